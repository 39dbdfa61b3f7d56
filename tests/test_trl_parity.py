"""grpo_loss equals TRL 1.16 GRPOTrainer's loss, and its gradient w.r.t. the policy's
log-probs, for the settings both have.

The comparison runs TRL's own code: a real GRPOTrainer (built from a tiny local
Llama, so its __init__ sets every attribute from the GRPOConfig as in training),
whose `_compute_loss` is called on fabricated inputs. The one thing replaced is the
model forward (`_get_per_token_logps_and_entropies`), so both sides get the same
log-probs and autograd can compare d loss / d logp directly.

Settings: one process, gradient_accumulation_steps = 1, no vLLM importance
correction (except in its own test), no entropy bonus, and use_bias_correction_kl=False (TRL 1.16
defaults it to True: the KL term is then multiplied by the ratio, which grpo_loss
does not do). Advantages are inputs here: TRL's own advantage convention (sample
std, + 1e-4) is a separate matter (tests/test_advantages.py).
"""

from __future__ import annotations

import warnings

import pytest
import torch

trl = pytest.importorskip("trl", reason="the TRL parity tests need the `trl` extra")
pytest.importorskip("datasets", reason="GRPOTrainer needs the `datasets` package")

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from grpo_edu.algorithm.loss import grpo_loss  # noqa: E402
from grpo_edu.policy.models import char_tokenizer, tiny_llama  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated:FutureWarning")

B, G, S, P = 2, 4, 7, 3
MAX_COMPLETION_LENGTH = 9

CONFIGS = [
    dict(loss_type="grpo", beta=0.0),
    dict(loss_type="grpo", beta=0.04),
    dict(loss_type="grpo", beta=0.04, epsilon_high=0.28),
    dict(loss_type="bnpo", beta=0.0),
    dict(loss_type="bnpo", beta=0.04, epsilon=0.1),
    dict(loss_type="dr_grpo", beta=0.0),
    dict(loss_type="dr_grpo", beta=0.04, epsilon_high=0.28),
    dict(loss_type="dapo", beta=0.0, epsilon_high=0.28),
    dict(loss_type="dapo", beta=0.04),
    dict(loss_type="grpo", beta=0.0, importance_sampling_level="sequence"),
    dict(loss_type="grpo", beta=0.04, importance_sampling_level="sequence", epsilon=3e-4, epsilon_high=4e-4),
    dict(loss_type="dapo", beta=0.04, importance_sampling_level="sequence"),
]


