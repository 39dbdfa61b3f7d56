"""`grpo-edu doctor --gpu`'s checks on vLLM's CPU build: every check that does not need CUDA.

`grpo-edu doctor --gpu` itself needs a GPU (without one it lists its checks and says so, the
main suite's test); its checks run on any device through doctor.run_checks, as here: vLLM's
version, transformers' range, the engine built (bf16, sleep mode, as on a GPU), the weight
sync at T = 0.7 and its perturbation, two training steps in a process of their own, and four
lagged steps sampled in turn and in the background (the same rewards, step by step).
Not proven on a CPU: the CUDA check itself, real memory release in sleep mode, the GPU
weight-loading path and bf16 GPU kernels (bf16 here is the CPU's), NCCL.
"""

import sys

import torch

from grpo_edu.commands import doctor
from real_vllm_support import environment, run
from hang_guard import HANG_SECONDS


def test_every_check_passes_on_the_cpu_with_the_shim(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    printed = []
    rows = {r.name: r for r in doctor.run_checks(torch.device("cpu"), output=printed.append, engines=("vllm",))}
    text = "\n".join(printed)
    assert list(rows) == doctor.ENGINES["vllm"]
    assert [r.status for r in rows.values()] == ["PASS"] * len(rows), text
    assert rows["vLLM"].detail == "vllm 0.31.0"
    assert "bfloat16" in rows["engine"].detail
    detail = rows["weight sync"].detail   # bf16 vLLM against the float32 trainer: a gap, below the limit
    assert "gap mean" in detail and "to the new policy" in detail and "to the old" in detail
    assert "grpo-edu train --set engine=vllm, 2 steps" in rows["training"].detail
    assert "rewards the same step by step" in rows["background"].detail, rows["background"].detail
    print(text)   # the table, in the tier's log (pytest -s shows it)


def test_without_the_shim_the_engine_check_fails_naming_the_cpu_build(tmp_path):
    """vLLM's CPU build as it is: the engine check fails in one line (no sleep mode) and the
    checks that stand on it are skipped."""
    code = ("import torch; from grpo_edu.commands import doctor; "
            "rows = doctor.run_checks(torch.device('cpu'), output=lambda line: None, engines=('vllm',)); "
            "print('|'.join(f'{r.name}={r.status}={r.detail}' for r in rows))")
    done = run([sys.executable, "-c", code], env=environment(shim=False), cwd=tmp_path, timeout=HANG_SECONDS)
    rows = {name: (status, detail) for name, status, detail in
            (row.split("=", 2) for row in done.stdout.strip().splitlines()[-1].split("|"))}
    assert rows["vLLM"][0] == rows["transformers"][0] == "PASS"
    assert rows["engine"][0] == "FAIL"
    assert "VLLMUnusable: config key 'vllm_sleep_mode' is true but this vLLM has no sleep mode" in rows["engine"][1]
    assert rows["weight sync"][0] == rows["training"][0] == rows["background"][0] == "SKIP"
