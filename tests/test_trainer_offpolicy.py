"""pi_old, mini-batches and the learning-rate schedule: the trainer's off-policy steps,
on a tiny randomly initialised model (helpers from test_trainer)."""

import math
import random
import warnings

import pytest
import torch
from torch.optim.optimizer import register_optimizer_step_pre_hook

from grpo_edu.runtime.distributed import World
from grpo_edu.environment import tasks
from grpo_edu.training import placement, rollouts, scoring, trainer, update, user_functions
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.algorithm.loss import LossSettings, grpo_loss
from grpo_edu.sampling.rollout import HFEngine
from test_trainer import count_digits, small_config, tiny

DIGITS = {"digits": (count_digits, 1.0)}


def quiet_run(config, **kwargs):
    policy, tokenizer = tiny()
    kwargs.setdefault("reward_functions", DIGITS)
    return trainer.train(config, policy=policy, tokenizer=tokenizer, log=lambda _: None, **kwargs)


def record_loss_calls(monkeypatch) -> list[dict]:
    """Every grpo_loss call of the trainer: its pi_old, mask, ratio and metrics, in call order."""
    calls = []

    def recording(logp, old_logp, advantages, completion_mask, *settings, **kwargs):
        out = grpo_loss(logp, old_logp, advantages, completion_mask, *settings, **kwargs)
        calls.append(dict(old_logp=old_logp.clone(), mask=completion_mask.bool(), ratio=out.ratio,
                          metrics=out.metrics))
        return out

    monkeypatch.setattr(update, "grpo_loss", recording)
    return calls


def engine_that_reports(transform=None, temperature=None):
    """make_engine whose rollouts carry transform(sampler_logp, mask) as their log-probs,
    or are sampled at another temperature than the trainer's."""
    make_engine = placement.make_engine

    def make(config, models, tokenizer, world):
        engine = make_engine(config, models, tokenizer, world)
        generate = engine.generate

        def tampered(prompt_ids, prompt_mask, sampling, **options):
            if temperature is not None:
                sampling = type(sampling)(sampling.num_generations, sampling.max_new_tokens, temperature)
            rollout = generate(prompt_ids, prompt_mask, sampling, **options)
            if transform is not None:
                rollout.sampler_logp = transform(rollout.sampler_logp, rollout.completion_mask)
            return rollout

        engine.generate = tampered
        return engine
    return make


# ----------------------------------------------------------------- pi_old

@pytest.mark.parametrize("num_iterations, num_mini_batches", [(1, 4), (2, 2)])
def test_the_clip_acts_on_later_mini_batches(tmp_path, monkeypatch, num_iterations, num_mini_batches):
    """pi_old is the policy that sampled for all K optimizer steps of a rollout: the first
    step's ratio is exactly 1, the later steps' are off-policy and get clipped."""
    calls = record_loss_calls(monkeypatch)
    config = small_config(tmp_path, steps=2, num_iterations=num_iterations, num_mini_batches=num_mini_batches,
                          epsilon=0.02, epsilon_high=0.02, learning_rate=1e-2, beta=0.0)
    result = quiet_run(config)
    K = num_iterations * num_mini_batches
    assert len(calls) == 2 * K   # one micro-batch per mini-batch (micro_batch_size 128)
    for step in range(2):
        first, later = calls[step * K], calls[step * K + 1:(step + 1) * K]
        assert torch.equal(first["ratio"][first["mask"]], torch.ones(int(first["mask"].sum())))
        assert first["metrics"]["clip_ratio/region"] == 0.0
        assert max(call["metrics"]["clip_ratio/region"] for call in later) > 0
    assert all(m["clip_ratio/region"] > 0 and m["optimizer_steps"] == K for m in result.history)


def test_one_step_on_policy_adds_no_forward(tmp_path, monkeypatch):
    """K = 1 keeps the fast path: the policy runs one forward per micro-batch, no pi_old pass;
    K = 2 adds exactly one no-grad pass over the rollout."""
    forwards = []
    sequence_logprobs = placement.sequence_logprobs

    def counting(config, model, *args):
        forwards.append(torch.is_grad_enabled())
        return sequence_logprobs(config, model, *args)

    monkeypatch.setattr(placement, "sequence_logprobs", counting)
    quiet_run(small_config(tmp_path, steps=1, beta=0.0, micro_batch_size=8))
    assert forwards == [True, True]                        # 16 completions in 2 micro-batches
    forwards.clear()
    quiet_run(small_config(tmp_path, steps=1, beta=0.0, micro_batch_size=8, num_iterations=2,
                           output_dir=str(tmp_path / "two")))
    assert forwards == [False, False] + [True, True] * 2


