"""The config's sections: each TOML table a dataclass whose fields are its keys, each documented
once beside the rules about it alone (grpo_edu.runtime.settings.setting).

    Run           a file's top level: modules to import, the policy, the task, the rewards, the
                  engine, seeds, threads, the device, processes and precision
    Data          [data]: how the task's prompts are read and shown to the policy
    Rollout       [rollout]: what each training step samples
    Optimisation  [optimisation]: the optimizer steps each rollout gives
    OffPolicy     [off_policy]: pi_old, rollouts that lag, the sampler corrections
    Lora          [lora]: LoRA adapters instead of full fine-tuning
    Loss          [loss]: the surrogate, the clip, the KL term, the aggregation, the reference
    Advantages    [advantages]: rewards to advantages, and the groups with no signal
    Logging       [logging]: evaluation, logging, checkpoints

An engine's own keys are a section beside its registration (grpo_edu.sampling.engines: [vllm],
[sglang]). Key names are unique across all sections, so `--set key=value`, a run's config.json
and an error message name a key without its section.

Where each kind of rule lives (each checked once, each refusal one line naming the keys):

    one key's allowed values   beside the key (`choices=`), taken from the module that
                               implements them: a registry (aggregation.AGGREGATIONS,
                               surrogates.SURROGATES, kl.KL_ESTIMATES, tasks, engines, ...) or
                               the implementing module's tuple (offpolicy.IS_MASKS, ...)
    one key's bounds           beside the key (`at_least=`, `above=`)
    one key's other rules      beside the key (`check=`): the implementing module's own check
                               where it has one (loss.check_epsilon, offpolicy.check_tis_cap,
                               ...), else one in grpo_edu.config.rules
    rules across keys          grpo_edu.config.rules.RULES, one table
    what needs the machine     at start-up, where the machine is known (the device, the number
                               of processes, the engine's installation, the reader's functions)
"""

from __future__ import annotations

from dataclasses import dataclass

from grpo_edu.algorithm import advantages, aggregation, entropy_mask, kl, loss, offpolicy, schedules, surrogates
from grpo_edu.config.rules import fraction_half_open, import_modules, import_path, layer_names, pair, some_reward
from grpo_edu.environment import process
from grpo_edu.environment.registry import TASKS
from grpo_edu.runtime import distributed, precision
from grpo_edu.runtime.settings import Section, setting
from grpo_edu.sampling.engines import ENGINES


