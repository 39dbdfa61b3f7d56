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