def test_old_logprobs_sampler_is_the_losss_pi_old(tmp_path, monkeypatch):
    """old_logprobs = "sampler": the loss's pi_old is rollout.sampler_logp, so a sampler that
    reports log-probs 0.3 lower gives ratios near e^0.3 from the first step on; with
    "recomputed" the same one-step run has ratio 1 exactly. The gap metric sees 0.3."""
    monkeypatch.setattr(trainer, "make_engine", engine_that_reports(lambda logp, mask: logp - 0.3 * mask))
    calls = record_loss_calls(monkeypatch)
    sampler_logps = []
    roll_out = rollouts.roll_out

    def remembering(*args):
        rollout = roll_out(*args)
        sampler_logps.append(rollout.sampler_logp)
        return rollout

    monkeypatch.setattr(rollouts, "roll_out", remembering)
    result = quiet_run(small_config(tmp_path, steps=2, beta=0.0, old_logprobs="sampler"))
    for call, sampler_logp in zip(calls, sampler_logps, strict=True):
        assert torch.equal(call["old_logp"], sampler_logp)
        assert call["ratio"][call["mask"]].mean().item() == pytest.approx(math.exp(0.3), abs=1e-4)
    for metrics in result.history:
        assert metrics["clip_ratio/high"] > 0 and metrics["ratio/mean"] == pytest.approx(math.exp(0.3), abs=1e-4)
        assert metrics["sampler_gap/mean_abs"] == pytest.approx(0.3, abs=1e-4)
        assert metrics["sampler_gap/max_ratio"] == pytest.approx(math.exp(0.3), abs=1e-3)

    calls.clear()
    result = quiet_run(small_config(tmp_path, steps=2, beta=0.0, output_dir=str(tmp_path / "recomputed")))
    assert all(torch.equal(c["ratio"][c["mask"]], torch.ones(int(c["mask"].sum()))) for c in calls)
    assert all(m["ratio/mean"] == 1.0 and m["clip_ratio/region"] == 0.0 for m in result.history)
    assert all(m["sampler_gap/mean_abs"] == pytest.approx(0.3, abs=1e-4) for m in result.history)


@pytest.mark.parametrize("engine", ["fused", "hf"])
@pytest.mark.parametrize("num_iterations, num_mini_batches, old_logprobs",
                         [(1, 1, "recomputed"), (2, 2, "recomputed"), (1, 2, "sampler")])
def test_sampler_gap_is_logged_every_step_and_near_zero(tmp_path, engine, num_iterations,
                                                        num_mini_batches, old_logprobs):
    """In float32 at the trainer's temperature, both engines' log-probs are the trainer's
    up to rounding, whichever log-probs the metric compares them with."""
    result = quiet_run(small_config(tmp_path, steps=3, engine=engine, num_iterations=num_iterations,
                                    num_mini_batches=num_mini_batches, old_logprobs=old_logprobs))
    assert len(result.history) == 3
    for metrics in result.history:
        assert 0 <= metrics["sampler_gap/mean_abs"] < 1e-4
        assert 1.0 <= metrics["sampler_gap/max_ratio"] < 1.0 + 1e-4


def test_sampler_gap_sees_a_sampler_at_another_temperature(tmp_path, monkeypatch):
    """A sampler at temperature 0.5 while the trainer assumes 1: the metric is the mean and
    max of |log pi_1 - log pi_0.5| over the sampled tokens, computed here independently for
    the first step (the initial policy)."""
    monkeypatch.setattr(trainer, "make_engine", engine_that_reports(temperature=0.5))
    sampled = []
    roll_out = rollouts.roll_out
    monkeypatch.setattr(rollouts, "roll_out", lambda *args: sampled.append(roll_out(*args)) or sampled[-1])
    result = quiet_run(small_config(tmp_path, steps=2))

    policy, _ = tiny()      # the policy of the first step, before its update
    first = sampled[0]
    ids = torch.cat([first.prompt_ids, first.completion_ids], 1)
    attention = torch.cat([first.prompt_mask, first.completion_mask.long()], 1)
    with torch.no_grad():
        at_one = completion_logprobs(policy, ids, attention, first.completion_mask, temperature=1.0)
    gap = (at_one - first.sampler_logp).abs()[first.completion_mask]
    assert gap.mean() > 0.05
    assert result.history[0]["sampler_gap/mean_abs"] == pytest.approx(gap.mean().item(), rel=1e-4)
    assert result.history[0]["sampler_gap/max_ratio"] == pytest.approx(math.exp(gap.max().item()), rel=1e-4)
    assert result.history[1]["sampler_gap/mean_abs"] > 0.05


