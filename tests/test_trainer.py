"""The trainer, rollout, config and checkpoints, on a tiny randomly initialised model."""

import dataclasses
import json
import random

import pytest
import torch

from grpo_edu.algorithm.loss import LossSettings
from grpo_edu.environment import tasks
from grpo_edu.training import checkpoint, placement, rollouts, scoring, trainer, update, user_functions
from grpo_edu.runtime.distributed import World
from grpo_edu.config import DEFAULT_CONFIG, TrainConfig, help_text
from grpo_edu.config.keys import key_field
from grpo_edu.algorithm.logprobs import completion_logprobs
from grpo_edu.policy.models import char_tokenizer, tiny_llama
from grpo_edu.sampling.rollout import HFEngine, SamplingParams, completion_mask_from_ids

TINY = dict(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)


def tiny(seed=0):
    tokenizer = char_tokenizer()
    return tiny_llama(tokenizer, seed=seed, **TINY), tokenizer


def small_config(tmp_path, **overrides):
    values = dict(prompts_per_step=4, num_generations=4, max_completion_length=6, steps=4,
                  eval_every=2, eval_size=8, checkpoint_every=2, progress=False, threads=1,
                  output_dir=str(tmp_path / "run"))
    values.update(overrides)
    return TrainConfig(**values)


# ----------------------------------------------------------------- config

def test_defaults_are_the_cpu_tiny_config():
    assert TrainConfig.from_toml(DEFAULT_CONFIG) == TrainConfig()


def test_every_field_is_documented_in_help():
    text = help_text()
    for key in TrainConfig.keys():
        assert key_field(key).metadata["doc"] and f"    {key} (" in text


@pytest.mark.parametrize("override, message", [
    ("bogus=1", "unknown config key 'bogus'"),
    ("steps=1.5", "config key 'steps' must be an integer, got 1.5"),
    ("beta=\"x\"", "config key 'beta' must be a float, got 'x'"),
    ("loss_type=ppo", "config key 'loss_type' must be one of"),
    ("progress=1", "config key 'progress' must be true or false, got 1"),
    ("num_generations=1", "config key 'num_generations' must be >= 2"),
    ("old_logprobs=vllm", r"config key 'old_logprobs' must be one of \('recomputed', 'sampler', 'proximal'\), got 'vllm'"),
    ("warmup_steps=-1", "config key 'warmup_steps' must be >= 0, got -1"),
    ("rewards.format=x", "config key 'rewards.\\*' must be a float, got 'x'"),
    ("beta", "--set expects key=value, got 'beta'"),
])
def test_bad_config_names_the_key(override, message):
    with pytest.raises(ValueError, match=message):
        TrainConfig.from_toml(None, [override])


def test_overrides_are_typed():
    config = TrainConfig.from_toml(DEFAULT_CONFIG, ["beta=0", "task=countdown", "rewards.format=0.25"])
    assert config.loss.beta == 0.0 and isinstance(config.loss.beta, float)
    assert config.run.task == "countdown" and config.run.rewards == {"accuracy": 1.0, "format": 0.25}


def test_unknown_reward_is_named():
    with pytest.raises(ValueError, match=r"unknown reward functions \['speed'\]"):
        user_functions.reward_functions_from_config({"speed": 1.0})


# ----------------------------------------------------------------- rollout

def test_completion_mask_stops_after_the_first_eos():
    ids = torch.tensor([[5, 1, 7, 1], [5, 6, 7, 8], [1, 0, 0, 0]])
    mask, finished = completion_mask_from_ids(ids, eos_token_id=1)
    assert mask.tolist() == [[True, True, False, False], [True] * 4, [True, False, False, False]]
    assert finished.tolist() == [True, False, True]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampler_logprobs_equal_the_trainers_recomputation(temperature):
    torch.manual_seed(0)
    policy, tokenizer = tiny()
    prompts = tokenizer(["12+34-5=", "99-98+1=", "7="], return_tensors="pt", padding=True,
                        add_special_tokens=False)
    rollout = HFEngine(policy, tokenizer).generate(prompts["input_ids"], prompts["attention_mask"],
                                                   SamplingParams(4, 10, temperature))
    assert rollout.completion_ids.shape[0] == 12 and rollout.num_prompts == 3
    # prompt-major: rows 0..3 continue prompt 0
    assert torch.equal(rollout.prompt_ids[:4], prompts["input_ids"][0].expand(4, -1))
    ids = torch.cat([rollout.prompt_ids, rollout.completion_ids], 1)
    mask = torch.cat([rollout.prompt_mask, rollout.completion_mask.long()], 1)
    recomputed = completion_logprobs(policy, ids, mask, rollout.completion_mask, temperature=temperature)
    assert rollout.completion_mask.sum() > 12
    torch.testing.assert_close(rollout.sampler_logp, recomputed, atol=1e-5, rtol=0)


