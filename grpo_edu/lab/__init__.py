"""The failure lab (chapter 7, "When GRPO goes wrong"): each GRPO failure mode caused on
purpose by one knob on the CPU tier's policy and task, next to the healthy default run.

    __init__.py  the lab's runs (this module): RUNS, TOOL_RUNS, run, and the tables of their metrics
    faults.py    the deliberate bugs no config can express, injected into a run that is set up

A run is the default config (configs/cpu-tiny.toml) with fewer steps, evaluated every 25 steps
on 128 held-out problems, plus its knob: config overrides (a learning rate, beta, a task) or
an injected fault (grpo_edu.lab.faults, for the bugs no config can express). `expected` names
the doctor's detectors (grpo_edu.doctor.diagnose) that the run must trigger; `also` those it may
trigger as a measured consequence of the same knob (each one explained where it is set);
the tests and the chapter check that it triggers the first, and none outside the two.

    from grpo_edu import lab
    result = lab.run("alias", "runs/lab")      # a RunResult; runs/lab/alias holds its metrics
    right = lab.held_out_outcomes("alias", result.policy, result.tokenizer)   # 0/1 per held-out problem
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from grpo_edu.config import DEFAULT_CONFIG, TrainConfig
from grpo_edu.doctor.diagnose import series, window_median
from grpo_edu.lab.faults import NONE, Faults

SETTINGS = {"eval_every": 25, "eval_size": 128, "checkpoint_every": 0, "progress": False}


@dataclass(frozen=True)
class LabRun:
    failure: int                      # chapter 7's failure mode, 1..9 (0: a healthy run; 10: chapter 13's)
    knob: str                         # the one thing changed, in words
    steps: int
    overrides: dict = field(default_factory=dict)
    faults: Faults | None = None
    expected: frozenset = frozenset()  # the detectors it must trigger
    also: frozenset = frozenset()      # those it may trigger as a consequence of its knob; no other
    base: Path = DEFAULT_CONFIG        # the config it changes (TOOL_RUNS: configs/cpu-tools.toml)

    def diagnosed_as_expected(self, found: set[str]) -> bool:
        """`found` (the detectors that fired) holds every expected one, and nothing beyond `also`."""
        return self.expected <= found <= self.expected | self.also

    def config(self, output_dir: str | Path, seed: int = 0) -> TrainConfig:
        return TrainConfig.from_dict({**TrainConfig.from_toml(self.base).to_dict(), **SETTINGS,
                                      "steps": self.steps, "seed": seed, "output_dir": str(output_dir),
                                      **self.overrides})


RUNS: dict[str, LabRun] = {
    "healthy": LabRun(0, "none: configs/cpu-tiny.toml", 100),
    # 1. all-equal groups: countdown is beyond the arithmetic policy (accuracy 0): its groups are
    # all wrong on accuracy; only the format reward differs within some of them. Chasing that
    # format signal alone moves the policy far from the reference within 30 steps (its KL against the
    # healthy run's: chapter 7): kl_runaway, rightly, may fire.
    "countdown": LabRun(1, "task = 'countdown' (no problem the policy can solve)", 30, {"task": "countdown"},
                        expected=frozenset({"zero_std_groups"}), also=frozenset({"kl_runaway"})),
    "countdown_sparse": LabRun(1, "task = 'countdown', reward accuracy only", 20,
                               {"task": "countdown", "rewards": {"accuracy": 1.0}},
                               expected=frozenset({"zero_std_groups"})),
    "countdown_filter": LabRun(1, "countdown, filter_zero_std_groups = true", 30,
                               {"task": "countdown", "filter_zero_std_groups": True},
                               expected=frozenset({"zero_std_groups"}), also=frozenset({"kl_runaway"})),
    "countdown_hot": LabRun(1, "countdown, temperature = 1.5", 30, {"task": "countdown", "temperature": 1.5},
                            also=frozenset({"kl_runaway"})),
    # 2. a group normalised in two pieces, as when its completions sit on two ranks
    "split": LabRun(2, "Faults(split_groups=2)", 50, faults=Faults(split_groups=2),
                    expected=frozenset({"split_groups"})),
    # 4. beta: none, 25x the default
    "beta_0": LabRun(4, "beta = 0", 100, {"beta": 0.0}),
    "beta_1": LabRun(4, "beta = 1.0", 100, {"beta": 1.0}),
    # 5. the trainer's log-probs at T = 1 for a sampler at T = 0.7 (pi_old from the sampler, so
    # that the ratio shows the mismatch)
    "temperature": LabRun(5, "sampler T = 0.7, Faults(trainer_temperature=1.0)", 20,
                          {"temperature": 0.7, "old_logprobs": "sampler"}, Faults(trainer_temperature=1.0),
                          expected=frozenset({"sampler_mismatch"})),
    # 6. the log-probs one column off
    "off_by_one": LabRun(6, "Faults(off_by_one=True)", 50, faults=Faults(off_by_one=True),
                         expected=frozenset({"misaligned_tokens"})),
    # 7. four passes over each rollout, pi_old fixed (correct) or refreshed every pass
    "old_fixed": LabRun(7, "num_iterations = 4", 20, {"num_iterations": 4}),
    # Four unclipped steps per rollout break the policy within 20 steps (held-out accuracy falls
    # from 0.45 to 0.14, pinned kernels, seed 0): zero_std_groups, rightly, as its all-wrong groups
    # fill the batch.
    "old_refreshed": LabRun(7, "num_iterations = 4, Faults(refresh_old_logprobs=True)", 20, {"num_iterations": 4},
                            Faults(refresh_old_logprobs=True), expected=frozenset({"old_logprobs_refreshed"}),
                            also=frozenset({"zero_std_groups"})),
    # 8. a learning rate 33x the default, clipped at 1.0 (the default) and not. The policy is
    # wrecked within 2 steps: the KL jumps past 4 nats per token and every group is all wrong;
    # the gradient norm falls with it (all-equal groups give none), so grad_explosion, which
    # reads a climbing norm or a non-finite loss, does not fire on this tier (chapter 7 says why).
    # The wrecked policy also stops ending its completions: nearly all of them run to
    # max_completion_length from the first steps, clipped or not, so truncated_completions
    # fires too, rightly (pinned kernels, seed 0).
    "lr_clipped": LabRun(8, "learning_rate = 1e-2", 25, {"learning_rate": 1e-2},
                         expected=frozenset({"kl_runaway", "zero_std_groups"}),
                         also=frozenset({"truncated_completions"})),
    "lr_unclipped": LabRun(8, "learning_rate = 1e-2, max_grad_norm = 0", 25,
                           {"learning_rate": 1e-2, "max_grad_norm": 0.0},
                           expected=frozenset({"kl_runaway", "zero_std_groups"}),
                           also=frozenset({"truncated_completions"})),
    # 8, the other cause of a climbing gradient norm: rewards 100x larger, with no std to divide them back
    # (advantage_scale = 'none'), so that the gradient is 100x larger too; clipped and not
    "reward_x100": LabRun(8, "rewards x100, advantage_scale = 'none'", 75,
                          {"rewards": {"accuracy": 100.0, "format": 50.0}, "advantage_scale": "none"}),
    "reward_x100_unclipped": LabRun(8, "rewards x100, advantage_scale = 'none', max_grad_norm = 0", 75,
                                    {"rewards": {"accuracy": 100.0, "format": 50.0}, "advantage_scale": "none",
                                     "max_grad_norm": 0.0}),
    # 9. the reference is the policy
    "alias": LabRun(9, "Faults(alias_reference=True)", 100, faults=Faults(alias_reference=True),
                    expected=frozenset({"reference_aliased"})),
}


# The failures of multi-turn episodes (chapter 13, "Tools and multi-turn episodes"; chapter 7
# trains RUNS): the tool run of configs/cpu-tools.toml, and the same run with the environment's
# tokens scored as if the policy had written them.
TOOLS_CONFIG = DEFAULT_CONFIG.parent / "cpu-tools.toml"
TOOL_RUNS: dict[str, LabRun] = {
    "tool": LabRun(0, "none: configs/cpu-tools.toml", 20, base=TOOLS_CONFIG),
    # the calculator's tokens in the KL too: the policy learns to predict text the reference never
    # did (the answers), and the KL, measured over them, runs away (kl_runaway, 3 seeds of 3 at
    # 100 steps in benchmarks/results/tools.json)
    "env_leak": LabRun(10, "Faults(env_tokens_in_loss=True)", 20, faults=Faults(env_tokens_in_loss=True),
                       expected=frozenset({"environment_tokens_trained"}), also=frozenset({"kl_runaway"}),
                       base=TOOLS_CONFIG),
}


def run(name: str, root: str | Path, seed: int = 0, log: Callable[[str], None] = lambda line: None):
    """Train lab run `name` (RUNS or TOOL_RUNS) into root/name; returns the trainer's RunResult."""
    runs = {**RUNS, **TOOL_RUNS}
    if name not in runs:
        raise ValueError(f"name: expected one of {sorted(runs)}, got {name!r}")
    spec = runs[name]
    return (spec.faults or NONE).train(spec.config(Path(root) / name, seed=seed), log=log)


