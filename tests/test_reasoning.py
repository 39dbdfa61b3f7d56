"""What a digitsum policy does (grpo_edu.training.reasoning), and what a digitsum run logs: pass@k
against the estimator on hand-computed cases, the forced formats, and a short run's metrics
carrying the completion length and the format shares."""

import json
import math

import pytest
import torch

from grpo_edu.config import TrainConfig
from grpo_edu.environment.digitsum import digitsum_sample, held_out_by_depth
from grpo_edu.policy.models import char_tokenizer, tiny_llama
from grpo_edu.training import reasoning
from grpo_edu.training.trainer import train

DIRECT, WORKED = "<think></think>\\boxed{6}", "<think>a33b81c56d17e96</think>\\boxed{6}"


def _scripted(completions: list[list[str]]):
    """complete() replaced: the given texts, problem-major, whatever is asked."""
    def fake(model, tokenizer, prompts, *, k=1, greedy=True, max_new_tokens=56, seed=0, rows_per_call=512):
        assert len(prompts) == len(completions) and all(len(group) == k for group in completions)
        return completions, [[len(t) for t in group] for group in completions]
    return fake


def test_pass_at_k_curve_is_the_unbiased_estimator_on_hand_computed_cases(monkeypatch):
    problems = [digitsum_sample([3, 8, 5, 1, 9]), digitsum_sample([1, 1, 1])]   # answers 6 and 3
    # problem 1: 1 right of 4; problem 2: 2 right of 4
    texts = [["<think></think>\\boxed{6}", "<think></think>\\boxed{5}", "x", "<think></think>\\boxed{0}"],
             ["<think></think>\\boxed{3}", "<think></think>\\boxed{3}", "<think></think>\\boxed{1}", ""]]
    monkeypatch.setattr(reasoning, "complete", _scripted(texts))
    curve = reasoning.pass_at_k_curve(None, None, problems, n=4)
    assert curve["correct"] == [1, 2] and list(curve["pass_at_k"]) == [1, 2, 4]
    # pass@1 = c / n; pass@2 = 1 - C(n - c, 2) / C(4, 2): 1 - 3/6 and 1 - 1/6; pass@4 = 1 for both
    assert curve["pass_at_k"][1] == pytest.approx((1 / 4 + 2 / 4) / 2, abs=1e-15)
    assert curve["pass_at_k"][2] == pytest.approx(((1 - math.comb(3, 2) / 6) + (1 - math.comb(2, 2) / 6)) / 2,
                                                  abs=1e-15)
    assert curve["pass_at_k"][4] == 1.0


def test_behaviour_reports_the_forced_and_free_formats_by_depth(monkeypatch):
    problems = {5: [digitsum_sample([3, 8, 5, 1, 9])]}
    asked = []

    def fake(model, tokenizer, prompts, *, k=1, greedy=True, max_new_tokens=56, seed=0, rows_per_call=512):
        asked.append((prompts[0], k, greedy))
        prefix = prompts[0][len("a3b8c5d1e9="):]
        whole = [DIRECT, WORKED, "<think>a33b81c57!c56d17e96</think>\\boxed{6}", "<think></think>\\boxed{2}"][:k]
        return [[t[len(prefix):] if t.startswith(prefix) else "!" for t in whole]], [[10] * k]
    monkeypatch.setattr(reasoning, "complete", fake)
    row = reasoning.behaviour(None, None, problems, samples=4)[5]
    assert [a[0] for a in asked] == ["a3b8c5d1e9=<think></think>"] * 2 + ["a3b8c5d1e9=<think>a"] * 2 + ["a3b8c5d1e9="] * 2
    assert row["free/greedy"] == 1.0 and row["free/sampled"] == 0.75 and row["free/greedy_format"] == "direct"
    assert row["free/format/direct"] == 0.5 and row["free/format/worked"] == 0.25 and row["free/format/check"] == 0.25
    assert row["free/accuracy/direct"] == 0.5 and row["free/accuracy/check"] == 1.0
    assert row["free/checks/written"] == 1 and row["free/checks/on_wrong"] == 1
    assert row["free/checks/fixed_to_right_answer"] == 1
    assert row["free/length/mean"] == 10 and row["free/length/std"] == 0
    table = reasoning.precondition_table({5: row})
    assert table.splitlines()[2].startswith("| 5 | 1 | ") and table.endswith("| direct | 1 (1, 1) |")


