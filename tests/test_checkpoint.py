"""Checkpoints: every kind of damage a kill or a power cut can leave is named and
skipped for the newest complete checkpoint, and a run killed at random moments
(inside checkpoint writes too) ends with the uninterrupted run's weights, bit for bit."""

import collections
import json
import os
import queue
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo_edu.runtime import durable
from grpo_edu.training import checkpoint, trainer
from grpo_edu.config import TrainConfig
from grpo_edu.policy.models import char_tokenizer, tiny_llama
from hang_guard import HANG_SECONDS

TINY = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def count_digits(completions, **kwargs):
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def train_tiny(output_dir, steps=3, **kwargs):
    config = TrainConfig(prompts_per_step=4, num_generations=4, max_completion_length=6, steps=steps,
                         eval_every=100, eval_size=4, checkpoint_every=1, progress=False, threads=1,
                         learning_rate=1e-2, output_dir=str(output_dir))
    tokenizer = char_tokenizer()
    policy = tiny_llama(tokenizer, seed=0, **TINY)
    return trainer.train(config, policy=policy, tokenizer=tokenizer, log=kwargs.pop("log", lambda _: None),
                         reward_functions={"digits": (count_digits, 1.0)}, **kwargs)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A 3-step run with a checkpoint every step: step-000002 and step-000003 are kept."""
    run_dir = tmp_path_factory.mktemp("finished") / "run"
    result = train_tiny(run_dir)
    return run_dir, {name: p.detach().clone() for name, p in result.policy.state_dict().items()}


@pytest.fixture
def run(finished_run, tmp_path):
    copy = tmp_path / "run"
    shutil.copytree(finished_run[0], copy)
    return copy


def newest(run_dir):
    messages = []
    folder, saved = checkpoint.newest_complete(run_dir, log=messages.append)
    return folder.name, saved["step"], messages


def truncate(path, size):
    with open(path, "r+b") as f:
        f.truncate(size)


def step3(run_dir):
    return run_dir / "checkpoints" / "step-000003"


# ------------------------------------------------------------------ each kind of damage

def test_a_sound_run_resumes_from_latest_silently(run):
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-000002", "step-000003"]
    assert newest(run) == ("step-000003", 3, [])


def _half_policy(folder):
    path = folder / "policy.safetensors"
    truncate(path, path.stat().st_size // 2)


def _flip_a_byte(folder):
    path = folder / "policy.safetensors"
    data = bytearray(path.read_bytes())
    data[-100] ^= 0x01  # inside the tensor data: the size and the header stay valid
    path.write_bytes(bytes(data))


def _power_cut(folder):  # the renamed folder holds empty files
    for file in folder.iterdir():
        truncate(file, 0)


def _zeros_inside_trainer_state(folder):
    path = folder / "trainer_state.pt"
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle:middle + 4096] = bytes(4096)
    path.write_bytes(bytes(data))


def _step_2_state_in_step_3(folder):
    shutil.copy(folder.parent / "step-000002" / "trainer_state.pt", folder / "trainer_state.pt")


DAMAGE = {
    "truncated policy": (_half_policy, "policy.safetensors has"),
    "flipped bit in policy": (_flip_a_byte, "policy.safetensors does not match the sha256"),
    "empty files": (_power_cut, "trainer_state.pt is empty"),
    "missing trainer_state": (lambda f: (f / "trainer_state.pt").unlink(), "trainer_state.pt is missing"),
    "missing reference": (lambda f: (f / "reference.safetensors").unlink(), "reference.safetensors is missing"),
    "garbled trainer_state": (_zeros_inside_trainer_state, "trainer_state.pt is"),
    "truncated trainer_state": (lambda f: truncate(f / "trainer_state.pt", 1000), "trainer_state.pt is unreadable"),
    "mismatched step": (_step_2_state_in_step_3, "holds step 2, but its folder is step-000003"),
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_damage_is_named_and_the_newest_complete_checkpoint_is_used(run, kind):
    damage, named = DAMAGE[kind]
    damage(step3(run))
    folder, step, messages = newest(run)
    assert (folder, step) == ("step-000002", 2)
    assert len(messages) == 2, messages
    assert "checkpoint step-000003 is damaged" in messages[0] and named in messages[0], messages[0]
    assert str(step3(run)) in messages[0]  # the file's full path
    assert "continuing from step-000002" in messages[1]


@pytest.mark.parametrize("text, named", [
    ("\x00\x00\x00\x00", "is garbled"),
    ("step-000009\n", "names step-000009, which is not there"),
    ("step-000002\n", "names step-000002, but step-000003 is newer and complete"),
])
def test_a_wrong_latest_pointer_is_named_and_the_newest_complete_checkpoint_used(run, text, named):
    (run / "checkpoints" / "latest").write_text(text)
    folder, step, messages = newest(run)
    assert (folder, step) == ("step-000003", 3)
    assert len(messages) == 1 and named in messages[0] and "latest" in messages[0], messages


def test_latest_pointing_at_a_folder_that_is_gone(run):
    shutil.rmtree(step3(run))  # `latest` still says step-000003
    assert newest(run) == ("step-000002", 2, [
        f"resume: {run / 'checkpoints' / 'latest'} names step-000003, which is not there; "
        f"continuing from step-000002, the newest complete checkpoint"])


def test_none_complete_is_refused_naming_the_run_and_every_damaged_file(run):
    _half_policy(step3(run))
    (run / "checkpoints" / "step-000002" / "trainer_state.pt").unlink()
    with pytest.raises(checkpoint.CheckpointError) as error:
        newest(run)
    message = str(error.value)
    assert "\n" not in message and message.startswith(f"{run}: expected a complete checkpoint")
    assert str(step3(run) / "policy.safetensors") in message
    assert str(run / "checkpoints" / "step-000002" / "trainer_state.pt") in message


def test_no_checkpoint_at_all_is_refused(tmp_path):
    (tmp_path / "run").mkdir()
    with pytest.raises(checkpoint.CheckpointError, match="found none .*without --resume"):
        newest(tmp_path / "run")


# ------------------------------------------------------------------ resuming after damage

def test_resume_after_damage_falls_back_and_is_bitwise(run, finished_run):
    _half_policy(step3(run))
    metrics = run / "metrics.jsonl"
    metrics.write_text(metrics.read_text() + '{"step": 4, "reward/me')  # torn by a kill
    messages = []
    resumed = train_tiny(run, resume=run, log=messages.append)
    assert any("policy.safetensors has" in m for m in messages), messages
    assert any("dropped 1 line(s) written after step 2 and a torn last line" in m and "nothing is lost" in m
               for m in messages), messages
    for name, weights in finished_run[1].items():
        assert torch.equal(resumed.policy.state_dict()[name], weights), name
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()] == [1, 2, 3]
    # The damaged step-000003 was replaced by a complete one.
    assert newest(run) == ("step-000003", 3, [])


def test_save_clears_a_killed_save_and_damaged_checkpoints_it_supersedes(run):
    stale = run / "checkpoints" / ".step-000004.tmp"  # a save that was killed
    stale.mkdir()
    (stale / "policy.safetensors").write_bytes(b"")
    (run / "checkpoints" / "step-000009").mkdir()  # a damaged (empty) checkpoint of a later step
    _half_policy(step3(run))
    messages = []
    train_tiny(run, resume=run, log=messages.append)
    assert "step-000009 is damaged" in messages[0] and "step-000003 is damaged" in messages[1]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["latest", "step-000002", "step-000003"]
    assert newest(run) == ("step-000003", 3, [])


def test_save_flushes_every_file_and_folder_around_each_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = durable.fsync, os.replace
    # checkpoint and runlog (MetricsLog.sync flushes metrics.jsonl) flush through grpo_edu.runtime.durable
    monkeypatch.setattr(durable, "fsync", lambda path: (events.append(("fsync", Path(path).name)),
                                                         real_fsync(path)))
    monkeypatch.setattr(checkpoint.os, "replace", lambda a, b: (events.append(("rename", Path(b).name)),
                                                                 real_replace(a, b)))
    train_tiny(tmp_path / "run", steps=1)
    rename, pointer = events.index(("rename", "step-000001")), events.index(("rename", "latest"))
    assert {name for _, name in events[:rename]} == {"run", "policy.safetensors", "reference.safetensors",
                                                     "trainer_state.pt", ".step-000001.tmp", "metrics.jsonl"}
    assert events[rename:pointer + 2] == [("rename", "step-000001"), ("fsync", "checkpoints"),
                                          ("fsync", ".latest.tmp"), ("rename", "latest"), ("fsync", "checkpoints")]


# ------------------------------------------------------------------ killed at random moments

# A forked copy of this process is a training process as `grpo-edu train` starts it,
# without paying transformers' import (seconds) for each of the many restarts. A request may
# name `stop_at`: the child then stops itself (SIGSTOP) just before the stop_at-th operation of
# checkpoint.save it reaches (a file written, flushed, renamed or removed), and the test kills it
# there. Where such a kill lands is the test's choice, not the machine's timing: a slow or loaded
# machine stops at the same operation as a fast one.
FORK_SERVER = r"""
import json, os, signal, sys, traceback
from grpo_edu.commands import cli
from grpo_edu.training import checkpoint, trainer