# ----------------------------------------------------------------- the learning-rate schedule

def closed_form_learning_rate(peak, schedule, steps, warmup_steps, K, optimizer_step):
    """The LR of optimizer step j (0-based) of a run of `steps` rollouts, K optimizer steps each:
    linear warmup over the first warmup_steps x K, then the schedule over the rest."""
    total, warmup = steps * K, warmup_steps * K
    if optimizer_step < warmup:
        return peak * (optimizer_step + 1) / warmup
    progress = (optimizer_step - warmup) / (total - warmup)
    return peak * {"constant": 1.0, "linear": 1.0 - progress,
                   "cosine": (1.0 + math.cos(math.pi * progress)) / 2.0}[schedule]


@pytest.mark.parametrize("num_iterations, num_mini_batches, warmup_steps, lr_schedule", [
    (1, 1, 0, "cosine"), (2, 2, 0, "cosine"), (1, 4, 1, "linear"), (2, 1, 2, "cosine"), (3, 2, 1, "constant"),
])
def test_learning_rate_spans_the_run(tmp_path, monkeypatch, num_iterations, num_mini_batches, warmup_steps,
                                     lr_schedule):
    """steps counts rollouts; each gives K optimizer steps; the schedule covers all steps x K,
    and the logged learning_rate is the one of the step's first optimizer step."""
    used = []
    handle = register_optimizer_step_pre_hook(
        lambda optimizer, args, kwargs: used.append(optimizer.param_groups[0]["lr"]))
    try:
        steps, peak = 4, 1e-3
        config = small_config(tmp_path, steps=steps, num_iterations=num_iterations, learning_rate=peak,
                              num_mini_batches=num_mini_batches, warmup_steps=warmup_steps,
                              lr_schedule=lr_schedule, eval_every=100, checkpoint_every=0)
        result = quiet_run(config)
    finally:
        handle.remove()
    K = num_iterations * num_mini_batches
    expected = [closed_form_learning_rate(peak, lr_schedule, steps, warmup_steps, K, j) for j in range(steps * K)]
    assert used == pytest.approx(expected, rel=1e-12, abs=1e-15)
    logged = [m["learning_rate"] for m in result.history]
    assert logged == pytest.approx(expected[::K], rel=1e-12, abs=1e-15)
    assert [m["optimizer_steps"] for m in result.history] == [K] * steps
    assert used[-1] > 0   # still learning at the last optimizer step


# ----------------------------------------------------------------- mini-batches after filtering

def varying_groups(count, G):
    """A reward under which exactly the first `count` groups disagree (the rest all score 0)."""
    def reward(completions, **kwargs):
        values = [0.0] * len(completions)
        for group in range(count):
            values[group * G] = 1.0
        return values
    return {"varying": (reward, 1.0)}


def test_plan_mini_batches_splits_the_surviving_groups_evenly(tmp_path):
    config = small_config(tmp_path, prompts_per_step=8, num_generations=2, num_mini_batches=2,
                          filter_zero_std_groups=True)
    rewards = torch.tensor([[0.0, 1.0]] * 7 + [[1.0, 1.0]], dtype=torch.float64)   # 7 groups survive
    plan = scoring.plan_mini_batches(config, rewards)
    assert [groups.tolist() for groups in plan] == [[0, 2, 4, 6], [1, 3, 5]]          # 4 groups + 3, dealt
    config.optimisation.num_mini_batches = 4
    rewards[3:] = 1.0                                                                # 3 survive
    assert [groups.tolist() for groups in scoring.plan_mini_batches(config, rewards)] == [[0], [1], [2], []]
    # Dealt, every mini-batch holds groups of every rank (each rank owns a run of prompts).
    rewards[:] = torch.tensor([0.0, 1.0])
    plan = scoring.plan_mini_batches(config, rewards)
    for rank in range(2):
        assert all(((groups >= 4 * rank) & (groups < 4 * (rank + 1))).sum() == 1 for groups in plan)
    rewards[:] = 1.0
    assert [len(rows) for rows in scoring.plan_mini_batches(config, rewards)] == [0, 0, 0, 0]


