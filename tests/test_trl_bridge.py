"""grpo_edu.commands.trl_bridge: our config, task and rewards as TRL 1.16's GRPOConfig and GRPOTrainer.
Two rollouts train through it on the CPU; its loss settings give TRL's loss equal to ours to
1e-6 (the parity tests' claim, for the bridged trainer); every config key is carried, or said
what becomes of it, or refused in one line; the batch arithmetic is ours."""

import dataclasses
import math
import warnings

import pytest
import torch

pytest.importorskip("trl", reason="the TRL bridge needs the `trl` extra")

from grpo_edu.commands import trl_bridge  # noqa: E402
from grpo_edu.config import TrainConfig  # noqa: E402
from grpo_edu.algorithm.loss import grpo_loss  # noqa: E402
from test_trl_parity import B, G, MAX_COMPLETION_LENGTH, S, fabricated_batch, policy_dir, trl_loss  # noqa: E402,F401

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::UserWarning")


def bridged(tmp_path, **values):
    settings = dict(advantage_std="sample", progress=False, checkpoint_every=0, output_dir=str(tmp_path / "trl"))
    settings.update(values)
    return TrainConfig(**settings)


def test_two_rollouts_train_through_the_bridge(tmp_path):
    config = bridged(tmp_path, steps=2, prompts_per_step=4, num_generations=4, max_completion_length=8,
                     num_mini_batches=2, micro_batch_size=4)
    trainer = trl_bridge.grpo_trainer(config)
    result = trainer.train()
    assert result.global_step == 4   # 2 rollouts x 2 optimizer steps
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 4 and all(math.isfinite(loss) for loss in losses)
    logged = {key for entry in trainer.state.log_history for key in entry}
    assert {"rewards/accuracy/mean", "rewards/format/mean"} <= logged   # our reward names


def test_trls_completions_end_at_every_eos_id_of_the_models_files(tmp_path):
    """TRL 1.16 ends a completion at generation_config's EOS ids and the tokenizer's (read here from
    its source); the bridge names config.json's there too, so TRL's 'finished' is every engine's."""
    import inspect
    import json
    import shutil
    from trl import GRPOTrainer
    from grpo_edu.policy.models import STARTING_POLICY, load_policy
    source = inspect.getsource(GRPOTrainer.__init__)
    assert "eos_token_ids = model.generation_config.eos_token_id" in source
    model_dir = tmp_path / "model"
    shutil.copytree(STARTING_POLICY, model_dir)
    _, tokenizer = load_policy(model_dir)
    think = tokenizer.convert_tokens_to_ids("</think>")
    config_json = json.loads((model_dir / "config.json").read_text())
    (model_dir / "config.json").write_text(json.dumps({**config_json, "eos_token_id": [tokenizer.eos_token_id, think]}))
    model, tokenizer = load_policy(model_dir)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id   # config.json's second id is not there
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = trl_bridge.grpo_trainer(bridged(tmp_path, prompts_per_step=2, num_generations=2), model=model,
                                          tokenizer=tokenizer)
    assert sorted(trainer.eos_token_ids) == sorted([tokenizer.eos_token_id, think])


LOSSES = [dict(loss_type=t, beta=b) for t in ("grpo", "bnpo", "dr_grpo", "dapo") for b in (0.0, 0.04)] + \
    [dict(loss_type="dapo", beta=0.04, epsilon_high=0.28, importance_sampling_level="sequence")]


@pytest.mark.parametrize("settings", LOSSES, ids=lambda s: "-".join(f"{k}={v}" for k, v in s.items()))
def test_the_bridged_loss_equals_ours(tmp_path, policy_dir, settings):
    from datasets import Dataset
    from trl import GRPOTrainer
    config = bridged(tmp_path, prompts_per_step=B, num_generations=G, max_completion_length=MAX_COMPLETION_LENGTH,
                     micro_batch_size=B * G, device="cpu", **settings)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GRPOTrainer(model=str(policy_dir), args=trl_bridge.grpo_config(config),
                              reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
                              train_dataset=Dataset.from_dict({"prompt": ["1+1="] * B}))
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = 1
    logp, old, ref, advantages, mask = fabricated_batch(0)
    num_items = int(mask.sum())
    theirs, _ = trl_loss(trainer, logp, old, ref, advantages, mask, num_items)
    ours = grpo_loss(logp.view(B, G, S), old.view(B, G, S), advantages.view(B, G), mask.view(B, G, S),
                     ref_logp=ref.view(B, G, S), beta=config.loss.beta, epsilon=config.loss.epsilon,
                     epsilon_high=config.loss.epsilon_high, loss_type=config.loss.loss_type,
                     max_completion_length=config.rollout.max_completion_length,
                     importance_sampling_level=config.loss.importance_sampling_level, num_items=num_items)
    assert abs(ours.loss.item() - theirs.item()) <= 1e-6


