"""Rollouts sampled in the background (config key rollout_overlap, grpo_edu.training.overlap): the same run
as the lagged one without overlap, bit for bit; the sampler's weights synced between rollouts,
never during one; a checkpoint resumes it; settings it cannot serve refused in one line."""

import json

import pytest
import torch

from grpo_edu.training import asynchronous, rollouts, trainer
from grpo_edu.config import TrainConfig
from test_lagging import run, without_time
from numerics_probe import weights_digest as digest
from test_trainer import _weights, small_config, tiny


@pytest.mark.parametrize("settings", [
    {"rollout_lag": 1},
    {"rollout_lag": 3},
    {"rollout_lag": 2, "old_logprobs": "proximal", "tis_cap": 2.0},
    {"rollout_lag": 2, "old_logprobs": "sampler"},
    {"rollout_lag": 1, "engine": "hf"},
], ids=["k1", "k3", "proximal-tis", "sampler", "hf"])
def test_overlap_trains_the_lagged_run_bit_for_bit(tmp_path, settings):
    alone = run(tmp_path, "alone", **settings)
    beside = run(tmp_path, "beside", rollout_overlap=True, **settings)
    for (name, a), b in zip(_weights(alone.policy).items(), _weights(beside.policy).values()):
        assert torch.equal(a, b), f"{name} differs with rollout_overlap"
    assert without_time(beside.history) == without_time(alone.history)
    assert [m["staleness"] for m in beside.history] == [m["staleness"] for m in alone.history]


def test_the_samplers_copy_sits_at_the_policys_alignment_and_samples_what_it_samples():
    """The committed starting policy's tensors sit 56 bytes past a 64-byte boundary (read from
    its safetensors file); a plain copy is 64-aligned, and the CPU kernels round some of its
    log-probs differently (an overlapped torchrun run logged another sampler_gap). The
    sampler's copy keeps each tensor's address modulo 64, so it samples bit for bit."""
    import copy

    from grpo_edu.sampling import fused_llama
    from grpo_edu.policy.models import load_policy
    from grpo_edu.sampling.rollout import SamplingParams
    policy, tokenizer = load_policy()
    mirrored, plain = asynchronous._mirrored_copy(policy), copy.deepcopy(policy)
    offsets = {name: p.data_ptr() % asynchronous.ALIGNMENT for name, p in policy.named_parameters()}
    assert set(offsets.values()) != {0}   # the case this guards: a policy whose tensors are not 64-aligned
    assert {n: p.data_ptr() % asynchronous.ALIGNMENT for n, p in mirrored.named_parameters()} == offsets
    assert {n: p.data_ptr() % asynchronous.ALIGNMENT for n, p in plain.named_parameters()} != offsets
    for (name, a), b in zip(policy.state_dict().items(), mirrored.state_dict().values()):
        assert torch.equal(a, b) and a.data_ptr() != b.data_ptr(), name
    prompts = tokenizer(["12+34=", "7*8=", "100-1=", "5+5="] * 4, return_tensors="pt", padding=True,
                        add_special_tokens=False)
    for trial in range(8):   # here the plain copy's differ in 2 of 30 such batches (kernels vary by CPU)
        torch.manual_seed(trial)
        uniforms, sampling = torch.rand(16 * 8, 32), SamplingParams(8, 32, 1.0)
        mine, theirs = (fused_llama.FusedEngine(model, tokenizer).generate(
            prompts["input_ids"], prompts["attention_mask"], sampling, uniforms=uniforms) for model in (mirrored, policy))
        assert torch.equal(mine.completion_ids, theirs.completion_ids) and torch.equal(mine.sampler_logp, theirs.sampler_logp)


