"""The starting-policy pretraining: masking, determinism, threshold stopping, the
script's outputs, and the committed checkpoint against its model card."""

import json
import math
import tomllib
from pathlib import Path

import pytest
import torch
from hang_guard import HANG_SECONDS

from grpo_edu.commands import pretrain
from grpo_edu.environment import tasks
from grpo_edu.training.evaluation import evaluate
from grpo_edu.policy.models import STARTING_POLICY, char_tokenizer, load_policy
from grpo_edu.commands.pretrain import PretrainConfig, sft_batch

TINY = dict(threads=1, batch_size=16, eval_every=5, eval_problems=16, max_steps=10, hidden_size=32,
            num_layers=1, num_heads=2, intermediate_size=64, max_new_tokens=12, pass_k=2)


def test_sft_batch_trains_on_the_completion_only():
    tokenizer = char_tokenizer()
    samples = [tasks.arithmetic_sample(47, "+", 85), tasks.arithmetic_sample(12, "+", 13)]
    batch = sft_batch(tokenizer, samples)
    ids, labels, mask = batch["input_ids"], batch["labels"], batch["attention_mask"]
    assert ids.shape == labels.shape == mask.shape == (2, 6 + 10)
    prompt = len("47+85=")
    assert (labels[:, :prompt] == -100).all()
    first = tokenizer("<think>12</think>\\boxed{132}")["input_ids"] + [tokenizer.eos_token_id]
    assert labels[0, prompt:].tolist() == first
    # The shorter row is right-padded; padding is neither attended to nor trained on.
    second = tokenizer("<think>5</think>\\boxed{25}")["input_ids"] + [tokenizer.eos_token_id]
    assert labels[1, prompt:prompt + len(second)].tolist() == second
    assert (labels[1, prompt + len(second):] == -100).all() and (mask[1, prompt + len(second):] == 0).all()


def test_a_tiny_run_is_deterministic_and_stops_at_max_steps():
    config = PretrainConfig(target_accuracy=1.0, **TINY)
    first = pretrain.pretrain(config, log=lambda line: None)
    second = pretrain.pretrain(config, log=lambda line: None)
    assert not first.reached and first.steps == 10
    assert [h["step"] for h in first.history] == [5, 10]
    assert first.history == second.history
    for (name, a), b in zip(first.model.state_dict().items(), second.model.state_dict().values()):
        assert torch.equal(a, b), name
    other_seed = pretrain.pretrain(PretrainConfig(target_accuracy=1.0, **{**TINY, "seed": 1}),
                                   log=lambda line: None)
    assert not torch.equal(other_seed.model.model.embed_tokens.weight, first.model.model.embed_tokens.weight)


def _scripted_evaluate(accuracies):
    """evaluate() that returns the given greedy accuracies, one per call."""
    calls = iter(accuracies)

    def fake(model, tokenizer, samples, *, pass_k=0, max_new_tokens=16, seed=0):
        metrics = {"problems": len(samples), "greedy_accuracy": next(calls), "greedy_format": 1.0}
        if pass_k:
            metrics.update({"sample_accuracy": 0.1, "sample_format": 0.9, f"pass_at_{pass_k}": 0.5,
                            "mixed_groups": 0.5})
        return metrics
    return fake


def test_training_stops_at_the_first_evaluation_reaching_the_target(monkeypatch):
    monkeypatch.setattr(pretrain, "evaluate", _scripted_evaluate([0.0, 0.2, 0.36, 0.9]))
    config = PretrainConfig(target_accuracy=0.35, **{**TINY, "max_steps": 100})
    result = pretrain.pretrain(config, log=lambda line: None)
    assert result.reached and result.steps == 15
    assert [h["greedy_accuracy"] for h in result.history] == [0.0, 0.2, 0.36]


@pytest.mark.parametrize("change, message", [
    ({"target_accuracy": 0.0}, "target_accuracy must be in"),
    ({"batch_size": 0}, "batch_size must be positive"),
    ({"eval_every": -1}, "eval_every must be positive"),
])
def test_bad_settings_name_themselves(change, message):
    with pytest.raises(ValueError, match=message):
        pretrain.pretrain(PretrainConfig(**{**TINY, **change}), log=lambda line: None)


def test_the_script_writes_policy_card_and_log(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(pretrain, "evaluate", _scripted_evaluate([0.1, 0.5, 0.45]))
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in TINY.items()]
    assert pretrain.main([*flags, f"--output-dir={tmp_path}", "--target-accuracy=0.4"]) == 0
    for name in ("model.safetensors", "config.json", "tokenizer.json", "README.md", "pretrain.json"):
        assert (tmp_path / name).is_file(), name
    card = (tmp_path / "README.md").read_text()
    assert "training stopped at step 10" in card and "| greedy accuracy | 0.4500 |" in card
    assert "| pass@2 (temperature 1) | 0.5000 |" in card
    log = json.loads((tmp_path / "pretrain.json").read_text())
    assert log["steps"] == 10 and log["held_out"]["greedy_accuracy"] == 0.45
    assert log["command"].startswith("python -m grpo_edu.commands.pretrain --threads=1")
    model, tokenizer = load_policy(tmp_path)
    assert model.config.hidden_size == 32


