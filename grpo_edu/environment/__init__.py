"""What the policy is asked and how its answers are scored.

    tasks.py    prompts with answers a program can check (arithmetic, multiply, countdown,
                chain, GSM8K)
    rewards.py  one scalar per completion from rules: accuracy, format, language
    process.py  process supervision: the chain task's step verifier, each step's reward at its token

Imports grpo_edu.runtime, grpo_edu.algorithm and grpo_edu.policy.
"""
