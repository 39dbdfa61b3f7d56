"""A bridge to TRL: our config, rewards and task as TRL 1.16's GRPOConfig and GRPOTrainer.

For readers who want TRL's production features (DeepSpeed, PEFT, its vLLM integration)
with the run they set up here:

    from grpo_edu.training.config import TrainConfig
    from grpo_edu.commands.trl_bridge import grpo_trainer
    grpo_trainer(TrainConfig.from_toml("configs/cpu-tiny.toml", ["advantage_std=sample"])).train()

Every TrainConfig key is either mapped (`grpo_config`) or listed in NOT_CARRIED with what
becomes of it; a setting TRL cannot reproduce is a one-line error naming the key (REFUSED),
never dropped. Mapped, the loss is the one tests/test_trl_parity.py holds equal to
grpo_edu's to 1e-6 (use_bias_correction_kl = False), on the same data sizes per optimizer
step. What stays different, by TRL's design and not by a setting: its advantages divide by
the sample std + 1e-4 (ours + 1e-8), and it splits a generation batch into optimizer steps
by shuffled completions where grpo_edu deals out whole groups (the loss of a step is the
same function; which completions share a step differs).
"""

from __future__ import annotations

import os

from grpo_edu.environment import tasks
from grpo_edu.training.config import TrainConfig

# Keys carried to a GRPOConfig argument of the same meaning.
CARRIED = {
    "seed": "seed", "num_generations": "num_generations", "num_iterations": "num_iterations",
    "max_completion_length": "max_completion_length", "temperature": "temperature",
    "learning_rate": "learning_rate", "weight_decay": "weight_decay", "max_grad_norm": "max_grad_norm",
    "loss_type": "loss_type", "beta": "beta", "epsilon": "epsilon", "epsilon_high": "epsilon_high",
    "importance_sampling_level": "importance_sampling_level", "vllm_mode": "vllm_mode",
    "vllm_gpu_memory_utilization": "vllm_gpu_memory_utilization", "top_entropy_quantile": "top_entropy_quantile",
    "mask_truncated_completions": "mask_truncated_completions",
}
# Keys with the one value TRL reproduces: any other is refused (_refusals).
ONLY_VALUE = {"advantage_std": "sample", "advantage_fn": "", "kl_estimator": "k3", "filter_zero_std_groups": False,
              "dynamic_sampling_rounds": 0, "rollout_lag": 0, "environment": "", "supervision": "outcome"}

