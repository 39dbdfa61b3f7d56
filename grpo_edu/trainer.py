"""The GRPO training loop, as plain code that reads top to bottom.

One step:

    1. sample B prompts from the train split                        sample_prompts
    2. roll out G completions each, with the sampler's log-probs    roll_out  -> (B*G, S)
    3. score every completion with the reward functions            score     -> rewards (B, G)
    4. group-relative advantages                                              -> (B, G)
    5. log-probs of the frozen reference (for the KL term)                    -> (B*G, S)
    6. num_iterations passes over the rollout, in mini-batches of   optimise
       whole groups, each an optimizer step: micro-batch forward/backward
       with gradient accumulation, global grad-norm clip, AdamW, LR schedule
    7. log metrics; evaluate, re-sync the reference, checkpoint when due

The pieces are arguments: `train(config, advantage_fn=my_advantages)` trains
with a reader's own advantage function, `reward_functions=` with their rewards.
"""

from __future__ import annotations

import copy
import json
import math
import random
import statistics
import time
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
# A step's wall-clock, in three parts: sampling; rewards, advantages and reference log-probs; the update.
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
    old_logp: torch.Tensor | None    # (N, S) only when num_iterations > 1
    ref_logp: torch.Tensor | None    # (N, S) only when beta > 0


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


def learning_rate_factor(config: TrainConfig) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < config.warmup_steps:
            return (step + 1) / config.warmup_steps
        progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
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


@torch.no_grad()
def score(config: TrainConfig, samples: list[dict], rollout: Rollout, policy, reference, tokenizer,
          reward_functions: dict[str, tuple[RewardFn, float]], advantage_fn: AdvantageFn) -> Scored:
    """Steps 3 to 5: rewards, group advantages, reference (and, for num_iterations > 1, old) log-probs."""
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
    # pi_old is the policy that sampled. With one pass over the rollout the
    # policy has not moved before its first forward, so the loss uses the
    # detached new log-probs (ratio 1, as TRL); with more passes, record them now.
    old_logp = (sequence_logprobs(config, policy, input_ids, attention_mask, rollout.completion_mask)
                if config.num_iterations > 1 else None)
    ref_logp = (sequence_logprobs(config, reference, input_ids, attention_mask, rollout.completion_mask)
                if config.beta != 0.0 else None)
    return Scored(samples, rollout, texts, input_ids, attention_mask, reward_matrix, components,
                  advantages.to(torch.float32), old_logp, ref_logp)


# --------------------------------------------------------------------------- step 6

def micro_batch_loss(config: TrainConfig, policy, scored: Scored, rows: torch.Tensor,
                     mini_rows: int, mini_tokens: int):
    """The loss of `rows` (completion indices), scaled so that summing over a
    mini-batch's micro-batches gives that mini-batch's loss exactly."""
    mask = scored.rollout.completion_mask[rows]
    logp = sequence_logprobs(config, policy, scored.input_ids[rows], scored.attention_mask[rows], mask)
    old = scored.old_logp[rows] if scored.old_logp is not None else logp.detach()
    ref = scored.ref_logp[rows] if scored.ref_logp is not None else None
    out = grpo_loss(logp, old, scored.advantages.reshape(-1)[rows], mask, ref_logp=ref, beta=config.beta,
                    epsilon=config.epsilon, epsilon_high=config.epsilon_high, loss_type=config.loss_type,
                    max_completion_length=config.max_completion_length,
                    importance_sampling_level=config.importance_sampling_level,
                    kl_estimator=config.kl_estimator, num_items=mini_tokens)
    if config.loss_type in ("grpo", "dr_grpo"):     # means over completions
        scale = len(rows) / mini_rows
    elif config.loss_type == "bnpo":                # mean over tokens
        scale = mask.sum().item() / mini_tokens
    else:                                           # dapo: num_items is already the mini-batch's
        scale = 1.0
    return out.loss * scale, out.metrics, len(rows) / mini_rows


def optimise(config: TrainConfig, policy, optimizer, scheduler, scored: Scored) -> dict[str, float]:
    """num_iterations passes over the rollout; each pass is num_mini_batches optimizer steps."""
    G = config.num_generations
    groups = list(range(scored.rewards.shape[0]))
    if config.filter_zero_std_groups:   # dynamic sampling: groups that agree teach nothing
        flat = zero_std_groups(scored.rewards)
        groups = [b for b in groups if not flat[b]]
    metrics: dict[str, float] = {}
    if not groups:
        return {"skipped_update": 1.0}
    per_mini = max(1, len(groups) // config.num_mini_batches)
    for _ in range(config.num_iterations):
        for start in range(0, len(groups), per_mini):
            chosen = torch.tensor(groups[start:start + per_mini])
            rows = (chosen[:, None] * G + torch.arange(G)).reshape(-1)
            mini_tokens = int(scored.rollout.completion_mask[rows].sum())
            optimizer.zero_grad(set_to_none=True)
            accumulated: dict[str, float] = {}
            for micro in rows.split(config.micro_batch_size):
                loss, micro_metrics, share = micro_batch_loss(config, policy, scored, micro, len(rows), mini_tokens)
                loss.backward()
                for key, value in micro_metrics.items():
                    accumulated[key] = accumulated.get(key, 0.0) + share * value
            # max_grad_norm 0: measure the norm (inf never clips) without clipping.
            norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), config.max_grad_norm or math.inf)
            optimizer.step()
            scheduler.step()
            accumulated["grad_norm"] = float(norm)
            metrics = accumulated   # the last optimizer step's metrics
    metrics["learning_rate"] = scheduler.get_last_lr()[0]
    return metrics


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
        summary_so_far = checkpoint.load(Path(resume), policy, reference, optimizer, scheduler, state)
        start_accuracy, elapsed = summary_so_far["start_accuracy"], summary_so_far["seconds"]
        history = checkpoint.read_history(output_dir, up_to_step=state.step)
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
