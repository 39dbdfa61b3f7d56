"""grpo_edu.algorithm.loss against the NumPy reference (float64, 1e-12), gradcheck, invariances,
aggregation weights, diagnostics by hand, and every bad input."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from grpo_edu.algorithm import reference
from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.algorithm.logprobs import token_logprobs
from grpo_edu.algorithm.aggregation import LOSS_TYPES, aggregate, aggregation_weights
from grpo_edu.algorithm.kl import KL_ESTIMATORS, kl_estimate
from grpo_edu.algorithm.loss import LossSettings, grpo_loss

F64 = torch.float64


def ragged_batch(seed, B, G, V, max_length, width=None):
    """Random ragged groups, as the reference takes them and padded to (B, G, S)."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, max_length + 1, size=(B, G))
    S = width or int(lengths.max())
    logits = torch.zeros(B, G, S, V, dtype=F64)
    token_ids = torch.zeros(B, G, S, dtype=torch.long)
    old_logp = torch.zeros(B, G, S, dtype=F64)
    ref_logp = torch.zeros(B, G, S, dtype=F64)
    mask = torch.zeros(B, G, S, dtype=torch.bool)
    groups = []
    for b in range(B):
        group = {"ids": [], "logits": [], "old": [], "ref": []}
        for g in range(G):
            T = int(lengths[b, g])
            z = rng.normal(scale=1.5, size=(T, V))
            ids = rng.integers(0, V, size=T)
            # old / ref: log-probs of nearby policies, so ratios straddle the clip range
            old = reference.log_softmax(z + rng.normal(scale=0.4, size=z.shape))[np.arange(T), ids]
            ref = reference.log_softmax(z + rng.normal(scale=0.4, size=z.shape))[np.arange(T), ids]
            for key, value in zip(group, (ids, z, old, ref)):
                group[key].append(value)
            logits[b, g, :T] = torch.from_numpy(z)
            token_ids[b, g, :T] = torch.from_numpy(ids)
            old_logp[b, g, :T] = torch.from_numpy(old)
            ref_logp[b, g, :T] = torch.from_numpy(ref)
            mask[b, g, :T] = True
        groups.append(group)
    rewards = rng.normal(size=(B, G))
    return dict(groups=groups, logits=logits, token_ids=token_ids, old_logp=old_logp,
                ref_logp=ref_logp, mask=mask, rewards=rewards, lengths=lengths)


