"""`grpo-edu doctor --gpu` and `grpo-edu vllm-serve`.

No GPU here: the command lists its checks and says so; the checks themselves run on the CPU
against the stand-in vllm (tests/fake_vllm), pass, and fail when they should (a wrong vLLM
version, a weight sync that does not load).
"""

import subprocess
import sys

import pytest
import torch

from grpo_edu import doctor, vllm_engine
from vllm_fake import environment_with_fake, fake_vllm


def cli(*arguments):
    return subprocess.run([sys.executable, "-m", "grpo_edu", *arguments], capture_output=True, text=True, timeout=300)


def test_without_a_gpu_it_lists_the_checks_and_exits_0():
    done = cli("doctor", "--gpu")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[-1].startswith("no GPU found")
    for name, _ in doctor.CHECKS:
        assert any(line.strip().startswith(name) for line in lines), name


def test_doctor_needs_gpu():
    done = cli("doctor")
    assert done.returncode == 2
    assert done.stderr.strip() == ("grpo-edu doctor: expected --gpu (the GPU machine's check of the vLLM engine), "
                                   "got no option")


def run(monkeypatch=None):
    printed = []
    rows = doctor.run_checks(torch.device("cpu"), output=printed.append)
    return {r.name: r for r in rows}, "\n".join(printed)


def test_every_check_passes_on_the_cpu_against_the_stand_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", environment_with_fake()["PYTHONPATH"])   # the training check's subprocess
    with fake_vllm():
        rows, printed = run()
    assert [r.status for r in rows.values()] == ["PASS"] * len(doctor.CHECKS), printed
    assert "gap mean" in rows["weight sync"].detail and "to the old" in rows["weight sync"].detail
    assert "losses" in rows["training"].detail
    assert printed.splitlines()[-1] == f"{len(doctor.CHECKS)} of {len(doctor.CHECKS)} checks passed"


def test_a_wrong_vllm_version_fails_naming_both(monkeypatch):
    with fake_vllm() as vllm:
        monkeypatch.setattr(vllm, "__version__", "0.30.0")
        rows, _ = run()
    assert rows["vLLM"].status == "FAIL"
    assert "found vllm 0.30.0, the engine is written for 0.31.0" in rows["vLLM"].detail
    assert rows["engine"].status == rows["weight sync"].status == rows["training"].status == "SKIP"


def test_a_weight_sync_that_does_not_load_fails(monkeypatch):
    """The engine's model ignores load_weights: vLLM keeps sampling the old policy."""
    def no_load(self):
        self.llm.wake_up(tags=["weights"])
        model = self._model()
        model.loaded = set(model.names)   # the stand-in thinks it was loaded; nothing was
        self.llm.reset_prefix_cache()
    monkeypatch.setattr(vllm_engine.VLLMEngine, "sync_weights", no_load)
    with fake_vllm():
        rows, _ = run()
    assert rows["weight sync"].status == "FAIL", rows["weight sync"].detail
    assert "the sync did not take" in rows["weight sync"].detail or "differ from the trainer's" in rows["weight sync"].detail
    assert rows["training"].status == "SKIP"


def test_vllm_serve_dry_run_binds_to_localhost(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    done = cli("vllm-serve", str(tmp_path), "--dry-run")
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith("VLLM_SERVER_DEV_MODE=1 ")
    assert "--host 127.0.0.1" in line and "--logprobs-mode processed_logprobs" in line
    assert """--weight-transfer-config '{"backend": "nccl"}'""" in line
    wide = cli("vllm-serve", str(tmp_path), "--dry-run", "--host", "0.0.0.0", "--port", "8100").stdout
    assert "--host 0.0.0.0" in wide and "--port 8100" in wide


def test_vllm_serve_needs_a_model_folder(tmp_path):
    done = cli("vllm-serve", str(tmp_path / "missing"))
    assert done.returncode == 2
    assert done.stderr.strip() == (f"grpo-edu vllm-serve: MODEL: expected a saved model folder (holding config.json) "
                                   f"or a hub id, got {str(tmp_path / 'missing')!r}")
