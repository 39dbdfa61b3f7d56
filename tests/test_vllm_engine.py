"""The vLLM engine (grpo_edu/sampling/vllm_engine.py) without a GPU.

- Its calls, against the fake vllm of tests/fake_vllm (which samples with the policy and
  refuses a call out of order): the engine's arguments, the order of every rollout's calls,
  sleep mode, the trainer's RNG restored after vLLM reseeds the process, per-completion
  seeds (the rollout does not depend on how prompts are split), a mismatched sampler seen
  by the gap metric.
- The trainer through it: 3 steps in 1 process (`grpo-edu train --set engine='vllm'`, one
  warning line) and in 2 (torchrun, ddp and fsdp2), which train what 1 process trains.
- The API check: every name and argument the engine uses exists in vLLM 0.31.0. Read once
  from the release's source (tests/freeze_vllm_api.py wrote tests/vllm_api_0.31.0.json) and
  checked here; checked against the installed package too, where a real vllm imports (a
  GPU machine with the gpu extra); the fake implements exactly that surface.
- Server mode against a stand-in for TRL's client, and TRL's client API as installed.
"""

import importlib
import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from grpo_edu.environment import tasks
from grpo_edu.policy import lora
from grpo_edu.sampling import vllm_engine
from grpo_edu.training import metrics, trainer
from grpo_edu.config import TrainConfig
from grpo_edu.runtime.distributed import World
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.policy.models import STARTING_POLICY, load_policy
from grpo_edu.sampling.rollout import SamplingParams
from test_distributed import final_policy, largest_difference
from vllm_fake import FAKE_VLLM, environment_with_fake, fake_vllm
from hang_guard import HANG_SECONDS

ROOT = Path(__file__).resolve().parents[1]
FROZEN = json.loads((ROOT / "tests" / f"vllm_api_{vllm_engine.VLLM_VERSION}.json").read_text())
G, L = 4, 10


def engine(policy, tokenizer, **overrides):
    settings = dict(seed=0, gpu_memory_utilization=0.3, sleep_mode=True, dtype="float32")
    settings.update(overrides)
    return vllm_engine.VLLMEngine(str(STARTING_POLICY), policy, tokenizer, World(), **settings)


def prompts(tokenizer, n=4):
    samples = tasks.make_dataset("arithmetic", n=n, split="test", seed=0)
    encoded = tokenizer([s["prompt"] for s in samples], return_tensors="pt", padding=True, add_special_tokens=False)
    return encoded["input_ids"], encoded["attention_mask"]


def rollout_calls(calls):
    """The calls of each rollout, load_weights collapsed to one entry with the parameter count."""
    out = []
    for name, *rest in calls:
        if name == "load_weights" and out and out[-1][0] == "load_weights":
            out[-1] = ("load_weights", out[-1][1] + len(rest[0]))
        elif name == "load_weights":
            out.append(("load_weights", len(rest[0])))
        else:
            out.append((name, *rest))
    return out


# ------------------------------------------------------------------ the engine's calls

def test_engine_arguments_and_the_order_of_a_rollouts_calls():
    policy, tokenizer = load_policy(STARTING_POLICY)
    count = len(list(policy.named_parameters()))
    with fake_vllm() as vllm:
        e = engine(policy, tokenizer, seed=5, gpu_memory_utilization=0.25)
        built = vllm.CALLS[0]
        for _ in range(2):
            e.sync_weights()
            e.generate(*prompts(tokenizer), SamplingParams(G, L, 1.0), seeds=[0, 4, 8, 12])
        calls = rollout_calls(vllm.CALLS[1:])
    assert built[0] == "LLM"
    assert built[1] == {"model": str(STARTING_POLICY), "seed": 5, "dtype": "float32", "backend": "external_launcher",
                        "sleep_mode": True, "logprobs_mode": "processed_logprobs", "gpu_memory_utilization": 0.25}
    one_rollout = [("wake_up", ["weights"]), ("load_weights", count), ("reset_prefix_cache",),
                   ("wake_up", ["kv_cache"]), ("generate", 4), ("sleep", 2)]
    assert calls == [("sleep", 2)] + one_rollout * 2