def random_inputs(seed=0, B=2, G=3, S=5, dtype=F64):
    """A padded batch of plausible log-probs with random lengths, logp requiring grad."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, S + 1, (B, G), generator=gen)
    mask = torch.arange(S) < lengths[..., None]
    logp = -torch.rand(B, G, S, generator=gen, dtype=dtype) * 3
    old_logp = (logp + 0.3 * torch.randn(B, G, S, generator=gen, dtype=dtype)).clamp(max=0)
    ref_logp = (logp + 0.3 * torch.randn(B, G, S, generator=gen, dtype=dtype)).clamp(max=0)
    rewards = torch.randn(B, G, generator=gen, dtype=dtype)
    return dict(logp=logp.requires_grad_(), old_logp=old_logp, ref_logp=ref_logp,
                advantages=group_advantages(rewards), completion_mask=mask)


def call(inputs, **options):
    return grpo_loss(inputs["logp"], inputs["old_logp"], inputs["advantages"], inputs["completion_mask"],
                     ref_logp=inputs.get("ref_logp"), **options)


def loss_and_grad(inputs, **options):
    inputs["logp"].grad = None
    out = call(inputs, **options)
    (grad,) = torch.autograd.grad(out.loss, inputs["logp"])
    return out, grad


ALL_OPTIONS = [
    dict(loss_type=loss_type, beta=beta, importance_sampling_level=level, epsilon_high=eps_high,
         kl_estimator=kl, max_completion_length=8)
    for loss_type in LOSS_TYPES for beta in (0.0, 0.04) for level in ("token", "sequence")
    for eps_high, kl in ((None, "k3"), (0.28, "k1"), (0.1, "k2"))
]


# --------------------------------------------------------------------------- the reference

@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), B=st.integers(1, 3), G=st.integers(2, 4), V=st.integers(2, 6),
       max_length=st.integers(1, 5), beta=st.sampled_from([0.0, 0.04, 0.5]),
       epsilon=st.sampled_from([0.1, 0.2]), epsilon_high=st.sampled_from([None, 0.28]),
       std=st.sampled_from(["population", "sample"]))
def test_matches_reference_loss_and_logit_gradient(seed, B, G, V, max_length, beta, epsilon, epsilon_high,
                                                   std):
    """The whole torch path (token_logprobs -> grpo_loss -> backward) equals chapter 1's
    loop-based NumPy update, group by group, to 1e-12 in float64."""
    batch = ragged_batch(seed, B, G, V, max_length)
    logits = batch["logits"].clone().requires_grad_()
    logp = token_logprobs(logits, batch["token_ids"])
    advantages = group_advantages(torch.from_numpy(batch["rewards"]), std=std)
    out = grpo_loss(logp, batch["old_logp"], advantages, batch["mask"], ref_logp=batch["ref_logp"],
                    beta=beta, epsilon=epsilon, epsilon_high=epsilon_high)
    out.loss.backward()

    updates = [reference.grpo_update(g["ids"], g["logits"], g["old"], g["ref"], batch["rewards"][b],
                                     epsilon=epsilon, epsilon_high=epsilon_high, beta=beta, std=std)
               for b, g in enumerate(batch["groups"])]
    # The batch loss is the mean of B equal-sized groups' losses.
    assert out.loss.item() == pytest.approx(np.mean([u.loss for u in updates]), abs=1e-12)
    for b, update in enumerate(updates):
        for g, response in enumerate(update.responses):
            T = batch["lengths"][b, g]
            np.testing.assert_allclose(logits.grad[b, g, :T].numpy(), response.grad_logits / B,
                                       rtol=0, atol=1e-12)
            np.testing.assert_allclose(out.ratio[b, g, :T].numpy(), response.ratio, rtol=0, atol=1e-12)
    assert (logits.grad[~batch["mask"]] == 0).all()
    # Diagnostics agree with the reference's own intermediate values.
    responses = [r for u in updates for r in u.responses]
    kl = np.concatenate([r.kl for r in responses])
    clipped = np.concatenate([r.clipped for r in responses])
    assert out.metrics["kl"] == pytest.approx(kl.mean(), abs=1e-12)
    assert out.metrics["clip_ratio/region"] == pytest.approx(clipped.mean(), abs=1e-12)


@pytest.mark.parametrize("options", ALL_OPTIONS, ids=lambda o: "-".join(str(v) for v in o.values()))
def test_gradcheck(options):
    inputs = random_inputs(seed=1)
    torch.autograd.gradcheck(
        lambda logp: call({**inputs, "logp": logp}, **options).loss, (inputs["logp"],))


# --------------------------------------------------------------------------- aggregation

@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_aggregation_weights_are_the_gradient_of_aggregate(loss_type):
    inputs = random_inputs(seed=2, B=3, G=4, S=6)
    mask = inputs["completion_mask"].reshape(-1, 6)
    per_token = torch.randn(mask.shape, dtype=F64).masked_fill(~mask, 0).requires_grad_()
    options = dict(max_completion_length=9, num_items=100)
    (grad,) = torch.autograd.grad(aggregate(per_token, mask, loss_type, **options), per_token)
    torch.testing.assert_close(aggregation_weights(mask, loss_type, **options), grad, rtol=0, atol=1e-15)


def test_aggregation_weights_by_hand():
    mask = torch.tensor([[1, 0, 0, 0], [1, 1, 1, 1]], dtype=torch.bool)  # lengths 1 and 4
    w = {t: aggregation_weights(mask, t, max_completion_length=8)[:, 0].tolist() for t in LOSS_TYPES}
    assert w["grpo"] == pytest.approx([1 / 2, 1 / 8])      # 1 / (N |o_i|)
    assert w["bnpo"] == pytest.approx([1 / 5, 1 / 5])      # 1 / total tokens
    assert w["dr_grpo"] == pytest.approx([1 / 16, 1 / 16])  # 1 / (N L)
    assert w["dapo"] == pytest.approx([1 / 5, 1 / 5])      # 1 / num_items, by default this batch's tokens
    # The whole batch's counts, passed to a part of it: 10 tokens, 3 completions.
    w = {t: aggregation_weights(mask, t, max_completion_length=8, num_items=10, num_completions=3)[:, 0].tolist()
         for t in LOSS_TYPES}
    assert w["grpo"] == pytest.approx([1 / 3, 1 / 12])
    assert w["bnpo"] == w["dapo"] == pytest.approx([1 / 10, 1 / 10])
    assert w["dr_grpo"] == pytest.approx([1 / 24, 1 / 24])
    # Only grpo's per-response token mean makes every response weigh the same in total.
    assert aggregation_weights(mask, "grpo").sum(-1).tolist() == pytest.approx([0.5, 0.5])
    assert aggregation_weights(mask, "bnpo").sum(-1).tolist() == pytest.approx([0.2, 0.8])


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
@pytest.mark.parametrize("level", ["token", "sequence"])
def test_parts_given_the_whole_batch_counts_add_up_to_the_whole_loss(loss_type, level):
    """How micro-batches and processes split a batch: each part passes the whole batch's
    num_items and num_completions, and the parts' losses and gradients add up exactly. With
    each part's own counts (a per-part normaliser) they do not."""
    inputs = random_inputs(seed=5, B=4, G=3, S=6)
    options = dict(loss_type=loss_type, beta=0.04, max_completion_length=9, importance_sampling_level=level)
    whole, g_whole = loss_and_grad(inputs, **options)
    counts = dict(num_items=int(inputs["completion_mask"].sum()), num_completions=12)
    parts = [{k: v[b] if isinstance(v, torch.Tensor) else v for k, v in inputs.items()} for b in ([0], [1, 2, 3])]
    total, grads, local_total = 0.0, [], 0.0
    for part in parts:
        out, g = loss_and_grad(part, **options, **counts)
        total += out.loss.item()
        grads.append(g)
        local_total += loss_and_grad(part, **options)[0].loss.item()
    assert total == pytest.approx(whole.loss.item(), abs=1e-14)
    torch.testing.assert_close(torch.cat(grads), g_whole, rtol=0, atol=1e-15)
    assert local_total != pytest.approx(whole.loss.item(), abs=1e-6)