def stop_before(stop_at):
    # Count checkpoint.save's operations; stop this process before the stop_at-th.
    count = [0]
    original_save = checkpoint.save

    def armed(function):
        def operation(*args, **kwargs):
            count[0] += 1
            if count[0] == stop_at:
                os.kill(os.getpid(), signal.SIGSTOP)
            return function(*args, **kwargs)
        return operation

    def save(*args, **kwargs):
        names = ((checkpoint.durable, "fsync"), (checkpoint.os, "replace"), (checkpoint.shutil, "rmtree"),
                 (checkpoint, "save_file"))
        originals = [(owner, name, getattr(owner, name)) for owner, name in names]
        for owner, name, function in originals:
            setattr(owner, name, armed(function))
        try:
            return original_save(*args, **kwargs)
        finally:
            for owner, name, function in originals:
                setattr(owner, name, function)
    checkpoint.save = save


for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(log, 1)
        os.dup2(log, 2)
        if request.get("stop_at"):
            stop_before(request["stop_at"])
        try:
            code = cli.main(request["argv"])
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    print(json.dumps({"pid": pid}), flush=True)
    status = os.waitpid(pid, os.WUNTRACED)[1]
    if os.WIFSTOPPED(status):
        print(json.dumps({"stopped": pid}), flush=True)
        status = os.waitpid(pid, 0)[1]
    print(json.dumps({"exit": os.waitstatus_to_exitcode(status)}), flush=True)
