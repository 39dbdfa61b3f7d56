"""GRPO's maths as functions of tensors and numbers: no model, no loop, no files.

    advantages.py    group-relative advantages: rewards (B, G) -> (B, G); per token (B, G, S)
                     from the rewards of every step (process supervision)
    baselines.py     the advantage estimators chapter 0 derives (REINFORCE to GRPO)
    bandit.py        a policy small enough to enumerate: exact bias and variance of each estimator
    logprobs.py      per-token log-probs at the sampled ids, without the full log-softmax
    loss.py          the clipped surrogate + KL, aggregated (grpo, bnpo, dr_grpo, dapo, GSPO)
    loss_checks.py   grpo_loss's argument checks: one line per bad input
    offpolicy.py     corrections for a sampler that is not pi_old (TIS, token and sequence masks)
    entropy_mask.py  the tokens whose entropy is in the top share (DAPO-style entropy masking)
    estimators.py    per-token pieces of the objective as functions of numbers (the explorers')
    reference.py     one GRPO update in pure NumPy, a loop per response: the test oracle
    worked_example.py  chapter 1's worked example as data

Imports only grpo_edu.runtime (a World to reduce over ranks).
"""
