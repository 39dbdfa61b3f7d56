"""metrics.jsonl through runlog.MetricsLog: a new run empties it, each step adds one line,
reading skips a kill's torn last line, and a resume cuts it back to the checkpoint's step,
naming what it dropped and what is lost."""

import json
import subprocess
import sys

from grpo_edu.runtime.runlog import MetricsLog


def test_start_append_read(tmp_path):
    log = MetricsLog(tmp_path / "run")
    log.start()                                   # creates the run directory
    assert log.path == tmp_path / "run" / "metrics.jsonl" and log.read() == []
    log.append({"step": 1, "loss": 0.5})
    log.append({"step": 2, "loss": 0.25})
    assert log.read() == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25}]
    assert log.path.read_text().count("\n") == 2
    log.sync()
    log.start()                                   # a new run in the same folder starts empty
    assert log.read() == []


def test_read_skips_a_torn_last_line_quietly_and_names_unreadable_ones(tmp_path):
    log = MetricsLog(tmp_path)
    assert log.read() == []                       # no file yet
    log.path.write_text('{"step": 1}\ngarbage\n\n{"step": 3}\n{"step": 4, "lo')
    messages = []
    assert log.read(log=messages.append) == [{"step": 1}, {"step": 3}]
    assert len(messages) == 1 and "skipped 1 unreadable line(s) (lines [2])" in messages[0]
    log.path.write_text('{"step": 1}\n{"step": 2, "lo')
    messages.clear()
    assert log.read(log=messages.append) == [{"step": 1}] and messages == []


def test_restore_drops_later_and_torn_lines_and_names_lost_ones(tmp_path):
    lines = [json.dumps({"step": s, "loss": 0.5}) for s in (1, 2, 3, 4)]
    path = tmp_path / "metrics.jsonl"
    path.write_text("\n".join(lines[:1] + ["garbage"] + lines[2:]) + "\n\x00\x00")
    messages = []
    history = MetricsLog(tmp_path).restore(up_to_step=3, log=messages.append)
    assert [m["step"] for m in history] == [1, 3]
    assert "dropped 1 line(s) written after step 3 and a torn last line" in messages[0]
    assert "metrics of 1 step(s) up to 3 are lost (steps [2]; unreadable lines [2])" in messages[1]
    assert path.read_text() == lines[0] + "\n" + lines[2] + "\n"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.jsonl"]  # no temporary file left
    messages.clear()
    assert MetricsLog(tmp_path).restore(up_to_step=3, log=messages.append) == history
    assert len(messages) == 1 and "steps [2]; unreadable lines []" in messages[0]  # still lost, still said


def test_restore_of_a_whole_log_changes_nothing_and_says_nothing(tmp_path):
    log = MetricsLog(tmp_path)
    log.start()
    for step in (1, 2):
        log.append({"step": step})
    before = log.path.stat().st_mtime_ns
    messages = []
    assert log.restore(up_to_step=2, log=messages.append) == [{"step": 1}, {"step": 2}]
    assert messages == [] and log.path.stat().st_mtime_ns == before


def test_restore_without_a_log_names_every_step_lost(tmp_path):
    messages = []
    assert MetricsLog(tmp_path).restore(up_to_step=2, log=messages.append) == []
    assert len(messages) == 1 and "the metrics of 2 step(s) up to 2 are lost (steps [1, 2]" in messages[0]
    assert not (tmp_path / "metrics.jsonl").exists()


def test_reading_curves_does_not_import_torch():
    """plots -> runlog stays standard library only (checked in a fresh interpreter)."""
    code = "import sys, grpo_edu.runtime.runlog; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
