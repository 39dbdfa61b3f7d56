"""The GPU configs: complete, valid, and their comments' batch arithmetic true to their values.

configs/gpu-1x.toml (one GPU) and configs/h100-8x.toml (torchrun --nproc-per-node 8) state
in comments how their batch divides (prompts per rank, completions, tokens, optimizer and
micro-batch steps). This recomputes every one of those lines from the file's values, so a
changed value with a stale comment fails here. No GPU is needed: the files are only parsed.
"""

import dataclasses
import math
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from grpo_edu.config import TrainConfig
from grpo_edu.config.files import read_file

resolve = TrainConfig.resolve
from grpo_edu.training.plan import plan_mini_batches

ROOT = Path(__file__).resolve().parents[1]
# Each file and the number of processes it is written for: the GPU tier's configs (the committed
# tiny policy), and the hub recipes (Qwen2.5-0.5B-Instruct on GSM8K and Countdown).
GPU_TIER = {"gpu-1x.toml": 1, "gpu-1x-async.toml": 1, "h100-8x.toml": 8, "h100-8x-async.toml": 8}
RECIPES = {f"qwen2.5-0.5b-{task}-{n}x.toml": n for task in ("gsm8k", "countdown") for n in (1, 8)}
FROM_SCRATCH = {"gpu-countdown-from-scratch.toml": 1}   # the download-free recipe
SGLANG = {"gpu-1x-sglang.toml": 1}   # the GPU tier's run with an SGLang server as the sampler
WORLD_SIZE = {**GPU_TIER, **RECIPES, **FROM_SCRATCH, **SGLANG}


def load(name: str) -> tuple[TrainConfig, str]:
    path = ROOT / "configs" / name
    return TrainConfig.from_toml(path), path.read_text()


def normalised_comments(text: str) -> list[str]:
    """Every comment line, from its '#', with runs of spaces made one."""
    return [" ".join(line.split()) for line in text.splitlines() if line.lstrip().startswith("#")]


def most_rows_of_a_mini_batch(config: TrainConfig, world_size: int) -> int:
    """The most completions one rank holds of one mini-batch, from the trainer's own plan of
    a rollout's mini-batches (no groups filtered); each rank owns a contiguous slice of
    B / N prompts."""
    B, G = config.rollout.prompts_per_step, config.rollout.num_generations
    per_rank = B // world_size
    plan = plan_mini_batches(config.replace(filter_zero_std_groups=False), torch.zeros(B, G))
    return G * max(int(((prompts >= r * per_rank) & (prompts < (r + 1) * per_rank)).sum())
                   for prompts in plan for r in range(world_size))


def arithmetic_lines(config: TrainConfig, N: int) -> list[str]:
    B, G, L = config.rollout.prompts_per_step, config.rollout.num_generations, config.rollout.max_completion_length
    mu, M, size = config.optimisation.num_iterations, config.optimisation.num_mini_batches, config.optimisation.micro_batch_size
    rows = most_rows_of_a_mini_batch(config, N)
    return [
        f"# processes N = {N}",
        f"# prompts per rank B / N = {B:,} / {N} = {B // N:,}",
        f"# completions per step B x G = {B:,} x {G} = {B * G:,}",
        f"# completions per rank B x G / N = {B * G:,} / {N} = {B * G // N:,}",
        f"# tokens per step, at most B x G x L = {B * G:,} x {L} = {B * G * L:,}",
        f"# optimizer steps per rollout K = num_iterations x num_mini_batches = {mu} x {M} = {mu * M}",
        f"# completions per optimizer step B x G / num_mini_batches = {B * G:,} / {M} = {B * G // M:,}",
        f"# micro-batches per rank per optimizer step ceil({rows:,} / micro_batch_size) = "
        f"ceil({rows:,} / {size}) = {math.ceil(rows / size)}",
    ]


