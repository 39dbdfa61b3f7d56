"""The chapter-11 checkers accept the worked solutions and name what a wrong answer got wrong; their
accounting is what the library's trainer holds."""

import dataclasses

import torch

from grpo_edu.exercises import ch11
from grpo_edu.policy import lora
from grpo_edu.policy.models import STARTING_POLICY, load_policy
from grpo_edu.runtime.distributed import World, memory_bytes
from grpo_edu.training import placement
from grpo_edu.config import TrainConfig
from grpo_edu.training.update import make_optimizer

# ----------------------------------------------------------------- 10.1


def state_bytes(model, config, gpus):
    """The worked solution: 16 bytes a trained parameter, 4 a frozen one, the reference's 4 a
    parameter only for full fine-tuning with beta > 0; 1/gpus of it all."""
    P = sum(p.numel() for p in model.parameters())
    if not config.lora.lora_rank:
        return (16 + (4 if config.loss.beta > 0 else 0)) * P / gpus
    A = sum(config.lora.lora_rank * (m.in_features + m.out_features) for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in config.lora.lora_target_modules)
    return (4 * P + 16 * A) / gpus


def test_state_bytes_solution_passes():
    result = ch11.check_state_bytes(state_bytes)
    assert result and result.passed == len(ch11.STATE_CASES)
    assert ch11.check_state_bytes(lambda *args: int(state_bytes(*args)))   # an integer division is within a byte


def test_the_accounting_is_chapter_9s():
    """Its figures for Qwen2.5-7B: 152.3 GB in full on one GPU, 31.1 GB with LoRA r = 16."""
    model = ch11.base_model("Qwen2.5-7B")
    assert round(ch11.state_bytes(model, TrainConfig(), 1) / 1e9, 1) == 152.3
    assert round(ch11.state_bytes(model, TrainConfig(lora_rank=16, lora_alpha=32.0), 1) / 1e9, 1) == 31.1
    tiny = ch11.base_model(ch11.TINY)
    assert ch11.adapter_parameters(tiny, TrainConfig(lora_rank=8)) == 34_816   # the CPU tier's LoRA run


def _held(config):
    """What the library's trainer holds after one optimizer step on the tiny policy: its
    parameters, gradients and AdamW state (memory_bytes) and the reference build_models makes."""
    policy = load_policy(STARTING_POLICY)[0]
    if config.lora.lora_rank:
        lora.add_adapters(policy, config)
    models = placement.build_models(config, World(), policy)
    optimizer, _ = make_optimizer(config, policy.parameters())
    policy(torch.tensor([[3, 4, 5, 6]])).logits.square().mean().backward()
    optimizer.step()
    held = sum(memory_bytes(policy, optimizer).values())
    if models.reference is not None:
        held += memory_bytes(models.reference)["parameters"]
    return held


def test_the_accounting_is_what_the_trainer_holds():
    tiny = ch11.base_model(ch11.TINY)
    for keys in (dict(beta=0.04), dict(beta=0.0), dict(lora_rank=8, lora_alpha=16.0),
                 dict(lora_rank=4, lora_target_modules=["q_proj", "down_proj"], beta=0.0)):
        config = TrainConfig(**keys)
        assert _held(config) == ch11.state_bytes(tiny, config, 1), keys