def test_the_sampler_is_synced_between_rollouts_and_never_during_one(tmp_path, monkeypatch):
    """Each background rollout starts from the weights the policy had when it was started (the
    update then running writes only the policy's), and they do not change while it samples."""
    seen = []   # per background rollout: policy at start, sampler at generate's start and end
    start = asynchronous.BackgroundSampler.start

    def spying_start(self, models, sample):
        at_start = digest(models.policy)
        generate = type(self.engine).generate

        def spying_generate(*args, **kwargs):
            first = digest(self.policy)
            out = generate(self.engine, *args, **kwargs)
            seen.append((at_start, first, digest(self.policy)))
            return out
        self.engine.generate = spying_generate   # this rollout's spy (an instance attribute, replaced each time)
        start(self, models, sample)
    monkeypatch.setattr(asynchronous.BackgroundSampler, "start", spying_start)
    result = run(tmp_path, "spied", rollout_lag=2, rollout_overlap=True, steps=6)
    assert len(seen) == 6 - 2   # rollouts 2..5 in the background; 0 and 1 before the first update
    for at_start, first, last in seen:
        assert at_start == first == last
    assert len({at_start for at_start, _, _ in seen}) == len(seen)   # synced anew each time: the policy moved
    assert result.summary["steps"] == 6


def test_an_overlapped_run_resumes_bitwise(tmp_path):
    full = run(tmp_path, "full", rollout_lag=2, rollout_overlap=True)
    run(tmp_path, "resumed", rollout_lag=2, rollout_overlap=True, stop_after=3)
    saved = torch.load(tmp_path / "resumed" / "checkpoints" / "step-000003" / "trainer_state.pt", weights_only=True)
    assert [r["sampled_at"] for r in saved["in_flight"][0]] == [1, 2]   # the joined rollout is in it
    resumed = run(tmp_path, "resumed", rollout_lag=2, rollout_overlap=True, resume=tmp_path / "resumed")
    for (name, a), b in zip(_weights(full.policy).items(), _weights(resumed.policy).values()):
        assert torch.equal(a, b), f"{name} differs after resume"
    lines = [json.loads(line) for line in (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()]
    assert without_time(lines) == without_time(full.history)


def test_an_error_in_the_sampler_thread_reaches_the_trainer(tmp_path, monkeypatch):
    def broken(self, step, engine=None, models=None, world=None):
        if step >= 1:
            raise RuntimeError("the sampler broke")
        return sample(self, step, engine, models, world)
    sample = rollouts.Sampler.sample
    monkeypatch.setattr(rollouts.Sampler, "sample", broken)
    with pytest.raises(RuntimeError, match="the sampler broke"):
        run(tmp_path, "broken", rollout_lag=1, rollout_overlap=True)


def vllm_run(tmp_path, name, **overrides):
    torch.manual_seed(0)
    config = small_config(tmp_path, output_dir=str(tmp_path / name), steps=5, engine="vllm", vllm_sleep_mode=False,
                          checkpoint_every=0, eval_every=5, **overrides)
    return trainer.train(config, log=lambda _: None)


def test_through_vllm_the_engines_weights_are_synced_in_the_main_thread_between_rollouts(tmp_path, monkeypatch):
    """engine = 'vllm' (the stand-in): vLLM's own weights are the sampler's. Every sync runs in
    the main thread, never while a rollout samples, once per rollout; the run is the one
    without overlap, bit for bit."""
    import threading

    from grpo_edu.sampling import vllm_engine
    from vllm_fake import fake_vllm
    with fake_vllm():
        alone = vllm_run(tmp_path, "alone", rollout_lag=2)
        events = []
        generate, sync = vllm_engine.VLLMEngine.generate, vllm_engine.VLLMEngine.sync_weights

        def spying_generate(self, *args, **kwargs):
            events.append(("generate", threading.current_thread() is threading.main_thread()))
            try:
                return generate(self, *args, **kwargs)
            finally:
                events.append(("generated", None))

        def spying_sync(self):
            sampling = sum(e == "generate" for e, _ in events) - sum(e == "generated" for e, _ in events)
            events.append(("sync", threading.current_thread() is threading.main_thread() and sampling == 0))
            return sync(self)
        monkeypatch.setattr(vllm_engine.VLLMEngine, "generate", spying_generate)
        monkeypatch.setattr(vllm_engine.VLLMEngine, "sync_weights", spying_sync)
        beside = vllm_run(tmp_path, "beside", rollout_lag=2, rollout_overlap=True)
    syncs = [ok for event, ok in events if event == "sync"]
    rollouts = [in_main for event, in_main in events if event == "generate"]
    assert len(syncs) == 5 and all(syncs)   # one per rollout, each in the main thread while nothing samples
    assert rollouts == [True, True, False, False, False]   # rollouts 0, 1 before the first update; 2-4 beside one
    for (name, a), b in zip(_weights(alone.policy).items(), _weights(beside.policy).values()):
        assert torch.equal(a, b), f"{name} differs with rollout_overlap"
    assert without_time(beside.history) == without_time(alone.history)


def test_through_vllm_with_pi_old_at_the_update_the_sampler_holds_no_copy(tmp_path, monkeypatch):
    """engine = 'vllm' with old_logprobs = 'proximal' (pi_old is the update's forward; TIS
    weighs the staleness): the sampler needs no weights but vLLM's, so it keeps no copy (under
    FSDP2 that copy would be whole weights on every rank), and the run is the in-turn one."""
    from vllm_fake import fake_vllm
    built = []
    init = asynchronous.BackgroundSampler.__init__

    def spying_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        built.append(self)
    monkeypatch.setattr(asynchronous.BackgroundSampler, "__init__", spying_init)
    settings = {"rollout_lag": 2, "old_logprobs": "proximal", "tis_cap": 2.0}
    with fake_vllm():
        alone = vllm_run(tmp_path, "alone", **settings)
        beside = vllm_run(tmp_path, "beside", rollout_overlap=True, **settings)
    assert len(built) == 1 and built[0].policy is None and built[0].models is None
    for (name, a), b in zip(_weights(alone.policy).items(), _weights(beside.policy).values()):
        assert torch.equal(a, b), f"{name} differs with rollout_overlap"
    assert without_time(beside.history) == without_time(alone.history)
    assert any(m["tis/mean"] != 1.0 for m in beside.history)   # the correction acted: pi_old is not the sampler


def test_settings_it_cannot_serve_are_refused_in_one_line(tmp_path):
    with pytest.raises(ValueError) as error:
        TrainConfig(rollout_overlap=True)
    assert "'rollout_overlap' is true with rollout_lag = 0" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ValueError, match="'rollout_overlap' is true with vllm_sleep_mode = true"):
        TrainConfig(rollout_overlap=True, rollout_lag=1, engine="vllm")
    TrainConfig(rollout_overlap=True, rollout_lag=1, engine="vllm", vllm_mode="server")   # no engine of its own to sleep