@dataclass
class Run(Section):
    """The run (a file's top level): what is trained, from which policy, with which rewards and engine, where."""

    title = "run"

    imports: list = setting("modules to import before the rest of the config is checked: each may register tasks, "
                            "engines or loss variants of its own (docs/contributing.md), e.g. ['my_tasks']; imported "
                            "from the working directory or PYTHONPATH", [], check=import_modules,
                            trl_note="imported by the config before the bridge runs: what they register is known to "
                                     "it")

    model: str = setting("starting policy: a local model directory or a hub id ('start' = the committed tiny policy, "
                         "'multiply-start' = the committed one that calls a calculator, 'chain-start' = the one that "
                         "sums chains step by step, 'trained' = what configs/cpu-tiny.toml trains from 'start')",
                         "start", trl_note="loaded by grpo_trainer (load_policy), passed to GRPOTrainer")

    task: str = setting("task: 'arithmetic', 'multiply' (needs a tool: environment = "
                        "'grpo_edu.training.episodes:Calculator'), 'countdown' or 'chain' (three numbers summed step "
                        "by step: process supervision) (generated), or 'gsm8k' (read from `dataset`)", "arithmetic",
                        choices=TASKS, trl_note="grpo_trainer builds the dataset from it")

    rewards: dict = setting("reward functions and their weights, e.g. {accuracy = 1.0, format = 0.5}; a name "
                            "'module:function' (quoted in TOML) is your own function, TRL's signature",
                            {"accuracy": 1.0, "format": 0.5}, check=some_reward,
                            trl_note="grpo_trainer passes the functions as reward_funcs and their weights as "
                                     "reward_weights")

    unboxed_answers: bool = setting("the accuracy reward also reads an answer given as a sentence, 'The answer is "
                                    "18.' (off: R1's rule asks for \\boxed{} or an 'Answer:' line)", False,
                                    trl_note="the accuracy function grpo_trainer passes reads unboxed sentences")

    engine: str = setting("rollout engine: 'fused' (the CPU tier's fast sampler and forward for Llama/Qwen2 "
                          "policies, transformers' maths tested to 1e-5; CPU, float32), 'hf' (transformers' generate "
                          "and forward: any causal LM, any device), 'vllm' (vLLM 0.31.0 samples, transformers' "
                          "forward trains; see vllm_mode) or 'sglang' (an SGLang 0.5.23 server samples, over its "
                          "HTTP API; see sglang_url)", "fused", choices=ENGINES,
                          trl_note="'fused', 'hf' and 'sglang' become TRL's transformers generate (TRL 1.16 has no "
                                   "SGLang backend); 'vllm' becomes use_vllm")

    seed: int = setting("seed for prompts, sampling and initialisation (same seed + threads = same weights)", 0,
                        trl="seed")

    threads: int = setting("torch CPU threads (part of what makes a run bitwise reproducible)", 2, at_least=1,
                           trl_note="torch's CPU thread count: set it in the launching process "
                                    "(torch.set_num_threads)")

    device: str = setting("'auto' (CUDA where torch sees a GPU, else the CPU), 'cpu' or 'cuda' (under torchrun: one "
                          "GPU per process, cuda:LOCAL_RANK)", "cpu", choices=distributed.DEVICES,
                          trl_note="use_cpu for 'cpu'; otherwise accelerate's device")

    parallelism: str = setting("how N processes (torchrun --nproc-per-node N) share the model: 'ddp' (a replica "
                               "each, gradients all-reduced) or 'fsdp2' (torch's fully_shard: parameters, gradients "
                               "and AdamW state sharded 1/N); one process ignores it", "ddp",
                               choices=distributed.PARALLELISM,
                               trl_note="ddp is accelerate's default; fsdp2 is an accelerate config (refused on "
                                        "several processes: launch TRL with one instead)")

    precision: str = setting("forward passes in 'fp32' or 'bf16' (autocast), 'auto' = bf16 on CUDA, fp32 on the CPU; "
                             "the master weights and AdamW's moments stay float32 either way (a bf16 weight keeps 8 "
                             "bits of mantissa: an update smaller than 1/256 of it would round away)", "auto",
                             choices=precision.PRECISIONS, trl_note="bf16")


@dataclass
class Data(Section):
    """[data]: how the task's prompts are read and shown to the policy."""

    title = "data"

    dataset: str = setting("task = 'gsm8k': a hub id (downloads) or a local folder holding train.jsonl and "
                           "test.jsonl (GSM8K's own layout); unused by the generated tasks", "openai/gsm8k",
                           trl_note="as task (task = 'gsm8k')")

    chat_template: bool = setting("wrap each prompt in the tokenizer's chat template as a user message (instruct "
                                  "models); false: the prompt text as it is (the committed tiny policy)", False,
                                  trl_note="grpo_trainer gives prompts in TRL's conversational form, which TRL "
                                           "templates")

    task_instruction: bool = setting("add the task's instruction on a line after each problem "
                                     "(grpo_edu.environment.tasks.INSTRUCTIONS): the answer format both rewards "
                                     "score, <think>...</think>\\boxed{...}, and Countdown's rules; for a model not "
                                     "trained on the bare prompts (any hub model). false: the bare problem "
                                     "('47+85=', 'Use 3 5 7 to make 22:'), which the committed tiny policy was "
                                     "pretrained on. GSM8K's prompts end with their instruction either way", False,
                                     trl_note="train_dataset adds the task's instruction to each prompt "
                                              "(grpo_edu.environment.tasks.with_instruction)")