@pytest.mark.parametrize("name", sorted(WORLD_SIZE))
def test_every_key_resolves_from_the_file_its_bases_or_the_defaults(name):
    """The file lists what it changes; the resolved config has every key, each from the file, a
    base it names (down to configs/cpu-tiny.toml) or the defaults."""
    resolved = resolve(ROOT / "configs" / name)
    assert set(resolved.config.to_dict()) == set(TrainConfig.keys())
    chain = {str(path) for path in resolved.files}
    assert str(ROOT / "configs" / "cpu-tiny.toml") in chain and str(ROOT / "configs" / name) in chain
    assert set(resolved.sources.values()) <= chain | {"default"}
    own, _ = read_file(ROOT / "configs" / name)
    assert {key for key, source in resolved.sources.items() if source == str(ROOT / "configs" / name)} == set(own)


@pytest.mark.parametrize("name", sorted(GPU_TIER))
def test_gpu_settings(name):
    config, text = load(name)
    N = WORLD_SIZE[name]
    assert (config.run.device, config.run.engine, config.run.precision) == ("cuda", "vllm", "bf16")
    assert config.run.parallelism == ("ddp" if N == 1 else "fsdp2")
    assert config.rollout.prompts_per_step % N == 0, f"prompts_per_step {config.rollout.prompts_per_step} must divide among {N}"
    assert config.logging.output_dir == f"runs/{name.removesuffix('.toml')}"
    launch = (f"grpo-edu train --config configs/{name}" if N == 1 else
              f"torchrun --standalone --nproc-per-node {N} -m grpo_edu train --config configs/{name}")
    assert launch in text
    assert 'model = "/path/to/local/model"' in text


def test_sglang_settings():
    """The SGLang config: gpu-1x.toml's run (every key but the engine's, tis_cap's comment and the
    output folder the same), an SGLang server started on the trainer's GPU that sleeps while the
    trainer updates, weights synced as CUDA IPC handles; each sglang_* key commented; said to be
    not measured."""
    config, text = load("gpu-1x-sglang.toml")
    reference, _ = load("gpu-1x.toml")
    assert (config.run.device, config.run.engine, config.run.precision, config.run.parallelism) == ("cuda", "sglang", "bf16", "ddp")
    assert (config.sglang.sglang_url, config.sglang.sglang_device, config.sglang.sglang_sleep, config.sglang.sglang_weight_sync) == \
        ("", "cuda", True, "tensor")
    assert config.sglang.sglang_deterministic and 0 < config.sglang.sglang_mem_fraction_static < 0.5
    differ = {key for key in TrainConfig.keys() if config.value(key) != reference.value(key)}
    assert differ == {"engine", "sglang_weight_sync", "sglang_sleep", "output_dir"}
    assert config.logging.output_dir == "runs/gpu-1x-sglang"
    assert "grpo-edu train --config configs/gpu-1x-sglang.toml" in text and "Not measured here" in text
    assert 'model = "/path/to/local/model"' in text
    for line in text.splitlines():
        if line.startswith("sglang_"):
            assert "#" in line and len(line.split("#", 1)[1].strip()) > 10, f"no explanation: {line}"
    # the memory split the header states is the file's own value
    assert f"sglang_mem_fraction_static = {config.sglang.sglang_mem_fraction_static} of the GPU" in text


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_settings(name):
    """A hub recipe: the instruct model, its chat template, the task its name says, vLLM on CUDA in
    bf16, the launch command, and figures not measured here said to be so."""
    config, text = load(name)
    N = RECIPES[name]
    assert (config.run.model, config.data.chat_template) == ("Qwen/Qwen2.5-0.5B-Instruct", True)
    assert config.run.task == name.split("-")[2]
    assert (config.run.device, config.run.engine, config.run.precision) == ("cuda", "vllm", "bf16")
    assert config.logging.output_dir == f"runs/{name.removesuffix('.toml')}"
    launch = (f"grpo-edu train --config configs/{name}" if N == 1 else
              f"torchrun --standalone --nproc-per-node {N} -m grpo_edu train --config configs/{name}")
    assert launch in text and "not measured here" in text


