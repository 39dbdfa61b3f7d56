"""The clipping explorer: PPO's clipped surrogate min(rho A, clip(rho, 1 - eps_low,
1 + eps_high) A) and its gradient against the ratio rho, with chapter 1's tokens."""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as widgets
import numpy as np

from grpo_edu.algorithm import worked_example
from grpo_edu.algorithm.estimators import ClippedObjective, clipped_objective
from grpo_edu.widgets._base import Explorer, Plot, cell, fmt, notes_html, snap, table

RATIO_RANGE = (0.0, 2.5)
GRID = np.linspace(0.005, RATIO_RANGE[1], 500)      # rho > 0


@dataclass(frozen=True)
class ClippingState:
    advantage: float
    epsilon_low: float
    epsilon_high: float
    curve: ClippedObjective        # on GRID
    tokens: ClippedObjective       # chapter 1's tokens at this advantage
    token_labels: tuple[str, ...]
    no_gradient: tuple[float, float] | None   # the rho interval with zero gradient, if any
    notes: tuple[str, ...]


def compute_state(advantage: float, epsilon_low: float, epsilon_high: float) -> ClippingState:
    curve = clipped_objective(GRID, advantage, epsilon=epsilon_low, epsilon_high=epsilon_high)
    tokens = clipped_objective(worked_example.token_ratios(), advantage, epsilon=epsilon_low,
                               epsilon_high=epsilon_high)
    labels = tuple(worked_example.token_labels())
    if advantage > 0:
        no_gradient = (1.0 + epsilon_high, np.inf)
        notes = [f"A > 0: past rho = {1 + epsilon_high:.4f} the clipped branch wins; the "
                 f"objective is flat at {fmt((1 + epsilon_high) * advantage)} and the gradient "
                 "is 0: no reward for pushing the token's probability further",
                 f"below rho = {1 - epsilon_low:.4f} nothing clips (the min keeps rho A): the "
                 f"gradient {fmt(advantage)} pulls the token back up"]
    elif advantage < 0:
        no_gradient = (0.0, 1.0 - epsilon_low)
        notes = [f"A < 0: below rho = {1 - epsilon_low:.4f} the clipped branch wins; the "
                 f"objective is flat at {fmt((1 - epsilon_low) * advantage)} and the gradient "
                 "is 0: no reward for pushing the token's probability further down",
                 f"above rho = {1 + epsilon_high:.4f} nothing clips (the min keeps rho A): the "
                 f"gradient {fmt(advantage)} pushes the token back down"]
    else:
        no_gradient = None
        notes = ["A = 0: the objective and its gradient are 0 for every ratio; this token "
                 "neither gains nor loses probability (its reward equals its group's mean, as when all rewards are equal)"]
    clipped = [label for label, c in zip(labels, tokens.clipped) if c]
    notes.append(f"chapter 1's tokens clipped at this A: {', '.join(clipped) if clipped else 'none'}"
                 f" ({len(clipped)} of {len(labels)})")
    return ClippingState(float(advantage), float(epsilon_low), float(epsilon_high), curve, tokens,
                         labels, no_gradient, tuple(notes))


