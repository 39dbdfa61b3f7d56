"""Chapter 0's estimators (grpo_edu.algorithm.baselines) and its enumerable policy (grpo_edu.algorithm.bandit):
hand-computed advantages, the identities between estimators, exact bias against enumeration,
the trainer running each one, and the comparison's results file re-derived by re-training."""

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from grpo_edu.algorithm import baselines
from grpo_edu.training import trainer
from grpo_edu.algorithm.bandit import Bandit, all_groups, moments, sampled_moments
from grpo_edu.config import TrainConfig
import grid_checks

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "estimators.json"
ONE_RIGHT = torch.tensor([[1.0, 0.0, 0.0, 0.0]], dtype=torch.float64)


def test_each_estimator_on_a_group_by_hand():
    third = 1 / 3
    assert baselines.reinforce(ONE_RIGHT).tolist() == [[1.0, 0.0, 0.0, 0.0]]
    assert torch.allclose(baselines.rloo(ONE_RIGHT), torch.tensor([[1.0, -third, -third, -third]], dtype=torch.float64))
    assert baselines.group_mean(ONE_RIGHT).tolist() == [[0.75, -0.25, -0.25, -0.25]]
    # population std of [1, 0, 0, 0]: sqrt(3/16); sample std: sqrt(1/4)
    assert torch.allclose(baselines.grpo(ONE_RIGHT), torch.tensor([[0.75, -0.25, -0.25, -0.25]],
                                                                  dtype=torch.float64) / math.sqrt(3 / 16))
    assert torch.allclose(baselines.grpo_sample_std(ONE_RIGHT),
                          torch.tensor([[1.5, -0.5, -0.5, -0.5]], dtype=torch.float64))
    two = torch.tensor([[1.0, 0.0], [1.0, 1.0]], dtype=torch.float64)   # batch mean 0.75
    assert baselines.batch_mean(two).tolist() == [[0.25, -0.75], [0.25, 0.25]]


groups = st.integers(1, 4).flatmap(lambda B: st.integers(2, 8).flatmap(lambda G: st.lists(
    st.sampled_from([0.0, 0.5, 1.0, 1.5]), min_size=B * G, max_size=B * G).map(
    lambda values: torch.tensor(values, dtype=torch.float64).view(B, G))))


@settings(max_examples=60, deadline=None)
@given(groups, st.floats(-5, 5))
def test_identities_and_shift_invariance(rewards, shift):
    G = rewards.shape[1]
    assert torch.allclose(baselines.rloo(rewards), G / (G - 1) * baselines.group_mean(rewards), atol=1e-12)
    for name in ("rloo", "group_mean", "grpo", "grpo_sample_std", "batch_mean"):
        function = baselines.ESTIMATORS[name][0]
        assert torch.allclose(function(rewards + shift), function(rewards), atol=1e-9), name
    flat = (rewards == rewards[:, :1]).all(dim=1)
    for name in ("rloo", "group_mean", "grpo", "grpo_sample_std"):
        assert (baselines.ESTIMATORS[name][0](rewards)[flat] == 0).all(), name   # exactly 0, no rounding residue
    assert torch.equal(baselines.reinforce(rewards + shift), rewards + shift)    # no baseline: the shift stays


def test_estimators_refuse_what_is_not_a_group():
    with pytest.raises(ValueError, match="needs G >= 2 completions per prompt"):
        baselines.rloo(torch.ones(3, 1))
    with pytest.raises(TypeError, match="rewards: expected a torch.Tensor of shape"):
        baselines.rloo([[1.0, 0.0]])
    with pytest.raises(ValueError, match="name: expected one of .*got 'ppo'"):
        baselines.spec("ppo")


BANDIT = Bandit([0.0, 0.5, 1.0, -0.5], [1.0, 0.0, 0.0, 0.5])


def test_the_bandits_gradient_is_the_derivative_of_its_value():
    step, numeric = 1e-6, []
    for k in range(4):
        up, down = BANDIT.logits.copy(), BANDIT.logits.copy()
        up[k] += step
        down[k] -= step
        numeric.append((Bandit(up, BANDIT.rewards).value - Bandit(down, BANDIT.rewards).value) / (2 * step))
    assert np.allclose(BANDIT.gradient(), numeric, atol=1e-9)