@pytest.mark.parametrize("prompts_per_step, num_mini_batches, varying, optimizer_steps", [
    (8, 2, 7, 2),   # 4 + 3 groups: two optimizer steps, not three
    (4, 4, 2, 2),   # two empty mini-batches skip their steps
    (4, 2, 0, 0),   # nothing left: no update at all
])
def test_uneven_filtering_keeps_num_mini_batches_and_the_schedule(tmp_path, prompts_per_step, num_mini_batches,
                                                                  varying, optimizer_steps):
    G, steps, peak = 4, 3, 1e-3
    config = small_config(tmp_path, steps=steps, prompts_per_step=prompts_per_step, num_generations=G,
                          num_mini_batches=num_mini_batches, filter_zero_std_groups=True, learning_rate=peak,
                          eval_every=100, checkpoint_every=0)
    policy, tokenizer = tiny()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = trainer.train(config, policy=policy, tokenizer=tokenizer, log=lambda _: None,
                               reward_functions=varying_groups(varying, G))
    assert not [w for w in caught if "lr_scheduler" in str(w.message)]   # a skipped step is meant
    assert [m["optimizer_steps"] for m in result.history] == [optimizer_steps] * steps
    expected = [closed_form_learning_rate(peak, "cosine", steps, 0, num_mini_batches, t * num_mini_batches)
                for t in range(steps)]
    assert [m["learning_rate"] for m in result.history] == pytest.approx(expected, rel=1e-12)
    moved = not all(torch.equal(before[k], v) for k, v in policy.state_dict().items())
    assert moved == (optimizer_steps > 0)
    assert all(("skipped_update" in m) == (optimizer_steps == 0) for m in result.history)


# ----------------------------------------------------------------- dapo's normaliser

def test_dapo_normalises_each_step_by_rollout_tokens_over_mini_batches_as_trl(tmp_path):
    """TRL 1.16 (grpo_trainer.py, loss_type "dapo") divides a micro-batch's token-loss sum by
    num_items_in_batch x gradient_accumulation_steps / steps_per_generation, where
    num_items_in_batch counts the generation batch's tokens and steps_per_generation =
    gradient_accumulation_steps x (optimizer steps per generation). One optimizer step's loss
    is so its token sum / (rollout tokens / num_mini_batches), not / its own token count."""
    torch.manual_seed(0)
    policy, tokenizer = tiny()
    config = small_config(tmp_path, loss_type="dapo", num_mini_batches=2, micro_batch_size=4, beta=0.04)
    models = placement.build_models(config, World(), policy)
    samples = rollouts.sample_prompts(config.rollout.prompts_per_step, random.Random(0), tasks.make_dataset(n=50))
    rollout = rollouts.roll_out(config, samples, tokenizer, HFEngine(policy, tokenizer))
    # The first mini-batch (groups 0 and 2, dealt) ends early: 24 tokens against 48.
    rollout.completion_mask[:4, 3:] = False
    rollout.completion_mask[8:12, 3:] = False
    batch, plan = scoring.score(config, samples, rollout, tokenizer,
                                user_functions.reward_functions_from_config({"format": 1.0}),
                                lambda r: torch.randn(r.shape, generator=torch.Generator().manual_seed(1)))
    batch = update.add_logprobs(config, models, batch, plan)
    rollout_tokens = int(batch.completion_mask.sum())
    gradient_accumulation_steps = 2                                # 8 rows, micro-batches of 4
    steps_per_generation = gradient_accumulation_steps * config.optimisation.num_mini_batches
    trl_normaliser = rollout_tokens * gradient_accumulation_steps / steps_per_generation

    for k in range(config.optimisation.num_mini_batches):
        totals = plan.totals(k, config.loss.loss_type)
        assert totals.num_items == trl_normaliser
        flat = batch.select(plan.local_groups(k)).flat()
        mask = flat["completion_mask"]
        mini_tokens = int(mask.sum())
        assert abs(mini_tokens - trl_normaliser) >= 12   # the two choices differ on this rollout
        with torch.no_grad():
            logp = placement.sequence_logprobs(config, policy, flat["input_ids"], flat["attention_mask"], mask)
            token_losses = grpo_loss(logp, logp, flat["advantages"], mask, ref_logp=flat["ref_logp"], beta=0.04,
                                     loss_type="dapo", num_items=mini_tokens).per_token_loss
        expected = token_losses.sum().item() / trl_normaliser
        for micro_batch_size in (4, 8, 1):                      # gradient accumulation stays exact
            config.optimisation.micro_batch_size = micro_batch_size
            policy.zero_grad()
            total = 0.0
            for part in update.micro_batches(plan, batch, k, micro_batch_size, World()):
                loss, _, _ = update.micro_batch_loss(LossSettings.of(config), models.train_logprobs, part, totals)
                loss.backward()
                total += loss.item()
            assert total == pytest.approx(expected, rel=1e-5, abs=1e-8)
            assert total != pytest.approx(token_losses.sum().item() / mini_tokens, rel=1e-3)
