"""GRPO's maths as functions of tensors and numbers: no model, no loop, no files. Each family
of variants is a registry of pure functions (as verl's core_algos keeps its estimators): a
new variant is one registered function beside its siblings, and its test.

    advantages.py    group-relative advantages: rewards (B, G) -> (B, G), the scales registered
                     (group, batch, none); per token (B, G, S)
                     from the rewards of every step (process supervision)
    baselines.py     the advantage estimators chapter 0 derives (REINFORCE to GRPO)
    bandit.py        a policy small enough to enumerate: exact bias and variance of each estimator
    logprobs.py      per-token log-probs at the sampled ids, without the full log-softmax
    loss.py          the GRPO loss composed from the parts below (LossSettings names each)
    aggregation.py   the loss types, registered: grpo, bnpo, dr_grpo, dapo
    surrogates.py    the ratio levels (token, sequence: GSPO) and surrogates (clip, capped), registered
    kl.py            the KL estimators k1, k2, k3, registered
    offpolicy.py     corrections for a sampler that is not pi_old, registered: TIS, token and sequence masks
    entropy_mask.py  the tokens whose entropy is in the top share (DAPO-style entropy masking)
    schedules.py     the learning-rate schedules, registered: constant, linear, cosine
    estimators.py    per-token pieces of the objective as functions of numbers (the explorers')
    reference.py     one GRPO update in pure NumPy, a loop per response: the test oracle
    statistics.py    paired comparisons (over seeds: t; over problems: bootstrap, McNemar):
                     when the book may say "A beats B"
    worked_example.py  chapter 1's worked example as data

Imports only grpo_edu.runtime (a World to reduce over ranks).
"""
