"""Named families of functions: a registry is a dict {name: function}, filled by a decorator.

    LOSS_TYPES: dict[str, Divisors] = {}
    aggregation = registrar(LOSS_TYPES)

    @aggregation("grpo")
    def per_response_mean(mask, counts): ...

The algorithm's variants (loss types, surrogates, KL estimators, corrections, advantage
scales) and the learning-rate schedules are registries; a config key names one entry.
"""

from __future__ import annotations

from typing import Callable, TypeVar

F = TypeVar("F", bound=Callable)


def registrar(registry: dict) -> Callable[[str], Callable[[F], F]]:
    """The decorator factory that registers a function in `registry` under a name."""
    def named(name: str) -> Callable[[F], F]:
        def register(function: F) -> F:
            registry[name] = function
            return function
        return register
    return named