def test_dapo_with_local_count_is_bnpo_and_num_items_scales():
    inputs = random_inputs(seed=3)
    tokens = int(inputs["completion_mask"].sum())
    bnpo, g_bnpo = loss_and_grad(inputs, loss_type="bnpo", beta=0.04)
    dapo, g_dapo = loss_and_grad(inputs, loss_type="dapo", beta=0.04)
    assert dapo.loss.item() == pytest.approx(bnpo.loss.item(), abs=1e-14)
    torch.testing.assert_close(g_dapo, g_bnpo, rtol=0, atol=1e-15)
    global_count, g_global = loss_and_grad(inputs, loss_type="dapo", beta=0.04,
                                           num_items=torch.tensor(4.0 * tokens))
    assert global_count.loss.item() == pytest.approx(bnpo.loss.item() / 4, abs=1e-14)
    torch.testing.assert_close(g_global, g_bnpo / 4, rtol=0, atol=1e-15)


def test_dr_grpo_is_token_sum_over_responses_times_max_length():
    inputs = random_inputs(seed=4)
    out = call(inputs, loss_type="dr_grpo", max_completion_length=7)
    expected = out.per_token_loss.sum() / (6 * 7)
    assert out.loss.item() == pytest.approx(expected.item(), abs=1e-15)


# --------------------------------------------------------------------------- invariances

@pytest.mark.parametrize("options", ALL_OPTIONS[::3], ids=lambda o: "-".join(str(v) for v in o.values()))
def test_padding_contents_change_neither_loss_nor_gradient(options):
    inputs = random_inputs(seed=5)
    out, grad = loss_and_grad(inputs, **options)
    pad = ~inputs["completion_mask"]
    garbage = {key: inputs[key].detach().masked_fill(pad, value)
               for key, value in (("logp", math.nan), ("old_logp", math.inf), ("ref_logp", -math.inf))}
    noisy = {**inputs, **garbage}
    noisy["logp"].requires_grad_()
    out2, grad2 = loss_and_grad(noisy, **options)
    assert out2.loss.item() == out.loss.item()
    torch.testing.assert_close(grad2, grad, rtol=0, atol=0)
    assert (grad[pad] == 0).all()
    assert out2.metrics == out.metrics