def test_complete_is_seeded_and_greedy_is_the_argmax_chain():
    tokenizer = char_tokenizer(128)
    model = tiny_llama(tokenizer, num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64,
                       max_position_embeddings=128)
    prompts = [p["prompt"] for p in held_out_by_depth([4], 3)[4]]
    first = reasoning.complete(model, tokenizer, prompts, k=3, greedy=False, seed=5, max_new_tokens=8)
    torch.rand(100)   # the caller's stream moves; the completions do not
    assert reasoning.complete(model, tokenizer, prompts, k=3, greedy=False, seed=5, max_new_tokens=8) == first
    assert reasoning.complete(model, tokenizer, prompts, k=3, greedy=False, seed=6, max_new_tokens=8) != first
    greedy, _ = reasoning.complete(model, tokenizer, prompts[:1], max_new_tokens=8)
    ids = tokenizer(prompts[0], return_tensors="pt", add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False,
                             pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    assert greedy[0][0] == tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    with pytest.raises(ValueError, match="k must be 1 for greedy"):
        reasoning.complete(model, tokenizer, prompts, k=2)


def test_a_short_digitsum_run_logs_length_and_format_shares(tmp_path):
    tokenizer = char_tokenizer(128)
    policy = tiny_llama(tokenizer, num_layers=1, hidden_size=32, num_heads=2, intermediate_size=64,
                        max_position_embeddings=128)
    config = TrainConfig(task="digitsum", digitsum_depths=[3, 4], steps=3, prompts_per_step=4, num_generations=4,
                         max_completion_length=56, eval_every=3, eval_size=8, threads=1, progress=False,
                         checkpoint_every=0, output_dir=str(tmp_path / "run"), rewards={"accuracy": 1.0})
    result = train(config, policy=policy, tokenizer=tokenizer, log=lambda line: None)
    for metrics in result.history:
        shares = [metrics[f"format/{name}"] for name in ("direct", "worked", "check", "other")]
        assert sum(shares) == pytest.approx(1.0, abs=1e-12) and all(0 <= s <= 1 for s in shares)
        assert metrics["completion_length/std"] >= 0 and 1 <= metrics["completion_length/mean"] <= 56
        assert {"checks/written", "checks/on_wrong", "checks/fixed"} <= set(metrics)
    # an untrained policy writes no markup: every completion is "other", most run to the limit
    assert result.history[0]["format/other"] == 1.0
    ends = json.loads((tmp_path / "run" / "summary.json").read_text())["rollouts"]
    assert ends["window"] == 3 and ends["first"] == ends["last"]
    assert set(ends["first"]) == {"reward/mean", "completion_length/mean", "completion_length/std", "format/direct",
                                  "format/worked", "format/check", "format/other", "checks/written",
                                  "checks/on_wrong", "checks/fixed"}
    assert ends["first"]["completion_length/mean"] == pytest.approx(
        sum(m["completion_length/mean"] for m in result.history) / 3, abs=1e-12)
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert "format/worked" in json.loads(lines[0])


def test_an_arithmetic_run_summary_has_the_length_but_no_formats(tmp_path):
    config = TrainConfig(steps=2, prompts_per_step=4, num_generations=4, eval_every=2, eval_size=8, threads=1,
                         progress=False, checkpoint_every=0, output_dir=str(tmp_path / "run"))
    result = train(config, log=lambda line: None)
    assert "format/worked" not in result.history[0]
    assert set(result.summary["rollouts"]["last"]) == {"reward/mean", "completion_length/mean",
                                                       "completion_length/std"}


# --------------------------------------------------------------------------- the committed bases

BASES = {"digitsum-start": ("direct=0.5,worked=0.4,check=0.1", 0),
         "digitsum-no-check": ("direct=0.5,worked=0.5", 0),
         "digitsum-no-top-worked": ("direct=0.5,worked=0.4,check=0.1", 11)}


def _card_row(card: str, depth: int) -> list[str]:
    row = next(line for line in card.splitlines() if line.startswith(f"| {depth} | "))
    return [cell.strip() for cell in row.strip("|").split("|")]


@pytest.mark.parametrize("name", BASES)
def test_a_committed_base_is_packaged_small_and_pretrained_on_its_mixture(name):
    import tomllib
    from pathlib import Path

    from grpo_edu.policy.models import policy_source
    folder = Path(policy_source(name))
    files = {p.name: p.stat().st_size for p in folder.iterdir()}
    assert {"model.safetensors", "config.json", "generation_config.json", "tokenizer.json", "README.md",
            "pretrain.json"} <= set(files) and sum(files.values()) <= 10 * 2 ** 20
    pyproject = tomllib.loads((folder.parents[2] / "pyproject.toml").read_text())
    assert f"assets/{folder.name}/*" in pyproject["tool"]["setuptools"]["package-data"]["grpo_edu"]
    config = json.loads((folder / "pretrain.json").read_text())["config"]
    mixture, worked_max_depth = BASES[name]
    assert (config["task"], config["mixture"], config["worked_max_depth"]) == ("digitsum", mixture, worked_max_depth)


@pytest.mark.parametrize("name", BASES)
def test_a_committed_base_shows_the_precondition_its_card_states(name):
    """Greedy, with the format forced, at depths 3 and 12, recomputed from the weights and equal to
    the card's table (up to one argmax flipped by rounding on another CPU): direct answers near
    chance at depth, worked chains right wherever the base was taught to work."""
    from pathlib import Path

    from grpo_edu.policy.models import load_policy, policy_source
    torch.set_num_threads(1)
    folder = Path(policy_source(name))
    model, tokenizer = load_policy(folder)
    card = (folder / "README.md").read_text()
    by_depth = held_out_by_depth([3, 12], 100)
    got = {}
    for depth, problems in by_depth.items():
        for mode in ("direct", "worked"):
            prefix = reasoning.FORCED[mode]
            texts, _ = reasoning.complete(model, tokenizer, [p["prompt"] + prefix for p in problems])
            got[depth, mode] = sum(reasoning._correct([prefix + t[0] for t in texts], problems, 1)) / len(problems)
        cells = _card_row(card, depth)
        assert cells[1] == str(len(problems))   # depth 3 has 88 held-out problems
        assert float(cells[2]) == pytest.approx(got[depth, "direct"], abs=0.011), (name, depth, "direct")
        assert float(cells[4]) == pytest.approx(got[depth, "worked"], abs=0.011), (name, depth, "worked")
    assert got[12, "direct"] <= 0.3
    if BASES[name][1]:        # never shown a worked chain at depth 12
        assert got[12, "worked"] <= 0.3 and got[3, "worked"] >= 0.9
    else:
        assert got[3, "worked"] >= 0.9 and got[12, "worked"] >= 0.9
