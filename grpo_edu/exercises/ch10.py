"""Checkers for chapter 10, "Scaling out"."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.runtime.distributed import World
from grpo_edu.exercises.checking import CheckResult
from grpo_edu.algorithm.aggregation import LOSS_TYPES
from grpo_edu.algorithm.loss import grpo_loss

F64 = torch.float64


# --------------------------------------------------------------------------- 9.1

# (B prompts, G completions each, world size): the rows divide into whole prompts per rank.
RANK_ROW_CASES = [(16, 8, 2), (16, 8, 4), (6, 4, 3), (4, 3, 1), (8, 2, 8)]
# B not divisible by the world size: the trainer refuses. In the second, B x G divides, so an
# even split of the rows would exist, and would cut a group in two.
INDIVISIBLE_CASES = [(15, 8, 2), (3, 4, 2)]


def _expected_rows(B: int, G: int, world_size: int, rank: int) -> list[int]:
    prompts = World(rank=rank, size=world_size).shard(B)
    return list(range(prompts.start * G, prompts.stop * G))


def _rows(value) -> list[int]:
    if isinstance(value, torch.Tensor):
        value = value.tolist()
    array = np.asarray(list(value))
    if array.ndim != 1 or (array.size and array.dtype.kind not in "iu"):
        raise TypeError(f"expected a flat list of integer row indices, got {value!r}")
    return [int(v) for v in array]


def _span(rows: list[int]) -> str:
    if rows and rows == list(range(rows[0], rows[-1] + 1)):
        return f"rows {rows[0]}..{rows[-1]}"
    return f"rows {rows}" if len(rows) <= 12 else f"rows {rows[:12]}... ({len(rows)} rows)"


def _split_groups(B: int, G: int, owners: dict[int, list[int]]) -> str | None:
    """The first prompt whose G rows more than one rank holds, in words."""
    holders: dict[int, set[int]] = {}
    for rank, rows in owners.items():
        for row in rows:
            holders.setdefault(row // G, set()).add(rank)
    for prompt in range(B):
        ranks = holders.get(prompt, set())
        if len(ranks) > 1:
            return f"prompt {prompt}'s {G} completions across ranks {sorted(ranks)}"
    return None


def check_rank_rows(fn: Callable[[int, int, int, int], list[int]]) -> CheckResult:
    """Exercise 10.1: fn(B, G, world_size, rank) -> the completion rows rank `rank` owns, in the
    prompt-major layout (completion j of prompt i is row i * G + j): whole prompts, the
    trainer's contiguous share (World.shard); a ValueError when B does not divide."""
    result = CheckResult("exercise 10.1 which rows a rank owns")
    for B, G, world_size in RANK_ROW_CASES:
        name = f"B={B}, G={G}, {world_size} ranks"
        owners, problems = {}, []
        for rank in range(world_size):
            try:
                owners[rank] = _rows(fn(B, G, world_size, rank))
            except Exception as error:  # the reader's code: report, don't crash
                problems.append(f"rank {rank} raised {type(error).__name__}: {error}")
                break
        if not problems:
            split = _split_groups(B, G, owners)
            every_row = sorted(row for rows in owners.values() for row in rows)
            if split:
                problems.append(f"{split}: its advantages need all {G} rewards on one rank")
            elif every_row != list(range(B * G)):
                missing = sorted(set(range(B * G)) - set(every_row))
                twice = sorted({row for row in every_row if every_row.count(row) > 1})
                problems.append(f"the ranks together must own each of the {B * G} rows once"
                                + (f"; no rank owns {missing[:8]}" if missing else "")
                                + (f"; more than one rank owns {twice[:8]}" if twice else ""))
            share_problems = []
            for rank, rows in owners.items():
                if split or every_row != list(range(B * G)) or sorted(rows) == _expected_rows(B, G, world_size, rank):
                    continue
                prompts = sorted({row // G for row in rows})
                if not prompts:
                    share_problems.append((rank, "owns no rows"))
                elif prompts != list(range(prompts[0], prompts[-1] + 1)):
                    share_problems.append((rank, f"owns whole prompts, but not consecutive ones ({_span(rows)}): "
                                                 f"the trainer gives each rank one contiguous block"))
                else:
                    share_problems.append((rank, f"owns a contiguous block of whole prompts ({_span(rows)}), but not "
                                                 f"the trainer's: block r in rank order, B / world_size prompts each"))
            if share_problems:
                rank, words = share_problems[0]
                others = len(share_problems) - 1
                problems.append(f"rank {rank}" + (f" (and {others} other rank{'s' * (others > 1)})" if others else "")
                                + f" {words}")
        result.record(name, problems)
    for B, G, world_size in INDIVISIBLE_CASES:
        name = f"B={B}, G={G}, {world_size} ranks"
        owners, raised = {}, True
        for rank in range(world_size):
            try:
                owners[rank] = _rows(fn(B, G, world_size, rank))
                raised = False
            except ValueError:
                pass
            except Exception as error:
                owners, raised = None, False
                result.failures.append(f"{name}: raised {type(error).__name__}: {error}; {B} prompts do not "
                                       f"split into whole prompts over {world_size} ranks, so the trainer refuses "
                                       f"(a ValueError)")
                break
        if owners is None:
            continue
        if raised:
            result.passed += 1
            continue
        why = _split_groups(B, G, owners) if len(owners) == world_size else None
        result.failures.append(f"{name}: {B} prompts do not split into whole prompts over {world_size} ranks, "
                               f"so the trainer refuses (a ValueError)" + (f"; yours split {why}" if why else
                                                                          "; yours returned rows"))
    return result


# --------------------------------------------------------------------------- 9.2

L = 12   # max_completion_length of the exercise's batches (dr_grpo's constant)


def _batch(lengths: list[list[int]], seed: int) -> dict:
    """A fabricated (B, G, S) batch with the given completion lengths, float64."""
    lengths = torch.tensor(lengths)
    B, G = lengths.shape
    generator = torch.Generator().manual_seed(seed)
    mask = torch.arange(L) < lengths[..., None]
    old_logp = -3 * torch.rand(B, G, L, generator=generator, dtype=F64) * mask
    logp = ((old_logp + 0.2 * torch.randn(B, G, L, generator=generator, dtype=F64)).clamp(max=0)) * mask
    rewards = torch.rand(B, G, generator=generator, dtype=F64).round()
    rewards[:, 0], rewards[:, 1] = 1.0, 0.0          # no group without signal
    return {"logp": logp, "old_logp": old_logp, "advantages": group_advantages(rewards), "mask": mask}


# (description, completion lengths (B, G), the prompts each rank holds)
RANK_LOSS_CASES = [
    ("2 ranks of 2 prompts, rank 1's completions longer",
     [[3, 5, 2, 4], [6, 2, 3, 5], [12, 9, 11, 7], [10, 12, 8, 12]], [[0, 1], [2, 3]]),
    ("3 ranks of 2, 1 and 1 prompts",
     [[3, 5, 2, 4], [6, 2, 3, 5], [12, 9, 11, 7], [1, 12, 2, 12]], [[0, 1], [2], [3]]),
]


def _whole_and_parts(fn, case, loss_type):
    """(whole loss, whole gradient, each rank's returned loss, DDP's averaged gradient)."""
    _, lengths, shares = case
    batch = _batch(lengths, seed=len(shares))
    mask, adv = batch["mask"], batch["advantages"]
    whole_logp = batch["logp"].clone().requires_grad_()
    whole = grpo_loss(whole_logp, batch["old_logp"], adv, mask, loss_type=loss_type, max_completion_length=L).loss
    whole.backward()
    token_counts = [int(mask[prompts].sum()) for prompts in shares]
    completion_counts = [len(prompts) * mask.shape[1] for prompts in shares]
    # The "parameters" every rank shares: the whole logp. DDP averages each rank's gradient.
    shared = batch["logp"].clone().requires_grad_()
    losses, averaged = [], torch.zeros_like(shared)
    for prompts in shares:
        loss = fn(shared[prompts], batch["old_logp"][prompts], adv[prompts], mask[prompts],
                  list(token_counts), list(completion_counts), loss_type, L)
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(f"expected a scalar tensor (the loss to backpropagate), got {loss!r}")
        if not loss.requires_grad:
            raise TypeError("the returned loss does not depend on logp (no gradient would reach the policy)")
        gradient, = torch.autograd.grad(loss.reshape(()), shared, allow_unused=True)
        averaged += (torch.zeros_like(shared) if gradient is None else gradient) / len(shares)
        losses.append(float(loss.detach()))
    return float(whole.detach()), whole_logp.grad, losses, averaged, batch, token_counts, completion_counts


def _diagnose(losses, batch, shares, token_counts, completion_counts, loss_type) -> str:
    """Name the mistake when the reader's rank losses are a known wrong scale."""
    mask, N = batch["mask"], len(shares)

    def part(prompts, **counts):
        return float(grpo_loss(batch["logp"][prompts], batch["old_logp"][prompts], batch["advantages"][prompts],
                               mask[prompts], loss_type=loss_type, max_completion_length=L, **counts).loss)
    own = [part(p) for p in shares]
    global_counts = [part(p, num_items=sum(token_counts), num_completions=sum(completion_counts)) for p in shares]
    if np.allclose(losses, own, rtol=1e-9, atol=1e-12):
        return "each rank divided by its own counts (grpo_loss's defaults), not the whole batch's"
    if np.allclose(losses, global_counts, rtol=1e-9, atol=1e-12) and N > 1:
        return f"the whole batch's counts, but DDP averages the ranks' gradients: 1/{N} of the 1-process gradient"
    if np.allclose(losses, [N * x for x in own], rtol=1e-9, atol=1e-12) and N > 1:
        return "multiplied by the world size, but divided by each rank's own counts"
    return ""


def check_rank_loss(fn: Callable) -> CheckResult:
    """Exercise 10.2: fn(logp, old_logp, advantages, completion_mask, token_counts,
    completion_counts, loss_type, max_completion_length) -> this rank's loss, whose
    gradients, averaged over ranks as DDP does, are the 1-process gradient.

    logp, old_logp, completion_mask: this rank's (b, G, S); advantages (b, G);
    token_counts, completion_counts: every rank's (the gathered counts, a list per rank);
    one mini-batch, beta = 0."""
    result = CheckResult("exercise 10.2 a rank's loss")
    for case in RANK_LOSS_CASES:
        description, _, shares = case
        for loss_type in LOSS_TYPES:
            name = f"{loss_type}, {description}"
            try:
                whole, whole_grad, losses, averaged, batch, tokens, completions = _whole_and_parts(fn, case, loss_type)
            except Exception as error:  # the reader's code: report, don't crash
                result.record_raised(name, error)
                continue
            difference = float((averaged - whole_grad).abs().max())
            if difference <= 1e-12 * max(1.0, float(whole_grad.abs().max())):
                result.passed += 1
                continue
            why = _diagnose(losses, batch, shares, tokens, completions, loss_type)
            result.failures.append(f"{name}: {why}" if why else
                                   f"{name}: the ranks' averaged gradient is not the 1-process gradient "
                                   f"(off by up to {difference:.1g})")
    return result


# --------------------------------------------------------------------------- 9.3

# A GPU-sized rollout on one node of 8 GPUs, for the arithmetic of exercise 10.3.
SCALE_QUIZ = {"world_size": 8, "prompts_per_step": 256, "num_generations": 16, "max_completion_length": 1024,
              "num_iterations": 1, "num_mini_batches": 4, "parameters": 1_500_000_000}
# What each answer counts (the chapter computes each for its own configs; the formulas are the
# exercise). fsdp2_bytes_per_rank: AdamW's training state in float32, as the chapter's memory cell.
QUANTITIES = {
    "prompts_per_rank": "the prompts one rank samples per step",
    "completions_per_rank": "the completions one rank samples and scores per step",
    "completions_per_step": "the completions of one step, all ranks together",
    "max_tokens_per_step": "the completion tokens of one step, all ranks together, every completion at the limit",
    "optimizer_steps_per_rollout": "the optimizer steps one rollout feeds",
    "fsdp2_bytes_per_rank": "the bytes of weights, gradients and AdamW's two moments (float32) one rank holds "
                            "under FSDP2",
}


def scale_answers(quiz: dict = SCALE_QUIZ) -> dict[str, int]:
    """The worked answers of exercise 10.3 for a quiz like SCALE_QUIZ."""
    N, B, G = quiz["world_size"], quiz["prompts_per_step"], quiz["num_generations"]
    return {"prompts_per_rank": B // N, "completions_per_rank": B // N * G, "completions_per_step": B * G,
            "max_tokens_per_step": B * G * quiz["max_completion_length"],
            "optimizer_steps_per_rollout": quiz["num_iterations"] * quiz["num_mini_batches"],
            "fsdp2_bytes_per_rank": quiz["parameters"] * 16 // N}


def random_quiz(seed: int) -> dict:
    """A quiz like SCALE_QUIZ with other numbers, drawn from random.Random(seed)."""
    import random
    draw = random.Random(seed)
    N = draw.choice([2, 4, 8, 16, 32])
    return {"world_size": N, "prompts_per_step": N * draw.randint(2, 64), "num_generations": draw.choice([4, 8, 12, 16, 32]),
            "max_completion_length": draw.choice([256, 512, 1000, 2048, 4096]),
            "num_iterations": draw.randint(1, 3), "num_mini_batches": draw.choice([1, 2, 4, 8, 16]),
            "parameters": N * draw.randint(10, 1000) * 1_000_000}


# The mistakes a reader makes, by the factor they put on one answer: (key, factor) -> what went wrong.
_MISTAKES = {
    ("prompts_per_rank", "N"): "the whole step's prompts, not one rank's share",
    ("completions_per_rank", "1/G"): "counts prompts, not their G completions each",
    ("completions_per_rank", "N"): "the whole step's completions, not one rank's share",
    ("completions_per_step", "1/N"): "one rank's completions, not the whole step's",
    ("completions_per_step", "1/G"): "counts prompts, not their G completions each",
    ("max_tokens_per_step", "1/N"): "one rank's tokens, not the whole step's",
    ("max_tokens_per_step", "1/G"): "counts one completion per prompt, not G",
    ("max_tokens_per_step", "1/L"): "counts completions, not their tokens",
    ("fsdp2_bytes_per_rank", "N"): "a whole copy on every rank (DDP's), not FSDP2's 1/N shard",
    ("fsdp2_bytes_per_rank", "1/4"): "the weights alone, not the gradients and AdamW's two moments",
    ("fsdp2_bytes_per_rank", "3/4"): "one AdamW moment short (each of the two is 4 bytes per parameter)",
    ("fsdp2_bytes_per_rank", "1/2"): "the weights and gradients, without AdamW's two moments",
    ("fsdp2_bytes_per_rank", "1/8"): "2 bytes per parameter (bf16 weights), not float32's training state",
}
_counter = iter(range(1 << 62))


def _mistake(key: str, got: float, right: int, quiz: dict) -> str:
    """What is wrong with one answer, in words: a known mistake, or too large / too small."""
    N, G, L = quiz["world_size"], quiz["num_generations"], quiz["max_completion_length"]
    factors = {"N": N, "1/N": 1 / N, "1/G": 1 / G, "1/L": 1 / L, "1/4": 1 / 4, "3/4": 3 / 4, "1/2": 1 / 2,
               "1/8": 1 / 8}
    for (name, factor), words in _MISTAKES.items():
        if name == key and got == right * factors[factor]:
            return f"{key} is wrong: {words}"
    if key == "optimizer_steps_per_rollout" and got in (quiz["num_iterations"], quiz["num_mini_batches"],
                                                        quiz["num_iterations"] + quiz["num_mini_batches"]):
        return f"{key} is wrong: every pass over the rollout (num_iterations) takes num_mini_batches steps"
    return f"{key} is {'too large' if got > right else 'too small'}"


def check_scale_answers(fn: Callable[[dict], dict], seed: int | None = None) -> CheckResult:
    """Exercise 10.3: fn(quiz) -> {key: number} for each key of QUANTITIES, for a quiz like SCALE_QUIZ.

    The checker asks about SCALE_QUIZ and about two quizzes drawn from `seed` (by default a new seed
    at every call: 0 at the first call of a session, then 1, ...), so an answer must be computed
    from the quiz, not typed in. A wrong number is named, with what went wrong where the mistake
    is a known one, never with the right number."""
    result = CheckResult("exercise 10.3 a step on N GPUs")
    seed = next(_counter) if seed is None else seed
    quizzes = [("SCALE_QUIZ", SCALE_QUIZ)] + [(f"ch10.random_quiz({2 * seed + k})", random_quiz(2 * seed + k))
                                               for k in (1, 2)]
    seen: dict[str, str] = {}   # a report already given, and the first quiz that got it
    for name, quiz in quizzes:
        try:
            answers = fn(dict(quiz))
        except Exception as error:  # the reader's code: report, don't crash
            result.record_raised(name, error)
            continue
        if not isinstance(answers, dict):
            result.failures.append(f"{name}: returned {type(answers).__name__}, not a dict of {list(QUANTITIES)}")
            continue
        problems, missing = [], [key for key in QUANTITIES if answers.get(key) is None]
        if missing:
            problems.append(f"no number for {', '.join(missing)}")
        for key, right in scale_answers(quiz).items():
            if key in missing:
                continue
            try:
                got = float(answers[key])
            except (TypeError, ValueError):
                problems.append(f"{key} is {answers[key]!r}, not a number")
                continue
            if got != right:
                problems.append(_mistake(key, got, right, quiz))
        unknown = sorted(set(answers) - set(QUANTITIES))
        if unknown:
            problems.append(f"unknown keys {unknown}")
        report = "; ".join(problems)
        if problems and report in seen:
            problems = [f"the same as {seen[report]}"]
        seen.setdefault(report, name)
        result.record(name, problems)
    return result