def test_every_key_is_carried_or_said_what_becomes_of_it():
    """Beside its own doc in its section, each key says what becomes of it in TRL: carried (trl=),
    carried at one value only (trl_only=), or in another form (trl_note=); exactly one of them."""
    keys = set(TrainConfig.keys())
    tables = (trl_bridge.carried(), trl_bridge.not_carried(), trl_bridge.only_value())
    decided = set().union(*tables)
    assert keys - decided == set(), f"no decision for {sorted(keys - decided)}"
    assert decided - keys == set()
    assert sum(len(table) for table in tables) == len(keys), "a key with two decisions"
    assert not hasattr(trl_bridge, "CARRIED") and not hasattr(trl_bridge, "NOT_CARRIED")


@pytest.mark.parametrize("key, value", [("seed", 7), ("num_iterations", 2), ("max_completion_length", 9),
                                        ("temperature", 0.7), ("learning_rate", 1e-5), ("weight_decay", 0.1),
                                        ("max_grad_norm", 0.5), ("loss_type", "dapo"), ("beta", 0.0),
                                        ("epsilon", 0.1), ("epsilon_high", 0.28),
                                        ("importance_sampling_level", "sequence")])
def test_each_carried_key_reaches_trl(tmp_path, key, value):
    args = trl_bridge.grpo_config(bridged(tmp_path, **{key: value}))
    assert getattr(args, trl_bridge.carried()[key]) == value


def test_keys_carried_in_another_form(tmp_path):
    config = bridged(tmp_path, steps=10, num_mini_batches=2, num_iterations=2, warmup_steps=3, ref_sync_steps=5,
                     checkpoint_every=4, advantage_scale="batch", lr_schedule="linear", adam_betas=[0.8, 0.95])
    args = trl_bridge.grpo_config(config)
    assert (args.max_steps, args.warmup_steps, args.ref_model_sync_steps, args.save_steps) == (40, 12, 20, 16)
    assert args.sync_ref_model and args.scale_rewards == "batch" and args.lr_scheduler_type == "linear"
    assert (args.adam_beta1, args.adam_beta2) == (0.8, 0.95) and args.use_bias_correction_kl is False


def test_the_trl_dataset_reads_the_prompts_our_trainer_reads():
    """task_instruction and chat_template shape train_dataset's prompts as they shape
    grpo_edu.environment.tasks.task_pools': the instruction after the problem, inside a user message."""
    from grpo_edu.environment import tasks
    plain = trl_bridge.train_dataset(TrainConfig(task="countdown"), size=3)
    told = trl_bridge.train_dataset(TrainConfig(task="countdown", task_instruction=True, chat_template=True), size=3)
    instruction = tasks.TASKS["countdown"].instruction
    assert [row["prompt"] for row in told] == [[{"role": "user", "content": f"{row['prompt']}\n{instruction}\n"}]
                                               for row in plain]
    assert [row["numbers"] for row in told] == [row["numbers"] for row in plain]


@pytest.mark.parametrize("key, value, message", [
    ("advantage_std", "population", "TRL divides by the sample std"),
    ("kl_estimator", "k2", "TRL's KL term is k3"),
    ("filter_zero_std_groups", True, "TRL has no zero-std filter"),
    ("old_logprobs", "sampler", "TRL recomputes pi_old"),
    ("rollout_lag", 2, "rollout_lag = 2: TRL.s GRPOTrainer samples each rollout with the current policy"),
    ("tis_cap", 2.0, "TRL corrects vLLM's samples only"),
    ("advantage_fn", "my_solutions:advantages", "TRL computes its own advantages"),
])
def test_what_trl_cannot_reproduce_is_refused(tmp_path, key, value, message):
    settings = {key: value, **({"advantage_std": "population"} if key == "advantage_fn" else {})}
    with pytest.raises(ValueError, match=f"config key '{key}' cannot be carried over to TRL: .*{message}"):
        trl_bridge.grpo_config(bridged(tmp_path, **settings))


@pytest.mark.parametrize("B_, G_, M, micro, processes", [(16, 8, 1, 128, 1), (16, 8, 2, 16, 1), (16, 8, 4, 8, 2),
                                                         (64, 8, 4, 32, 1)])
def test_batch_arithmetic_is_ours(B_, G_, M, micro, processes):
    config = TrainConfig(prompts_per_step=B_, num_generations=G_, num_mini_batches=M, micro_batch_size=micro)
    sizes = trl_bridge.batch_sizes(config, processes)
    per_optimizer_step = sizes["per_device_train_batch_size"] * sizes["gradient_accumulation_steps"] * processes
    assert per_optimizer_step == B_ * G_ // M                                   # completions per optimizer step
    assert sizes["steps_per_generation"] // sizes["gradient_accumulation_steps"] == M   # optimizer steps per pass
    assert sizes["per_device_train_batch_size"] * processes * sizes["steps_per_generation"] == B_ * G_
