"""Supervised pretraining of the starting policy: a tiny Llama that is half-right.

GRPO learns only from groups whose completions disagree, so its starting policy
must already solve some problems, and not all: a policy at 0% or 100% gives
every group the same reward and zero advantage. This script trains the tiny
model of grpo_edu.policy.models on arithmetic solutions (grpo_edu.environment.tasks) with
next-token cross-entropy on the completion tokens, and stops as soon as its
greedy accuracy on held-out problems (grpo_edu.training.evaluation) reaches `target_accuracy`.

Why a threshold and not a step count: SFT accuracy on this task stays near
zero for about 150 steps, then jumps within a few hundred, and where the jump
happens depends on the seed. With these settings, seeds 0, 1 and 2 first
reached 30% held-out greedy accuracy at steps 170, 190 and 220, and 90% at
steps 498, 562 and 514. A fixed step count would give a policy that is still
hopeless with one seed and nearly solved with another; stopping on the
threshold gives one with room to improve every time, and the run is still
deterministic for a given seed and thread count.

    python -m grpo_edu.commands.pretrain --output-dir runs/my-start --seed 1 --target-accuracy 0.5

--output-dir is required, and a folder inside the package's assets (grpo_edu/assets/, where
the committed starting policy that `grpo-edu train`, the book and `grpo-edu doctor --gpu`
start from lives) is refused unless --write-package-assets says so too. The committed policy
was made when the script wrote there by default; to remake it on purpose:

    python -m grpo_edu.commands.pretrain --output-dir grpo_edu/assets/tiny-arithmetic-start --write-package-assets

The model card (README.md in the output directory) records how it was made,
its held-out greedy accuracy, format rate, pass@8 and the run time. When the target is not
reached within --max-steps, nothing is written and the script exits 1, saying how close it
came and what to change.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib
import json
import math
import platform
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from grpo_edu.environment import tasks
from grpo_edu.training.episodes import writers
from grpo_edu.training.evaluation import SAMPLE_SEED, evaluate
from grpo_edu.policy.models import ASSETS, char_tokenizer, save_policy, tiny_llama


def _doc(text: str, default):
    return field(default=default, metadata={"help": text})


@dataclass
class PretrainConfig:
    """Every knob of the pretraining run (each is a --flag of the script)."""

    output_dir: str = _doc("where the model, tokenizer and model card are written (required)", "")
    write_package_assets: bool = _doc("allow an --output-dir inside the package's assets (grpo_edu/assets/): "
                                      "only to replace the committed starting policy on purpose", False)
    seed: int = _doc("seed of the initial weights and of the training problems", 0)
    threads: int = _doc("torch CPU threads (results are bitwise reproducible for a fixed count)", 1)
    batch_size: int = _doc("training problems per optimizer step", 64)
    learning_rate: float = _doc("AdamW peak learning rate (linear warmup, then --schedule)", 2e-3)
    warmup_steps: int = _doc("steps of linear learning-rate warmup", 50)
    schedule: str = _doc("after the warmup: 'constant', or 'cosine' (down to --min-lr-ratio of the peak at "
                         "--steps; needs --steps)", "constant")
    min_lr_ratio: float = _doc("schedule 'cosine': the learning rate at the last step, a share of the peak", 0.1)
    steps: int = _doc("train exactly this many steps, with no early stop (0: stop at --target-accuracy, "
                      "within --max-steps)", 0)
    weight_decay: float = _doc("AdamW weight decay", 0.0)
    max_steps: int = _doc("give up (and fail) if the target is not reached by this step", 5000)
    eval_every: int = _doc("steps between held-out greedy evaluations (the jump takes ~20 steps)", 2)
    eval_problems: int = _doc("held-out problems in each evaluation that decides when to stop", 256)
    target_accuracy: float = _doc("stop at the first evaluation with at least this greedy accuracy", 0.35)
    pass_k: int = _doc("samples per problem for pass@k in the model card", 8)
    task: str = _doc("what to pretrain on, a registered task with a pretraining card: 'arithmetic' (the committed "
                     "policy), 'multiply' (the tool policy: grpo_edu/assets/tiny-multiply-start), 'chain' (the "
                     "process-supervision policy: grpo_edu/assets/tiny-chain-start) or 'countdown' (the GPU tier's "
                     "download-free recipe)", "arithmetic")
    tool_share: float = _doc("task 'multiply': the share of training solutions that call the calculator "
                             "([47*85], its answer =3995 kept out of the loss: the environment writes it); the "
                             "rest answer in the head", 0.0)
    max_turns: int = _doc("task 'multiply': the most policy turns of an evaluation episode", 2)
    mixture: str = _doc("task 'digitsum': the share of each completion format, 'direct=0.5,worked=0.4,check=0.1' "
                        "(grpo_edu.environment.digitsum.Mixture; '' is that one)", "")
    depths: str = _doc("task 'digitsum': the depths (digit counts) pretrained on, 'lowest-highest', weighted "
                       "towards short ones", "3-12")
    worked_max_depth: int = _doc("task 'digitsum': worked and check traces only up to this depth, direct answers "
                                 "above it (0: every depth)", 0)
    check_wrong_share: float = _doc("task 'digitsum': the share of check traces that end wrong (a second wrong "
                                    "value, not flagged; Gandhi et al., 2025)", 0.25)
    device: str = _doc("'cpu' or 'cuda'", "cpu")
    max_position_embeddings: int = _doc("positions the model has: prompt + completion must fit "
                                        "(arithmetic: 64; countdown: 128)", 64)
    hidden_size: int = _doc("model width", 128)
    num_layers: int = _doc("transformer layers", 2)
    num_heads: int = _doc("attention heads", 4)
    intermediate_size: int = _doc("SwiGLU hidden width", 256)
    max_new_tokens: int = _doc("generation limit; a correct completion is at most 12 tokens (multiply with the "
                               "calculator: 21, both writers')", 16)


EVAL_SEED = 0
CALCULATOR = "grpo_edu.training.episodes:Calculator"   # task 'multiply': the tool its solutions call


# --------------------------------------------------------------------------- where it writes

def check_output_dir(config: PretrainConfig) -> Path:
    """config.output_dir, checked: given, and outside the package's assets (the committed
    starting policy) unless config.write_package_assets. Raises ValueError naming the flag."""
    if not config.output_dir:
        raise ValueError(f"--output-dir: expected the folder to write the policy to, got none (the package's "
                         f"assets are written only when asked: to remake the committed starting policy, pass "
                         f"--output-dir {_shown(ASSETS / 'tiny-arithmetic-start')} --write-package-assets)")
    folder = Path(config.output_dir).expanduser()
    if folder.resolve().is_relative_to(ASSETS.resolve()) and not config.write_package_assets:
        raise ValueError(f"--output-dir: expected a folder outside the package's assets ({_shown(ASSETS)}), got "
                         f"{config.output_dir!r}: the committed starting policy there is what grpo-edu train, the "
                         f"book and grpo-edu doctor --gpu start from; pass --write-package-assets too to replace "
                         f"it on purpose, or choose another folder (runs/my-start)")
    return folder


def _shown(path: Path) -> str:
    """A path relative to the working directory where it is inside it (grpo_edu/assets/...)."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def not_reached_message(config: PretrainConfig, result: "PretrainResult") -> str:
    """What went wrong when the target was not reached, and what to do (one line)."""
    if result.history:
        best = max(result.history, key=lambda r: r["greedy_accuracy"])
        last = ", ".join(f"{r['step']}: {r['greedy_accuracy']:.3f}" for r in result.history[-3:])
        how_close = (f"the best held-out greedy accuracy was {best['greedy_accuracy']:.3f} at step {best['step']} "
                     f"(the last evaluations, step: accuracy: {last})")
    else:
        how_close = f"no evaluation ran (--eval-every {config.eval_every} is above --max-steps {config.max_steps})"
    return (f"--target-accuracy {config.target_accuracy} not reached in --max-steps {config.max_steps} steps: "
            f"{how_close}; nothing was written to {config.output_dir}. Run the same command with a larger "
            f"--max-steps (if the accuracy was still rising) or a lower --target-accuracy (GRPO needs a policy "
            f"that solves some problems, not most); a GRPO run that starts from {config.output_dir} can begin "
            f"only after this command ends with 'wrote {config.output_dir}'")


