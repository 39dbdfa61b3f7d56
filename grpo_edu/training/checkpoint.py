"""Checkpoints that resume a run bit for bit, survive a kill or a power cut, and
never unpickle foreign code.

A checkpoint is a folder run_dir/checkpoints/step-NNNNNN/ holding

    policy.safetensors      the policy's weights (with LoRA: its adapters only; the
                            frozen base is the run's config.run.model, loaded again)
    reference.safetensors   the reference's weights (it can differ from the
                            start when ref_sync_steps re-syncs it)
    trainer_state.pt        optimizer, LR schedule, step, the torch and prompt
                            RNG states, and the size and sha256 of the two
                            weight files: tensors, numbers, strings and tuples
                            only, read with torch.load(weights_only=True)

trainer_state.pt is written last and vouches for the others: a checkpoint is
complete when trainer_state.pt reads back whole (every record of its zip passes
its CRC check), its step is the folder's, and each weight file has the recorded
size and sha256. run_dir/checkpoints/latest names the newest checkpoint.

A kill can stop the process at any line, and a power cut loses whatever the
kernel had not yet written to disk (a renamed folder can come back holding
empty files). So every file is flushed (fsync) before its folder is renamed
into place, and the folder that holds the rename is flushed after it; `latest`
is replaced the same way. Resume checks the newest checkpoint, says which file
is damaged if one is, and falls back to the newest complete checkpoint.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import sys
import zipfile
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_model, save_file

from grpo_edu.policy import lora
from grpo_edu.runtime import distributed, durable

KEEP = 2  # newest checkpoints kept
STATE_KEYS = {"step", "optimizer", "scheduler", "torch_rng", "prompt_rng", "extra", "files"}


class CheckpointError(Exception):
    """A run directory that cannot be resumed; the message names the files."""


class DamagedCheckpoint(CheckpointError):
    """One checkpoint folder is incomplete or damaged; the message names the file."""


def _warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# ------------------------------------------------------------------ writing

def save(run_dir: Path, policy_weights: dict, reference_weights: dict | None, optimizer_state: dict,
         scheduler, state, extra: dict, in_flight: list[list[dict]] | None = None) -> Path:
    """Write run_dir/checkpoints/step-NNNNNN/ durably, point `latest` at it, and
    prune; `extra` (JSON) comes back from `load_weights`. `in_flight`: with rollout_lag,
    each rank's rollouts sampled ahead of their updates (grpo_edu.training.asynchronous.to_record).

    policy_weights, reference_weights: whole tensors by parameter name (each tied
    weight once), as grpo_edu.runtime.distributed.full_state_dict gives them; optimizer_state
    the optimizer's state_dict with whole tensors (distributed.full_optimizer_state).
    So a checkpoint is the same whatever the number of processes that wrote it, and
    resumes on any number. The caller flushes the run's metrics first (runlog).
    """
    run_dir = Path(run_dir)
    folder = run_dir / "checkpoints"
    if not folder.is_dir():
        folder.mkdir(parents=True)
        durable.fsync(run_dir)
    for stale in folder.glob(".step-*.tmp"):  # left by a save that was killed
        shutil.rmtree(stale)
    name = f"step-{state.step:06d}"
    temporary = folder / f".{name}.tmp"
    temporary.mkdir()

    files = {}
    for filename, weights in (("policy.safetensors", policy_weights), ("reference.safetensors", reference_weights)):
        if weights is not None:
            save_file(weights, str(temporary / filename))
            durable.fsync(temporary / filename)
            files[filename] = _size_and_sha256(temporary / filename)
    trainer_state = {
        "step": state.step,
        "optimizer": optimizer_state,
        "scheduler": scheduler.state_dict(),
        "torch_rng": torch.get_rng_state(),
        "prompt_rng": state.prompt_rng.getstate(),
        "extra": json.dumps(extra),
        "files": files,
    }
    if in_flight is not None:   # rollout_lag: the rollouts sampled ahead, per rank (asynchronous.to_record)
        trainer_state["in_flight"] = in_flight
    torch.save(trainer_state, temporary / "trainer_state.pt")
    durable.fsync(temporary / "trainer_state.pt")
    durable.fsync(temporary)

    final = folder / name
    shutil.rmtree(final, ignore_errors=True)  # a damaged one of the same step, skipped by the resume
    os.replace(temporary, final)
    durable.fsync(folder)
    durable.replace(folder / "latest", name + "\n")
    _prune(folder, state.step)
    return final


def save_checkpoint(run_dir: Path, models, optimizer, scheduler, state, world, extra: dict, metrics_log,
                    in_flight: list[list[dict]] | None = None) -> None:
    """A training run's checkpoint (grpo_edu.training.trainer): the policy's and the reference's whole
    weights and the optimizer's state (gathered under FSDP2, on every rank: a collective),
    written by rank 0 after the metrics it covers (`metrics_log`, a runlog.MetricsLog) reach
    the disk. `models` is a placement.Models, `world` a distributed.World; `in_flight` every
    rank's rollouts sampled ahead (the rollout source's records: rollout_lag), or None."""
    adapters_only = lora.is_adapter if lora.has_adapters(models.policy) else None   # the base never changes
    policy_weights = distributed.full_state_dict(models.policy, keep=adapters_only)
    reference_weights = None if models.reference is None else distributed.full_state_dict(models.reference)
    optimizer_state = distributed.full_optimizer_state(optimizer)
    if world.is_main:
        metrics_log.sync()
        save(run_dir, policy_weights, reference_weights, optimizer_state, scheduler, state, extra, in_flight)
    world.barrier()


def _prune(folder: Path, step: int) -> None:
    """Keep the KEEP newest checkpoints up to `step`. Later ones are left by a run
    resumed from an earlier checkpoint (they were damaged) or by an earlier run in
    the same folder: remove them."""
    older = [p for p in checkpoint_folders(folder) if _step_of(p) < step]
    later = [p for p in checkpoint_folders(folder) if _step_of(p) > step]
    for old in later + older[:max(len(older) - (KEEP - 1), 0)]:
        shutil.rmtree(old)


def _size_and_sha256(path: Path) -> dict:
    sha256 = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha256.update(chunk)
    return {"size": path.stat().st_size, "sha256": sha256.hexdigest()}


# ------------------------------------------------------------------ checking

def _step_of(folder: Path) -> int:
    return int(folder.name.removeprefix("step-"))


def checkpoint_folders(folder: Path) -> list[Path]:
    """The step-NNNNNN folders in checkpoints/, newest last."""
    found = [p for p in folder.glob("step-*") if re.fullmatch(r"step-\d+", p.name) and p.is_dir()]
    return sorted(found, key=_step_of)


def read_state(checkpoint: Path) -> dict:
    """trainer_state.pt of a complete checkpoint, once every file it vouches for is
    checked; raises DamagedCheckpoint naming the first damaged file."""
    path = checkpoint / "trainer_state.pt"
    if not path.is_file():
        raise DamagedCheckpoint(f"{path} is missing")
    if path.stat().st_size == 0:
        raise DamagedCheckpoint(f"{path} is empty")
    try:
        with zipfile.ZipFile(path) as archive:
            failed_crc = archive.testzip()
        saved = None if failed_crc else torch.load(path, weights_only=True)
    except Exception as error:  # a damaged zip or pickle fails in many ways (zipfile, pickle, torch)
        raise DamagedCheckpoint(f"{path} is unreadable ({type(error).__name__}: {error})") from error
    if failed_crc:
        raise DamagedCheckpoint(f"{path} is corrupt (its record {failed_crc!r} fails its CRC check)")
    if not isinstance(saved, dict) or not STATE_KEYS <= saved.keys():
        found = sorted(saved) if isinstance(saved, dict) else type(saved).__name__
        raise DamagedCheckpoint(f"{path} lacks the keys {sorted(STATE_KEYS)} (found {found}; "
                                f"written by an older grpo-edu?)")
    if saved["step"] != _step_of(checkpoint):
        raise DamagedCheckpoint(f"{path} holds step {saved['step']}, but its folder is {checkpoint.name}")
    for filename, expected in saved["files"].items():
        file = checkpoint / filename
        if not file.is_file():
            raise DamagedCheckpoint(f"{file} is missing")
        size = file.stat().st_size
        if size != expected["size"]:
            raise DamagedCheckpoint(f"{file} has {size} bytes, expected {expected['size']}")
        if _size_and_sha256(file)["sha256"] != expected["sha256"]:
            raise DamagedCheckpoint(f"{file} does not match the sha256 recorded when it was written")
    return saved


def newest_complete(run_dir: Path, log: Callable[[str], None] = _warn) -> tuple[Path, dict]:
    """The newest complete checkpoint of a run and its trainer state. Each damaged
    checkpoint on the way, and a `latest` pointer that disagrees, is logged in one line."""
    folder = Path(run_dir) / "checkpoints"
    candidates = checkpoint_folders(folder) if folder.is_dir() else []
    if not candidates:
        raise CheckpointError(f"{run_dir}: expected a checkpoint in {folder}, found none (the run stopped "
                              f"before its first checkpoint: start it again without --resume)")
    damaged = []
    for checkpoint in reversed(candidates):
        try:
            saved = read_state(checkpoint)
        except DamagedCheckpoint as damage:
            damaged.append(str(damage))
            left = "trying an older one" if len(damaged) < len(candidates) else "no older one is left"
            log(f"resume: checkpoint {checkpoint.name} is damaged: {damage}; {left}")
            continue
        pointer = _latest_problem(folder, checkpoint)
        if pointer or damaged:
            log(f"resume: {pointer + '; ' if pointer else ''}continuing from {checkpoint.name}, "
                f"the newest complete checkpoint")
        return checkpoint, saved
    raise CheckpointError(f"{run_dir}: expected a complete checkpoint in {folder}, found none: "
                          + "; ".join(damaged))


def _latest_problem(folder: Path, newest: Path) -> str | None:
    """Why checkpoints/latest does not name `newest`, or None when it does."""
    pointer = folder / "latest"
    if not pointer.is_file():
        return f"{pointer} is missing"
    text = pointer.read_bytes().decode(errors="replace").strip()
    if text == newest.name:
        return None
    if not re.fullmatch(r"step-\d+", text):
        return f"{pointer} is garbled ({text[:40]!r})"
    if not (folder / text).is_dir():
        return f"{pointer} names {text}, which is not there"
    if _step_of(folder / text) > _step_of(newest):
        return None  # it names a damaged checkpoint, already reported
    return f"{pointer} names {text}, but {newest.name} is newer and complete (the run stopped before updating it)"


def latest(run_dir: Path) -> Path:
    """The checkpoint folder run_dir/checkpoints/latest names (unchecked: resume
    uses `newest_complete`)."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    if not pointer.is_file():
        raise CheckpointError(f"{run_dir}: no checkpoints/latest (not a run directory, "
                              f"or the run never reached its first checkpoint)")
    return pointer.parent / pointer.read_text().strip()


