"""benchmarks/first_run.py: the training clock leaves the evaluations out, the first crossing of
0.90 is found, the settings rotate, and a short run writes every figure its summary prints."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

import first_run  # noqa: E402


def test_every_setting_is_a_valid_config():
    from grpo_edu.config import DEFAULT_CONFIG, TrainConfig
    base = TrainConfig.from_toml(DEFAULT_CONFIG)
    assert first_run.SETTINGS["today"] == []
    for name, overrides in first_run.SETTINGS.items():
        config = TrainConfig.from_toml(DEFAULT_CONFIG, overrides)
        assert (config == base) == (name == "today"), name   # each other setting changes the run


def test_a_short_run_writes_every_figure(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(first_run.SETTINGS, "fast", ["learning_rate=1e-3"])
    monkeypatch.setattr(first_run, "TARGET", 0.0)   # every evaluation crosses it: the first is found
    out = tmp_path / "first.json"
    assert first_run.main(["--settings", "today", "fast", "--seeds", "0", "1", "--steps", "4", "--eval-every", "2",
                           "--threads", "1", "--out", str(out)]) == 0
    payload = json.loads(out.read_text())
    runs = payload["runs"]
    assert [(r["seed"], r["setting"]) for r in runs] == [(0, "today"), (0, "fast"), (1, "fast"), (1, "today")]
    for run in runs:
        assert [e[0] for e in run["evaluations"]] == [2, 4]
        seconds = [e[1] for e in run["evaluations"]]
        assert 0 < seconds[0] < seconds[1] <= run["training_seconds"]
        assert run["evaluations"][-1][2] == run["final_accuracy"]
        assert run["steps_to_90"] == 2 and run["seconds_to_90"] == seconds[0]
        assert len(run["greedy_correct"]) == 256
        assert sum(run["greedy_correct"]) / 256 == run["final_accuracy"]
        assert run["eval_seconds"] > 0
    assert set(payload["verdicts"]) == {f"{name}: fast - today" for name, _ in first_run.VALUES}
    assert "per_seed" in payload["verdicts"]["final accuracy: fast - today"]
    printed = capsys.readouterr().out
    assert "seconds to 0.90 per seed" in printed and f"wrote {out}" in printed


def test_the_clock_leaves_evaluations_out(monkeypatch, tmp_path):
    """An evaluation made 1,000 s slower (on the benchmark's clock: a real sleep would make the test
    depend on how fast this machine trains two steps) does not reach the training seconds."""
    import time
    from grpo_edu.training import trainer
    evaluate, late = trainer.evaluate_held_out, {"seconds": 0.0}

    class Clock:   # the real clock, plus the seconds the slow evaluations took
        @staticmethod
        def perf_counter():
            return time.perf_counter() + late["seconds"]

    def slow(run, samples=0):
        late["seconds"] += 1000.0
        return evaluate(run, samples)
    monkeypatch.setattr(trainer, "evaluate_held_out", slow)
    monkeypatch.setattr(first_run, "time", Clock)

    class Args:
        steps, eval_every, threads = 2, 1, 1
    run = first_run.run_one("today", 0, Args)
    assert run["training_seconds"] < 1000.0 and run["eval_seconds"] >= 1000.0


def test_bad_arguments_are_one_line(capsys):
    with pytest.raises(SystemExit):
        first_run.main(["--settings", "lr5e-4"])
    assert "--settings: expected 'today' among them" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        first_run.main(["--steps", "0"])


def test_sooner_is_better_in_the_verdicts():
    """A setting that reaches 0.90 in fewer steps and seconds on every seed beats today; one that
    never does counts its whole run."""
    def run(setting, seed, steps, seconds):
        return {"setting": setting, "seed": seed, "final_accuracy": 0.99, "steps_to_90": steps,
                "seconds_to_90": seconds, "training_seconds": 80.0 + seed, "evaluations": [[1500, 80.0, 0.99]]}
    runs = [run("today", s, 600 + 10 * s, 33.0 + s) for s in range(3)]
    runs += [run("quick", s, 400 + 20 * s, 20.0 + 2 * s) for s in range(3)]
    runs += [run("never", s, None, None) for s in range(3)]
    verdicts = first_run.verdicts(runs, ["today", "quick", "never"])
    quick = verdicts["sooner to 0.90 (minus steps): quick - today"]
    assert quick["words"].startswith("quick beats today") and quick["difference"] == pytest.approx(190.0)
    assert verdicts["sooner to 0.90 (minus training seconds): quick - today"]["words"].startswith("quick beats today")
    never = verdicts["sooner to 0.90 (minus steps): never - today"]
    assert never["words"].startswith("today beats never") and never["difference"] == pytest.approx(-890.0)
    assert verdicts["sooner to 0.90 (minus training seconds): never - today"]["difference"] == pytest.approx(-47.0)


def test_merge_keeps_the_earlier_runs_and_runs_only_what_they_lack(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(first_run.SETTINGS, "fast", ["learning_rate=1e-3"])
    common = ["--seeds", "0", "1", "--steps", "2", "--eval-every", "1", "--threads", "1"]
    earlier, merged = tmp_path / "earlier.json", tmp_path / "merged.json"
    assert first_run.main(["--settings", "today", *common, "--out", str(earlier)]) == 0
    trained = []
    run_one = first_run.run_one
    monkeypatch.setattr(first_run, "run_one", lambda setting, seed, args: trained.append((setting, seed))
                        or run_one(setting, seed, args))
    assert first_run.main(["--settings", "fast", *common, "--merge", str(earlier), "--out", str(merged)]) == 0
    assert sorted(trained) == [("fast", 0), ("fast", 1)]
    old, new = (json.loads(path.read_text()) for path in (earlier, merged))
    assert new["settings"] == ["today", "fast"] and new["runs"][:2] == old["runs"]
    assert "final accuracy: fast - today" in new["verdicts"]
    with pytest.raises(SystemExit):
        first_run.main(["--settings", "fast", "--seeds", "0", "--steps", "3", "--merge", str(earlier)])
    assert "--merge: expected a file with steps = 3, got 2" in capsys.readouterr().err


def test_make_train_runs_the_setting_the_results_chose():
    """configs/cpu-first-run.toml is cpu-tiny.toml with first_run's MAKE_TRAIN overrides (only the keys
    it marks differ), `make train` runs it, and the results file bears out what its comment states:
    every seed within 30 s, sooner than today by the stated interval, final accuracy not separated."""
    import re
    from grpo_edu.config import DEFAULT_CONFIG, TrainConfig
    path = first_run.MAKE_TRAIN_CONFIG
    chosen = TrainConfig.from_toml(path)
    assert chosen == TrainConfig.from_toml(DEFAULT_CONFIG, first_run.SETTINGS[first_run.MAKE_TRAIN])
    tiny = TrainConfig().to_dict()
    differ = {key for key, value in chosen.to_dict().items() if tiny[key] != value}
    text = path.read_text()
    marked = {line.split("=")[0].strip() for line in text.splitlines() if "# first run:" in line and not line.startswith("#")}
    assert differ == marked == {"beta", "learning_rate"}
    makefile = (ROOT / "Makefile").read_text()
    assert f"train: setup\n\t$(BIN)/grpo-edu train --config configs/{path.name}\n" in makefile

    stored = json.loads(first_run.OUT.read_text())
    runs = [r for r in stored["runs"] if r["setting"] == first_run.MAKE_TRAIN]
    assert len(runs) >= 5 and all(r["seconds_to_90"] is not None and r["seconds_to_90"] <= 30 for r in runs)
    comment = " ".join(line.lstrip("# ") for line in text.splitlines() if line.startswith("#"))
    sooner = stored["verdicts"][f"sooner to 0.90 (minus training seconds): {first_run.MAKE_TRAIN} - today"]
    final = stored["verdicts"][f"final accuracy: {first_run.MAKE_TRAIN} - today"]
    assert sooner["low"] > 0 and final["low"] < 0 < final["high"]
    assert f"{sooner['difference']:.1f} s sooner" in comment
    assert f"[{sooner['low']:.1f}, {sooner['high']:.1f}] s" in comment
    assert re.search(re.escape(f"{final['difference']:+.3f} [{final['low']:+.3f}, {final['high']:+.3f}]")
                     .replace(r"\ ", r"\s+"), comment)


def test_the_training_doc_carries_both_files_tables():
    """docs/training.md's tables of time to 0.90 are the committed files' (first_run.markdown_rows)."""
    doc = (ROOT / "docs" / "training.md").read_text()
    for name in ("first_run.json", "first_run_sweep.json"):
        rows = first_run.markdown_rows(json.loads((ROOT / "benchmarks" / "results" / name).read_text()))
        assert "\n".join(rows) in doc, name
