"""The training configuration: one dataclass, every key documented once, beside its rules.

The one-line doc of each key is also its `grpo-edu train --help` text. A run is configured by
a TOML file (configs/cpu-tiny.toml holds exactly these defaults) and `--set key=value`
overrides; an unknown key or a value of the wrong type is an error that names the key. The
keys are grouped as the TOML files group them: the run (a file's top level), [task] and
[rewards], [rollout], [optimisation], [loss], [logging].

Where each kind of rule lives (each checked once, each refusal one line naming the keys):

    one key's allowed values   beside the key (`choices=`), taken from the module that
                               implements them: a registry (aggregation.AGGREGATIONS,
                               kl.KL_ESTIMATES, surrogates.RATIO_LEVELS, schedules.LR_SCHEDULES)
                               or the implementing module's tuple (tasks.TASKS, offpolicy.IS_MASKS, ...)
    one key's bounds           beside the key (`at_least=`, `above=`)
    one key's other rules      beside the key (`check=`): the implementing module's own check
                               where it has one (offpolicy.check_tis_cap, loss_checks.check_ratio_cap,
                               entropy_mask.check_quantile), else one in config_rules.py
    rules across keys          config_rules.RULES, one table
    what needs the machine     at start-up, where the machine is known (the device, the number
                               of processes, the engine's installation, the reader's functions)
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

from grpo_edu.algorithm import advantages, aggregation, entropy_mask, kl, loss_checks, offpolicy, surrogates
from grpo_edu.environment import process, tasks
from grpo_edu.runtime import distributed, precision
from grpo_edu.sampling import rollout, sglang_engine, vllm_engine
from grpo_edu.training import schedules
from grpo_edu.training.config_rules import (RULES, check_key, fraction_half_open, fraction_open, import_path,
                                             layer_names, pair, some_reward)

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

# The CPU tier's config: in a source checkout the repository root's configs/; in a package
# installed from its wheel the copy shipped with the book's files (pyproject.toml maps configs/
# to grpo_edu/book/files/configs, grpo_edu.book.home reads them).
_CHECKOUT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "cpu-tiny.toml"
_SHIPPED_CONFIG = Path(__file__).resolve().parents[1] / "book" / "files" / "configs" / "cpu-tiny.toml"
DEFAULT_CONFIG = _CHECKOUT_CONFIG if _CHECKOUT_CONFIG.is_file() else _SHIPPED_CONFIG


def _doc(text: str, default, *, choices=None, at_least=None, above=None, check=None):
    """A config key: its one-line doc (also its --help), its default, and the rules about it alone.

    choices: the names it may take, from the module that implements them (a registry's dict,
        or a tuple); at_least / above: a bound (>= / >), or (bound, why); check: a function
        check(value, name) of the module that implements the key, raising a one-line error."""
    rules = {"doc": text, "choices": choices, "at_least": at_least, "above": above, "check": check}
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: type(default)(default), metadata=rules)
    return field(default=default, metadata=rules)


@dataclass
class TrainConfig:
    # --- [task] and [rewards]: what to train
    model: str = _doc("starting policy: a local model directory or a hub id ('start' = the committed tiny policy, "
                     "'multiply-start' = the committed one that calls a calculator, 'chain-start' = the one that "
                     "sums chains step by step, 'trained' = what configs/cpu-tiny.toml trains from 'start')", "start")
    task: str = _doc("task: 'arithmetic', 'multiply' (needs a tool: environment = 'grpo_edu.training.episodes:Calculator'), "
                     "'countdown' or 'chain' (three numbers summed step by step: process supervision) (generated), "
                     "or 'gsm8k' (read from `dataset`)", "arithmetic", choices=tasks.TASKS)
    dataset: str = _doc("task = 'gsm8k': a hub id (downloads) or a local folder holding train.jsonl and test.jsonl "
                        "(GSM8K's own layout); unused by the generated tasks", "openai/gsm8k")
    chat_template: bool = _doc("wrap each prompt in the tokenizer's chat template as a user message (instruct "
                               "models); false: the prompt text as it is (the committed tiny policy)", False)
    task_instruction: bool = _doc("add the task's instruction on a line after each problem (grpo_edu.environment.tasks."
                                  "INSTRUCTIONS): the answer format both rewards score, <think>...</think>"
                                  "\\boxed{...}, and Countdown's rules; for a model not trained on the bare "
                                  "prompts (any hub model). false: the bare problem ('47+85=', 'Use 3 5 7 to make "
                                  "22:'), which the committed tiny policy was pretrained on. GSM8K's prompts end "
                                  "with their instruction either way", False)
    rewards: dict = _doc("reward functions and their weights, e.g. {accuracy = 1.0, format = 0.5}; a name "
                         "'module:function' (quoted in TOML) is your own function, TRL's signature",
                         {"accuracy": 1.0, "format": 0.5}, check=some_reward)
    unboxed_answers: bool = _doc("the accuracy reward also reads an answer given as a sentence, 'The answer is 18.' "
                                 "(off: R1's rule asks for \\boxed{} or an 'Answer:' line)", False)
    # --- the run (a TOML file's top level): seeds, threads, devices, the engine
    seed: int = _doc("seed for prompts, sampling and initialisation (same seed + threads = same weights)", 0)
    threads: int = _doc("torch CPU threads (part of what makes a run bitwise reproducible)", 2, at_least=1)
    device: str = _doc("'auto' (CUDA where torch sees a GPU, else the CPU), 'cpu' or 'cuda' (under torchrun: "
                       "one GPU per process, cuda:LOCAL_RANK)", "cpu", choices=distributed.DEVICES)
    parallelism: str = _doc("how N processes (torchrun --nproc-per-node N) share the model: 'ddp' (a replica "
                            "each, gradients all-reduced) or 'fsdp2' (torch's fully_shard: parameters, gradients "
                            "and AdamW state sharded 1/N); one process ignores it", "ddp", choices=distributed.PARALLELISM)
    precision: str = _doc("forward passes in 'fp32' or 'bf16' (autocast), 'auto' = bf16 on CUDA, fp32 on the "
                          "CPU; the master weights and AdamW's moments stay float32 either way (a bf16 weight "
                          "keeps 8 bits of mantissa: an update smaller than 1/256 of it would round away)", "auto", choices=precision.PRECISIONS)
    engine: str = _doc("rollout engine: 'fused' (the CPU tier's fast sampler and forward for Llama/Qwen2 "
                       "policies, transformers' maths tested to 1e-5; CPU, float32), 'hf' (transformers' generate "
                       "and forward: any causal LM, any device), 'vllm' (vLLM 0.31.0 samples, transformers' "
                       "forward trains; see vllm_mode) or 'sglang' (an SGLang 0.5.23 server samples, over its "
                       "HTTP API; see sglang_url)", "fused", choices=rollout.ENGINES)
    vllm_mode: str = _doc("engine = 'vllm': 'colocate' (an engine inside every training process, sharing its GPU, "
                          "asleep between rollouts) or 'server' (a separate `grpo-edu vllm-serve` process at "
                          "vllm_server_url, for models that do not fit beside the trainer)", "colocate", choices=vllm_engine.VLLM_MODES)
    vllm_gpu_memory_utilization: float = _doc("colocated vLLM: the fraction of the GPU's memory vLLM may take for "
                                              "its weights and KV cache; the trainer gets the rest", 0.3, check=fraction_open)
    vllm_sleep_mode: bool = _doc("colocated vLLM: release the engine's weights and KV cache between rollouts "
                                 "(sleep level 2), so the update has the GPU to itself", True)
    vllm_server_url: str = _doc("vllm_mode = 'server': the server's address", "http://127.0.0.1:8000")
    sglang_url: str = _doc("engine = 'sglang': the address of a running SGLang server (python -m "
                           "sglang.launch_server ...); '' = grpo-edu starts one on sglang_device and stops it when the "
                           "run ends", "", check=sglang_engine.check_url)
    sglang_device: str = _doc("engine = 'sglang', sglang_url = '': the started server's device: 'cuda' (the trainer's "
                              "GPU, shared: see sglang_sleep), 'cuda:N' (GPU N, its own) or 'cpu' (SGLang's CPU "
                              "backend, built from source)", "cuda", check=sglang_engine.check_device)
    sglang_mem_fraction_static: float = _doc("engine = 'sglang', sglang_url = '': SGLang's --mem-fraction-static, the "
                                             "share of the device's memory the server takes for its weights and KV "
                                             "cache (beside the trainer, leave it the rest)", 0.3, check=fraction_open)
    sglang_weight_sync: str = _doc("engine = 'sglang': how the trainer's weights reach the server before every "
                                   "rollout: 'disk' (safetensors files in output_dir, then /update_weights_from_disk: "
                                   "a server that reads this file system) or 'tensor' (/update_weights_from_tensor: "
                                   "CUDA IPC handles or shared memory, a server on this machine)", "disk",
                                   choices=sglang_engine.WEIGHT_SYNCS)
    sglang_sleep: bool = _doc("engine = 'sglang': the server releases its weights, KV cache and CUDA graphs while the "
                              "trainer updates, and takes them back for the next rollout (SGLang's "
                              "release/resume_memory_occupation; needs --enable-memory-saver, which a started server "
                              "gets): for a server that shares the trainer's GPU", False)
    sglang_deterministic: bool = _doc("engine = 'sglang': a seed per completion (sampling_seed) and SGLang's "
                                      "batch-invariant kernels (--enable-deterministic-inference): a rollout is "
                                      "reproducible and independent of how the prompts split over processes; a running "
                                      "server must have been started with the flag. false: no seeds are sent, the "
                                      "server samples from its own random state", True)
    sglang_timeout: float = _doc("engine = 'sglang': seconds any one request to the server may take (a rollout's "
                                 "/generate, a weight update); past it the run stops with one line", 600.0, above=0)
    sglang_start_timeout: float = _doc("engine = 'sglang', sglang_url = '': seconds to wait for the started server to "
                                       "answer /health_generate (it loads the model, captures CUDA graphs)", 900.0,
                                       above=0)
    # --- [rollout]
    prompts_per_step: int = _doc("B: prompts sampled per rollout", 16, at_least=1)
    num_generations: int = _doc("G: completions sampled per prompt", 8, at_least=(2, "a group needs two completions"))
    max_completion_length: int = _doc("L: most tokens generated per completion", 16, at_least=1)
    temperature: float = _doc("sampling temperature (training log-probs use the same one)", 1.0, above=0)
    environment: str = _doc("multi-turn episodes: an environment class, 'module:Class' (grpo_edu.training.episodes; "
                            "'grpo_edu.training.episodes:Calculator' is a calculator tool); the policy writes until EOS or "
                            "the environment's stop token, the environment answers, the policy goes on. Its tokens "
                            "are context, never trained on; max_completion_length holds the whole episode. '' = "
                            "single-turn completions", "", check=import_path)
    max_turns: int = _doc("with environment: the most policy turns in an episode (a hand-over on the last one is "
                          "left unanswered, and the episode ends truncated)", 4, at_least=1)

    # --- [optimisation]
    steps: int = _doc("training steps in the run: rollouts, each giving num_iterations x num_mini_batches "
                      "optimizer steps (eval_every and checkpoint_every count training steps too)", 1500, at_least=1)
    learning_rate: float = _doc("peak AdamW learning rate", 3e-4)
    lr_schedule: str = _doc("'constant', 'linear' (decay to 0) or 'cosine' (decay to 0), after warmup, over "
                            "all steps x num_iterations x num_mini_batches optimizer steps", "cosine", choices=schedules.LR_SCHEDULES)
    warmup_steps: int = _doc("linear learning-rate warmup, in training steps (rollouts): the first "
                             "warmup_steps x num_iterations x num_mini_batches optimizer steps", 0, at_least=0)
    weight_decay: float = _doc("AdamW weight decay", 0.0)
    adam_betas: list = _doc("AdamW (beta1, beta2)", [0.9, 0.99], check=pair)
    max_grad_norm: float = _doc("global gradient-norm clip (0 = none)", 1.0)
    num_iterations: int = _doc("mu: passes over each rollout; pi_old stays the policy that sampled for all of them", 1, at_least=1)
    num_mini_batches: int = _doc("optimizer steps per pass over a rollout, each on a near-equal share of whole "
                                 "groups (an empty one, after filter_zero_std_groups, skips its step)", 1, at_least=1)
    old_logprobs: str = _doc("pi_old, what the clipped ratio compares with: 'recomputed' (the trainer's forward "
                             "before the rollout's first update; with one optimizer step per rollout, that step's "
                             "own detached log-probs: ratio 1; under rollout_lag, the forward of the policy that "
                             "sampled, taken when it sampled), 'sampler' (the rollout engine's log-probs, for "
                             "every step: the ratio then also carries the sampler/trainer mismatch) or 'proximal' "
                             "(under rollout_lag, the policy at the update: the clip no longer sees the staleness, "
                             "which is left to tis_cap or is_mask; without lag, the same as 'recomputed')",
                             "recomputed", choices=offpolicy.PI_OLD_SOURCES)
    rollout_lag: int = _doc("k: each update trains on the rollout the policy of k updates earlier sampled "
                            "(asynchronous GRPO: the sampler runs k rollouts ahead of the trainer); pi_old is that "
                            "sampling policy (old_logprobs = 'recomputed' or 'sampler'), so the ratio and the clip "
                            "see the staleness, or the policy at the update ('proximal'). 0 = synchronous. Needs "
                            "one optimizer step per rollout (num_iterations = num_mini_batches = 1)", 0, at_least=(0, "0 = synchronous"))
    rollout_overlap: bool = _doc("with rollout_lag >= 1: sample the next rollout in a background thread while the "
                                 "trainer updates (the sampler's own copy of the weights, synced from the policy "
                                 "between rollouts, never during one); the same numbers as without it. Under "
                                 "torchrun every rank samples its share so. A colocated vLLM: without "
                                 "vllm_sleep_mode", False)
    tis_cap: float = _doc("truncated importance sampling: weigh each token's loss by min(pi_old / pi_sampler, "
                          "tis_cap), correcting for a sampler that differs from pi_old (vLLM's kernels, bf16; an "
                          "older policy under rollout_lag with old_logprobs = 'proximal'); 0 = off. Not with "
                          "old_logprobs = 'sampler' (the ratio is 1 there)", 0.0, check=offpolicy.check_tis_cap)
    is_mask: str = _doc("masked importance sampling, the other correction (grpo_edu.algorithm.offpolicy): 'token' zeroes "
                        "the policy term of each token whose r = pi_old / pi_sampler leaves is_mask_band and "
                        "weighs the rest by r (IcePop; TRL's token_mask), 'sequence' zeroes whole responses whose "
                        "geometric-mean r leaves it; 'none' = off. Not with tis_cap, nor old_logprobs = 'sampler'",
                        "none", choices=offpolicy.IS_MASKS)
    is_mask_band: list = _doc("[low, high]: the band of r that is_mask keeps, 0 <= low < 1 < high", [0.5, 2.0], check=offpolicy.check_band)
    lora_rank: int = _doc("r: train LoRA adapters of this rank on lora_target_modules, the rest of the model "
                          "frozen; the reference is then the base model with the adapters off, no second copy "
                          "(grpo_edu.policy.lora); 0 = full fine-tuning", 0, at_least=(0, "0 = full fine-tuning"))
    lora_alpha: float = _doc("LoRA's scale numerator: each adapter adds (lora_alpha / lora_rank) B A to its layer's "
                             "weight", 32.0, above=(0, "the adapters' scale is lora_alpha / lora_rank"))
    lora_target_modules: list = _doc("the linear layers of every decoder layer that get adapters, by name",
                                     ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"], check=layer_names)
    micro_batch_size: int = _doc("completions per forward/backward (gradient accumulation below a mini-batch)", 128, at_least=1)

    # --- [loss]: the GRPO loss
    loss_type: str = _doc("aggregation: 'grpo', 'bnpo', 'dr_grpo' or 'dapo'", "grpo", choices=aggregation.AGGREGATIONS)
    beta: float = _doc("KL-to-reference coefficient (DeepSeekMath: 0.04; DeepSeek-R1: 0.001)", 0.04)
    kl_estimator: str = _doc("'k1', 'k2' or 'k3'", "k3", choices=kl.KL_ESTIMATES)
    epsilon: float = _doc("clip range below: ratio >= 1 - epsilon", 0.2)
    epsilon_high: float = _doc("clip range above: ratio <= 1 + epsilon_high (DAPO clip-higher: 0.28)", 0.2)
    ratio_cap: float = _doc("0: the clipped surrogate (epsilon, epsilon_high); c > 1: the capped surrogate "
                            "without the clip, -sg(min(ratio, c)) A log pi (CISPO; prime-rl's loss family): a "
                            "token far off-policy keeps a gradient weighed at most c, where the clip gives it "
                            "none (epsilon and epsilon_high then unused)", 0.0, check=loss_checks.check_ratio_cap)
    importance_sampling_level: str = _doc("'token' (GRPO) or 'sequence' (GSPO)", "token", choices=surrogates.RATIO_LEVELS)
    top_entropy_quantile: float = _doc("entropy masking: only the tokens whose next-token entropy is in this top "
                                       "share of an optimizer step's tokens train their policy term (the 80/20 "
                                       "finding: 0.2); the KL term and the normaliser keep every token "
                                       "(grpo_edu.algorithm.entropy_mask); 1 = every token", 1.0, check=entropy_mask.check_quantile)
    advantage_fn: str = _doc("your own advantage function, 'module:function' or 'path/file.py:function' (rewards "
                             "(B, G) -> advantages (B, G); checked at start-up on a probe batch); '' = the built-in "
                             "group_advantages with advantage_scale and advantage_std", "")
    supervision: str = _doc("'outcome' (every token of a completion gets its reward's advantage) or 'process' "
                            "(DeepSeekMath's process supervision, grpo_edu.environment.process: a reward at the end of every "
                            "reasoning step a rule checks, task 'chain'; token t's advantage is the sum of the "
                            "group-normalised rewards of its completion's steps ending at or after t)", "outcome", choices=process.SUPERVISIONS)
    advantage_scale: str = _doc("advantage std: 'group', 'batch' or 'none' (Dr. GRPO)", "group", choices=advantages.SCALES)
    advantage_std: str = _doc("'population' (divide by G) or 'sample' (by G - 1, as TRL)", "population", choices=advantages.STD_KINDS)
    mask_truncated_completions: bool = _doc("overlong filtering (DAPO): the completions cut at "
                                            "max_completion_length (no EOS; an episode that did not end) train "
                                            "nothing: their tokens leave the loss (policy, KL, bnpo's and dapo's "
                                            "token counts), their rewards stay in their group's advantages, and "
                                            "they still count in grpo's and dr_grpo's completions (TRL 1.16's "
                                            "mask_truncated_completions)", False)
    overlong_cache: int = _doc("DAPO's soft overlong punishment: a reward term, 0 up to max_completion_length - "
                               "overlong_cache tokens, then falling linearly to -1 at max_completion_length "
                               "(logged as reward/overlong); 0 = off", 0)
    filter_zero_std_groups: bool = _doc("drop groups whose rewards are all equal (the zero-std filter; DAPO's dynamic "
                                        "sampling would sample replacements, this does not)", False)
    dynamic_sampling_rounds: int = _doc("DAPO's dynamic sampling: the groups whose rewards are all equal are "
                                        "replaced by the differing groups of fresh prompts, sampled in up to this "
                                        "many more rollouts of prompts_per_step prompts; at the limit the slots "
                                        "left keep all-equal groups, which are not trained on (logged: "
                                        "dynamic_sampling/rounds, /first_zero_std, /short); 0 = off "
                                        "(grpo_edu.training.dynamic_sampling)", 0, at_least=(0, "0 = off"))
    ref_sync_steps: int = _doc("copy the policy into the reference every K training steps (rollouts; 0 = never; "
                                "R1: every 400 optimizer steps = 25 rollouts of 16 optimizer steps)", 0)
    ref_mixup_alpha: float = _doc("with ref_sync_steps: at each sync the reference moves toward the policy by this "
                                  "share, ref = alpha x policy + (1 - alpha) x ref (Polyak averaging; TRL's "
                                  "ref_model_mixup_alpha); 1 = a hard copy", 1.0, check=fraction_half_open)

    # --- [logging]: evaluation, logging, checkpoints
    eval_every: int = _doc("held-out greedy accuracy every N steps (and at the start and end)", 100, at_least=1)
    eval_size: int = _doc("held-out problems per evaluation", 256, at_least=1)
    eval_samples: int = _doc("k: at each evaluation also sample k completions per held-out problem (temperature "
                             "1, seeded) and log pass@1, pass@k and maj@k with 95% intervals; 0 = greedy only", 0, at_least=0)
    checkpoint_every: int = _doc("checkpoint every N steps (0 = only at the end)", 500)
    output_dir: str = _doc("run directory: metrics.jsonl, summary.json, plot, checkpoints", "runs/cpu-tiny")
    progress: bool = _doc("show a tqdm progress bar", True)
    log_entropy: bool = _doc("log the policy's exact entropy at every optimizer step (entropy/mean, /min, /max "
                             "over completions; one extra forward per step), as top_entropy_quantile < 1 "
                             "always does; the 'entropy' metric otherwise is the sampler's -log p estimate", False)

    def __post_init__(self):
        self.validate()

    def validate(self) -> None:
        """Every key's own rules (beside the key), then the rules across keys (config_rules.RULES): one
        line per refusal."""
        for key in dataclasses.fields(self):
            check_key(key.name, getattr(self, key.name), key.metadata)
        for rule in RULES:
            if rule.broken(self):
                raise ValueError(rule.message(self))

    @classmethod
    def from_toml(cls, path: str | Path | None = None, overrides: list[str] | None = None) -> "TrainConfig":
        """Defaults, then the TOML file (if any), then `key=value` overrides."""
        values: dict = {}
        if path is not None:
            with open(path, "rb") as f:
                values.update(_flatten_file(tomllib.load(f), str(path)))
        for override in overrides or []:
            key, value = parse_override(override)
            if key.startswith("rewards."):
                values.setdefault("rewards", dict(values.get("rewards", cls().rewards)))
                values["rewards"][key.split(".", 1)[1]] = _coerce("rewards.*", value, float)
            else:
                values[key] = value
        return cls.from_dict(values)

    @classmethod
    def from_dict(cls, values: dict) -> "TrainConfig":
        fields = {f.name: f for f in dataclasses.fields(cls)}
        typed = {}
        for key, value in values.items():
            if key in RENAMED:
                raise ValueError(RENAMED[key])
            if key not in fields:
                raise ValueError(f"unknown config key {key!r}; known keys: {', '.join(fields)}")
            typed[key] = _coerce(key, value, _resolved_types()[key])
        return cls(**typed)

    @classmethod
    def load_run_config(cls, run_dir: str | Path, overrides: list[str] | None = None) -> "TrainConfig":
        """The config a run directory was started with (its config.json), plus overrides."""
        import json
        path = Path(run_dir) / "config.json"
        if not path.is_file():
            raise ValueError(f"--resume {run_dir}: no config.json there (not a grpo-edu run directory)")
        values = _upgrade(json.loads(path.read_text()))
        for override in overrides or []:
            key, value = parse_override(override)
            values[key] = value
        values["output_dir"] = str(run_dir)
        return cls.from_dict(values)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# Keys that were replaced: the error names the new key.
RENAMED = {
    "fused_llama": "config key 'fused_llama' was replaced by 'engine': fused_llama = true is engine = \"fused\", "
                   "false is engine = \"hf\" (and engine = \"vllm\" is new)",
}


def _upgrade(saved: dict) -> dict:
    """A run directory's config.json as written before a key was replaced (so that an older
    run resumes): fused_llama = true/false is engine = "fused"/"hf"."""
    saved = dict(saved)
    if "fused_llama" in saved:
        saved["engine"] = "fused" if saved.pop("fused_llama") else "hf"
    return saved


def _resolved_types() -> dict:
    return typing.get_type_hints(TrainConfig)


def _flatten_file(data: dict, source: str) -> dict:
    # TOML sections are for reading only ([rollout], [loss], ...): keys are unique.
    flat = {}
    for key, value in data.items():
        if isinstance(value, dict) and key != "rewards":
            for inner, inner_value in value.items():
                if inner in flat:
                    raise ValueError(f"{source}: config key {inner!r} given twice")
                flat[inner] = inner_value
        else:
            flat[key] = value
    return flat


def parse_override(text: str) -> tuple[str, object]:
    """'beta=0.0' -> ('beta', 0.0): the value is read as TOML (strings may be bare)."""
    if "=" not in text:
        raise ValueError(f"--set expects key=value, got {text!r}")
    key, raw = (part.strip() for part in text.split("=", 1))
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare string: --set task=countdown
    return key, value


def _coerce(key: str, value, expected):
    """Check (and widen int -> float) a value against the field's type."""
    origin = typing.get_origin(expected)
    if origin in (typing.Union, types.UnionType):
        expected = tuple(t for t in typing.get_args(expected) if t is not type(None))[0]
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is bool and not isinstance(value, bool):
        raise ValueError(f"config key {key!r} must be true or false, got {value!r}")
    if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"config key {key!r} must be an integer, got {value!r}")
    if expected in (dict, list) and not isinstance(value, expected):
        raise ValueError(f"config key {key!r} must be a {expected.__name__}, got {value!r}")
    if expected is dict:
        return {str(k): _coerce(f"{key}.{k}", v, float) for k, v in value.items()}
    if expected in (float, str) and not isinstance(value, expected):
        raise ValueError(f"config key {key!r} must be a {expected.__name__}, got {value!r}")
    return value


def help_text() -> str:
    """Every key with its type, default and one-line doc (the --help epilog)."""
    lines = ["config keys (set in a TOML file or with --set key=value):"]
    hints = _resolved_types()
    for f in dataclasses.fields(TrainConfig):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kind = getattr(hints[f.name], "__name__", str(hints[f.name]))
        lines.append(f"  {f.name} ({kind}, default {default!r}): {f.metadata['doc']}")
    return "\n".join(lines)
