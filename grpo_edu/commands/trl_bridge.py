"""A bridge to TRL: our config, rewards and task as TRL 1.16's GRPOConfig and GRPOTrainer.

For readers who want TRL's production features (DeepSpeed, PEFT, its vLLM integration)
with the run they set up here:

    from grpo_edu.config import TrainConfig
    from grpo_edu.commands.trl_bridge import grpo_trainer
    grpo_trainer(TrainConfig.from_toml("configs/cpu-tiny.toml", ["advantage_std=sample"])).train()

Every TrainConfig key says, beside its own doc (grpo_edu.config.sections), what becomes of it
here: carried to a GRPOConfig argument (trl=), carried only at the one value TRL reproduces
(trl_only=), or carried in another form or of no effect (trl_note=). A setting TRL cannot
reproduce is a one-line error naming the key (`_refusals`), never dropped. Mapped, the loss is the one tests/test_trl_parity.py holds equal to
grpo_edu's to 1e-6 (use_bias_correction_kl = False), on the same data sizes per optimizer
step. What stays different, by TRL's design and not by a setting: its advantages divide by
the sample std + 1e-4 (ours + 1e-8), and it splits a generation batch into optimizer steps
by shuffled completions where grpo_edu deals out whole groups (the loss of a step is the
same function; which completions share a step differs).
"""

from __future__ import annotations

import os

from grpo_edu.algorithm.surrogates import SURROGATES
from grpo_edu.config import TrainConfig
from grpo_edu.config.files import toml_value
from grpo_edu.config.keys import key_field
from grpo_edu.environment import tasks

def _metadata(rule: str) -> dict[str, object]:
    """{key: its `rule` metadata} over every config key that has one (grpo_edu.runtime.settings:
    trl, trl_only, trl_note), read from the sections, where each key documents it."""
    found = {}
    for key in TrainConfig.keys():
        value = key_field(key).metadata.get(rule)
        if value is not None:
            found[key] = value
    return found


def carried() -> dict[str, str]:
    """Keys carried to a GRPOConfig argument of the same meaning: key -> the argument."""
    return _metadata("trl")


def only_value() -> dict[str, tuple]:
    """Keys with the one value TRL reproduces: key -> (that value, why another is refused)."""
    return _metadata("trl_only")


def not_carried() -> dict[str, str]:
    """Keys carried in another form, or that do not change what is computed: key -> what becomes of it."""
    return _metadata("trl_note")


def _shown(value) -> str:
    """A value as a config file writes it (true, 4, 'k1')."""
    return toml_value(value) if isinstance(value, bool) else repr(value)


def _refusals(config: TrainConfig) -> list[str]:
    """Why each setting TRL cannot reproduce cannot be carried over: first each key set to other than
    the one value TRL reproduces (its trl_only), then the combinations TRL does not have."""
    out = []
    for key, (value, why) in only_value().items():
        if config.value(key) != value:
            out.append(f"{key} = {_shown(config.value(key))}: {why}")
    off_policy, loss, engine = config.off_policy, config.loss, config.run.engine
    if off_policy.old_logprobs == "sampler":   # 'recomputed' and 'proximal' (without lag) are TRL's
        out.append(f"old_logprobs = {off_policy.old_logprobs!r}: TRL recomputes pi_old")
    if off_policy.tis_cap and engine != "vllm":
        out.append(f"tis_cap = {off_policy.tis_cap} with engine = {engine!r}: TRL corrects vLLM's samples only")
    if off_policy.is_mask == "sequence":
        out.append("is_mask = 'sequence': TRL's sequence_mask takes the product of the ratios, not their geometric "
                   "mean, and weighs each kept response by it")
    elif off_policy.is_mask != "none" and engine != "vllm":
        out.append(f"is_mask = {off_policy.is_mask!r} with engine = {engine!r}: TRL corrects vLLM's samples only")
    trl_surrogate = SURROGATES[loss.surrogate].trl_loss_type   # TRL names it by a loss_type of its own
    if trl_surrogate and (loss.loss_type != "dapo" or loss.importance_sampling_level != "token"):
        out.append(f"surrogate = {loss.surrogate!r} with loss_type = {loss.loss_type!r}, importance_sampling_level = "
                   f"{loss.importance_sampling_level!r}: TRL's {trl_surrogate} loss aggregates as dapo, per token")
    if loss.top_entropy_quantile < 1 and _accumulation(config) > 1:
        out.append(f"top_entropy_quantile = {loss.top_entropy_quantile} with {_accumulation(config)} micro-batches "
                   f"per optimizer step: TRL takes the entropy quantile per micro-batch, grpo_edu per optimizer step "
                   f"(set micro_batch_size to the completions per process per optimizer step)")
    if config.run.parallelism == "fsdp2" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
        out.append("parallelism = 'fsdp2': launch TRL with an accelerate FSDP2 config instead "
                   "(accelerate launch --config_file ...)")
    return out