# --------------------------------------------------------------------------- training

def sft_batch(tokenizer, samples: list[dict], environment: str = "") -> dict[str, torch.Tensor]:
    """prompt + solution + <eos>, right-padded; labels are -100 on the prompt and
    the padding, so the loss is the completion's cross-entropy only. With an environment
    the solution is an episode: the environment's text (`=3995` after a calculator call,
    grpo_edu.training.episodes.writers) is -100 too, as GRPO's loss never counts it: the policy
    learns to call and to read the answer, not to predict it."""
    rows, labels = [], []
    for sample in samples:
        prompt = tokenizer(sample["prompt"], add_special_tokens=False)["input_ids"]
        pieces = writers(sample["solution"], environment, sample) if environment else [(sample["solution"], False)]
        completion, label = [], []
        for piece, by_env in pieces:
            ids = tokenizer(piece, add_special_tokens=False)["input_ids"]
            completion += ids
            label += [-100] * len(ids) if by_env else ids
        rows.append(prompt + completion + [tokenizer.eos_token_id])
        labels.append([-100] * len(prompt) + label + [tokenizer.eos_token_id])
    width = max(map(len, rows))
    pad = tokenizer.pad_token_id
    return {
        "input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
        "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
        "labels": torch.tensor([l + [-100] * (width - len(l)) for l in labels]),
    }