@pytest.mark.parametrize("options", ALL_OPTIONS[::3], ids=lambda o: "-".join(str(v) for v in o.values()))
def test_extra_padding_columns_change_nothing(options):
    inputs = random_inputs(seed=6)
    out, grad = loss_and_grad(inputs, **options)
    wider = {key: torch.cat([value.detach(), torch.full((*value.shape[:-1], 3), -0.5, dtype=value.dtype)], -1)
             if key != "completion_mask" else
             torch.cat([value, torch.zeros(*value.shape[:-1], 3, dtype=torch.bool)], -1)
             for key, value in inputs.items() if key != "advantages"}
    wider["advantages"] = inputs["advantages"]
    wider["logp"].requires_grad_()
    out2, grad2 = loss_and_grad(wider, **options)
    assert out2.loss.item() == pytest.approx(out.loss.item(), abs=1e-15)
    torch.testing.assert_close(grad2[..., :-3], grad, rtol=0, atol=1e-15)
    assert (grad2[..., -3:] == 0).all()
    for key, value in out.metrics.items():
        assert out2.metrics[key] == pytest.approx(value, abs=1e-14), key


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), options=st.sampled_from(ALL_OPTIONS), data=st.data())
def test_property_permuting_responses_within_a_group_permutes_outputs(seed, options, data):
    inputs = random_inputs(seed=seed, B=2, G=4, S=5)
    order = data.draw(st.permutations(range(4)))
    out, grad = loss_and_grad(inputs, **options)
    permuted = {key: value.detach()[:, order] for key, value in inputs.items()}
    permuted["logp"].requires_grad_()
    out2, grad2 = loss_and_grad(permuted, **options)
    assert out2.loss.item() == pytest.approx(out.loss.item(), abs=1e-14)
    torch.testing.assert_close(out2.per_token_loss, out.per_token_loss[:, order], rtol=0, atol=1e-14)
    torch.testing.assert_close(grad2, grad[:, order], rtol=0, atol=1e-14)


@pytest.mark.parametrize("options", ALL_OPTIONS[::4], ids=lambda o: "-".join(str(v) for v in o.values()))
def test_grouped_and_flat_layouts_agree(options):
    inputs = random_inputs(seed=7)
    out, grad = loss_and_grad(inputs, **options)
    flat = {key: value.detach().reshape(-1, *value.shape[2:]) for key, value in inputs.items()}
    flat["logp"].requires_grad_()
    out2, grad2 = loss_and_grad(flat, **options)
    assert out2.loss.item() == out.loss.item()
    torch.testing.assert_close(grad2, grad.reshape(6, 5), rtol=0, atol=0)
    assert "zero_std_groups" in out.metrics and "zero_std_groups" not in out2.metrics


# --------------------------------------------------------------------------- behaviour by hand

def test_first_step_loss_is_zero_but_gradient_is_not():
    """On the first step logp == old_logp: every ratio is 1, so under grpo the loss is
    -mean_i A_i = 0 for each group, but d loss / d logp_t = -A_i / (N |o_i|) is not."""
    inputs = random_inputs(seed=8)
    inputs["old_logp"] = inputs["logp"].detach().clone()
    out, grad = loss_and_grad(inputs)
    assert abs(out.loss.item()) < 1e-15
    lengths = inputs["completion_mask"].sum(-1, keepdim=True)
    expected = -inputs["advantages"][..., None] / (6 * lengths) * inputs["completion_mask"]
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)
    assert out.metrics["clip_ratio/region"] == 0.0 and out.metrics["approx_kl"] == 0.0
    assert out.metrics["ratio/min"] == out.metrics["ratio/max"] == 1.0


def test_clipping_and_metrics_by_hand():
    # Four one-token responses; ratios 1.3, 1.3, 0.7, 0.7 against A = +1, -1, +1, -1.
    ratio = torch.tensor([[1.3], [1.3], [0.7], [0.7]], dtype=F64)
    old = torch.full_like(ratio, -2.0)
    logp = (old + ratio.log()).requires_grad_()
    A = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=F64)
    out = grpo_loss(logp, old, A, torch.ones_like(ratio, dtype=torch.bool))
    # objective = min(rho A, clip(rho) A): 1.2 (clipped), -1.3, 0.7, -0.8 (clipped)
    assert out.per_token_loss[:, 0].tolist() == pytest.approx([-1.2, 1.3, -0.7, 0.8])
    assert out.loss.item() == pytest.approx((-1.2 + 1.3 - 0.7 + 0.8) / 4)
    (grad,) = torch.autograd.grad(out.loss, logp)
    # d/d logp of -rho A / 4 = -rho A / 4 where unclipped, 0 where clipped
    assert grad[:, 0].tolist() == pytest.approx([0.0, 1.3 / 4, -0.7 / 4, 0.0])
    m = out.metrics
    assert (m["clip_ratio/high"], m["clip_ratio/low"], m["clip_ratio/region"]) == (0.25, 0.25, 0.5)
    assert (m["ratio/min"], m["ratio/max"]) == pytest.approx((0.7, 1.3))
    assert m["ratio/mean"] == pytest.approx(1.0)
    assert m["approx_kl"] == pytest.approx(np.mean([r - 1 - math.log(r) for r in (1.3, 1.3, 0.7, 0.7)]))
    assert m["advantage/std"] == pytest.approx(1.0)
    assert m["policy_loss"] == m["loss"] and "kl" not in m
    # clip-higher: with epsilon_high = 0.35 the first token is no longer clipped
    wide = grpo_loss(logp, old, A, torch.ones_like(ratio, dtype=torch.bool), epsilon_high=0.35)
    assert wide.per_token_loss[0, 0].item() == pytest.approx(-1.3)
    assert wide.metrics["clip_ratio/high"] == 0.0


