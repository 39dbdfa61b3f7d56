"""The GRPO training loop, as plain code that reads top to bottom.

One step:

    1. sample B prompts from the train split                        sample_prompts
    2. roll out G completions each, with the sampler's log-probs    roll_out  -> (B*G, S)
    3. score every completion with the reward functions            score     -> rewards (B, G)
    4. group-relative advantages; the mini-batches of whole groups            -> (B, G)
    5. log-probs of the frozen reference (for the KL term) and, when          -> (B*G, S)
       the rollout feeds more than one optimizer step, of pi_old
    6. num_iterations passes over the rollout, in num_mini_batches  optimise
       mini-batches, each an optimizer step: micro-batch forward/backward
       with gradient accumulation, global grad-norm clip, AdamW, LR schedule
    7. log metrics; evaluate, re-sync the reference, checkpoint when due

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

Metrics the loop adds to grpo_loss's (see step_metrics and optimise): the loss
metrics are the step's last optimizer step's; `learning_rate` is the one its
first optimizer step used; `optimizer_steps` how many were taken (K, less one
per empty mini-batch); `sampler_gap/mean_abs` and `sampler_gap/max_ratio`
compare the trainer's log-probs before the update with the sampler's, on the
rows trained on (groups dropped by filter_zero_std_groups are not included).

The pieces are arguments: `train(config, advantage_fn=my_advantages)` trains
with a reader's own advantage function, `reward_functions=` with their rewards.
"""

from __future__ import annotations

import copy
import json
import math
import random
import re
import statistics
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from grpo_edu import checkpoint, fused_llama, rewards, tasks
from grpo_edu.advantages import group_advantages, zero_std_groups
from grpo_edu.config import TrainConfig
from grpo_edu.logprobs import completion_logprobs
from grpo_edu.loss import grpo_loss
from grpo_edu.models import STARTING_POLICY, load_policy
from grpo_edu.pretrain import evaluate
from grpo_edu.rollout import HFEngine, Rollout, SamplingParams

TRAIN_POOL = 10_000  # distinct training problems the prompts are drawn from (with replacement)
# A step's wall-clock, in three parts: sampling; rewards, advantages, reference and pi_old log-probs; the update.
TIME_SPLIT = ("rollout", "scoring", "update")

AdvantageFn = Callable[[torch.Tensor], torch.Tensor]          # rewards (B, G) -> advantages (B, G)
RewardFn = Callable[..., Sequence[float]]                      # TRL's signature


@dataclass
class Scored:
    """One rollout, scored: what the optimisation phase of a step consumes."""

    samples: list[dict]              # the B prompts' samples
    rollout: Rollout                 # B*G completions
    texts: list[str]                 # B*G decoded completions
    input_ids: torch.Tensor          # (N, P + S) prompt + completion
    attention_mask: torch.Tensor     # (N, P + S)
    rewards: torch.Tensor            # (B, G) the weighted sum
    components: dict[str, torch.Tensor]  # name -> (B, G), each reward function
    advantages: torch.Tensor         # (B, G)
    old_logp: torch.Tensor | None    # (N, S) pi_old; None: each update's own detached log-probs (K = 1)
    ref_logp: torch.Tensor | None    # (N, S) only when beta > 0
    mini_batches: list[torch.Tensor]  # num_mini_batches row indices (n_k G,), whole groups; may be empty

    @property
    def trained_tokens(self) -> int:
        """Real completion tokens in the rows the update trains on (all mini-batches)."""
        return int(sum(self.rollout.completion_mask[rows].sum() for rows in self.mini_batches))


@dataclass
class TrainState:
    step: int = 0
    prompt_rng: random.Random = field(default_factory=random.Random)


# --------------------------------------------------------------------------- set-up

def reward_functions_from_config(weights: dict[str, float]) -> dict[str, tuple[RewardFn, float]]:
    known = rewards.REWARD_FUNCTIONS
    unknown = sorted(set(weights) - set(known))
    if unknown:
        raise ValueError(f"config key 'rewards' names unknown reward functions {unknown}; known: {sorted(known)}")
    return {name: (known[name], float(weight)) for name, weight in weights.items()}


