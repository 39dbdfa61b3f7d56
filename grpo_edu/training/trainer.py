"""The GRPO training loop, as plain code that reads top to bottom.

One step, on each of N ranks (one process: N = 1; see grpo_edu.runtime.distributed):

    1. draw the step's B prompts (every rank the same list) and take     sample_prompts
       this rank's B / N of them, whole
    2. roll out G completions each, with the sampler's log-probs         roll_out
    3. score every completion; gather the rewards (B, G) from all ranks  scoring.score
    4. group-relative advantages and the mini-batch plan, from all B     scoring.Plan
       prompts (the same on every rank); this rank's RolloutBatch
       (steps 1-4: sample_ahead; with rollout_lag = k it keeps the next
       k rollouts sampled ahead, each with pi_old = the policy that
       sampled it: grpo_edu.training.lagging)
    5. log-probs of the frozen reference (for the KL term) and, when     update.add_logprobs
       the rollout feeds more than one optimizer step, of pi_old
    6. num_iterations passes over the rollout, in num_mini_batches       update.optimise
       mini-batches, each an optimizer step: micro-batch forward/
       backward with gradient accumulation (and, across ranks, DDP's
       or FSDP2's gradient reduction), global grad-norm clip, AdamW,
       LR schedule
    7. log metrics; evaluate, re-sync the reference, checkpoint when     metrics.step_metrics,
       due (rank 0 writes)                                               evaluation, checkpoint

Before the first step, `set_up` places the models (grpo_edu.training.placement), builds the
optimizer, the rollout engine and the problems, and evaluates the starting policy (or
restores a checkpoint); after the last, `finish` writes summary.json and the samples.

The step's data is one `grpo_edu.training.batch.RolloutBatch` per rank (B / N prompts,
(B / N, G, S)): the type chapters 3 and 4 teach. Its mini-batches are `select`s
of whole groups; its micro-batches `MicroBatch` rows of it. The loss of every part
is computed with the whole mini-batch's counts (`scoring.LossTotals`), so the parts,
over micro-batches and ranks, add up to the 1-process loss exactly.

A training step (`steps`, `warmup_steps`, `eval_every`, `checkpoint_every` and
`ref_sync_steps` count them) is one rollout, and gives exactly
K = num_iterations x num_mini_batches optimizer steps; the learning-rate
schedule runs over all steps x K of them.

pi_old, the policy the clipped ratio compares with, is the policy that sampled,
fixed for the whole rollout. With config.old_logprobs = "recomputed" (default)
it is the trainer's own forward before the rollout's first update, computed
only when K > 1: for K = 1 the one update's own detached log-probs are that same
forward (ratio 1, no extra pass). With "sampler" it is the rollout engine's
log-probs, for every K.

The metrics of a step are grpo_loss's, reduced over micro-batches and ranks, those
optimise adds (grad_norm, learning_rate, optimizer_steps, sampler_gap/...) and the
rollout's (grpo_edu.training.metrics.step_metrics); chapter 6 explains each.

The pieces are arguments: `train(config, advantage_fn=my_advantages)` trains
with a reader's own advantage function, `reward_functions=` with their rewards.
"""

from __future__ import annotations

import functools
import json
import random
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from grpo_edu.environment import tasks
from grpo_edu.runtime import distributed
from grpo_edu.sampling import fused_llama
from grpo_edu.training import checkpoint, dynamic_sampling
from grpo_edu.training.config import TrainConfig
from grpo_edu.lab.diagnose import LiveDoctor, diagnose
from grpo_edu.training.episodes import load_environment, roll_out_episodes, stop_token, turn_sampler
from grpo_edu.runtime.distributed import World
from grpo_edu.training.evaluation import held_out_metrics, samples_table
from grpo_edu.lab.faults import Faults, checked_faults, leak_environment
from grpo_edu.training.lagging import InFlight
from grpo_edu.policy.lora import add_adapters
from grpo_edu.training.metrics import run_summary, step_metrics
from grpo_edu.policy.models import load_policy, policy_source
from grpo_edu.training.overlap import BackgroundSampler
from grpo_edu.training.placement import Models, autocast, build_models, check_engine_settings, make_engine, make_reference
from grpo_edu.sampling.rollout import HFEngine, Rollout, SamplingParams
from grpo_edu.runtime.runlog import MetricsLog
from grpo_edu.training.scoring import score
from grpo_edu.training.trained import save_trained
from grpo_edu.training.update import add_logprobs, make_optimizer, optimise, optimise_refreshing_old, policy_logprobs
from grpo_edu.training.user_functions import AdvantageFn, RewardFn, functions_from_config


