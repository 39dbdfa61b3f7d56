"""`grpo-edu doctor --gpu` and `grpo-edu vllm-serve`.

No GPU here: the command runs what needs none (which engines are installed), lists the rest as
not run, and says so; the checks themselves run on the CPU against the stand-in vllm
(tests/fake_vllm) and the stand-in SGLang server (tests/fake_sglang), pass, and fail when they
should (a wrong version, a weight sync that does not load, raw instead of processed log-probs,
a server that does not sample by seed, an engine asked for that is not installed).
"""

import os
import subprocess
import sys

import torch

from grpo_edu.commands import cli as cli_module, doctor
from grpo_edu.sampling import vllm_engine
from vllm_fake import environment_with_fake, fake_vllm
from test_sglang_engine import fake_sglang  # noqa: F401  (the fixture: sglang is the stand-in, here and in children)
from hang_guard import HANG_SECONDS


def cli(*arguments):
    return subprocess.run([sys.executable, "-m", "grpo_edu", *arguments], capture_output=True, text=True, timeout=HANG_SECONDS)


def test_without_a_gpu_it_lists_the_checks_and_exits_0():
    done = cli("doctor", "--gpu")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    needs_gpu = [name for name, _ in doctor.CHECKS if name not in doctor.NO_GPU_NEEDED]
    assert lines[-1] == (f"no GPU found (torch.cuda.is_available() is False): {len(needs_gpu)} checks need one and "
                         f"did not run ({', '.join(needs_gpu)})")
    rows = {line[:15].strip(): line[15:].split(None, 1) for line in lines[1:-1]}
    assert list(rows) == [name for name, _ in doctor.CHECKS]
    for name in needs_gpu:
        assert rows[name][0] == "SKIP" and rows[name][1].startswith("needs a GPU, not run here: "), name
    # what needs no GPU ran: neither engine is installed in the test environment
    assert rows["vLLM"] == ["SKIP", "vllm is not installed; pip install -e '.[gpu]' (vllm==0.31.0); --engine vllm "
                                    "to require it"]
    assert rows["SGLang"][0] == "SKIP" and "sglang is not installed" in rows["SGLang"][1]


def test_without_a_gpu_one_engine_lists_its_own_checks():
    done = cli("doctor", "--gpu", "--engine", "sglang")
    assert done.returncode == 0, done.stderr
    names = [line[:15].strip() for line in done.stdout.splitlines()[1:-1]]
    assert names == doctor.ENGINES["sglang"]
    assert done.stdout.splitlines()[2].startswith("SGLang          FAIL   sglang is not installed in ")


def test_doctor_needs_a_run_or_gpu():
    done = cli("doctor")
    assert done.returncode == 2
    assert done.stderr.strip() == ("grpo-edu doctor: expected RUN_DIR (diagnose a run from its metrics) or --gpu "
                                   "(the GPU machine's check of the vLLM and SGLang engines), got neither")
    done = cli("doctor", "--engine", "vllm")
    assert done.returncode == 2
    assert done.stderr.strip() == "grpo-edu doctor: --engine: expected with --gpu, got --engine vllm without it"


def run(engine_dtype="float32", engine="vllm", required=()):
    """The checks on the CPU; the stand-in samples bf16 slowly here, so float32 where bf16 is not the point."""
    printed = []
    rows = doctor.run_checks(torch.device("cpu"), output=printed.append, engine_dtype=engine_dtype,
                             engines=(engine,), required=required)
    return {r.name: r for r in rows}, "\n".join(printed)