@dataclass
class Rollout(Section):
    """[rollout]: what each training step samples."""

    title = "rollout"

    prompts_per_step: int = setting("B: prompts sampled per rollout", 16, at_least=1,
                                    trl_note="with num_generations, num_mini_batches and micro_batch_size: TRL's "
                                             "batch sizes")

    num_generations: int = setting("G: completions sampled per prompt", 8,
                                   at_least=(2, "a group needs two completions"), trl="num_generations")

    max_completion_length: int = setting("L: most tokens generated per completion", 16, at_least=1,
                                         trl="max_completion_length")

    temperature: float = setting("sampling temperature (training log-probs use the same one)", 1.0, above=0,
                                 trl="temperature")

    environment: str = setting("multi-turn episodes: an environment class, 'module:Class' "
                               "(grpo_edu.training.episodes; 'grpo_edu.training.episodes:Calculator' is a calculator "
                               "tool); the policy writes until EOS or the environment's stop token, the environment "
                               "answers, the policy goes on. Its tokens are context, never trained on; "
                               "max_completion_length holds the whole episode. '' = single-turn completions", "",
                               check=import_path,
                               trl_only=("", "TRL 1.16's tool training calls Python functions through the chat "
                                         "template's tool-call format (tools, max_tool_calling_iterations), not a "
                                         "text environment that answers at a stop token"))

    max_turns: int = setting("with environment: the most policy turns in an episode (a hand-over on the last one is "
                             "left unanswered, and the episode ends truncated)", 4, at_least=1,
                             trl_note="used with environment only, which the bridge refuses (TRL 1.16's tool "
                                      "training calls Python functions through the chat template's tool-call format, "
                                      "not a text environment with a stop token)")


@dataclass
class Optimisation(Section):
    """[optimisation]: the optimizer steps each rollout gives."""

    title = "optimisation"

    steps: int = setting("training steps in the run: rollouts, each giving num_iterations x num_mini_batches "
                         "optimizer steps (eval_every and checkpoint_every count training steps too)", 1500,
                         at_least=1, trl_note="max_steps = steps x optimizer steps per rollout")

    learning_rate: float = setting("peak AdamW learning rate", 3e-4, at_least=0, trl="learning_rate")

    lr_schedule: str = setting("'constant', 'linear' (decay to 0) or 'cosine' (decay to 0), after warmup, over all "
                               "steps x num_iterations x num_mini_batches optimizer steps", "cosine",
                               choices=schedules.LR_SCHEDULES, trl_note="lr_scheduler_type")

    warmup_steps: int = setting("linear learning-rate warmup, in training steps (rollouts): the first warmup_steps x "
                                "num_iterations x num_mini_batches optimizer steps", 0, at_least=0,
                                trl_note="warmup_steps x optimizer steps per rollout")

    weight_decay: float = setting("AdamW weight decay", 0.0, at_least=0, trl="weight_decay")

    adam_betas: list = setting("AdamW (beta1, beta2)", [0.9, 0.99], check=pair, trl_note="adam_beta1, adam_beta2")

    max_grad_norm: float = setting("global gradient-norm clip (0 = none)", 1.0,
                                   at_least=(0, "0 = no clip; a negative norm would flip the gradient"),
                                   trl="max_grad_norm")

    num_iterations: int = setting("mu: passes over each rollout; pi_old stays the policy that sampled for all of them",
                                  1, at_least=1, trl="num_iterations")

    num_mini_batches: int = setting("optimizer steps per pass over a rollout, each on a near-equal share of whole "
                                    "groups (an empty one, after filter_zero_std_groups, skips its step)", 1,
                                    at_least=1,
                                    trl_note="steps_per_generation (optimizer steps per generation batch and pass)")

    micro_batch_size: int = setting("completions per forward/backward (gradient accumulation below a mini-batch)", 128,
                                    at_least=1,
                                    trl_note="per_device_train_batch_size, with gradient accumulation up to the "
                                             "mini-batch")