@dataclass
class TrainState:
    """What a checkpoint restores besides weights and optimizer: the step (updates done), the
    prompt RNG, and with rollout_lag the rollouts sampled ahead of their updates."""

    step: int = 0
    prompt_rng: random.Random = field(default_factory=random.Random)
    in_flight: list[InFlight] = field(default_factory=list)     # sampled, not yet trained on, oldest first


@dataclass
class RunResult:
    policy: torch.nn.Module
    tokenizer: object
    summary: dict
    history: list[dict]


# --------------------------------------------------------------------------- steps 1-2

def sample_prompts(config: TrainConfig, state: TrainState, pool: list[dict]) -> list[dict]:
    """The step's B prompts: the same list on every rank (each takes its World.shard)."""
    return [pool[state.prompt_rng.randrange(len(pool))] for _ in range(config.prompts_per_step)]


@torch.no_grad()
def roll_out(config: TrainConfig, samples: list[dict], tokenizer, engine, world: World = World(),
             share: slice | None = None) -> Rollout:
    """Step 2: G completions of each of this rank's prompts, with the sampler's log-probs.

    `samples` is the step's whole prompt list; this rank samples `share` of it (default
    world.shard). The random numbers are drawn for all B prompts on every rank alike, so
    every rank's RNG stays in step: the fused engine takes its rows of one uniforms table
    (the rollout does not depend on the number of ranks); vLLM seeds completion i of the
    batch with one number drawn for the batch plus i (nor does it, up to vLLM's kernels);
    transformers' generate draws its own, seeded from that number plus the rank (each
    rank's samples are reproducible, but depend on how the prompts are split).
    """
    B, G, L = len(samples), config.num_generations, config.max_completion_length
    share = world.shard(B) if share is None else share
    mine = samples[share]
    prompts = tokenizer([s["prompt"] for s in mine], return_tensors="pt", padding=True,
                        add_special_tokens=False).to(world.device)
    sampling = SamplingParams(G, L, config.temperature)
    engine.sync_weights()   # vLLM: the trainer's current weights (fused, hf: the policy itself)
    if config.environment:   # multi-turn episodes, one policy turn at a time (grpo_edu.training.episodes)
        generate = turn_sampler(config, engine, world, B, share)
        return roll_out_episodes(generate, mine, prompts["input_ids"], prompts["attention_mask"], sampling,
                                 tokenizer, config.environment, config.max_turns)
    with autocast(config, world.device):
        if isinstance(engine, fused_llama.FusedEngine):
            uniforms = torch.rand(B * G, L)[share.start * G:share.stop * G].to(world.device)
            return engine.generate(prompts["input_ids"], prompts["attention_mask"], sampling, uniforms=uniforms)
        seed = int(torch.randint(0, 2**62, (1,)))
        if not isinstance(engine, HFEngine):   # vLLM: completion i of the batch samples with seed + i
            seeds = [seed + (share.start + b) * G for b in range(len(mine))]
            return engine.generate(prompts["input_ids"], prompts["attention_mask"], sampling, seeds=seeds)
        devices = [world.device] if world.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices):
            torch.manual_seed(seed + world.rank)
            return engine.generate(prompts["input_ids"], prompts["attention_mask"], sampling)


def draw_rollout(run: "Run", engine, world: World) -> tuple[list[dict], Rollout]:
    """Steps 1-2: the next B prompts, and this rank's rollout of its share of them."""
    samples = sample_prompts(run.config, run.state, run.train_pool)
    rollout = roll_out(run.config, samples, run.tokenizer, engine, world)
    if run.faults.env_tokens_in_loss:   # the failure lab's bug: the environment's tokens trained on
        rollout = leak_environment(rollout)
    return samples, rollout