class ClippingExplorer(Explorer):
    """Sliders for the advantage A (both signs), eps_low and eps_high; the per-token
    objective and d objective / d rho against rho, clipped regions shaded, chapter 1's
    nine tokens drawn as points (where they would sit if their response had this A).

        explorer = ClippingExplorer()
        explorer.advantage.value = -1.0
        explorer.state.tokens.clipped     # (9,) bool, from grpo_edu.algorithm.estimators
    """

    css = "grpo-clipping-explorer"

    def __init__(self, advantage: float = 1.0, epsilon_low: float = worked_example.EPSILON,
                 epsilon_high: float = worked_example.EPSILON):
        super().__init__()
        self.advantage = widgets.FloatSlider(value=advantage, min=-2.0, max=2.0, step=0.05,
                                             description="A", readout_format="+.2f")
        self.epsilon_low = widgets.FloatSlider(value=epsilon_low, min=0.0, max=0.5, step=0.01,
                                               description="eps_low", readout_format=".2f")
        self.epsilon_high = widgets.FloatSlider(value=epsilon_high, min=0.0, max=0.5, step=0.01,
                                                description="eps_high", readout_format=".2f")
        self.table = widgets.HTML()
        self.notes = widgets.HTML()
        self.plot = Plot(8.0, 3.0, ncols=2)
        self._artists = None
        self._observe(self.advantage, self.epsilon_low, self.epsilon_high)
        self.widget = self._assemble(
            widgets.HBox([self.advantage, self.epsilon_low, self.epsilon_high]),
            self.plot.image, self.notes, self.table)
        self.update()

    def compute(self) -> ClippingState:
        return compute_state(snap(self.advantage.value), snap(self.epsilon_low.value),
                             snap(self.epsilon_high.value))

    def show(self, state: ClippingState) -> None:
        tokens = state.tokens
        rows = [[label, cell(tokens.ratio[k], "ratio"), cell(tokens.objective[k], "objective"),
                 cell(tokens.gradient[k], "gradient"), "clipped" if tokens.clipped[k] else "-"]
                for k, label in enumerate(state.token_labels)]
        self.table.value = table("grpo-clipping-table",
                                 ["token", "rho", "objective", "d obj / d rho", "clipped"], rows)
        self.notes.value = notes_html("grpo-clipping-notes", list(state.notes))
        self._draw(state)

    def _draw(self, state: ClippingState) -> None:
        objective_ax, gradient_ax = self.plot.axes
        if self._artists is None:
            artists = {}
            artists["guides"] = []
            for ax, title in ((objective_ax, "objective min(rho A, clip(rho) A)"),
                              (gradient_ax, "d objective / d rho")):
                artists["guides"] += [ax.axhline(0.0, color="black", linewidth=0.8),
                                      ax.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")]
                ax.set_xlim(*RATIO_RANGE)
                ax.set_ylim(-2.6 if ax is gradient_ax else -5.2, 2.6 if ax is gradient_ax else 5.2)
                ax.set_xlabel("rho = pi / pi_old")
                ax.set_title(title, fontsize=10)
            artists["unclipped"], = objective_ax.plot(GRID, GRID, color="grey", linestyle="--",
                                                      linewidth=1, label="rho A")
            artists["objective"], = objective_ax.plot(GRID, GRID, color="#08519c", linewidth=2,
                                                      label="objective")
            artists["gradient"], = gradient_ax.plot(GRID, GRID, color="#a50f15", linewidth=2)
            artists["tokens"] = objective_ax.scatter(GRID[:9], GRID[:9], zorder=3, s=25,
                                                     edgecolors="black", linewidths=0.5,
                                                     label="chapter 1's tokens")
            artists["token_gradients"] = gradient_ax.scatter(GRID[:9], GRID[:9], zorder=3, s=25,
                                                             edgecolors="black", linewidths=0.5)
            artists["spans"] = [ax.axvspan(0.0, 1.0, color="#fdd0a2", alpha=0.6, zorder=0)
                                for ax in self.plot.axes]
            artists["legend"] = objective_ax.legend(loc="upper left", fontsize=7)
            self.plot.figure.tight_layout()
            self._artists = artists
        artists = self._artists
        curve, tokens = state.curve, state.tokens
        artists["unclipped"].set_ydata(curve.ratio * state.advantage)
        artists["objective"].set_ydata(curve.objective)
        artists["gradient"].set_ydata(curve.gradient)
        colours = np.where(tokens.clipped, "#fb6a4a", "#6baed6")
        for name, values in (("tokens", tokens.objective), ("token_gradients", tokens.gradient)):
            artists[name].set_offsets(np.column_stack([tokens.ratio, values]))
            artists[name].set_facecolors(colours)
        for span in artists["spans"]:
            if state.no_gradient is None:
                span.set_visible(False)
            else:
                low, high = state.no_gradient
                span.set_visible(True)
                span.set_x(low)
                span.set_width(min(high, RATIO_RANGE[1]) - low)
        # Drawn in this order over the background: the shading first, then the axes lines
        # and the legend it would otherwise cover, then the curves and the tokens.
        self.plot.render([*artists["spans"], *artists["guides"], artists["unclipped"],
                          artists["objective"], artists["gradient"], artists["tokens"],
                          artists["token_gradients"], artists["legend"]])

    def describe(self) -> str:
        s = self.state
        return f"A = {fmt(s.advantage, 2)}, eps_low = {s.epsilon_low:.2f}, eps_high = {s.epsilon_high:.2f}"

    def report(self) -> str:
        s = self.state
        lines = [self.describe()]
        lines.append("token    rho      objective  d obj/d rho  clipped")
        for k, label in enumerate(s.token_labels):
            lines.append(f"{label:<7} {s.tokens.ratio[k]:.4f}   {fmt(s.tokens.objective[k])}    "
                         f"{fmt(s.tokens.gradient[k])}      {'yes' if s.tokens.clipped[k] else 'no'}")
        lines += [f"note: {n}" for n in s.notes]
        return "\n".join(lines)