@dataclass
class OffPolicy(Section):
    """[off_policy]: pi_old, rollouts that lag, and the sampler corrections."""

    title = "off_policy"

    old_logprobs: str = setting("pi_old, what the clipped ratio compares with: 'recomputed' (the trainer's forward "
                                "before the rollout's first update; with one optimizer step per rollout, that step's "
                                "own detached log-probs: ratio 1; under rollout_lag, the forward of the policy that "
                                "sampled, taken when it sampled), 'sampler' (the rollout engine's log-probs, for "
                                "every step: the ratio then also carries the sampler/trainer mismatch) or 'proximal' "
                                "(under rollout_lag, the policy at the update: the clip no longer sees the "
                                "staleness, which is left to tis_cap or is_mask; without lag, the same as "
                                "'recomputed')", "recomputed", choices=offpolicy.PI_OLD_SOURCES,
                                trl_note="TRL recomputes pi_old: 'recomputed', and 'proximal' (the same without "
                                         "rollout_lag)")

    rollout_lag: int = setting("k: each update trains on the rollout the policy of k updates earlier sampled "
                               "(asynchronous GRPO: the sampler runs k rollouts ahead of the trainer); pi_old is "
                               "that sampling policy (old_logprobs = 'recomputed' or 'sampler'), so the ratio and "
                               "the clip see the staleness, or the policy at the update ('proximal'). 0 = "
                               "synchronous. Needs one optimizer step per rollout (num_iterations = num_mini_batches "
                               "= 1)", 0, at_least=(0, "0 = synchronous"),
                               trl_only=(0, "TRL's GRPOTrainer samples each rollout with the current policy (its "
                                         "experimental AsyncGRPOTrainer, with max_staleness, is another trainer)"))

    rollout_overlap: bool = setting("with rollout_lag >= 1: sample the next rollout in a background thread while the "
                                    "trainer updates (the sampler's own copy of the weights, synced from the policy "
                                    "between rollouts, never during one); the same numbers as without it. Under "
                                    "torchrun every rank samples its share so. A colocated vLLM: without "
                                    "vllm_sleep_mode", False,
                                    trl_note="when grpo_edu's sampler runs (the numbers are the same either way); it "
                                             "needs rollout_lag, which the bridge refuses")

    tis_cap: float = setting("truncated importance sampling: weigh each token's loss by min(pi_old / pi_sampler, "
                             "tis_cap), correcting for a sampler that differs from pi_old (vLLM's kernels, bf16; an "
                             "older policy under rollout_lag with old_logprobs = 'proximal'); 0 = off. Not with "
                             "old_logprobs = 'sampler' (the ratio is 1 there)", 0.0, check=offpolicy.check_tis_cap,
                             trl_note="vllm_importance_sampling_correction with mode 'token_truncate' and clip_max")

    is_mask: str = setting("masked importance sampling, the other correction (grpo_edu.algorithm.offpolicy): 'token' "
                           "zeroes the policy term of each token whose r = pi_old / pi_sampler leaves is_mask_band "
                           "and weighs the rest by r (IcePop; TRL's token_mask), 'sequence' zeroes whole responses "
                           "whose geometric-mean r leaves it; 'none' = off. Not with tis_cap, nor old_logprobs = "
                           "'sampler'", "none", choices=offpolicy.IS_MASKS,
                           trl_note="'token': vllm_importance_sampling_correction with mode 'token_mask' ('sequence' "
                                    "is refused: TRL's sequence_mask takes the product of the ratios and weighs by "
                                    "it, a different loss)")

    is_mask_band: list = setting("[low, high]: the band of r that is_mask keeps, 0 <= low < 1 < high", [0.5, 2.0],
                                 check=offpolicy.check_band,
                                 trl_note="vllm_importance_sampling_clip_min and _clip_max (with is_mask = 'token')")


@dataclass
class Lora(Section):
    """[lora]: LoRA adapters instead of full fine-tuning."""

    title = "lora"

    lora_rank: int = setting("r: train LoRA adapters of this rank on lora_target_modules, the rest of the model "
                             "frozen; the reference is then the base model with the adapters off, no second copy "
                             "(grpo_edu.policy.lora); 0 = full fine-tuning", 0, at_least=(0, "0 = full fine-tuning"),
                             trl_note="GRPOTrainer's peft_config (peft_config(config): a peft LoraConfig of rank "
                                      "lora_rank, no dropout); TRL's reference is then the base with the adapters "
                                      "off, as grpo_edu's")

    lora_alpha: float = setting("LoRA's scale numerator: each adapter adds (lora_alpha / lora_rank) B A to its "
                                "layer's weight", 32.0, above=(0, "the adapters' scale is lora_alpha / lora_rank"),
                                trl_note="peft_config's lora_alpha")

    lora_target_modules: list = setting("the linear layers of every decoder layer that get adapters, by name",
                                        ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
                                        check=layer_names, trl_note="peft_config's target_modules")