@pytest.mark.parametrize("name", sorted(WORLD_SIZE))
def test_batch_arithmetic_in_the_comments_matches_the_values(name):
    config, text = load(name)
    comments = normalised_comments(text)
    for line in arithmetic_lines(config, WORLD_SIZE[name]):
        assert line in comments, f"configs/{name}: expected the comment line\n  {line}\nthe file has:\n" + \
            "\n".join(c for c in comments if c.split(" = ")[0] == line.split(" = ")[0] or
                      c[:20] == line[:20])


def test_mini_batches_are_dealt_over_all_ranks():
    """The 8-GPU config's comments say num_mini_batches = 4 would put 16 of every rank's 64
    prompts in each mini-batch (the trainer deals groups out)."""
    config, _ = load("h100-8x.toml")
    config = config.replace(num_mini_batches=4)
    assert most_rows_of_a_mini_batch(config, WORLD_SIZE["h100-8x.toml"]) == 16 * config.rollout.num_generations


@pytest.mark.parametrize("name", sorted(WORLD_SIZE))
def test_numbers_in_other_comments(name):
    """The other derived figures the comments state."""
    config, text = load(name)
    comments = " ".join(" ".join(line.split("#", 1)[1].split()) for line in text.splitlines() if "#" in line)
    K = config.optimisation.num_iterations * config.optimisation.num_mini_batches
    if K > 1:
        assert f"{config.optimisation.steps:,} x {K} = {config.optimisation.steps * K:,} optimizer steps" in comments
    else:
        assert f"{config.optimisation.steps:,} x {config.rollout.prompts_per_step:,} = {config.optimisation.steps * config.rollout.prompts_per_step:,}" \
            f" prompts drawn" in comments
    assert re.search(rf"decays to 0 over all {config.optimisation.steps * K:,} optimizer steps", comments)


def test_the_download_free_recipe_pretrains_a_model_of_tens_of_millions_that_fits_its_task():
    """Step 1's command (in the file's comments) parses as python -m grpo_edu.commands.pretrain's flags,
    builds a model of tens of millions of parameters whose positions hold a prompt and L
    tokens, on the task and to the folder that step 2's config trains."""
    import shlex

    from grpo_edu.environment import tasks
    from grpo_edu.policy.models import char_tokenizer, tiny_llama
    from grpo_edu.commands.pretrain import parse_args
    config, text = load("gpu-countdown-from-scratch.toml")
    line = next(line for line in text.splitlines() if "python -m grpo_edu.commands.pretrain" in line)
    pretrain = parse_args(shlex.split(line.split("python -m grpo_edu.commands.pretrain", 1)[1]))
    assert (pretrain.task, pretrain.device, pretrain.output_dir) == (config.run.task, "cuda", config.run.model)
    tokenizer = char_tokenizer()
    with torch.device("meta"):
        model = tiny_llama(tokenizer, hidden_size=pretrain.hidden_size, num_layers=pretrain.num_layers,
                           num_heads=pretrain.num_heads, intermediate_size=pretrain.intermediate_size,
                           max_position_embeddings=pretrain.max_position_embeddings)
    assert 10e6 <= sum(p.numel() for p in model.parameters()) < 100e6
    longest_prompt = max(len(tokenizer(s["prompt"])["input_ids"]) for s in tasks.make_dataset("countdown", 500))
    assert longest_prompt + config.rollout.max_completion_length <= pretrain.max_position_embeddings
    assert pretrain.max_new_tokens == config.rollout.max_completion_length


# --------------------------------------------------------------------------- what the hub recipes' model reads

# A chat template in the form of Qwen2.5-Instruct's (its default system message, ChatML turns;
# the tool-calling branches left out), on the local character tokenizer: the recipes' prompt
# path without a download.
QWEN_CHAT_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (message['role'] == 'system' and loop.first) %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


def chat_tokenizer():
    from grpo_edu.policy.models import char_tokenizer
    tokenizer = char_tokenizer(max_length=4096)
    tokenizer.chat_template = QWEN_CHAT_TEMPLATE
    return tokenizer


