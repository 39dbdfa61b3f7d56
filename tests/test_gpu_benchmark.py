"""benchmarks/gpu.py: the GPU measurement, run at toy size on the CPU (`--toy`), as a reader or CI
runs it: the results file's structure, and that its numbers are measured (steps timed, accuracies
in [0, 1], the tensors the trainer holds equal to chapter 11's 20 bytes per parameter, no GPU peak
on the CPU but a reason). Its figures on a GPU need a GPU: no test here can check them."""

import importlib.util
import json
import math
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from hang_guard import HANG_SECONDS

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu.py"
PARTS = ["tiny", "countdown-pretrain", "countdown-grpo", "qwen2.5-0.5b", "qwen2.5-1.5b", "qwen2.5-1.5b-lora",
         "qwen2.5-7b-lora", "qwen2.5-7b-lora-mb8"]


def run_script(*args, check=True):
    done = subprocess.run([sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True,
                          timeout=HANG_SECONDS, cwd=ROOT)
    if check and done.returncode != 0:
        raise AssertionError(f"benchmarks/gpu.py {' '.join(map(str, args))} exited {done.returncode}:\n"
                             f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return done


@pytest.fixture(scope="module")
def gpu_benchmark():
    spec = importlib.util.spec_from_file_location("gpu_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    """One `--toy` run of every part, as CI runs it."""
    work = tmp_path_factory.mktemp("gpu-benchmark")
    done = run_script("--toy", "--work-dir", work, "--out", work / "gpu.json")
    return work, json.loads((work / "gpu.json").read_text()), done.stdout


def _seconds_increase(curve):
    seconds = [point["seconds"] for point in curve]
    return all(s >= 0 for s in seconds) and seconds == sorted(seconds)


def test_every_part_is_written_with_its_environment(toy):
    _, results, _ = toy
    assert results["format"] == 1 and results["written_by"] == "benchmarks/gpu.py"
    assert list(results["parts"]) == PARTS
    for name, entry in results["parts"].items():
        assert entry["status"] in ("done", "not_reached"), (name, entry.get("error"))
        assert entry["toy"] is True and entry["commands"] == 1 and entry["wall_seconds"] > 0
        datetime.fromisoformat(entry["measured_utc"])
        env = entry["environment"]
        assert env["device"] == "cpu" and env["torch"] == torch.__version__ and env["gpu"] is None
        assert set(env) >= {"python", "transformers", "cuda", "cpu_count", "git_commit", "vllm"}
        # On the CPU there is no GPU peak: null, and the reason says so.
        assert entry["peak_memory_allocated_bytes"] is None and entry["peak_memory_reserved_bytes"] is None
        assert "no CUDA" in entry["peak_memory_note"]


def test_the_tiny_recipe_is_timed_to_its_target(toy):
    _, results, _ = toy
    tiny = results["parts"]["tiny"]
    assert tiny["config"] == "configs/gpu-1x.toml" and "engine=hf" in tiny["overrides"]
    assert tiny["target"] == {"held_out_greedy_accuracy": 0.9}
    assert [p["step"] for p in tiny["eval_curve"]] == [0, 2, 4] and _seconds_increase(tiny["eval_curve"])
    assert all(0.0 <= p["accuracy"] <= 1.0 for p in tiny["eval_curve"])
    assert tiny["start_accuracy"] == tiny["eval_curve"][0]["accuracy"]
    reached = [p for p in tiny["eval_curve"][1:] if p["accuracy"] >= 0.9]
    assert tiny["reached"] == bool(reached) and tiny["status"] == ("done" if reached else "not_reached")
    if reached:
        assert tiny["steps_to_target"] == reached[0]["step"] and tiny["time_to_target_s"] == reached[0]["seconds"]
    else:
        assert tiny["time_to_target_s"] is None and tiny["steps"] == tiny["recipe_steps"] == 4
    assert tiny["step_seconds_median"] > 0 and tiny["completion_tokens_per_second"] > 0
    assert all(tiny["time_split_median_s"][k] > 0 for k in ("rollout", "scoring", "update"))


def test_the_countdown_recipe_runs_end_to_end(toy):
    work, results, _ = toy
    step1, step2 = results["parts"]["countdown-pretrain"], results["parts"]["countdown-grpo"]
    # Step 1 is the recipe's own command, with the benchmark's output directory (never the package's).
    assert step1["command"].startswith("python -m grpo_edu.commands.pretrain --task countdown --device cuda")
    assert f"--output-dir {work / 'countdown-start'}" in step1["command"]
    assert step1["target"] == {"held_out_greedy_accuracy": 0.3}
    assert [p["step"] for p in step1["eval_curve"]] == [2, 4] and _seconds_increase(step1["eval_curve"])
    assert all(0.0 <= p["accuracy"] <= 1.0 and math.isfinite(p["loss"]) and p["loss"] > 0 for p in step1["eval_curve"])
    assert step1["status"] == "not_reached" and step1["time_to_target_s"] is None   # 4 toy steps
    assert (work / "countdown-start" / "model.safetensors").is_file()
    # Step 2 trains that model with the recipe's config, to the recipe's end.
    assert step2["config"] == "configs/gpu-countdown-from-scratch.toml"
    assert f"model={work / 'countdown-start'}" in step2["overrides"]
    assert step2["status"] == "done" and step2["reached"] and step2["steps"] == step2["recipe_steps"] == 2
    assert step2["target"] == {"recipe_end_steps": 2} and step2["time_to_target_s"] > 0
    assert [p["step"] for p in step2["eval_curve"]] == [0, 1, 2]
    assert (Path(step2["run_dir"]) / "model" / "config.json").is_file()


def test_qwen_shaped_steps_hold_what_chapter_9_predicts(toy, gpu_benchmark):
    _, results, _ = toy
    for name in ("qwen2.5-0.5b", "qwen2.5-1.5b"):
        entry = results["parts"][name]
        with torch.device("meta"):
            model = Qwen2ForCausalLM(Qwen2Config(**gpu_benchmark.TOY_QWEN_SHAPE))
        P = sum(p.numel() for p in model.parameters())
        assert entry["parameters"] == P
        # float32 weights, gradients, AdamW's two moments and the reference: exactly 20 bytes a parameter
        assert entry["state_bytes"] == {"parameters": 4 * P, "gradients": 4 * P, "optimizer": 8 * P,
                                        "reference": 4 * P, "total": 20 * P}
        assert entry["chapter9_prediction_bytes"]["total"] == 20 * P
        workload = entry["workload"]
        N, L = workload["prompts_per_step"] * workload["num_generations"], workload["max_completion_length"]
        assert entry["timed_steps"] == len(entry["step_seconds"]) == 2 and min(entry["step_seconds"]) > 0
        assert 0 < entry["completion_tokens_per_step"] <= N * L
        assert entry["rollout_logits_bytes"] == N * L * entry["shape"]["vocab_size"] * 4
        for key in ("completion_tokens_per_second", "sampled_tokens_per_second", "trained_tokens_per_second"):
            assert entry[key] > 0, key
        assert workload["engine"] == "hf" and workload["prompt_tokens_mean"] > 0


def test_the_lora_steps_hold_the_base_and_the_adapters_training_state_and_no_reference(toy, gpu_benchmark):
    """LoRA (rank 16, alpha 32, every linear layer): float32 base weights, 16 bytes a parameter of
    the adapters (weights, gradients, AdamW), no reference: exactly chapter 11's LoRA rows."""
    _, results, _ = toy
    with torch.device("meta"):
        model = Qwen2ForCausalLM(Qwen2Config(**gpu_benchmark.TOY_QWEN_SHAPE))
    P = sum(p.numel() for p in model.parameters())
    shape = gpu_benchmark.TOY_QWEN_SHAPE
    H, I, L, kv = shape["hidden_size"], shape["intermediate_size"], shape["num_hidden_layers"], shape["num_key_value_heads"]
    kv_width = kv * H // shape["num_attention_heads"]
    adapters = 16 * L * (2 * (H + H) + 2 * (H + kv_width) + 3 * (H + I))   # q o, k v, gate up down: r (in + out)
    for name in ("qwen2.5-1.5b-lora", "qwen2.5-7b-lora", "qwen2.5-7b-lora-mb8"):
        entry = results["parts"][name]
        assert entry["workload"]["lora_rank"] == 16 and entry["workload"]["lora_alpha"] == 32.0
        assert entry["state_bytes"] == {"parameters": 4 * (P + adapters), "gradients": 4 * adapters,
                                        "optimizer": 8 * adapters, "reference": 0, "total": 4 * P + 16 * adapters}
        assert entry["chapter9_prediction_bytes"] == {"base_weights": 4 * P, "adapter_parameters": adapters,
                                                      "adapters_gradients_adamw": 16 * adapters, "reference": 0,
                                                      "total": 4 * P + 16 * adapters}


def test_the_committed_gpu_figures():
    """benchmarks/results/gpu.json, measured on a lent GPU (an H200; the parts that ran): what the
    trainer holds is chapter 11's prediction to the byte, and Qwen2.5-7B's LoRA steps with
    micro-batches of 8 peaked below one H100's memory, with micro-batches of 16 above it."""
    results = json.loads((ROOT / "benchmarks" / "results" / "gpu.json").read_text())
    parts = results["parts"]
    assert set(parts) <= set(PARTS) and {"qwen2.5-1.5b", "qwen2.5-1.5b-lora", "qwen2.5-7b-lora-mb8"} <= set(parts)
    for name, entry in parts.items():
        assert entry["status"] == "done" and not entry["toy"] and "H" in entry["environment"]["gpu"], name
        assert entry["state_bytes"]["total"] == entry["chapter9_prediction_bytes"]["total"], name
        assert entry["peak_memory_allocated_bytes"] > entry["state_bytes"]["total"], name
    h100 = 81_559 * 2**20   # chapter 11's H100 80GB, as nvidia-smi reports it
    assert parts["qwen2.5-7b-lora-mb8"]["peak_memory_allocated_bytes"] < h100 < parts["qwen2.5-7b-lora"][
        "peak_memory_allocated_bytes"]
    # LoRA at 1.5B: less than two thirds of full fine-tuning's peak
    assert parts["qwen2.5-1.5b-lora"]["peak_memory_allocated_bytes"] < 2 / 3 * parts["qwen2.5-1.5b"][
        "peak_memory_allocated_bytes"]


def test_the_report_prints_the_tables(toy):
    work, _, stdout = toy
    assert "| part | target | reached |" in stdout and "| model (random weights) |" in stdout
    report = run_script("--report", "--out", work / "gpu.json").stdout
    assert "| tiny |" in report and "| qwen2.5-1.5b |" in report


def test_a_part_stopped_by_its_budget_resumes(tmp_path):
    """--budget-seconds 0: the part stops after its first checkpoint ("interrupted"); the same command
    again resumes from it, and the entry adds up both commands."""
    out = tmp_path / "gpu.json"
    common = ["--toy", "--part", "tiny", "--work-dir", tmp_path, "--out", out]
    run_script(*common, "--budget-seconds", "0")
    first = json.loads(out.read_text())["parts"]["tiny"]
    assert first["status"] == "interrupted" and first["steps"] == 2 and first["commands"] == 1
    assert [p["step"] for p in first["eval_curve"]] == [0, 2] and first["time_to_target_s"] is None
    run_script(*common)
    second = json.loads(out.read_text())["parts"]["tiny"]
    assert second["status"] in ("done", "not_reached") and second["commands"] == 2 and second["steps"] == 4
    assert [p["step"] for p in second["eval_curve"]] == [0, 2, 4] and _seconds_increase(second["eval_curve"])
    assert second["wall_seconds"] > first["wall_seconds"]


def test_a_failed_part_is_recorded_and_keeps_the_others(tmp_path):
    out = tmp_path / "gpu.json"
    out.write_text(json.dumps({"format": 1, "written_by": "benchmarks/gpu.py",
                               "parts": {"tiny": {"status": "done", "toy": True, "figure": 1}}}))
    done = run_script("--toy", "--part", "countdown-grpo", "--work-dir", tmp_path, "--out", out, check=False)
    assert done.returncode == 1
    parts = json.loads(out.read_text())["parts"]
    assert parts["tiny"]["figure"] == 1
    assert parts["countdown-grpo"]["status"] == "failed" and "countdown-pretrain" in parts["countdown-grpo"]["error"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_without_cuda_it_refuses_unless_toy(tmp_path):
    done = run_script("--part", "tiny", "--out", tmp_path / "gpu.json", check=False)
    assert done.returncode == 2 and "--toy" in done.stderr
    assert not (tmp_path / "gpu.json").exists()


def test_the_qwen_shapes_are_chapter_9s(gpu_benchmark):
    counts = {}
    for name, shape in gpu_benchmark.QWEN_SHAPES.items():
        with torch.device("meta"):
            counts[name] = sum(p.numel() for p in Qwen2ForCausalLM(Qwen2Config(**shape)).parameters())
    assert [round(c / 1e9, 2) for c in counts.values()] == [0.49, 1.54]   # chapter 11's 0.49 and 1.54 billion
    with torch.device("meta"):
        assert round(sum(p.numel() for p in Qwen2ForCausalLM(Qwen2Config(**gpu_benchmark.QWEN_7B)).parameters())
                     / 1e9, 2) == 7.62   # and 7.62
    # chapter 11 builds its shapes from the table grpo_edu/exercises/ch11.py holds
    chapter = (ROOT / "grpo_edu" / "exercises" / "ch11.py").read_text()
    assert "from grpo_edu.exercises.ch11 import QWEN_ARCHITECTURES" in (ROOT / "chapters" / "11_gpu.py").read_text()
    for name, shape in gpu_benchmark.QWEN_SHAPES.items():
        dims = ", ".join(f"{key}={shape[key]}" for key in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                                           "num_key_value_heads"))
        assert dims in chapter, name


def test_the_filler_tokenizer_decodes_every_id_and_encodes_as_before(gpu_benchmark):
    from grpo_edu.policy.models import char_tokenizer
    tokenizer = gpu_benchmark.filler_tokenizer(500, 64)
    base = char_tokenizer()
    assert len(tokenizer) == 500
    text = "Use 15 10 9 to make 34:<think>10+9=19</think>\\boxed{10+9+15}"
    assert tokenizer(text)["input_ids"] == base(text)["input_ids"]
    assert tokenizer.decode([len(base), 499]) == f"<f{len(base)}><f499>"
    assert (tokenizer.pad_token_id, tokenizer.eos_token_id) == (base.pad_token_id, base.eos_token_id)


def test_step_1_is_read_from_the_recipe(gpu_benchmark):
    flags = gpu_benchmark.recipe_pretrain_flags()
    assert flags[:4] == ["--task", "countdown", "--device", "cuda"] and "--output-dir" not in flags
    assert "--target-accuracy" in flags and flags[flags.index("--target-accuracy") + 1] == "0.3"


def test_a_reached_target_stops_the_run_and_is_timed(tmp_path, gpu_benchmark, monkeypatch):
    """The branches a toy never reaches: the tiny recipe at its target (here 0: its first
    evaluation), and pretraining at its target (evaluate scripted to say 0.5), which then writes
    the model and its card as `python -m grpo_edu.commands.pretrain` does."""
    from grpo_edu.commands import pretrain
    args = gpu_benchmark.parse_args(["--toy", "--work-dir", str(tmp_path)])
    monkeypatch.setattr(gpu_benchmark, "TINY_TARGET", 0.0)
    tiny = gpu_benchmark.part_tiny(args, "cpu", {})
    assert tiny["status"] == "done" and tiny["reached"] and tiny["steps_to_target"] == tiny["steps"] == 2
    assert tiny["time_to_target_s"] == tiny["eval_curve"][-1]["seconds"] > 0

    def scripted(model, tokenizer, samples, *, pass_k=0, max_new_tokens=16, seed=0):
        metrics = {"problems": len(samples), "greedy_accuracy": 0.5, "greedy_format": 1.0}
        if pass_k:
            metrics.update({"sample_accuracy": 0.4, "sample_format": 1.0, f"pass_at_{pass_k}": 0.75,
                            "mixed_groups": 0.5})
        return metrics
    monkeypatch.setattr(pretrain, "evaluate", scripted)
    step1 = gpu_benchmark.part_countdown_pretrain(args, "cpu", {})
    assert step1["status"] == "done" and step1["reached"] and step1["steps"] == 2
    assert step1["time_to_target_s"] == pytest.approx(step1["eval_curve"][-1]["seconds"], abs=2.0)   # its clock, ours
    assert step1["held_out"]["greedy_accuracy"] == 0.5 and step1["parameters"] > 0
    assert (tmp_path / "countdown-start" / "README.md").is_file()
    assert (tmp_path / "countdown-start" / "pretrain.json").is_file()