def sample_rollout(run: "Run", engine, models: Models, world: World | None = None) -> InFlight:
    """Steps 1-4 for the next rollout: prompts, completions from `engine`, rewards and
    advantages, and (rollout_lag > 0) its pi_old from `models`, the policy that sampled it.
    world: the run's, or the background sampler's (its collectives in a group of their own)."""
    config, state, world = run.config, run.state, run.world if world is None else world
    t0 = time.perf_counter()
    samples, rollout = draw_rollout(run, engine, world)
    t1 = time.perf_counter()
    scoring = functools.partial(score, config, tokenizer=run.tokenizer, reward_functions=run.reward_functions,
                                advantage_fn=run.advantage_fn, world=world)
    batch, plan = scoring(samples, rollout)
    more = 0.0   # DAPO's dynamic sampling: all-equal groups replaced by fresh prompts' (grpo_edu.training.dynamic_sampling)
    if config.dynamic_sampling_rounds:
        batch, plan, more = dynamic_sampling.refill(config, samples, rollout, batch, plan, lambda: draw_rollout(
            run, engine, world), scoring, run.tokenizer.pad_token_id, world)
    if config.rollout_lag and config.old_logprobs == "recomputed":   # the policy that sampled, now
        batch = replace(batch, old_logp=policy_logprobs(config, models, batch, plan, world))
    return InFlight(samples, batch, plan, sampled_at=state.step,
                    seconds={"rollout": t1 - t0 + more, "scoring": time.perf_counter() - t1 - more})


def sample_ahead(run: "Run") -> None:
    """Steps 1-4 for every rollout not yet sampled that the sampler may be ahead by: through
    the rollout of update step + rollout_lag (never past the run's last), each with the
    current policy. With rollout_overlap the last of them is the background sampler's
    (sample_in_background), so this samples one fewer."""
    config, state = run.config, run.state
    ahead = config.rollout_lag - (1 if run.background is not None else 0)
    while len(state.in_flight) <= ahead and state.step + len(state.in_flight) < config.steps:
        state.in_flight.append(sample_rollout(run, run.engine, run.models))


def sample_in_background(run: "Run") -> None:
    """rollout_overlap: start sampling the rollout of update step + rollout_lag (the one
    sample_ahead would sample next, with the same policy: the current one) while this update
    runs; the loop joins it after the update."""
    state = run.state
    if state.step + 1 + len(state.in_flight) < run.config.steps:
        run.background.start(run.models, lambda engine, models, world: sample_rollout(run, engine, models, world))


# --------------------------------------------------------------------------- the loop