def test_rollout_rejects_right_padded_prompts():
    policy, tokenizer = tiny()
    with pytest.raises(ValueError, match="left-padded"):
        HFEngine(policy, tokenizer).generate(torch.tensor([[5, 6, 0]]), torch.tensor([[1, 1, 0]]),
                                             SamplingParams(2, 4))


# ----------------------------------------------------------------- the update

@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo"])
def test_gradient_accumulation_equals_one_big_batch(tmp_path, loss_type):
    """Micro-batches of 3 completions give the gradient of one batch of 16."""
    torch.manual_seed(0)
    policy, tokenizer = tiny()
    config = small_config(tmp_path, loss_type=loss_type, micro_batch_size=16, beta=0.04)
    models = placement.build_models(config, World(), policy)
    samples = rollouts.sample_prompts(config.rollout.prompts_per_step, random.Random(0), tasks.make_dataset(n=50))
    rollout = rollouts.roll_out(config, samples, tokenizer, HFEngine(policy, tokenizer))
    batch, plan = scoring.score(config, samples, rollout, tokenizer, user_functions.reward_functions_from_config({"format": 1.0}),
                                lambda r: torch.randn(r.shape, generator=torch.Generator().manual_seed(1)))
    batch = update.add_logprobs(config, models, batch, plan)
    gradients = []
    for micro in (16, 3):
        policy.zero_grad()
        config.optimisation.micro_batch_size = micro
        parts = update.micro_batches(plan, batch, 0, micro, World())
        assert len(parts) == -(-16 // micro)
        for part in parts:
            loss, _, _ = update.micro_batch_loss(LossSettings.of(config), models.train_logprobs, part,
                                                 plan.totals(0, config.loss.loss_type))
            loss.backward()
        gradients.append(torch.cat([p.grad.reshape(-1) for p in policy.parameters()]))
    torch.testing.assert_close(gradients[0], gradients[1], atol=1e-6, rtol=1e-5)
    assert gradients[0].abs().sum() > 0


def test_reference_must_not_alias_the_policy():
    policy, _ = tiny()
    with pytest.raises(ValueError, match="reference model is the policy object itself"):
        placement.check_not_aliased(policy, policy)
    shallow = __import__("copy").copy(policy)
    with pytest.raises(ValueError, match="shares memory with the policy"):
        placement.check_not_aliased(policy, shallow)
    placement.check_not_aliased(policy, placement.make_reference(policy))


def test_bad_advantage_function_is_named(tmp_path):
    policy, tokenizer = tiny()
    config = small_config(tmp_path, steps=1)
    with pytest.raises(ValueError, match=r"advantage_fn must map rewards \(B, G\) = \(4, 4\)"):
        trainer.train(config, policy=policy, tokenizer=tokenizer, advantage_fn=lambda r: r.reshape(-1),
                      log=lambda _: None)


def test_a_readers_advantage_function_is_what_trains(tmp_path):
    """Zero advantages and beta = 0: the policy must not move at all."""
    policy, tokenizer = tiny()
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    config = small_config(tmp_path, steps=2, beta=0.0)
    trainer.train(config, policy=policy, tokenizer=tokenizer, advantage_fn=torch.zeros_like, log=lambda _: None)
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())


# ----------------------------------------------------------------- runs

def _weights(model):
    return {k: v.clone() for k, v in model.state_dict().items()}


def count_digits(completions, **kwargs):
    """A reward a random model's completions disagree on, so every step moves the policy."""
    return [float(sum(ch.isdigit() for ch in c)) for c in completions]


