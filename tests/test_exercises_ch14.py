"""The chapter-14 checkers accept the worked solutions and name what a wrong answer got wrong; their
accounting is what the library's trainer writes and runs."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from test_trainer import small_config
from vllm_fake import fake_vllm
from grpo_edu.exercises import ch11, ch14
from grpo_edu.policy.models import STARTING_POLICY, load_policy, policy_source
from grpo_edu.training import trainer, update
from grpo_edu.training.checkpoint import KEEP
from grpo_edu.training.plan import optimizer_steps_per_rollout

# ----------------------------------------------------------------- 13.1


def run_disk(model, config):
    """The worked solution: sampler_init/ for a colocated vLLM engine from a hub id, the newest KEEP
    checkpoints of the trained weights, the reference and AdamW's two moments, and model/."""
    P = sum(p.numel() for p in model.parameters())
    if config.lora.lora_rank:
        trained = sum(config.lora.lora_rank * (m.in_features + m.out_features) for name, m in model.named_modules()
                      if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in config.lora.lora_target_modules)
        reference = 0
    else:
        trained, reference = P, (P if config.loss.beta > 0 else 0)
    every = config.logging.checkpoint_every
    written = {config.optimisation.steps} | (set(range(every, config.optimisation.steps + 1, every)) if every else set())
    from_hub = not Path(policy_source(config.run.model)).exists()
    return {"sampler_init": 4 * P if config.run.engine == "vllm" and config.vllm.vllm_mode == "colocate" and from_hub else 0,
            "checkpoints": min(KEEP, len(written)) * (12 * trained + 4 * reference), "model": 4 * P}


def test_run_disk_solution_passes():
    result = ch14.check_run_disk(run_disk)
    assert result and result.passed == len(ch14.DISK_CASES)


def test_the_accounting_is_chapter_12s():
    """The chapter's table: Qwen2.5-7B, full fine-tuning, beta 0.04, from the hub, KEEP checkpoints."""
    from grpo_edu.config import TrainConfig
    config = TrainConfig(model="Qwen/Qwen2.5-7B-Instruct", engine="vllm", beta=0.04)
    disk = ch14.run_disk_bytes(ch11.base_model("Qwen2.5-7B"), config)
    assert round(sum(disk.values()) / 1e9, 1) == 304.6 and KEEP == 2


def _tensor_bytes(path: Path) -> int:
    """The bytes of the tensors a safetensors file holds (its header left out)."""
    itemsize = {"F32": 4, "BF16": 2, "F16": 2, "I64": 8}
    with safe_open(str(path), "pt") as f:
        return sum(math.prod(f.get_slice(name).get_shape()) * itemsize[f.get_slice(name).get_dtype()]
                   for name in f.keys())


def _written(run_dir: Path) -> dict[str, int]:
    """The tensors' bytes in each folder of a finished run: the weights' safetensors files, and
    AdamW's moments in each checkpoint's trainer_state.pt."""
    folders = {"sampler_init": run_dir / "sampler_init", "model": run_dir / "model"}
    written = {part: sum(_tensor_bytes(p) for p in folder.glob("*.safetensors")) if folder.is_dir() else 0
               for part, folder in folders.items()}
    checkpoints = sorted((run_dir / "checkpoints").glob("step-*"))
    total = 0
    for folder in checkpoints:
        total += sum(_tensor_bytes(p) for p in folder.glob("*.safetensors"))
        state = torch.load(folder / "trainer_state.pt", weights_only=True)
        total += sum(t.numel() * t.element_size() for s in state["optimizer"]["state"].values()
                     for key, t in s.items() if key in ("exp_avg", "exp_avg_sq"))
    written["checkpoints"] = total
    return written


@pytest.mark.slow
@pytest.mark.parametrize("keys", [
    dict(beta=0.04, steps=3, checkpoint_every=1),                                     # 3 written, KEEP kept
    dict(beta=0.0, steps=3, checkpoint_every=2),                                      # at 2 and at the end
    dict(lora_rank=4, lora_alpha=8.0, lora_target_modules=["q_proj", "down_proj"], steps=2, checkpoint_every=0),
], ids=["reference", "no-reference", "lora"])
def test_the_accounting_is_what_a_run_writes(tmp_path, keys):
    config = small_config(tmp_path, eval_every=100, **keys)
    trainer.train(config, log=lambda _: None)
    assert _written(Path(config.logging.output_dir)) == ch14.run_disk_bytes(ch11.base_model(ch11.TINY), config)