def test_sequence_level_is_gspo():
    """GSPO: one ratio exp(mean_t log rho_t) per response, clipped as a whole."""
    inputs = random_inputs(seed=9)
    out = call(inputs, importance_sampling_level="sequence")
    mask = inputs["completion_mask"]
    log_ratio = ((inputs["logp"] - inputs["old_logp"]) * mask).sum(-1) / mask.sum(-1)
    s = torch.exp(log_ratio)
    A = inputs["advantages"]
    expected = -torch.minimum(s * A, s.clamp(0.8, 1.2) * A).mean()
    assert out.loss.item() == pytest.approx(expected.item(), abs=1e-14)
    assert out.ratio.shape == (2, 3, 1)
    torch.testing.assert_close(out.ratio[..., 0], s.detach(), rtol=0, atol=1e-15)
    # with one shared log-ratio per response, token and sequence level coincide
    shifted = dict(inputs, old_logp=(inputs["logp"].detach() - 0.1).masked_fill(~mask, 0))
    token, g_token = loss_and_grad(shifted)
    sequence, g_sequence = loss_and_grad(shifted, importance_sampling_level="sequence")
    assert token.loss.item() == pytest.approx(sequence.loss.item(), abs=1e-14)
    torch.testing.assert_close(g_token, g_sequence, rtol=0, atol=1e-14)


def test_kl_estimators_by_hand():
    logp = torch.tensor([-0.476, -1.0], dtype=F64)
    ref = torch.tensor([-0.600, -1.0], dtype=F64)
    d = -0.124
    assert kl_estimate(logp, ref, "k1").tolist() == pytest.approx([-d, 0.0])
    assert kl_estimate(logp, ref, "k2").tolist() == pytest.approx([d * d / 2, 0.0])
    assert kl_estimate(logp, ref, "k3").tolist() == pytest.approx([math.exp(d) - d - 1, 0.0])
    assert kl_estimate(logp, ref, "k3")[0].item() == pytest.approx(
        reference.k3([-0.600], [-0.476])[0], abs=1e-15)


@pytest.mark.parametrize("kl", KL_ESTIMATORS)
def test_kl_term_enters_with_beta(kl):
    inputs = random_inputs(seed=10)
    base = call(inputs, beta=0.0, kl_estimator=kl)
    with_kl = call(inputs, beta=0.5, kl_estimator=kl)
    mask = inputs["completion_mask"]
    per_token_kl = kl_estimate(inputs["logp"], inputs["ref_logp"], kl) * mask
    expected = base.loss + 0.5 * (per_token_kl.sum(-1) / mask.sum(-1)).mean()
    assert with_kl.loss.item() == pytest.approx(expected.item(), abs=1e-14)
    assert with_kl.metrics["kl"] == pytest.approx((per_token_kl.sum() / mask.sum()).item(), abs=1e-14)
    assert base.metrics["kl"] == with_kl.metrics["kl"]  # reported whenever ref_logp is given


def test_zero_std_groups_metric():
    inputs = random_inputs(seed=11, B=4, G=3)
    rewards = torch.tensor([[1.0, 0.0, 1.0], [0.3, 0.3, 0.3], [0.0, 0.0, 0.0], [2.0, 1.0, 0.0]], dtype=F64)
    inputs["advantages"] = group_advantages(rewards)
    assert call(inputs).metrics["zero_std_groups"] == 0.5
    # TRL's convention (sample std, + 1e-4) leaves tiny non-zeros; the groups still count.
    trl_style = (rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4)
    inputs["advantages"] = trl_style
    assert call(inputs).metrics["zero_std_groups"] == 0.5


def test_bfloat16_inputs_compute_in_float32():
    inputs = random_inputs(seed=12, dtype=torch.float32)
    out32 = call(inputs, beta=0.04)
    half = {key: value.detach().to(torch.bfloat16) if value.is_floating_point() else value
            for key, value in inputs.items()}
    half["logp"].requires_grad_()
    out16 = call(half, beta=0.04)
    assert out16.loss.dtype == torch.float32
    out16.loss.backward()
    assert half["logp"].grad.dtype == torch.bfloat16
    assert out16.loss.item() == pytest.approx(out32.loss.item(), abs=0.05)


# --------------------------------------------------------------------------- bad input

def bad(**changes):
    inputs = random_inputs(seed=13)
    inputs.update(changes)
    return inputs


