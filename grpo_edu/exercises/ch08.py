"""Checkers for chapter 8, "Scaling out"."""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch

from grpo_edu.advantages import group_advantages
from grpo_edu.distributed import World
from grpo_edu.exercises.checking import CheckResult
from grpo_edu.loss import LOSS_TYPES, grpo_loss

F64 = torch.float64


# --------------------------------------------------------------------------- 8.1

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
    """The first prompt whose G rows more than one rank (or no rank) holds, in words."""
    holders: dict[int, set[int]] = {}
    for rank, rows in owners.items():
        for row in rows:
            holders.setdefault(row // G, set()).add(rank)
    for prompt in range(B):
        ranks = holders.get(prompt, set())
        if len(ranks) > 1:
            return (f"prompt {prompt}'s {G} completions are split across ranks {sorted(ranks)}: its group "
                    f"advantages (mean and std over all {G}) would need rewards from more than one rank")
    return None


def check_rank_rows(fn: Callable[[int, int, int, int], list[int]]) -> CheckResult:
    """Exercise 8.1: fn(B, G, world_size, rank) -> the completion rows rank `rank` owns, in the
    prompt-major layout (completion j of prompt i is row i * G + j): whole prompts, the
    trainer's contiguous share (World.shard); a ValueError when B does not divide."""
    result = CheckResult("exercise 8.1 which rows a rank owns")
    for B, G, world_size in RANK_ROW_CASES:
        name = f"B={B}, G={G}, {world_size} ranks"
        owners, problems = {}, []
        for rank in range(world_size):
            try:
                owners[rank] = _rows(fn(B, G, world_size, rank))
            except Exception as error:  # the reader's code: report, don't crash
                problems.append(f"rank {rank} raised {type(error).__name__}: {error}")
        if not problems:
            split = _split_groups(B, G, owners)
            every_row = sorted(row for rows in owners.values() for row in rows)
            if split:
                problems.append(split)
            elif every_row != list(range(B * G)):
                missing = sorted(set(range(B * G)) - set(every_row))
                twice = sorted({row for row in every_row if every_row.count(row) > 1})
                problems.append(f"the ranks together must own each of the {B * G} rows once"
                                + (f"; no rank owns {missing[:8]}" if missing else "")
                                + (f"; more than one rank owns {twice[:8]}" if twice else ""))
            for rank, rows in owners.items():
                expected = _expected_rows(B, G, world_size, rank)
                if sorted(rows) != expected and not split:
                    first, last = expected[0] // G, expected[-1] // G
                    problems.append(f"rank {rank}: expected {_span(expected)} (prompts {first}..{last}, the "
                                    f"trainer's contiguous share), got {_span(rows)}")
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
                result.failures.append(f"{name}: expected a ValueError ({B} prompts do not split into whole "
                                       f"prompts over {world_size} ranks), got {type(error).__name__}: {error}")
                break
        if owners is None:
            continue
        if raised:
            result.passed += 1
            continue
        why = _split_groups(B, G, owners) if len(owners) == world_size else None
        result.failures.append(f"{name}: expected a ValueError ({B} prompts do not split into whole prompts over "
                               f"{world_size} ranks; the trainer refuses such a config), got "
                               + ", ".join(f"rank {r}: {_span(rows)}" for r, rows in owners.items())
                               + (f" ({why})" if why else ""))
    return result


# --------------------------------------------------------------------------- 8.2

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
    ("2 ranks, 2 prompts each, rank 1's completions longer",
     [[3, 5, 2, 4], [6, 2, 3, 5], [12, 9, 11, 7], [10, 12, 8, 12]], [[0, 1], [2, 3]]),
    ("3 ranks holding 2, 1 and 1 prompts (dynamic sampling dropped a group on ranks 1 and 2)",
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
        return ("each rank divided by its own counts (the per-rank mean: grpo_loss's defaults); pass the whole "
                "batch's counts, num_items = sum(token_counts) and num_completions = sum(completion_counts)")
    if np.allclose(losses, global_counts, rtol=1e-9, atol=1e-12) and N > 1:
        return (f"the parts have the whole batch's counts, but DDP averages the ranks' gradients: the "
                f"result is 1/{N} of the 1-process gradient; multiply each rank's loss by the world size")
    if np.allclose(losses, [N * x for x in own], rtol=1e-9, atol=1e-12) and N > 1:
        return "each rank's loss is multiplied by the world size, but still divided by its own counts"
    return ""


def check_rank_loss(fn: Callable) -> CheckResult:
    """Exercise 8.2: fn(logp, old_logp, advantages, completion_mask, token_counts,
    completion_counts, loss_type, max_completion_length) -> this rank's loss, whose
    gradients, averaged over ranks as DDP does, are the 1-process gradient.

    logp, old_logp, completion_mask: this rank's (b, G, S); advantages (b, G);
    token_counts, completion_counts: every rank's (the gathered counts, a list per rank);
    one mini-batch, beta = 0."""
    result = CheckResult("exercise 8.2 a rank's loss")
    for case in RANK_LOSS_CASES:
        description, _, shares = case
        for loss_type in LOSS_TYPES:
            name = f"{loss_type}, {description}"
            try:
                whole, whole_grad, losses, averaged, batch, tokens, completions = _whole_and_parts(fn, case, loss_type)
            except Exception as error:  # the reader's code: report, don't crash
                result.failures.append(f"{name}: raised {type(error).__name__}: {error}")
                continue
            difference = float((averaged - whole_grad).abs().max())
            mean_loss = sum(losses) / len(losses)
            if difference <= 1e-12 * max(1.0, float(whole_grad.abs().max())):
                result.passed += 1
                continue
            why = _diagnose(losses, batch, shares, tokens, completions, loss_type)
            result.failures.append(
                f"{name} (token_counts {tokens}, completion_counts {completions}): the ranks' average gradient "
                f"differs from the 1-process gradient by up to {difference:.3g} (the ranks' mean loss "
                f"{mean_loss:.6f}, the 1-process loss {whole:.6f})" + (f": {why}" if why else ""))
    return result


# --------------------------------------------------------------------------- 8.3

# A GPU-sized rollout on one node of 8 GPUs, for the arithmetic of exercise 8.3.
SCALE_QUIZ = {"world_size": 8, "prompts_per_step": 256, "num_generations": 16, "max_completion_length": 1024,
              "num_iterations": 1, "num_mini_batches": 4, "parameters": 1_500_000_000}
FORMULAS = {
    "prompts_per_rank": "prompts_per_step / world_size (whole prompts per rank)",
    "completions_per_rank": "prompts_per_rank x num_generations (all G completions of each prompt)",
    "completions_per_step": "prompts_per_step x num_generations, whatever the number of ranks",
    "max_tokens_per_step": "completions_per_step x max_completion_length (every completion at the limit)",
    "optimizer_steps_per_rollout": "num_iterations x num_mini_batches",
    "fsdp2_bytes_per_rank": "parameters x (4 weights + 4 gradients + 8 AdamW moments) bytes in float32, "
                            "divided by world_size",
}


def scale_answers(quiz: dict = SCALE_QUIZ) -> dict[str, int]:
    """The worked answers of exercise 8.3 for a quiz like SCALE_QUIZ."""
    N, B, G = quiz["world_size"], quiz["prompts_per_step"], quiz["num_generations"]
    return {"prompts_per_rank": B // N, "completions_per_rank": B // N * G, "completions_per_step": B * G,
            "max_tokens_per_step": B * G * quiz["max_completion_length"],
            "optimizer_steps_per_rollout": quiz["num_iterations"] * quiz["num_mini_batches"],
            "fsdp2_bytes_per_rank": quiz["parameters"] * 16 // N}


def check_scale_answers(answers: dict) -> CheckResult:
    """Exercise 8.3: the arithmetic of SCALE_QUIZ's step, one number per key of FORMULAS."""
    result = CheckResult("exercise 8.3 a step on 8 GPUs")
    if not answers:
        result.failures.append(f"no answers yet: give a number for each of {list(FORMULAS)}")
        return result
    for key, expected in scale_answers().items():
        got = answers.get(key)
        try:
            right = got is not None and float(got) == expected
        except (TypeError, ValueError):
            right = False
        if right:
            result.passed += 1
        else:
            result.failures.append(f"{key}: expected {expected:,}, got {got!r} ({FORMULAS[key]})")
    unknown = sorted(set(answers) - set(FORMULAS))
    if unknown:
        result.failures.append(f"unknown keys {unknown}; the keys are {list(FORMULAS)}")
    return result