def test_the_script_fails_when_the_target_is_not_reached(monkeypatch, tmp_path):
    monkeypatch.setattr(pretrain, "evaluate", _scripted_evaluate([0.1, 0.2]))
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in TINY.items()]
    assert pretrain.main([*flags, f"--output-dir={tmp_path}"]) == 1
    assert not (tmp_path / "model.safetensors").exists()


def test_the_learning_rate_warms_up_then_stays_or_decays_by_cosine():
    constant = PretrainConfig(warmup_steps=4)
    assert [pretrain.learning_rate_factor(constant, s) for s in range(6)] == [0.25, 0.5, 0.75, 1.0, 1.0, 1.0]
    cosine = PretrainConfig(warmup_steps=2, schedule="cosine", steps=12, min_lr_ratio=0.1)
    factors = [pretrain.learning_rate_factor(cosine, s) for s in range(13)]
    assert factors[:3] == [0.5, 1.0, 1.0]
    assert factors[7] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 5 / 10)), abs=1e-15)   # halfway: 0.55
    assert factors[12] == pytest.approx(0.1, abs=1e-15) and all(a >= b for a, b in zip(factors[2:], factors[3:]))


def test_fixed_steps_train_exactly_that_many_whatever_the_accuracy(monkeypatch):
    monkeypatch.setattr(pretrain, "evaluate", _scripted_evaluate([0.9, 0.95, 0.99]))
    result = pretrain.pretrain(PretrainConfig(**{**TINY, "max_steps": 100, "steps": 15}), log=lambda line: None)
    assert result.reached and result.steps == 15 and [h["step"] for h in result.history] == [5, 10, 15]


@pytest.mark.parametrize("change, message", [
    ({"schedule": "linear"}, "schedule must be 'constant' or 'cosine'"),
    ({"schedule": "cosine"}, "give --steps"),
    ({"steps": -1}, "steps must be >= 0"),
    ({"min_lr_ratio": 1.5}, r"min_lr_ratio must be in \[0, 1\]"),
    ({"mixture": "direct=1"}, "mixture is a mixture flag of a task whose card reads it"),
    ({"worked_max_depth": 11}, "worked_max_depth is a mixture flag"),
    ({"task": "digitsum", "mixture": "direct=0.5,worked=0.6"}, "sum to 1"),
    ({"task": "digitsum", "depths": "3"}, "lowest-highest"),
    ({"task": "digitsum", "depths": "3-30"}, "<= 26"),
])
def test_bad_schedule_and_mixture_flags_name_themselves(change, message):
    with pytest.raises(ValueError, match=message):
        pretrain.validate(PretrainConfig(**{**TINY, **change}))