def held_out_outcomes(name: str, policy, tokenizer) -> list[int]:
    """Each held-out problem's greedy outcome under `policy` (1 right, 0 wrong), in order: the
    problems lab run `name`'s evaluations score (its task's first eval_size test problems),
    scored as its trainer scores them. Runs on one task score the same problems, so their
    outcomes pair problem by problem (grpo_edu.algorithm.statistics: mcnemar, paired_problems);
    for a run's trained policy their mean is its final_accuracy."""
    from grpo_edu.environment.tasks import task_pools
    from grpo_edu.training.evaluation import evaluate

    runs = {**RUNS, **TOOL_RUNS}
    if name not in runs:
        raise ValueError(f"name: expected one of {sorted(runs)}, got {name!r}")
    config = runs[name].config("unused")
    _, held_out = task_pools(config, tokenizer)
    training = policy.training
    policy.eval()
    try:
        metrics = evaluate(policy, tokenizer, held_out, max_new_tokens=config.rollout.max_completion_length,
                           environment=config.rollout.environment, max_turns=config.rollout.max_turns,
                           per_problem=True)
    finally:
        policy.train(training)
    return metrics["greedy_correct"]


def early_late(history: list[dict], key: str) -> tuple[float, float]:
    """The median of `key` over a run's first and last steps that logged it (nan if none): the
    doctor's windows (grpo_edu.doctor.diagnose.WINDOW steps), so the tables show what it reads."""
    values = series(history, key)
    if not values:
        return math.nan, math.nan
    return window_median(values, late=False)[0], window_median(values, late=True)[0]