def test_without_sleep_mode_the_engine_neither_sleeps_nor_wakes():
    policy, tokenizer = load_policy(STARTING_POLICY)
    with fake_vllm() as vllm:
        e = engine(policy, tokenizer, sleep_mode=False)
        e.sync_weights()
        e.generate(*prompts(tokenizer), SamplingParams(G, L, 1.0))
        calls = [c[0] for c in rollout_calls(vllm.CALLS)]
    assert calls == ["LLM", "load_weights", "reset_prefix_cache", "generate"]


def test_the_fake_refuses_what_vllm_would_get_wrong():
    """The fake's rules have teeth: a rollout that skips a step of the order fails."""
    policy, tokenizer = load_policy(STARTING_POLICY)
    ids, mask = prompts(tokenizer)
    with fake_vllm():
        e = engine(policy, tokenizer)
        with pytest.raises(RuntimeError, match="asleep"):
            e.llm.generate([{"prompt_token_ids": [1, 2]}], e._sampling_params(SamplingParams(G, L, 1.0), 0))
        e.llm.wake_up(tags=["weights"])
        e.llm.wake_up(tags=["kv_cache"])
        with pytest.raises(RuntimeError, match="discarded by sleep and not loaded"):
            e.llm.generate([{"prompt_token_ids": [1, 2]}], e._sampling_params(SamplingParams(G, L, 1.0), 0))
        model = e._model()
        model.load_weights(weights=list(vllm_engine.named_weights(policy)))
        with pytest.raises(RuntimeError, match="without reset_prefix_cache"):
            e.llm.generate([{"prompt_token_ids": [1, 2]}], e._sampling_params(SamplingParams(G, L, 1.0), 0))


def test_the_trainers_random_state_is_restored_after_vllm_reseeds_the_process():
    import random

    import numpy
    policy, tokenizer = load_policy(STARTING_POLICY)
    torch.manual_seed(123)
    random.seed(123)
    numpy.random.seed(123)
    expected = (torch.rand(3), random.random(), numpy.random.rand())
    torch.manual_seed(123)
    random.seed(123)
    numpy.random.seed(123)
    with fake_vllm() as vllm:
        engine(policy, tokenizer, seed=0)   # the fake, like vLLM, seeds torch, random and numpy with 0
        assert vllm.CALLS[0][0] == "LLM"
    got = (torch.rand(3), random.random(), numpy.random.rand())
    assert torch.equal(got[0], expected[0]) and got[1:] == expected[1:]


def test_a_seeded_generate_leaves_the_trainers_random_state_as_it_was():
    """vLLM's CPU sampler (and so the stand-in) draws noise for the whole batch from torch's
    global RNG even when every request has its own seed: generate must put the trainer's RNG
    back, or each rollout advances it by an amount that depends on the rank's batch and the
    ranks' next seeds diverge (tests/real_vllm measures it with the real library). Unseeded,
    vLLM samples from that RNG, and it advances."""
    import random

    import numpy
    policy, tokenizer = load_policy(STARTING_POLICY)
    ids, mask = prompts(tokenizer)
    with fake_vllm():
        e = engine(policy, tokenizer)
        for count in (4, 2):   # two batch sizes: two different draws, if any were left
            torch.manual_seed(7)
            random.seed(7)
            numpy.random.seed(7)
            states = (torch.get_rng_state(), random.getstate(), numpy.random.get_state()[1].copy())
            e.sync_weights()
            e.generate(ids[:count], mask[:count], SamplingParams(G, L, 1.0), seeds=[3 + b * G for b in range(count)])
            assert torch.equal(torch.get_rng_state(), states[0]), f"a {count}-prompt generate moved torch's RNG"
            assert random.getstate() == states[1]
            assert (numpy.random.get_state()[1] == states[2]).all()
        e.sync_weights()
        e.generate(ids, mask, SamplingParams(G, L, 1.0))
        assert not torch.equal(torch.get_rng_state(), states[0]), "unseeded, vLLM samples from torch's RNG"


