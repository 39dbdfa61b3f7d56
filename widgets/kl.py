"""The KL explorer: Schulman's k1, k2, k3 estimators of KL(pi || pi_ref) for two
categorical distributions over a 3-token vocabulary (one position of a language model),
per sample and averaged over samples drawn from pi, next to the exact KL."""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as widgets
import numpy as np
import torch
from matplotlib.collections import LineCollection

from grpo_edu.algorithm import worked_example
from grpo_edu.algorithm.estimators import categorical_kl
from grpo_edu.algorithm.kl import KL_ESTIMATORS
from grpo_edu.algorithm.kl import kl_estimate as _kl_estimate
from grpo_edu.algorithm.reference import log_softmax
from grpo_edu.widgets._base import (Explorer, Plot, cell, fmt, nice_limit, notes_html, snap,
                                    sticky_limits, table)

# pi: the new policy's logits at chapter 1's first token; pi_ref: a flatter reference.
DEFAULT_LOGITS = worked_example.NEW_LOGITS[0][0]
DEFAULT_REF_LOGITS = (0.5, 0.0, 0.5)
SAMPLE_SIZES = (10, 30, 100, 300, 1000, 3000, 10000)
LOG_RATIO_GRID = np.linspace(-4.0, 4.0, 401)
COLOURS = {"k1": "#6baed6", "k2": "#fd8d3c", "k3": "#31a354"}


def kl_estimate(logp, ref_logp, estimator: str) -> np.ndarray:
    """grpo_edu.algorithm.kl.kl_estimate (the trainer's) on NumPy arrays."""
    return _kl_estimate(torch.as_tensor(logp, dtype=torch.float64),
                        torch.as_tensor(ref_logp, dtype=torch.float64), estimator).numpy()


@dataclass(frozen=True)
class KLState:
    logits: np.ndarray          # (V,) pi
    ref_logits: np.ndarray      # (V,) pi_ref
    probs: np.ndarray           # (V,) pi
    log_ratio: np.ndarray       # (V,) log pi_ref(x) - log pi(x) for each token x
    per_token: dict             # estimator -> (V,) its value at each token
    exact_kl: float             # KL(pi || pi_ref)
    expected: dict              # estimator -> E_{x ~ pi}[k(x)], exactly
    num_samples: int
    sample_mean: dict           # estimator -> mean over num_samples draws x ~ pi
    sample_std: dict            # estimator -> std of the per-sample values
    notes: tuple[str, ...]


def compute_state(logits, ref_logits, num_samples: int = 1000, seed: int = 0) -> KLState:
    logits, ref_logits = np.asarray(logits, float), np.asarray(ref_logits, float)
    logp, ref_logp = log_softmax(logits), log_softmax(ref_logits)
    probs = np.exp(logp)
    samples = np.random.default_rng(seed).choice(len(probs), size=num_samples, p=probs)
    per_token, expected, sample_mean, sample_std = {}, {}, {}, {}
    for name in KL_ESTIMATORS:
        per_token[name] = kl_estimate(logp, ref_logp, name)
        expected[name] = float(np.dot(probs, per_token[name]))
        drawn = kl_estimate(logp[samples], ref_logp[samples], name)
        sample_mean[name], sample_std[name] = float(drawn.mean()), float(drawn.std())
    exact = categorical_kl(logits, ref_logits)
    notes = []
    if np.allclose(logp, ref_logp, rtol=0, atol=1e-12):
        notes.append("pi = pi_ref: every estimator is 0 on every sample, and so is the KL")
    else:
        notes.append(f"on tokens drawn from pi, k1 and k3 are unbiased: their exact means {fmt(expected['k1'])} and "
                     f"{fmt(expected['k3'])} equal the KL {fmt(exact)}; k2's mean is "
                     f"{fmt(expected['k2'])} (bias {fmt(expected['k2'] - exact)})")
        notes.append(f"per-sample std over {num_samples} draws: k1 {sample_std['k1']:.4f}, "
                     f"k2 {sample_std['k2']:.4f}, k3 {sample_std['k3']:.4f}")
        if (per_token["k1"] < 0).any():
            negative = [f"x{x}" for x in np.flatnonzero(per_token["k1"] < 0)]
            notes.append(f"k1 is negative on token(s) {', '.join(negative)} (where pi_ref > pi): "
                         "a single-sample KL penalty that rewards moving away")
    return KLState(logits, ref_logits, probs, ref_logp - logp, per_token, exact,
                   expected, int(num_samples), sample_mean, sample_std, tuple(notes))


