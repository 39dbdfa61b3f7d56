"""The explorers, driven from Python the way a reader's slider drives them.

Each test sets widget values, then checks what the explorer shows (its state and the
exact values in its HTML table) against grpo_edu's own computation for the same
inputs, and, where it is cheap, against a computation that does not go through
grpo_edu at all (finite differences, brute-force sums, autograd).
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch

from grpo_edu.algorithm import estimators, reference, worked_example
from grpo_edu.book import notebooks
from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.exercises import ch02
from grpo_edu.algorithm.aggregation import aggregation_weights
from grpo_edu.algorithm.kl import kl_estimate
from grpo_edu.algorithm.loss import grpo_loss
from grpo_edu.widgets import AdvantageExplorer, ClippingExplorer, KLExplorer, LengthBiasExplorer
from grpo_edu.widgets import advantages as advantage_view
from grpo_edu.widgets import clipping as clipping_view
from grpo_edu.widgets._base import snap


def table_values(html: str, css: str) -> list[float]:
    """The exact values (data-value) of the cells whose class list starts with css."""
    return [float(v) for v in re.findall(rf'<td class="{re.escape(css)}"[^>]*data-value="([^"]+)"', html)]


def assert_finite_state(*arrays):
    for array in arrays:
        assert np.all(np.isfinite(np.asarray(array, dtype=float))), array


# --------------------------------------------------------------------------- advantages

def test_advantage_explorer_default_is_chapter_1_and_grpo_edu():
    explorer = AdvantageExplorer()
    state = explorer.state
    np.testing.assert_array_equal(state.rewards[0], worked_example.REWARDS)
    np.testing.assert_array_equal(state.advantages, group_advantages(state.rewards))
    # chapter 1's population-std advantages, from the NumPy reference
    np.testing.assert_allclose(state.advantages[0], reference.group_advantages(worked_example.REWARDS),
                               atol=1e-12)
    shown = np.array(table_values(explorer.table.value, "advantage")).reshape(2, 4)
    np.testing.assert_array_equal(shown, state.advantages)
    assert "+1.1717" in explorer.table.value and "-1.4321" in explorer.table.value


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
@pytest.mark.parametrize("std", ["population", "sample"])
def test_advantage_explorer_follows_its_controls(scale, std):
    explorer = AdvantageExplorer()
    explorer.scale.value = scale
    explorer.std.value = std
    explorer.reward_sliders[0][1].value = 0.8
    explorer.reward_sliders[1][3].value = -0.35
    explorer.shift.value = 0.25
    state = explorer.state
    expected_rewards = np.array([[0.9, 0.8, -0.1, 0.7], [1.0, 0.9, 1.0, -0.35]]) + 0.25
    np.testing.assert_allclose(state.rewards, expected_rewards, atol=1e-12)
    np.testing.assert_array_equal(state.advantages, group_advantages(state.rewards, scale=scale, std=std))
    np.testing.assert_array_equal(np.array(table_values(explorer.table.value, "reward")).reshape(2, 4),
                                  state.rewards)
    np.testing.assert_array_equal(np.array(table_values(explorer.table.value, "advantage")).reshape(2, 4),
                                  state.advantages)
    # the mean and std the table shows are the ones the advantages were made with
    np.testing.assert_allclose(state.advantages * (state.scales[:, None] + (0 if scale == "none" else 1e-8)),
                               state.rewards - state.means[:, None], atol=1e-12)
    # shifting every reward changed nothing, and the explorer says so
    assert state.shift_change < 1e-12
    assert any("changes the advantages by at most 0.0000" in note for note in state.notes)
    assert bytes(explorer.plot.image.value).startswith(b"\x89PNG")


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_all_equal_group_teaches_nothing(scale):
    explorer = AdvantageExplorer(scale=scale)
    with explorer.hold():
        for slider in explorer.reward_sliders[1]:
            slider.value = 0.55
    state = explorer.state
    assert_finite_state(state.advantages, state.scales)
    assert np.all(state.advantages[1] == 0.0)
    assert state.silent.tolist() == [False, True]
    assert any(note.startswith("prompt 2: all 4 rewards are +0.55") and "teaches nothing" in note
               for note in state.notes)
    assert table_values(explorer.table.value, "advantage")[4:] == [0.0] * 4


def test_every_reward_equal_in_the_batch_gives_zeros_not_nan():
    explorer = AdvantageExplorer(scale="batch", std="sample")
    with explorer.hold():
        for sliders in explorer.reward_sliders:
            for slider in sliders:
                slider.value = -1.0
    assert np.all(explorer.state.advantages == 0.0)
    assert explorer.state.silent.all()
    assert "nan" not in explorer.table.value.lower()


def test_browser_rounding_noise_does_not_hide_an_all_equal_group():
    # the front end sends 0.8999999999999999 for 0.9 (seen in the browser test)
    explorer = AdvantageExplorer()
    with explorer.hold():
        for slider, value in zip(explorer.reward_sliders[0], [0.9, 0.8999999999999999, 0.9, 0.9000000000000001]):
            slider.value = value
    assert explorer.state.silent[0] and np.all(explorer.state.advantages[0] == 0.0)
    assert snap(-5.551115123125783e-17) == 0.0 and math.copysign(1, snap(-1e-17)) == 1


@pytest.mark.parametrize("G", [2, 3, 8])
def test_changing_group_size(G):
    explorer = AdvantageExplorer()
    explorer.group_size.value = G
    assert [len(s) for s in explorer.reward_sliders] == [G, G]
    assert len(explorer.rows[0].children) == G
    np.testing.assert_array_equal(explorer.rewards()[:, :min(G, 4)], np.array(advantage_view.DEFAULT_REWARDS)[:, :min(G, 4)])
    explorer.reward_sliders[0][G - 1].value = 1.0       # a new or an old slider still drives it
    assert explorer.state.rewards.shape == (2, G)
    np.testing.assert_array_equal(explorer.state.advantages, group_advantages(explorer.state.rewards))
    assert len(table_values(explorer.table.value, "advantage")) == 2 * G


def test_advantage_explorer_rejects_bad_rewards():
    with pytest.raises(ValueError, match=r"rewards must have shape \(2, G\)"):
        AdvantageExplorer(rewards=[[0.1, 0.2, 0.3]])


# --------------------------------------------------------------------------- clipping

def test_clipped_objective_matches_the_reference_on_chapter_1():
    update = worked_example.update()
    for response in update.responses:
        shown = estimators.clipped_objective(response.ratio, response.advantage, epsilon=0.2)
        np.testing.assert_allclose(shown.objective, response.objective, atol=1e-12)
        np.testing.assert_array_equal(shown.clipped, response.clipped)


@pytest.mark.parametrize("advantage", [1.3, -0.7, 0.0])
@pytest.mark.parametrize("low,high", [(0.2, 0.2), (0.2, 0.28), (0.0, 0.0), (0.5, 0.1)])
def test_clipped_objective_gradient_is_the_derivative_of_its_objective(advantage, low, high):
    ratio = np.linspace(0.05, 2.4, 200)
    ratio = ratio[np.min(np.abs(ratio[:, None] - [1 - low, 1 + high]), axis=1) > 1e-3]  # off the kinks
    h = 1e-6
    shown = estimators.clipped_objective(ratio, advantage, epsilon=low, epsilon_high=high)
    up = estimators.clipped_objective(ratio + h, advantage, epsilon=low, epsilon_high=high).objective
    down = estimators.clipped_objective(ratio - h, advantage, epsilon=low, epsilon_high=high).objective
    np.testing.assert_allclose(shown.gradient, (up - down) / (2 * h), atol=1e-6)
    # the textbook formula, written out independently
    clip = np.clip(ratio, 1 - low, 1 + high)
    np.testing.assert_allclose(shown.objective, np.minimum(ratio * advantage, clip * advantage), atol=1e-12)
    assert shown.clipped_low.sum() == ((ratio < 1 - low) & (advantage < 0)).sum()
    assert shown.clipped_high.sum() == ((ratio > 1 + high) & (advantage > 0)).sum()


@pytest.mark.parametrize("advantage", [1.5, -1.0, -0.05])
@pytest.mark.parametrize("low,high", [(0.2, 0.2), (0.1, 0.3), (0.0, 0.0)])
def test_clipping_explorer_follows_its_controls(advantage, low, high):
    explorer = ClippingExplorer()
    with explorer.hold():
        explorer.advantage.value = advantage
        explorer.epsilon_low.value = low
        explorer.epsilon_high.value = high
    state = explorer.state
    ratios = worked_example.token_ratios()
    expected = estimators.clipped_objective(ratios, advantage, epsilon=low, epsilon_high=high)
    np.testing.assert_array_equal(state.tokens.objective, expected.objective)
    np.testing.assert_array_equal(table_values(explorer.table.value, "objective"), expected.objective)
    np.testing.assert_array_equal(table_values(explorer.table.value, "gradient"), expected.gradient)
    np.testing.assert_array_equal(state.curve.objective, estimators.clipped_objective(
        clipping_view.GRID, advantage, epsilon=low, epsilon_high=high).objective)
    # the clip decisions agree with grpo_loss's own clip metric on the same tokens
    logp = torch.tensor(np.log(ratios) - 1.0).reshape(-1, 1)
    metrics = grpo_loss(logp, torch.full_like(logp, -1.0), torch.full((9,), advantage, dtype=torch.float64),
                        torch.ones_like(logp, dtype=torch.bool), epsilon=low, epsilon_high=high).metrics
    assert metrics["clip_ratio/region"] == pytest.approx(state.tokens.clipped.mean(), abs=1e-12)
    side = "A > 0" if advantage > 0 else "A < 0"
    assert state.notes[0].startswith(side)
    assert f"({int(state.tokens.clipped.sum())} of 9)" in state.notes[-1]


def test_clipping_explorer_at_zero_advantage_and_zero_epsilon():
    explorer = ClippingExplorer()
    with explorer.hold():
        explorer.advantage.value = 0.0
        explorer.epsilon_low.value = 0.0
        explorer.epsilon_high.value = 0.0
    state = explorer.state
    assert_finite_state(state.curve.objective, state.curve.gradient)
    assert np.all(state.curve.objective == 0) and np.all(state.curve.gradient == 0)
    assert not state.tokens.clipped.any() and state.no_gradient is None
    assert state.notes[0].startswith("A = 0: the objective and its gradient are 0")
    explorer.advantage.value = 1.0            # eps = 0: everything that rose is clipped
    assert state is not explorer.state
    assert np.array_equal(explorer.state.tokens.clipped, worked_example.token_ratios() > 1.0)


def test_clipped_objective_rejects_bad_ratios():
    with pytest.raises(ValueError, match="ratio must lie in"):
        estimators.clipped_objective([0.0, 1.0], 1.0)
    with pytest.raises(ValueError, match="epsilon"):
        estimators.clipped_objective([1.0], 1.0, epsilon=1.5)


# --------------------------------------------------------------------------- KL

def test_kl_explorer_default_numbers():
    explorer = KLExplorer()
    state = explorer.state
    p = np.exp(state.logits) / np.exp(state.logits).sum()
    q = np.exp(state.ref_logits) / np.exp(state.ref_logits).sum()
    exact = float(np.sum(p * np.log(p / q)))             # brute force, not through grpo_edu
    assert state.exact_kl == pytest.approx(exact, abs=1e-12)
    d = np.log(q) - np.log(p)
    for name, values in (("k1", -d), ("k2", d * d / 2), ("k3", np.exp(d) - 1 - d)):
        np.testing.assert_allclose(state.per_token[name], values, atol=1e-12)
        np.testing.assert_array_equal(state.per_token[name], kl_estimate(
            torch.from_numpy(reference.log_softmax(state.logits)),
            torch.from_numpy(reference.log_softmax(state.ref_logits)), name).numpy())
    # k1 and k3 are unbiased, k2 is not
    assert state.expected["k1"] == pytest.approx(exact, abs=1e-12)
    assert state.expected["k3"] == pytest.approx(exact, abs=1e-12)
    assert state.expected["k2"] != pytest.approx(exact, abs=1e-4)
    shown = table_values(explorer.table.value, "exact-kl")
    assert shown == [state.exact_kl]


def test_kl_explorer_samples_converge_to_the_expectation():
    explorer = KLExplorer()
    explorer.num_samples.value = 10000
    state = explorer.state
    for name in ("k1", "k2", "k3"):
        # within 5 standard errors of the exact mean
        assert abs(state.sample_mean[name] - state.expected[name]) < 5 * state.sample_std[name] / 100
        assert table_values(explorer.table.value, f"sample-mean {name}") == [state.sample_mean[name]]
    assert state.sample_std["k3"] < state.sample_std["k1"]


def test_kl_explorer_follows_its_sliders_and_handles_identical_and_extreme():
    explorer = KLExplorer()
    with explorer.hold():
        for slider, ref in zip(explorer.ref_logit_sliders, explorer.logit_sliders):
            slider.value = ref.value
    state = explorer.state
    assert state.exact_kl == 0.0 or abs(state.exact_kl) < 1e-15
    for name in ("k1", "k2", "k3"):
        assert state.sample_mean[name] == 0.0 and state.sample_std[name] == 0.0
    assert state.notes == ("pi = pi_ref: every estimator is 0 on every sample, and so is the KL",)
    with explorer.hold():
        for slider, value in zip(explorer.logit_sliders, [3.0, -3.0, -3.0]):
            slider.value = value
        for slider, value in zip(explorer.ref_logit_sliders, [-3.0, 3.0, 3.0]):
            slider.value = value
    state = explorer.state
    assert_finite_state(list(state.expected.values()), list(state.sample_mean.values()),
                        list(state.sample_std.values()), [state.exact_kl])
    assert state.exact_kl == pytest.approx(estimators.categorical_kl([3, -3, -3], [-3, 3, 3]), abs=1e-12)
    assert "nan" not in explorer.table.value.lower()


def test_categorical_kl_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"shape \(V,\)"):
        estimators.categorical_kl([0.0, 1.0], [0.0, 1.0, 2.0])


# --------------------------------------------------------------------------- length bias

@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_token_weights_are_the_gradient_of_grpo_loss(loss_type):
    lengths = np.array([3, 17, 64, 5])
    mask = torch.arange(64)[None, :] < torch.from_numpy(lengths)[:, None]
    logp = torch.full(mask.shape, -0.5, dtype=torch.float64, requires_grad=True)
    loss = grpo_loss(logp, logp.detach(), torch.ones(4, dtype=torch.float64), mask,
                     loss_type=loss_type, max_completion_length=100).loss
    (gradient,) = torch.autograd.grad(loss, logp)
    weights = estimators.response_token_weights(lengths, loss_type, max_completion_length=100)
    for i, length in enumerate(lengths):
        np.testing.assert_allclose(-gradient[i, :length].numpy(), weights[i], rtol=1e-12)
    np.testing.assert_array_equal(weights, aggregation_weights(mask, loss_type, max_completion_length=100)[:, 0])


def test_length_bias_explorer_default_and_controls():
    explorer = LengthBiasExplorer()
    state = explorer.state
    np.testing.assert_array_equal(state.lengths, [20, 54, 147, 400])
    np.testing.assert_allclose(state.totals["grpo"], 1 / 4, rtol=1e-12)        # each response: 1/G
    np.testing.assert_allclose(state.weights["dr_grpo"], 1 / (4 * 512), rtol=1e-12)
    np.testing.assert_allclose(state.weights["dapo"], 1 / state.lengths.sum(), rtol=1e-12)
    np.testing.assert_array_equal(state.weights["dapo"], state.weights["bnpo"])
    assert state.short_to_long["grpo"] == pytest.approx(400 / 20)
    assert table_values(explorer.table.value, "weight grpo") == state.weights["grpo"].tolist()

    with explorer.hold():
        explorer.group_size.value = 16
        explorer.lengths.value = (1, 300)
    state = explorer.state
    assert len(state.lengths) == 16 and state.lengths[0] == 1 and state.lengths[-1] == 300
    for loss_type in ("grpo", "dr_grpo", "dapo"):
        np.testing.assert_array_equal(state.weights[loss_type], estimators.response_token_weights(
            state.lengths, loss_type, max_completion_length=512))

    explorer.max_completion_length.value = 128     # clamps the lengths: no response exceeds it
    state = explorer.state
    assert explorer.lengths.max == 128 and state.lengths.max() <= 128
    assert state.max_completion_length == 128
    np.testing.assert_allclose(state.weights["dr_grpo"], 1 / (16 * 128), rtol=1e-12)


def test_length_bias_with_equal_lengths():
    explorer = LengthBiasExplorer()
    explorer.lengths.value = (64, 64)
    state = explorer.state
    for loss_type in ("grpo", "dapo"):
        np.testing.assert_allclose(state.weights[loss_type], 1 / (4 * 64), rtol=1e-12)
    assert state.short_to_long["grpo"] == 1.0


def test_response_token_weights_rejects_bad_lengths():
    with pytest.raises(ValueError, match="lengths must be whole numbers >= 1"):
        estimators.response_token_weights([0, 3], "grpo")
    with pytest.raises(ValueError, match="max_completion_length"):
        estimators.response_token_weights([10, 300], "dr_grpo", max_completion_length=100)


# --------------------------------------------------------------------------- display

@pytest.mark.parametrize("cls", [AdvantageExplorer, ClippingExplorer, KLExplorer, LengthBiasExplorer])
def test_display_bundle_is_a_widget_view_with_stable_text(cls):
    explorer = cls()
    bundle = explorer._repr_mimebundle_()
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == explorer.widget.model_id
    text = bundle["text/plain"]
    assert text == repr(explorer) == repr(cls())          # the same for every fresh explorer
    assert text.startswith(f"<{cls.__name__}: ") and "0x" not in text and len(text) < 200
    assert "grpo-explorer" in explorer.widget._dom_classes
    assert explorer.report().strip() and "nan" not in explorer.report().lower()
    assert explorer.updates == 1 and explorer.last_update_seconds > 0


# --------------------------------------------------------------------------- exercises

def test_chapter_2_checkers_accept_right_answers():
    def advantages(rewards, scale):
        return group_advantages(rewards, scale=scale)

    def clip_gradient(ratio, advantage, low, high):
        return np.where(np.clip(ratio, 1 - low, 1 + high) * advantage < ratio * advantage, 0.0, advantage)

    def expected(logits, ref_logits):
        p, q = np.exp(logits) / np.exp(logits).sum(), np.exp(ref_logits) / np.exp(ref_logits).sum()
        d = np.log(q) - np.log(p)
        return [np.sum(p * -d), np.sum(p * d * d / 2), np.sum(p * (np.exp(d) - 1 - d))]

    def response_weights(lengths, loss_type, max_length):
        G = len(lengths)
        return {"grpo": np.full(G, 1 / G), "dr_grpo": lengths / (G * max_length),
                "dapo": lengths / lengths.sum()}[loss_type]

    assert ch02.check_batch_advantages(advantages)
    assert ch02.check_clip_gradient(clip_gradient)
    assert ch02.check_expected_estimates(expected)
    assert ch02.check_response_weights(response_weights)


def test_chapter_2_checkers_name_the_failing_case():
    result = ch02.check_batch_advantages(lambda r, s: group_advantages(r, scale="group" if s == "batch" else s))
    assert len(result.failures) == 3 and all("scale='batch'" in f for f in result.failures)
    assert result.failures[0].endswith("8 of 8 elements are wrong: element (0, 0) is too small, element (0, 1) is "
                                       "too large, element (0, 2) is too large, and 5 more")
    assert "1.2136" not in str(result)      # the right value is never printed
    result = ch02.check_clip_gradient(lambda ratio, a, low, high: np.where(
        (ratio >= 1 - low) & (ratio <= 1 + high), a, 0.0))
    assert len(result.failures) == 5 and "A = 0" not in " ".join(result.failures)
    result = ch02.check_expected_estimates(lambda logits, ref: 1 / 0)
    assert len(result.failures) == 4 and "raised ZeroDivisionError" in result.failures[0]
    result = ch02.check_response_weights(lambda n, t, m: np.full(len(n), 1 / len(n)))
    assert len(result.failures) == 7 and not any("'grpo'" in f for f in result.failures)


# --------------------------------------------------------------------------- notebooks

def test_widget_model_ids_are_renumbered_consistently_and_idempotently():
    import nbformat

    first, second = "a3f1c2d44e5b4f6a8b9c0d1e2f3a4b5c", "0f1e2d3c4b5a49788796a5b4c3d2e1f0"
    notebook = nbformat.v4.new_notebook()
    view = {"application/vnd.jupyter.widget-view+json": {"model_id": second, "version_major": 2,
                                                          "version_minor": 0}, "text/plain": "<x>"}
    notebook.cells = [nbformat.v4.new_code_cell("x", outputs=[
        nbformat.v4.new_output("display_data", data=view)])]
    notebook.metadata["widgets"] = {notebooks.WIDGET_STATE: {"state": {
        first: {"model_name": "LayoutModel", "state": {}},
        second: {"model_name": "VBoxModel", "state": {"layout": f"IPY_MODEL_{first}"}}},
        "version_major": 2, "version_minor": 0}}
    once = notebooks.normalise(notebook)
    state = once.metadata["widgets"][notebooks.WIDGET_STATE]["state"]
    one, two = "0" * 31 + "1", "0" * 31 + "2"
    assert list(state) == [one, two]                      # creation order
    assert state[two]["state"]["layout"] == f"IPY_MODEL_{one}"
    assert once.cells[0].outputs[0].data["application/vnd.jupyter.widget-view+json"]["model_id"] == two
    assert nbformat.writes(notebooks.normalise(once)) == nbformat.writes(once)


# --------------------------------------------------------------------------- chapter 1's data

def test_worked_example_is_chapter_1s_data():
    """The explorers draw "chapter 1's tokens" from grpo_edu.algorithm.worked_example; chapter 1 types
    the same numbers out for its reader. Read them from chapter 1's source and compare."""
    import ast
    from pathlib import Path

    source = (Path(__file__).resolve().parent.parent / "chapters" / "01_grpo_by_hand.py").read_text()
    found = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            name = node.targets[0].id
            if name in ("token_ids", "old_logp", "ref_logp", "new_logits", "rewards") and name not in found:
                found[name] = eval(compile(ast.Expression(node.value), "chapter 1", "eval"), {"np": np})
    assert set(found) == {"token_ids", "old_logp", "ref_logp", "new_logits", "rewards"}, sorted(found)
    assert [list(t) for t in found["token_ids"]] == [list(t) for t in worked_example.TOKEN_IDS]
    for name, ours in (("old_logp", worked_example.OLD_LOGP), ("ref_logp", worked_example.REF_LOGP),
                       ("new_logits", worked_example.NEW_LOGITS)):
        assert len(found[name]) == len(ours)
        for theirs, mine in zip(found[name], ours):
            np.testing.assert_array_equal(np.asarray(theirs), np.asarray(mine), err_msg=name)
    np.testing.assert_array_equal(found["rewards"], worked_example.REWARDS)
