"""The task that needs a tool: two-digit products with a calculator. The task and its two
solutions, who wrote each piece of a solution, pretraining that keeps the calculator's answers
out of its loss, the committed tool policy against its model card, configs/cpu-tools.toml, a
GRPO run that learns to call, evaluation as episodes, and benchmarks/tools.py's results file
(chapter 13 reads it) against what the trainer computes."""

import json
import math
import sys
import tomllib
from pathlib import Path

import pytest
import torch
import grid_checks

from grpo_edu import lab
from grpo_edu.commands import pretrain
from grpo_edu.environment import tasks
from grpo_edu.training import episodes
from grpo_edu.config import TrainConfig
from grpo_edu.config.files import read_file
from grpo_edu.training.evaluation import evaluate, played_episodes, samples_table
from grpo_edu.policy.models import TOOL_POLICY, char_tokenizer, load_policy, policy_source
from grpo_edu.commands.pretrain import PretrainConfig, sft_batch
from grpo_edu.environment.rewards import accuracy_reward

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "tools.json"
CALCULATOR = "grpo_edu.training.episodes:Calculator"
sys.path.insert(0, str(ROOT / "benchmarks"))
import tools  # noqa: E402

needs_pin = grid_checks.PINNED


@pytest.fixture(scope="module")
def tool_policy():
    torch.set_num_threads(1)
    return load_policy(TOOL_POLICY)


# --------------------------------------------------------------------------- the task

def test_a_product_has_a_calculator_solution_and_one_in_the_head():
    sample = tasks.multiply_sample(47, 85)
    assert sample == {"prompt": "47*85=", "answer": "3995", "task": "multiply",
                      "solution": "<think>[47*85]=3995</think>\\boxed{3995}",
                      "direct_solution": "<think>35</think>\\boxed{3995}"}
    assert accuracy_reward([sample["solution"], sample["direct_solution"]], answer="3995") == [1.0, 1.0]
    with pytest.raises(ValueError, match="a must be a non-negative integer, got -1"):
        tasks.multiply_sample(-1, 3)


def test_the_products_split_into_disjoint_train_and_held_out_sets():
    train, test = tasks._multiply_pool("train"), tasks._multiply_pool("test")
    assert len(train) + len(test) == 90 * 90 and (len(train), len(test)) == (7284, 816)
    assert not {s["prompt"] for s in train} & {s["prompt"] for s in test}
    assert all(tasks.split_of(s["prompt"]) == "test" for s in test)
    assert [s["prompt"] for s in tasks.make_dataset("multiply", 816, "test")] == \
        [s["prompt"] for s in tasks.make_dataset("multiply", 816, "test")]
    with pytest.raises(ValueError, match="n = 817 distinct multiply problems requested from split 'test', "
                                         "which holds 816"):
        tasks.make_dataset("multiply", 817, "test")
    assert "calculator" in tasks.with_instruction(tasks.multiply_sample(12, 34))["prompt"]


def test_a_run_draws_from_every_training_product(tool_policy):
    config = TrainConfig.from_toml(ROOT / "configs" / "cpu-tools.toml")
    train_pool, held_out = tasks.task_pools(config, tool_policy[1])
    assert len(train_pool) == 7284 and len({s["prompt"] for s in train_pool}) == 7284
    assert len(held_out) == config.logging.eval_size
    assert tasks.training_pool_size("multiply") == 7284 and tasks.training_pool_size("countdown") == 10_000
    # TRL's dataset of the same run (without the calculator, which the bridge refuses): every product
    from grpo_edu.commands import trl_bridge
    single_turn = TrainConfig.from_toml(ROOT / "configs" / "cpu-tools.toml", ['environment=""'])
    assert len(trl_bridge.train_dataset(single_turn)) == 7284


def test_a_solution_is_split_into_who_wrote_each_piece_by_playing_it():
    sample = tasks.multiply_sample(47, 85)
    assert episodes.writers(sample["solution"], CALCULATOR, sample) == [
        ("<think>[47*85]", False), ("=3995", True), ("</think>\\boxed{3995}", False)]
    assert episodes.writers(sample["direct_solution"], CALCULATOR, sample) == [
        ("<think>35</think>\\boxed{3995}", False)]
    wrong = sample["solution"].replace("=3995<", "=3996<")
    with pytest.raises(ValueError, match=r"answers '<think>\[47\*85\]' with '=3995', but the text goes on '=3996"):
        episodes.writers(wrong, CALCULATOR, sample)
    calls = "".join(f"[{i}*2]={2 * i}" for i in range(1, 5)) + "[1*1]=!more"
    with pytest.raises(ValueError, match="ended the episode, but the text goes on 'more'"):
        episodes.writers(calls, CALCULATOR, sample)


