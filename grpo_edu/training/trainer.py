"""The GRPO training loop, as plain code that reads top to bottom.

`train(config)` is `loop(set_up(config))`. One step of `loop`, on each of N ranks (one
process: N = 1; see grpo_edu.runtime.distributed):

    1. draw the step's B prompts (every rank the same list) and take     run.rollouts.next(step)
       this rank's B / N of them, whole                                  (grpo_edu.training.rollouts:
    2. roll out G completions each, with the sampler's log-probs          Sampler.sample)
    3. score every completion; gather the rewards (B, G) from all ranks
    4. group-relative advantages and the mini-batch plan, from all B
       prompts (the same on every rank); this rank's RolloutBatch
    5. log-probs of the frozen reference (for the KL term) and, when     update.add_logprobs
       the rollout feeds more than one optimizer step, of pi_old
    6. num_iterations passes over the rollout, in num_mini_batches       update.optimise
       mini-batches, each an optimizer step: micro-batch forward/
       backward with gradient accumulation (and, across ranks, DDP's
       or FSDP2's gradient reduction), global grad-norm clip, AdamW,
       LR schedule
    7. log metrics; re-sync the reference, evaluate, checkpoint when     metrics.step_metrics,
       due (rank 0 writes)                                               evaluation, checkpoint

Steps 1-4 come from the run's rollout source over its Sampler: Synchronous (each rollout just
before its update), Lagged (rollout_lag = k: k rollouts sampled ahead) or Overlapped
(rollout_overlap: the newest sampled in a thread beside the update;
grpo_edu.training.asynchronous). The loop is the same for all three, for one process or N, for
single-turn completions or multi-turn episodes.

Before the first step, `set_up` places the models (grpo_edu.training.placement), builds the
optimizer, the rollout engine, the problems and the rollout source, and evaluates the
starting policy (or restores a checkpoint); after the last, `finish` writes summary.json and
the samples. Between the two, a Run's stages (its sampler's roll_out and advantage_fn, its
optimise, the models' log-prob functions) are the seams the failure lab injects its faults
through (grpo_edu.lab.faults); `train` itself takes none.

The step's data is one `grpo_edu.training.batch.RolloutBatch` per rank (B / N prompts,
(B / N, G, S)): the type chapters 3 and 4 teach. Its mini-batches are `select`s
of whole groups; its micro-batches `MicroBatch` rows of it. The loss of every part
is computed with the whole mini-batch's counts (`plan.LossTotals`), so the parts,
over micro-batches and ranks, add up to the 1-process loss exactly.

A training step (`steps`, `warmup_steps`, `eval_every`, `checkpoint_every` and
`ref_sync_steps` count them) is one rollout, and gives exactly
K = num_iterations x num_mini_batches optimizer steps; the learning-rate
schedule runs over all steps x K of them.

pi_old, the policy the clipped ratio compares with, is the policy that sampled,
fixed for the whole rollout. With config.off_policy.old_logprobs = "recomputed" (default)
it is the trainer's own forward before the rollout's first update, computed
only when K > 1: for K = 1 the one update's own detached log-probs are that same
forward (ratio 1, no extra pass). With "sampler" it is the rollout engine's
log-probs, for every K.

The metrics of a step are grpo_loss's, reduced over micro-batches and ranks, those
optimise adds (grad_norm, learning_rate, optimizer_steps, sampler_gap/...), the
rollout's (grpo_edu.training.metrics.step_metrics) and the source's (staleness, time/step);
chapter 6 explains each.

The pieces are arguments: `train(config, advantage_fn=my_advantages)` trains
with a reader's own advantage function, `reward_functions=` with their rewards.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from grpo_edu.algorithm.loss import LossSettings
from grpo_edu.config import TrainConfig
from grpo_edu.doctor.diagnose import LiveDoctor, diagnose
from grpo_edu.environment import tasks
from grpo_edu.policy.lora import add_adapters
from grpo_edu.policy.models import load_policy, policy_source
from grpo_edu.runtime import distributed
from grpo_edu.runtime.distributed import World
from grpo_edu.runtime.precision import autocast
from grpo_edu.runtime.runlog import MetricsLog
from grpo_edu.training import checkpoint
from grpo_edu.training.asynchronous import rollout_source
from grpo_edu.training.episodes import load_environment, stop_token
from grpo_edu.training.evaluation import held_out_metrics, samples_table
from grpo_edu.training.metrics import run_summary, step_metrics
from grpo_edu.training.placement import Models, build_models, check_engine_settings, make_engine, make_reference
from grpo_edu.training.rollouts import RolloutSource, Sampler
from grpo_edu.training.trained import save_trained
from grpo_edu.training.update import Optimise, add_logprobs, make_optimizer, optimise
from grpo_edu.training.user_functions import AdvantageFn, RewardFn, functions_from_config


@dataclass
class TrainState:
    """What a checkpoint restores besides weights, optimizer and the rollouts sampled ahead (the
    rollout source's records): the step (updates done) and the prompt RNG."""

    step: int = 0
    prompt_rng: random.Random = field(default_factory=random.Random)


@dataclass
class RunResult:
    policy: torch.nn.Module
    tokenizer: object
    summary: dict
    history: list[dict]


# --------------------------------------------------------------------------- the loop

def train(config: TrainConfig, *, advantage_fn: AdvantageFn | None = None,
          reward_functions: dict[str, tuple[RewardFn, float]] | None = None,
          policy=None, tokenizer=None, resume: str | Path | None = None, stop_after: int | None = None,
          log: Callable[[str], None] = print) -> RunResult:
    """Train a policy with GRPO as `config` says; write the run to config.logging.output_dir.

    Under torchrun every rank calls this with the same arguments (see grpo_edu.runtime.distributed);
    rank 0 writes the run directory and logs.

    advantage_fn: rewards (B, G) -> advantages (B, G); default the config's (its
        advantage_fn by import path, else group_advantages with advantage_scale / advantage_std).
    reward_functions: {name: (fn, weight)} with TRL's signature; default the
        config's `rewards` weights over grpo_edu.environment.rewards.
    policy, tokenizer: a model to train instead of loading config.run.model.
    resume: a run directory whose latest checkpoint to continue from.
    stop_after: stop (checkpointed) after this many steps in total: a test's
        stand-in for an interrupted run.

    Returns the trained policy with whole weights (under FSDP2 a plain copy).
    """
    run = set_up(config, advantage_fn=advantage_fn, reward_functions=reward_functions, policy=policy,
                 tokenizer=tokenizer, resume=resume, log=log)
    return loop(run, stop_after)


def loop(run: Run, stop_after: int | None = None) -> RunResult:
    """The GRPO steps of a run that set_up built, then `finish`."""
    config, models, state, world = run.config, run.models, run.state, run.world
    steps, logging = config.optimisation.steps, config.logging
    last = steps if stop_after is None else min(steps, stop_after)
    accuracy, started = run.start_accuracy, time.perf_counter()
    while state.step < last:
        # ------------------------------------------------ 1-4: prompts, completions, rewards, advantages
        t0 = time.perf_counter()
        flight = run.rollouts.next(state.step)   # scored: its RolloutBatch and its mini-batch plan
        # ------------------------------------------------ 5: the reference's log-probs (and pi_old's)
        t1 = time.perf_counter()
        batch = add_logprobs(config, models, flight.batch, flight.plan, world)
        # ------------------------------------------------ 6: the update
        t2 = time.perf_counter()
        update = run.optimise(config, run.loss, models, run.optimizer, run.scheduler, batch, flight.plan, world)
        t3 = time.perf_counter()
        run.rollouts.after_update()
        state.step += 1
        # ------------------------------------------------ 7: log, re-sync the reference, evaluate, checkpoint
        seconds = {**flight.seconds, "scoring": flight.seconds["scoring"] + t2 - t1, "update": t3 - t2}
        metrics = {"step": state.step, **step_metrics(flight.plan, batch, update, seconds, world),
                   **run.rollouts.metrics(flight, state.step, started=t0)}
        if config.loss.ref_sync_steps and state.step % config.loss.ref_sync_steps == 0:
            models.sync_reference(config.loss.ref_mixup_alpha)
        if state.step % logging.eval_every == 0 or state.step == steps:
            metrics.update(evaluate_held_out(run, samples=logging.eval_samples))
            accuracy = metrics["eval/greedy_accuracy"]
        record(run, metrics, accuracy)
        if (logging.checkpoint_every and state.step % logging.checkpoint_every == 0) or state.step == last:
            seconds_so_far = run.elapsed + time.perf_counter() - started
            checkpoint.save_checkpoint(run.output_dir, models, run.optimizer, run.scheduler, state, world,
                                       {"start_accuracy": run.start_accuracy, "seconds": seconds_so_far},
                                       run.metrics_log, run.rollouts.records(world))
    return finish(run, seconds=run.elapsed + time.perf_counter() - started)


# --------------------------------------------------------------------------- set-up

@dataclass
class Run:
    """What set_up builds for the loop."""

    config: TrainConfig
    world: World
    models: Models
    tokenizer: object
    loss: LossSettings               # the loss's settings, from the config's loss section, built once
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    sampler: Sampler                 # steps 1-4's stages and what they need (its roll_out, advantage_fn: seams)
    optimise: Optimise               # update.optimise (the failure lab may put another in its place)
    held_out: list[dict]
    state: TrainState
    output_dir: Path
    metrics_log: MetricsLog
    history: list[dict]
    start_accuracy: float
    elapsed: float                   # seconds trained before this process started (a resumed run's)
    say: Callable[[str], None]       # log on rank 0, nothing elsewhere
    doctor: LiveDoctor
    progress: object | None          # a tqdm bar on rank 0 (config key progress)
    rollouts: RolloutSource | None = None   # where each update's rollout comes from, over the sampler
    notes: dict = field(default_factory=dict)          # written into summary.json (the lab's faults)


def set_up(config: TrainConfig, *, advantage_fn: AdvantageFn | None = None, reward_functions=None, policy=None,
           tokenizer=None, resume: str | Path | None = None, log: Callable[[str], None] = print) -> Run:
    """Everything before the first step (train's arguments): the process group, the run's
    functions, the models placed and wrapped, AdamW and its schedule, the rollout engine, the
    problems; then the starting policy evaluated and the run directory started, or a
    checkpoint restored."""
    world = distributed.init_world(config.run.device)
    check_engine_settings(config, world.device)
    world.shard(config.rollout.prompts_per_step)   # prompts_per_step must divide among the ranks
    torch.set_num_threads(config.run.threads)
    torch.manual_seed(config.run.seed)
    say = log if world.is_main else (lambda message: None)
    if advantage_fn is not None and config.advantages.advantage_fn:
        raise ValueError(f"train(advantage_fn=...) and config key 'advantage_fn' ({config.advantages.advantage_fn!r}) both "
                         f"given; pass one")
    configured_advantage_fn, configured_rewards = functions_from_config(config)
    advantage_fn = configured_advantage_fn if advantage_fn is None else advantage_fn
    reward_functions = configured_rewards if reward_functions is None else reward_functions
    if policy is None:
        policy, tokenizer = load_policy(policy_source(config.run.model))
    if config.lora.lora_rank:   # LoRA adapters on the chosen layers, the rest frozen (grpo_edu.policy.lora)
        policy = add_adapters(policy, config)
    state = TrainState(prompt_rng=random.Random(config.run.seed))
    output_dir = Path(config.logging.output_dir)
    metrics_log = MetricsLog(output_dir)
    saved, reference = None, None
    if resume is not None:
        # Whole weights into the plain models, before they are placed and sharded.
        reference = make_reference(policy) if config.loss.beta and not config.lora.lora_rank else None   # LoRA: adapters off
        saved = checkpoint.load_weights(Path(resume), policy, reference, log=say)
    if config.rollout.environment:   # importable, with a one-token stop: checked before anything is built
        stop_token(config.rollout.environment, load_environment(config.rollout.environment), tokenizer)
    models = build_models(config, world, policy, reference)
    optimizer, scheduler = make_optimizer(config, models.policy.parameters())
    engine = make_engine(config, models, tokenizer, world)
    train_pool, held_out = tasks.task_pools(config, tokenizer)
    sampler = Sampler(config, tokenizer, engine, models, world, train_pool, state.prompt_rng, reward_functions,
                      advantage_fn)
    run = Run(config, world, models, tokenizer, LossSettings.of(config), optimizer, scheduler, sampler, optimise,
              held_out, state, output_dir, metrics_log, history=[], start_accuracy=0.0, elapsed=0.0, say=say,
              doctor=LiveDoctor(config.to_dict()), progress=None, rollouts=rollout_source(config, sampler))
    if saved is not None:
        distributed.load_full_optimizer_state(optimizer, saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        checkpoint.restore_rng(saved, state)
        run.rollouts.restore(saved.get("in_flight"), world)
        extra = json.loads(saved["extra"])
        run.start_accuracy, run.elapsed = extra["start_accuracy"], extra["seconds"]
        run.history = metrics_log.restore(up_to_step=state.step, log=say) if world.is_main else []
        # what was reported before is not reported again
        run.doctor.reported |= {f.detector for f in diagnose(run.history, config.to_dict())}
    else:
        run.start_accuracy = evaluate_held_out(run)["eval/greedy_accuracy"]
        with models.whole() as model:   # every rank enters: under FSDP2 a lazy copy is gathered
            if world.is_main:
                output_dir.mkdir(parents=True, exist_ok=True)
                metrics_log.start()
                (output_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
                before = samples_table(model, tokenizer, held_out[:4], config)
                (output_dir / "samples_before.txt").write_text(before)
        say(f"start: held-out greedy accuracy {run.start_accuracy:.4f}")
    world.barrier()
    run.progress = _progress_bar(config, state.step) if world.is_main else None
    return run


def _progress_bar(config: TrainConfig, initial: int):
    if not config.logging.progress:
        return None
    from tqdm.auto import tqdm
    # No rates in the bar: its text must not vary from run to run (the book checks outputs).
    return tqdm(total=config.optimisation.steps, initial=initial, desc="GRPO",
                bar_format="{desc}: {n_fmt}/{total_fmt} steps |{bar:20}| {postfix}")


# --------------------------------------------------------------------------- step 7 and finishing

def evaluate_held_out(run: Run, samples: int = 0) -> dict[str, object]:
    """The policy on the held-out problems (evaluation.held_out_metrics): greedy accuracy, and
    pass@k and maj@k from `samples` samples per problem. Every rank takes part."""
    with run.models.whole() as model, autocast(run.config.run.precision, run.world.device):
        return held_out_metrics(model, run.tokenizer, run.held_out, run.world,
                                max_new_tokens=run.config.rollout.max_completion_length, samples=samples,
                                environment=run.config.rollout.environment, max_turns=run.config.rollout.max_turns)


def record(run: Run, metrics: dict, accuracy: float) -> None:
    """A step's metrics into the history and, on rank 0, metrics.jsonl, the live doctor's
    warnings (each symptom once, the step it appears) and the progress bar."""
    run.history.append(metrics)
    if run.world.is_main:
        run.metrics_log.append(metrics)
        for finding in run.doctor.check(run.history):
            run.say(f"warning at step {run.state.step}: {finding.failure}: {finding.evidence}. "
                    f"Advice: {finding.advice} (grpo-edu doctor {run.output_dir})")
    if run.progress is not None:
        run.progress.set_postfix_str(f"reward {metrics['reward/mean']:.3f} held-out acc {accuracy:.3f}",
                                     refresh=False)
        run.progress.update(1)


def finish(run: Run, seconds: float) -> RunResult:
    """After the last step: summary.json and, for a finished run, samples_after.txt and the
    trained policy in model/ (grpo_edu.training.trained; rank 0 writes); the policy with whole weights."""
    config, world, models = run.config, run.world, run.models
    if run.progress is not None:
        run.progress.close()
    finished = run.state.step >= config.optimisation.steps
    summary = run_summary(config.to_dict(), run.history, run.start_accuracy, seconds, finished=finished,
                          eval_problems=len(run.held_out))
    summary.update(run.notes)
    summary["world_size"] = world.size
    summary["parallelism"] = config.run.parallelism if world.distributed else "none"
    # What each rank holds of the policy's parameters, gradients and AdamW state (FSDP2: ~1/N each).
    summary["memory_bytes_per_rank"] = world.gather_objects([distributed.memory_bytes(models.policy, run.optimizer)])
    with models.whole(keep=True) as model:   # the run's result: whole weights (every rank enters)
        if world.is_main:
            (run.output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
            if finished:
                after = samples_table(model, run.tokenizer, run.held_out[:4], config)
                (run.output_dir / "samples_after.txt").write_text(after)
                save_trained(model, run.tokenizer, run.output_dir, summary)
    world.barrier()
    return RunResult(model, run.tokenizer, summary, run.history)
