"""The training run: a config, the loop and the stages it calls, in the order of one step.

    config.py            TrainConfig: every key documented once beside its own rules; from TOML
                         and --set key=value
    config_rules.py      how a key is checked; RULES, the rules across keys, in one table
    schedules.py         the learning-rate schedules, registered: constant, linear, cosine
    user_functions.py    the reader's own advantage and reward functions by import path
    placement.py         the policy, reference and sampler placed and wrapped; the engine
    episodes.py          multi-turn episodes: the policy and an environment take turns
    batch.py             RolloutBatch: the step's data in the (B, G, S) layout, checked once
    scoring.py           a rollout's rewards, its advantages and the mini-batch plan
    update.py            reference and pi_old log-probs, micro-batches, the optimizer steps
    metrics.py           what a step logs (reduced over micro-batches and ranks), the summary
    rollouts.py          steps 1-4 as stages (draw, roll out, score, refill, pi_old) and the
                         rollout sources behind one interface: synchronous, lagged, overlapped
    evaluation.py        held-out greedy accuracy, pass@k, intervals
    diagnose.py          the doctor: failure modes recognised from a run's metrics, live or after
    lagging.py           rollouts that lag (rollout_lag): batches in flight
    overlap.py           rollouts sampled in the background (rollout_overlap)
    dynamic_sampling.py  DAPO's dynamic sampling: all-equal groups replaced by fresh ones
    checkpoint.py        checkpoints that resume bit for bit and survive a kill
    trainer.py           the loop that wires them, step by step; set-up and finishing
    trained.py           the trained model: where a run leaves it, and evaluating it

Imports the subpackages below it: runtime, algorithm, policy, environment, sampling.
"""