BAD_CASES = [
    ("logp 1-d", dict(logp=torch.zeros(5)), {}, ValueError, r"logp must have shape \(B, G, S\) or \(N, S\)"),
    ("old_logp shape", dict(old_logp=torch.zeros(2, 3, 4, dtype=F64)), {}, ValueError,
     r"old_logp must have the shape of logp \(2, 3, 5\), got \(2, 3, 4\)"),
    ("mask shape", dict(completion_mask=torch.ones(6, 5, dtype=torch.bool)), {}, ValueError,
     r"completion_mask must have the shape of logp \(2, 3, 5\), got \(6, 5\)"),
    ("flat advantages for grouped logp", dict(advantages=torch.zeros(6, dtype=F64)), {}, ValueError,
     r"advantages must have shape \(B, G\) = \(2, 3\).*got \(6,\)"),
    ("G = 1", dict(logp=torch.zeros(2, 1, 5), old_logp=torch.zeros(2, 1, 5),
                   advantages=torch.zeros(2, 1), completion_mask=torch.ones(2, 1, 5), ref_logp=None),
     {}, ValueError, "G >= 2.*got G = 1"),
    ("integer logp", dict(logp=torch.zeros(2, 3, 5, dtype=torch.long)), {}, TypeError,
     "logp must be a floating-point tensor, got dtype torch.int64"),
    ("mask values", dict(completion_mask=torch.full((2, 3, 5), 2.0)), {}, ValueError,
     "completion_mask must be bool or hold only 0 and 1"),
    ("empty response", dict(completion_mask=torch.ones(2, 3, 5).index_fill(2, torch.arange(5), 0)
                            .index_put((torch.tensor([0]), torch.tensor([0]), torch.tensor([0])),
                                       torch.tensor(1.0))),
     {}, ValueError, r"at least one token.*position \(0, 1\)"),
    ("NaN logp on a real token", dict(logp=torch.zeros(2, 3, 5, dtype=F64).index_fill(2, torch.tensor([0]), math.nan)),
     {}, ValueError, r"logp must be finite on completion tokens, got nan at position \(0, 0, 0\)"),
    ("NaN advantage", dict(advantages=torch.tensor([[0.0, math.nan, 0.0], [0.0, 0.0, 0.0]], dtype=F64)),
     {}, ValueError, r"advantages must be finite, got nan at position \(0, 1\)"),
    ("probabilities for log-probs", dict(old_logp=torch.full((2, 3, 5), 0.5, dtype=F64)), {}, ValueError,
     "old_logp must hold log-probabilities.*0.5.*probabilities or logits"),
    ("old_logp with grad", dict(old_logp=torch.zeros(2, 3, 5, dtype=F64, requires_grad=True)), {}, ValueError,
     r"old_logp requires grad.*old_logp.detach\(\)"),
    ("beta without ref", dict(ref_logp=None), dict(beta=0.1), ValueError, "beta = 0.1 needs ref_logp"),
    ("dr_grpo without L", {}, dict(loss_type="dr_grpo"), ValueError,
     "loss_type='dr_grpo' needs max_completion_length"),
    ("dr_grpo with a short L", {}, dict(loss_type="dr_grpo", max_completion_length=2), ValueError,
     r"max_completion_length = 2 is shorter than the longest completion"),
    ("num_completions zero", {}, dict(loss_type="grpo", num_completions=0), ValueError,
     r"num_completions \(the whole batch's completion count\) must be a positive int, got 0"),
    ("num_items zero", {}, dict(loss_type="dapo", num_items=0), ValueError, "num_items.*must be > 0"),
    ("loss type", {}, dict(loss_type="ppo"), ValueError, "loss_type must be one of"),
    ("level", {}, dict(importance_sampling_level="group"), ValueError, "importance_sampling_level must be one of"),
    ("estimator", {}, dict(kl_estimator="k4"), ValueError, "kl_estimator must be one of"),
    ("epsilon", {}, dict(epsilon=1.5), ValueError, r"epsilon must be a number in \[0, 1\)"),
    ("epsilon_high", {}, dict(epsilon_high=-0.1), ValueError, "epsilon_high must be a number >= 0"),
    ("beta", {}, dict(beta=-1.0), ValueError, "beta must be a number >= 0"),
    ("list logp", dict(logp=[[0.0]]), {}, TypeError, "logp must be a torch.Tensor, got list"),
]