@pytest.mark.slow
def test_a_colocated_engine_from_a_hub_id_writes_sampler_init(tmp_path):
    """The tiny policy standing in for a hub model: a policy whose name is not a folder is saved once
    into sampler_init/ for vLLM (here the stand-in) to start from."""
    config = small_config(tmp_path, engine="vllm", vllm_sleep_mode=False, model="Qwen/Qwen2.5-0.5B-Instruct",
                          steps=2, checkpoint_every=0, eval_every=100)
    policy, tokenizer = load_policy(STARTING_POLICY)
    policy.config._name_or_path = config.run.model
    with fake_vllm():
        trainer.train(config, policy=policy, tokenizer=tokenizer, log=lambda _: None)
    assert ch14.writes_sampler_init(config)
    assert _written(Path(config.logging.output_dir)) == ch14.run_disk_bytes(ch11.base_model(ch11.TINY), config)


def test_checkpoints_kept_counts_the_last_step_and_keeps_the_newest():
    from grpo_edu.config import TrainConfig
    assert [ch14.checkpoints_written(TrainConfig(steps=s, checkpoint_every=e))
            for s, e in ((1000, 100), (450, 200), (300, 500), (200, 0), (400, 200))] == [10, 3, 1, 1, 2]
    assert [ch14.checkpoints_kept(TrainConfig(steps=s, checkpoint_every=e))
            for s, e in ((1000, 100), (300, 500))] == [KEEP, 1]


def test_run_disk_mistakes_are_named():
    def table(model, config):   # the chapter's table, whatever the config
        P = sum(p.numel() for p in model.parameters())
        return {"sampler_init": 4 * P, "checkpoints": KEEP * 16 * P, "model": 4 * P}
    result = ch14.check_run_disk(table)
    assert result.passed == 0 and len(result.failures) == 6
    assert result.failures[0].endswith("checkpoints: a reference with beta = 0: the trainer builds none, so none "
                                       "is saved")
    assert "engine = 'hf' samples with the policy itself" in result.failures[2]
    assert "counts 2 checkpoints; this run writes fewer" in result.failures[2]
    assert "config.run.model is a folder on disk" in result.failures[3]
    assert "a vLLM server loads its model itself" in result.failures[4]

    def every_checkpoint(model, config):
        answer = run_disk(model, config)
        kept = ch14.checkpoints_kept(config)
        answer["checkpoints"] = answer["checkpoints"] // kept * ch14.checkpoints_written(config)
        return answer
    result = ch14.check_run_disk(every_checkpoint)
    assert len(result.failures) == 4 and all("counts every checkpoint the run writes" in f for f in result.failures)

    def merged_beside(model, config):
        answer = run_disk(model, config)
        if config.lora.lora_rank:
            answer["model"] += 4 * ch11.adapter_parameters(model, config)
        return answer
    result = ch14.check_run_disk(merged_beside)
    assert len(result.failures) == 3 and all("the adapters beside the base" in f for f in result.failures)

    def bf16_sampler(model, config):
        answer = run_disk(model, config)
        answer["sampler_init"] //= 2
        return answer
    result = ch14.check_run_disk(bf16_sampler)
    assert len(result.failures) == 3 and all("sampler_init: bf16" in f for f in result.failures)


def test_run_disk_reports_other_answers_without_the_right_one():
    result = ch14.check_run_disk(lambda model, config: {k: 3 * v for k, v in run_disk(model, config).items()})
    assert "model: is too large: about 3 times the right value" in result.failures[0]
    raises = ch14.check_run_disk(lambda *args: 1 / 0)
    assert len(raises.failures) == 6 and raises.failures[0].endswith("raised ZeroDivisionError: division by zero")
    assert "returned int, not a dict of sampler_init, checkpoints, model" in ch14.check_run_disk(lambda *a: 7).failures[0]
    partial = ch14.check_run_disk(lambda model, config: {"model": run_disk(model, config)["model"], "disk": 1})
    assert "no number for sampler_init, checkpoints; unknown keys ['disk']" in partial.failures[0]


# ----------------------------------------------------------------- 13.2

