"""DAPO's overlong handling on a run whose length limit truncates often: the CPU tier's default
run (configs/cpu-tiny.toml) with max_completion_length = 9, 150 steps, seeds 0 1 2. Nine tokens
hold a two-digit answer with its EOS but cut the EOS of a three-digit one
(<think>11</think>\\boxed{111} is nine tokens), so about a fifth of the starting policy's
completions are truncated, many of them right.

    plain    truncated completions train like the others
    filter   overlong filtering: their tokens leave the loss (mask_truncated_completions)
    soft     the soft overlong punishment, a reward term 0 up to 7 tokens, -0.5 at 8, -1 at 9
             (overlong_cache = 2)

L - c = 7 is the shortest right answer's length, so those two fail by construction. The same three
with DAPO's slack, scaled to this task (DAPO: L = 20,480 with c = 4,096, so L - c = 0.8 L; here
L = 13 and c = 3, so L - c = 10, the longest right answer): the methods where they are meant to help.

    plain-13, filter-13, soft-13   max_completion_length = 13 (soft: overlong_cache = 3)

    .venv/bin/python benchmarks/overlong.py [--variants ...] [--seeds 0 1 2] [--steps 150] [--out FILE]
    .venv/bin/python benchmarks/overlong.py --check FILE [--steps 4] [--runs filter:0 ...]

Writes FILE (default benchmarks/results/overlong.json) after every run: per run its held-out
greedy accuracy at every evaluation (256 problems, every 25 steps, at the same 9-token limit)
and, per step, the share of truncated completions, the training accuracy, the mean completion
length, the overlong term, the KL and the gradient norm. Run it under the book's pinned kernels
(grpo_edu.runtime.numerics): chapter 8 reads the file. --check re-trains the named runs for their first
--steps steps and compares every kept number with FILE's, exactly (tests/test_overlong.py).
"""

from __future__ import annotations

from pathlib import Path

import variant_grid

OUT = Path(__file__).parent / "results" / "overlong.json"
SETTINGS = {"eval_every": 25, "eval_size": 256, "checkpoint_every": 0, "progress": False, "max_completion_length": 9}
VARIANTS = {
    "plain": {},
    "filter": {"mask_truncated_completions": True},
    "soft": {"overlong_cache": 2},
    "plain-13": {"max_completion_length": 13},
    "filter-13": {"max_completion_length": 13, "mask_truncated_completions": True},
    "soft-13": {"max_completion_length": 13, "overlong_cache": 3},
}
KEPT = ("truncated", "reward/accuracy", "completion_length/mean", "reward/overlong", "kl", "grad_norm")
GRID = variant_grid.DefaultRunGrid(
    __doc__, OUT, VARIANTS, KEPT, SETTINGS, example="filter:0",
    pairs=(("filter", "plain"), ("soft", "plain"), ("filter-13", "plain-13"), ("soft-13", "plain-13")),
    describe=lambda run: (f"accuracy {run['start_accuracy']:.3f} -> {run['final_accuracy']:.3f}, "
                          f"last truncated {run['steps']['truncated'][-1]:.3f} in {run['seconds']:.0f} s"))
config_for, run, parse_runs, differences = GRID.config_for, GRID.run, GRID.parse_runs, GRID.differences


if __name__ == "__main__":
    GRID.main()