def test_generate_while_the_weights_sleep_is_refused_by_the_engine():
    """In sleep mode, a rollout starts with sync_weights (it wakes and loads the weights). A
    generate without it is refused by the engine, on the stand-in as on vLLM, where the call
    would wait forever for a paused engine (tests/real_vllm shows both)."""
    policy, tokenizer = load_policy(STARTING_POLICY)
    ids, mask = prompts(tokenizer)
    with fake_vllm() as vllm:
        e = engine(policy, tokenizer)
        for _ in range(2):   # after start-up, and after a rollout put it back to sleep
            with pytest.raises(RuntimeError, match="the engine's weights sleep .*call sync_weights first"):
                e.generate(ids, mask, SamplingParams(G, L, 1.0), seeds=[0, 4, 8, 12])
            assert vllm.CALLS[-1][0] == "sleep", "refused before any call to vLLM"
            e.sync_weights()
            e.generate(ids, mask, SamplingParams(G, L, 1.0), seeds=[0, 4, 8, 12])


def test_the_stand_in_without_sleep_mode_only_pauses():
    """As vLLM's CPU build (measured in tests/real_vllm): without enable_sleep_mode, sleep keeps
    the weights and pauses the scheduler until every tag is awake again."""
    policy, tokenizer = load_policy(STARTING_POLICY)
    with fake_vllm():
        e = engine(policy, tokenizer, sleep_mode=False)
        e.llm.sleep(level=2)
        e.llm.wake_up(tags=["weights"])
        with pytest.raises(RuntimeError, match="asleep"):
            e.llm.generate([{"prompt_token_ids": [1, 2]}], e._sampling_params(SamplingParams(G, L, 1.0), 0))
        e.llm.wake_up(tags=["kv_cache"])
        out = e.llm.generate([{"prompt_token_ids": [1, 2]}], e._sampling_params(SamplingParams(G, L, 1.0), 0))
    assert len(out[0].outputs) == G


def test_a_completion_depends_on_its_seed_not_on_the_rest_of_the_batch():
    """The trainer seeds completion i of the batch with seed + i: sampled in one call or in two
    halves (two ranks), the completions are the same."""
    policy, tokenizer = load_policy(STARTING_POLICY)
    ids, mask = prompts(tokenizer)
    sampling = SamplingParams(G, L, 1.0)
    with fake_vllm():
        e = engine(policy, tokenizer)
        e.sync_weights()
        whole = e.generate(ids, mask, sampling, seeds=[99 + b * G for b in range(4)])
        e.sync_weights()
        first = e.generate(ids[:2], mask[:2], sampling, seeds=[99, 99 + G])
        e.sync_weights()
        second = e.generate(ids[2:], mask[2:], sampling, seeds=[99 + 2 * G, 99 + 3 * G])
    for part, rows in ((first, slice(0, 2 * G)), (second, slice(2 * G, 4 * G))):
        S = part.completion_ids.shape[1]
        assert torch.equal(part.completion_ids, whole.completion_ids[rows, :S])
        assert torch.equal(part.sampler_logp, whole.sampler_logp[rows, :S])


@pytest.mark.parametrize("mismatch", ["bf16 sampler", "raw log-probs at T = 0.7"])
def test_a_mismatched_sampler_shows_in_the_gap(mismatch):
    """The gap metric compares the trainer's recomputation with the sampler's log-probs: about
    1e-7 for the float32 fake; a bf16 sampler (vLLM's usual dtype) or log-probs taken before the
    temperature (vLLM's default logprobs_mode, which the engine does not use) show plainly."""
    policy, tokenizer = load_policy(STARTING_POLICY)
    ids, mask = prompts(tokenizer)
    T = 0.7 if "raw" in mismatch else 1.0
    gaps = {}
    with fake_vllm() as vllm:
        for label, dtype in (("float32", "float32"), (mismatch, "bfloat16" if "bf16" in mismatch else "float32")):
            e = engine(policy, tokenizer, dtype=dtype)
            if "raw" in mismatch and label == mismatch:
                e.llm._logprobs_mode = "raw_logprobs"
            e.sync_weights()
            r = e.generate(ids, mask, SamplingParams(G, L, T), seeds=[1 + b * G for b in range(4)])
            full = torch.cat([r.prompt_ids, r.completion_ids], 1)
            attention = torch.cat([r.prompt_mask, r.completion_mask.long()], 1)
            with torch.no_grad():
                recomputed = completion_logprobs(policy, full, attention, r.completion_mask, temperature=T)
            gaps[label] = metrics.sampler_gap(recomputed, r.sampler_logp, r.completion_mask)
    assert gaps["float32"]["sampler_gap/mean_abs"] < 1e-5
    assert gaps[mismatch]["sampler_gap/mean_abs"] > 1e-3
    assert gaps[mismatch]["sampler_gap/max_ratio"] > 1.01


