"""The forward passes' precision (config key precision): float32, or bf16 autocast.

    precision  forward passes                 where
    fp32       float32                        the CPU tier; any device
    bf16       bf16 autocast                  GPUs (what vLLM samples in, too)
    auto       bf16 on CUDA, fp32 on the CPU

The master weights and AdamW's moments stay float32 either way: a bf16 weight keeps 8 bits of
mantissa, so an update smaller than 1/256 of it would round away.

    PRECISIONS     the settings
    compute_dtype  the dtype a setting gives on a device
    autocast       bf16 autocast where compute_dtype says so, else nothing
"""

from __future__ import annotations

import contextlib

import torch

PRECISIONS = ("auto", "fp32", "bf16")


def compute_dtype(precision: str, device: torch.device) -> torch.dtype:
    """The forward passes' precision on `device`: `precision` (config key precision), "auto"
    being bf16 on CUDA, float32 on the CPU."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return torch.bfloat16 if precision == "bf16" else torch.float32


def autocast(precision: str, device: torch.device):
    """bf16 autocast for the forward passes when compute_dtype says so, else nothing."""
    if compute_dtype(precision, device) == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16)
