"""A task, an engine and a loss variant added from outside the package: each a module in a folder of
its own that registers the whole variant (docs/contributing.md: "Adding a task", "Adding an
engine", "Adding a loss variant"), named by the config key `imports`, and two training steps
with it. No file of the library is touched: the registrations are all the library learns."""

import hashlib
import sys
import textwrap
from pathlib import Path

import pytest

from grpo_edu.algorithm import aggregation, surrogates
from grpo_edu.config import TrainConfig
from grpo_edu.environment import registry
from grpo_edu.sampling import engines
from grpo_edu.training import trainer

PACKAGE = Path(trainer.__file__).resolve().parents[1]

TASK = '''
import random
from grpo_edu.environment.registry import Task, register_task
from grpo_edu.environment.rewards import answers_match
from grpo_edu.policy.models import completion_text

CHECKED = []

def draw(rng: random.Random) -> dict:
    a, b = rng.randint(100, 999), rng.randint(100, 999)
    return {"prompt": f"{a}+{b}+1=", "answer": str(a + b + 1), "task": "plus-one",
            "solution": completion_text("1", str(a + b + 1))}

def check(predicted, row) -> bool:
    CHECKED.append(row["answer"])
    return answers_match(predicted, row["answer"])

register_task(Task("plus-one", "a + b + 1 (a test's task)", instruction="Add the three numbers.", check=check,
                   draw=draw))
'''

ENGINE = '''
from dataclasses import dataclass
from grpo_edu.runtime.settings import Section, setting
from grpo_edu.sampling.engines import Engine, register_engine
from grpo_edu.sampling.fused_llama import FusedEngine

MADE, SYNCS = [], []

@dataclass
class CountingSettings(Section):
    title = "counting"
    counting_label: str = setting("a label the test reads back", "none")

class Counting(FusedEngine):
    def sync_weights(self):
        SYNCS.append(1)
        return super().sync_weights()

def make(config, models, tokenizer, world):
    MADE.append(config.counting.counting_label)
    return Counting(models.full_policy, tokenizer)

register_engine(Engine("counting", "counting_engine:make", "the fused engine, counting its syncs",
                       settings=CountingSettings, forward="grpo_edu.sampling.fused_llama:completion_logprobs",
                       layer_forward=False))
'''

LOSS = '''
import torch
from grpo_edu.algorithm.aggregation import aggregation
from grpo_edu.algorithm.surrogates import surrogate

def unclipped_metrics(ratio, A, unit_mean, settings):
    return {"ratio/above_one": unit_mean(ratio > 1.0)}

def check_unclipped(settings):
    if settings.ratio_cap:
        raise ValueError("surrogate = 'unclipped' has no cap")

@surrogate("unclipped", metrics=unclipped_metrics, reductions={"ratio/above_one": "unit"}, check=check_unclipped)
def unclipped(ratio, A, logp, settings):
    """-rho A: the surrogate without the clip."""
    return -ratio * A

COUNTS = []

def every_token_once(lengths, chosen, mini_batches):
    COUNTS.append(float(lengths.sum()))
    return float(lengths.sum())

@aggregation("rollout_mean", num_items=every_token_once)
def divisors(mask, counts):
    """A token mean over the whole rollout's tokens."""
    return None, counts.num_items if counts.num_items is not None else mask.sum().clamp(min=1)
'''

SHORT = {"steps": 2, "eval_every": 2, "eval_size": 8, "checkpoint_every": 0, "progress": False}


def _package_digest() -> str:
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture
def outside(tmp_path, monkeypatch):
    """A folder outside the package on sys.path; the registries as they were, afterwards."""
    saved = [(table, dict(table)) for table in (registry.TASKS, engines.ENGINES, surrogates.SURROGATES,
                                                aggregation.AGGREGATIONS)]
    before = _package_digest()
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for table, contents in saved:
        table.clear()
        table.update(contents)
    for name in ("plus_one_task", "counting_engine", "unclipped_loss"):
        sys.modules.pop(name, None)
    assert _package_digest() == before, "a file of the library changed"
    assert not tmp_path.resolve().is_relative_to(PACKAGE)


def test_a_task_from_outside_trains(outside):
    (outside / "plus_one_task.py").write_text(textwrap.dedent(TASK))
    config = TrainConfig(imports=["plus_one_task"], task="plus-one", output_dir=str(outside / "run"), **SHORT)
    result = trainer.train(config, log=lambda message: None)
    module = sys.modules["plus_one_task"]
    assert len(result.history) == 2 and result.summary["eval_problems"] == 8
    # every completion of both rollouts and of both evaluations' held-out problems was checked by the task's rule
    assert len(module.CHECKED) >= 2 * 16 * 8
    samples = (outside / "run" / "samples_before.txt").read_text()
    assert "+1=" in samples


def test_an_engine_from_outside_trains(outside):
    (outside / "counting_engine.py").write_text(textwrap.dedent(ENGINE))
    config = TrainConfig(imports=["counting_engine"], engine="counting", counting_label="mine",
                         output_dir=str(outside / "run"), **SHORT)
    assert config.counting.counting_label == "mine" and config.to_dict()["counting_label"] == "mine"
    result = trainer.train(config, log=lambda message: None)
    module = sys.modules["counting_engine"]
    assert module.MADE == ["mine"] and len(module.SYNCS) == 2
    assert result.history[-1]["optimizer_steps"] == 1.0
    # a key of the engine's section set while another engine is chosen configures nothing: refused
    with pytest.raises(ValueError, match="config key 'counting_label' configures the engine 'counting', not engine = "):
        TrainConfig(counting_label="mine")


def test_a_loss_variant_from_outside_trains(outside):
    (outside / "unclipped_loss.py").write_text(textwrap.dedent(LOSS))
    config = TrainConfig(imports=["unclipped_loss"], surrogate="unclipped", loss_type="rollout_mean",
                         num_iterations=2, output_dir=str(outside / "run"), **SHORT)
    result = trainer.train(config, log=lambda message: None)
    module = sys.modules["unclipped_loss"]
    last = result.history[-1]
    assert "ratio/above_one" in last and "clip_ratio/region" not in last   # the surrogate's own metrics
    assert len(module.COUNTS) >= 2   # the aggregation's own token count, asked for every rollout
    with pytest.raises(ValueError, match="surrogate = 'unclipped' has no cap"):
        TrainConfig(imports=["unclipped_loss"], surrogate="unclipped", ratio_cap=2.0)