@pytest.mark.parametrize("name, changes, options, error, message", BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_input(name, changes, options, error, message):
    with pytest.raises(error, match=message):
        call(bad(**changes), **options)


# --------------------------------------------------------------------------- chapter 3 checkers

def test_chapter3_masked_loss_checker():
    from grpo_edu.exercises import ch03

    def correct(logp, old_logp, advantages, mask, epsilon):
        log_ratio = torch.where(mask, logp - old_logp, torch.zeros_like(logp))
        ratio = torch.exp(log_ratio)
        objective = torch.minimum(ratio * advantages[:, None],
                                  ratio.clamp(1 - epsilon, 1 + epsilon) * advantages[:, None])
        return -((objective * mask).sum(-1) / mask.sum(-1)).mean()

    def leaks(logp, old_logp, advantages, mask, epsilon):
        ratio = torch.exp(logp - old_logp)
        objective = torch.minimum(ratio * advantages[:, None],
                                  ratio.clamp(1 - epsilon, 1 + epsilon) * advantages[:, None])
        return -((objective * mask).sum(-1) / mask.sum(-1)).mean()

    def batch_mean(logp, old_logp, advantages, mask, epsilon):  # bnpo, not grpo
        ratio = torch.exp(torch.where(mask, logp - old_logp, torch.zeros_like(logp)))
        objective = torch.minimum(ratio * advantages[:, None],
                                  ratio.clamp(1 - epsilon, 1 + epsilon) * advantages[:, None])
        return -(objective * mask).sum() / mask.sum()

    assert ch03.check_masked_grpo_loss(correct)
    leaked = ch03.check_masked_grpo_loss(leaks)
    assert len(leaked.failures) == 2 and "NaN" in str(leaked)
    wrong = ch03.check_masked_grpo_loss(batch_mean)
    assert not wrong and wrong.passed < 6


def test_chapter3_first_step_gradient_checker():
    from grpo_edu.exercises import ch03

    def correct(advantages, mask):
        return -advantages[:, None] / (len(advantages) * mask.sum(-1, keepdim=True)) * mask

    assert ch03.check_first_step_gradient(correct)
    sign = ch03.check_first_step_gradient(lambda a, m: -correct(a, m))
    assert not sign and sign.passed == 1  # only the all-zero group survives a sign error
    no_length = ch03.check_first_step_gradient(lambda a, m: -a[:, None] / len(a) * m)
    assert not no_length


# --------------------------------------------------------------------------- chapter 4 checkers

def test_chapter4_token_weights_checker():
    from grpo_edu.exercises import ch04

    def correct(lengths, loss_type, max_completion_length):
        lengths = torch.as_tensor(lengths, dtype=F64)
        N = len(lengths)
        if loss_type == "grpo":
            return 1 / (N * lengths)
        if loss_type == "bnpo":
            return torch.full_like(lengths, 1 / lengths.sum().item())
        return torch.full_like(lengths, 1 / (N * max_completion_length))

    assert ch04.check_token_weights(correct)
    forgot_n = ch04.check_token_weights(
        lambda n, t, m: correct(n, t, m) * (len(n) if t == "dr_grpo" else 1))
    assert len(forgot_n.failures) == len(ch04.TOKEN_WEIGHT_CASES)
    assert all(f.startswith("dr_grpo") for f in forgot_n.failures)


def test_chapter4_informative_groups_checker():
    from grpo_edu.exercises import ch04

    assert ch04.check_informative_groups(lambda r: (r != r[:, :1]).any(dim=1))
    assert ch04.check_informative_groups(lambda r: r.std(dim=1) > 0)  # torch's std is exact here
    centred = ch04.check_informative_groups(lambda r: (r - r.mean(1, keepdim=True)).abs().amax(1) > 0)
    assert [f.split(":")[0] for f in centred.failures] == ["equal rewards whose r - mean rounds to 1e-16, not 0"]
    std_threshold = ch04.check_informative_groups(lambda r: r.std(dim=1) > 1e-3)
    assert len(std_threshold.failures) == 1 and "partial-credit" in std_threshold.failures[0]


def test_chapter4_sequence_ratio_checker():
    from grpo_edu.exercises import ch04

    def correct(logp, old_logp, mask):
        return torch.exp(((logp - old_logp) * mask).sum(-1) / mask.sum(-1))

    assert ch04.check_sequence_ratio(correct)
    token_mean_over_padding = ch04.check_sequence_ratio(lambda l, o, m: torch.exp((l - o).mean(-1)))
    assert not token_mean_over_padding
    assert token_mean_over_padding.passed == 2  # "no padding" and the first step (all log-ratios 0)
    product = ch04.check_sequence_ratio(lambda l, o, m: torch.exp(((l - o) * m).sum(-1)))
    assert not product  # the unnormalised sequence ratio is not GSPO's


# ----------------------------------------------------------------- the registries

def test_each_registry_is_what_the_settings_may_name():
    from grpo_edu.algorithm import aggregation, kl, offpolicy, surrogates
    assert LOSS_TYPES == tuple(aggregation.AGGREGATIONS) == ("grpo", "bnpo", "dr_grpo", "dapo")
    assert KL_ESTIMATORS == tuple(kl.KL_ESTIMATES) == ("k1", "k2", "k3")
    assert tuple(surrogates.RATIO_LEVELS) == ("token", "sequence")
    assert tuple(surrogates.SURROGATES) == ("clip", "capped")
    assert tuple(offpolicy.CORRECTIONS) == ("tis", "token_mask", "sequence_mask")
    assert LossSettings(surrogate="capped", ratio_cap=2.0).surrogate == "capped" and LossSettings().surrogate == "clip"
    for entry in surrogates.SURROGATES.values():   # whole: its loss, metrics and their reductions, check
        assert callable(entry.loss) and callable(entry.metrics) and callable(entry.check) and entry.reductions
    assert [LossSettings(tis_cap=2.0).correction.kind, LossSettings(is_mask="token").correction.kind,
            LossSettings(is_mask="sequence").correction.kind, LossSettings().correction.kind] == \
        ["tis", "token_mask", "sequence_mask", None]
    with pytest.raises(ValueError, match=r"loss_type must be one of \('grpo', 'bnpo', 'dr_grpo', 'dapo'\), got 'x'"):
        LossSettings(loss_type="x")


def test_a_new_loss_type_is_one_registered_function(monkeypatch):
    """Registering divisors is all a loss type takes: grpo_loss, aggregate and the weights use it."""
    from grpo_edu.algorithm import aggregation
    monkeypatch.setitem(aggregation.AGGREGATIONS, "sum", aggregation.Aggregation(lambda mask, counts: (None, 1.0)))
    torch.manual_seed(0)
    logp = -torch.rand(2, 3, 5, dtype=F64, requires_grad=True)
    mask = torch.ones(2, 3, 5, dtype=torch.bool)
    mask[0, 1, 3:] = False
    out = grpo_loss(logp, logp.detach(), torch.randn(2, 3, dtype=F64), mask, loss_type="sum")
    assert torch.equal(out.loss, (out.per_token_loss * mask).sum())
    assert torch.equal(out.token_weights, mask.to(F64))


def test_a_new_surrogate_is_one_registered_function(monkeypatch):
    """A surrogate without the clip (the plain ratio, -rho A) gives, at rho = 1, the clip's loss
    and gradient; off-policy, the gradient the clip would cut."""
    from grpo_edu.algorithm import surrogates
    monkeypatch.setitem(surrogates.SURROGATES, "plain", surrogates.Surrogate(
        lambda ratio, A, logp, settings: -ratio * A, metrics=lambda ratio, A, unit_mean, settings: {"plain": 1.0},
        reductions={"plain": "unit"}, check=lambda settings: None))
    torch.manual_seed(1)
    logp = -torch.rand(2, 4, 6, dtype=F64)
    advantages = torch.randn(2, 4, dtype=F64)
    mask = torch.ones(2, 4, 6, dtype=torch.bool)
    plain = logp.clone().requires_grad_(True)
    out = grpo_loss(plain, logp, advantages, mask, epsilon=0.01, surrogate="plain")
    out.loss.backward()
    assert out.metrics["plain"] == 1.0 and "clip_ratio/region" not in out.metrics
    monkeypatch.undo()
    clipped = logp.clone().requires_grad_(True)
    grpo_loss(clipped, logp, advantages, mask, epsilon=0.01).loss.backward()
    assert torch.allclose(plain.grad, clipped.grad, rtol=0, atol=1e-15)


def test_settings_or_options_not_both_and_no_unknown_option():
    logp = -torch.rand(1, 2, 3, dtype=F64)
    mask = torch.ones(1, 2, 3, dtype=torch.bool)
    args = (logp, logp, torch.tensor([[1.0, -1.0]], dtype=F64), mask)
    assert grpo_loss(*args, LossSettings(beta=0.0, loss_type="bnpo")).metrics == \
        grpo_loss(*args, beta=0.0, loss_type="bnpo").metrics
    with pytest.raises(ValueError, match=r"grpo_loss: pass settings or the options \['beta'\], not both"):
        grpo_loss(*args, LossSettings(), beta=0.1)
    with pytest.raises(TypeError, match=r"grpo_loss: unknown option 'loss_typ'"):
        grpo_loss(*args, loss_typ="bnpo")
