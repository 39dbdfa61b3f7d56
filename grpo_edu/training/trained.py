"""The trained model: where a run leaves it, and what a reader does with it next.

A finished `grpo-edu train` writes its policy to RUN_DIR/model/ (`save_trained`): a
transformers folder (config.json, model.safetensors in float32, generation_config.json, the
tokenizer's files) with a README.md that says how it was trained, how it scored and how to
load it. transformers' `from_pretrained` loads it, and so does vLLM (`vllm.LLM(model=...)`).

    grpo-edu eval RUN_DIR [--samples K]       held-out accuracy again, with intervals; pass@K, maj@K
    grpo-edu sample RUN_DIR "47+85=" [-n N]   completions of a prompt of your own

`evaluate_run` scores the policy on the run's own held-out problems, with the trainer's own
function (evaluation.held_out_metrics): the run's final evaluation, recomputed. A run that has
not finished has no model/ yet: `load_trained` then takes the policy of its newest complete
checkpoint, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from grpo_edu import __version__
from grpo_edu.environment import tasks
from grpo_edu.policy import lora
from grpo_edu.training import checkpoint
from grpo_edu.config import TrainConfig
from grpo_edu.runtime.distributed import resolve_device
from grpo_edu.training.evaluation import greedy_scores, sampled_metrics, sampled_scores, wilson_interval
from grpo_edu.policy.models import generate_completions, load_policy, policy_source, save_policy
from grpo_edu.runtime.precision import autocast

MODEL_DIR = "model"   # RUN_DIR/model: the finished run's policy


class TrainedModelError(ValueError):
    """RUN_DIR holds no run, or nothing to load yet: one line naming what was found."""


@dataclass
class Trained:
    model: torch.nn.Module
    tokenizer: object
    config: TrainConfig     # the run's own (its config.json)
    source: str             # what was loaded: "model/" or "checkpoint step-000300"


# --------------------------------------------------------------------------- writing

def save_trained(model, tokenizer, run_dir: str | Path, summary: dict) -> Path:
    """The trained policy into run_dir/model/, with a README.md model card; returns the folder."""
    if lora.has_adapters(model):   # the plain architecture, each adapter merged into its layer
        model = lora.merged_copy(model)
    folder = save_policy(model, tokenizer, Path(run_dir) / MODEL_DIR)
    (folder / "README.md").write_text(model_card(summary, folder))
    return folder


def model_card(summary: dict, folder: Path) -> str:
    config = summary["config"]
    start, final = summary["start_accuracy_interval_95"], summary["final_accuracy_interval_95"]
    chat = ("inside the tokenizer's chat template, as a user message (chat_template = true)"
            if config["chat_template"] else "as plain text, continued directly (chat_template = false)")
    return f"""# A GRPO-trained policy (grpo-edu {__version__})

Trained by `grpo-edu train` from `{config['model']}` on the {config['task']!r} task: {summary['steps']} steps of
{config['prompts_per_step']} prompts x {config['num_generations']} completions, loss {config['loss_type']!r},
beta {config['beta']}, learning rate {config['learning_rate']}, seed {config['seed']}. The run's config is
`../config.json`, its metrics `../metrics.jsonl`.

| held-out greedy accuracy ({summary['eval_problems']} problems) | value | 95% Wilson interval |
|---|---|---|
| before training | {summary['start_accuracy']:.4f} | [{start[0]:.4f}, {start[1]:.4f}] |
| after training | {summary['final_accuracy']:.4f} | [{final[0]:.4f}, {final[1]:.4f}] |

