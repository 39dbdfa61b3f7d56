"""benchmarks/vs_trl.py runs end to end (2 steps a trainer): docs/training.md's figures against TRL
come from it, and a refactor once left it with a name it no longer imported."""

import subprocess
import sys
from pathlib import Path

from hang_guard import HANG_SECONDS

ROOT = Path(__file__).resolve().parent.parent


def test_the_benchmark_against_trl_runs_and_prints_its_table():
    result = subprocess.run([sys.executable, "benchmarks/vs_trl.py", "--steps", "2", "--seeds", "0", "--eval-size", "4",
                             "--threads", "1"], cwd=ROOT, capture_output=True, text=True, timeout=HANG_SECONDS)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line.split()[0] for line in result.stdout.splitlines() if line.endswith(")") and "x " in line]
    assert {"grpo_edu", "TRL"} <= set(rows), result.stdout


def test_beta_and_learning_rate_reach_both_trainers(monkeypatch, capsys):
    """--beta 0: both trainers train without a KL term (and so without a reference model); --learning-rate
    sets both trainers' peak rate (make train's setting: --beta 0 --learning-rate 2.5e-4)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import vs_trl
    import trl
    from grpo_edu.training import trainer
    seen = {}
    train, build = trainer.train, trl.GRPOTrainer.__init__

    def recording_train(config, **kwargs):
        seen.setdefault("grpo_edu", []).append((config.loss.beta, config.optimisation.learning_rate))
        return train(config, **kwargs)

    def recording_build(self, *args, **kwargs):
        seen.setdefault("TRL", []).append((kwargs["args"].beta, kwargs["args"].learning_rate))
        build(self, *args, **kwargs)
        seen["TRL reference"] = getattr(self, "ref_model", None)
    monkeypatch.setattr(trainer, "train", recording_train)
    monkeypatch.setattr(trl.GRPOTrainer, "__init__", recording_build)
    assert vs_trl.main(["--steps", "2", "--seeds", "0", "--eval-size", "4", "--threads", "1", "--beta", "0",
                        "--learning-rate", "2.5e-4"]) == 0
    assert seen["grpo_edu"] == [(0.0, 2.5e-4)] * 2 and seen["TRL"] == [(0.0, 2.5e-4)] and seen["TRL reference"] is None
    assert "beta 0.0, lr 0.00025" in capsys.readouterr().out


def test_the_speed_ratio_is_paired_by_seed_with_a_t_interval_of_the_log_ratios():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import math
    import vs_trl

    def runs(*medians):
        return [vs_trl.Run([m, m, m * 5], [m] * 3, 0.5) for m in medians]   # the median ignores one slow step

    same = vs_trl.speed_vs_trl(runs(0.1, 0.2), runs(0.1, 0.2))
    assert same["ratio"] == 1.0 and same["low"] == same["high"] == 1.0
    twice = vs_trl.speed_vs_trl(runs(0.05, 0.11, 0.2), runs(0.1, 0.2, 0.4))
    assert all(math.isclose(a, b) for a, b in zip(twice["per_seed"], [2.0, 0.2 / 0.11, 2.0]))
    assert math.isclose(twice["ratio"], (2.0 * (0.2 / 0.11) * 2.0) ** (1 / 3))
    assert twice["low"] < twice["ratio"] < twice["high"] and twice["low"] > 1.5 and "3 seeds" in twice["method"]
    one = vs_trl.speed_vs_trl(runs(0.05), runs(0.1))
    assert one["ratio"] == 2.0 and one["low"] is None


def test_a_config_file_sets_both_trainers_and_out_keeps_every_step(tmp_path, monkeypatch):
    """--config: grpo_edu and TRL (through the bridge) both train the file's task, policy and sizes."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import json
    import vs_trl
    import trl
    from grpo_edu.training import trainer
    seen = {}
    train, build = trainer.train, trl.GRPOTrainer.__init__

    def recording_train(config, **kwargs):
        seen.setdefault("grpo_edu", []).append((config.run.task, config.run.model, config.rollout.max_completion_length,
                                                config.optimisation.learning_rate))
        return train(config, **kwargs)

    def recording_build(self, *args, **kwargs):
        seen.setdefault("TRL", []).append((kwargs["args"].max_completion_length, kwargs["args"].learning_rate,
                                           kwargs["train_dataset"][0]["task"]))
        build(self, *args, **kwargs)
    monkeypatch.setattr(trainer, "train", recording_train)
    monkeypatch.setattr(trl.GRPOTrainer, "__init__", recording_build)
    out = tmp_path / "vs_trl.json"
    assert vs_trl.main(["--config", "configs/cpu-reasoning.toml", "--steps", "2", "--seeds", "0", "--eval-size", "4",
                        "--threads", "1", "--out", str(out)]) == 0
    assert seen["grpo_edu"] == [("digitsum", "digitsum-start", 56, 5e-5)] * 2
    assert seen["TRL"] == [(56, 5e-5, "digitsum")]
    record = json.loads(out.read_text())
    assert record["settings"]["task"] == "digitsum" and record["settings"]["steps"] == 2
    assert set(record["runs"]) == set(vs_trl.TRAINERS)
    assert all(len(run["step_seconds"]) == 1 for runs in record["runs"].values() for run in runs)
    assert record["speed_vs_trl"]["TRL GRPOTrainer"]["ratio"] == 1.0


def test_the_docs_quote_the_committed_results():
    """docs/training.md's rows against TRL are the results files', interval and accuracies included."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import json
    import vs_trl
    doc = (ROOT / "docs" / "training.md").read_text()
    files = {"vs_trl.json": "beta 0.04, lr 3e-4", "vs_trl_first_run.json": "make train's: beta 0, lr 2.5e-4",
             "vs_trl_digitsum.json": "digit sum, 10 steps"}
    for name, setting in files.items():
        record = json.loads((ROOT / "benchmarks" / "results" / name).read_text())
        assert record["settings"]["seeds"] == [0, 1, 2]
        for row in vs_trl.markdown_rows(record, setting):
            assert row in doc, row
        ours = record["speed_vs_trl"]["grpo_edu"]
        assert ours["low"] > 1, f"{name}: 'beats' needs the interval above 1"
    digitsum = json.loads((ROOT / "benchmarks" / "results" / "vs_trl_digitsum.json").read_text())
    speed = digitsum["speed_vs_trl"]
    assert (f"grpo_edu took {speed['grpo_edu']['ratio']:.2f}x [{speed['grpo_edu']['low']:.2f}, "
            f"{speed['grpo_edu']['high']:.2f}] TRL's steps per second" in " ".join(doc.split()))