def rollout_numbers(config, gpus):
    """The worked solution."""
    prompts = config.rollout.prompts_per_step // gpus
    completions = prompts * config.rollout.num_generations
    per_step = completions // config.optimisation.num_mini_batches
    return {"prompts_per_engine": prompts, "completions_per_engine": completions,
            "completion_tokens_per_engine": completions * config.rollout.max_completion_length,
            "optimizer_steps_per_rollout": optimizer_steps_per_rollout(config),
            "micro_batches_per_optimizer_step": -(-per_step // config.optimisation.micro_batch_size)}


def test_rollout_numbers_solution_passes():
    result = ch14.check_rollout_numbers(rollout_numbers)
    assert result and result.passed == len(ch14.ROLLOUT_CASES)


@pytest.mark.slow
def test_the_micro_batches_are_the_trainers(tmp_path, monkeypatch):
    """One process: the micro-batches update.micro_batches gives each optimizer step."""
    counts = []
    original = update.micro_batches

    def counting(*args, **kwargs):
        parts = original(*args, **kwargs)
        counts.append(len(parts))
        return parts
    monkeypatch.setattr(update, "micro_batches", counting)
    config = small_config(tmp_path, prompts_per_step=8, num_mini_batches=2, num_iterations=2, micro_batch_size=3,
                          steps=1, checkpoint_every=0, eval_every=100)
    trainer.train(config, log=lambda _: None)
    numbers = ch14.rollout_numbers(config, 1)
    assert len(counts) == numbers["optimizer_steps_per_rollout"] == 4
    assert max(counts) == numbers["micro_batches_per_optimizer_step"] == 6   # 4 prompts x 4 = 16 rows, 3 at a time


def test_uneven_shares_take_the_busiest_gpu():
    """Where a GPU's share of a mini-batch is uneven, every GPU runs as many micro-batches as the
    busiest (update.micro_batches pads the others)."""
    from grpo_edu.config import TrainConfig
    config = TrainConfig(prompts_per_step=48, num_generations=4, num_mini_batches=4, micro_batch_size=4)
    # 6 prompts per GPU on 8 GPUs, dealt into 4 mini-batches: 2, 2, 1, 1 of them per GPU
    assert ch14.rollout_numbers(config, 8)["micro_batches_per_optimizer_step"] == 2


def test_rollout_numbers_mistakes_are_named():
    def whole_mini_batch(config, gpus):
        answer = rollout_numbers(config, gpus)
        answer["micro_batches_per_optimizer_step"] = -(-config.rollout.prompts_per_step * config.rollout.num_generations
                                                      // config.optimisation.num_mini_batches // config.optimisation.micro_batch_size)
        return answer
    result = ch14.check_rollout_numbers(whole_mini_batch)
    assert result.passed == 2 and all("a whole mini-batch's micro-batches" in f for f in result.failures)

    def one_pass(config, gpus):
        return {**rollout_numbers(config, gpus), "optimizer_steps_per_rollout": config.optimisation.num_mini_batches}
    result = ch14.check_rollout_numbers(one_pass)
    assert len(result.failures) == 1 and "(num_iterations) takes num_mini_batches" in result.failures[0]

    def whole_step(config, gpus):
        return rollout_numbers(config.replace(), 1)
    result = ch14.check_rollout_numbers(whole_step)
    assert "prompts_per_engine: the whole step's prompts" in result.failures[0]
    assert "completions_per_engine: the whole step's completions" in result.failures[0]

    def no_tokens(config, gpus):
        answer = rollout_numbers(config, gpus)
        return {**answer, "completion_tokens_per_engine": answer["completions_per_engine"]}
    result = ch14.check_rollout_numbers(no_tokens)
    assert len(result.failures) == 6 and all("counts completions, not their tokens" in f for f in result.failures)


def test_rollout_numbers_reports_other_answers_without_the_right_one():
    result = ch14.check_rollout_numbers(lambda config, gpus: {k: v + 1 for k, v in
                                                              rollout_numbers(config, gpus).items()})
    assert "prompts_per_engine: is too large" in result.failures[0]
    raises = ch14.check_rollout_numbers(lambda *args: 1 / 0)
    assert len(raises.failures) == 6 and raises.failures[0].endswith("raised ZeroDivisionError: division by zero")