def table(results: dict, keys: list[str]) -> str:
    """One line per run: held-out greedy accuracy (start -> end), then each key's median over
    the first and the last steps of the doctor's windows (early_late). Each column is as wide
    as its widest entry."""
    width = max(len("run"), *(len(name) for name in results)) + 1
    cells = {name: [tuple(map(_g, early_late(result.history, key))) for key in keys]
             for name, result in results.items()}
    columns = []   # per key: (width of the early value, of the late value, of the column)
    for j, key in enumerate(keys):
        early = max(len(cells[name][j][0]) for name in results)
        late = max(len(cells[name][j][1]) for name in results)
        columns.append((early, late, max(len(key), early + 4 + late)))
    lines = [f"{'run':<{width}} {'accuracy':>14}" + "".join(f"  {key:>{w}}" for key, (_, _, w) in zip(keys, columns))]
    for name, result in results.items():
        summary = result.summary
        row = [f"{first:>{early}} -> {last:<{late}}" for (first, last), (early, late, _) in zip(cells[name], columns)]
        lines.append(f"{name:<{width}} {summary['start_accuracy']:.3f} -> {summary['final_accuracy']:.3f}"
                     + "".join(f"  {cell:>{w}}" for cell, (_, _, w) in zip(row, columns)))
    return "\n".join(lines)


def _g(value: float) -> str:
    if math.isnan(value):
        return "-"
    return f"{value:.3g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"