def rollout_of(tokenizer, prompt: str, completions: list[str]):
    """A Rollout of one prompt's G completions, each ended by <eos> (as an engine returns it)."""
    from grpo_edu.sampling.rollout import Rollout
    G = len(completions)
    prompt_ids = torch.tensor([tokenizer(prompt, add_special_tokens=False)["input_ids"]] * G)
    rows = [tokenizer(c, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for c in completions]
    S = max(map(len, rows))
    completion_ids = torch.tensor([r + [tokenizer.pad_token_id] * (S - len(r)) for r in rows])
    completion_mask = torch.tensor([[1] * len(r) + [0] * (S - len(r)) for r in rows]).bool()
    return Rollout(prompt_ids, torch.ones_like(prompt_ids), completion_ids, completion_mask,
                   torch.zeros(G, S), torch.ones(G, dtype=torch.bool), G)


def recipe_with_local_data(name: str, tmp_path) -> TrainConfig:
    """The recipe, its GSM8K read from a local folder in GSM8K's layout (two rows a split)."""
    config, _ = load(name)
    if config.run.task == "gsm8k":
        import json
        rows = [{"question": "Tom has 3 apples and buys 4 more. How many apples does he have?",
                 "answer": "3 + 4 = 7\n#### 7"},
                {"question": "A box holds 6 eggs. How many eggs are in 2 boxes?", "answer": "6 * 2 = 12\n#### 12"}]
        for split in ("train", "test"):
            (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        config = config.replace(dataset=str(tmp_path))
    return config.replace(eval_size=2)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_a_completion_in_the_format_the_recipe_asks_for_scores_full_marks(name, tmp_path):
    """The recipe's exact prompt path (grpo_edu.environment.tasks.task_pools: the task's instruction, then the
    chat template) asks for <think>...</think>\\boxed{...}; a completion written that way, scored
    as the trainer scores a rollout (grpo_edu.training.scoring.score with the recipe's reward functions),
    earns every reward's full weight; the ways of missing the format score less."""
    from grpo_edu.environment import tasks
    from grpo_edu.training.scoring import score
    from grpo_edu.training.user_functions import functions_from_config
    config = recipe_with_local_data(name, tmp_path)
    tokenizer = chat_tokenizer()
    _, held_out = tasks.task_pools(config, tokenizer)
    sample = held_out[0]
    instruction = tasks.TASKS[config.run.task].instruction
    bare = sample["prompt"].split("<|im_start|>user\n", 1)[1].split(f"\n{instruction}\n<|im_end|>", 1)[0]
    assert sample["prompt"] == (
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{bare}\n{instruction}\n<|im_end|>\n<|im_start|>assistant\n")
    assert "<think>" in instruction and "</think>" in instruction and "\\boxed{" in instruction
    if config.run.task == "countdown":
        assert re.fullmatch(r"Use \d+ \d+ \d+ to make \d+:", bare)
        reasoning, answer = sample["solution"].split("</think>")[0].removeprefix("<think>"), \
            sample["solution"].split("\\boxed{", 1)[1][:-1]
    else:
        reasoning, answer = "3 + 4 = 7", sample["answer"]
    advantage_fn, reward_functions = functions_from_config(config)
    full = sum(weight for _, weight in reward_functions.values())
    completions = [
        f"<think>{reasoning}</think>\\boxed{{{answer}}}",                          # as instructed
        f"<think>\nLet me work it out.\n{reasoning}\n</think>\n\n\\boxed{{{answer}}}",  # with a chat model's spacing
        f"{reasoning}, so the answer is {answer}.",                              # no tags, no box: what an
        f"<think>{reasoning}</think>\\boxed{{{answer}}} I hope it helps.",         # untold model writes
    ]
    config = config.replace(num_generations=len(completions))
    _, plan = score(config, [sample], rollout_of(tokenizer, sample["prompt"], completions), tokenizer,
                    reward_functions, advantage_fn)
    assert full == 1.5 and plan.rewards[0].tolist() == [full, full, 0.0, full - config.run.rewards["format"]]
    assert plan.components["accuracy"][0].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert plan.components["format"][0].tolist() == [1.0, 1.0, 0.0, 0.0]


def test_without_the_instruction_the_countdown_recipe_would_ask_for_nothing(tmp_path):
    """The bare prompt (task_instruction = false) names neither the tags nor the box."""
    from grpo_edu.environment import tasks
    config = recipe_with_local_data("qwen2.5-0.5b-countdown-1x.toml", tmp_path).replace(task_instruction=False)
    _, held_out = tasks.task_pools(config, chat_tokenizer())
    assert all("<think>" not in s["prompt"] and "boxed" not in s["prompt"] for s in held_out)


# --------------------------------------------------------------------------- how long a completion may be

# Reported, not measured here (huggingface/trl issue #6263): Qwen2.5-0.5B-Instruct's GSM8K
# completions have a median of ~274 tokens, and ~57% were cut at max_completion_length = 256.
REPORTED_MEDIAN, REPORTED_LIMIT, REPORTED_TRUNCATED = 274, 256, 0.57


def lognormal_share_above(limit: int) -> float:
    """The share of completions longer than `limit` under a log-normal through the two
    reported figures (a rough model: the tail itself is not reported)."""
    from statistics import NormalDist
    z = NormalDist().inv_cdf(1 - REPORTED_TRUNCATED)
    sigma = (math.log(REPORTED_LIMIT) - math.log(REPORTED_MEDIAN)) / z
    return 1 - NormalDist().cdf((math.log(limit) - math.log(REPORTED_MEDIAN)) / sigma)


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_every_hub_recipe_leaves_room_for_the_reported_completion_lengths(name):
    """Each recipe's L is above the limit that cut most completions, leaves most of the reported
    length distribution below it, and its comment says why, with what is reported and the doctor
    that watches the share truncated."""
    config, _ = load(name)
    L = config.rollout.max_completion_length
    assert L > REPORTED_LIMIT and L >= 1.5 * REPORTED_MEDIAN and lognormal_share_above(L) < 0.1
    # the comment where L is set: this file, or the base it takes L from
    text = Path(resolve(ROOT / "configs" / name).sources["max_completion_length"]).read_text()
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("max_completion_length"))
    block = [lines[first]]
    for line in lines[first + 1:]:
        if not line.startswith(" " * 33 + "#"):
            break
        block.append(line)
    comment = " ".join(" ".join(line.split("#", 1)[1].split()) for line in block)
    for said in ("median of ~274 tokens", "~57% of them", "cut at 256", "huggingface/trl issue #6263",
                 "not measured here" if config.run.task == "gsm8k" else "none was measured here",
                 "scores 0", "truncated_completions"):
        assert said in comment, f"configs/{name}: the comment on max_completion_length lacks {said!r}"
    if config.run.task == "gsm8k":
        assert f"~{lognormal_share_above(L):.0%} above {L}" in comment


def test_the_asynchronous_variant_is_the_one_gpu_config_with_the_sampler_one_rollout_ahead():
    """configs/gpu-1x-async.toml differs from configs/gpu-1x.toml in the keys its comments name,
    and those make it asynchronous: a lag of one update, sampled in the background, by a vLLM
    that stays awake; the same optimizer steps, each on as many completions; the correction its
    comments call chapter 12's best at k = 1 is the best in chapter 12's results file."""
    import json
    sync, _ = load("gpu-1x.toml")
    lagged, text = load("gpu-1x-async.toml")
    differ = {key for key in TrainConfig.keys() if lagged.value(key) != sync.value(key)}
    assert differ == {"prompts_per_step", "num_mini_batches", "steps", "rollout_lag", "rollout_overlap",
                      "vllm_sleep_mode", "eval_every", "checkpoint_every", "output_dir"}
    comments = " ".join(normalised_comments(text))
    for key in differ - {"output_dir"}:
        assert key in comments, f"the comments do not name {key}"
    assert (lagged.off_policy.rollout_lag, lagged.off_policy.rollout_overlap, lagged.vllm.vllm_sleep_mode) == (1, True, False)
    assert lagged.off_policy.old_logprobs == "recomputed" and lagged.optimisation.num_iterations * lagged.optimisation.num_mini_batches == 1

    def optimizer_steps(c):
        return c.optimisation.steps * c.optimisation.num_iterations * c.optimisation.num_mini_batches
    assert optimizer_steps(lagged) == optimizer_steps(sync) == 1600
    assert (lagged.rollout.prompts_per_step * lagged.rollout.num_generations // lagged.optimisation.num_mini_batches
            == sync.rollout.prompts_per_step * sync.rollout.num_generations // sync.optimisation.num_mini_batches)
    assert lagged.logging.eval_every == sync.logging.eval_every * sync.optimisation.num_mini_batches   # the same optimizer steps apart
    results = json.loads((ROOT / "benchmarks" / "results" / "lag.json").read_text())["runs"]
    at_1 = {name: sum(r["final_accuracy"] for r in results if (r["correction"], r["lag"]) == (name, 1))
            for name in {r["correction"] for r in results}}
    assert max(at_1, key=at_1.get) == "clip"   # old_logprobs = "recomputed": the clip sees the staleness


def test_the_asynchronous_eight_gpu_variant_samples_in_the_background_on_every_rank():
    """configs/h100-8x-async.toml differs from configs/h100-8x.toml in the keys its comments name:
    a lag of one update sampled in the background by an awake vLLM, pi_old at the update with
    TIS (no whole copy per rank); its accuracy figures are chapter 12's results file's, and its
    memory arithmetic is recomputed here."""
    import json
    from statistics import mean
    sync, sync_text = load("h100-8x.toml")
    lagged, text = load("h100-8x-async.toml")
    differ = {key for key in TrainConfig.keys() if lagged.value(key) != sync.value(key)}
    assert differ == {"rollout_lag", "rollout_overlap", "old_logprobs", "vllm_sleep_mode", "output_dir"}
    def prose(source):   # the comments as running text, without their '#'
        return " ".join(" ".join(line.split("#", 1)[1].split()) for line in source.splitlines() if "#" in line)
    comments = prose(text)
    for key in differ:
        assert key in comments, f"the comments do not name {key}"
    assert (lagged.off_policy.rollout_lag, lagged.off_policy.rollout_overlap, lagged.vllm.vllm_sleep_mode) == (1, True, False)
    assert (lagged.off_policy.old_logprobs, lagged.off_policy.tis_cap, lagged.run.parallelism) == ("proximal", 2.0, "fsdp2")
    results = json.loads((ROOT / "benchmarks" / "results" / "lag.json").read_text())
    at_1 = {name: mean(r["final_accuracy"] for r in results["runs"] if (r["correction"], r["lag"]) == (name, 1))
            for name in ("tis", "clip")}
    assert results["corrections"]["tis"] == {"old_logprobs": "proximal", "tis_cap": lagged.off_policy.tis_cap}
    assert f"{len(results['seeds'])} seeds, k = 1) TIS ended at {at_1['tis']:.3f}" in comments
    assert f"the clip at {at_1['clip']:.3f}" in comments
    # The memory: 16 bytes per parameter sharded 8 ways plus the reference's 4 / 8 (fsdp2, from
    # configs/h100-8x.toml), vLLM's share of an 80 GB H100 held awake, the evaluation's copy.
    params, gpu = 7e9, 80
    N = WORLD_SIZE["h100-8x-async.toml"]
    sharded = params * (16 + 4) / N / 1e9
    awake = lagged.vllm.vllm_gpu_memory_utilization * gpu
    copy = params * 4 / 1e9
    assert f"7e9 x (2 + 0.5) = {sharded:g} GB" in prose(sync_text)
    assert (f"{sharded:g} GB (fsdp2, see configs/h100-8x.toml) + {lagged.vllm.vllm_gpu_memory_utilization} x {gpu} = "
            f"{awake:.1f} GB = {sharded + awake:.1f} GB per GPU before activations") in comments
    assert f"{sharded + awake + copy:.1f} GB while an evaluation holds its gathered float32 copy ({copy:g} GB)" in comments
    assert sharded + awake + copy < gpu
    assert f"(4 bytes per parameter: {copy:g} GB for a 7B model, beside fsdp2's {sharded:g} GB)" in comments
