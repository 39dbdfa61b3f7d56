"""Chapter 1's worked example as data: one prompt, G = 4 responses, one update.

The numbers are chapter 1's example, which it works through by hand: 4 responses of 3, 2, 2 and 2 tokens over a
vocabulary of 3 tokens. Chapter 1 types them out for the reader; the explorers
(chapter 2) and the tests import them from here, so the book has one copy of them
outside chapter 1's prose.
"""

from __future__ import annotations

import numpy as np

from grpo_edu.algorithm import reference

TOKEN_IDS = ((0, 2, 1), (1, 0), (2, 2), (0, 1))          # (T_i,) per response
OLD_LOGP = ((-0.50, -0.61, -0.92), (-1.20, -0.41), (-0.81, -0.69), (-0.51, -1.10))
REF_LOGP = ((-0.60, -0.71, -0.82), (-1.10, -0.51), (-0.91, -0.79), (-0.41, -1.00))
NEW_LOGITS = (                                           # (T_i, V = 3) per response
    ((1.10, -0.20, 0.30), (-0.40, 0.80, 1.60), (0.10, 1.40, 0.20)),
    ((-0.20, 1.10, 0.40), (0.90, -0.30, 0.10)),
    ((0.10, 0.20, 1.30), (-0.10, 0.40, 1.50)),
    ((1.20, -0.40, 0.10), (-0.30, 1.50, 0.20)),
)
REWARDS = (0.9, 0.3, -0.1, 0.7)                          # (G,)
EPSILON = 0.2
BETA = 0.04


def update(**overrides) -> reference.GRPOUpdate:
    """The reference GRPO update of the worked example; keyword arguments override
    grpo_update's settings (epsilon, epsilon_high, beta, std, scale_by_std, eps)."""
    settings = {"epsilon": EPSILON, "beta": BETA, **overrides}
    return reference.grpo_update(TOKEN_IDS, [np.array(x) for x in NEW_LOGITS], OLD_LOGP, REF_LOGP,
                                 np.array(REWARDS), **settings)


def token_ratios() -> np.ndarray:
    """rho = pi / pi_old of every token of the worked example, response by response: (9,)."""
    return np.concatenate([r.ratio for r in update().responses])


def token_labels() -> list[str]:
    """'o1,t1', 'o1,t2', ... in the order of token_ratios()."""
    return [f"o{i + 1},t{t + 1}" for i, ids in enumerate(TOKEN_IDS) for t in range(len(ids))]