def test_to_rollout_when_the_pad_token_is_eos():
    """Qwen-style tokenizers pad with EOS: only the generated tokens are real, the EOS that
    ends a completion among them."""
    class Tokenizer:
        eos_token_id = pad_token_id = 9

    class Completion:
        def __init__(self, index, tokens):
            self.index, self.token_ids = index, tokens
            self.logprobs = [{t: type("Logprob", (), {"logprob": -0.5})()} for t in tokens]
    rows = [[Completion(0, [3, 9]), Completion(1, [3, 4, 5])]]
    r = vllm_engine._to_rollout(torch.tensor([[1, 2]]), torch.tensor([[1, 1]]), rows, SamplingParams(2, 3), Tokenizer(),
                                (9,))
    assert r.completion_mask.tolist() == [[True, True, False], [True, True, True]]
    assert r.finished.tolist() == [True, False]
    assert r.completion_ids.tolist() == [[3, 9, 9], [3, 4, 5]]
    assert r.sampler_logp.tolist() == [[-0.5, -0.5, 0.0], [-0.5, -0.5, -0.5]]


# ------------------------------------------------------------------ training through it

SETTINGS = ["steps=3", "prompts_per_step=4", "num_generations=4", "max_completion_length=8", "eval_size=16",
            "eval_every=1000", "checkpoint_every=0", "progress=false", "threads=1", "engine='vllm'"]


def run(arguments: list[str], processes: int, log: Path, tmp_path: Path) -> subprocess.CompletedProcess:
    prefix = [sys.executable] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={processes}"]
    env = environment_with_fake(FAKE_VLLM_LOG=str(log), OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(FAKE_VLLM), str(ROOT)])
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    done = subprocess.run(prefix + ["-m", "grpo_edu", "train", *[f"--set={s}" for s in arguments]], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=HANG_SECONDS)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


def logged_calls(log: Path, rank: int) -> list:
    return [tuple(json.loads(line)) for line in Path(f"{log}.{rank}").read_text().splitlines()]


def test_grpo_edu_train_with_engine_vllm_on_the_cpu(tmp_path):
    """`grpo-edu train --set engine='vllm'` with a vllm importable and no GPU: one warning line,
    then 3 steps, each through the whole sleep/load/generate cycle, the gap logged every step."""
    out = tmp_path / "run"
    done = run(SETTINGS + [f"output_dir={out}", "vllm_gpu_memory_utilization=0.25"], 1, tmp_path / "calls", tmp_path)
    warnings = [line for line in done.stderr.splitlines() if "warning" in line.lower()]
    assert warnings == ["grpo-edu: warning: engine = 'vllm' without a GPU: vLLM samples on the CPU (vLLM's CPU "
                        "build, or a stand-in); the GPU check is `grpo-edu doctor --gpu`"]
    logged = logged_calls(tmp_path / "calls", 0)
    assert logged[0][1]["gpu_memory_utilization"] == 0.25 and logged[0][1]["seed"] == 0
    calls = [c[0] for c in rollout_calls(logged)]
    cycle = ["wake_up", "load_weights", "reset_prefix_cache", "wake_up", "generate", "sleep"]
    assert calls == ["LLM", "sleep"] + cycle * 3
    metrics = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert all(m["sampler_gap/mean_abs"] < 1e-5 and m["loss"] == m["loss"] for m in metrics)