def _bar_limits(low: float, high: float) -> tuple[float, float]:
    top = nice_limit(high * 1.3)
    return (-nice_limit(-low * 1.3) if low < -top / 20 else -top / 20), top


class KLExplorer(Explorer):
    """Logit sliders for pi and pi_ref over 3 tokens and a sample count; the per-sample
    k1, k2, k3 against the log-ratio, and their sample means and stds next to the exact KL.

        explorer = KLExplorer()
        explorer.ref_logit_sliders[0].value = 2.0
        explorer.state.exact_kl, explorer.state.sample_mean["k3"]
    """

    css = "grpo-kl-explorer"

    def __init__(self, logits=DEFAULT_LOGITS, ref_logits=DEFAULT_REF_LOGITS, num_samples: int = 1000,
                 seed: int = 0):
        super().__init__()
        if len(logits) != len(ref_logits):
            raise ValueError(f"logits and ref_logits must have the same length V, got "
                             f"{len(logits)} and {len(ref_logits)}")
        self.seed = seed
        self.logit_sliders = [self._logit_slider(f"pi x{x}", v) for x, v in enumerate(logits)]
        self.ref_logit_sliders = [self._logit_slider(f"ref x{x}", v)
                                  for x, v in enumerate(ref_logits)]
        self.num_samples = widgets.SelectionSlider(options=SAMPLE_SIZES, value=num_samples,
                                                   description="samples")
        self.table = widgets.HTML()
        self.notes = widgets.HTML()
        self.plot = Plot(8.0, 3.0, ncols=2)
        self._artists = None
        self._ylim = None
        self._observe(*self.logit_sliders, *self.ref_logit_sliders, self.num_samples)
        self.widget = self._assemble(
            widgets.HBox([widgets.VBox([widgets.HTML("<b>pi (policy) logits</b>"), *self.logit_sliders]),
                          widgets.VBox([widgets.HTML("<b>pi_ref logits</b>"), *self.ref_logit_sliders]),
                          self.num_samples]),
            self.plot.image, widgets.HBox([self.table]), self.notes)
        self.update()

    @staticmethod
    def _logit_slider(description: str, value: float) -> widgets.FloatSlider:
        return widgets.FloatSlider(value=value, min=-3.0, max=3.0, step=0.1,
                                   description=description, readout_format="+.1f")

    def compute(self) -> KLState:
        return compute_state([snap(s.value) for s in self.logit_sliders],
                             [snap(s.value) for s in self.ref_logit_sliders],
                             self.num_samples.value, self.seed)

    def show(self, state: KLState) -> None:
        rows = [["exact KL", cell(state.exact_kl, "exact-kl"), "", ""]]
        for name in KL_ESTIMATORS:
            rows.append([name, cell(state.expected[name], f"expected {name}"),
                         cell(state.sample_mean[name], f"sample-mean {name}"),
                         cell(state.sample_std[name], f"sample-std {name}")])
        self.table.value = table("grpo-kl-table",
                                 ["", "E_pi[k] exact", f"mean of {state.num_samples}", "std"], rows)
        self.notes.value = notes_html("grpo-kl-notes", list(state.notes))
        self._draw(state)

    def _draw(self, state: KLState) -> None:
        curve_ax, bar_ax = self.plot.axes
        x = np.arange(len(KL_ESTIMATORS))
        if self._artists is None:
            artists = {"points": {}}
            for name in KL_ESTIMATORS:
                values = kl_estimate(np.zeros_like(LOG_RATIO_GRID), LOG_RATIO_GRID, name)
                curve_ax.plot(LOG_RATIO_GRID, values, color=COLOURS[name], label=name)
                artists["points"][name] = curve_ax.scatter([0, 0, 0], [0, 0, 0], color=COLOURS[name],
                                                           edgecolors="black", zorder=3)
            curve_ax.axhline(0.0, color="black", linewidth=0.8)
            curve_ax.set_xlim(LOG_RATIO_GRID[0], LOG_RATIO_GRID[-1])
            curve_ax.set_ylim(-4.0, 6.0)
            curve_ax.set_xlabel("d = log pi_ref(x) - log pi(x)")
            curve_ax.set_title("per sample (dots: the 3 tokens, size ~ pi)", fontsize=10)
            curve_ax.legend(loc="upper center", fontsize=8)
            artists["bars"] = list(bar_ax.bar(x, [0, 0, 0], 0.6, color=[COLOURS[n] for n in KL_ESTIMATORS]))
            artists["errors"] = LineCollection([], colors="black", linewidths=1.2)
            bar_ax.add_collection(artists["errors"])
            artists["exact"] = bar_ax.axhline(0.0, color="black", linestyle="--", label="exact KL")
            bar_ax.axhline(0.0, color="black", linewidth=0.8)
            bar_ax.set_xticks(x, list(KL_ESTIMATORS))
            bar_ax.set_xlim(-0.6, len(x) - 0.4)
            bar_ax.set_title("sample mean +- std vs exact KL", fontsize=10)
            bar_ax.legend(loc="upper right", fontsize=8)
            self.plot.figure.tight_layout()
            self._artists = artists
        artists = self._artists
        sizes = 20 + 200 * state.probs
        for name in KL_ESTIMATORS:
            points = artists["points"][name]
            points.set_offsets(np.column_stack([state.log_ratio, state.per_token[name]]))
            points.set_sizes(sizes)
        means = np.array([state.sample_mean[n] for n in KL_ESTIMATORS])
        stds = np.array([state.sample_std[n] for n in KL_ESTIMATORS])
        for bar, mean in zip(artists["bars"], means):
            bar.set_height(mean)
        segments = [[(i, m - s), (i, m + s)] for i, (m, s) in enumerate(zip(means, stds))]
        segments += [[(i - 0.08, m + sign * s), (i + 0.08, m + sign * s)]
                     for i, (m, s) in enumerate(zip(means, stds)) for sign in (-1, 1)]
        artists["errors"].set_segments(segments)
        artists["exact"].set_ydata([state.exact_kl, state.exact_kl])
        # y limits from a 1-2-5 ladder, kept while the bars fit: most slider moves then
        # reuse the cached background.
        high = max(float(np.max(means + stds)), state.exact_kl, 1e-3)
        low = min(float(np.min(means - stds)), -high / 40)
        self._ylim = sticky_limits(self._ylim, low, high, _bar_limits, slack=6.0)
        bar_ax.set_ylim(*self._ylim)
        self.plot.render([*artists["points"].values(), *artists["bars"], artists["errors"],
                          artists["exact"]], layout=self._ylim)

    def describe(self) -> str:
        s = self.state
        return (f"pi logits {np.round(s.logits, 2).tolist()}, pi_ref logits "
                f"{np.round(s.ref_logits, 2).tolist()}, {s.num_samples} samples")

    def report(self) -> str:
        s = self.state
        lines = [self.describe(),
                 f"pi     = [{', '.join(f'{p:.4f}' for p in s.probs)}]",
                 f"log pi_ref - log pi = [{', '.join(fmt(d) for d in s.log_ratio)}]",
                 f"exact KL(pi || pi_ref) = {s.exact_kl:.4f}",
                 "estimator   E_pi[k] exact   sample mean   sample std"]
        for name in KL_ESTIMATORS:
            lines.append(f"{name:<11} {s.expected[name]:>13.4f}   {s.sample_mean[name]:>11.4f}"
                         f"   {s.sample_std[name]:>10.4f}")
        lines += [f"note: {n}" for n in s.notes]
        return "\n".join(lines)
