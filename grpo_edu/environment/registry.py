"""The tasks, registered whole: what a run's prompts are and how their answers are checked.

One registration (`register_task(Task(...))`) carries everything the library needs to know about
a task, so that adding one touches no other module (docs/contributing.md, "Adding a task"):

    name           the config key task's value, and every sample's "task" column
    problems       where its problems come from, exactly one of:
                     pool(split) -> every problem of a split, listed (small spaces)
                     draw(rng) -> one problem (spaces too big to list; a split keeps its own)
                     load(split, dataset) -> the split read from a file or the hub (GSM8K)
    instruction    what a model not trained on the bare prompts is told (config key
                   task_instruction): the answer format and the task's rules;
                   instruction_in_prompt: its prompts end with it already (GSM8K's)
    example        for a task read from files: one sample, for probes that must not read them
    check          check(predicted, row) -> bool: is the final answer (read by
                   grpo_edu.environment.rewards.extract_answer; None when there is none) right for
                   the completion's dataset row ({"answer": ..., "numbers": ..., ...})
    step_verifier  steps(text, numbers) -> [(end, reward)]: a rule that checks every written step
                   (process supervision, grpo_edu.environment.process), or None
    pretraining    how `python -m grpo_edu.commands.pretrain --task NAME` trains and describes a
                   starting policy for it (Pretraining), or None: not pretrainable here

The built-in tasks register themselves where they are written (grpo_edu.environment.tasks:
arithmetic, multiply, countdown, gsm8k; grpo_edu.environment.process: chain); importing
grpo_edu.environment registers them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Mapping


@dataclass(frozen=True)
class Pretraining:
    """How the pretraining command makes a starting policy for a task.

    card: the model card's title and first paragraph, a str.format template with {name},
        {layers}, {width}, {parameters} and the pretraining config's fields (e.g. {tool_percent})
    report: (how a reader makes the held-out set the card reports, a function that makes it)
    use: the card's "Use" lines (Python) that load the policy; {output_dir} is the folder
    environment: evaluate its policy in episodes with this environment ("module:Class"), "" = no
    stream: (pretraining config) -> endless training samples, each with a "solution"; None: the
        task's train split with its own solutions (grpo_edu.environment.tasks.iterate_samples)
    """

    card: str
    report: tuple[str, Callable[[], list[dict]]]
    use: str = ("from grpo_edu.policy.models import load_policy\n"
                "model, tokenizer = load_policy({output_dir!r})")
    environment: str = ""
    stream: Callable[..., Iterator[dict]] | None = None


@dataclass(frozen=True)
class Task:
    """A registered task (module docstring)."""

    name: str
    doc: str
    instruction: str
    check: Callable[[str | None, Mapping], bool]
    pool: Callable[[str], tuple[dict, ...]] | None = None
    draw: Callable[..., dict] | None = None
    load: Callable[[str, str], list[dict]] | None = None
    step_verifier: Callable | None = None
    pretraining: Pretraining | None = None
    instruction_in_prompt: bool = False
    example: dict | None = None

    def __post_init__(self):
        given = [name for name in ("pool", "draw", "load") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"task {self.name!r}: give exactly one of pool, draw and load (where its problems come "
                             f"from), got {given or 'none'}")
        if self.load is not None and self.example is None:
            raise ValueError(f"task {self.name!r}: a task read from files needs an example (one sample, for probes)")

    @property
    def generated(self) -> bool:
        """Its problems are made here (pool or draw), not read from files."""
        return self.load is None


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    """Add a task under task.name (config key task)."""
    TASKS[task.name] = task
    return task


def task_named(name, key: str = "task") -> Task:
    """The registered task `name`, or one line naming the known ones."""
    if name not in TASKS:
        raise ValueError(f"{key} must be one of {tuple(TASKS)}, got {name!r}")
    return TASKS[name]


def generated_tasks() -> tuple[str, ...]:
    """The tasks whose problems are made here (pool or draw), in registration order."""
    return tuple(name for name, task in TASKS.items() if task.generated)


def step_verified_tasks() -> tuple[str, ...]:
    """The tasks whose written steps a rule checks (process supervision)."""
    return tuple(name for name, task in TASKS.items() if task.step_verifier is not None)
