"""The chapter-12 checkers accept the worked solutions, name what a wrong answer got wrong,
report an answer that raises, and check against what the library does."""

from types import SimpleNamespace

import pytest
import torch

from grpo_edu.exercises import ch12
from grpo_edu.training import asynchronous

# ----------------------------------------------------------------- 11.1


def sequence_weights(old_logp, sampler_logp, mask, band):
    """The worked solution."""
    low, high = band
    total = (old_logp - sampler_logp).masked_fill(~mask, 0.0).sum(-1)
    geometric = torch.exp(total / mask.sum(-1))
    product = torch.exp(total)
    return geometric, product, (geometric >= low) & (geometric <= high)


def test_sequence_weights_solution_passes():
    result = ch12.check_sequence_weights(sequence_weights)
    assert result and result.passed == len(ch12.sequence_weight_cases())
    assert ch12.check_sequence_weights(sequence_weights, seed=3)


def test_the_drift_case_separates_the_geometric_mean_from_the_product():
    """The case the exercise asks about: the geometric mean keeps three of four, the product none."""
    name, old, sampler, mask, band = ch12.sequence_weight_cases()[2]
    geometric, product, keep = ch12.sequence_weights(old, sampler, mask, band)
    assert "each token off by a constant" in name
    assert keep.tolist() == [True, True, True, False]
    assert not ((product >= band[0]) & (product <= band[1])).any()


def test_sequence_weights_keep_is_the_trainers_sequence_mask():
    from grpo_edu.algorithm.offpolicy import Correction, correction_weights
    for _, old, sampler, mask, band in ch12.sequence_weight_cases():
        w, metrics = correction_weights(old, sampler, mask, Correction(is_mask="sequence", is_mask_band=band))
        keep = sequence_weights(old, sampler, mask, band)[2]
        assert torch.equal(w[mask], keep[:, None].expand_as(mask)[mask].double())


def test_sequence_weights_names_the_case_and_the_part():
    def wrong_product(old_logp, sampler_logp, mask, band):
        geometric, product, keep = sequence_weights(old_logp, sampler_logp, mask, band)
        return geometric, 2 * product, keep
    result = ch12.check_sequence_weights(wrong_product)
    assert len(result.failures) == len(ch12.sequence_weight_cases())
    assert result.failures[0].startswith("8 responses of 1-12 tokens, a small mismatch: product: ")
    assert "all off by the same factor: about 2 times the right values" in result.failures[0]


def test_sequence_weights_reports_an_answer_that_raises_or_returns_one_thing():
    def raises(old_logp, sampler_logp, mask, band):
        raise NotImplementedError("your weights here")
    result = ch12.check_sequence_weights(raises)
    assert not result and result.passed == 0
    assert all(f.endswith("raised NotImplementedError: your weights here") for f in result.failures)
    result = ch12.check_sequence_weights(lambda old, sampler, mask, band: sequence_weights(old, sampler, mask,
                                                                                           band)[0])
    assert "returned Tensor; return three things: (geometric, product, keep)" in result.failures[0]


# ----------------------------------------------------------------- 11.2


def run_seconds(phase, steps, lag, overlap):
    """The worked solution."""
    sample = phase["rollout"] + phase["scoring"]
    if not overlap:
        return steps * (sample + phase["update"])
    alone = min(lag, steps)
    return alone * sample + (steps - alone) * max(sample, phase["update"]) + alone * phase["update"]


def test_run_seconds_solution_passes():
    result = ch12.check_run_seconds(run_seconds)
    assert result and result.passed == len(ch12.RUN_SECONDS_CASES)


class _Background:
    """BackgroundSampler's protocol, recording whether a rollout runs beside the update."""

    def __init__(self):
        self.running = False

    def start(self, models, sample):
        self.running = True

    def join(self):
        if not self.running:
            return None
        self.running = False
        return SimpleNamespace(sampled_at=None)


@pytest.mark.parametrize("steps, lag, overlap", [(10, 1, True), (50, 4, True), (5, 8, True), (4, 4, True),
                                                 (12, 3, False), (3, 5, False)])
def test_run_seconds_is_how_the_rollout_sources_order_the_phases(steps, lag, overlap):
    """Drive Lagged and Overlapped as the trainer's loop does (next, update, after_update), over a
    sampler that prices sampling and updating by the phases: the wall time is the reference's."""
    phase = {"rollout": 0.3, "scoring": 0.2, "update": 0.4}
    sample = phase["rollout"] + phase["scoring"]
    seconds = 0.0

    class Sampler:   # what a source asks of its sampler: sample(step) and the models to sync from
        models = None

        def sample(self, step, engine=None, models=None, world=None):
            nonlocal seconds
            seconds += sample
            return SimpleNamespace(sampled_at=step)

    background = _Background()
    source = (asynchronous.Overlapped(Sampler(), lag, steps, background) if overlap
              else asynchronous.Lagged(Sampler(), lag, steps))
    for step in range(steps):
        source.next(step)
        beside = background.running
        seconds += max(sample, phase["update"]) if beside else phase["update"]
        source.after_update()
    assert seconds == pytest.approx(ch12.run_seconds(phase, steps, lag, overlap), abs=1e-12)
    assert source.in_flight == []   # every rollout sampled was trained on


def test_run_seconds_reports_an_answer_that_raises():
    def raises(phase, steps, lag, overlap):
        return phase["sampling"]
    result = ch12.check_run_seconds(raises)
    assert len(result.failures) == len(ch12.RUN_SECONDS_CASES)
    assert result.failures[0].endswith("raised KeyError: 'sampling'")


def test_run_seconds_names_an_unknown_mistake_by_its_size():
    result = ch12.check_run_seconds(lambda phase, steps, lag, overlap: 1.5 * run_seconds(phase, steps, lag, overlap))
    assert "is too large: about 1.5 times the right value" in result.failures[0]