def test_same_seed_same_weights_and_resume_is_bitwise(tmp_path):
    def run(directory, **kwargs):
        torch.manual_seed(123)  # train() must not depend on the caller's RNG
        policy, tokenizer = tiny()
        config = small_config(tmp_path, output_dir=str(tmp_path / directory), ref_sync_steps=2,
                              learning_rate=1e-2)
        return trainer.train(config, policy=policy, tokenizer=tokenizer, log=lambda _: None,
                             reward_functions={"digits": (count_digits, 1.0)}, **kwargs)

    initial = _weights(tiny()[0])
    full = run("full")
    assert not all(torch.equal(a, b) for a, b in zip(initial.values(), _weights(full.policy).values()))
    assert all(m["reward/std"] > 0 for m in full.history)
    again = run("again")
    assert all(torch.equal(a, b) for a, b in zip(_weights(full.policy).values(), _weights(again.policy).values()))

    interrupted = run("resumed", stop_after=2)
    assert not interrupted.summary["finished"] and interrupted.summary["steps"] == 2
    assert (tmp_path / "resumed" / "checkpoints" / "latest").read_text().strip() == "step-000002"
    resumed = run("resumed", resume=tmp_path / "resumed")
    for (name, a), b in zip(_weights(full.policy).items(), _weights(resumed.policy).values()):
        assert torch.equal(a, b), f"{name} differs after resume"
    lines = (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2, 3, 4]
    summary = json.loads((tmp_path / "resumed" / "summary.json").read_text())
    for key in ("start_accuracy", "final_accuracy", "steps", "seconds", "config"):
        assert key in summary
    assert summary["steps"] == 4 and summary["finished"]


def test_checkpoint_files_load_without_pickle(tmp_path):
    policy, tokenizer = tiny()
    trainer.train(small_config(tmp_path, steps=2), policy=policy, tokenizer=tokenizer, log=lambda _: None)
    folder = checkpoint.latest(tmp_path / "run")
    assert sorted(p.name for p in folder.iterdir()) == ["policy.safetensors", "reference.safetensors",
                                                       "trainer_state.pt"]
    state = torch.load(folder / "trainer_state.pt", weights_only=True)
    assert state["step"] == 2
    assert not list((tmp_path / "run" / "checkpoints").glob(".*tmp"))


def test_metrics_cover_the_documented_keys(tmp_path):
    policy, tokenizer = tiny()
    result = trainer.train(small_config(tmp_path, steps=2), policy=policy, tokenizer=tokenizer, log=lambda _: None)
    metrics = result.history[-1]
    for key in ("reward/mean", "reward/std", "reward/accuracy", "reward/format", "zero_std_groups",
                "completion_length/mean", "completion_length/min", "completion_length/max", "truncated",
                "kl", "clip_ratio/low", "clip_ratio/high", "entropy", "grad_norm",
                "time/rollout", "time/scoring", "time/update", "eval/greedy_accuracy"):
        assert key in metrics, key


def test_filtering_zero_std_groups_skips_groups_that_agree(tmp_path):
    """The zero-std filter: with every group's rewards equal there is nothing to update on;
    with rewards that differ, the update happens."""
    policy, tokenizer = tiny()
    before = _weights(policy)
    config = small_config(tmp_path, steps=2, filter_zero_std_groups=True, learning_rate=1e-2)
    constant = {"constant": (lambda completions, **kwargs: [1.0] * len(completions), 1.0)}
    result = trainer.train(config, policy=policy, tokenizer=tokenizer, reward_functions=constant,
                           log=lambda _: None)
    assert all(m["skipped_update"] == 1.0 and m["zero_std_groups"] == 1.0 for m in result.history)
    assert all(torch.equal(before[k], v) for k, v in policy.state_dict().items())

    result = trainer.train(small_config(tmp_path, steps=2, filter_zero_std_groups=True, learning_rate=1e-2,
                                        output_dir=str(tmp_path / "mixed")),
                           policy=policy, tokenizer=tokenizer, reward_functions={"digits": (count_digits, 1.0)},
                           log=lambda _: None)
    assert "skipped_update" not in result.history[-1]
    assert not all(torch.equal(before[k], v) for k, v in policy.state_dict().items())