def make_reference(policy: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of the policy: separate tensors, no gradients, eval mode."""
    reference = copy.deepcopy(policy).eval()
    reference.requires_grad_(False)
    check_not_aliased(policy, reference)
    return reference


def check_not_aliased(policy: torch.nn.Module, reference: torch.nn.Module) -> None:
    """The reference must not share storage with the policy (its KL would stay 0)."""
    if reference is policy:
        raise ValueError("reference model is the policy object itself; pass a separate copy "
                         "(grpo_edu.trainer.make_reference(policy))")
    policy_storage = {p.untyped_storage().data_ptr() for p in policy.parameters()}
    for name, parameter in reference.named_parameters():
        if parameter.untyped_storage().data_ptr() in policy_storage:
            raise ValueError(f"reference parameter {name!r} shares memory with the policy; "
                             f"pass a separate copy (grpo_edu.trainer.make_reference(policy))")


def optimizer_steps_per_rollout(config: TrainConfig) -> int:
    """K: each training step (one rollout) gives this many optimizer steps."""
    return config.num_iterations * config.num_mini_batches


def learning_rate_factor(config: TrainConfig) -> Callable[[int], float]:
    """The multiplier of the peak learning rate at optimizer step `step` (0-based).

    The schedule spans the run: config.steps x K optimizer steps, the first
    config.warmup_steps x K of them warming up linearly (training steps count
    rollouts; K = optimizer_steps_per_rollout).
    """
    K = optimizer_steps_per_rollout(config)
    total, warmup = config.steps * K, config.warmup_steps * K

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        progress = (step - warmup) / max(1, total - warmup)
        if config.lr_schedule == "linear":
            return max(0.0, 1.0 - progress)
        if config.lr_schedule == "cosine":
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0
    return factor


def make_engine(config: TrainConfig, policy, tokenizer):
    return fused_llama.FusedEngine(policy, tokenizer) if config.fused_llama else HFEngine(policy, tokenizer)


def sequence_logprobs(config: TrainConfig, model, input_ids, attention_mask, completion_mask):
    """log pi(token) of the completion tokens of prompt-major rows: (N, P + S) -> (N, S).

    The fused forward computes each prompt once for its G completions when the rows
    hold whole groups (every micro-batch does when micro_batch_size is a multiple of G).
    """
    if not config.fused_llama:
        return completion_logprobs(model, input_ids, attention_mask, completion_mask,
                                   temperature=config.temperature)
    G = config.num_generations
    group = G if config.micro_batch_size % G == 0 and input_ids.shape[0] % G == 0 else 1
    return fused_llama.completion_logprobs(model, input_ids, attention_mask, completion_mask,
                                           temperature=config.temperature, group_size=group)


# --------------------------------------------------------------------------- steps 1-5

def sample_prompts(config: TrainConfig, state: TrainState, pool: list[dict]) -> list[dict]:
    return [pool[state.prompt_rng.randrange(len(pool))] for _ in range(config.prompts_per_step)]


@torch.no_grad()
def roll_out(config: TrainConfig, samples: list[dict], tokenizer, engine) -> Rollout:
    """Step 2: G completions of each prompt, with the sampler's log-probs."""
    prompts = tokenizer([s["prompt"] for s in samples], return_tensors="pt", padding=True,
                        add_special_tokens=False).to(config.device)
    sampling = SamplingParams(config.num_generations, config.max_completion_length, config.temperature)
    return engine.generate(prompts["input_ids"], prompts["attention_mask"], sampling)


def plan_mini_batches(config: TrainConfig, rewards: torch.Tensor) -> list[torch.Tensor]:
    """The rows of each of a rollout's num_mini_batches mini-batches: rewards (B, G) ->
    num_mini_batches tensors of row indices (n_k G,), whole groups, prompt-major.

    The groups (those left after filter_zero_std_groups) are split as evenly as
    possible, larger first: 7 groups in 2 mini-batches give 4 + 3. With fewer
    groups than mini-batches the last ones are empty (the update skips them).
    """
    G = config.num_generations
    groups = torch.arange(rewards.shape[0])
    if config.filter_zero_std_groups:   # dynamic sampling: groups that agree teach nothing
        groups = groups[~zero_std_groups(rewards)]
    return [(chosen[:, None] * G + torch.arange(G)).reshape(-1)
            for chosen in groups.tensor_split(config.num_mini_batches)]


def logprobs_before_update(config: TrainConfig, policy, input_ids, attention_mask, completion_mask,
                           mini_batches: list[torch.Tensor]) -> torch.Tensor | None:
    """pi_old recomputed: the policy's log-probs (N, S) of the rows of `mini_batches`, in the
    micro-batches the update will use, so the first mini-batch's ratio is exactly 1 (the same
    forward, bitwise). Rows in no mini-batch (filtered groups) stay 0 and are never read;
    None when no row will be trained on."""
    micro_batches = [micro for rows in mini_batches if len(rows) for micro in rows.split(config.micro_batch_size)]
    if not micro_batches:
        return None
    pieces = [sequence_logprobs(config, policy, input_ids[micro], attention_mask[micro], completion_mask[micro])
              for micro in micro_batches]
    old_logp = pieces[0].new_zeros(completion_mask.shape)
    old_logp[torch.cat(micro_batches)] = torch.cat(pieces)
    return old_logp


@torch.no_grad()
def score(config: TrainConfig, samples: list[dict], rollout: Rollout, policy, reference, tokenizer,
          reward_functions: dict[str, tuple[RewardFn, float]], advantage_fn: AdvantageFn) -> Scored:
    """Steps 3 to 5: rewards, group advantages, the mini-batches, reference and pi_old log-probs."""
    B, G = len(samples), config.num_generations
    # Each completion is scored with its prompt's dataset columns (TRL's convention).
    texts = tokenizer.batch_decode(rollout.completion_ids, skip_special_tokens=True)
    columns = {key: [s.get(key) for s in samples for _ in range(G)]
               for key in samples[0] if key != "prompt"}
    components, total = {}, torch.zeros(B * G, dtype=torch.float64)
    for name, (function, weight) in reward_functions.items():
        values = torch.tensor([float(v) for v in function(texts, **columns)], dtype=torch.float64)
        if values.shape != (B * G,) or not torch.isfinite(values).all():
            raise ValueError(f"reward function {name!r} must return {B * G} finite floats, got {values.tolist()}")
        components[name] = values.view(B, G)
        total += weight * values
    reward_matrix = total.view(B, G)
    advantages = advantage_fn(reward_matrix)
    if not isinstance(advantages, torch.Tensor) or advantages.shape != (B, G):
        raise ValueError(f"advantage_fn must map rewards (B, G) = ({B}, {G}) to a tensor of the same "
                         f"shape, got {getattr(advantages, 'shape', type(advantages))}")
    if not torch.isfinite(advantages).all():
        raise ValueError(f"advantage_fn returned non-finite advantages for rewards {reward_matrix.tolist()}")

    input_ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], dim=1)
    attention_mask = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], dim=1)
    mini_batches = plan_mini_batches(config, reward_matrix)
    # pi_old is the policy that sampled, for every optimizer step of this rollout:
    # refreshed per pass or per mini-batch, the ratio would restart at 1 there, and
    # with one mini-batch per pass the clip would never act. With one optimizer step
    # the policy has not moved before its forward, so that forward's detached
    # log-probs serve (ratio 1, as TRL), at no extra cost.
    if config.old_logprobs == "sampler":
        old_logp = rollout.sampler_logp
    elif optimizer_steps_per_rollout(config) > 1:
        old_logp = logprobs_before_update(config, policy, input_ids, attention_mask, rollout.completion_mask,
                                          mini_batches)
    else:
        old_logp = None
    ref_logp = (sequence_logprobs(config, reference, input_ids, attention_mask, rollout.completion_mask)
                if config.beta != 0.0 else None)
    return Scored(samples, rollout, texts, input_ids, attention_mask, reward_matrix, components,
                  advantages.to(torch.float32), old_logp, ref_logp, mini_batches)