# Keys carried in another form, or that do not change what is computed: what becomes of them.
NOT_CARRIED = {
    "threads": "torch's CPU thread count: set it in the launching process (torch.set_num_threads)",
    "rollout_overlap": "when grpo_edu's sampler runs (the numbers are the same either way); it needs rollout_lag, "
                       "which the bridge refuses",
    "max_turns": "used with environment only, which the bridge refuses (TRL 1.16's tool training calls Python "
                 "functions through the chat template's tool-call format, not a text environment with a stop token)",
    "eval_every": "grpo_edu's held-out greedy accuracy; TRL evaluates an eval_dataset (eval_strategy)",
    "eval_size": "as eval_every",
    "eval_samples": "as eval_every (pass@k and maj@k on the held-out problems)",
    "engine": "'fused', 'hf' and 'sglang' become TRL's transformers generate (TRL 1.16 has no SGLang backend); "
              "'vllm' becomes use_vllm",
    **{key: "engine = 'sglang' only: TRL 1.16 has no SGLang backend (the bridge samples with transformers' generate)"
       for key in ("sglang_url", "sglang_device", "sglang_mem_fraction_static", "sglang_weight_sync", "sglang_sleep",
                   "sglang_deterministic", "sglang_timeout", "sglang_start_timeout")},
    "parallelism": "ddp is accelerate's default; fsdp2 is an accelerate config (refused here, see REFUSED)",
    "model": "loaded by grpo_trainer (load_policy), passed to GRPOTrainer",
    "task": "grpo_trainer builds the dataset from it",
    "dataset": "as task (task = 'gsm8k')",
    "chat_template": "grpo_trainer gives prompts in TRL's conversational form, which TRL templates",
    "task_instruction": "train_dataset adds the task's instruction to each prompt (grpo_edu.environment.tasks.with_instruction)",
    "rewards": "grpo_trainer passes the functions as reward_funcs and their weights as reward_weights",
    "unboxed_answers": "the accuracy function grpo_trainer passes reads unboxed sentences",
    "prompts_per_step": "with num_generations, num_mini_batches and micro_batch_size: TRL's batch sizes",
    "micro_batch_size": "per_device_train_batch_size, with gradient accumulation up to the mini-batch",
    "num_mini_batches": "steps_per_generation (optimizer steps per generation batch and pass)",
    "device": "use_cpu for 'cpu'; otherwise accelerate's device",
    "precision": "bf16",
    "progress": "disable_tqdm",
    "overlong_cache": "reward_functions adds TRL's get_soft_overlong_punishment(max_completion_length, "
                      "overlong_cache) as the reward 'overlong', weight 1",
    "log_entropy": "TRL logs the policy's exact token entropy ('entropy') at every step, asked or not",
    "vllm_server_url": "vllm_server_base_url",
    "vllm_sleep_mode": "vllm_enable_sleep_mode",
    "adam_betas": "adam_beta1, adam_beta2",
    "lr_schedule": "lr_scheduler_type",
    "warmup_steps": "warmup_steps x optimizer steps per rollout",
    "steps": "max_steps = steps x optimizer steps per rollout",
    "ref_sync_steps": "sync_ref_model, ref_model_sync_steps (in optimizer steps)",
    "ref_mixup_alpha": "ref_model_mixup_alpha",
    "advantage_scale": "scale_rewards",
    "tis_cap": "vllm_importance_sampling_correction with mode 'token_truncate' and clip_max",
    "is_mask": "'token': vllm_importance_sampling_correction with mode 'token_mask' ('sequence' is refused: TRL's "
               "sequence_mask takes the product of the ratios and weighs by it, a different loss)",
    "is_mask_band": "vllm_importance_sampling_clip_min and _clip_max (with is_mask = 'token')",
    "ratio_cap": "loss_type 'cispo' with epsilon_high = ratio_cap (cispo aggregates as dapo: needs loss_type = 'dapo')",
    "old_logprobs": "TRL recomputes pi_old: 'recomputed', and 'proximal' (the same without rollout_lag)",
    "checkpoint_every": "save_steps (in optimizer steps)",
    "output_dir": "output_dir",
    "lora_rank": "GRPOTrainer's peft_config (peft_config(config): a peft LoraConfig of rank lora_rank, no dropout); "
                 "TRL's reference is then the base with the adapters off, as grpo_edu's",
    "lora_alpha": "peft_config's lora_alpha",
    "lora_target_modules": "peft_config's target_modules",
}