def test_state_bytes_mistakes_are_named():
    def no_reference(model, config, gpus):
        return 16 * sum(p.numel() for p in model.parameters()) / gpus
    result = ch11.check_state_bytes(no_reference)
    assert result.passed == 1 and len(result.failures) == 5
    assert result.failures[0] == ("Qwen2.5-0.5B, full fine-tuning, beta 0.04, 2 GPUs (FSDP2): no reference: with "
                                  "beta > 0 the trainer keeps a frozen float32 copy of the policy")
    assert all("with lora_rank > 0 only the adapters train" in f for f in result.failures[2:])

    def unsharded(model, config, gpus):
        return state_bytes(model, config, 1)
    result = ch11.check_state_bytes(unsharded)
    assert len(result.failures) == 3 and all("a whole copy on every GPU" in f for f in result.failures)

    def lora_with_reference(model, config, gpus):
        extra = 4 * sum(p.numel() for p in model.parameters()) if config.lora.lora_rank and config.loss.beta else 0
        return state_bytes(model, config, gpus) + extra / gpus
    result = ch11.check_state_bytes(lora_with_reference)
    assert len(result.failures) == 2 and all("the base with its adapters off" in f for f in result.failures)

    def every_projection(model, config, gpus):
        return state_bytes(model, config.replace(lora_target_modules=ch11.ALL_SEVEN), gpus)
    result = ch11.check_state_bytes(every_projection)
    assert len(result.failures) == 1 and "only on those lora_target_modules names" in result.failures[0]

    def tied_twice(model, config, gpus):
        P = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
        return (16 + 4 * (config.loss.beta > 0)) * P / gpus if not config.lora.lora_rank else state_bytes(model, config, gpus)
    result = ch11.check_state_bytes(tied_twice)
    assert len(result.failures) == 2 and all("counts the tied embedding twice" in f for f in result.failures)


def test_state_bytes_reports_other_answers_without_the_right_one():
    result = ch11.check_state_bytes(lambda model, config, gpus: 1.5 * state_bytes(model, config, gpus))
    assert "is too large: about 1.5 times the right value" in result.failures[0]
    raises = ch11.check_state_bytes(lambda *args: 1 / 0)
    assert len(raises.failures) == 6 and raises.failures[0].endswith("raised ZeroDivisionError: division by zero")
    text = ch11.check_state_bytes(lambda *args: "a lot")
    assert "returned 'a lot', which is not numbers" in text.failures[0]


# ----------------------------------------------------------------- 10.2

def merged_weight(W, A, B, alpha, r):
    """The worked solution: W + (alpha / r) B A."""
    return W + (alpha / r) * (B @ A)


def test_merged_weight_solution_passes_and_the_policy_is_unchanged():
    result = ch11.check_merged_weight(merged_weight)
    assert result and result.passed == len(ch11.MERGE_CASES)
    policy = ch11.trained_lora_policy(ch11.MERGE_CASES[0][1])
    assert all(float(layer.lora_B[lora.ADAPTER_NAME].weight.detach().abs().min()) > 0
               for layer in lora.adapter_layers(policy).values())   # B is no longer 0: the merge shows


def test_merged_weight_mistakes_are_named():
    result = ch11.check_merged_weight(lambda W, A, B, alpha, r: W + B @ A)
    assert len(result.failures) == 4
    assert result.failures[0] == ("r = 8, alpha = 32 on q_proj and v_proj: layers.0.self_attn.q_proj (and 3 more "
                                  "of its 4 adapted layers): no scale: the adapter adds (alpha / r) B A")
    result = ch11.check_merged_weight(lambda W, A, B, alpha, r: W + alpha * (B @ A))
    assert result.passed == 1 and all("scaled by alpha: the scale is alpha / r" in f for f in result.failures)
    result = ch11.check_merged_weight(lambda W, A, B, alpha, r: W + r / alpha * (B @ A))
    assert all("scaled by r / alpha" in f for f in result.failures)
    result = ch11.check_merged_weight(lambda W, A, B, alpha, r: alpha / r * (B @ A))
    assert all("the adapter's change alone" in f for f in result.failures)
    result = ch11.check_merged_weight(lambda W, A, B, alpha, r: W + alpha / r * (A.T @ B.T))
    assert "transposed" in result.failures[0] and "raised RuntimeError" in result.failures[1]


def test_merged_weight_reports_exceptions_and_shapes():
    raises = ch11.check_merged_weight(lambda *args: 1 / 0)
    assert raises.failures[0].endswith("of its 4 adapted layers): raised ZeroDivisionError: division by zero")
    shape = ch11.check_merged_weight(lambda W, A, B, alpha, r: (alpha / r) * (A @ B) if A.shape[0] > 1 else W)
    assert "returned shape (8, 8); the case needs shape (128, 128)" in shape.failures[0]