@dataclass
class Loss(Section):
    """[loss]: the GRPO loss: its surrogate, clip, KL term, aggregation and the reference."""

    title = "loss"

    loss_type: str = setting("aggregation: 'grpo', 'bnpo', 'dr_grpo' or 'dapo'", "grpo",
                             choices=aggregation.AGGREGATIONS, trl="loss_type")

    surrogate: str = setting("the policy term: 'clip' (PPO's clipped surrogate: epsilon, epsilon_high) or 'capped' "
                             "(-sg(min(ratio, ratio_cap)) A log pi without the clip: CISPO, the MiniMax-M1 report; a "
                             "token far off-policy keeps a gradient weighed at most ratio_cap, where the clip gives "
                             "it none) (grpo_edu.algorithm.surrogates)", "clip", choices=surrogates.SURROGATES,
                             trl_note="'capped' becomes loss_type 'cispo' with epsilon_high = ratio_cap (cispo "
                                      "aggregates as dapo: needs loss_type = 'dapo')")

    beta: float = setting("KL-to-reference coefficient (DeepSeekMath: 0.04; DeepSeek-R1: 0.001)", 0.04,
                          check=loss.check_beta, trl="beta")

    kl_estimator: str = setting("'k1', 'k2' or 'k3'", "k3", choices=kl.KL_ESTIMATES,
                                trl_only=("k3", "TRL's KL term is k3"))

    epsilon: float = setting("clip range below: ratio >= 1 - epsilon", 0.2, check=loss.check_epsilon, trl="epsilon")

    epsilon_high: float = setting("clip range above: ratio <= 1 + epsilon_high (DAPO clip-higher: 0.28)", 0.2,
                                  check=loss.check_epsilon_high, trl="epsilon_high")

    ratio_cap: float = setting("surrogate = 'capped': its largest weight c > 1 (0 with the clip)", 0.0,
                               check=surrogates.check_ratio_cap, trl_note="epsilon_high, with surrogate = 'capped'")

    importance_sampling_level: str = setting("'token' (GRPO) or 'sequence' (GSPO)", "token",
                                             choices=surrogates.RATIO_LEVELS, trl="importance_sampling_level")

    top_entropy_quantile: float = setting("entropy masking: only the tokens whose next-token entropy is in this top "
                                          "share of an optimizer step's tokens train their policy term (the 80/20 "
                                          "finding: 0.2); the KL term and the normaliser keep every token "
                                          "(grpo_edu.algorithm.entropy_mask); 1 = every token", 1.0,
                                          check=entropy_mask.check_quantile, trl="top_entropy_quantile")

    mask_truncated_completions: bool = setting("overlong filtering (DAPO): the completions cut at "
                                               "max_completion_length (no EOS; an episode that did not end) train "
                                               "nothing: their tokens leave the loss (policy, KL, bnpo's and dapo's "
                                               "token counts), their rewards stay in their group's advantages, and "
                                               "they still count in grpo's and dr_grpo's completions (TRL 1.16's "
                                               "mask_truncated_completions)", False, trl="mask_truncated_completions")

    overlong_cache: int = setting("DAPO's soft overlong punishment: a reward term, 0 up to max_completion_length - "
                                  "overlong_cache tokens, then falling linearly to -1 at max_completion_length "
                                  "(logged as reward/overlong); 0 = off", 0,
                                  trl_note="reward_functions adds TRL's "
                                           "get_soft_overlong_punishment(max_completion_length, overlong_cache) as "
                                           "the reward 'overlong', weight 1")

    ref_sync_steps: int = setting("copy the policy into the reference every K training steps (rollouts; 0 = never; "
                                  "R1: every 400 optimizer steps = 25 rollouts of 16 optimizer steps)", 0,
                                  at_least=(0, "0 = never"),
                                  trl_note="sync_ref_model, ref_model_sync_steps (in optimizer steps)")

    ref_mixup_alpha: float = setting("with ref_sync_steps: at each sync the reference moves toward the policy by "
                                     "this share, ref = alpha x policy + (1 - alpha) x ref (Polyak averaging; TRL's "
                                     "ref_model_mixup_alpha); 1 = a hard copy", 1.0, check=fraction_half_open,
                                     trl_note="ref_model_mixup_alpha")