@pytest.mark.parametrize("parallelism", ["ddp", "fsdp2"])
def test_two_processes_train_through_vllm_what_one_does(tmp_path, parallelism):
    """torchrun, 2 ranks: each builds its engine (seed + rank, external_launcher), loads the
    trainer's weights (under FSDP2 gathered from the shards) every step, samples its own
    prompts; the completions' seeds do not depend on the split, so the 2-process run trains
    what the 1-process run does (final policies within 1e-5, rewards equal). The ddp run also
    turns sleep mode off: its engines never sleep or wake."""
    sleep = parallelism == "fsdp2"
    settings = SETTINGS + [f"parallelism={parallelism}", "checkpoint_every=3", f"vllm_sleep_mode={str(sleep).lower()}"]
    if parallelism == "fsdp2":   # LoRA: vLLM gets the adapters merged, gathered from the shards (and the lazy copy has them)
        settings += ["lora_rank=4", "lora_alpha=16.0", "learning_rate=3e-3"]
    for processes in (1, 2):
        run(settings + [f"output_dir={tmp_path / str(processes)}"], processes, tmp_path / f"calls{processes}",
            tmp_path)
    for rank in (0, 1):
        calls = logged_calls(tmp_path / "calls2", rank)
        assert calls[0][0] == "LLM" and calls[0][1]["seed"] == rank
        names = [c[0] for c in rollout_calls(calls)]
        assert names.count("generate") == 3
        assert names.count("sleep") == (4 if sleep else 0) and names.count("wake_up") == (6 if sleep else 0)
    rewards = [[json.loads(line)["reward/mean"] for line in (tmp_path / str(p) / "metrics.jsonl").read_text().splitlines()]
               for p in (1, 2)]
    assert rewards[0] == rewards[1]
    assert largest_difference(tmp_path / "1", tmp_path / "2") < 1e-5
    # Under fsdp2 the whole-weights copy evaluation reads exists only while it evaluates
    # (Models.whole, gathered from the shards): its accuracies are the 1-process run's.
    summaries = [json.loads((tmp_path / str(p) / "summary.json").read_text()) for p in (1, 2)]
    assert summaries[0]["eval_curve"] == summaries[1]["eval_curve"]
    assert summaries[0]["start_accuracy"] == summaries[1]["start_accuracy"]
    samples = [(tmp_path / str(p) / "samples_after.txt").read_text() for p in (1, 2)]
    assert samples[0] == samples[1]
    if parallelism == "fsdp2":   # the stand-in samples with the weights it was given: the merged policy's
        for p in (1, 2):
            gaps = [json.loads(line)["sampler_gap/mean_abs"] for line in
                    (tmp_path / str(p) / "metrics.jsonl").read_text().splitlines()]
            assert max(gaps) < 1e-5, gaps
        adapters = final_policy(tmp_path / "2")   # the checkpoint: adapters, which trained (B starts at 0)
        assert adapters and all(lora.is_adapter(name) for name in adapters)
        assert min(float(v.abs().max()) for name, v in adapters.items() if ".lora_B." in name) > 1e-4


# ------------------------------------------------------------------ the API check

def _used_arguments(key: str) -> list[str]:
    return vllm_engine.VLLM_API[key]


def test_every_name_the_engine_uses_is_in_vllm_0_31_0():
    """VLLM_API against the names and arguments read from the 0.31.0 release's source."""
    assert FROZEN["vllm_version"] == vllm_engine.VLLM_VERSION
    assert FROZEN["names"]["vllm.__version__"]["value"] == vllm_engine.VLLM_VERSION
    for key, arguments in vllm_engine.VLLM_API.items():
        assert key in FROZEN["names"], f"{key} was not read from vllm {vllm_engine.VLLM_VERSION}"
        entry = FROZEN["names"][key]
        known = set(entry.get("parameters", [])) | set(entry.get("kwargs_parameters", []))
        missing = set(arguments) - known
        assert not missing, f"{key}: vllm {vllm_engine.VLLM_VERSION} takes no {sorted(missing)}"


def _fake_name(vllm, key: str):
    """vllm.X.Y -> the fake's object (submodules imported), or its owner and the attribute name."""
    parts = key.split(".")[1:]
    target = vllm
    if parts[0] in ("inputs", "outputs", "logprobs") and len(parts) > 1:
        target, parts = importlib.import_module(f"vllm.{parts[0]}"), parts[1:]
    for part in parts[:-1]:
        target = getattr(target, part)
    return target, parts[-1]