def _accumulation(config: TrainConfig) -> int:
    try:
        return batch_sizes(config, int(os.environ.get("WORLD_SIZE", "1")))["gradient_accumulation_steps"]
    except ValueError:   # sizes TRL cannot split: grpo_config refuses them itself
        return 1


def batch_sizes(config: TrainConfig, processes: int = 1) -> dict[str, int]:
    """Our rollout (B x G completions, num_mini_batches optimizer steps per pass, micro-batches of
    micro_batch_size) as TRL's: per-device micro-batch, gradient accumulation, and the micro-steps
    per generation batch."""
    optimisation = config.optimisation
    completions = config.rollout.prompts_per_step * config.rollout.num_generations
    per_step = completions // optimisation.num_mini_batches
    if per_step % processes:
        raise ValueError(f"config key 'prompts_per_step': {per_step} completions per optimizer step do not "
                         f"divide among {processes} processes")
    per_process = per_step // processes
    micro = min(optimisation.micro_batch_size, per_process)
    if per_process % micro:
        raise ValueError(f"config key 'micro_batch_size' ({optimisation.micro_batch_size}) must divide the "
                         f"completions per process per optimizer step ({per_process}) for TRL's gradient accumulation")
    accumulation = per_process // micro
    return {"per_device_train_batch_size": micro, "gradient_accumulation_steps": accumulation,
            "steps_per_generation": optimisation.num_mini_batches * accumulation,
            "generation_batch_size": completions}


def grpo_config(config: TrainConfig, output_dir: str | None = None, **overrides):
    """TRL's GRPOConfig for `config` (overrides: any GRPOConfig argument, applied last)."""
    from trl import GRPOConfig

    refused = _refusals(config)
    if refused:
        raise ValueError(f"config key {refused[0].split(' =')[0]!r} cannot be carried over to TRL: {refused[0]}")
    run, rollout, optimisation, loss, logging = config.run, config.rollout, config.optimisation, config.loss, config.logging
    K = optimisation.num_iterations * optimisation.num_mini_batches
    schedule = {"cosine": "cosine", "linear": "linear",
                "constant": "constant_with_warmup" if optimisation.warmup_steps else "constant"}[optimisation.lr_schedule]
    bf16 = run.precision == "bf16" or (run.precision == "auto" and run.device == "cuda")
    arguments = dict(
        output_dir=output_dir or logging.output_dir, seed=run.seed, max_steps=optimisation.steps * K,
        num_generations=rollout.num_generations, num_iterations=optimisation.num_iterations,
        max_completion_length=rollout.max_completion_length, temperature=rollout.temperature, top_k=0, top_p=1.0,
        learning_rate=optimisation.learning_rate, lr_scheduler_type=schedule, warmup_steps=optimisation.warmup_steps * K,
        weight_decay=optimisation.weight_decay, adam_beta1=optimisation.adam_betas[0],
        adam_beta2=optimisation.adam_betas[1], max_grad_norm=optimisation.max_grad_norm, loss_type=loss.loss_type,
        beta=loss.beta, epsilon=loss.epsilon, epsilon_high=loss.epsilon_high,
        importance_sampling_level=loss.importance_sampling_level, top_entropy_quantile=loss.top_entropy_quantile,
        scale_rewards=config.advantages.advantage_scale, use_bias_correction_kl=False,
        mask_truncated_completions=loss.mask_truncated_completions,
        sync_ref_model=bool(loss.ref_sync_steps), ref_model_sync_steps=max(1, loss.ref_sync_steps * K),
        ref_model_mixup_alpha=loss.ref_mixup_alpha, bf16=bf16, use_cpu=run.device == "cpu",
        disable_tqdm=not logging.progress, save_strategy="steps" if logging.checkpoint_every else "no",
        save_steps=max(1, logging.checkpoint_every * K), report_to="none", logging_strategy="steps", logging_steps=1,
        use_vllm=run.engine == "vllm",
        **batch_sizes(config, int(os.environ.get("WORLD_SIZE", "1"))))
    if run.engine == "vllm":
        vllm, off_policy = config.vllm, config.off_policy
        masking = off_policy.is_mask != "none"
        arguments.update(vllm_mode=vllm.vllm_mode, vllm_gpu_memory_utilization=vllm.vllm_gpu_memory_utilization,
                         vllm_enable_sleep_mode=vllm.vllm_sleep_mode,
                         vllm_server_base_url=vllm.vllm_server_url if vllm.vllm_mode == "server" else None,
                         vllm_importance_sampling_correction=bool(off_policy.tis_cap) or masking,
                         vllm_importance_sampling_mode="token_truncate" if off_policy.tis_cap else "token_mask",
                         vllm_importance_sampling_clip_min=off_policy.is_mask_band[0] if masking else None,
                         vllm_importance_sampling_clip_max=off_policy.tis_cap or (
                             off_policy.is_mask_band[1] if masking else None))
    trl_surrogate = SURROGATES[config.loss.surrogate].trl_loss_type
    if trl_surrogate:   # TRL's cispo: the capped surrogate, its cap in epsilon_high
        arguments.update(loss_type=trl_surrogate, epsilon_high=config.loss.ratio_cap)
    arguments.pop("generation_batch_size")   # TRL derives it from the three above; passing both is an error
    arguments.update(overrides)
    return GRPOConfig(**arguments)