"""

# Steps enough that the killed run cannot finish before its kills, on any machine: an aimed
# kill lands within the first three checkpoint writes of its launch (one a step), a kill
# within 0.8 s at most ~10 steps (at 40 steps/s on a quiet CPU), so 12 kills use at most ~80.
SETTINGS = dict(model="start", steps=200, prompts_per_step=2, num_generations=4, max_completion_length=8,
                checkpoint_every=1, eval_every=1000, eval_size=4, progress=False, threads=1)
KILLS = 12
# checkpoint.save's operations for one checkpoint, counted: 12 (the weight files written, each file and
# the folders flushed, the renames, `latest` replaced), 13 past KEEP checkpoints (an old one removed).
# An aimed kill stops before one of the first 3 x SAVE_OPERATIONS operations after its launch: within
# its first three writes.
SAVE_OPERATIONS = 13


class ForkServer:
    def __init__(self, cwd):
        self.process = subprocess.Popen([sys.executable, "-c", FORK_SERVER], cwd=cwd, text=True,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.lines = queue.Queue()
        threading.Thread(target=lambda: [self.lines.put(json.loads(line)) for line in self.process.stdout],
                         daemon=True).start()
        self.running = None

    def start(self, argv, log, stop_at: int | None = None) -> int:
        self.process.stdin.write(json.dumps({"argv": argv, "log": str(log), "stop_at": stop_at}) + "\n")
        self.process.stdin.flush()
        self.running = self.lines.get(timeout=HANG_SECONDS)["pid"]
        return self.running

    def stopped(self, timeout=None) -> bool:
        """True once the child has stopped itself (an aimed kill's moment); False if it ended first."""
        event = self.lines.get(timeout=timeout)
        if "stopped" in event:
            return True
        self.lines.put(event)
        return False

    def exit_code(self, timeout=None):
        try:
            event = self.lines.get(timeout=timeout)
        except queue.Empty:
            return None
        self.running = None
        return event["exit"]

    def close(self):
        if self.running is not None and self.exit_code(timeout=0) is None:
            os.kill(self.running, signal.SIGKILL)  # a failed test leaves no training behind
        self.process.stdin.close()
        self.process.wait(timeout=HANG_SECONDS)


def _train_argv(run_dir):
    return ["train", *(f"--set={key}={json.dumps(value)}" for key, value in SETTINGS.items()),
            f"--set=output_dir={json.dumps(str(run_dir))}"]


def _listing(folder):
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in folder.iterdir()} if folder.is_dir() else {}