# ------------------------------------------------------------------ resuming

def load_weights(run_dir: Path, policy, reference, log: Callable[[str], None] = _warn) -> dict:
    """The newest complete checkpoint's weights into `policy` and `reference` (plain,
    unsharded models; None: beta = 0); returns its trainer state (`restore_rng` and the
    optimizer's and scheduler's load_state_dict take the rest)."""
    checkpoint, saved = newest_complete(run_dir, log)
    _load_weights(policy, checkpoint / "policy.safetensors")
    if reference is not None:
        if "reference.safetensors" not in saved["files"]:
            raise CheckpointError(f"{checkpoint}: expected reference.safetensors (beta > 0), found none: "
                                  f"the run was started with beta = 0")
        _load_weights(reference, checkpoint / "reference.safetensors")
    return saved


def restore_rng(saved: dict, state) -> None:
    """The step, the torch RNG and the prompt RNG as they were at the checkpoint. Every rank
    draws the same numbers (grpo_edu.runtime.distributed), so rank 0's states serve any number of ranks."""
    torch.set_rng_state(saved["torch_rng"])
    version, internal, gauss = saved["prompt_rng"]
    state.prompt_rng.setstate((version, tuple(internal), gauss))
    state.step = saved["step"]


def _load_weights(model, path: Path) -> None:
    """Every weight of `model` from `path`; a model with LoRA adapters: exactly its adapters."""
    adapters = lora.has_adapters(model)
    expected = ("the LoRA adapters of this run's model (config keys lora_rank, lora_target_modules)" if adapters
                else "the weights of this run's model")
    try:
        missing, unexpected = load_model(model, str(path), strict=not adapters)
    except RuntimeError as error:  # missing, unexpected or other-shaped tensors: another model than the run's
        detail = " ".join(str(error).split())
        raise CheckpointError(f"{path}: expected {expected}, got others ({detail[:300]})") from error
    missing = [name for name in missing if lora.is_adapter(name)]
    if adapters and (missing or unexpected):
        found = f"{unexpected[0]!r} is not one of its adapters" if unexpected else f"{missing[0]!r} is missing"
        raise CheckpointError(f"{path}: expected {expected}, got others ({found})")