def train(config: TrainConfig, *, advantage_fn: AdvantageFn | None = None,
          reward_functions: dict[str, tuple[RewardFn, float]] | None = None,
          policy=None, tokenizer=None, resume: str | Path | None = None, stop_after: int | None = None,
          log: Callable[[str], None] = print, faults: Faults | None = None) -> RunResult:
    """Train a policy with GRPO as `config` says; write the run to config.output_dir.

    Under torchrun every rank calls this with the same arguments (see grpo_edu.runtime.distributed);
    rank 0 writes the run directory and logs.

    advantage_fn: rewards (B, G) -> advantages (B, G); default the config's (its
        advantage_fn by import path, else group_advantages with advantage_scale / advantage_std).
    reward_functions: {name: (fn, weight)} with TRL's signature; default the
        config's `rewards` weights over grpo_edu.environment.rewards.
    policy, tokenizer: a model to train instead of loading config.model.
    resume: a run directory whose latest checkpoint to continue from.
    stop_after: stop (checkpointed) after this many steps in total: a test's
        stand-in for an interrupted run.
    faults: deliberate bugs for the failure lab (grpo_edu.lab.faults.Faults); never a config key.

    Returns the trained policy with whole weights (under FSDP2 a plain copy).
    """
    run = set_up(config, advantage_fn=advantage_fn, reward_functions=reward_functions, policy=policy,
                 tokenizer=tokenizer, resume=resume, log=log, faults=faults)
    world, models, state = run.world, run.models, run.state
    last = config.steps if stop_after is None else min(config.steps, stop_after)
    accuracy, started = run.start_accuracy, time.perf_counter()
    while state.step < last:
        # -------------------------------------------------- 1-4: prompts, rollout, rewards, advantages
        t0 = time.perf_counter()
        sample_ahead(run)   # this update's rollout; with rollout_lag = k, the next k too
        flight = state.in_flight.pop(0)
        if run.background is not None:   # rollout_overlap: the newest of the k, beside this update
            sample_in_background(run)
        # -------------------------------------------------- 5: log-probs
        t1 = time.perf_counter()
        batch = add_logprobs(config, models, flight.batch, flight.plan, world)
        # -------------------------------------------------- 6: the update
        t2 = time.perf_counter()
        update = run.optimise(config, models, run.optimizer, run.scheduler, batch, flight.plan, world)
        t3 = time.perf_counter()
        if run.background is not None and (sampled := run.background.join()) is not None:
            state.in_flight.append(sampled)
        staleness, state.step = state.step - flight.sampled_at, state.step + 1
        # -------------------------------------------------- 7: log, evaluate, re-sync, checkpoint
        seconds = {**flight.seconds, "scoring": flight.seconds["scoring"] + t2 - t1, "update": t3 - t2}
        metrics = {"step": state.step, **step_metrics(flight.plan, batch, update, seconds, world)}
        if config.rollout_lag:
            metrics["staleness"] = float(staleness)   # updates between the sampling policy and this one
        if run.background is not None:   # the rollout's time overlapped the update: the step's own wall-clock
            metrics["time/step"] = time.perf_counter() - t0
        if config.ref_sync_steps and state.step % config.ref_sync_steps == 0:
            models.sync_reference(config.ref_mixup_alpha)
        if state.step % config.eval_every == 0 or state.step == config.steps:
            metrics.update(evaluate_held_out(run, samples=config.eval_samples))
            accuracy = metrics["eval/greedy_accuracy"]
        record(run, metrics, accuracy)
        if (config.checkpoint_every and state.step % config.checkpoint_every == 0) or state.step == last:
            seconds_so_far = run.elapsed + time.perf_counter() - started
            checkpoint.save_checkpoint(run.output_dir, models, run.optimizer, run.scheduler, state, world,
                                       {"start_accuracy": run.start_accuracy, "seconds": seconds_so_far},
                                       run.metrics_log)
    return finish(run, seconds=run.elapsed + time.perf_counter() - started)


# --------------------------------------------------------------------------- set-up

@dataclass
class Run:
    """What set_up builds for the loop."""

    config: TrainConfig
    world: World
    models: Models
    tokenizer: object
    engine: object                   # a grpo_edu.sampling.rollout.RolloutEngine
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    optimise: Callable[..., dict]    # update.optimise (the failure lab may inject another)
    reward_functions: dict[str, tuple[RewardFn, float]]
    advantage_fn: AdvantageFn
    train_pool: list[dict]
    held_out: list[dict]
    state: TrainState
    output_dir: Path
    metrics_log: MetricsLog
    history: list[dict]
    start_accuracy: float
    elapsed: float                   # seconds trained before this process started (a resumed run's)
    say: Callable[[str], None]       # log on rank 0, nothing elsewhere
    faults: Faults
    doctor: LiveDoctor
    progress: object | None          # a tqdm bar on rank 0 (config.progress)
    background: BackgroundSampler | None = None   # rollout_overlap (grpo_edu.training.overlap)


