"""The failure lab's per-problem outcomes (grpo_edu.lab.held_out_outcomes): what chapter 7's
paired comparisons over the same held-out problems read."""

import pytest

from grpo_edu import lab
from grpo_edu.config import TrainConfig
from grpo_edu.training import trainer


def test_held_out_outcomes_reproduce_a_runs_final_accuracy_problem_by_problem(tmp_path):
    spec = lab.RUNS["healthy"]
    config = TrainConfig.from_dict({**spec.config(tmp_path / "run").to_dict(), "steps": 2, "eval_every": 2})
    result = trainer.train(config, log=lambda line: None)
    right = lab.held_out_outcomes("healthy", result.policy, result.tokenizer)
    assert len(right) == lab.SETTINGS["eval_size"] and set(right) <= {0, 1}
    assert sum(right) / len(right) == result.summary["final_accuracy"]
    assert result.policy.training   # left as the trainer leaves it
    # the countdown runs score other problems, with the same count
    assert len(lab.held_out_outcomes("countdown", result.policy, result.tokenizer)) == len(right)


def test_held_out_outcomes_name_an_unknown_run():
    with pytest.raises(ValueError, match="name: expected one of"):
        lab.held_out_outcomes("no-such-run", None, None)