def _refusals(config: TrainConfig) -> list[str]:
    """Why each setting TRL cannot reproduce cannot be carried over."""
    out = []
    if config.advantage_fn:
        out.append(f"advantage_fn = {config.advantage_fn!r}: TRL computes its own advantages")
    elif config.advantage_std != "sample":
        out.append(f"advantage_std = {config.advantage_std!r}: TRL divides by the sample std (G - 1); set "
                   f"advantage_std = 'sample'")
    if config.kl_estimator != "k3":
        out.append(f"kl_estimator = {config.kl_estimator!r}: TRL's KL term is k3")
    if config.filter_zero_std_groups:
        out.append("filter_zero_std_groups = true: TRL has no zero-std filter")
    if config.dynamic_sampling_rounds:
        out.append(f"dynamic_sampling_rounds = {config.dynamic_sampling_rounds}: TRL's GRPOTrainer trains every "
                   f"group it samples, and samples no replacements")
    if config.supervision != "outcome":
        out.append(f"supervision = {config.supervision!r}: TRL 1.16's GRPOTrainer computes one advantage per "
                   f"completion (its loss takes (B, T) advantages only from a subclass)")
    if config.old_logprobs == "sampler":
        out.append(f"old_logprobs = {config.old_logprobs!r}: TRL recomputes pi_old")
    if config.rollout_lag:
        out.append(f"rollout_lag = {config.rollout_lag}: TRL's GRPOTrainer samples each rollout with the current "
                   f"policy (its experimental AsyncGRPOTrainer, with max_staleness, is another trainer)")
    if config.environment:
        out.append(f"environment = {config.environment!r}: TRL 1.16's tool training calls Python functions through "
                   f"the chat template's tool-call format (tools, max_tool_calling_iterations), not a text "
                   f"environment that answers at a stop token")
    if config.tis_cap and config.engine != "vllm":
        out.append(f"tis_cap = {config.tis_cap} with engine = {config.engine!r}: TRL corrects vLLM's samples only")
    if config.is_mask == "sequence":
        out.append("is_mask = 'sequence': TRL's sequence_mask takes the product of the ratios, not their geometric "
                   "mean, and weighs each kept response by it")
    elif config.is_mask != "none" and config.engine != "vllm":
        out.append(f"is_mask = {config.is_mask!r} with engine = {config.engine!r}: TRL corrects vLLM's samples only")
    if config.ratio_cap and (config.loss_type != "dapo" or config.importance_sampling_level != "token"):
        out.append(f"ratio_cap = {config.ratio_cap} with loss_type = {config.loss_type!r}, importance_sampling_level "
                   f"= {config.importance_sampling_level!r}: TRL's capped loss (cispo) aggregates as dapo, per token")
    if config.top_entropy_quantile < 1 and _accumulation(config) > 1:
        out.append(f"top_entropy_quantile = {config.top_entropy_quantile} with {_accumulation(config)} micro-batches "
                   f"per optimizer step: TRL takes the entropy quantile per micro-batch, grpo_edu per optimizer step "
                   f"(set micro_batch_size to the completions per process per optimizer step)")
    if config.parallelism == "fsdp2" and int(os.environ.get("WORLD_SIZE", "1")) > 1:
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
    completions = config.prompts_per_step * config.num_generations
    per_step = completions // config.num_mini_batches
    if per_step % processes:
        raise ValueError(f"config key 'prompts_per_step': {per_step} completions per optimizer step do not "
                         f"divide among {processes} processes")
    per_process = per_step // processes
    micro = min(config.micro_batch_size, per_process)
    if per_process % micro:
        raise ValueError(f"config key 'micro_batch_size' ({config.micro_batch_size}) must divide the completions "
                         f"per process per optimizer step ({per_process}) for TRL's gradient accumulation")
    accumulation = per_process // micro
    return {"per_device_train_batch_size": micro, "gradient_accumulation_steps": accumulation,
            "steps_per_generation": config.num_mini_batches * accumulation,
            "generation_batch_size": completions}


def grpo_config(config: TrainConfig, output_dir: str | None = None, **overrides):
    """TRL's GRPOConfig for `config` (overrides: any GRPOConfig argument, applied last)."""
    from trl import GRPOConfig

    refused = _refusals(config)
    if refused:
        raise ValueError(f"config key {refused[0].split(' =')[0]!r} cannot be carried over to TRL: {refused[0]}")
    K = config.num_iterations * config.num_mini_batches
    schedule = {"cosine": "cosine", "linear": "linear",
                "constant": "constant_with_warmup" if config.warmup_steps else "constant"}[config.lr_schedule]
    bf16 = config.precision == "bf16" or (config.precision == "auto" and config.device == "cuda")
    arguments = dict(
        output_dir=output_dir or config.output_dir, seed=config.seed, max_steps=config.steps * K,
        num_generations=config.num_generations, num_iterations=config.num_iterations,
        max_completion_length=config.max_completion_length, temperature=config.temperature, top_k=0, top_p=1.0,
        learning_rate=config.learning_rate, lr_scheduler_type=schedule, warmup_steps=config.warmup_steps * K,
        weight_decay=config.weight_decay, adam_beta1=config.adam_betas[0], adam_beta2=config.adam_betas[1],
        max_grad_norm=config.max_grad_norm, loss_type=config.loss_type, beta=config.beta, epsilon=config.epsilon,
        epsilon_high=config.epsilon_high, importance_sampling_level=config.importance_sampling_level,
        top_entropy_quantile=config.top_entropy_quantile,
        scale_rewards=config.advantage_scale, use_bias_correction_kl=False,
        mask_truncated_completions=config.mask_truncated_completions,
        sync_ref_model=bool(config.ref_sync_steps), ref_model_sync_steps=max(1, config.ref_sync_steps * K),
        ref_model_mixup_alpha=config.ref_mixup_alpha, bf16=bf16, use_cpu=config.device == "cpu", disable_tqdm=not config.progress,
        save_strategy="steps" if config.checkpoint_every else "no",
        save_steps=max(1, config.checkpoint_every * K), report_to="none", logging_strategy="steps", logging_steps=1,
        use_vllm=config.engine == "vllm",
        **batch_sizes(config, int(os.environ.get("WORLD_SIZE", "1"))))
    if config.engine == "vllm":
        arguments.update(vllm_mode=config.vllm_mode, vllm_gpu_memory_utilization=config.vllm_gpu_memory_utilization,
                         vllm_enable_sleep_mode=config.vllm_sleep_mode,
                         vllm_server_base_url=config.vllm_server_url if config.vllm_mode == "server" else None,
                         vllm_importance_sampling_correction=bool(config.tis_cap) or config.is_mask != "none",
                         vllm_importance_sampling_mode="token_truncate" if config.tis_cap else "token_mask",
                         vllm_importance_sampling_clip_min=config.is_mask_band[0] if config.is_mask != "none" else None,
                         vllm_importance_sampling_clip_max=config.tis_cap or (
                             config.is_mask_band[1] if config.is_mask != "none" else None))
    if config.ratio_cap:
        arguments.update(loss_type="cispo", epsilon_high=config.ratio_cap)
    arguments.pop("generation_batch_size")   # TRL derives it from the three above; passing both is an error
    arguments.update(overrides)
    return GRPOConfig(**arguments)


