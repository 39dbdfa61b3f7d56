"""DAPO's dynamic sampling on chapter 7's countdown failure: the arithmetic policy on countdown,
which it cannot solve (accuracy 0), so most groups are all wrong and only the format reward
differs within some of them. The CPU tier's default run (configs/cpu-tiny.toml) with task =
'countdown', 40 steps, seeds 0 1 2:

    keep     every group trains (the all-equal ones with advantages 0)
    drop     filter_zero_std_groups: the all-equal groups are dropped, the batch trains fewer
    refill   dynamic_sampling_rounds = 4: they are replaced by the differing groups of up to 4
             more rollouts of fresh prompts; at the limit, the slots left are dropped

    .venv/bin/python benchmarks/dynamic_sampling.py [--variants ...] [--seeds 0 1 2] [--steps 40] [--out FILE]
    .venv/bin/python benchmarks/dynamic_sampling.py --check FILE [--steps 4] [--runs refill:0 ...]

Writes FILE (default benchmarks/results/dynamic_sampling.json) after every run: per run its
held-out greedy accuracy at every evaluation (128 countdown problems, every 10 steps) and, per
step, the share of all-equal groups in the batch trained on and in the first rollout, the
rollouts sampled, the share of slots left at the limit, the accuracy and format rewards, the KL,
the gradient norm and the seconds spent sampling. Run it under the book's pinned kernels
(grpo_edu.runtime.numerics): chapter 4 reads the file. --check re-trains the named runs for their first
--steps steps and compares every kept number with FILE's, exactly (tests/test_dynamic_sampling.py).
"""

from __future__ import annotations

from pathlib import Path

import variant_grid

OUT = Path(__file__).parent / "results" / "dynamic_sampling.json"
SETTINGS = {"task": "countdown", "eval_every": 10, "eval_size": 128, "checkpoint_every": 0, "progress": False}
VARIANTS = {
    "keep": {},
    "drop": {"filter_zero_std_groups": True},
    "refill": {"dynamic_sampling_rounds": 4},
}
KEPT = ("zero_std_groups", "dynamic_sampling/first_zero_std", "dynamic_sampling/rounds", "dynamic_sampling/short",
        "reward/accuracy", "reward/format", "kl", "grad_norm")
TIMED = ("time/rollout",)   # kept in the file, not compared by --check (seconds differ run to run)
GRID = variant_grid.DefaultRunGrid(
    __doc__, OUT, VARIANTS, KEPT + TIMED, SETTINGS, example="refill:0", compared=KEPT,
    describe=lambda run: (f"accuracy {run['start_accuracy']:.3f} -> {run['final_accuracy']:.3f}, all-equal groups "
                          f"in the batch {sum(run['steps']['zero_std_groups']) / len(run['steps']['zero_std_groups']):.3f} "
                          f"in {run['seconds']:.0f} s"))
config_for, run, parse_runs, differences = GRID.config_for, GRID.run, GRID.parse_runs, GRID.differences


def differing_groups_per_step(run_: dict, prompts_per_step: int) -> float:
    """The mean count of groups whose rewards differ in the batch a run trains on, per step: the
    groups that carry a gradient (an all-equal group's advantages are all 0, kept or dropped)."""
    shares = run_["steps"]["zero_std_groups"]
    return prompts_per_step * (1 - sum(shares) / len(shares))


if __name__ == "__main__":
    GRID.main(steps=40)