@dataclass
class Advantages(Section):
    """[advantages]: rewards to advantages, and the groups with no signal."""

    title = "advantages"

    advantage_fn: str = setting("your own advantage function, 'module:function' or 'path/file.py:function' (rewards "
                                "(B, G) -> advantages (B, G); checked at start-up on a probe batch); '' = the "
                                "built-in group_advantages with advantage_scale and advantage_std", "",
                                trl_only=("", "TRL computes its own advantages"))

    supervision: str = setting("'outcome' (every token of a completion gets its reward's advantage) or 'process' "
                               "(DeepSeekMath's process supervision, grpo_edu.environment.process: a reward at the "
                               "end of every reasoning step a rule checks, task 'chain'; token t's advantage is the "
                               "sum of the group-normalised rewards of its completion's steps ending at or after t)",
                               "outcome", choices=process.SUPERVISIONS,
                               trl_only=("outcome", "TRL 1.16's GRPOTrainer computes one advantage per completion "
                                         "(its loss takes (B, T) advantages only from a subclass)"))

    advantage_scale: str = setting("advantage std: 'group', 'batch' or 'none' (Dr. GRPO)", "group",
                                   choices=advantages.SCALES, trl_note="scale_rewards")

    advantage_std: str = setting("'population' (divide by G) or 'sample' (by G - 1, as TRL)", "population",
                                 choices=advantages.STD_KINDS,
                                 trl_only=("sample", "TRL divides by the sample std (G - 1); set advantage_std = "
                                           "'sample'"))

    filter_zero_std_groups: bool = setting("drop groups whose rewards are all equal (the zero-std filter; DAPO's "
                                           "dynamic sampling would sample replacements, this does not)", False,
                                           trl_only=(False, "TRL has no zero-std filter"))

    dynamic_sampling_rounds: int = setting("DAPO's dynamic sampling: the groups whose rewards are all equal are "
                                           "replaced by the differing groups of fresh prompts, sampled in up to this "
                                           "many more rollouts of prompts_per_step prompts; at the limit the slots "
                                           "left keep all-equal groups, which are not trained on (logged: "
                                           "dynamic_sampling/rounds, /first_zero_std, /short); 0 = off "
                                           "(grpo_edu.training.dynamic_sampling)", 0, at_least=(0, "0 = off"),
                                           trl_only=(0, "TRL's GRPOTrainer trains every group it samples, and "
                                                     "samples no replacements"))


@dataclass
class Logging(Section):
    """[logging]: evaluation, logging, checkpoints."""

    title = "logging"

    eval_every: int = setting("held-out greedy accuracy every N steps (and at the start and end)", 100, at_least=1,
                              trl_note="grpo_edu's held-out greedy accuracy; TRL evaluates an eval_dataset "
                                       "(eval_strategy)")

    eval_size: int = setting("held-out problems per evaluation", 256, at_least=1, trl_note="as eval_every")

    eval_samples: int = setting("k: at each evaluation also sample k completions per held-out problem (temperature "
                                "1, seeded) and log pass@1, pass@k and maj@k with 95% intervals; 0 = greedy only", 0,
                                at_least=0, trl_note="as eval_every (pass@k and maj@k on the held-out problems)")

    checkpoint_every: int = setting("checkpoint every N steps (0 = only at the end)", 500,
                                    at_least=(0, "0 = only at the end"), trl_note="save_steps (in optimizer steps)")

    output_dir: str = setting("run directory: metrics.jsonl, summary.json, plot, checkpoints", "runs/cpu-tiny",
                              trl_note="output_dir")

    progress: bool = setting("show a tqdm progress bar", True, trl_note="disable_tqdm")

    log_entropy: bool = setting("log the policy's exact entropy at every optimizer step (entropy/mean, /min, /max "
                                "over completions; one extra forward per step), as top_entropy_quantile < 1 always "
                                "does; the 'entropy' metric otherwise is the sampler's -log p estimate", False,
                                trl_note="TRL logs the policy's exact token entropy ('entropy') at every step, asked "
                                         "or not")


