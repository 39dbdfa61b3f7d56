"""grpo-edu doctor RUN_DIR (grpo_edu.doctor.diagnose): each detector at its threshold, no false alarm
on three whole healthy runs, real faulty runs caught by their own detector and no other, the
live warnings, the command."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_edu import lab
from grpo_edu.lab.faults import NONE
from grpo_edu.doctor import diagnose as dx
from grpo_edu.training import trainer
from grpo_edu.config import TrainConfig

HEALTHY = Path(__file__).parent / "data" / "healthy_runs"


def healthy_step(step, **changes):
    m = {"step": step, "reward/mean": 0.7, "reward/accuracy": 0.4, "zero_std_groups": 0.25,
         "completion_length/mean": 9.0, "kl": 0.0 if step == 1 else 0.05, "sampler_gap/mean_abs": 2e-7,
         "ratio/min": 1.0, "ratio/max": 1.0, "optimizer_steps": 1.0, "loss": 0.01, "grad_norm": 0.8,
         "advantage/tie_spread": 0.0, "truncated": 0.0}
    m.update(changes)
    return m


CONFIG = TrainConfig().to_dict()


def found(history, config=CONFIG):
    return {f.detector for f in dx.diagnose(history, config)}


def steps(n, **changes):
    return [healthy_step(s, **changes) for s in range(1, n + 1)]


def test_a_healthy_looking_history_has_no_finding():
    assert found(steps(100)) == set()
    assert dx.report([], 100) == "no symptoms found in 100 steps"


# ----------------------------------------------------------------- each detector at its threshold

def test_reference_aliased_needs_kl_exactly_0_while_the_policy_moves():
    history = steps(10, kl=0.0)
    assert found(history) == {"reference_aliased"}
    assert found(steps(10, kl=1e-9)) == set()                          # tiny, not 0: a separate reference
    assert found(history, {**CONFIG, "beta": 0.0}) == set()             # no reference at all
    assert found(steps(10, kl=0.0, grad_norm=0.0)) == set()             # nothing moves: no gradient, not aliasing
    assert found(steps(MIN := dx.MIN_STEPS, kl=0.0)) == set()           # steps 2..5: 4 steps, too few
    assert found(steps(MIN + 1, kl=0.0)) == {"reference_aliased"}


def test_zero_std_groups_needs_a_majority_of_all_wrong_groups():
    assert found(steps(20, zero_std_groups=dx.ZERO_STD_SHARE)) == {"zero_std_groups"}
    assert found(steps(20, zero_std_groups=0.49)) == set()
    solved = steps(20, zero_std_groups=0.9, **{"reward/accuracy": 0.95})   # all-right groups: a solved task
    assert found(solved) == set()
    finding = dx.zero_std_groups(steps(20, zero_std_groups=0.8), CONFIG)
    assert "median share of all-equal groups 0.80 over steps 11-20" in finding.evidence


def test_split_groups_reads_the_tie_spread():
    history = steps(20)
    history[6]["advantage/tie_spread"] = 2 * dx.TIE_SPREAD
    assert found(history) == {"split_groups"}
    history[6]["advantage/tie_spread"] = dx.TIE_SPREAD
    assert found(history) == set()


def test_length_drift_compares_the_late_window_with_the_early():
    history = steps(40)
    for m in history[-10:]:
        m["completion_length/mean"] = 9.0 * dx.LENGTH_GROWTH
    assert found(history) == {"length_drift"}
    assert "dr_grpo" in dx.length_drift(history, CONFIG).advice
    assert "dr_grpo" not in dx.length_drift(history, {**CONFIG, "loss_type": "dr_grpo"}).advice
    for m in history[-10:]:
        m["completion_length/mean"] = 9.0 * dx.LENGTH_GROWTH - 0.01
    assert found(history) == set()
    assert found(steps(39, **{"completion_length/mean": 20.0})) == set()   # too short to have a trend


def test_kl_runaway():
    assert found(steps(20, kl=dx.KL_HIGH)) == {"kl_runaway"}
    assert found(steps(20, kl=0.99)) == set()


@pytest.mark.parametrize("gap, detector", [(dx.GAP_MISMATCH, "sampler_mismatch"), (0.49, "sampler_mismatch"),
                                           (dx.GAP_MISALIGNED, "misaligned_tokens"), (0.029, None)])
def test_the_sampler_gap_detectors_split_by_size(gap, detector):
    assert found(steps(10, **{"sampler_gap/mean_abs": gap})) == ({detector} if detector else set())


def test_old_logprobs_refreshed_needs_several_steps_per_rollout_and_a_ratio_of_exactly_1():
    config = {**CONFIG, "num_iterations": 4}
    refreshed = steps(10, optimizer_steps=4.0)
    assert found(refreshed, config) == {"old_logprobs_refreshed"}
    fixed = steps(10, optimizer_steps=4.0)
    fixed[3]["ratio/max"] = 1.01
    assert found(fixed, config) == set()
    assert found(refreshed, {**config, "old_logprobs": "sampler"}) == set()
    assert found(steps(10), CONFIG) == set()   # one optimizer step per rollout: ratio 1 by design


def test_grad_explosion():
    history = steps(40)
    for m in history[-10:]:
        m["grad_norm"] = 0.8 * dx.GRAD_GROWTH
    assert found(history) == {"grad_explosion"}
    for m in history[-10:]:
        m["grad_norm"] = 0.8 * dx.GRAD_GROWTH * 0.99
    assert found(history) == set()
    broken = steps(10)
    broken[4]["loss"] = float("nan")
    assert found(broken) == {"grad_explosion"}
    assert "loss is not finite from step 5" in dx.grad_explosion(broken, CONFIG).evidence


def test_truncated_completions_needs_half_or_more_over_a_window_of_steps():
    assert found(steps(dx.WINDOW, truncated=dx.TRUNCATED_SHARE)) == {"truncated_completions"}
    assert found(steps(dx.WINDOW, truncated=0.49)) == set()
    assert found(steps(dx.WINDOW - 1, truncated=0.9)) == set()          # fewer steps than a window
    history = steps(40)                                                 # a stretch in the middle of a run
    for m in history[15:21]:
        m["truncated"] = 0.8
    finding = dx.truncated_completions(history, {**CONFIG, "max_completion_length": 256})
    assert finding.evidence == ("median share of completions cut at max_completion_length (256 tokens) 0.80 over "
                                "steps 12-21 (threshold 0.5), median length 9.0 tokens; at or above the threshold "
                                "at 6 of 40 steps")
    history[15]["truncated"] = 0.0                                      # 5 of 10 steps: not most of the window
    assert found(history) == set()
    live = dx.LiveDoctor(CONFIG)
    history = steps(30, truncated=0.6)
    warned = [(end, f.detector) for end in range(1, 31) for f in live.check(history[:end])]
    assert warned == [(10, "truncated_completions")]                    # at the first check, once


def test_stale_rollouts_reads_what_each_setting_shows_of_the_staleness():
    lag = {**CONFIG, "rollout_lag": 4}

    def lagged(n, **changes):
        return [healthy_step(s, staleness=float(min(s - 1, 4)), **changes) for s in range(1, n + 1)]
    proximal = {**lag, "old_logprobs": "proximal"}
    assert found(lagged(20, **{"sampler_gap/mean_abs": dx.STALE_GAP}), proximal) == {"stale_rollouts"}
    assert found(lagged(20, **{"sampler_gap/mean_abs": 0.059}), proximal) == set()
    # Corrected (tis_cap): the same gap is what the weights correct, not a symptom.
    assert found(lagged(20, **{"sampler_gap/mean_abs": 0.2}), {**proximal, "tis_cap": 2.0}) == set()
    assert found(lagged(20, **{"sampler_gap/mean_abs": 0.2}), {**proximal, "is_mask": "token"}) == set()
    # pi_old the policy that sampled (the clip): the gap is the sampler's numerics, nothing to read.
    assert found(lagged(20, **{"clip_ratio/region": 0.9}), lag) == set()
    # Too few steps at the full lag; no lag at all.
    assert found(lagged(13, **{"sampler_gap/mean_abs": 0.2}), proximal) == set()   # 9 steps at the full lag
    assert found(steps(20, **{"sampler_gap/mean_abs": 0.2}), {**CONFIG, "old_logprobs": "proximal"}) == {
        "sampler_mismatch"}
    history = lagged(40, **{"sampler_gap/mean_abs": 0.03})
    for m in history[9:21]:   # a stretch in the middle (a decaying learning rate shrinks it again)
        m["sampler_gap/mean_abs"] = 0.08
    finding = dx.stale_rollouts(history, proximal)
    assert finding.evidence == ("mean |log pi_now - log pi_sampler| per token 0.08, median over steps 6-15 "
                                "(threshold 0.06; rollout_lag = 4, old_logprobs = 'proximal', no tis_cap or is_mask)")


def test_the_sampler_gap_detectors_ignore_the_staleness_of_a_proximal_lag():
    """Under rollout_lag with old_logprobs = 'proximal' the gap of a stale step is its staleness
    (stale_rollouts' evidence), not a mismatched sampler; steps on fresh rollouts still count."""
    proximal = {**CONFIG, "rollout_lag": 4, "old_logprobs": "proximal", "tis_cap": 2.0}
    history = [healthy_step(s, staleness=float(min(s - 1, 4)), **{"sampler_gap/mean_abs": 0.1 if s > 1 else 2e-7})
               for s in range(1, 30)]
    assert found(history, proximal) == set()
    assert "sampler_mismatch" in found(history, {**proximal, "old_logprobs": "recomputed", "tis_cap": 0.0})


# ----------------------------------------------------------------- real runs

@pytest.mark.parametrize("folder", ["healthy_runs", "healthy_runs_first_run"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_no_false_alarm_on_whole_healthy_runs(seed, folder):
    """benchmarks/healthy_runs.py: `grpo-edu train` for 1,500 steps, the keys the doctor reads; the default
    config's runs and `make train`'s (configs/cpu-first-run.toml: no KL term, so no "kl" to read)."""
    healthy = HEALTHY.parent / folder
    with gzip.open(healthy / f"seed{seed}.jsonl.gz", "rt") as f:
        history = [json.loads(line) for line in f]
    config = json.loads((healthy / "config.json").read_text())
    assert (config["beta"] == 0.0) == (folder == "healthy_runs_first_run")
    assert all(("kl" in m) == (config["beta"] > 0) for m in history)
    assert len(history) == 1500 and config["steps"] == 1500
    assert all(key in m for m in history for key in ("truncated", "completion_length/mean"))   # read, not absent
    assert dx.diagnose(history, config) == []
    live = dx.LiveDoctor(config)
    assert [finding for end in range(1, 1501) for finding in live.check(history[:end])] == []


# Short versions of the lab's runs whose symptom shows within a few steps.
QUICK = {"alias": 8, "temperature": 8, "off_by_one": 8, "split": 8, "countdown_sparse": 8, "old_refreshed": 6}


@pytest.mark.parametrize("name", sorted(QUICK))
def test_a_lab_run_triggers_its_own_detector_and_no_other(tmp_path, name):
    spec = lab.RUNS[name]
    config = TrainConfig.from_dict({**spec.config(tmp_path / name).to_dict(), "steps": QUICK[name],
                                    "eval_size": 16, "eval_every": 100})
    result = (spec.faults or NONE).train(config, log=lambda line: None)
    assert {f.detector for f in dx.diagnose(result.history, config.to_dict())} == set(spec.expected)


def test_the_trainer_warns_once_when_a_symptom_appears(tmp_path):
    spec = lab.RUNS["alias"]
    config = TrainConfig.from_dict({**spec.config(tmp_path / "alias").to_dict(), "steps": 20, "eval_size": 16,
                                    "eval_every": 100})
    lines = []
    spec.faults.train(config, log=lines.append)
    warnings = [line for line in lines if line.startswith("warning")]
    assert len(warnings) == 1 and warnings[0].startswith(
        "warning at step 10: the reference is the policy (aliased): the KL term does nothing: kl = 0 exactly")
    assert warnings[0].endswith(f"(grpo-edu doctor {tmp_path / 'alias'})")


def test_the_healthy_lab_config_has_no_live_warning(tmp_path):
    config = TrainConfig.from_dict({**lab.RUNS["healthy"].config(tmp_path / "h").to_dict(), "steps": 30,
                                    "eval_size": 16, "eval_every": 100})
    lines = []
    trainer.train(config, log=lines.append)
    assert not [line for line in lines if line.startswith("warning")]


# ----------------------------------------------------------------- the command

def cli(*args):
    return subprocess.run([sys.executable, "-m", "grpo_edu", *args], capture_output=True, text=True)


def write_run(directory, history, config=CONFIG):
    directory.mkdir()
    (directory / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in history))
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def test_doctor_run_dir_reports_and_exits_1_on_findings(tmp_path):
    healthy = write_run(tmp_path / "ok", steps(30))
    done = cli("doctor", str(healthy))
    assert (done.returncode, done.stdout) == (0, "no symptoms found in 30 steps\n")
    aliased = write_run(tmp_path / "bad", steps(30, kl=0.0))
    done = cli("doctor", str(aliased))
    assert done.returncode == 1
    assert done.stdout.splitlines()[0] == ("the reference is the policy (aliased): the KL term does nothing "
                                           "[reference_aliased]")
    assert done.stdout.splitlines()[1].startswith("  evidence: kl = 0 exactly at all 29 steps from 2 to 30")


def test_doctor_run_dir_errors_name_the_argument(tmp_path):
    done = cli("doctor", str(tmp_path / "nope"))
    assert (done.returncode, done.stderr.strip()) == (
        2, f"grpo-edu doctor: RUN_DIR: expected a run directory, got {str(tmp_path / 'nope')!r} (no such folder)")
    (tmp_path / "empty").mkdir()
    done = cli("doctor", str(tmp_path / "empty"))
    assert done.stderr.strip().endswith("(no metrics.jsonl)")
    done = cli("doctor", str(tmp_path / "empty"), "--gpu")
    assert done.returncode == 2 and "expected RUN_DIR or --gpu, got both" in done.stderr


def test_every_lab_run_names_real_detectors_and_the_also_set_only_widens():
    for name, spec in lab.RUNS.items():
        assert spec.expected | spec.also <= set(dx.DETECTORS), name
        assert not spec.expected & spec.also, name
    countdown = lab.RUNS["countdown"]
    assert countdown.diagnosed_as_expected({"zero_std_groups"})
    assert countdown.diagnosed_as_expected({"zero_std_groups", "kl_runaway"})
    assert not countdown.diagnosed_as_expected({"kl_runaway"})                        # its own detector missing
    assert not countdown.diagnosed_as_expected({"zero_std_groups", "split_groups"})   # an unrelated one
    assert lab.RUNS["healthy"].diagnosed_as_expected(set()) and not lab.RUNS["healthy"].diagnosed_as_expected(
        {"kl_runaway"})


def test_the_training_doc_lists_every_detector_with_its_threshold():
    readme = (Path(__file__).parents[1] / "docs" / "training.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line for line in readme.splitlines() if line.startswith("| `")}
    assert set(dx.DETECTORS) <= set(rows)
    assert f"{dx.LENGTH_GROWTH}x" in rows["length_drift"] and f"{dx.GAP_MISMATCH} to {dx.GAP_MISALIGNED}" in rows[
        "sampler_mismatch"] and f"{dx.GRAD_GROWTH:g}x" in rows["grad_explosion"] and f"{dx.TIE_SPREAD:.0e}".replace("e-0", "e-") in rows[
        "split_groups"] and f"{dx.TRUNCATED_SHARE:g}" in rows["truncated_completions"]
    assert f"{dx.STALE_GAP:g}" in rows["stale_rollouts"]
    assert f"gap {dx.ENV_GAP:g} nats per token or more" in rows["environment_tokens_trained"]