@dataclass
class PretrainResult:
    model: torch.nn.Module
    tokenizer: object
    steps: int                  # optimizer steps taken
    reached: bool               # the target accuracy was reached
    history: list[dict]         # one {"step", "loss", "greedy_accuracy", "greedy_format"} per evaluation
    seconds: float              # training time, evaluations included


def validate(config: PretrainConfig) -> None:
    """Raises ValueError naming the first bad setting."""
    if not 0 < config.target_accuracy <= 1:
        raise ValueError(f"target_accuracy must be in (0, 1], got {config.target_accuracy}")
    for name in ("batch_size", "max_steps", "eval_every", "eval_problems", "threads"):
        if getattr(config, name) <= 0:
            raise ValueError(f"{name} must be positive, got {getattr(config, name)}")
    if config.task not in pretrainable_tasks():
        raise ValueError(f"task must be one of {pretrainable_tasks()} (a registered task with a pretraining card), "
                         f"got {config.task!r}")
    if not 0 <= config.tool_share <= 1:
        raise ValueError(f"tool_share must be in [0, 1], got {config.tool_share}")
    if config.tool_share and not card(config).environment:
        raise ValueError(f"tool_share is for a task with a tool (its pretraining card names an environment: "
                         f"'multiply'), got tool_share {config.tool_share} with task {config.task!r}")
    if config.max_turns <= 0:
        raise ValueError(f"max_turns must be positive, got {config.max_turns}")
    if config.steps < 0:
        raise ValueError(f"steps must be >= 0 (0: stop at target_accuracy), got {config.steps}")
    if config.schedule not in ("constant", "cosine"):
        raise ValueError(f"schedule must be 'constant' or 'cosine', got {config.schedule!r}")
    if config.schedule == "cosine" and not config.steps:
        raise ValueError("schedule 'cosine' decays to its end at --steps: give --steps (a fixed length), got 0")
    if not 0 <= config.min_lr_ratio <= 1:
        raise ValueError(f"min_lr_ratio must be in [0, 1], got {config.min_lr_ratio}")
    defaults = PretrainConfig()
    for name in ("mixture", "depths", "worked_max_depth", "check_wrong_share"):
        if getattr(config, name) != getattr(defaults, name) and name not in card(config).mixture:
            raise ValueError(f"{name} is a mixture flag of a task whose card reads it ('digitsum'), got {name} "
                             f"{getattr(config, name)!r} with task {config.task!r}: it would change nothing")
    if card(config).mixture:
        card(config).stream(config)   # the mixture's flags checked before any training
    if config.device not in ("cpu", "cuda") or (config.device == "cuda" and not torch.cuda.is_available()):
        raise ValueError(f"device must be 'cpu' or a 'cuda' torch can see, got {config.device!r}")


def pretrain(config: PretrainConfig, log=print) -> PretrainResult:
    """SFT until held-out greedy accuracy >= config.target_accuracy (or max_steps)."""
    validate(config)
    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    start = time.perf_counter()
    tokenizer = char_tokenizer(config.max_position_embeddings)
    model = tiny_llama(tokenizer, seed=config.seed, hidden_size=config.hidden_size,
                       num_layers=config.num_layers, num_heads=config.num_heads,
                       intermediate_size=config.intermediate_size,
                       max_position_embeddings=config.max_position_embeddings).to(config.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.learning_rate,
                                  weight_decay=config.weight_decay, betas=(0.9, 0.99))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: learning_rate_factor(config, step))
    stream = training_stream(config)
    held_out = tasks.make_dataset(config.task, config.eval_problems, "test", seed=EVAL_SEED)
    episodes = _episodes(config)

    history, step, reached, losses = [], 0, False, []
    last = config.steps or config.max_steps
    while step < last and not reached:
        model.train()
        batch = {k: v.to(config.device) for k, v in
                 sft_batch(tokenizer, [next(stream) for _ in range(config.batch_size)],
                           episodes.get("environment", "")).items()}
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        step += 1
        if step % config.eval_every == 0:
            model.eval()
            metrics = evaluate(model, tokenizer, held_out, max_new_tokens=config.max_new_tokens, **episodes)
            record = {"step": step, "loss": sum(losses) / len(losses), **metrics}
            losses = []
            history.append(record)
            log(f"step {step:5d}  loss {record['loss']:.4f}  held-out greedy accuracy "
                f"{metrics['greedy_accuracy']:.4f}  format {metrics['greedy_format']:.4f}"
                + (f"  tool calls {metrics['tool_call_rate']:.4f}" if episodes else ""))
            reached = not config.steps and metrics["greedy_accuracy"] >= config.target_accuracy
    reached = reached or step == config.steps
    model.eval().to("cpu")   # written and evaluated for the card on the CPU, as it is loaded
    return PretrainResult(model, tokenizer, step, reached, history, time.perf_counter() - start)