def peft_config(config: TrainConfig):
    """LoRA (lora_rank > 0) as the peft LoraConfig GRPOTrainer takes: the adapters grpo_edu.policy.lora
    injects (rank, alpha, the target layers, no dropout, no bias); None for full fine-tuning."""
    if not config.lora.lora_rank:
        return None
    from peft import LoraConfig
    return LoraConfig(r=config.lora.lora_rank, lora_alpha=config.lora.lora_alpha, lora_dropout=0.0, bias="none",
                      target_modules=list(config.lora.lora_target_modules), task_type="CAUSAL_LM")


def reward_functions(config: TrainConfig) -> tuple[list, list[float]]:
    """The config's reward functions (built-in by name, the reader's by import path) and weights."""
    from grpo_edu.training.user_functions import reward_functions_from_config
    functions, weights = [], []
    for name, (function, weight) in reward_functions_from_config(config.run.rewards, config.run.unboxed_answers).items():
        functions.append(_named(function, name))
        weights.append(weight)
    if config.loss.overlong_cache:   # the term grpo_edu.training.scoring adds, weight 1: TRL's own function
        from trl.rewards import get_soft_overlong_punishment
        punishment = get_soft_overlong_punishment(config.rollout.max_completion_length, config.loss.overlong_cache)

        def overlong(completions, completion_ids, **kwargs):
            return punishment(completion_ids)
        functions.append(overlong)
        weights.append(1.0)
    return functions, weights


def _named(function, name: str):
    """The function under the config's name (TRL logs each reward as rewards/<__name__>/...)."""
    def reward(completions, **kwargs):
        return function(completions, **kwargs)
    reward.__name__ = reward.__qualname__ = name
    return reward


def train_dataset(config: TrainConfig, size: int = 10_000):
    """The task's training problems as a datasets.Dataset: prompt (text, with the task's instruction
    when config.data.task_instruction, as a user message when config.data.chat_template) and the columns
    the rewards read."""
    from datasets import Dataset
    samples = tasks.training_problems(config.run.task, config.data.dataset, size)
    rows = []
    for sample in samples:
        row = tasks.with_instruction(sample) if config.data.task_instruction else dict(sample)
        if config.data.chat_template:
            row["prompt"] = [{"role": "user", "content": row["prompt"]}]
        rows.append(row)
    return Dataset.from_list(rows)


def grpo_trainer(config: TrainConfig, *, model=None, tokenizer=None, dataset=None, **trainer_kwargs):
    """TRL's GRPOTrainer for `config`: its policy (config.run.model; 'start' is the committed tiny
    policy), task and rewards, and with lora_rank > 0 its LoRA adapters (peft_config). trainer_kwargs
    go to GRPOTrainer (callbacks, a peft_config of your own, ...). The model's generation config is
    given every EOS id of the model's files, so that TRL's completions end where grpo_edu's do."""
    from trl import GRPOTrainer

    from grpo_edu.policy.models import eos_token_ids, load_policy, policy_source
    args = grpo_config(config)
    if model is None:
        model, tokenizer = load_policy(policy_source(config.run.model))
    if tokenizer is not None and getattr(model, "generation_config", None) is not None:
        # TRL 1.16 ends a completion at the generation config's EOS ids and the tokenizer's; grpo_edu's
        # engines at config.json's too (eos_token_ids). Named in the generation config, all end alike.
        model.generation_config.eos_token_id = list(eos_token_ids(model, tokenizer))
    functions, weights = reward_functions(config)
    args.reward_weights = weights
    if config.lora.lora_rank and "peft_config" not in trainer_kwargs:
        trainer_kwargs["peft_config"] = peft_config(config)
    return GRPOTrainer(model=model, args=args, reward_funcs=functions,
                       train_dataset=dataset if dataset is not None else train_dataset(config),
                       processing_class=tokenizer, **trainer_kwargs)

