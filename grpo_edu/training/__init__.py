"""The training run: the loop and the stages it calls, in the order of one step.

    user_functions.py    the reader's own advantage and reward functions by import path
    placement.py         the policy, reference and sampler placed and wrapped; the engine
    episodes.py          multi-turn episodes: the policy and an environment take turns
    batch.py             RolloutBatch: the step's data in the (B, G, S) layout, checked once
    plan.py              Plan: which groups each optimizer step trains on, what each part's loss
                         divides by, the micro-batches of a mini-batch on each rank
    scoring.py           a rollout's rewards, its advantages and its Plan
    rollouts.py          steps 1-4 as stages (draw, roll out, score, refill, pi_old) over a typed
                         Sampler, and the synchronous rollout source
    asynchronous.py      rollouts that lag (rollout_lag) and sampled in the background
                         (rollout_overlap): their sources, the sampler thread, their checkpoint records
    dynamic_sampling.py  DAPO's dynamic sampling: all-equal groups replaced by fresh ones
    update.py            reference and pi_old log-probs, micro-batches, the optimizer steps
    metrics.py           what a step logs (reduced over micro-batches and ranks), the summary
    evaluation.py        held-out greedy accuracy, pass@k, intervals
    checkpoint.py        checkpoints that resume bit for bit and survive a kill
    trainer.py           the loop that wires them, step by step; set-up and finishing
    trained.py           the trained model: where a run leaves it, and evaluating it
    reasoning.py         what a digitsum policy does depth by depth (chapter 9): formats, checks, pass@k

The config they read is grpo_edu.config; the doctor that watches a run, grpo_edu.doctor.

Imports the subpackages below it: runtime, algorithm, policy, environment, sampling, config, doctor.
"""