# --------------------------------------------------------------------------- pretraining

def test_pretraining_keeps_the_calculators_answer_out_of_the_loss():
    tokenizer = char_tokenizer()
    sample = tasks.multiply_sample(47, 85)
    batch = sft_batch(tokenizer, [sample], CALCULATOR)
    labels, ids = batch["labels"][0], batch["input_ids"][0]
    text = tokenizer.decode(ids, skip_special_tokens=False)
    assert text == "47*85=" + sample["solution"] + tokenizer.eos_token
    env_start = len("47*85=") + len(tokenizer("<think>[47*85]")["input_ids"])
    assert (labels[env_start:env_start + 5] == -100).all() and tokenizer.decode(ids[env_start:env_start + 5]) == "=3995"
    trained = labels != -100
    assert int(trained.sum()) == len(ids) - len("47*85=") - 5
    # Without the environment the same text is trained on whole (what a careless SFT would do).
    assert int((sft_batch(tokenizer, [sample])["labels"][0] != -100).sum()) == len(ids) - len("47*85=")


@pytest.mark.parametrize("share", [0.0, 0.3, 1.0])
def test_the_tool_share_is_the_share_of_solutions_that_call(share):
    stream = pretrain.training_stream(PretrainConfig(task="multiply", tool_share=share, seed=3))
    n = 4000
    calls = sum("[" in next(stream)["solution"] for _ in range(n))
    assert abs(calls / n - share) <= 4 * math.sqrt(share * (1 - share) / n)