# --------------------------------------------------------------------------- step 6

def micro_batch_loss(config: TrainConfig, policy, scored: Scored, rows: torch.Tensor, mini_batch: torch.Tensor):
    """The loss of `rows` (completion indices, part of the row indices `mini_batch`), scaled
    so that summing over a mini-batch's micro-batches gives that mini-batch's loss exactly.

    Returns (loss, metrics, logp): the scaled scalar loss, grpo_loss's metrics of these rows,
    and their log-probs (len(rows), S), detached.
    """
    mask = scored.rollout.completion_mask[rows]
    logp = sequence_logprobs(config, policy, scored.input_ids[rows], scored.attention_mask[rows], mask)
    old = scored.old_logp[rows] if scored.old_logp is not None else logp.detach()
    ref = scored.ref_logp[rows] if scored.ref_logp is not None else None
    # dapo, as TRL 1.16: every token of the rollout weighs the same in every optimizer step,
    # 1 / (rollout tokens / num_mini_batches), whichever mini-batch holds it. TRL divides by
    # num_items_in_batch (the generation batch's tokens) x gradient_accumulation_steps /
    # steps_per_generation, i.e. by the tokens per optimizer step; not by the mini-batch's own
    # count, which would weigh the tokens of a short mini-batch more. Filtered groups do not
    # count: they are not trained on.
    dapo_tokens = scored.trained_tokens if config.loss_type == "dapo" else None
    out = grpo_loss(logp, old, scored.advantages.reshape(-1)[rows], mask, ref_logp=ref, beta=config.beta,
                    epsilon=config.epsilon, epsilon_high=config.epsilon_high, loss_type=config.loss_type,
                    max_completion_length=config.max_completion_length,
                    importance_sampling_level=config.importance_sampling_level,
                    kl_estimator=config.kl_estimator, num_items=dapo_tokens)
    if config.loss_type in ("grpo", "dr_grpo"):     # means over completions
        scale = len(rows) / len(mini_batch)
    elif config.loss_type == "bnpo":                # mean over tokens
        scale = mask.sum().item() / int(scored.rollout.completion_mask[mini_batch].sum())
    else:                                           # dapo: sum / rollout tokens, times num_mini_batches
        scale = float(config.num_mini_batches)
    return out.loss * scale, out.metrics, logp.detach()


