"""The real-vLLM tier's shim: what vLLM's CPU build lacks, made to look as on a GPU, test-side
only. A vLLM plugin (entry point group vllm.general_plugins, declared by the dist-info beside
this file), so it applies in every process whose PYTHONPATH holds this folder (pytest's, and
`grpo-edu train` and torchrun's ranks that the tests start), before vLLM builds its config.

Two changes, nothing else:

1. Sleep mode is accepted. vLLM 0.31.0's CPU platform refuses enable_sleep_mode=True ("Sleep
   mode is not supported on current platform"); here it is let through, and the CPU worker's
   sleep/wake_up are vLLM's own no-ops: the engine's sleep/wake calls go through vLLM's
   bookkeeping (the scheduler pauses, the executor tracks the sleeping tags) but NO memory is
   released or discarded. Not proven on a CPU: real memory release in sleep mode, and that
   every weight is loaded again after level 2 discarded it (tests/fake_vllm checks that).
2. Linear layers keep their weights. The CPU build repacks every linear layer's weight at
   load time for oneDNN/SGL kernels (qkv_proj, o_proj, gate_up_proj and down_proj become
   size-0 parameters without a weight_loader; the head keeps a packed copy of its own), so
   load_weights after start-up fails. Here they compute with torch.nn.functional.linear on
   the parameter itself, as the GPU build's layers do, so load_weights writes the weights
   the next forward uses. Not proven on a CPU: the GPU weight-loading kernels and bf16 GPU
   kernels (the CPU's float32 F.linear computes here).
"""

import torch


def register() -> None:
    from vllm.model_executor.layers import utils
    from vllm.platforms.cpu import CpuPlatform

    CpuPlatform.is_sleep_mode_available = lambda self: True

    def keep_weight(layer: torch.nn.Module, remove_weight: bool) -> None:
        layer.cpu_linear = torch.nn.functional.linear

    utils.dispatch_cpu_unquantized_gemm = keep_weight
