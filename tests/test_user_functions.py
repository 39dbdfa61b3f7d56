"""The reader's own functions by import path (config keys advantage_fn and rewards): found
from the working directory, a file or PYTHONPATH, probed at start-up with one-line errors, and
used on every rank: 2 processes with the reader's functions train what 1 process trains with
the built-in ones when the two compute the same thing."""

import subprocess
import sys
import textwrap

import pytest
import torch

from grpo_edu.policy import models
from grpo_edu.training import trainer, user_functions
from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.config import TrainConfig
from test_distributed import COMMON, largest_difference, launch
from hang_guard import HANG_SECONDS

SOLUTIONS = textwrap.dedent('''
    """A reader's solutions: the group-relative advantage and an accuracy reward, written out."""
    import torch
    from grpo_edu.environment.rewards import accuracy_reward


    def advantages(rewards):
        mean = rewards.mean(dim=1, keepdim=True)
        std = ((rewards - mean) ** 2).mean(dim=1, keepdim=True).sqrt()
        return (rewards - mean) / (std + 1e-8)


    def naive_advantages(rewards):
        return (rewards - rewards.mean(dim=1, keepdim=True)) / rewards.std(dim=1, keepdim=True)


    def zeros(rewards):
        return torch.zeros_like(rewards)


    def constant(completions, **columns):
        return [0.25] * len(completions)


    def flat(rewards):
        return rewards.flatten()


    def right(completions, **columns):
        return accuracy_reward(completions, **columns)


    def no_kwargs(completions):
        return [0.0] * len(completions)


    def one_short(completions, **columns):
        return [0.0] * (len(completions) - 1)
''')


@pytest.fixture
def solutions(tmp_path, monkeypatch):
    (tmp_path / "my_solutions.py").write_text(SOLUTIONS)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("my_solutions", None)


def test_resolved_from_the_working_directory_and_from_a_file(solutions):
    by_module = user_functions.resolve("my_solutions:advantages", "advantage_fn")
    by_file = user_functions.resolve(f"{solutions / 'my_solutions.py'}:advantages", "advantage_fn")
    rewards = user_functions.probe_rewards(16, 8)
    expected = group_advantages(rewards)
    assert torch.allclose(by_module(rewards), expected, atol=1e-12)
    assert torch.allclose(by_file(rewards), expected, atol=1e-12)


@pytest.mark.parametrize("spec, message", [
    ("nowhere:advantages", "cannot import 'nowhere' for 'nowhere:advantages'"),
    ("my_solutions:missing", "'my_solutions' has no function 'missing'"),
    ("my_solutions", "expected 'module:function' or 'path/file.py:function', got 'my_solutions'"),
    ("absent.py:f", "names the file"),
])
def test_bad_names_are_one_line(solutions, spec, message):
    with pytest.raises(ValueError, match=message):
        user_functions.resolve(spec, "advantage_fn")


@pytest.mark.parametrize("function, message", [
    ("naive_advantages", "returned nan for prompt 0 \\(its rewards are all equal: a zero std\\)"),
    ("flat", "must map rewards \\(B, G\\) = \\(16, 8\\) to a tensor of the same shape, got \\(128,\\)"),
])
def test_the_advantage_probe_catches(solutions, function, message):
    config = TrainConfig(advantage_fn=f"my_solutions:{function}")
    with pytest.raises(ValueError, match=f"config key 'advantage_fn': my_solutions:{function} {message}"):
        user_functions.functions_from_config(config)


@pytest.mark.parametrize("function, message", [
    ("no_kwargs", "must take \\(completions, \\*\\*kwargs\\), TRL's signature"),
    ("one_short", "must return one finite float per completion, got \\[0.0, 0.0\\] for 3 completions"),
])
def test_the_reward_probe_catches(solutions, function, message):
    config = TrainConfig(rewards={f"my_solutions:{function}": 1.0})
    with pytest.raises(ValueError, match=f"config key 'rewards': my_solutions:{function} {message}"):
        user_functions.functions_from_config(config)


def test_advantage_settings_of_the_builtin_with_advantage_fn_are_an_error():
    with pytest.raises(ValueError, match="'advantage_scale' / 'advantage_std' \\('batch', 'population'\\) set with "
                                         "advantage_fn"):
        TrainConfig(advantage_fn="my_solutions:advantages", advantage_scale="batch")


def test_the_configured_functions_are_the_ones_used(solutions):
    """Zero advantages (and beta = 0) leave the policy where it was; a constant reward makes
    every group's rewards equal."""
    from test_trainer import small_config
    config = small_config(solutions, steps=1, beta=0.0, checkpoint_every=0, advantage_fn="my_solutions:zeros",
                          rewards={"my_solutions:constant": 1.0})
    policy, tokenizer = models.load_policy(models.STARTING_POLICY)
    before = {k: v.clone() for k, v in policy.state_dict().items()}
    result = trainer.train(config, policy=policy, tokenizer=tokenizer, log=lambda _: None)
    after = result.policy.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    metrics = result.history[0]
    assert metrics["zero_std_groups"] == 1.0 and metrics["reward/my_solutions:constant"] == 0.25


def test_the_cli_names_the_function(solutions):
    done = subprocess.run([sys.executable, "-m", "grpo_edu", "train", "--set", "advantage_fn=my_solutions:flat",
                           "--set", f"output_dir={solutions / 'run'}"], capture_output=True, text=True, timeout=HANG_SECONDS)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "grpo-edu train: config key 'advantage_fn': my_solutions:flat must map rewards (B, G) = (16, 8) to a tensor "
        "of the same shape, got (128,)")


def test_two_processes_with_the_readers_functions_train_what_one_does_with_the_builtins(solutions):
    """The reader's advantage (written out) and reward (calling the built-in) on 2 ranks, each
    importing them by file path; the built-ins on 1 process: final policies within 1e-5."""
    path = solutions / "my_solutions.py"
    own = [f"--set=advantage_fn={path}:advantages", "--set=rewards={'" + f"{path}:right" + "' = 1.0, format = 0.5}"]
    settings = [f"--set={s}" for s in COMMON]
    launch(["-m", "grpo_edu", "train", *settings, *own, f"--set=output_dir={solutions / 'own'}"], 2)
    launch(["-m", "grpo_edu", "train", *settings, f"--set=output_dir={solutions / 'builtin'}"], 1)
    assert largest_difference(solutions / "own", solutions / "builtin") < 1e-5