def test_a_digitsum_base_records_its_mixture_and_precondition_in_its_card(tmp_path):
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in {**TINY, "max_new_tokens": 56}.items()]
    assert pretrain.main([*flags, "--task=digitsum", "--mixture=direct=0.5,worked=0.5", "--depths=3-5",
                          "--worked-max-depth=4", "--steps=4", "--eval-every=2", "--max-position-embeddings=128",
                          f"--output-dir={tmp_path}"]) == 0
    card = (tmp_path / "README.md").read_text()
    assert "direct 50%, worked 50%, check 0%; depths 3 to 5" in card
    assert "worked and check traces up to depth 4, direct answers only above it" in card
    assert "training ran its 4 steps (--steps: no early stop)" in card
    table = card[card.index("## Before any RL"):]
    assert [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| ") and line[2].isdigit()] == \
        ["| 3", "| 4", "| 5", "| 6"]   # the depths it was taught, and one beyond
    log = json.loads((tmp_path / "pretrain.json").read_text())
    assert log["config"]["mixture"] == "direct=0.5,worked=0.5" and log["config"]["worked_max_depth"] == 4
    assert pretrain.parse_args(log["command"].split()[3:]) == PretrainConfig(**log["config"])


# --------------------------------------------------------------------------- the committed policy

@pytest.fixture(scope="module")
def starting_policy():
    return load_policy()


def test_committed_policy_is_small_and_packaged():
    files = {p.name: p.stat().st_size for p in STARTING_POLICY.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
            "tokenizer_config.json", "README.md", "pretrain.json"} <= set(files)
    assert sum(files.values()) <= 10 * 2 ** 20
    pyproject = tomllib.loads((Path(__file__).parent.parent / "pyproject.toml").read_text())
    package_data = pyproject["tool"]["setuptools"]["package-data"]["grpo_edu"]
    assert "assets/tiny-arithmetic-start/*" in package_data


def test_committed_policy_matches_its_model_card(starting_policy):
    """The card's greedy figures, recomputed from the weights on all held-out problems."""
    model, tokenizer = starting_policy
    log = json.loads((STARTING_POLICY / "pretrain.json").read_text())
    card = (STARTING_POLICY / "README.md").read_text()
    torch.set_num_threads(1)
    got = evaluate(model, tokenizer, tasks.arithmetic_problems("test"))
    for key in ("greedy_accuracy", "greedy_format"):
        # Equal up to an argmax flipped by float rounding on another CPU (1 of 1,576).
        assert got[key] == pytest.approx(log["held_out"][key], abs=1.5 / 1576), key
    assert f"| greedy accuracy | {log['held_out']['greedy_accuracy']:.4f} |" in card
    assert f"training stopped at step {log['steps']}" in card


def test_committed_policy_leaves_room_for_grpo(starting_policy):
    """What GRPO needs from its start: often wrong, well formatted, and groups that disagree."""
    held_out = json.loads((STARTING_POLICY / "pretrain.json").read_text())["held_out"]
    assert 0.30 <= held_out["greedy_accuracy"] <= 0.45
    assert held_out["greedy_format"] >= 0.95 and held_out["sample_format"] >= 0.9
    assert held_out["pass_at_8"] >= held_out["greedy_accuracy"] + 0.15
    assert held_out["mixed_groups"] >= 0.5


def test_the_download_free_recipe_runs_end_to_end_at_toy_size_on_the_cpu(tmp_path):
    """configs/gpu-countdown-from-scratch.toml's two steps, shrunk to run here: pretraining on
    Countdown (a toy model, a few steps) writes a policy that step 2's config, moved to the CPU,
    trains with GRPO. (Whether the recipe learns, and how fast on an H100, needs a GPU.)"""
    from grpo_edu.training import trainer
    from grpo_edu.config import TrainConfig
    from grpo_edu.policy.models import save_policy
    config = PretrainConfig(task="countdown", max_position_embeddings=128, hidden_size=32, num_layers=1,
                            num_heads=2, intermediate_size=64, batch_size=8, max_steps=4, eval_every=2,
                            eval_problems=4, max_new_tokens=48, target_accuracy=1.0,
                            output_dir=str(tmp_path / "countdown-start"))
    result = pretrain.pretrain(config, log=lambda _: None)
    assert result.steps == 4 and not result.reached and [r["step"] for r in result.history] == [2, 4]
    save_policy(result.model, result.tokenizer, config.output_dir)
    root = Path(__file__).resolve().parents[1]
    recipe = TrainConfig.from_toml(root / "configs" / "gpu-countdown-from-scratch.toml", [
        f"model={config.output_dir}", "device=cpu", "engine=fused", "precision=fp32", "tis_cap=0", "steps=2",
        "prompts_per_step=4", "num_generations=4", "micro_batch_size=16", "eval_size=4", "eval_every=100",
        "checkpoint_every=0", "progress=false", "threads=1", f"output_dir={tmp_path / 'grpo'}"])
    history = trainer.train(recipe, log=lambda _: None).history
    assert [m["step"] for m in history] == [1, 2] and all(m["loss"] == m["loss"] for m in history)


# --------------------------------------------------------------------------- where it writes, and when not

def assets_fingerprint() -> dict[str, bytes]:
    """Every file under the package's assets, by path, with its bytes."""
    from grpo_edu.policy.models import ASSETS
    return {str(p.relative_to(ASSETS)): p.read_bytes() for p in sorted(ASSETS.rglob("*")) if p.is_file()}


def run_script(*args, cwd):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "grpo_edu.commands.pretrain", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=HANG_SECONDS)


