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
    settings       the task's own config keys, a grpo_edu.runtime.settings.Section whose title is
                   the task's name (digitsum's [digitsum]: its depths), or None. Its problems are
                   then drawn with them: draw(rng, settings)
    completion_metrics  completion_metrics(texts, rows) -> {name: [value per completion]}: what a
                   run logs of this task beside the rewards, each averaged over the rollout
                   (digitsum's format shares and checks); called with no completions, it
                   names them all (empty lists); or None

The built-in tasks register themselves where they are written (grpo_edu.environment.tasks:
arithmetic, multiply, countdown, gsm8k; grpo_edu.environment.process: chain); importing
grpo_edu.environment registers them all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator, Mapping

from grpo_edu.runtime.settings import Section


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
    mixture: the pretraining config's mixture flags this task reads (--mixture, --depths, ...), an
        empty tuple: none (the command refuses them set for another task)
    describe: (pretraining config) -> the mixture in words, the card's {mixture_text}; or None
    extra: "module:function", function(model, tokenizer, pretraining config) -> a markdown section
        of the card after its held-out figures (digitsum's precondition table); "" = none
    """

    card: str
    report: tuple[str, Callable[[], list[dict]]]
    use: str = ("from grpo_edu.policy.models import load_policy\n"
                "model, tokenizer = load_policy({output_dir!r})")
    environment: str = ""
    stream: Callable[..., Iterator[dict]] | None = None
    mixture: tuple[str, ...] = ()
    describe: Callable[..., str] | None = None
    extra: str = ""


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
    settings: type[Section] | None = None
    completion_metrics: Callable[[list[str], list[dict]], dict[str, list[float]]] | None = None

    def __post_init__(self):
        given = [name for name in ("pool", "draw", "load") if getattr(self, name) is not None]
        if len(given) != 1:
            raise ValueError(f"task {self.name!r}: give exactly one of pool, draw and load (where its problems come "
                             f"from), got {given or 'none'}")
        if self.load is not None and self.example is None:
            raise ValueError(f"task {self.name!r}: a task read from files needs an example (one sample, for probes)")
        if self.settings is not None and self.settings.title != self.name:
            raise ValueError(f"task {self.name!r}: its settings section must have the task's name as its title "
                             f"(config table [{self.name}]), got {self.settings.title!r}")

    def draw_with(self, rng, settings: Section | None = None) -> dict:
        """One drawn problem: draw(rng), or with the task's settings (their defaults when None)."""
        if self.settings is None:
            return self.draw(rng)
        return self.draw(rng, settings if settings is not None else self.settings())

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
