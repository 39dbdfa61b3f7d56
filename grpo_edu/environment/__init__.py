"""What the policy is asked and how its answers are scored.

    registry.py  the tasks, each registered whole: its problems, instruction, answer check, step
                 verifier and pretraining card
    tasks.py     prompts with answers a program can check (arithmetic, multiply, countdown,
                 GSM8K), each registered where it is written; a run's problems
    rewards.py   one scalar per completion from rules: accuracy, format, language
    process.py   process supervision: the chain task (registered there), its step verifier, each
                 step's reward at its token
    digitsum.py  the digit sum mod 10 of controlled depth (registered there): its pretraining
                 mixtures, and what a completion does (its format, its checks)

Importing the package registers the built-in tasks (tasks.py, process.py and digitsum.py).

Imports grpo_edu.runtime, grpo_edu.algorithm and grpo_edu.policy.
"""

from grpo_edu.environment import digitsum, process, tasks  # noqa: F401  (the built-in tasks register themselves)