@pytest.mark.parametrize("change, message", [
    ({"tool_share": 1.5, "task": "multiply"}, "tool_share must be in [0, 1], got 1.5"),
    ({"tool_share": 0.5}, "tool_share is for a task with a tool (its pretraining card names an environment: "
                          "'multiply'), got tool_share 0.5 with task 'arithmetic'"),
    ({"max_turns": 0, "task": "multiply"}, "max_turns must be positive, got 0"),
])
def test_bad_tool_settings_name_themselves(change, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        pretrain.validate(PretrainConfig(**change))


def test_a_tiny_tool_pretraining_is_evaluated_as_episodes():
    config = PretrainConfig(task="multiply", tool_share=1.0, threads=1, batch_size=16, eval_every=5, eval_problems=8,
                            max_steps=5, hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64,
                            max_new_tokens=24, target_accuracy=1.0)
    result = pretrain.pretrain(config, log=lambda line: None)
    assert result.steps == 5 and {"tool_call_rate", "mean_turns"} <= set(result.history[0])


# --------------------------------------------------------------------------- the committed tool policy

def test_the_committed_tool_policy_is_packaged_and_named():
    files = {p.name: p.stat().st_size for p in TOOL_POLICY.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md", "pretrain.json"} <= set(files)
    assert sum(files.values()) <= 2 * 2 ** 20
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "assets/tiny-multiply-start/*" in package_data["grpo_edu"]
    assert policy_source("multiply-start") == TOOL_POLICY and policy_source("runs/x") == "runs/x"


def test_the_committed_tool_policy_matches_its_model_card(tool_policy):
    """The card's greedy figures, recomputed from the weights as episodes on every held-out product."""
    model, tokenizer = tool_policy
    log = json.loads((TOOL_POLICY / "pretrain.json").read_text())
    card = (TOOL_POLICY / "README.md").read_text()
    got = evaluate(model, tokenizer, tasks.make_dataset("multiply", 816, "test"), max_new_tokens=24,
                   environment=CALCULATOR, max_turns=2)
    for key in ("greedy_accuracy", "greedy_format", "tool_call_rate", "mean_turns"):
        # Equal up to an argmax flipped by float rounding on another CPU (1 of 816).
        assert got[key] == pytest.approx(log["held_out"][key], abs=1.5 / 816), key
    assert f"| greedy tool-call rate | {log['held_out']['tool_call_rate']:.4f} |" in card
    assert f"training stopped at step {log['steps']}" in card and log["config"]["tool_share"] == 0.5


def test_the_committed_tool_policy_gives_grpo_a_choice():
    """Half its samples call, half answer in the head; the calls are mostly right, the rest
    almost never: groups that disagree, and a choice to learn."""
    held_out = json.loads((TOOL_POLICY / "pretrain.json").read_text())["held_out"]
    assert 0.35 <= held_out["sample_tool_call_rate"] <= 0.65
    assert held_out["sample_accuracy"] <= held_out["sample_tool_call_rate"]
    assert held_out["mixed_groups"] >= 0.8


# --------------------------------------------------------------------------- configs/cpu-tools.toml

def test_the_tools_config_is_the_cpu_tier_but_for_its_tools_keys():
    tiny, tools_config = (TrainConfig.from_toml(ROOT / "configs" / name).to_dict()
                          for name in ("cpu-tiny.toml", "cpu-tools.toml"))
    differ = {key for key in tiny if tiny[key] != tools_config[key]}
    own, base = read_file(ROOT / "configs" / "cpu-tools.toml")   # what the file says it changes
    assert base == "cpu-tiny.toml" and differ == set(own) == {"model", "task", "max_completion_length", "environment", "max_turns", "steps",
                                "eval_every", "output_dir"}
    assert tools_config["environment"] == CALCULATOR
    # The longest episode fits: prompt, a call, its answer, the boxed copy and EOS.
    longest = tasks.multiply_sample(99, 99)
    assert len(char_tokenizer()(longest["solution"])["input_ids"]) + 1 <= tools_config["max_completion_length"]


# --------------------------------------------------------------------------- training and evaluation

def test_grpo_teaches_the_tool_policy_to_call(tmp_path):
    """15 steps of configs/cpu-tools.toml (fewer prompts): the sampled episodes call the calculator more
    and are right more often than at the start, and the held-out greedy accuracy rises."""
    from grpo_edu.training.trainer import train
    config = TrainConfig.from_toml(ROOT / "configs" / "cpu-tools.toml", [
        "steps=15", "eval_every=15", "eval_size=64", "prompts_per_step=8", "checkpoint_every=0",
        f"output_dir={json.dumps(str(tmp_path))}", "progress=false"])
    result = train(config, log=lambda line: None)
    history = result.history
    first, last = history[:3], history[-3:]
    mean = lambda rows, key: sum(m[key] for m in rows) / len(rows)  # noqa: E731
    assert mean(last, "reward/accuracy") > mean(first, "reward/accuracy") + 0.1
    assert mean(last, "episode/turns") > mean(first, "episode/turns")
    assert result.summary["final_accuracy"] > result.summary["start_accuracy"]
    assert history[-1]["eval/tool_call_rate"] > 0.9
    after = (tmp_path / "samples_after.txt").read_text()
    assert "]=" in after.splitlines()[0]   # the calculator's answer, in the greedy episode's text


def test_episodes_are_evaluated_greedy_or_sampled_from_their_own_seed(tool_policy):
    model, tokenizer = tool_policy
    samples = tasks.make_dataset("multiply", 6, "test")
    greedy = played_episodes(model, tokenizer, samples, CALCULATOR, 2, 24)
    assert len(greedy["texts"]) == 6 and all(t == (2 if c else 1) for t, c in zip(greedy["turns"], greedy["called"]))
    for text, called in zip(greedy["texts"], greedy["called"]):
        assert called == ("]=" in text)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = played_episodes(model, tokenizer, samples, CALCULATOR, 2, 24, k=3, seed=7)
    assert torch.equal(torch.get_rng_state(), state)   # the caller's stream untouched
    assert played_episodes(model, tokenizer, samples, CALCULATOR, 2, 24, k=3, seed=7) == first
    assert len(first["texts"]) == 18 and first != played_episodes(model, tokenizer, samples, CALCULATOR, 2, 24,
                                                                   k=3, seed=8)
    with pytest.raises(ValueError, match="k must be 1 for greedy episodes"):
        played_episodes(model, tokenizer, samples, CALCULATOR, 2, 24, k=2)


def test_a_runs_sample_table_shows_the_episode(tool_policy):
    model, tokenizer = tool_policy
    sample = tasks.multiply_sample(47, 85)
    with_tool = TrainConfig.from_toml(ROOT / "configs" / "cpu-tools.toml")
    without = TrainConfig.from_toml(ROOT / "configs" / "cpu-tools.toml", ["environment=\"\""])
    assert samples_table(model, tokenizer, [sample], with_tool) == \
        "47*85=<think>[47*85]=3995</think>\\boxed{3995}   (right, answer 3995)\n"
    assert "=3995" not in samples_table(model, tokenizer, [sample], without)


# --------------------------------------------------------------------------- the benchmark's file

def test_the_results_file_holds_every_variant_and_seed():
    results = json.loads(RESULTS.read_text())
    assert {(r["variant"], r["seed"]) for r in results["runs"]} == set(tools.parse_runs(None, list(tools.VARIANTS),
                                                                                       [0, 1, 2]))
    assert results["held_out"] == 816 and set(results["before"]) == {"tool", "no_tool"}
    for run in results["runs"]:
        assert all(len(values) == results["steps"] for values in run["steps"].values())
        assert [step for step, _ in run["eval"]] == list(range(25, results["steps"] + 1, 25))
        assert run["after"]["greedy_accuracy"] == pytest.approx(run["eval"][-1][1], abs=0.1)   # 816 vs its 256
        assert (run["steps"]["episode/turns"][0] is None) == (run["variant"] == "no_tool")


def test_the_tool_beats_no_tool_and_the_doctor_names_the_leak_alone():
    results = json.loads(RESULTS.read_text())
    by = {v: [r for r in results["runs"] if r["variant"] == v] for v in tools.VARIANTS}
    assert min(r["after"]["greedy_accuracy"] for r in by["tool"]) > max(r["after"]["greedy_accuracy"]
                                                                         for r in by["no_tool"]) + 0.5
    # The doctor names the leak in every leak seed (and, as the failure lab allows, the KL it runs
    # away with: lab.TOOL_RUNS["env_leak"].also), and in no other run; no tool's groups are all wrong.
    assert all(lab.TOOL_RUNS["env_leak"].diagnosed_as_expected(set(r["findings"])) for r in by["leak"])
    assert all(r["findings"] == [] for r in by["tool"])
    assert all(r["findings"] == ["zero_std_groups"] for r in by["no_tool"])


def test_the_results_file_keeps_each_problems_outcomes_and_its_verdicts():
    """Every measurement keeps its 816 problems' outcomes, whose means are its accuracies; the
    file's verdicts are what tools.verdicts computes from its runs (chapter 13 prints them)."""
    results = json.loads(RESULTS.read_text())
    for after in [r["after"] for r in results["runs"]] + list(results["before"].values()):
        assert len(after["greedy_correct"]) == len(after["sample_correct"]) == results["held_out"]
        assert sum(after["greedy_correct"]) / results["held_out"] == after["greedy_accuracy"]
        assert sum(after["sample_correct"]) / (results["samples"] * results["held_out"]) == after["sample_accuracy"]
    assert results["verdicts"] == json.loads(json.dumps(tools.verdicts(results)))
    assert len([k for k in results["verdicts"] if "McNemar" in results["verdicts"][k]["method"]]) == 3


def test_a_result_written_after_the_call_is_a_product_sized_number():
    """self_answer_rate counts a number of three or more digits between the call's `]` and
    `</think>`; a stray digit among repeated brackets (what the tool policy writes when nobody
    answers) is not a result. Completions without a call count in the denominator only."""
    samples = [{"answer": "4896"}, {"answer": "208"}, {"answer": "2790"}, {"answer": "300"}, {"answer": "12"}]
    texts = ["<think>[51*96]]]]]]5</think>\\boxed{995}",   # a stray digit: no result
             "<think>[13*16]]400</think>\\boxed{400}",      # a wrong result
             "<think>[31*90]]2790</think>\\boxed{2790}",    # the product
             "<think>[30*10]]7]300</think>\\boxed{300}",    # a digit, then the product
             "<think>12</think>\\boxed{12}"]                 # no call
    assert tools.self_answers(texts, samples) == {"self_answer_rate": 3 / 5, "self_answers_right": 2 / 3}
    assert tools.self_answers(texts[:1], samples[:1]) == {"self_answer_rate": 0.0, "self_answers_right": 0.0}


def test_bad_runs_are_named():
    with pytest.raises(SystemExit, match="--runs: expected variant:seed"):
        tools.parse_runs(["tool"], None, None)
    assert tools.config_for("no_tool", 1, 10, "x").rollout.environment == "" and tools.config_for("leak", 1, 10, "x").run.seed == 1


def check(path, run="leak:0", steps=6):
    return grid_checks.run_check("tools.py", path, run, steps)


@needs_pin
def test_the_results_file_is_what_the_trainer_computes():
    """Re-train the leak, seed 0, for 6 steps under the pin: every kept number of those steps
    equals the file's."""
    done = check(RESULTS)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "leak:0 first 6 steps: equal to the file" in done.stdout


def test_a_changed_number_or_evaluation_is_caught():
    want = next(r for r in json.loads(RESULTS.read_text())["runs"] if (r["variant"], r["seed"]) == ("leak", 0))
    got = json.loads(json.dumps({"steps": {key: values[:30] for key, values in want["steps"].items()},
                                 "eval": [e for e in want["eval"] if e[0] <= 30]}))
    assert tools.differences(got, want, 30) == []
    got["steps"]["sampler_gap/mean_abs"][3] *= 1.0001
    got["eval"][0][1] += 0.004
    assert tools.differences(got, want, 30) == ["sampler_gap/mean_abs differs in steps 1-30",
                                               f"evaluations {got['eval']} against {want['eval'][:1]}"]


def readme_figures(results: dict) -> list[str]:
    """The figures docs/training.md quotes from benchmarks/results/tools.json, as it writes them."""
    def span(variant, key):
        values = [r["after"][key] for r in results["runs"] if r["variant"] == variant]
        return f"{sum(values) / len(values):.3f} ({min(values):.3f}-{max(values):.3f})"
    before = results["before"]
    logp = {v: [r["after"]["answer_logp"] for r in results["runs"] if r["variant"] == v] for v in ("tool", "leak")}
    kl = {v: [sorted(r["steps"]["kl"])[len(r["steps"]["kl"]) // 2] for r in results["runs"] if r["variant"] == v]
          for v in ("tool", "leak")}
    return [f"held-out greedy accuracy {before['tool']['greedy_accuracy']:.3f} -> {span('tool', 'greedy_accuracy')}",
            f"sampled tool-call rate {before['tool']['sample_tool_call_rate']:.3f} -> "
            f"{span('tool', 'sample_tool_call_rate')}",
            f"sampled accuracy {before['tool']['sample_accuracy']:.3f} -> {span('tool', 'sample_accuracy')}",
            f"without it {span('no_tool', 'greedy_accuracy')}",
            f"log-prob per answer token {before['tool']['answer_logp']:.2f} -> {max(logp['leak']):.2f} to "
            f"{min(logp['leak']):.2f} (the tool runs: {max(logp['tool']):.2f} to {min(logp['tool']):.2f})",
            f"a result of its own (three or more digits) where the answer would stand in "
            f"{span('leak', 'self_answer_rate')} of its held-out completions",
            f"(the tool runs, in at most {max(r['after']['self_answer_rate'] for r in results['runs'] if r['variant'] == 'tool'):.3f})",
            f"median KL {min(kl['leak']):.2f}-{max(kl['leak']):.2f} against {min(kl['tool']):.3f}-{max(kl['tool']):.3f}",
            f"sampled accuracy {span('leak', 'sample_accuracy')}"]


def test_the_training_doc_quotes_the_tools_benchmark():
    readme = " ".join((ROOT / "docs" / "training.md").read_text().split())
    for figure in readme_figures(json.loads(RESULTS.read_text())):
        assert figure in readme, figure


def test_the_failure_labs_tool_runs_change_one_thing_of_the_tools_config():
    from grpo_edu.doctor import diagnose as dx
    tool, leak = (lab.TOOL_RUNS[name].config("unused") for name in ("tool", "env_leak"))
    assert tool == leak and tool.rollout.environment == CALCULATOR and tool.run.task == "multiply"
    assert lab.TOOL_RUNS["tool"].faults is None and lab.TOOL_RUNS["env_leak"].faults.env_tokens_in_loss
    for spec in lab.TOOL_RUNS.values():
        assert spec.expected | spec.also <= set(dx.DETECTORS) and not spec.expected & spec.also
    with pytest.raises(ValueError, match="name: expected one of .*'env_leak'.*got 'leak'"):
        lab.run("leak", "unused")
