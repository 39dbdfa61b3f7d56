"""Config files that say what they change: a base, then the overrides with their reasons; every
committed file resolves to exactly what it resolved to when each file spelled out every key
(tests/data/configs_resolved.json, written by the resolver of that time); old full files and
--set still work; `grpo-edu config show` prints every key with its source."""

import json
import re
from pathlib import Path

import pytest

from grpo_edu.commands import cli
from grpo_edu.config import TrainConfig
from grpo_edu.config.files import read_file, show, tomllib

resolve = TrainConfig.resolve

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = sorted((ROOT / "configs").glob("*.toml"))
RESOLVED = json.loads((ROOT / "tests" / "data" / "configs_resolved.json").read_text())


def test_every_committed_file_is_kept_here():
    assert sorted(RESOLVED) == [path.name for path in CONFIGS]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_file_resolves_to_what_it_resolved_to_in_full(path):
    resolved = TrainConfig.from_toml(path).to_dict()
    before = RESOLVED[path.name]
    assert {key: resolved[key] for key in before} == before
    new = set(resolved) - set(before)   # keys added since: at their defaults
    assert {key: resolved[key] for key in new} == {key: TrainConfig().value(key) for key in new}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_file_names_a_base_and_each_override_says_why(path):
    values, base = read_file(path)
    assert base is not None, f"{path.name}: no base named"
    for line in path.read_text().splitlines():
        key = re.match(r"^([a-z_]+) = ", line)
        if key and key[1] not in ("base", "output_dir"):
            assert "#" in line, f"{path.name}: {key[1]} is set without a comment saying why"
    if path.name != "r1-recipe-tiny.toml":   # the recipe's table names R1's values, the base's too
        base_values = TrainConfig.from_toml(path.parent / base).to_dict() if base != "defaults" else \
            TrainConfig().to_dict()
        same = [key for key, value in values.items() if base_values[key] == value]
        assert not same, f"{path.name}: {same} repeat the base's values"


def test_a_full_file_of_the_flat_layout_still_resolves(tmp_path):
    old = RESOLVED["gpu-1x.toml"]
    tables = {"task": ["model", "task", "dataset", "chat_template", "task_instruction", "unboxed_answers"],
              "rollout": ["prompts_per_step", "num_generations", "max_completion_length", "temperature"],
              "optimisation": ["steps", "learning_rate", "num_mini_batches", "tis_cap", "lora_rank", "micro_batch_size"]}
    placed = {key for keys in tables.values() for key in keys} | {"rewards"}
    lines = [f"{key} = {json.dumps(value)}" for key, value in old.items()
             if key not in placed and not isinstance(value, (dict, list))]
    for table, keys in tables.items():
        lines += [f"[{table}]"] + [f"{key} = {json.dumps(old[key])}" for key in keys]
    lines += ["[rewards]"] + [f"{name} = {weight}" for name, weight in old["rewards"].items()]
    path = tmp_path / "old.toml"
    path.write_text("\n".join(lines) + "\n")
    assert {k: v for k, v in TrainConfig.from_toml(path).to_dict().items() if k in old and k != "adam_betas"} == \
        {k: v for k, v in old.items() if k != "adam_betas"}


def test_bases_chain_and_sources_say_which_file_set_each_key(tmp_path):
    (tmp_path / "a.toml").write_text('base = "defaults"\nsteps = 50  # a\n[loss]\nbeta = 0.0  # a\n')
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.toml").write_text('base = "../a.toml"\n[optimisation]\nsteps = 60  # b\n'
                                             '[rewards]\naccuracy = 1.0\n')
    resolved = resolve(tmp_path / "sub" / "b.toml", ["learning_rate=1e-4", "rewards.format=0.25", "loss.kl_estimator=k1"])
    config = resolved.config
    assert (config.optimisation.steps, config.loss.beta, config.optimisation.learning_rate) == (60, 0.0, 1e-4)
    assert config.run.rewards == {"accuracy": 1.0, "format": 0.25}   # the file's table replaced the base's; --set added
    assert config.loss.kl_estimator == "k1"
    sources = resolved.sources
    assert sources["steps"] == str(tmp_path / "sub" / "b.toml") and sources["beta"] == str(tmp_path / "a.toml")
    assert (sources["learning_rate"], sources["rewards"], sources["seed"]) == ("--set", "--set", "default")
    assert resolved.files == [tmp_path / "a.toml", tmp_path / "sub" / "b.toml"]


def test_show_is_a_config_file_that_resolves_to_the_same_config(tmp_path):
    path = ROOT / "configs" / "cpu-first-run.toml"
    text = show(resolve(path, ["steps=20"]), overrides=["steps=20"])
    assert text.startswith("# resolved: defaults <- ") and text.count(" <- ") == 3
    assert re.search(r"^beta = 0\.0 +# .*cpu-first-run\.toml$", text, re.M)
    assert re.search(r"^steps = 20 +# --set$", text, re.M) and re.search(r"^seed = 0 +# default$", text, re.M)
    assert "[loss]" in text and "[vllm]" in text and "[sglang]" in text
    (tmp_path / "shown.toml").write_text(text)
    assert TrainConfig.from_toml(tmp_path / "shown.toml") == TrainConfig.from_toml(path, ["steps=20"])
    assert tomllib.loads(text)["loss"]["beta"] == 0.0


def test_config_show_command(capsys):
    assert cli.main(["config", "show", str(ROOT / "configs" / "cpu-chain.toml"), "--set", "steps=3"]) == 0
    out = capsys.readouterr().out
    assert re.search(r'^task = "chain" +# .*cpu-chain\.toml$', out, re.M)
    assert re.search(r"^steps = 3 +# --set$", out, re.M)
    assert cli.main(["config", "show", str(ROOT / "configs" / "cpu-chain.toml"), "--set", "loss.steps=3"]) == 2
    assert "section 'loss' has no key 'steps' (it is in section 'optimisation')" in capsys.readouterr().err


@pytest.mark.parametrize("files, message", [
    ({"a.toml": 'base = "b.toml"\n', "b.toml": 'base = "a.toml"\n'}, "'base' files form a loop"),
    ({"a.toml": 'base = "missing.toml"\n'}, "is not a file"),
    ({"a.toml": 'steps = 1\n[optimisation]\nsteps = 2\n'}, "config key 'steps' given twice"),
    ({"a.toml": 'base = 3\n'}, "'base' must be a file name"),
    ({"a.toml": 'stepz = 3\n'}, "unknown config key 'stepz'"),
])
def test_a_bad_file_is_one_line_naming_it(tmp_path, files, message):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    with pytest.raises(ValueError) as error:
        resolve(tmp_path / "a.toml")
    assert message in str(error.value) and "\n" not in str(error.value)
