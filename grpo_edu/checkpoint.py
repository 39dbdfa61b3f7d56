"""Checkpoints that resume a run bit for bit, and never unpickle foreign code.

A checkpoint is a folder run_dir/checkpoints/step-NNNNNN/ holding

    policy.safetensors      the policy's weights
    reference.safetensors   the reference's weights (it can differ from the
                            start when ref_sync_steps re-syncs it)
    trainer_state.pt        optimizer, LR schedule, step, the torch and prompt
                            RNG states: tensors, numbers and tuples only, read
                            with torch.load(weights_only=True)

It is written to a temporary folder and renamed into place, and
run_dir/checkpoints/latest names the newest complete one (replaced atomically),
so a run killed at any moment leaves a checkpoint that loads.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_model, save_model

KEEP = 2  # newest checkpoints kept


def save(run_dir: Path, policy, reference, optimizer, scheduler, state, extra: dict) -> Path:
    folder = Path(run_dir) / "checkpoints"
    folder.mkdir(parents=True, exist_ok=True)
    name = f"step-{state.step:06d}"
    temporary = folder / f".{name}.tmp"
    shutil.rmtree(temporary, ignore_errors=True)
    temporary.mkdir()
    save_model(policy, str(temporary / "policy.safetensors"))
    if reference is not None:
        save_model(reference, str(temporary / "reference.safetensors"))
    torch.save({
        "step": state.step,
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "prompt_rng": state.prompt_rng.getstate(),
        "extra": json.dumps(extra),
    }, temporary / "trainer_state.pt")
    final = folder / name
    shutil.rmtree(final, ignore_errors=True)
    os.replace(temporary, final)
    pointer = folder / ".latest.tmp"
    pointer.write_text(name + "\n")
    os.replace(pointer, folder / "latest")
    for old in sorted(p for p in folder.glob("step-*") if p.is_dir())[:-KEEP]:
        shutil.rmtree(old)
    return final


def latest(run_dir: Path) -> Path:
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        raise FileNotFoundError(f"resume: {run_dir} has no checkpoints/latest (not a run directory, "
                                f"or the run never reached its first checkpoint)")
    return pointer.parent / pointer.read_text().strip()


def load(run_dir: Path, policy, reference, optimizer, scheduler, state) -> dict:
    """Restore everything `save` wrote, in place; returns the saved `extra`."""
    folder = latest(run_dir)
    load_model(policy, str(folder / "policy.safetensors"))
    if reference is not None:
        load_model(reference, str(folder / "reference.safetensors"))
    saved = torch.load(folder / "trainer_state.pt", weights_only=True)
    optimizer.load_state_dict(saved["optimizer"])
    scheduler.load_state_dict(saved["scheduler"])
    torch.set_rng_state(saved["torch_rng"])
    version, internal, gauss = saved["prompt_rng"]
    state.prompt_rng.setstate((version, tuple(internal), gauss))
    state.step = saved["step"]
    return json.loads(saved["extra"])


def read_history(run_dir: Path, up_to_step: int) -> list[dict]:
    """metrics.jsonl up to the checkpoint's step; later lines (written after the
    checkpoint by the interrupted run) are dropped from the file too."""
    path = Path(run_dir) / "metrics.jsonl"
    history = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    history = [m for m in history if m["step"] <= up_to_step]
    path.write_text("".join(json.dumps(m) + "\n" for m in history))
    return history