def skip_optimizer_step(scheduler) -> None:
    """An empty mini-batch: no update, but the learning rate moves on as if one were taken,
    so that it stays on its schedule (K scheduler steps per rollout, always)."""
    with warnings.catch_warnings():
        # torch warns when a scheduler steps before the optimizer ever has; here that is meant.
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()` before"))
        scheduler.step()


def optimise(config: TrainConfig, policy, optimizer, scheduler, scored: Scored) -> dict[str, float]:
    """num_iterations passes over the rollout; each pass is one optimizer step per mini-batch
    of scored.mini_batches: K = num_iterations x num_mini_batches optimizer steps per rollout.

    Returns the last optimizer step's loss metrics (grpo_loss's, plus grad_norm) and
      learning_rate       the learning rate of this rollout's first optimizer step
      optimizer_steps     the optimizer steps taken: K, less those of empty mini-batches
                          (which still step the schedule)
      sampler_gap/...     the trainer's log-probs before the update against the sampler's
                          (see sampler_gap); absent when no row is trained on
      skipped_update      1.0 when no optimizer step was taken
    """
    learning_rate = optimizer.param_groups[0]["lr"]   # what the first step below uses
    metrics: dict[str, float] = {}
    steps_taken, first_forward = 0, []
    for _ in range(config.num_iterations):
        for mini_batch in scored.mini_batches:
            if len(mini_batch) == 0:
                skip_optimizer_step(scheduler)
                continue
            optimizer.zero_grad(set_to_none=True)
            accumulated: dict[str, float] = {}
            for micro in mini_batch.split(config.micro_batch_size):
                loss, micro_metrics, logp = micro_batch_loss(config, policy, scored, micro, mini_batch)
                loss.backward()
                if steps_taken == 0:   # the policy has not moved yet: it is the one that sampled
                    first_forward.append(logp)
                share = len(micro) / len(mini_batch)
                for key, value in micro_metrics.items():
                    accumulated[key] = accumulated.get(key, 0.0) + share * value
            # max_grad_norm 0: measure the norm (inf never clips) without clipping.
            norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm or math.inf)
            optimizer.step()
            scheduler.step()
            steps_taken += 1
            accumulated["grad_norm"] = float(norm)
            metrics = accumulated   # the last optimizer step's metrics
    if steps_taken == 0:
        metrics["skipped_update"] = 1.0
    metrics["learning_rate"] = learning_rate
    metrics["optimizer_steps"] = float(steps_taken)
    if first_forward:
        metrics.update(_gap_before_update(config, scored, first_forward))
    return metrics


def _gap_before_update(config: TrainConfig, scored: Scored, first_forward: list[torch.Tensor]) -> dict[str, float]:
    """The sampler gap over the log-probs the trainer had before the rollout's first update:
    the recomputed pi_old (every trained row) when there is one, else the first optimizer
    step's own forward (its mini-batch's rows; with one step per rollout, every trained row).
    Either way, groups dropped by filter_zero_std_groups are not included."""
    if config.old_logprobs == "recomputed" and scored.old_logp is not None:
        rows = torch.cat(scored.mini_batches)
        trainer_logp = scored.old_logp[rows]
    else:
        rows = scored.mini_batches[0]   # the first step's mini-batch (the largest, never empty here)
        trainer_logp = torch.cat(first_forward)
    return sampler_gap(trainer_logp, scored.rollout.sampler_logp[rows], scored.rollout.completion_mask[rows])


def sampler_gap(trainer_logp: torch.Tensor, sampler_logp: torch.Tensor,
                completion_mask: torch.Tensor) -> dict[str, float]:
    """How far the trainer's log-probs of the sampled tokens are from the sampler's: (n, S) x 3 -> floats.

      sampler_gap/mean_abs   mean over completion tokens of |log pi_trainer - log pi_sampler|
      sampler_gap/max_ratio  the largest exp(|log pi_trainer - log pi_sampler|): the worst
                             token's importance weight, either way round (1 = no gap)

    Both engines compute the trainer's maths, so in float32 at the same temperature the gap
    is rounding (the CPU tier: mean ~2e-7, max_ratio ~1.00001); a sampler with other
    kernels or precision (vLLM, bf16), or at another temperature, shows here.
    """
    mask = completion_mask.bool()
    gap = (trainer_logp.double() - sampler_logp.double()).abs()[mask]
    return {"sampler_gap/mean_abs": gap.mean().item(), "sampler_gap/max_ratio": math.exp(gap.max().item())}


# --------------------------------------------------------------------------- the loop

def step_metrics(scored: Scored, update: dict[str, float], seconds: dict[str, float]) -> dict:
    lengths = scored.rollout.completion_mask.sum(-1).float()
    zero_std = zero_std_groups(scored.rewards).float().mean().item()
    metrics = {
        "reward/mean": scored.rewards.mean().item(), "reward/std": scored.rewards.std().item(),
        **{f"reward/{name}": values.mean().item() for name, values in scored.components.items()},
        "zero_std_groups": zero_std,
        "completion_length/mean": lengths.mean().item(), "completion_length/min": lengths.min().item(),
        "completion_length/max": lengths.max().item(),
        "truncated": 1.0 - scored.rollout.finished.float().mean().item(),
        "entropy": _sampler_entropy(scored.rollout),
        **{k: v for k, v in update.items() if k not in ("completion_length/mean",)},
        **{f"time/{k}": v for k, v in seconds.items()},
    }
    return metrics


def _sampler_entropy(rollout: Rollout) -> float:
    """Mean over completion tokens of -log pi(token): a Monte-Carlo estimate of the
    sampling policy's entropy per token (exact in expectation)."""
    mask = rollout.completion_mask
    return float(-(rollout.sampler_logp * mask).sum() / mask.sum())


@dataclass
class RunResult:
    policy: torch.nn.Module
    tokenizer: object
    summary: dict
    history: list[dict]


def train(config: TrainConfig, *, advantage_fn: AdvantageFn | None = None,
          reward_functions: dict[str, tuple[RewardFn, float]] | None = None,
          policy=None, tokenizer=None, resume: str | Path | None = None, stop_after: int | None = None,
          log: Callable[[str], None] = print) -> RunResult:
    """Train a policy with GRPO as `config` says; write the run to config.output_dir.

    advantage_fn: rewards (B, G) -> advantages (B, G); default group_advantages
        with config.advantage_scale / advantage_std.
    reward_functions: {name: (fn, weight)} with TRL's signature; default the
        config's `rewards` weights over grpo_edu.rewards.
    policy, tokenizer: a model to train instead of loading config.model.
    resume: a run directory whose latest checkpoint to continue from.
    stop_after: stop (checkpointed) after this many steps in total: a test's
        stand-in for an interrupted run.
    """
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    if advantage_fn is None:
        advantage_fn = lambda r: group_advantages(r, scale=config.advantage_scale, std=config.advantage_std)
    if reward_functions is None:
        reward_functions = reward_functions_from_config(config.rewards)
    if policy is None:
        policy, tokenizer = load_policy(STARTING_POLICY if config.model == "start" else config.model,
                                        device=config.device)
    reference = make_reference(policy) if config.beta != 0.0 else None
    policy.train()
    # fused: one kernel for all parameters (the same algorithm; 0.35 ms a step instead of 1.2 on the CPU tier)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=config.learning_rate, betas=tuple(config.adam_betas),
                                  weight_decay=config.weight_decay, fused=True)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, learning_rate_factor(config))
    engine = make_engine(config, policy, tokenizer)
    state = TrainState(prompt_rng=random.Random(config.seed))
    output_dir = Path(config.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    train_pool = tasks.make_dataset(config.task, n=TRAIN_POOL, split="train", seed=0)
    held_out = tasks.make_dataset(config.task, n=config.eval_size, split="test", seed=0)
    history: list[dict] = []

    def held_out_accuracy() -> float:
        policy.eval()
        metrics = evaluate(policy, tokenizer, held_out, max_new_tokens=config.max_completion_length)
        policy.train()
        return metrics["greedy_accuracy"]

    if resume is not None:
        summary_so_far = checkpoint.load(Path(resume), policy, reference, optimizer, scheduler, state, log=log)
        start_accuracy, elapsed = summary_so_far["start_accuracy"], summary_so_far["seconds"]
        history = checkpoint.read_history(output_dir, up_to_step=state.step, log=log)
    else:
        start_accuracy, elapsed = held_out_accuracy(), 0.0
        (output_dir / "metrics.jsonl").write_text("")
        (output_dir / "config.json").write_text(json.dumps(config.to_dict(), indent=2) + "\n")
        before = _samples_table(policy, tokenizer, held_out[:4], config.max_completion_length)
        (output_dir / "samples_before.txt").write_text(before)
        log(f"start: held-out greedy accuracy {start_accuracy:.4f}")

    progress = _progress_bar(config, state.step)
    accuracy, started = start_accuracy, time.perf_counter()
    last = min(config.steps, stop_after) if stop_after is not None else config.steps
    while state.step < last:
        t0 = time.perf_counter()
        samples = sample_prompts(config, state, train_pool)
        rollout = roll_out(config, samples, tokenizer, engine)
        t1 = time.perf_counter()
        scored = score(config, samples, rollout, policy, reference, tokenizer, reward_functions, advantage_fn)
        t2 = time.perf_counter()
        update = optimise(config, policy, optimizer, scheduler, scored)
        t3 = time.perf_counter()
        state.step += 1
        seconds = {"rollout": t1 - t0, "scoring": t2 - t1, "update": t3 - t2}
        metrics = {"step": state.step, **step_metrics(scored, update, seconds)}

        if config.ref_sync_steps and state.step % config.ref_sync_steps == 0 and reference is not None:
            reference.load_state_dict(policy.state_dict())
        if state.step % config.eval_every == 0 or state.step == config.steps:
            accuracy = held_out_accuracy()
            metrics["eval/greedy_accuracy"] = accuracy
        history.append(metrics)
        with open(output_dir / "metrics.jsonl", "a") as f:
            f.write(json.dumps(metrics) + "\n")
        if progress is not None:
            progress.set_postfix_str(f"reward {metrics['reward/mean']:.3f} held-out acc {accuracy:.3f}",
                                     refresh=False)
            progress.update(1)
        due = config.checkpoint_every and state.step % config.checkpoint_every == 0
        if due or state.step == last:
            total = elapsed + time.perf_counter() - started
            checkpoint.save(output_dir, policy, reference, optimizer, scheduler, state,
                            {"start_accuracy": start_accuracy, "seconds": total})
    if progress is not None:
        progress.close()

    seconds = elapsed + time.perf_counter() - started
    summary = _summary(config, history, start_accuracy, seconds, finished=state.step >= config.steps)
    (output_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    if state.step >= config.steps:
        after = _samples_table(policy, tokenizer, held_out[:4], config.max_completion_length)
        (output_dir / "samples_after.txt").write_text(after)
    return RunResult(policy, tokenizer, summary, history)


def _summary(config: TrainConfig, history: list[dict], start_accuracy: float, seconds: float,
             finished: bool) -> dict:
    evals = [(m["step"], m["eval/greedy_accuracy"]) for m in history if "eval/greedy_accuracy" in m]
    step_times = [sum(m[f"time/{key}"] for key in TIME_SPLIT) for m in history]
    return {
        "start_accuracy": start_accuracy,
        "final_accuracy": evals[-1][1] if evals else start_accuracy,
        "best_accuracy": max([a for _, a in evals], default=start_accuracy),
        "steps": history[-1]["step"] if history else 0,
        "finished": finished,
        "seconds": seconds,
        "median_steps_per_second": 1.0 / statistics.median(step_times) if step_times else 0.0,
        "time_split_median": {
            key: statistics.median(m[f"time/{key}"] for m in history) if history else 0.0
            for key in TIME_SPLIT},
        "eval_curve": evals,
        "config": config.to_dict(),
    }


def _samples_table(policy, tokenizer, samples: list[dict], max_new_tokens: int) -> str:
    from grpo_edu.models import generate_completions

    policy.eval()
    completions = generate_completions(policy, tokenizer, [s["prompt"] for s in samples],
                                       max_new_tokens=max_new_tokens)
    policy.train()
    lines = []
    for sample, (completion,) in zip(samples, completions):
        correct = rewards.accuracy_reward([completion], answer=[sample["answer"]], task=[sample.get("task")])[0]
        lines.append(f"{sample['prompt']}{completion}   ({'right' if correct else 'wrong'}, answer {sample['answer']})")
    return "\n".join(lines) + "\n"


def _progress_bar(config: TrainConfig, initial: int):
    if not config.progress:
        return None
    from tqdm.auto import tqdm
    # No rates in the bar: its text must not vary from run to run (the book checks outputs).
    return tqdm(total=config.steps, initial=initial, desc="GRPO",
                bar_format="{desc}: {n_fmt}/{total_fmt} steps |{bar:20}| {postfix}")