def learning_rate_factor(config: PretrainConfig, step: int) -> float:
    """The learning rate at optimizer step `step` (0-based), a share of the peak: linear warmup,
    then constant, or cosine down to min_lr_ratio at config.steps."""
    if step < config.warmup_steps:
        return (step + 1) / config.warmup_steps
    if config.schedule == "constant":
        return 1.0
    progress = (step - config.warmup_steps) / max(1, config.steps - config.warmup_steps)
    return config.min_lr_ratio + (1 - config.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def pretrainable_tasks() -> tuple[str, ...]:
    """The registered tasks with a pretraining card (grpo_edu.environment.registry.Pretraining)."""
    return tuple(name for name, task in tasks.TASKS.items() if task.pretraining is not None)


def card(config: PretrainConfig):
    """The task's pretraining card."""
    return tasks.TASKS[config.task].pretraining


def _episodes(config: PretrainConfig) -> dict:
    """evaluate()'s episode arguments: a task with a tool (multiply) is evaluated with its environment."""
    environment = card(config).environment
    return {"environment": environment, "max_turns": config.max_turns} if environment else {}


def training_stream(config: PretrainConfig):
    """The task's training samples, endless and seeded: its card's own stream (multiply's: each
    solution calls the calculator with probability tool_share), else its train split's solutions."""
    stream = card(config).stream
    return stream(config) if stream is not None else tasks.iterate_samples(config.task, "train", seed=config.seed)


# --------------------------------------------------------------------------- the model card

def use_lines(config: PretrainConfig) -> str:
    """How a card's "Use" section loads its policy."""
    return card(config).use.format(output_dir=config.output_dir)


def model_card(config: PretrainConfig, result: PretrainResult, report: dict, seconds: float,
               cpu_seconds: float, command: str, extra: str = "") -> str:
    """The README.md of a pretrained policy; `extra`, the task's own section (card_extra)."""
    parameters = sum(p.numel() for p in result.model.parameters())
    k = config.pass_k
    jump = ", ".join(f"{r['step']}: {r['greedy_accuracy']:.3f}" for r in result.history[-6:])
    tools = "" if not card(config).environment else f"""
| greedy tool-call rate | {report['tool_call_rate']:.4f} |
| greedy mean policy turns | {report['mean_turns']:.4f} |
| sampled tool-call rate (temperature 1) | {report['sample_tool_call_rate']:.4f} |"""
    episodes = "" if not card(config).environment else (
        f"; every completion an episode with the calculator\n(`{card(config).environment}`, at most "
        f"{config.max_turns} policy turns), scored on its whole text")
    describe = card(config).describe
    schedule = ("" if config.schedule == "constant" else
                f", then cosine down to {config.min_lr_ratio:g} of it at the last step")
    stopped = (f"training ran its {config.steps} steps (--steps: no early stop)" if config.steps else
               f"training stopped at step {result.steps},\nthe first evaluation at or above "
               f"{config.target_accuracy:.2f}")
    return f"""{card(config).card.format(name=Path(config.output_dir).name, layers=config.num_layers,
                                     width=config.hidden_size, parameters=parameters,
                                     tool_percent=100 * config.tool_share,
                                     mixture_text=describe(config) if describe else "")}

## How it was made

    {command}

Next-token cross-entropy on the completion tokens, AdamW (lr {config.learning_rate:g},
{config.warmup_steps} warmup steps{schedule}, weight decay {config.weight_decay:g}), batch {config.batch_size},
seed {config.seed}, {config.threads} CPU thread(s). Every {config.eval_every} steps the held-out greedy
accuracy on {config.eval_problems} problems was measured; {stopped}. The last evaluations (step: accuracy):
{jump}.

Run time: {seconds:.0f} s wall-clock from start to written files ({result.seconds:.0f} s of it
training, the rest the evaluation below; Python start-up and imports not counted), of which the process had {cpu_seconds:.0f} s of CPU time
({platform.machine()}, torch {torch.__version__}, Python {platform.python_version()}); where the
two differ, other processes shared the CPU.

## Held-out figures

All {report['problems']:,} held-out problems ({card(config).report[0]};
train and held-out problems never overlap), at most {config.max_new_tokens} new tokens,
{k} samples per problem at temperature 1 (seed {SAMPLE_SEED}){episodes}:

| metric | value |
|---|---|
| greedy accuracy | {report['greedy_accuracy']:.4f} |
| greedy format rate | {report['greedy_format']:.4f} |
| sampled accuracy (pass@1, temperature 1) | {report['sample_accuracy']:.4f} |
| sampled format rate | {report['sample_format']:.4f} |
| pass@{k} (temperature 1) | {report[f'pass_at_{k}']:.4f} |
| problems whose {k} samples disagree | {report['mixed_groups']:.4f} |{tools}

Accuracy and format are `grpo_edu.environment.rewards.accuracy_reward` and `format_reward`.
`{'tests/test_tools.py' if card(config).environment else 'tests/test_pretrain.py'}` recomputes the greedy figures from these weights.
{extra}
## Use

```python
{use_lines(config)}
```
"""


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 of the weights (every tensor's bytes, by name): a remake from the recorded command,
    under the same kernels and thread count, gives the same digest."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def card_extra(config: PretrainConfig, result: PretrainResult) -> str:
    """The task's own section of the card (its Pretraining.extra, "module:function"), or ""."""
    if not card(config).extra:
        return ""
    module, _, function = card(config).extra.partition(":")
    return "\n" + getattr(importlib.import_module(module), function)(result.model, result.tokenizer, config)


def write_policy(config: PretrainConfig, result: PretrainResult, command: str,
                 started: tuple[float, float]) -> dict:
    """Measure the held-out figures, then write weights, tokenizer, model card
    (README.md) and pretrain.json (config, evaluation history, figures) to
    config.output_dir (check_output_dir: never the package's assets unless
    config.write_package_assets). `started` is (time.perf_counter(), time.process_time())
    at launch, so the card's run time covers training and this evaluation."""
    check_output_dir(config)
    report_set = card(config).report[1]()
    report = evaluate(result.model, result.tokenizer, report_set, pass_k=config.pass_k,
                      max_new_tokens=config.max_new_tokens, **_episodes(config))
    extra = card_extra(config, result)
    seconds, cpu_seconds = time.perf_counter() - started[0], time.process_time() - started[1]
    output = save_policy(result.model, result.tokenizer, config.output_dir)
    (output / "README.md").write_text(model_card(config, result, report, seconds, cpu_seconds, command, extra))
    (output / "pretrain.json").write_text(json.dumps(
        {"command": command, "config": dataclasses.asdict(config), "steps": result.steps,
         "weights_sha256": weights_digest(result.model),
         "seconds": round(seconds, 1), "cpu_seconds": round(cpu_seconds, 1),
         "history": result.history, "held_out": report}, indent=1) + "\n")
    return report


# --------------------------------------------------------------------------- command line

def parse_args(argv: list[str] | None = None) -> PretrainConfig:
    parser = argparse.ArgumentParser(prog="python -m grpo_edu.commands.pretrain", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(PretrainConfig):
        flag = f"--{f.name.replace('_', '-')}"
        if isinstance(f.default, bool):
            parser.add_argument(flag, action="store_true", help=f.metadata["help"])
        else:
            parser.add_argument(flag, type=type(f.default), default=f.default, help=f.metadata["help"])
    return PretrainConfig(**vars(parser.parse_args(argv)))


def main(argv: list[str] | None = None) -> int:
    started = (time.perf_counter(), time.process_time())
    config = parse_args(argv)
    try:   # before training: a refused folder or setting must not cost the run
        check_output_dir(config)
        validate(config)
    except ValueError as error:
        print(f"python -m grpo_edu.commands.pretrain: {error}", file=sys.stderr)
        return 2
    result = pretrain(config)
    if not result.reached:
        print(f"python -m grpo_edu.commands.pretrain: {not_reached_message(config, result)}", file=sys.stderr)
        return 1
    command = " ".join(["python -m grpo_edu.commands.pretrain", *(sys.argv[1:] if argv is None else argv)])
    report = write_policy(config, result, command, started)
    print(json.dumps(report, indent=1))
    print(f"wrote {config.output_dir} in {time.perf_counter() - started[0]:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
