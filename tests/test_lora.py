"""LoRA (grpo_edu.policy.lora; config keys lora_rank, lora_alpha, lora_target_modules).

The adapters' maths by hand; at initialisation the LoRA policy is the base model bit for bit; with
the adapters off it is the base model again, which is the reference (no copy); the fused forward's
merged weights against peft's layers; the trainer trains the adapters only; checkpoints hold the
adapters and resume bitwise; the trained model and what vLLM loads are merged; refusals; the
results file. DDP and FSDP2: tests/test_distributed.py (bnpo's runs train adapters) and
tests/test_vllm_engine.py (FSDP2 with the vLLM stand-in); vLLM's CPU build:
tests/real_vllm/test_real_vllm_training.py.
"""

import json
import math
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import grid_checks
from grpo_edu.commands import trl_bridge
from grpo_edu.policy import lora
from grpo_edu.sampling import fused_llama, vllm_engine
from grpo_edu.training import checkpoint, trainer
from grpo_edu.config import TrainConfig
from grpo_edu.runtime.distributed import World
from grpo_edu.lab.faults import Faults
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.policy.models import load_policy
from grpo_edu.training.placement import build_models, make_reference
from grpo_edu.training.trained import load_trained
from test_trainer import count_digits, small_config, tiny

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def with_adapters(rank=4, alpha=8.0, targets=TARGETS, seed=0, dtype=torch.float32, moved=True):
    """The tiny test model with adapters; `moved`: B drawn at random (at initialisation B = 0
    and the adapters change nothing)."""
    policy, tokenizer = tiny()
    policy = policy.to(dtype)
    base = make_reference(policy)
    config = TrainConfig(lora_rank=rank, lora_alpha=alpha, lora_target_modules=list(targets), seed=seed)
    lora.add_adapters(policy, config)
    policy.to(dtype)
    if moved:
        with torch.no_grad(), torch.random.fork_rng():
            torch.manual_seed(seed + 1)
            for layer in lora.adapter_layers(policy).values():
                layer.lora_B["default"].weight.normal_(0.0, 0.05)
    return policy, base, tokenizer


def batch(tokenizer, n=6, P=5, S=7, seed=0):
    generator = torch.Generator().manual_seed(seed)
    input_ids = torch.randint(6, len(tokenizer), (n, P + S), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :2] = 0                    # left padding of one prompt
    completion_mask = torch.ones(n, S, dtype=torch.long)
    completion_mask[1, 4:] = 0                   # a completion that ended early
    return input_ids, attention_mask, completion_mask


# ----------------------------------------------------------------- the adapters

def test_an_adapter_adds_alpha_over_r_times_b_a_to_its_layer():
    policy, base, _ = with_adapters(rank=4, alpha=8.0)
    layer = policy.model.layers[0].mlp.down_proj
    A, B = layer.lora_A["default"].weight, layer.lora_B["default"].weight
    assert A.shape == (4, 64) and B.shape == (32, 4) and layer.scaling["default"] == 2.0
    x = torch.randn(3, 64)
    by_hand = x @ base.model.layers[0].mlp.down_proj.weight.T + 2.0 * (x @ A.T) @ B.T
    torch.testing.assert_close(layer(x), by_hand, rtol=0, atol=1e-6)
    torch.testing.assert_close(lora.effective_weight(layer), base.model.layers[0].mlp.down_proj.weight + 2.0 * B @ A,
                               rtol=0, atol=1e-7)


def test_lora_rank_sets_the_trained_parameters_and_only_they_train():
    for rank in (1, 4, 8):
        policy, _, _ = with_adapters(rank=rank)
        trained = {name: p.numel() for name, p in policy.named_parameters() if p.requires_grad}
        assert all(lora.is_adapter(name) for name in trained)
        # one layer: q, k, v, o are 32 -> 32, gate and up 32 -> 64, down 64 -> 32; r (in + out) each
        assert sum(trained.values()) == rank * (4 * 64 + 2 * 96 + 96)
        frozen = [p for name, p in policy.named_parameters() if not lora.is_adapter(name)]
        assert frozen and not any(p.requires_grad for p in frozen)


