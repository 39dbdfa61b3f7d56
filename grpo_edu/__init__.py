"""grpo_edu: the library behind the GRPO textbook.

Subpackages by role, from the maths up to the commands (each one's docstring lists its
modules, one line each; a subpackage imports only those above it in this list):

    runtime/      what every run stands on: processes and ranks, durable files, the pinned
                  floating-point kernels, the metrics log
    algorithm/    GRPO's maths as pure functions: advantages, log-probs, the loss and its
                  variants, off-policy corrections, the NumPy reference (the test oracle)
    policy/       the tiny model, its tokenizer and completion format; LoRA adapters
    environment/  tasks with checkable answers (each registered whole), rule-based rewards,
                  process supervision
    sampling/     rollout engines, each registered whole: transformers' generate, the fused CPU
                  engine, vLLM, an SGLang server
    config/       a run's config: its sections as types, their rules, config files on a base
    doctor/       failure modes recognised from a run's metrics, live and after the run
    training/     the loop and its stages (rollouts, scoring, the plan, update, metrics,
                  evaluation), placement, episodes, lagged and overlapped rollouts, checkpoints
    lab/          the failure lab: its runs (chapter 7) and the bugs it injects into a run
    exercises/    a checker for each chapter's exercises
    widgets       the interactive explorers (folder widgets/, imported as grpo_edu.widgets)
    book/         the book's tooling (book.toml, chapter builds and checks, the website) and
                  the training plots
    commands/     `grpo-edu` (cli), pretraining, the TRL bridge, the GPU doctor

One GRPO step goes through them in this order (B prompts, G completions per prompt, S
completion tokens): environment.tasks (prompts) -> sampling (G completions each, (B, G, S))
-> environment.rewards ((B, G)) -> algorithm.advantages -> algorithm.loss (with
algorithm.logprobs) -> the optimizer, wired by training.trainer.

grpo_edu/assets/ holds the committed starting policies (grpo_edu.policy.models loads them).
"""

__version__ = "0.1.0"
