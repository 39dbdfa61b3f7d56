"""DAPO's dynamic sampling on chapter 7's countdown failure: the arithmetic policy on countdown,
which it cannot solve (accuracy 0), so most groups are all wrong and only the format reward
differs within some of them. The CPU tier's default run (configs/cpu-tiny.toml) with task =
'countdown', 40 steps, seeds 0 1 2:

    keep     every group trains (the all-equal ones with advantages 0)
    drop     filter_zero_std_groups: the all-equal groups are dropped, the batch trains fewer
    refill   dynamic_sampling_rounds = 4: they are replaced by the differing groups of up to 4
             more rollouts of fresh prompts; at the limit, the slots left are dropped

and, in the regime DAPO made refill for, a policy that solves most of its problems (so most
groups are all right): the three again as keep-solved, drop-solved and refill-solved, each from
the committed policy `make train` trains (model = "trained", grpo_edu/assets/tiny-arithmetic-trained:
configs/cpu-tiny.toml, seed 0, 1,500 steps) on its own task, arithmetic, with 4 samples per
held-out problem at every evaluation (room to grow where greedy accuracy has almost none).
The filter reads each group's total reward (accuracy + format), not accuracy alone as DAPO's does.

    .venv/bin/python benchmarks/dynamic_sampling.py [--variants ...] [--seeds 0 1 2] [--steps 40] [--out FILE]
    .venv/bin/python benchmarks/dynamic_sampling.py --trained-policy   (re-make the committed policy; ~2 min)
    .venv/bin/python benchmarks/dynamic_sampling.py --check FILE [--steps 4] [--runs refill:0 ...]

Writes FILE (default benchmarks/results/dynamic_sampling.json) after every run: per run its
held-out greedy accuracy at every evaluation (128 countdown problems, every 10 steps) and, per
step, the share of all-equal groups in the batch trained on and in the first rollout, the
rollouts sampled, the share of slots left at the limit, the accuracy and format rewards, the KL,
the gradient norm and the seconds spent sampling. Run it under the book's pinned kernels
(grpo_edu.runtime.numerics): chapter 8 reads the file. --check re-trains the named runs for their first
--steps steps and compares every kept number with FILE's, exactly (tests/test_dynamic_sampling.py).
"""

from __future__ import annotations

from pathlib import Path

import variant_grid

OUT = Path(__file__).parent / "results" / "dynamic_sampling.json"
SETTINGS = {"task": "countdown", "eval_every": 10, "eval_size": 128, "checkpoint_every": 0, "progress": False}
HOW = {"keep": {}, "drop": {"filter_zero_std_groups": True}, "refill": {"dynamic_sampling_rounds": 4}}
SOLVED = {"task": "arithmetic", "model": "trained", "eval_samples": 4, "learning_rate": 3e-5}   # refill's regime
VARIANTS = {**HOW, **{f"{name}-solved": {**SOLVED, **keys} for name, keys in HOW.items()}}
KEPT = ("zero_std_groups", "dynamic_sampling/first_zero_std", "dynamic_sampling/rounds", "dynamic_sampling/short",
        "reward/accuracy", "reward/format", "kl", "grad_norm", "eval/pass_at_1")
TIMED = ("time/rollout",)   # kept in the file, not compared by --check (seconds differ run to run)
GRID = variant_grid.DefaultRunGrid(
    __doc__, OUT, VARIANTS, KEPT + TIMED, SETTINGS, example="refill:0", compared=KEPT,
    pairs=(("refill", "keep"), ("drop", "keep"), ("refill-solved", "keep-solved"), ("drop-solved", "keep-solved"),
           ("refill-solved", "keep-solved", "pass_at_1"), ("refill-solved", "drop-solved", "pass_at_1"),
           ("drop-solved", "keep-solved", "pass_at_1")),
    values={"pass_at_1": lambda run: [x for x in run["steps"]["eval/pass_at_1"] if x is not None][-1]},
    describe=lambda run: (f"accuracy {run['start_accuracy']:.3f} -> {run['final_accuracy']:.3f}, all-equal groups "
                          f"in the batch {sum(run['steps']['zero_std_groups']) / len(run['steps']['zero_std_groups']):.3f} "
                          f"in {run['seconds']:.0f} s"))
config_for, run, parse_runs, differences = GRID.config_for, GRID.run, GRID.parse_runs, GRID.differences


def differing_groups_per_step(run_: dict, prompts_per_step: int) -> float:
    """The mean count of groups whose rewards differ in the batch a run trains on, per step: the
    groups that carry a gradient (an all-equal group's advantages are all 0, kept or dropped)."""
    shares = run_["steps"]["zero_std_groups"]
    return prompts_per_step * (1 - sum(shares) / len(shares))


def write_trained_policy() -> Path:
    """The committed policy "trained": `make train`'s run (configs/cpu-tiny.toml as it is, seed 0,
    1,500 steps), its model/ folder and model card copied into the package's assets. Run it
    under the pinned kernels, as the benchmark."""
    import shutil
    import tempfile

    from grpo_edu.policy.models import TRAINED_POLICY
    from grpo_edu.config import DEFAULT_CONFIG, TrainConfig
    from grpo_edu.training.trainer import train
    with tempfile.TemporaryDirectory() as directory:
        config = TrainConfig.from_dict({**TrainConfig.from_toml(DEFAULT_CONFIG).to_dict(), "output_dir": directory,
                                        "checkpoint_every": 0, "progress": False})
        result = train(config, log=lambda line: None)
        shutil.rmtree(TRAINED_POLICY, ignore_errors=True)
        shutil.copytree(Path(directory) / "model", TRAINED_POLICY)
    (TRAINED_POLICY / "README.md").write_text(trained_card(config, result.summary))
    print(f"wrote {TRAINED_POLICY}: held-out greedy accuracy {result.summary['start_accuracy']:.3f} -> "
          f"{result.summary['final_accuracy']:.3f}")
    return TRAINED_POLICY


def trained_card(config, summary: dict) -> str:
    """The committed policy's model card: what it is, how it was made, how it scored."""
    return f"""# tiny-arithmetic-trained: the policy `make train` trains

The committed starting policy (`start`, grpo_edu/assets/tiny-arithmetic-start) after the CPU tier's
default GRPO run: configs/cpu-tiny.toml as it is, seed {config.run.seed}, {config.optimisation.steps:,} steps of
{config.rollout.prompts_per_step} prompts x {config.rollout.num_generations} completions, loss '{config.loss.loss_type}',
beta {config.loss.beta}, learning rate {config.optimisation.learning_rate} ({config.optimisation.lr_schedule}). In a run's config:
`model = "trained"`. Chapter 8 trains from it where many groups are all right
(benchmarks/dynamic_sampling.py, the `-solved` variants).

## How it was made

    env $(python -m grpo_edu.runtime.numerics) python benchmarks/dynamic_sampling.py --trained-policy

under the book's pinned kernels, so any x86-64 machine makes the same weights.

## Held-out figures

Greedy accuracy on the run's {summary['eval_problems']} held-out problems: {summary['start_accuracy']:.4f} before
training, {summary['final_accuracy']:.4f} after (tests/test_dynamic_sampling.py evaluates it again).
"""


if __name__ == "__main__":
    import sys
    if sys.argv[1:] == ["--trained-policy"]:
        write_trained_policy()
    else:
        GRID.main(steps=40)