Prompts are given {chat}; completions answer as `<think>...</think>` then `\\boxed{{answer}}`, at most
{config['max_completion_length']} new tokens.

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained("{folder}")
tokenizer = AutoTokenizer.from_pretrained("{folder}")
```

or `grpo-edu eval {folder.parent}` (held-out accuracy again, `--samples 8` for pass@8 and maj@8) and
`grpo-edu sample {folder.parent} "PROMPT"`. vLLM loads the folder too: `vllm.LLM(model="{folder}")`.
"""


# --------------------------------------------------------------------------- loading

def load_trained(run_dir: str | Path) -> Trained:
    """The run's policy: run_dir/model/ when the run finished, else its newest complete
    checkpoint's weights in the run's model (config.run.model)."""
    run = Path(run_dir)
    if not (run / "config.json").is_file():
        found = "no such folder" if not run.exists() else "not a folder" if not run.is_dir() else "no config.json"
        raise TrainedModelError(f"RUN_DIR: expected a run directory of grpo-edu train, got {str(run_dir)!r} ({found})")
    config = TrainConfig.load_run_config(run)
    if (run / MODEL_DIR / "config.json").is_file():
        model, tokenizer = load_policy(run / MODEL_DIR)
        return Trained(model, tokenizer, config, f"{MODEL_DIR}/")
    if not checkpoint.checkpoint_folders(run / "checkpoints"):
        raise TrainedModelError(f"RUN_DIR: {run} has no {MODEL_DIR}/ (the run has not finished) and no checkpoint "
                                f"to take the policy from")
    model, tokenizer = load_policy(policy_source(config.run.model))
    if config.lora.lora_rank:   # the checkpoint holds the adapters: on the base again, then merged
        model = lora.add_adapters(model, config)
    try:
        saved = checkpoint.load_weights(run, model, None)
    except checkpoint.CheckpointError as error:
        raise TrainedModelError(f"RUN_DIR: {error}") from None
    model = lora.merged_copy(model).eval() if config.lora.lora_rank else model
    return Trained(model, tokenizer, config,
                   f"checkpoint step-{saved['step']:06d} (the run has not finished: no {MODEL_DIR}/)")


# --------------------------------------------------------------------------- using

def evaluate_run(trained: Trained, *, samples: int = 0, problems: int | None = None,
                 max_new_tokens: int | None = None) -> dict:
    """The policy on the run's held-out problems (the first `problems` of them; default all
    eval_size), as the trainer evaluates: greedy accuracy and format with 95% Wilson intervals,
    and with samples = k > 0, pass@1, pass@k and maj@k from k samples per problem."""
    config = trained.config
    held_out = tasks.task_pools(config, trained.tokenizer)[1]
    if problems is not None:
        if not 1 <= problems <= len(held_out):
            raise TrainedModelError(f"--problems: expected 1 to {len(held_out)} (the run's held-out problems), "
                                    f"got {problems}")
        held_out = held_out[:problems]
    if samples < 0:
        raise TrainedModelError(f"--samples: expected 0 (greedy only) or more, got {samples}")
    length = _new_tokens(config, max_new_tokens)
    device = resolve_device(config.run.device)
    model = trained.model.to(device).eval()
    with autocast(config.run.precision, device):
        scores = greedy_scores(model, trained.tokenizer, held_out, max_new_tokens=length)
        sampled = sampled_scores(model, trained.tokenizer, held_out, k=samples, max_new_tokens=length) if samples else []
    n = len(held_out)
    right, formatted = sum(a for a, _ in scores), sum(f for _, f in scores)
    results = {"problems": n, "task": config.run.task, "source": trained.source, "max_new_tokens": length,
               "greedy_accuracy": right / n, "greedy_accuracy_interval_95": list(wilson_interval(round(right), n)),
               "greedy_format": formatted / n, "greedy_format_interval_95": list(wilson_interval(round(formatted), n))}
    if samples:
        results.update(sampled_metrics(sampled, samples))
    return results


def sample(trained: Trained, prompt: str, *, n: int = 1, temperature: float = 1.0, max_new_tokens: int | None = None,
           seed: int = 0, raw: bool = False) -> tuple[str, list[str]]:
    """n completions of `prompt` (the prompt as the policy reads it, and the completions).
    The prompt goes into the tokenizer's chat template as the run's did (chat_template),
    unless `raw`. temperature 0 is greedy (n = 1)."""
    if n < 1:
        raise TrainedModelError(f"-n: expected 1 or more completions, got {n}")
    if temperature < 0:
        raise TrainedModelError(f"--temperature: expected 0 (greedy) or more, got {temperature}")
    if temperature == 0 and n != 1:
        raise TrainedModelError(f"-n: greedy decoding (--temperature 0) gives one completion, got -n {n}")
    config, tokenizer = trained.config, trained.tokenizer
    if config.data.chat_template and not raw:
        prompt = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                               tokenize=False)
    length = _new_tokens(config, max_new_tokens)
    device = resolve_device(config.run.device)
    model = trained.model.to(device).eval()
    with autocast(config.run.precision, device):
        completions = generate_completions(model, tokenizer, [prompt], num_samples=n, temperature=temperature,
                                           max_new_tokens=length, seed=seed)[0]
    return prompt, completions


def _new_tokens(config: TrainConfig, max_new_tokens: int | None) -> int:
    if max_new_tokens is None:
        return config.rollout.max_completion_length
    if max_new_tokens < 1:
        raise TrainedModelError(f"--max-new-tokens: expected 1 or more, got {max_new_tokens}")
    return max_new_tokens