@pytest.mark.parametrize("G", [1, 2, 3, 5])
def test_exact_bias_of_each_estimator(G):
    gradient = BANDIT.gradient()
    assert np.allclose(moments(BANDIT, G).mean, gradient, atol=1e-12)                      # REINFORCE: unbiased
    if G >= 2:
        assert np.allclose(moments(BANDIT, G, baselines.rloo).mean, gradient, atol=1e-12)   # RLOO: unbiased
        assert np.allclose(moments(BANDIT, G, baselines.group_mean).mean, (G - 1) / G * gradient, atol=1e-12)
        grpo = moments(BANDIT, G, baselines.grpo).mean
        assert not np.allclose(grpo / gradient, (grpo / gradient)[0])   # the std's reweighting: not a scale


def test_the_groups_and_their_probabilities_are_all_of_them():
    actions, probability = all_groups(BANDIT, 3)
    assert actions.shape == (64, 3) and len({tuple(a) for a in actions}) == 64
    assert probability.sum() == pytest.approx(1.0, abs=1e-15)


def test_sampled_moments_agree_with_the_exact_ones():
    exact, sampled = moments(BANDIT, 4, baselines.rloo), sampled_moments(BANDIT, 4, baselines.rloo, groups=200_000)
    standard_error = math.sqrt(exact.variance / sampled.groups)
    assert np.abs(sampled.mean - exact.mean).max() < 5 * standard_error
    assert sampled.variance == pytest.approx(exact.variance, rel=0.03)


def test_bandit_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"logits, rewards: expected two \(K,\) arrays with K >= 2, got shapes"):
        Bandit([0.0, 1.0], [1.0])
    with pytest.raises(ValueError, match="G: expected 1 <= G with K\\^G groups at most 5,000,000, got G = 12"):
        moments(BANDIT, 12)


# ----------------------------------------------------------------- in the trainer

def tiny(tmp_path, **overrides):
    values = dict(prompts_per_step=4, num_generations=8, steps=3, eval_every=100, eval_size=8, progress=False,
                  checkpoint_every=0, output_dir=str(tmp_path))
    return TrainConfig.from_dict({**TrainConfig().to_dict(), **values, **overrides})


def weights(result):
    return torch.cat([p.detach().flatten() for p in result.policy.parameters()])


def test_the_trainer_runs_the_estimators_and_grpo_is_its_default(tmp_path):
    """advantage_fn = "grpo_edu.algorithm.baselines:grpo" trains the default run bit for bit; RLOO another run."""
    default = trainer.train(tiny(tmp_path / "default"), log=lambda line: None)
    grpo = trainer.train(tiny(tmp_path / "grpo", advantage_fn=baselines.spec("grpo")), log=lambda line: None)
    rloo = trainer.train(tiny(tmp_path / "rloo", advantage_fn=baselines.spec("rloo")), log=lambda line: None)
    assert torch.equal(weights(default), weights(grpo))
    assert not torch.equal(weights(default), weights(rloo))


# ----------------------------------------------------------------- the comparison's results file

def test_the_results_file_holds_every_estimator_and_seed():
    results = json.loads(RESULTS.read_text())
    keys = {(r["estimator"], r["seed"]) for r in results["runs"]}
    assert keys == {(name, seed) for name in baselines.ESTIMATORS for seed in results["seeds"]}
    assert results["seeds"] == [0, 1, 2]
    for run in results["runs"]:
        assert [step for step, _ in run["eval"]] == list(range(20, results["steps"] + 1, 20))
        assert run["final_accuracy"] == run["eval"][-1][1]
        assert all(len(values) == results["steps"] for values in run["steps"].values())


needs_pin = grid_checks.PINNED


def check(path, run="rloo:0"):
    return grid_checks.run_check("estimators.py", path, run, "5")


@needs_pin
@pytest.mark.slow
def test_the_results_file_is_what_the_trainer_computes(tmp_path):
    """Re-train RLOO, seed 0, for 5 steps under the pin: every logged number of those steps equals
    the file's (the evaluations come at step 20: the file's are what test_the_results_file_holds_
    every_estimator_and_seed checks). A changed file is caught."""
    done = check(RESULTS)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "rloo:0 first 5 steps: equal to the file" in done.stdout
    results = json.loads(RESULTS.read_text())
    run = next(r for r in results["runs"] if (r["estimator"], r["seed"]) == ("rloo", 0))
    run["steps"]["advantage/std"][3] += 1e-9
    changed = tmp_path / "estimators.json"
    changed.write_text(json.dumps(results))
    done = check(changed)
    assert done.returncode != 0 and "advantage/std differs in steps 1-5" in done.stdout