def test_the_fake_implements_exactly_what_the_engine_uses():
    """The fake's public names and arguments are VLLM_API's (the internal chain from
    llm_engine to the model's load_weights is walked by every test above)."""
    with fake_vllm() as vllm:
        for key, arguments in vllm_engine.VLLM_API.items():
            if key.startswith(("vllm.v1.", "vllm.model_executor.")) or key == "vllm.__version__":
                continue
            owner, name = _fake_name(vllm, key)
            if FROZEN["names"][key]["kind"] == "attribute":   # set on instances: in the source or the fields
                assert name in getattr(owner, "__annotations__", {}) or f"self.{name}" in inspect.getsource(owner), key
                continue
            target = getattr(owner, name)
            if isinstance(target, type) and issubclass(target, dict):   # a TypedDict: its keys
                accepted = list(target.__annotations__)
            else:
                accepted = [p for p in inspect.signature(target).parameters if p != "self"]
            assert sorted(accepted) == sorted(arguments), f"fake {key} takes {accepted}, the engine uses {arguments}"
        assert vllm.__version__ == vllm_engine.VLLM_VERSION
        methods = {name for name, value in vars(vllm.LLM).items() if callable(value) and not name.startswith("_")}
        assert methods == {"generate", "sleep", "wake_up", "reset_prefix_cache"}


def _real_vllm():
    spec = importlib.util.find_spec("vllm")
    if spec is None or str(FAKE_VLLM) in str(spec.origin):
        return None
    return spec


@pytest.mark.skipif(_real_vllm() is None, reason="no real vllm installed (the gpu extra); the frozen 0.31.0 "
                                                  "API is checked above")
def test_every_name_the_engine_uses_is_in_the_installed_vllm():
    import dataclasses

    import vllm
    assert vllm.__version__ == vllm_engine.VLLM_VERSION
    for key, arguments in vllm_engine.VLLM_API.items():
        if key == "vllm.__version__":
            continue
        parts = key.split(".")
        for split in range(len(parts), 0, -1):   # the longest importable module, then attributes
            try:
                target = importlib.import_module(".".join(parts[:split]))
                break
            except ImportError:
                continue
        owner, name = target, None
        for name in parts[split:]:
            owner, target = target, getattr(target, name, None)
        if target is None:   # set on instances: a field, or assigned in a method
            fields = {f.name for f in dataclasses.fields(owner)} if dataclasses.is_dataclass(owner) else set()
            assert name in fields or f"self.{name}" in inspect.getsource(owner), key
            continue
        if isinstance(target, type) and issubclass(target, dict):   # a TypedDict
            accepted = set(target.__required_keys__ | target.__optional_keys__)
        else:
            parameters = inspect.signature(target).parameters
            accepted = set(parameters)
            if key == "vllm.LLM":   # LLM(**kwargs) hands the rest to EngineArgs
                from vllm.engine.arg_utils import EngineArgs
                accepted |= {f.name for f in dataclasses.fields(EngineArgs)}
        assert set(arguments) <= accepted, f"{key}: the installed vllm takes no {sorted(set(arguments) - accepted)}"


def test_trls_client_has_what_server_mode_uses():
    for key, arguments in vllm_engine.TRL_CLIENT_API.items():
        module_name, _, attribute = key.rpartition(".")
        try:
            target = getattr(importlib.import_module(module_name), attribute)
        except ImportError:
            module_name, _, owner = module_name.rpartition(".")
            target = getattr(getattr(importlib.import_module(module_name), owner), attribute)
        parameters = inspect.signature(target).parameters
        assert set(arguments) <= set(parameters), f"{key}: trl takes {list(parameters)}"


# ------------------------------------------------------------------ the state vLLM keeps across the engine's calls

def sleep_state(llm) -> tuple[set, bool]:
    """(the tags asleep, whether the scheduler is paused) of a vllm.LLM: vLLM's own (its executor's
    sleeping_tags, its engine core's pause state) or the stand-in's."""
    if hasattr(llm, "_sleeping"):
        return set(llm._sleeping), llm._paused
    core = llm.llm_engine.engine_core.engine_core
    return set(core.model_executor.sleeping_tags), core.is_scheduler_paused()