def test_fused_and_transformers_paths_give_the_same_update(tmp_path):
    """engine = "fused" changes how the numbers are computed, not which: the same
    rollout gives the same reference log-probs, loss and gradient either way."""
    torch.manual_seed(0)
    policy, tokenizer = tiny()
    samples = rollouts.sample_prompts(small_config(tmp_path).rollout.prompts_per_step, random.Random(0),
                                     tasks.make_dataset(n=50))
    rollout = rollouts.roll_out(small_config(tmp_path), samples, tokenizer, HFEngine(policy, tokenizer))
    results = []
    for fused in (True, False):
        config = small_config(tmp_path, beta=0.04, engine="fused" if fused else "hf", micro_batch_size=8)
        models = placement.build_models(config, World(), policy)
        batch, plan = scoring.score(config, samples, rollout, tokenizer,
                                    user_functions.reward_functions_from_config({"format": 1.0}),
                                    lambda r: torch.linspace(-1, 1, r.numel()).view(r.shape))
        batch = update.add_logprobs(config, models, batch, plan)
        policy.zero_grad()
        losses = []
        for part in update.micro_batches(plan, batch, 0, config.optimisation.micro_batch_size, World()):
            loss, _, _ = update.micro_batch_loss(LossSettings.of(config), models.train_logprobs, part,
                                                 plan.totals(0, config.loss.loss_type))
            loss.backward()
            losses.append(loss.item())
        assert len(losses) == 2
        results.append((batch.ref_logp, sum(losses), torch.cat([p.grad.reshape(-1) for p in policy.parameters()])))
    (ref_f, loss_f, grad_f), (ref_t, loss_t, grad_t) = results
    torch.testing.assert_close(ref_f, ref_t, rtol=0, atol=1e-5)
    assert loss_f == pytest.approx(loss_t, abs=1e-6)
    torch.testing.assert_close(grad_f, grad_t, rtol=1e-4, atol=1e-6)


def test_the_transformers_path_trains(tmp_path):
    policy, tokenizer = tiny()
    before = _weights(policy)
    result = trainer.train(small_config(tmp_path, steps=2, engine="hf", learning_rate=1e-2), policy=policy,
                           tokenizer=tokenizer, reward_functions={"digits": (count_digits, 1.0)}, log=lambda _: None)
    assert result.summary["steps"] == 2
    assert not all(torch.equal(before[k], v) for k, v in policy.state_dict().items())


def test_a_lazy_whole_copy_holds_no_memory_outside_whole():
    """Models.whole on a lazy copy (FSDP2 with vLLM): on the meta device, materialised with the
    policy's weights inside the block, released after (kept with keep=True)."""
    policy, _ = tiny()
    with torch.device("meta"):
        copy = type(policy)(policy.config)
    models = placement.Models(policy, None, copy, policy, None, lazy=True)
    assert all(p.is_meta for p in copy.parameters())
    with models.whole() as whole:
        assert all(torch.equal(a, b) for a, b in zip(whole.state_dict().values(), policy.state_dict().values()))
    assert all(p.is_meta for p in copy.parameters())
    with models.whole(keep=True) as whole:
        pass
    assert not any(p.is_meta for p in whole.parameters())


@pytest.mark.parametrize("overrides", [{}, {"rollout_lag": 1}, {"rollout_lag": 1, "rollout_overlap": True}])
def test_a_finished_run_is_freed_at_once(tmp_path, overrides):
    """No reference cycle holds a run: its models (under torchrun, DDP's and FSDP2's wrappers and
    their process group) go when the run does, not at the garbage collector's whim, which may
    be interpreter exit, after the process group is gone (measured: rank aborts, "terminate
    called without an active exception", when the rollout source held the run)."""
    import gc
    import weakref
    gc.disable()
    try:
        run = trainer.set_up(small_config(tmp_path, steps=2, checkpoint_every=0, **overrides), log=lambda _: None)
        freed = weakref.ref(run)
        trainer.loop(run)
        del run
        assert freed() is None
    finally:
        gc.enable()
