"""How fast the explorers answer a slider: the median time from a value change to the
updated output (new state from grpo_edu, new HTML table, new PNG), per explorer.

    python benchmarks/widgets.py [--repeats 40]

Setting a control's value runs the explorer's observer synchronously, exactly as the
kernel does when the browser sends a slider move; the time measured is that call. Each
slider is swept back and forth through its values as a drag would; "redraws" counts
the updates that changed the axis limits and so redrew the whole figure (the others
redraw only the moving artists over a cached background).
(Not included: the round trip through the websocket and the browser's repaint,
which the browser test exercises.) Target: <= 100 ms per update on a laptop CPU.
"""

from __future__ import annotations

import argparse
import itertools
import platform
import statistics
import time

import numpy as np
import torch

from grpo_edu.widgets import AdvantageExplorer, ClippingExplorer, KLExplorer, LengthBiasExplorer
from grpo_edu.widgets.kl import SAMPLE_SIZES

TARGET_MS = 100.0


def sweep(start: float, stop: float, step: float) -> list:
    """The values a slider passes through when dragged from start to stop and back."""
    forward = [round(v, 6) for v in np.arange(start, stop + step / 2, step)]
    return forward + forward[-2:0:-1]


def cases():
    """(explorer name, control label, explorer, control, the values it takes in turn)."""
    advantages = AdvantageExplorer()
    clipping = ClippingExplorer()
    kl = KLExplorer()
    length_bias = LengthBiasExplorer()
    lengths = [(20, int(n)) for n in sweep(400, 512, 4)] + [(int(n), 400) for n in sweep(20, 120, 4)]
    return [
        ("AdvantageExplorer", "reward r2 (drag)", advantages, advantages.reward_sliders[0][1],
         sweep(-1.0, 1.0, 0.05)),
        ("AdvantageExplorer", "scale (toggle)", advantages, advantages.scale, ["batch", "none", "group"]),
        ("ClippingExplorer", "A (drag)", clipping, clipping.advantage, sweep(-2.0, 2.0, 0.05)),
        ("ClippingExplorer", "eps_high (drag)", clipping, clipping.epsilon_high, sweep(0.0, 0.5, 0.01)),
        ("KLExplorer", "pi_ref logit x0 (drag)", kl, kl.ref_logit_sliders[0], sweep(-3.0, 3.0, 0.1)),
        ("KLExplorer", "samples (drag)", kl, kl.num_samples, list(SAMPLE_SIZES)),
        ("LengthBiasExplorer", "lengths (drag)", length_bias, length_bias.lengths, lengths),
        ("LengthBiasExplorer", "G (drag)", length_bias, length_bias.group_size, sweep(2, 16, 1)),
    ]


def measure(explorer, control, values, repeats: int) -> tuple[list[float], list[float], int]:
    """Times of `repeats` value changes (cycling through values), the grpo_edu part of
    each, and how many needed a full redraw (new axis limits)."""
    totals, computes = [], []
    full_draws = explorer.plot.full_draws
    for value in itertools.islice(itertools.cycle(values), repeats + 1):
        if control.value == value:
            continue
        before = explorer.updates
        start = time.perf_counter()
        control.value = value
        totals.append(time.perf_counter() - start)
        assert explorer.updates == before + 1, "one value change must give exactly one update"
        computes.append(explorer.last_compute_seconds)
    return totals, computes, explorer.plot.full_draws - full_draws


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=60, help="value changes per control")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print(f"explorer responsiveness: {platform.processor() or platform.machine()}, "
          f"{args.repeats} value changes per control, torch threads = 1\n")
    print(f"{'explorer':<20} {'control':<24} {'median':>9} {'p90':>9} {'max':>9} {'grpo_edu':>9} "
          f"{'redraws':>8}")
    per_explorer: dict[str, list[float]] = {}
    for name, label, explorer, control, values in cases():
        totals, computes, full_draws = measure(explorer, control, values, args.repeats)
        per_explorer.setdefault(name, []).extend(totals)
        print(f"{name:<20} {label:<24} {statistics.median(totals) * 1e3:>6.1f} ms "
              f"{statistics.quantiles(totals, n=10)[-1] * 1e3:>6.1f} ms {max(totals) * 1e3:>6.1f} ms "
              f"{statistics.median(computes) * 1e3:>6.1f} ms {full_draws:>4}/{len(totals)}")
    print("\nmedian per explorer, slider change -> updated table and figure:")
    slow = 0
    for name, totals in per_explorer.items():
        median = statistics.median(totals) * 1e3
        slow += median > TARGET_MS
        print(f"  {name:<20} {median:6.1f} ms  ({'within' if median <= TARGET_MS else 'OVER'} "
              f"the {TARGET_MS:.0f} ms target)")
    return 1 if slow else 0


if __name__ == "__main__":
    raise SystemExit(main())