def _where_the_kill_landed(folder, before):
    """The moment of checkpoint.save a kill interrupted, from what it left in
    checkpoints/ that differs from the listing `before` the launch; None: outside a save."""
    changed = {name for name, stamp in _listing(folder).items() if before.get(name) != stamp}
    steps = [p.name for p in checkpoint.checkpoint_folders(folder)] if folder.is_dir() else []
    if any(name.startswith(".step-") for name in changed):
        return "writing the temporary folder"
    if ".latest.tmp" in changed:
        return "replacing latest"
    if steps and steps[-1] in changed:
        pointer = folder / "latest"
        if not pointer.is_file() or pointer.read_text().strip() != steps[-1]:
            return "renamed, latest not yet updated"
        if len(steps) > checkpoint.KEEP:
            return "old checkpoint not yet pruned"
        # latest names the new checkpoint and nothing is left to prune: stopped before the last
        # flush of the folder, or after the save ended (a random kill that lands later looks the same)
        return "latest replaced, folder not yet flushed"
    if any(name in before and name in changed for name in steps[:-1]):
        return "pruning an old checkpoint"
    return None


@pytest.mark.slow
def test_killed_at_random_moments_resumes_to_the_uninterrupted_weights(tmp_path):
    uninterrupted = subprocess.Popen([sys.executable, "-m", "grpo_edu.commands.cli", *_train_argv(tmp_path / "uninterrupted")],
                                     cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _kill_and_resume(tmp_path)
    except BaseException:
        uninterrupted.kill()  # a failed test leaves no training behind
        raise
    assert uninterrupted.wait(timeout=HANG_SECONDS) == 0, uninterrupted.stderr.read()[-3000:]
    run_dir = tmp_path / "killed"
    for name in ("policy.safetensors", "reference.safetensors"):
        expected = load_file(checkpoint.latest(tmp_path / "uninterrupted") / name)
        got = load_file(checkpoint.latest(run_dir) / name)
        assert expected.keys() == got.keys()
        for key in expected:
            assert torch.equal(expected[key], got[key]), f"{name}: {key} differs"

    def without_times(path):
        return [{k: v for k, v in json.loads(line).items() if not k.startswith("time/")}
                for line in path.read_text().splitlines()]
    assert without_times(run_dir / "metrics.jsonl") == without_times(tmp_path / "uninterrupted" / "metrics.jsonl")
    assert [m["step"] for m in without_times(run_dir / "metrics.jsonl")] == list(range(1, SETTINGS["steps"] + 1))


def _kill_and_resume(tmp_path):
    """Start the run and SIGKILL it KILLS times, each time resuming it, then let it finish: every
    other kill aimed inside a checkpoint write (the child stops itself before a chosen operation of
    checkpoint.save), the others at a random moment anywhere (starting up, resuming, sampling,
    updating, saving)."""
    server = ForkServer(tmp_path)
    run_dir, log = tmp_path / "killed", tmp_path / "killed.log"
    folder = run_dir / "checkpoints"
    rng = random.Random(0)
    kills, aimed, started = [], [], time.perf_counter()
    try:
        while True:
            steps = checkpoint.checkpoint_folders(folder) if folder.is_dir() else []
            before = _listing(folder)
            argv = ["train", "--resume", str(run_dir)] if steps else _train_argv(run_dir)
            if len(kills) == KILLS:
                server.start(argv, log)
                assert server.exit_code(timeout=HANG_SECONDS) == 0, log.read_text()[-3000:]
                break
            at_a_write = len(kills) % 2 == 0
            stop_at = rng.randint(1, 3 * SAVE_OPERATIONS) if at_a_write else None
            pid = server.start(argv, log, stop_at)
            if at_a_write:
                assert server.stopped(timeout=HANG_SECONDS), \
                    f"the run ended before checkpoint.save's operation {stop_at}:\n{log.read_text()[-3000:]}"
            else:
                code = server.exit_code(timeout=rng.uniform(0.0, 0.8))
                assert code is None, f"the run ended (exit code {code}) before its kill:\n{log.read_text()[-3000:]}"
            os.kill(pid, signal.SIGKILL)
            code = server.exit_code(timeout=HANG_SECONDS)
            assert code == -signal.SIGKILL, f"exit code {code}:\n{log.read_text()[-3000:]}"
            kills.append(_where_the_kill_landed(folder, before))
            if at_a_write:
                aimed.append((stop_at, kills[-1]))
    finally:
        server.close()
    seconds = time.perf_counter() - started
    inside = [where for where in kills if where]
    print(f"\n{len(kills)} kills in {seconds:.0f} s, {len(inside)} inside checkpoint.save: "
          f"{dict(collections.Counter(inside))}; aimed (operation, where): {aimed}")
    text = log.read_text()
    assert "Traceback" not in text and "grpo-edu train: " not in text, text[-3000:]
    # every aimed kill landed inside a checkpoint write, whatever the machine's speed
    assert len(aimed) == KILLS // 2 and all(where for _, where in aimed), aimed
