"""The learning-rate schedules, registered by name (config key lr_schedule).

After a linear warmup of `warmup` optimizer steps, the peak learning rate is multiplied by
the schedule's factor of the run's progress p (0 at the end of the warmup, 1 at the last step):

    constant  1
    linear    1 - p                          (decay to 0)
    cosine    (1 + cos(pi min(1, p))) / 2    (decay to 0; Loshchilov and Hutter, 2017, SGDR)

    LR_SCHEDULES          name -> factor(p)
    learning_rate_factor  the multiplier at each optimizer step: warmup, then the schedule
"""

from __future__ import annotations

import math
from typing import Callable
from grpo_edu.runtime.registry import registrar

Decay = Callable[[float], float]
LR_SCHEDULES: dict[str, Decay] = {}

schedule = registrar(LR_SCHEDULES)   # @schedule("name") registers factor(progress), the learning-rate schedule `name`


@schedule("constant")
def constant(progress: float) -> float:
    return 1.0


@schedule("linear")
def linear(progress: float) -> float:
    return max(0.0, 1.0 - progress)


@schedule("cosine")
def cosine(progress: float) -> float:
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


def learning_rate_factor(name: str, total: int, warmup: int) -> Callable[[int], float]:
    """The multiplier of the peak learning rate at optimizer step `step` (0-based) of `total`:
    the first `warmup` of them warming up linearly, then schedule `name` over the rest."""
    if name not in LR_SCHEDULES:
        raise ValueError(f"lr_schedule must be one of {tuple(LR_SCHEDULES)}, got {name!r}")
    decay = LR_SCHEDULES[name]

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return decay((step - warmup) / max(1, total - warmup))
    return factor