def peft_config(config: TrainConfig):
    """LoRA (lora_rank > 0) as the peft LoraConfig GRPOTrainer takes: the adapters grpo_edu.policy.lora
    injects (rank, alpha, the target layers, no dropout, no bias); None for full fine-tuning."""
    if not config.lora_rank:
        return None
    from peft import LoraConfig
    return LoraConfig(r=config.lora_rank, lora_alpha=config.lora_alpha, lora_dropout=0.0, bias="none",
                      target_modules=list(config.lora_target_modules), task_type="CAUSAL_LM")


def reward_functions(config: TrainConfig) -> tuple[list, list[float]]:
    """The config's reward functions (built-in by name, the reader's by import path) and weights."""
    from grpo_edu.training.user_functions import reward_functions_from_config
    functions, weights = [], []
    for name, (function, weight) in reward_functions_from_config(config.rewards, config.unboxed_answers).items():
        functions.append(_named(function, name))
        weights.append(weight)
    if config.overlong_cache:   # the term grpo_edu.training.scoring adds, weight 1: TRL's own function
        from trl.rewards import get_soft_overlong_punishment
        punishment = get_soft_overlong_punishment(config.max_completion_length, config.overlong_cache)

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
    when config.task_instruction, as a user message when config.chat_template) and the columns
    the rewards read."""
    from datasets import Dataset
    samples = (tasks.load_gsm8k("train", config.dataset) if config.task == "gsm8k" else
               tasks.make_dataset(config.task, n=tasks.training_pool_size(config.task, size), split="train", seed=0))
    rows = []
    for sample in samples:
        row = tasks.with_instruction(sample) if config.task_instruction else dict(sample)
        if config.chat_template:
            row["prompt"] = [{"role": "user", "content": row["prompt"]}]
        rows.append(row)
    return Dataset.from_list(rows)


def grpo_trainer(config: TrainConfig, *, model=None, tokenizer=None, dataset=None, **trainer_kwargs):
    """TRL's GRPOTrainer for `config`: its policy (config.model; 'start' is the committed tiny
    policy), task and rewards, and with lora_rank > 0 its LoRA adapters (peft_config). trainer_kwargs
    go to GRPOTrainer (callbacks, a peft_config of your own, ...). The model's generation config is
    given every EOS id of the model's files, so that TRL's completions end where grpo_edu's do."""
    from trl import GRPOTrainer

    from grpo_edu.policy.models import eos_token_ids, load_policy, policy_source
    args = grpo_config(config)
    if model is None:
        model, tokenizer = load_policy(policy_source(config.model))
    if tokenizer is not None and getattr(model, "generation_config", None) is not None:
        # TRL 1.16 ends a completion at the generation config's EOS ids and the tokenizer's; grpo_edu's
        # engines at config.json's too (eos_token_ids). Named in the generation config, all end alike.
        model.generation_config.eos_token_id = list(eos_token_ids(model, tokenizer))
    functions, weights = reward_functions(config)
    args.reward_weights = weights
    if config.lora_rank and "peft_config" not in trainer_kwargs:
        trainer_kwargs["peft_config"] = peft_config(config)
    return GRPOTrainer(model=model, args=args, reward_funcs=functions,
                       train_dataset=dataset if dataset is not None else train_dataset(config),
                       processing_class=tokenizer, **trainer_kwargs)