def test_no_command_writes_into_the_package_assets_unless_told_to(tmp_path, monkeypatch, capsys):
    """python -m grpo_edu.commands.pretrain without --output-dir, or with one inside grpo_edu/assets/, stops
    before training with one line naming the flag, and the committed policy is untouched. The
    command itself once (its exit status and output); the folders through main(), in-process."""
    from grpo_edu.policy.models import ASSETS, STARTING_POLICY
    root = Path(__file__).resolve().parents[1]
    before = assets_fingerprint()
    done = run_script(cwd=root)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr == ("python -m grpo_edu.commands.pretrain: --output-dir: expected the folder to write the policy to, "
                           "got none (the package's assets are written only when asked: to remake the committed "
                           "starting policy, pass --output-dir grpo_edu/assets/tiny-arithmetic-start "
                           "--write-package-assets)\n")
    monkeypatch.chdir(root)
    for inside in ("grpo_edu/assets/tiny-arithmetic-start", str(STARTING_POLICY), "grpo_edu/assets/new-policy",
                   "grpo_edu/assets/../assets/tiny-arithmetic-start"):
        assert pretrain.main(["--output-dir", inside, "--max-steps", "1", "--eval-every", "1"]) == 2, inside
        out, err = capsys.readouterr()
        assert out == "" and len(err.splitlines()) == 1, inside
        assert err.startswith(f"python -m grpo_edu.commands.pretrain: --output-dir: expected a folder outside the "
                              f"package's assets (grpo_edu/assets), got {inside!r}: the committed starting "
                              f"policy there is what grpo-edu train"), inside
        assert "pass --write-package-assets too to replace it on purpose" in err
    assert assets_fingerprint() == before and not (ASSETS / "new-policy").exists()


def test_the_package_assets_are_written_only_with_write_package_assets(monkeypatch, tmp_path):
    """The flag is what allows it (a stand-in assets folder here: the real one stays as committed);
    write_policy, the library's way in, refuses without it too."""
    monkeypatch.setattr(pretrain, "ASSETS", tmp_path / "assets")
    monkeypatch.setattr(pretrain, "evaluate", _scripted_evaluate([0.5, 0.5, 0.5]))
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in TINY.items()]
    target = tmp_path / "assets" / "tiny-arithmetic-start"
    config = PretrainConfig(output_dir=str(target), **TINY)
    with pytest.raises(ValueError, match="expected a folder outside the package's assets"):
        pretrain.write_policy(config, pretrain.pretrain(config, log=lambda _: None), "test", (0.0, 0.0))
    assert not target.exists()
    assert pretrain.main([*flags, f"--output-dir={target}", "--target-accuracy=0.4", "--write-package-assets"]) == 0
    assert (target / "model.safetensors").is_file()
    assert pretrain.parse_args([f"--output-dir={target}"]).write_package_assets is False


def test_a_pretraining_run_that_misses_its_target_says_how_close_and_what_to_do(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(pretrain, "evaluate", _scripted_evaluate([0.1, 0.25]))
    flags = [f"--{key.replace('_', '-')}={value}" for key, value in TINY.items()]
    output = tmp_path / "countdown-start"
    assert pretrain.main([*flags, f"--output-dir={output}", "--target-accuracy=0.3"]) == 1
    assert not output.exists()
    error = capsys.readouterr().err
    assert error == (
        f"python -m grpo_edu.commands.pretrain: --target-accuracy 0.3 not reached in --max-steps 10 steps: the best held-out "
        f"greedy accuracy was 0.250 at step 10 (the last evaluations, step: accuracy: 5: 0.100, 10: 0.250); nothing "
        f"was written to {output}. Run the same command with a larger --max-steps (if the accuracy was still rising) "
        f"or a lower --target-accuracy (GRPO needs a policy that solves some problems, not most); a GRPO run that "
        f"starts from {output} can begin only after this command ends with 'wrote {output}'\n")


def test_the_download_free_recipes_grpo_step_says_when_step_1_has_not_written_its_model(tmp_path, monkeypatch):
    """Step 2 of configs/gpu-countdown-from-scratch.toml before step 1 has succeeded: one line naming
    the missing folder and the step that writes it, before anything loads (and never a hub lookup:
    the folder is written "./runs/...")."""
    import subprocess
    import sys
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-m", "grpo_edu", "train", "--config",
                           str(root / "configs" / "gpu-countdown-from-scratch.toml"), "--set",
                           f"output_dir={tmp_path / 'run'}"], capture_output=True, text=True, cwd=tmp_path,
                          timeout=HANG_SECONDS)
    assert done.returncode == 2
    assert done.stderr == (
        "grpo-edu train: model: expected 'start', 'multiply-start', 'chain-start', 'trained', 'digitsum-start', 'digitsum-no-check' or 'digitsum-no-top-worked', a saved model folder (holding config.json) or a hub id, got "
        "'./runs/countdown-start': no such folder. If an earlier step writes it (a pretraining run, python -m "
        "grpo_edu.commands.pretrain --output-dir ./runs/countdown-start), run that step first: it writes the folder only "
        "once it reaches its --target-accuracy\n")
    from grpo_edu.policy.models import load_policy
    monkeypatch.chdir(tmp_path)
    with pytest.raises(FileNotFoundError, match=r"'\./runs/countdown-start' is a local path, and no such folder "
                                                r"exists \(if an earlier step writes it"):
        load_policy("./runs/countdown-start")