def check_sleep_rules(llm) -> None:
    """vLLM 0.31.0's sleep bookkeeping, on an awake engine built with enable_sleep_mode (tests/real_vllm
    runs this on vLLM itself, and reads each rule from its source):
    - sleep(level >= 1) pauses the scheduler and marks both tags asleep (vllm/v1/engine/core.py
      EngineCore.sleep; vllm/v1/executor/abstract.py SLEEP_TAGS, Executor.sleep);
    - a sleep while the weights sleep changes nothing (Executor.sleep's first lines);
    - wake_up(tags) wakes those tags, and nothing at all when one of them is not asleep, or when
      nothing is (Executor.wake_up); the scheduler resumes only once no tag sleeps (EngineCore.wake_up).
    The engine wakes one tag at a time, each once: weights before loading them, the KV cache
    before generating."""
    both = {"weights", "kv_cache"}
    assert sleep_state(llm) == (set(), False)
    steps = [(lambda: llm.sleep(level=2), (both, True)),
             (lambda: llm.sleep(level=2), (both, True)),
             (lambda: llm.wake_up(tags=["weights"]), ({"kv_cache"}, True)),
             (lambda: llm.wake_up(tags=["weights", "kv_cache"]), ({"kv_cache"}, True)),
             (lambda: llm.wake_up(tags=["kv_cache"]), (set(), False)),
             (lambda: llm.wake_up(tags=["kv_cache"]), (set(), False)),
             (lambda: llm.sleep(level=1), (both, True)),
             (lambda: llm.wake_up(), (set(), False))]
    for number, (step, expected) in enumerate(steps):
        step()
        assert sleep_state(llm) == expected, f"step {number}: {sleep_state(llm)}, expected {expected}"


def test_the_stand_in_keeps_vllms_sleep_state():
    with fake_vllm() as vllm:
        check_sleep_rules(vllm.LLM(str(STARTING_POLICY), enable_sleep_mode=True, dtype="float32"))


def test_trls_client_opens_and_closes_vllms_weight_update_session_around_every_update():
    """vLLM 0.31.0's server keeps a weight-update session (vllm/v1/worker/gpu_worker.py: update_weights
    without start_weight_update, a second start, a finish without a start are refused; a failed
    update ends the session). The server engine never calls those routes itself: TRL 1.16's
    VLLMClient.update_named_params posts /start_weight_update before the weights and
    /finish_weight_update after them (read here from TRL's source), and the engine calls it once
    per sync (test_server_mode_streams_the_weights_then_samples_each_prompt_with_its_seed)."""
    from trl.generation import vllm_client
    source = inspect.getsource(vllm_client.VLLMClient.update_named_params)
    start = source.index("self._start_weight_update()")
    update = source.index('f"{self.base_url}/update_weights"')
    finish = source.index("self._finish_weight_update()")
    assert start < update < finish
    assert '"/start_weight_update"' in inspect.getsource(vllm_client.VLLMClient._start_weight_update).replace(
        "{self.base_url}", "")
    assert '"/finish_weight_update"' in inspect.getsource(vllm_client.VLLMClient._finish_weight_update).replace(
        "{self.base_url}", "")


# ------------------------------------------------------------------ server mode

class FakeClient:
    """TRL's VLLMClient's surface (TRL_CLIENT_API) over the fake vllm's LLM: a server."""

    def __init__(self, base_url, connection_timeout):
        import vllm
        self.calls = [("connect", base_url)]
        self.llm = vllm.LLM(str(STARTING_POLICY), logprobs_mode="processed_logprobs", dtype="float32")
        self.sampling = vllm.SamplingParams

    def init_communicator(self, device):
        self.calls.append(("init_communicator", str(device)))

    def update_named_params(self, metadata, named_params):
        streamed = list(named_params)
        assert [m[0] for m in metadata] == [name for name, _ in streamed]
        self.llm._model.load_weights(streamed)
        self.calls.append(("update_named_params", len(streamed)))

    def reset_prefix_cache(self):
        self.llm.reset_prefix_cache()
        self.calls.append(("reset_prefix_cache",))

    def generate(self, prompts, n, temperature, top_p, top_k, max_tokens, logprobs, generation_kwargs):
        params = self.sampling(n=n, temperature=temperature, top_p=top_p, top_k=top_k, max_tokens=max_tokens,
                               logprobs=logprobs, **generation_kwargs)
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        self.calls.append(("generate", len(prompts), generation_kwargs.get("seed")))
        rows = [c for o in outputs for c in o.outputs]
        return {"prompt_ids": [o.prompt_token_ids for o in outputs], "completion_ids": [c.token_ids for c in rows],
                "logprobs": [[[lp[t].logprob] for lp, t in zip(c.logprobs, c.token_ids)] for c in rows]}