def test_lora_target_modules_chooses_the_layers():
    policy, _, _ = with_adapters(targets=["q_proj", "v_proj"])
    assert sorted(lora.adapter_layers(policy)) == sorted(
        f"model.layers.{i}.self_attn.{name}" for i in (0,) for name in ("q_proj", "v_proj"))
    assert not lora.is_lora_layer(policy.model.layers[0].mlp.gate_proj)


def test_at_initialisation_the_lora_policy_is_the_base_model_bitwise():
    """B = 0: every log-prob equal to the base model's to the bit, on both forwards."""
    policy, base, tokenizer = with_adapters(moved=False)
    ids, attention, completion = batch(tokenizer)
    assert torch.equal(completion_logprobs(policy, ids, attention, completion),
                       completion_logprobs(base, ids, attention, completion))
    assert torch.equal(fused_llama.completion_logprobs(policy, ids, attention, completion),
                       fused_llama.completion_logprobs(base, ids, attention, completion))


def test_with_the_adapters_off_it_is_the_base_model_again():
    policy, base, tokenizer = with_adapters()
    ids, attention, completion = batch(tokenizer)
    on = completion_logprobs(policy, ids, attention, completion)
    assert (on - completion_logprobs(base, ids, attention, completion)).abs().max() > 1e-3   # the adapters matter
    with lora.adapters_off(policy):
        assert torch.equal(completion_logprobs(policy, ids, attention, completion),
                           completion_logprobs(base, ids, attention, completion))
        assert torch.equal(fused_llama.completion_logprobs(policy, ids, attention, completion),
                           fused_llama.completion_logprobs(base, ids, attention, completion))
    assert torch.equal(completion_logprobs(policy, ids, attention, completion), on)   # and back on
    assert all(p.requires_grad == lora.is_adapter(n) for n, p in policy.named_parameters())   # untouched


