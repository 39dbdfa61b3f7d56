"""metrics.jsonl, one JSON line of metrics per training step: the only code that touches it.

The trainer starts it (`start`), appends a step's metrics (`append`, rank 0 only), flushes it
to disk before a checkpoint that covers it (`sync`), and on resume cuts it back to the
checkpoint's step (`restore`); plots read it (`read`). Standard library only, so reading a
run's curves does not import torch.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Callable

from grpo_edu.runtime import durable

FILENAME = "metrics.jsonl"


def _warn(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


class MetricsLog:
    """run_dir/metrics.jsonl."""

    def __init__(self, run_dir: str | Path):
        self.path = Path(run_dir) / FILENAME

    def start(self) -> None:
        """An empty log: a new run."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")

    def append(self, metrics: dict) -> None:
        """One step's metrics, one line, written through (a kill loses at most this line)."""
        with open(self.path, "a") as f:
            f.write(json.dumps(metrics) + "\n")

    def read(self, log: Callable[[str], None] = _warn) -> list[dict]:
        """Every whole line, in order. A torn last line (left by a kill) is skipped quietly:
        the run writes it again on resume. Unreadable whole lines are skipped and named."""
        if not self.path.is_file():
            return []
        *lines, _torn = self.path.read_bytes().decode(errors="replace").split("\n")
        history, unreadable = [], []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                history.append(json.loads(line))
            except ValueError:
                unreadable.append(number)
        if unreadable:
            log(f"{self.path}: skipped {len(unreadable)} unreadable line(s) (lines {unreadable[:10]}"
                f"{'...' if len(unreadable) > 10 else ''})")
        return history

    def sync(self) -> None:
        """Force the log to disk (before a checkpoint that covers its lines)."""
        if self.path.is_file():
            durable.fsync(self.path)

    def restore(self, up_to_step: int, log: Callable[[str], None] = _warn) -> list[dict]:
        """The metrics up to a checkpoint's step, for a resumed run. Lines written after the
        checkpoint by the interrupted run, and a last line it left half-written, are dropped
        from the file too: the resumed run writes them again."""
        path = self.path
        text = path.read_bytes().decode(errors="replace") if path.is_file() else ""
        *lines, torn = text.split("\n")  # after the last newline: "" or a line cut short
        history, unreadable = [], []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                metrics = json.loads(line)
                step = int(metrics["step"])
            except (ValueError, TypeError, KeyError):
                unreadable.append(number)
                continue
            if step <= up_to_step:
                history.append(metrics)
        later = sum(1 for line in lines if line.strip()) - len(history) - len(unreadable)
        if later or torn.strip():
            torn_note = " and a torn last line" if torn.strip() else ""
            log(f"resume: {path}: dropped {later} line(s) written after step {up_to_step}{torn_note}; "
                f"the run writes them again from the checkpoint, nothing is lost")
        missing = sorted(set(range(1, up_to_step + 1)) - {m["step"] for m in history})
        if missing or unreadable:
            log(f"resume: {path}: the metrics of {len(missing)} step(s) up to {up_to_step} are lost "
                f"(steps {missing[:10]}{'...' if len(missing) > 10 else ''}; unreadable lines {unreadable[:10]})")
        if later or torn or unreadable:
            durable.replace(path, "".join(json.dumps(m) + "\n" for m in history))
        return history