def test_the_benchmark_measures_every_setting_and_the_training_doc_quotes_its_file(tmp_path):
    """benchmarks/overlap.py at toy length (its figures are its own; the committed file's are
    docs/training.md's and chapter 12's); every setting trains the same weights."""
    import subprocess
    import sys
    from pathlib import Path

    from hang_guard import HANG_SECONDS
    root = Path(__file__).resolve().parent.parent
    out = tmp_path / "overlap.json"
    done = subprocess.run([sys.executable, str(root / "benchmarks" / "overlap.py"), "--steps", "3", "--repeats", "1",
                           "--out", str(out)], capture_output=True, text=True, cwd=tmp_path, timeout=HANG_SECONDS)
    assert done.returncode == 0, done.stderr[-3000:]
    figures = json.loads(out.read_text())["figures"]
    assert set(figures) == {"sequential", "overlap", "sequential, passive", "overlap, passive"}
    assert len({w for f in figures.values() for w in f["weights"]}) == 1
    assert "s/step" in done.stdout and "wrote" in done.stdout
    committed = json.loads((root / "benchmarks" / "results" / "overlap.json").read_text())["figures"]
    readme = (root / "docs" / "training.md").read_text()
    sequential, overlapped = (committed[name]["seconds_per_step"] for name in ("sequential", "overlap"))
    assert f"{sequential:.3f} s per step sequential, {overlapped:.3f} s overlapped" in " ".join(readme.split())