def test_every_check_passes_on_the_cpu_against_the_stand_in(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", environment_with_fake()["PYTHONPATH"])   # the training check's subprocess
    with fake_vllm():
        rows, printed = run("bfloat16")   # as on a GPU: bf16 vLLM against the float32 trainer
    assert list(rows) == doctor.ENGINES["vllm"]
    assert [r.status for r in rows.values()] == ["PASS"] * len(doctor.ENGINES["vllm"]), printed
    detail = rows["weight sync"].detail   # bf16 vLLM vs the float32 trainer: a gap, small; the old policy: far
    assert "gap mean" in detail and "to the new policy" in detail and "to the old" in detail, detail
    assert rows["engine"].detail.startswith("built in") and "bfloat16" in rows["engine"].detail
    assert "losses" in rows["training"].detail
    # the stand-in samples in a thread what it samples in turn: the same rewards, step by step
    assert "rewards the same step by step" in rows["background"].detail, rows["background"].detail
    assert printed.splitlines()[-1] == f"{len(rows)} of {len(rows)} checks passed"
    assert doctor.engines_checked(list(rows.values())) == ["vllm"]


def test_a_wrong_vllm_version_fails_naming_both(monkeypatch):
    with fake_vllm() as vllm:
        monkeypatch.setattr(vllm, "__version__", "0.30.0")
        rows, _ = run()
    assert rows["vLLM"].status == "FAIL"
    assert "found vllm 0.30.0, the engine is written for 0.31.0" in rows["vLLM"].detail
    assert rows["engine"].status == rows["weight sync"].status == rows["training"].status == "SKIP"
    assert rows["background"].status == "SKIP"


def test_a_weight_sync_that_does_not_load_fails(monkeypatch):
    """The engine loads the weights once and then no more (the stand-in is told it did):
    vLLM keeps sampling the old policy after the weight change."""
    syncs = []
    load = vllm_engine.VLLMEngine.sync_weights

    def first_only(self):
        syncs.append(1)
        if len(syncs) == 1:
            return load(self)
        self.llm.wake_up(tags=["weights"])
        model = self._model()
        model.loaded = set(model.names)   # nothing was loaded: the stand-in's NaN weights of sleep ...
        for name, tensor in model.module.named_parameters():   # ... become the old weights again
            tensor.data.copy_(kept[name])
        self._weights_asleep = False   # the engine is told so too
        self.llm.reset_prefix_cache()

    def keep_and_sleep(self, level=1):
        kept.update({n: t.detach().clone() for n, t in self._model.module.named_parameters()})
        sleep(self, level)

    kept = {}
    monkeypatch.setattr(vllm_engine.VLLMEngine, "sync_weights", first_only)
    with fake_vllm() as vllm:
        sleep = vllm.LLM.sleep
        monkeypatch.setattr(vllm.LLM, "sleep", keep_and_sleep)
        rows, _ = run()
    assert len(syncs) == 2
    assert rows["weight sync"].status == "FAIL", rows["weight sync"].detail
    assert "the sync did not take" in rows["weight sync"].detail
    assert rows["training"].status == rows["background"].status == "SKIP"


def test_raw_log_probs_fail_the_gap(monkeypatch):
    """vLLM's default logprobs_mode (log softmax(logits), not / T): the check's T != 1 catches it."""
    with fake_vllm() as vllm:
        build = vllm.LLM.__init__
        monkeypatch.setattr(vllm.LLM, "__init__",
                            lambda self, *a, **k: build(self, *a, **{**k, "logprobs_mode": "raw_logprobs"}))
        rows, _ = run()
    assert rows["weight sync"].status == "FAIL"
    assert "differ from the trainer's" in rows["weight sync"].detail


def test_the_training_check_runs_without_the_engines_launcher_variables(monkeypatch):
    """The engine set MASTER_PORT etc. for its world of one (vLLM bound that port): the training
    process must choose its own."""
    for name in doctor.LAUNCHER_VARIABLES:
        monkeypatch.setenv(name, "1")
    environment = doctor.training_environment()
    assert not set(doctor.LAUNCHER_VARIABLES) & set(environment)
    assert environment["PATH"] == os.environ["PATH"]


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


def test_vllm_serve_without_trl_says_how_to_install(tmp_path, monkeypatch, capsys):
    (tmp_path / "config.json").write_text("{}")
    for name in [n for n in sys.modules if n == "trl" or n.startswith("trl.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "trl", None)   # import trl raises ImportError
    assert cli_module.main(["vllm-serve", str(tmp_path), "--dry-run"]) == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "pip install -e '.[gpu]'" in error, error


def test_vllm_serve_needs_a_model_folder(tmp_path):
    done = cli("vllm-serve", str(tmp_path / "missing"))
    assert done.returncode == 2
    assert done.stderr.strip() == (f"grpo-edu vllm-serve: MODEL: expected a saved model folder (holding config.json) "
                                   f"or a hub id, got {str(tmp_path / 'missing')!r} (no such folder)")


# --------------------------------------------------------------------------- SGLang

def test_every_sglang_check_passes_on_the_cpu_against_the_stand_in(fake_sglang, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rows, printed = run(engine="sglang")
    assert [r.status for r in rows.values()] == ["PASS"] * len(doctor.ENGINES["sglang"]), printed
    assert list(rows) == doctor.ENGINES["sglang"]
    assert rows["SGLang"].detail == "sglang 0.5.23"
    assert "started in" in rows["SGLang server"].detail and "deterministic inference True" in rows["SGLang server"].detail
    sync = rows["SGLang sync"].detail   # three syncs: disk, tensor, disk; each change of weights seen
    assert sync.count("disk") == 2 and sync.count("tensor") == 1 and sync.count("old weights") == 2, sync
    assert "the same alone as in the batch" in rows["SGLang seeds"].detail
    assert rows["SGLang sleep"].detail.startswith("free memory not measured on cpu")
    assert "losses" in rows["SGLang training"].detail and "gap mean" in rows["SGLang training"].detail
    assert doctor.engines_checked(list(rows.values())) == ["sglang"]


def test_an_sglang_sync_that_does_not_take_fails(fake_sglang, tmp_path, monkeypatch):
    """The server loads the weights once and then no more: it keeps sampling the old policy."""
    from grpo_edu.sampling.sglang_engine import SGLangEngine
    syncs, sync = [], SGLangEngine.sync_weights

    def first_only(self):
        syncs.append(1)
        if len(syncs) == 1:
            return sync(self)
        if self.settings.sleep:   # awake again, the old weights kept
            self.client.call("POST", "/resume_memory_occupation", {"tags": ["weights"]})
            self.client.call("POST", "/resume_memory_occupation", {"tags": ["kv_cache", "cuda_graph"]})
        self.released = False
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(SGLangEngine, "sync_weights", first_only)
    rows, printed = run(engine="sglang")
    assert rows["SGLang sync"].status == "FAIL", printed
    assert "after a sync from tensor" in rows["SGLang sync"].detail and "the sync did not take" in rows["SGLang sync"].detail
    assert [rows[n].status for n in ("SGLang seeds", "SGLang sleep", "SGLang training")] == ["SKIP"] * 3


def test_a_server_that_ignores_seeds_fails_the_seed_check(fake_sglang, tmp_path, monkeypatch):
    """Each request samples from the server's own random state (as SGLang without deterministic
    inference does), though the engine sent seeds."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FAKE_SGLANG_IGNORE_SEEDS", "1")
    rows, printed = run(engine="sglang")
    assert rows["SGLang sync"].status == "PASS", printed
    assert rows["SGLang seeds"].status == "FAIL", printed
    assert "the same seeds gave other tokens" in rows["SGLang seeds"].detail


def test_a_wrong_sglang_version_fails_naming_both(tmp_path, monkeypatch):
    package = tmp_path / "old" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "0.5.22"\n')
    monkeypatch.syspath_prepend(str(tmp_path / "old"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "old"))
    rows, _ = run(engine="sglang")
    assert rows["SGLang"].status == "FAIL"
    assert rows["SGLang"].detail == "RuntimeError: found sglang 0.5.22, the engine is written for 0.5.23 (pip install -e '.[sglang]')"
    assert all(rows[name].status == "SKIP" for name in doctor.ENGINES["sglang"][2:])


def test_an_engine_asked_for_but_not_installed_fails(monkeypatch):
    rows, _ = run(engine="sglang", required=("sglang",))
    assert rows["SGLang"].status == "FAIL" and rows["SGLang"].detail.startswith("sglang is not installed in ")
    rows, _ = run(engine="sglang")
    assert rows["SGLang"].status == "SKIP" and rows["SGLang"].detail.endswith("; --engine sglang to require it")
    assert doctor.engines_checked(list(rows.values())) == []
