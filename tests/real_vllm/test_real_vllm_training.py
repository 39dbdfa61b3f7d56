"""The trainer through vLLM's CPU build: `grpo-edu train --set engine=vllm` in one process, and
torchrun with 2 processes (ddp, fsdp2: each rank its own engine, external_launcher, the
trainer's weights loaded every step, under FSDP2 gathered from the shards), which must train
what the one process trains.

The 2-process runs are where vLLM's CPU sampler's draws from torch's RNG showed: without the
engine's RNG restore the runs' rewards were [0.4375, 0.5, 0.5625] and [0.4375, 0.5625,
0.71875] and the final weights 5.2e-4 apart (ddp); with it, equal and 2.2e-8 apart.

Every process finds the shim (cpu_shim/) through PYTHONPATH. Not proven on a CPU: NCCL (the
ranks talk over gloo here), real memory release in sleep mode, GPU weight loading and kernels,
bf16 sampling.
"""

import json
import math
import sys

import pytest

from real_vllm_support import BIN, environment, run
from grpo_edu.policy import lora
from test_distributed import TOLERANCE, final_policy, largest_difference
from test_vllm_engine import SETTINGS
from hang_guard import HANG_SECONDS

ARGUMENTS = [f"--set={s}" for s in SETTINGS + ["checkpoint_every=3"]]


def train(tmp_path, name: str, processes: int, *extra: str):
    out = tmp_path / name
    launcher = [str(BIN / "grpo-edu")] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}",
        "-m", "grpo_edu"]
    done = run(launcher + ["train", *ARGUMENTS, f"--set=output_dir={out}", *[f"--set={e}" for e in extra]],
               env=environment(), cwd=tmp_path, timeout=HANG_SECONDS)
    return out, done


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """The 1-process run (sleep mode on, the default): the run every 2-process run must equal."""
    return train(tmp_path_factory.mktemp("one"), "run", 1)


def metrics(out):
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_grpo_edu_train_with_engine_vllm(one_process):
    """One warning line (no GPU), then 3 steps through vLLM: finite losses, the sampler gap of
    float32 vLLM against the float32 trainer logged every step (~1e-6)."""
    out, done = one_process
    warnings = [line for line in done.stderr.splitlines() if line.startswith("grpo-edu: warning")]
    assert warnings == ["grpo-edu: warning: engine = 'vllm' without a GPU: vLLM samples on the CPU (vLLM's CPU "
                        "build, or a stand-in); the GPU check is `grpo-edu doctor --gpu`"]
    history = metrics(out)
    assert [m["step"] for m in history] == [1, 2, 3]
    assert all(math.isfinite(m["loss"]) and m["sampler_gap/mean_abs"] < 1e-5 for m in history)
    assert json.loads((out / "config.json").read_text())["engine"] == "vllm"


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp2"])
def test_two_processes_train_through_vllm_what_one_does(tmp_path, one_process, parallelism):
    """Rewards, final weights (within 1e-5; measured 2.2e-8), the evaluation and the samples of
    the 2-process run are the 1-process run's. ddp runs with vllm_sleep_mode = false, fsdp2
    with it on (the engine's sleep/wake calls; on the CPU they only pause the scheduler).
    Fails without the engine's RNG restore (see the module docstring)."""
    one, _ = one_process
    sleep = "true" if parallelism == "fsdp2" else "false"
    two, _ = train(tmp_path, parallelism, 2, f"parallelism={parallelism}", f"vllm_sleep_mode={sleep}")
    assert [m["reward/mean"] for m in metrics(two)] == [m["reward/mean"] for m in metrics(one)]
    assert largest_difference(one, two) < TOLERANCE
    summaries = [json.loads((run_dir / "summary.json").read_text()) for run_dir in (one, two)]
    assert summaries[0]["eval_curve"] == summaries[1]["eval_curve"]
    assert (one / "samples_after.txt").read_text() == (two / "samples_after.txt").read_text()


@pytest.mark.parametrize("pi_old", [(), ("old_logprobs=proximal", "tis_cap=2.0")], ids=["recomputed", "proximal"])
def test_sampling_in_the_background_trains_what_sampling_in_turn_does(tmp_path, pi_old):
    """rollout_overlap = true through the CPU build (rollout_lag = 1, no sleep mode): vLLM
    samples rollouts 2 and 3 in a thread while the trainer updates, its weights synced in the
    main thread between rollouts; rewards, final weights and evaluation are those of the same
    lagged run sampled in turn. With pi_old recomputed by the sampling policy (the sampler's
    copy computes it) and taken at the update (no copy: configs/h100-8x-async.toml's way)."""
    settings = ("rollout_lag=1", "vllm_sleep_mode=false", *pi_old)
    alone, _ = train(tmp_path, "alone", 1, *settings)
    beside, _ = train(tmp_path, "beside", 1, *settings, "rollout_overlap=true")
    assert [m["reward/mean"] for m in metrics(beside)] == [m["reward/mean"] for m in metrics(alone)]
    assert all("time/step" in m for m in metrics(beside))
    assert largest_difference(alone, beside) == 0.0
    summaries = [json.loads((run_dir / "summary.json").read_text()) for run_dir in (alone, beside)]
    assert summaries[0]["eval_curve"] == summaries[1]["eval_curve"]


def test_multi_turn_episodes_through_vllm(tmp_path):
    """environment = tests/episode_envs.py:Echo (it answers at the digit 1, which the starting
    policy writes often) through the CPU build: one vLLM request per turn with the growing
    context. vLLM's log-probs of every policy turn, sampled from a prompt that holds the
    environment's answers, are the trainer's forward over the whole episode (float32 both: the
    gap of a single-turn run), and the environment's tokens are in no sampler gap."""
    from pathlib import Path
    echo = Path(__file__).resolve().parents[1] / "episode_envs.py"
    out, _ = train(tmp_path, "episodes", 1, f"environment={json.dumps(str(echo) + ':Echo')}", "max_turns=3",
                   "max_completion_length=24", "vllm_sleep_mode=false")
    history = metrics(out)
    assert all(m["episode/turns"] > 1 and m["episode/env_tokens"] > 0 for m in history)
    assert all(math.isfinite(m["loss"]) and m["sampler_gap/mean_abs"] < 1e-5 for m in history)
    assert 0 <= history[-1]["eval/tool_call_rate"] <= 1


def test_lora_trains_through_vllm(tmp_path):
    """lora_rank = 4 through the CPU build: vLLM's load_weights knows the base model's names only,
    so before every rollout it is given each adapted layer's weight with its adapter merged
    (W + (alpha / r) B A); its log-probs are then the trainer's LoRA policy's to float32 rounding
    while the adapters move (learning rate 3e-3: an adapter left out would move the log-probs by
    about 1e-2). The checkpoint holds the adapters, which trained."""
    out, _ = train(tmp_path, "lora", 1, "lora_rank=4", "lora_alpha=16.0", "learning_rate=3e-3")
    history = metrics(out)
    assert [m["step"] for m in history] == [1, 2, 3]
    assert all(math.isfinite(m["loss"]) and m["sampler_gap/mean_abs"] < 1e-5 for m in history)
    adapters = final_policy(out)
    assert adapters and all(lora.is_adapter(name) for name in adapters)
    assert min(float(v.abs().max()) for name, v in adapters.items() if ".lora_B." in name) > 1e-4