def config_id(config):
    return "-".join(f"{key}={value}" for key, value in config.items())


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory):
    tokenizer = char_tokenizer()
    directory = tmp_path_factory.mktemp("tiny-policy")
    tiny_llama(tokenizer, hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def trainers(policy_dir, tmp_path_factory):
    """One real GRPOTrainer per configuration, built lazily."""
    built = {}

    def get(config):
        key = config_id(config)
        if key not in built:
            args = GRPOConfig(
                output_dir=str(tmp_path_factory.mktemp("trl")), use_cpu=True, report_to=[],
                per_device_train_batch_size=B * G, num_generations=G, gradient_accumulation_steps=1,
                max_completion_length=MAX_COMPLETION_LENGTH, use_bias_correction_kl=False,
                logging_strategy="no", save_strategy="no", **config)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # TRL's advice on sequence-level dapo, deprecations
                trainer = GRPOTrainer(model=str(policy_dir), args=args,
                                      reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
                                      train_dataset=Dataset.from_dict({"prompt": ["1+1="] * B}))
            trainer.model.train()
            trainer.current_gradient_accumulation_steps = 1  # what Trainer's loop sets with accumulation 1
            built[key] = trainer
        return built[key]

    return get


def fabricated_batch(seed):
    """A flat (N, S) batch in float32, as TRL holds it, with plausible log-probs."""
    gen = torch.Generator().manual_seed(seed)
    N = B * G
    lengths = torch.randint(1, S + 1, (N,), generator=gen)
    lengths[0] = S  # at least one full-length completion
    completion_mask = (torch.arange(S) < lengths[:, None]).long()
    logp = -3 * torch.rand(N, S, generator=gen)
    old = (logp + 0.25 * torch.randn(N, S, generator=gen)).clamp(max=0)
    ref = (logp + 0.25 * torch.randn(N, S, generator=gen)).clamp(max=0)
    advantages = torch.randn(N, generator=gen)
    return logp, old, ref, advantages, completion_mask


def trl_loss(trainer, logp, old, ref, advantages, completion_mask, num_items, importance_sampling_ratio=None,
             entropies=None):
    """TRL's _compute_loss on these inputs (with the vLLM correction's ratio, and the model's
    entropies, when given); returns the loss and its metrics."""
    N = logp.shape[0]
    entropies = torch.zeros_like(logp) if entropies is None else entropies
    trainer._get_per_token_logps_and_entropies = lambda *args, **kwargs: (logp, entropies, None)
    inputs = {
        "prompt_ids": torch.ones(N, P, dtype=torch.long), "prompt_mask": torch.ones(N, P, dtype=torch.long),
        "completion_ids": torch.ones(N, S, dtype=torch.long), "completion_mask": completion_mask,
        "advantages": advantages, "old_per_token_logps": old, "ref_per_token_logps": ref,
        "num_items_in_batch": torch.tensor(float(num_items)),
    }
    if importance_sampling_ratio is not None:
        inputs["importance_sampling_ratio"] = importance_sampling_ratio
    trainer._metrics["train"].clear()
    loss = trainer._compute_loss(trainer.model, inputs)
    metrics = {key: values[-1] for key, values in trainer._metrics["train"].items()}
    return loss, metrics


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("config", CONFIGS, ids=config_id)
def test_loss_and_gradient_match_trl(trainers, config, seed):
    trainer = trainers(config)
    logp, old, ref, advantages, completion_mask = fabricated_batch(seed)
    # dapo's num_items counts the whole generation batch; make it differ from the local count.
    num_items = int(completion_mask.sum()) + (5 if config["loss_type"] == "dapo" else 0)

    theirs_logp = logp.clone().requires_grad_()
    theirs, their_metrics = trl_loss(trainer, theirs_logp, old, ref, advantages, completion_mask, num_items)
    (their_grad,) = torch.autograd.grad(theirs, theirs_logp)

    ours_logp = logp.clone().requires_grad_()
    ours = grpo_loss(ours_logp.view(B, G, S), old.view(B, G, S), advantages.view(B, G),
                     completion_mask.view(B, G, S), ref_logp=ref.view(B, G, S),
                     max_completion_length=MAX_COMPLETION_LENGTH, num_items=num_items, **config)
    (our_grad,) = torch.autograd.grad(ours.loss, ours_logp)

    assert abs(ours.loss.item() - theirs.item()) <= 1e-6, (ours.loss.item(), theirs.item())
    torch.testing.assert_close(our_grad, their_grad, rtol=0, atol=1e-6)
    assert their_grad.abs().max() > 1e-3  # the comparison is not between two zeros
    for ours_name, their_name in (("clip_ratio/low", "clip_ratio/low_mean"),
                                  ("clip_ratio/high", "clip_ratio/high_mean"),
                                  ("clip_ratio/region", "clip_ratio/region_mean")):
        assert ours.metrics[ours_name] == pytest.approx(their_metrics[their_name], abs=1e-6), ours_name
    if config["beta"] != 0.0:
        assert ours.metrics["kl"] == pytest.approx(their_metrics["kl"], abs=1e-6)


def test_some_tokens_clip_so_parity_covers_both_branches(trainers):
    """The fabricated ratios straddle [0.8, 1.2], so the min and the clamp both matter."""
    _, metrics = trl_loss(trainers(CONFIGS[0]), *fabricated_batch(0)[:4], fabricated_batch(0)[4], num_items=1)
    assert 0.05 < metrics["clip_ratio/region_mean"] < 0.95


def test_bias_corrected_kl_differs(trainers):
    """TRL's default use_bias_correction_kl=True weights the KL by the ratio: a different
    loss, which is why parity is stated for False."""
    logp, old, ref, advantages, completion_mask = fabricated_batch(3)
    trainer = trainers(dict(loss_type="grpo", beta=1.0))
    trainer.args.use_bias_correction_kl = True
    try:
        theirs, _ = trl_loss(trainer, logp, old, ref, advantages, completion_mask, num_items=1)
    finally:
        trainer.args.use_bias_correction_kl = False
    ours = grpo_loss(logp, old, advantages, completion_mask, ref_logp=ref, beta=1.0)
    assert abs(ours.loss.item() - theirs.item()) > 1e-4


# --------------------------------------------------------------------------- the corrections

def trl_is_ratio(old, sampler, completion_mask, mode, clip_min, clip_max):
    """TRL 1.16's importance_sampling_ratio (GRPOTrainer._generate_and_score_completions, the
    token modes): exp(old - sampler) on real tokens, clamped to [clip_min, clip_max]
    ('token_truncate') or set to 0 outside it ('token_mask')."""
    ratio = torch.exp((old - sampler) * completion_mask)
    if mode == "token_truncate":
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    low = clip_min if clip_min is not None else -float("inf")
    return ratio.masked_fill((ratio < low) | (ratio > clip_max), 0.0)


CORRECTIONS = [
    dict(loss_type="grpo", beta=0.04, mode="token_truncate", ours=dict(tis_cap=1.2)),
    dict(loss_type="dapo", beta=0.0, mode="token_truncate", ours=dict(tis_cap=1.5)),
    dict(loss_type="grpo", beta=0.04, mode="token_mask", ours=dict(is_mask="token", is_mask_band=(0.8, 1.25))),
    dict(loss_type="bnpo", beta=0.0, mode="token_mask", ours=dict(is_mask="token", is_mask_band=(0.5, 1.1))),
]


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("case", CORRECTIONS, ids=lambda c: f"{c['loss_type']}-{c['mode']}")
def test_the_samplers_corrections_match_trl(trainers, case, seed):
    """tis_cap and is_mask = 'token' against TRL's vllm_importance_sampling_mode 'token_truncate'
    and 'token_mask': TRL's _compute_loss with its vLLM correction switched on (use_vllm set on
    the built trainer: the loss reads nothing else of vLLM)."""
    config = {k: case[k] for k in ("loss_type", "beta")}
    trainer = trainers(config)
    logp, old, ref, advantages, completion_mask = fabricated_batch(seed)
    sampler = (old + 0.3 * torch.randn(old.shape, generator=torch.Generator().manual_seed(seed + 50))).clamp(max=0)
    clip_min, clip_max = (None, case["ours"]["tis_cap"]) if "tis_cap" in case["ours"] else case["ours"]["is_mask_band"]
    num_items = int(completion_mask.sum())
    is_ratio = trl_is_ratio(old, sampler, completion_mask, case["mode"], clip_min, clip_max)
    trainer.use_vllm = trainer.vllm_importance_sampling_correction = True
    try:
        theirs_logp = logp.clone().requires_grad_()
        theirs, _ = trl_loss(trainer, theirs_logp, old, ref, advantages, completion_mask, num_items, is_ratio)
    finally:
        trainer.use_vllm = trainer.vllm_importance_sampling_correction = False
    (their_grad,) = torch.autograd.grad(theirs, theirs_logp)
    ours_logp = logp.clone().requires_grad_()
    ours = grpo_loss(ours_logp, old, advantages, completion_mask, ref_logp=ref, num_items=num_items,
                     max_completion_length=MAX_COMPLETION_LENGTH, sampler_logp=sampler, **config, **case["ours"])
    (our_grad,) = torch.autograd.grad(ours.loss, ours_logp)
    assert abs(ours.loss.item() - theirs.item()) <= 1e-6, (ours.loss.item(), theirs.item())
    torch.testing.assert_close(our_grad, their_grad, rtol=0, atol=1e-6)
    corrected = (is_ratio != 1.0) & completion_mask.bool()
    assert corrected.any() and their_grad.abs().max() > 1e-3   # the correction acts, the gradient is not 0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_capped_surrogate_matches_trls_cispo(trainers, seed):
    """surrogate = 'capped', ratio_cap = c with loss_type 'dapo' is TRL's loss_type 'cispo' with epsilon_high = c."""
    cap = 1.1
    trainer = trainers(dict(loss_type="cispo", beta=0.04, epsilon_high=cap))
    logp, old, ref, advantages, completion_mask = fabricated_batch(seed)
    num_items = int(completion_mask.sum()) + 3
    theirs_logp = logp.clone().requires_grad_()
    theirs, _ = trl_loss(trainer, theirs_logp, old, ref, advantages, completion_mask, num_items)
    (their_grad,) = torch.autograd.grad(theirs, theirs_logp)
    ours_logp = logp.clone().requires_grad_()
    ours = grpo_loss(ours_logp, old, advantages, completion_mask, ref_logp=ref, beta=0.04, loss_type="dapo",
                     num_items=num_items, surrogate="capped", ratio_cap=cap)
    (our_grad,) = torch.autograd.grad(ours.loss, ours_logp)
    assert abs(ours.loss.item() - theirs.item()) <= 1e-6, (ours.loss.item(), theirs.item())
    torch.testing.assert_close(our_grad, their_grad, rtol=0, atol=1e-6)
    assert 0 < ours.metrics["ratio/capped"] < 1


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("config", [dict(loss_type="grpo", beta=0.04, top_entropy_quantile=0.2),
                                    dict(loss_type="dapo", beta=0.0, top_entropy_quantile=0.5),
                                    dict(loss_type="bnpo", beta=0.04, top_entropy_quantile=0.5,
                                         importance_sampling_level="sequence")], ids=config_id)
def test_entropy_masking_matches_trls_top_entropy_quantile(trainers, config, seed):
    """The threshold over the batch's real tokens (grpo_edu.algorithm.entropy_mask), the policy term of the
    tokens below it zeroed, their KL and normaliser kept: TRL's loss and gradient to 1e-6."""
    from grpo_edu.algorithm import entropy_mask
    trainer = trainers(config)
    logp, old, ref, advantages, completion_mask = fabricated_batch(seed)
    entropies = 2 * torch.rand(logp.shape, generator=torch.Generator().manual_seed(10 + seed))
    num_items = int(completion_mask.sum())
    theirs_logp = logp.clone().requires_grad_()
    theirs, _ = trl_loss(trainer, theirs_logp, old, ref, advantages, completion_mask, num_items, entropies=entropies)
    (their_grad,) = torch.autograd.grad(theirs, theirs_logp)

    q = config["top_entropy_quantile"]
    tau = entropy_mask.threshold([entropies], [completion_mask], q)
    keep = entropy_mask.high_entropy_mask(entropies, completion_mask, tau)
    ours_logp = logp.clone().requires_grad_()
    options = {key: value for key, value in config.items() if key != "top_entropy_quantile"}
    ours = grpo_loss(ours_logp.view(B, G, S), old.view(B, G, S), advantages.view(B, G), completion_mask.view(B, G, S),
                     ref_logp=ref.view(B, G, S), max_completion_length=MAX_COMPLETION_LENGTH, num_items=num_items,
                     entropy_mask=keep.view(B, G, S), **options)
    (our_grad,) = torch.autograd.grad(ours.loss, ours_logp)
    assert abs(ours.loss.item() - theirs.item()) <= 1e-6, (ours.loss.item(), theirs.item())
    torch.testing.assert_close(our_grad, their_grad, rtol=0, atol=1e-6)
    real = int(completion_mask.sum())
    assert 0 < int(keep.sum()) < real   # some tokens masked, some kept
    unmasked = grpo_loss(logp.view(B, G, S), old.view(B, G, S), advantages.view(B, G), completion_mask.view(B, G, S),
                         ref_logp=ref.view(B, G, S), max_completion_length=MAX_COMPLETION_LENGTH,
                         num_items=num_items, **options)
    assert abs(unmasked.loss.item() - theirs.item()) > 1e-4   # the mask mattered


@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("config", [dict(loss_type="grpo", beta=0.04), dict(loss_type="bnpo", beta=0.04),
                                    dict(loss_type="dr_grpo", beta=0.0), dict(loss_type="dapo", beta=0.04)],
                         ids=config_id)
def test_overlong_filtering_matches_trls_mask_truncated_completions(trainers, config, seed):
    """TRL zeroes a truncated completion's mask (and num_items counts what is left); grpo_loss's
    `excluded` leaves the same completions out: the same loss and gradient to 1e-6."""
    trainer = trainers(config)
    logp, old, ref, advantages, completion_mask = fabricated_batch(seed)
    truncated = torch.zeros(B * G, dtype=torch.bool)
    truncated[[0, 3, 6]] = True
    trl_mask = completion_mask * (~truncated)[:, None].long()
    num_items = int(trl_mask.sum())
    theirs_logp = logp.clone().requires_grad_()
    theirs, _ = trl_loss(trainer, theirs_logp, old, ref, advantages, trl_mask, num_items)
    (their_grad,) = torch.autograd.grad(theirs, theirs_logp)
    ours_logp = logp.clone().requires_grad_()
    ours = grpo_loss(ours_logp.view(B, G, S), old.view(B, G, S), advantages.view(B, G), completion_mask.view(B, G, S),
                     ref_logp=ref.view(B, G, S), max_completion_length=MAX_COMPLETION_LENGTH, num_items=num_items,
                     excluded=truncated.view(B, G), **config)
    (our_grad,) = torch.autograd.grad(ours.loss, ours_logp)
    assert abs(ours.loss.item() - theirs.item()) <= 1e-6, (ours.loss.item(), theirs.item())
    torch.testing.assert_close(our_grad, their_grad, rtol=0, atol=1e-6)
    assert (our_grad[truncated] == 0).all() and their_grad.abs().max() > 1e-3


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("config", [c for c in CONFIGS if c.get("importance_sampling_level") != "sequence"]
                         + [dict(loss_type="cispo", beta=0.04, epsilon_high=1.1)], ids=config_id)
def test_per_token_advantages_match_trls(trainers, config, seed):
    """Process supervision's advantages, one per token ((B, G, S); grpo_edu.environment.process), against TRL 1.16's
    loss given (B, T) advantages (what its _compute_loss takes from a subclass), with a group's real
    process advantages: steps of different counts ending at different tokens, the outcome at the last."""
    from grpo_edu.algorithm.advantages import process_advantages

    trainer = trainers(config)
    logp, old, ref, _, completion_mask = fabricated_batch(seed)
    gen = torch.Generator().manual_seed(100 + seed)
    lengths = completion_mask.sum(-1)
    ends = torch.minimum(torch.randint(0, S, (B * G, 3), generator=gen), (lengths - 1)[:, None])
    ends[:, -1] = lengths - 1
    steps = torch.rand(B * G, 3, generator=gen) < 0.7
    steps[:, -1] = True
    rewards = torch.randint(0, 2, (B * G, 3), generator=gen).float()
    advantages = process_advantages(rewards.view(B, G, 3), ends.view(B, G, 3), steps.view(B, G, 3), S)
    assert (advantages[..., 0] != advantages[..., -1]).any()   # they do differ along a completion
    num_items = int(completion_mask.sum()) + (5 if config["loss_type"] in ("dapo", "cispo") else 0)
    cap = ({"surrogate": "capped", "ratio_cap": config["epsilon_high"], "loss_type": "dapo"}
           if config["loss_type"] == "cispo" else {})
    ours_config = {**config, **cap}
    if cap:
        ours_config.pop("epsilon_high")

    theirs_logp = logp.clone().requires_grad_()
    theirs, _ = trl_loss(trainer, theirs_logp, old, ref, advantages.view(B * G, S), completion_mask, num_items)
    (their_grad,) = torch.autograd.grad(theirs, theirs_logp)
    ours_logp = logp.clone().requires_grad_()
    ours = grpo_loss(ours_logp.view(B, G, S), old.view(B, G, S), advantages, completion_mask.view(B, G, S),
                     ref_logp=ref.view(B, G, S), max_completion_length=MAX_COMPLETION_LENGTH, num_items=num_items,
                     **ours_config)
    (our_grad,) = torch.autograd.grad(ours.loss, ours_logp)
    assert abs(ours.loss.item() - theirs.item()) <= 1e-6, (ours.loss.item(), theirs.item())
    torch.testing.assert_close(our_grad, their_grad, rtol=0, atol=1e-6)
    assert their_grad.abs().max() > 1e-3
