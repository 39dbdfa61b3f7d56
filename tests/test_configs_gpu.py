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

from grpo_edu.config import TrainConfig, _flatten_file, tomllib
from grpo_edu.scoring import plan_mini_batches

ROOT = Path(__file__).resolve().parents[1]
# Each file and the number of processes it is written for: the GPU tier's configs (the committed
# tiny policy), and the hub recipes (Qwen2.5-0.5B-Instruct on GSM8K and Countdown).
GPU_TIER = {"gpu-1x.toml": 1, "h100-8x.toml": 8}
RECIPES = {f"qwen2.5-0.5b-{task}-{n}x.toml": n for task in ("gsm8k", "countdown") for n in (1, 8)}
FROM_SCRATCH = {"gpu-countdown-from-scratch.toml": 1}   # the download-free recipe
WORLD_SIZE = {**GPU_TIER, **RECIPES, **FROM_SCRATCH}


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
    B, G = config.prompts_per_step, config.num_generations
    per_rank = B // world_size
    plan = plan_mini_batches(replace(config, filter_zero_std_groups=False), torch.zeros(B, G))
    return G * max(int(((prompts >= r * per_rank) & (prompts < (r + 1) * per_rank)).sum())
                   for prompts in plan for r in range(world_size))


def arithmetic_lines(config: TrainConfig, N: int) -> list[str]:
    B, G, L = config.prompts_per_step, config.num_generations, config.max_completion_length
    mu, M, size = config.num_iterations, config.num_mini_batches, config.micro_batch_size
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
def test_every_key_is_in_the_file(name):
    with open(ROOT / "configs" / name, "rb") as f:
        keys = set(_flatten_file(tomllib.load(f), name))
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    assert fields - keys == set(), f"configs/{name} lacks keys {sorted(fields - keys)}"
    assert keys - fields == set(), f"configs/{name} has unknown keys {sorted(keys - fields)}"


@pytest.mark.parametrize("name", sorted(GPU_TIER))
def test_gpu_settings(name):
    config, text = load(name)
    N = WORLD_SIZE[name]
    assert (config.device, config.engine, config.precision) == ("cuda", "vllm", "bf16")
    assert config.parallelism == ("ddp" if N == 1 else "fsdp2")
    assert config.prompts_per_step % N == 0, f"prompts_per_step {config.prompts_per_step} must divide among {N}"
    assert config.output_dir == f"runs/{name.removesuffix('.toml')}"
    launch = (f"grpo-edu train --config configs/{name}" if N == 1 else
              f"torchrun --standalone --nproc-per-node {N} -m grpo_edu train --config configs/{name}")
    assert launch in text
    assert 'model = "/path/to/local/model"' in text


@pytest.mark.parametrize("name", sorted(RECIPES))
def test_recipe_settings(name):
    """A hub recipe: the instruct model, its chat template, the task its name says, vLLM on CUDA in
    bf16, the launch command, and figures not measured here said to be so."""
    config, text = load(name)
    N = RECIPES[name]
    assert (config.model, config.chat_template) == ("Qwen/Qwen2.5-0.5B-Instruct", True)
    assert config.task == name.split("-")[2]
    assert (config.device, config.engine, config.precision) == ("cuda", "vllm", "bf16")
    assert config.output_dir == f"runs/{name.removesuffix('.toml')}"
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
    config = replace(config, num_mini_batches=4)
    assert most_rows_of_a_mini_batch(config, WORLD_SIZE["h100-8x.toml"]) == 16 * config.num_generations


@pytest.mark.parametrize("name", sorted(WORLD_SIZE))
def test_numbers_in_other_comments(name):
    """The other derived figures the comments state."""
    config, text = load(name)
    comments = " ".join(" ".join(line.split("#", 1)[1].split()) for line in text.splitlines() if "#" in line)
    K = config.num_iterations * config.num_mini_batches
    if K > 1:
        assert f"{config.steps:,} x {K} = {config.steps * K:,} optimizer steps" in comments
    else:
        assert f"{config.steps:,} x {config.prompts_per_step:,} = {config.steps * config.prompts_per_step:,}" \
            f" prompts drawn" in comments
    assert re.search(rf"decays to 0 over all {config.steps * K:,} optimizer steps", comments)


def test_the_download_free_recipe_pretrains_a_model_of_tens_of_millions_that_fits_its_task():
    """Step 1's command (in the file's comments) parses as python -m grpo_edu.pretrain's flags,
    builds a model of tens of millions of parameters whose positions hold a prompt and L
    tokens, on the task and to the folder that step 2's config trains."""
    import shlex

    from grpo_edu import tasks
    from grpo_edu.models import char_tokenizer, tiny_llama
    from grpo_edu.pretrain import parse_args
    config, text = load("gpu-countdown-from-scratch.toml")
    line = next(line for line in text.splitlines() if "python -m grpo_edu.pretrain" in line)
    pretrain = parse_args(shlex.split(line.split("python -m grpo_edu.pretrain", 1)[1]))
    assert (pretrain.task, pretrain.device, pretrain.output_dir) == (config.task, "cuda", config.model)
    tokenizer = char_tokenizer()
    with torch.device("meta"):
        model = tiny_llama(tokenizer, hidden_size=pretrain.hidden_size, num_layers=pretrain.num_layers,
                           num_heads=pretrain.num_heads, intermediate_size=pretrain.intermediate_size,
                           max_position_embeddings=pretrain.max_position_embeddings)
    assert 10e6 <= sum(p.numel() for p in model.parameters()) < 100e6
    longest_prompt = max(len(tokenizer(s["prompt"])["input_ids"]) for s in tasks.make_dataset("countdown", 500))
    assert longest_prompt + config.max_completion_length <= pretrain.max_position_embeddings
    assert pretrain.max_new_tokens == config.max_completion_length