def test_the_fused_forward_merges_the_adapters_as_peft_computes_them(monkeypatch):
    """float64: log-probs and the adapters' gradients equal to transformers' forward through
    peft's layers to 1e-10 (one merged weight per layer against x W^T + s (x A^T) B^T).
    transformers' RMSNorm computes in float32 whatever its input: here the same formula in
    float64, as tests/test_fused_llama.py does."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))
    monkeypatch.setattr(LlamaRMSNorm, "forward", forward)
    policy, _, tokenizer = with_adapters(dtype=torch.float64)
    ids, attention, completion = batch(tokenizer)
    gradients = []
    for forward in (completion_logprobs, fused_llama.completion_logprobs):
        policy.zero_grad()
        logp = forward(policy, ids, attention, completion)
        (logp * completion).sum().backward()
        gradients.append({n: p.grad.clone() for n, p in policy.named_parameters() if p.requires_grad})
        gradients[-1]["logp"] = logp.detach()
    assert gradients[0].keys() == gradients[1].keys() and len(gradients[0]) == 2 * 7 + 1
    for name in gradients[0]:
        torch.testing.assert_close(gradients[1][name], gradients[0][name], rtol=0, atol=1e-10, msg=name)


def test_the_reference_is_the_policy_with_its_adapters_off_and_no_copy():
    policy, base, tokenizer = with_adapters()
    config = small_config(Path("unused"), lora_rank=4, lora_alpha=8.0, beta=0.04)
    models = build_models(config, World(), policy)
    assert models.reference is None and isinstance(models.reference_logprobs, lora.ReferenceLogprobs)
    assert not list(models.reference_logprobs.parameters())   # it holds no weights of its own
    ids, attention, completion = batch(tokenizer)
    reference = models.reference_logprobs(ids, attention, completion)
    assert not reference.requires_grad
    assert torch.equal(reference, fused_llama.completion_logprobs(base, ids, attention, completion))
    assert not torch.equal(models.train_logprobs(ids, attention, completion).detach(), reference)
    with pytest.raises(ValueError, match="reference: the policy has LoRA adapters"):
        build_models(config, World(), policy, make_reference(base))


# ----------------------------------------------------------------- merged weights

def test_merged_weights_are_the_base_models_names_with_the_lora_policys_function():
    policy, base, tokenizer = with_adapters()
    merged = lora.merged_copy(policy)
    assert type(merged) is type(base) and not lora.has_adapters(merged) and lora.has_adapters(policy)
    assert [n for n, _ in merged.named_parameters()] == [n for n, _ in base.named_parameters()]
    streamed = dict(vllm_engine.named_weights(policy))   # what vLLM loads before every rollout
    assert list(streamed) == [n for n, _ in base.named_parameters()]
    for name, parameter in merged.named_parameters():
        assert torch.equal(streamed[name], parameter), name
    changed = [n for n, p in base.named_parameters() if not torch.equal(streamed[n], p)]
    assert len(changed) == 7   # each adapted layer's weight, nothing else
    ids, attention, completion = batch(tokenizer)
    torch.testing.assert_close(completion_logprobs(merged, ids, attention, completion),
                               completion_logprobs(policy, ids, attention, completion), rtol=0, atol=1e-5)


# ----------------------------------------------------------------- the trainer

def lora_run(tmp_path, name="run", stop=None, **overrides):
    policy, tokenizer = tiny()
    values = dict(lora_rank=4, lora_alpha=8.0, learning_rate=1e-2, output_dir=str(tmp_path / name))
    config = small_config(tmp_path, **{**values, **overrides})
    return trainer.train(config, policy=policy, tokenizer=tokenizer, log=lambda _: None,
                         reward_functions={"digits": (count_digits, 1.0)}, stop_after=stop)


def test_a_lora_run_trains_the_adapters_only_and_holds_no_reference(tmp_path):
    start = tiny()[0]
    result = lora_run(tmp_path)
    out = tmp_path / "run"
    # the checkpoint: the adapters only (the base is config.run.model), no reference file
    latest = (out / "checkpoints" / "latest").read_text().strip()
    saved = load_file(out / "checkpoints" / latest / "policy.safetensors")
    assert saved and all(lora.is_adapter(name) for name in saved) and len(saved) == 2 * 7
    assert not (out / "checkpoints" / latest / "reference.safetensors").exists()
    # model/: the merged plain model, loadable without peft's layers; its base weights moved only
    # where adapters are
    merged, _ = load_policy(out / "model")
    assert not lora.has_adapters(merged)
    moved = {n for n, p in merged.named_parameters() if not torch.equal(p, dict(start.named_parameters())[n])}
    assert moved == {f"model.layers.0.{part}.weight" for part in (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
        "mlp.up_proj", "mlp.down_proj")}
    # the KL is to the base model: 0 at the first step (the adapters start at B = 0), then > 0
    kl = [m["kl"] for m in result.history]
    assert kl[0] == 0.0 and kl[-1] > 0
    # memory: float32 weights of all, gradients and AdamW's two moments of the adapters only
    adapters = sum(p.numel() for n, p in result.policy.named_parameters() if lora.is_adapter(n))
    memory = result.summary["memory_bytes_per_rank"][0]
    assert memory["gradients"] == 4 * adapters and memory["optimizer"] == 8 * adapters


def test_lora_alpha_scales_what_the_adapters_learn(tmp_path):
    weights = {}
    for alpha in (4.0, 16.0):
        result = lora_run(tmp_path, f"alpha{alpha}", lora_alpha=alpha, steps=2, checkpoint_every=0)
        weights[alpha] = {n: p.detach().clone() for n, p in result.policy.named_parameters() if lora.is_adapter(n)}
        layer = result.policy.model.layers[0].self_attn.q_proj
        assert layer.scaling["default"] == alpha / 4
    assert weights[4.0].keys() == weights[16.0].keys()
    assert max(float((weights[4.0][n] - weights[16.0][n]).abs().max()) for n in weights[4.0]) > 1e-4


def test_lora_target_modules_decides_which_weights_train(tmp_path):
    start = dict(tiny()[0].named_parameters())
    result = lora_run(tmp_path, lora_target_modules=["q_proj", "v_proj"], steps=2, checkpoint_every=0)
    merged = lora.merged_copy(result.policy)
    moved = {n for n, p in merged.named_parameters() if not torch.equal(p, start[n])}
    assert moved == {"model.layers.0.self_attn.q_proj.weight", "model.layers.0.self_attn.v_proj.weight"}


def test_sampling_in_the_background_trains_the_lora_run_sampled_in_turn(tmp_path):
    """rollout_overlap: the sampler's copy carries the adapters and is synced from them."""
    runs = [lora_run(tmp_path, f"overlap{o}", rollout_lag=1, rollout_overlap=o, checkpoint_every=0)
            for o in (False, True)]
    assert [m["loss"] for m in runs[0].history] == [m["loss"] for m in runs[1].history]
    for (name, a), (_, b) in zip(runs[0].policy.named_parameters(), runs[1].policy.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_a_lora_run_resumes_bitwise(tmp_path):
    straight = lora_run(tmp_path, "straight")
    lora_run(tmp_path, "stopped", stop=2)
    policy, tokenizer = tiny()
    config = small_config(tmp_path, lora_rank=4, lora_alpha=8.0, learning_rate=1e-2,
                          output_dir=str(tmp_path / "stopped"))
    resumed = trainer.train(config, policy=policy, tokenizer=tokenizer, log=lambda _: None,
                            reward_functions={"digits": (count_digits, 1.0)}, resume=tmp_path / "stopped")
    for (name, a), (_, b) in zip(straight.policy.named_parameters(), resumed.policy.named_parameters(), strict=True):
        assert torch.equal(a, b), name
    assert [m["loss"] for m in straight.history] == [m["loss"] for m in resumed.history]


def test_a_lora_checkpoint_is_refused_by_a_full_fine_tuning_run_and_read_by_load_trained(tmp_path):
    lora_run(tmp_path, "stopped", stop=2)
    policy, tokenizer = tiny()
    config = small_config(tmp_path, learning_rate=1e-2, output_dir=str(tmp_path / "stopped"))
    with pytest.raises(checkpoint.CheckpointError, match="expected the weights of this run's model"):
        trainer.train(config, policy=policy, tokenizer=tokenizer, log=lambda _: None, resume=tmp_path / "stopped")
    policy, base, _ = with_adapters(rank=2, moved=False)
    with pytest.raises(checkpoint.CheckpointError, match="expected the LoRA adapters of this run's model"):
        checkpoint.load_weights(tmp_path / "stopped", policy, None)


def test_load_trained_merges_a_checkpoints_adapters(tmp_path, monkeypatch):
    """grpo-edu eval / sample on an unfinished LoRA run: the base from config.run.model, the
    checkpoint's adapters, merged."""
    run = tmp_path / "run"
    run.mkdir()
    config = TrainConfig(lora_rank=4, lora_alpha=8.0, prompts_per_step=4, num_generations=4, steps=3, eval_size=8,
                         progress=False, threads=1, output_dir=str(run), checkpoint_every=2, learning_rate=1e-2)
    result = trainer.train(config, log=lambda _: None, stop_after=2)
    trained = load_trained(run)
    assert not lora.has_adapters(trained.model) and "checkpoint step-000002" in trained.source
    merged = lora.merged_copy(result.policy)
    for (name, a), (_, b) in zip(merged.named_parameters(), trained.model.named_parameters(), strict=True):
        assert torch.equal(a, b), name


# ----------------------------------------------------------------- refusals

@pytest.mark.parametrize("overrides, message", [
    (dict(lora_rank=-1), "config key 'lora_rank' must be >= 0"),
    (dict(lora_rank=4, lora_alpha=0.0), "config key 'lora_alpha' must be > 0"),
    (dict(lora_rank=4, lora_target_modules=[]), "config key 'lora_target_modules' must be a list"),
    (dict(lora_rank=4, lora_target_modules=["q_proj", "q_proj"]), "config key 'lora_target_modules' must be a list"),
    (dict(lora_rank=4, lora_target_modules=["self_attn.q_proj"]), "config key 'lora_target_modules' must be a list"),
    (dict(lora_alpha=8.0), "config key 'lora_alpha' \\(8.0\\) configures LoRA adapters, but lora_rank = 0"),
    (dict(lora_target_modules=["q_proj"]), "config key 'lora_target_modules' .* but lora_rank = 0"),
    (dict(lora_rank=4, ref_sync_steps=5), "config keys 'lora_rank' \\(4\\) and 'ref_sync_steps' \\(5\\)"),
])
def test_refusals_name_the_key(overrides, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig(**overrides)


def test_refusals_at_start_up(tmp_path):
    policy, tokenizer = tiny()
    with pytest.raises(ValueError, match="config key 'lora_target_modules': 'c_attn' names no linear layer of "
                                         "LlamaForCausalLM's decoder layers"):
        lora.add_adapters(policy, TrainConfig(lora_rank=2, lora_target_modules=["c_attn"]))
    policy, _, _ = with_adapters()
    with pytest.raises(ValueError, match="the policy already has LoRA layers"):
        lora.add_adapters(policy, TrainConfig(lora_rank=2))
    with pytest.raises(ValueError, match="Faults.alias_reference: expected a run with a reference copy, got "
                                         "lora_rank = 4"):
        Faults(alias_reference=True).train(small_config(tmp_path, lora_rank=4), policy=tiny()[0],
                                           tokenizer=tokenizer, log=lambda _: None)


def test_without_peft_the_error_says_what_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "peft", None)   # import peft then raises ImportError
    with pytest.raises(ValueError, match=r"config key 'lora_rank' \(2\) trains peft's LoRA adapters, and peft is "
                                         r"not installed: pip install -e '.\[lora\]'"):
        lora.add_adapters(tiny()[0], TrainConfig(lora_rank=2))


def test_the_trl_bridge_carries_lora_as_a_peft_config():
    config = TrainConfig(lora_rank=8, lora_alpha=16.0, lora_target_modules=["q_proj", "v_proj"], steps=2,
                         prompts_per_step=4, num_generations=4, micro_batch_size=16)
    peft_config = trl_bridge.peft_config(config)
    assert (peft_config.r, peft_config.lora_alpha, peft_config.lora_dropout, sorted(peft_config.target_modules)) == (
        8, 16.0, 0.0, ["q_proj", "v_proj"])
    assert trl_bridge.peft_config(TrainConfig()) is None
    # peft's model of TRL's GRPOTrainer trains the matrices grpo_edu's adapters are, of the same shapes
    from peft import get_peft_model
    ours, _, _ = with_adapters(rank=8, alpha=16.0, targets=["q_proj", "v_proj"], moved=False)
    theirs = get_peft_model(tiny()[0], peft_config)
    trained = {n.removeprefix("base_model.model."): p.shape for n, p in theirs.named_parameters() if p.requires_grad}
    assert trained == {n: p.shape for n, p in ours.named_parameters() if p.requires_grad}


# ----------------------------------------------------------------- benchmarks/lora.py

RESULTS = ROOT / "benchmarks" / "results" / "lora.json"
sys.path.insert(0, str(ROOT / "benchmarks"))
import lora as benchmark  # noqa: E402  (benchmarks/lora.py)


def test_the_results_file_holds_every_variant_and_seed_and_every_lora_run_learned():
    for run_ in grid_checks.every_variant_and_seed(RESULTS, benchmark, eval_every=25):
        assert run_["final_accuracy"] > run_["start_accuracy"] + 0.1, (run_["variant"], run_["seed"])
        assert run_["steps"]["kl"][0] == 0.0 and all(math.isfinite(v) for v in run_["steps"]["kl"])


@grid_checks.PINNED
def test_the_results_file_is_what_the_trainer_computes():
    """Re-train lora, seed 0, for 2 steps under the pin."""
    grid_checks.reproduces("lora.py", RESULTS, "lora:0", 2)


def test_a_changed_kl_is_caught():
    grid_checks.catches_a_change(RESULTS, benchmark, "lora", 0, 2, "kl", lambda value: value * 1.0001 + 1e-9)


def test_the_training_doc_quotes_the_results_file():
    grid_checks.training_doc_quotes_final_accuracies(RESULTS, benchmark)