def test_server_mode_streams_the_weights_then_samples_each_prompt_with_its_seed():
    policy, tokenizer = load_policy(STARTING_POLICY)
    ids, mask = prompts(tokenizer)
    with fake_vllm():
        e = vllm_engine.VLLMServerEngine("http://127.0.0.1:8000", policy, tokenizer, World(), client_class=FakeClient)
        with torch.no_grad():
            policy.lm_head.weight.mul_(2.0)
        e.sync_weights()
        r = e.generate(ids, mask, SamplingParams(G, L, 0.7), seeds=[5 + b * G for b in range(4)])
    count = len(list(policy.named_parameters()))
    assert e.client.calls == [("connect", "http://127.0.0.1:8000"), ("init_communicator", "cpu"),
                              ("update_named_params", count), ("reset_prefix_cache",)] + \
        [("generate", 1, 5 + b * G) for b in range(4)]
    full = torch.cat([r.prompt_ids, r.completion_ids], 1)
    attention = torch.cat([r.prompt_mask, r.completion_mask.long()], 1)
    with torch.no_grad():
        recomputed = completion_logprobs(policy, full, attention, r.completion_mask, temperature=0.7)
    assert float((recomputed - r.sampler_logp)[r.completion_mask].abs().max()) < 1e-4


def test_the_trainer_in_server_mode(tmp_path, monkeypatch):
    """vllm_mode = "server": the trainer builds the server engine for vllm_server_url and trains
    through it (here against the stand-in client)."""
    from test_trainer import small_config
    built = []

    class ServerEngine(vllm_engine.VLLMServerEngine):
        def __init__(self, url, *args, **kwargs):
            built.append(url)
            super().__init__(url, *args, client_class=FakeClient, **kwargs)
    monkeypatch.setattr(vllm_engine, "VLLMServerEngine", ServerEngine)
    with fake_vllm():
        config = small_config(tmp_path, steps=2, engine="vllm", vllm_mode="server", checkpoint_every=0,
                              vllm_server_url="http://127.0.0.1:8123")
        result = trainer.train(config, log=lambda _: None)
    assert built == ["http://127.0.0.1:8123"]
    assert len(result.history) == 2 and all(m["sampler_gap/mean_abs"] < 1e-5 for m in result.history)


def test_serve_command_binds_to_localhost_with_weight_transfer():
    command = vllm_engine.serve_command("/models/tiny")
    assert command[command.index("--host") + 1] == "127.0.0.1"
    assert command[command.index("--logprobs-mode") + 1] == "processed_logprobs"
    assert json.loads(command[command.index("--weight-transfer-config") + 1]) == {"backend": "nccl"}
    assert "serve" in command and "/models/tiny" in command


# ------------------------------------------------------------------ the key it replaced

def test_the_old_fused_llama_key_is_an_error_naming_engine(tmp_path):
    with pytest.raises(ValueError, match="'fused_llama' was replaced by 'engine': fused_llama = true is "
                                         "engine = \"fused\", false is engine = \"hf\""):
        TrainConfig.from_toml(None, ["fused_llama=false"])
    # A run directory written before the rename resumes with the equivalent engine.
    saved = TrainConfig().to_dict()
    del saved["engine"]
    saved["fused_llama"] = False
    (tmp_path / "config.json").write_text(json.dumps(saved))
    assert TrainConfig.load_run_config(tmp_path).run.engine == "hf"


def test_engine_choice_is_checked():
    with pytest.raises(ValueError, match="config key 'engine' must be one of \\('fused', 'hf', 'vllm', 'sglang'\\), got 'vlm'"):
        TrainConfig(engine="vlm")
    with pytest.raises(ValueError, match="vllm_gpu_memory_utilization' must be in \\(0, 1\\), got 1.5"):
        TrainConfig(vllm_gpu_memory_utilization=1.5)


def test_engine_vllm_without_vllm_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)   # `import vllm` raises ImportError
    with pytest.raises(ImportError, match=r"pip install -e '.\[gpu\]' \(vllm==0.31.0\)"):
        vllm_engine.import_vllm(torch.device("cpu"))


def test_grpo_edu_train_with_engine_vllm_and_no_vllm_is_one_line(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-m", "grpo_edu", "train", "--set", "engine=vllm", "--set", "steps=1",
                           "--set", f"output_dir={tmp_path / 'run'}"], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=HANG_SECONDS)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "grpo-edu train: engine: config key 'engine' is 'vllm' but vllm does not import (No module named 'vllm'); "
        "install the GPU tier with: pip install -e '.[gpu]' (vllm==0.31.0)")