def set_up(config: TrainConfig, *, advantage_fn: AdvantageFn | None, reward_functions, policy, tokenizer,
           resume: str | Path | None, log: Callable[[str], None], faults: Faults | None) -> Run:
    """Everything before the first step (train's arguments): the process group, the run's
    functions, the models placed and wrapped, AdamW and its schedule, the rollout engine, the
    problems; then the starting policy evaluated and the run directory started, or a
    checkpoint restored."""
    world = distributed.init_world(config.device)
    check_engine_settings(config, world.device)
    world.shard(config.prompts_per_step)   # prompts_per_step must divide among the ranks
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    say = log if world.is_main else (lambda message: None)
    if advantage_fn is not None and config.advantage_fn:
        raise ValueError(f"train(advantage_fn=...) and config key 'advantage_fn' ({config.advantage_fn!r}) both "
                         f"given; pass one")
    configured_advantage_fn, configured_rewards = functions_from_config(config)
    advantage_fn = configured_advantage_fn if advantage_fn is None else advantage_fn
    faults = checked_faults(faults, config, say)
    if faults.split_groups > 1:
        advantage_fn = functools.partial(faults.split_advantages, advantage_fn)
    reward_functions = configured_rewards if reward_functions is None else reward_functions
    if policy is None:
        policy, tokenizer = load_policy(policy_source(config.model))
    if config.lora_rank:   # LoRA adapters on the chosen layers, the rest frozen (grpo_edu.policy.lora)
        policy = add_adapters(policy, config)
    state = TrainState(prompt_rng=random.Random(config.seed))
    output_dir = Path(config.output_dir)
    metrics_log = MetricsLog(output_dir)
    saved, reference = None, None
    if resume is not None:
        # Whole weights into the plain models, before they are placed and sharded.
        reference = make_reference(policy) if config.beta and not config.lora_rank else None   # LoRA: adapters off
        saved = checkpoint.load_weights(Path(resume), policy, reference, log=say)
    if config.environment:   # importable, with a one-token stop: checked before anything is built
        stop_token(config.environment, load_environment(config.environment), tokenizer)
    models = _build_models(config, world, policy, reference, faults)
    optimizer, scheduler = make_optimizer(config, models.policy.parameters())
    engine = make_engine(config, models, tokenizer, world)
    background = BackgroundSampler(config, world, models, tokenizer, engine) if config.rollout_overlap else None
    train_pool, held_out = tasks.task_pools(config, tokenizer)
    run = Run(config, world, models, tokenizer, engine, optimizer, scheduler,
              optimise_refreshing_old if faults.refresh_old_logprobs else optimise,
              reward_functions, advantage_fn, train_pool, held_out, state, output_dir, metrics_log,
              history=[], start_accuracy=0.0, elapsed=0.0, say=say, faults=faults,
              doctor=LiveDoctor(config.to_dict()), progress=None, background=background)
    if saved is not None:
        distributed.load_full_optimizer_state(optimizer, saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        checkpoint.restore_rng(saved, state)
        checkpoint.restore_in_flight(saved, state, world)
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


def _build_models(config: TrainConfig, world: World, policy, reference, faults: Faults) -> Models:
    """build_models, with the failure lab's faults on the models: an aliased reference, the
    trainer's log-probs at another temperature, off-by-one log-probs."""
    if faults.alias_reference:
        reference = policy
    # faults.trainer_temperature: the trainer's log-probs at another temperature than the sampler's
    logprob_config = config if faults.trainer_temperature is None else replace(
        config, temperature=faults.trainer_temperature)
    models = build_models(logprob_config, world, policy, reference, allow_alias=faults.alias_reference)
    if faults.active() and world.distributed:
        raise ValueError(f"faults: the failure lab injects faults in one process, got {world.size} processes")
    if faults.off_by_one:   # policy, pi_old and reference alike (one process: plain modules, never DDP's wrapper)
        for module in (models.train_logprobs, models.reference_logprobs):
            if hasattr(module, "logprob_fn"):   # not None, nor LoRA's reference (the policy's own module)
                module.logprob_fn = faults.logprob_fn(module.logprob_fn)
    return models


def _progress_bar(config: TrainConfig, initial: int):
    if not config.progress:
        return None
    from tqdm.auto import tqdm
    # No rates in the bar: its text must not vary from run to run (the book checks outputs).
    return tqdm(total=config.steps, initial=initial, desc="GRPO",
                bar_format="{desc}: {n_fmt}/{total_fmt} steps |{bar:20}| {postfix}")


# --------------------------------------------------------------------------- step 7 and finishing

def evaluate_held_out(run: Run, samples: int = 0) -> dict[str, object]:
    """The policy on the held-out problems (evaluation.held_out_metrics): greedy accuracy, and
    pass@k and maj@k from `samples` samples per problem. Every rank takes part."""
    with run.models.whole() as model, autocast(run.config, run.world.device):
        return held_out_metrics(model, run.tokenizer, run.held_out, run.world,
                                max_new_tokens=run.config.max_completion_length, samples=samples,
                                environment=run.config.environment, max_turns=run.config.max_turns)


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
    finished = run.state.step >= config.steps
    summary = run_summary(config.to_dict(), run.history, run.start_accuracy, seconds, finished=finished,
                          eval_problems=len(run.held_out))
    if run.faults.active():
        summary["faults"] = run.faults.active()
    summary["world_size"] = world.size
    summary["parallelism"] = config.parallelism if world.distributed else "none"
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
