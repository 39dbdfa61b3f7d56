"""The length-bias explorer: how much one token of a response counts in the loss, against
the response's length, under the grpo, dr_grpo and dapo / bnpo aggregations."""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as widgets
import numpy as np

from grpo_edu.algorithm.estimators import response_token_weights
from grpo_edu.widgets._base import PAD, Explorer, Plot, decade_limits, notes_html, sticky_limits, table

# On one process with num_items left to its default, dapo and bnpo both divide by the
# batch's token count; the explorer computes both and shows them as one curve.
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo")
CURVES = (("grpo", "#08519c"), ("dr_grpo", "#a50f15"), ("dapo", "#31a354"))
MAX_LENGTHS = (128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class LengthBiasState:
    lengths: np.ndarray               # (G,) response lengths, shortest to longest
    max_completion_length: int
    weights: dict                     # loss_type -> (G,) weight of one token of each response
    totals: dict                      # loss_type -> (G,) weight of the whole response (L * w)
    short_to_long: dict               # loss_type -> w(shortest) / w(longest)
    notes: tuple[str, ...]


def response_lengths(group_size: int, shortest: int, longest: int) -> np.ndarray:
    """G lengths spread evenly on a log scale from shortest to longest: (G,) int."""
    return np.round(np.geomspace(shortest, longest, group_size)).astype(np.int64)


def compute_state(group_size: int = 4, shortest: int = 20, longest: int = 400,
                  max_completion_length: int = 512) -> LengthBiasState:
    lengths = response_lengths(group_size, shortest, longest)
    weights = {t: response_token_weights(lengths, t, max_completion_length=max_completion_length)
               for t in LOSS_TYPES}
    totals = {t: lengths * weights[t] for t in LOSS_TYPES}
    ratio = {t: float(weights[t][0] / weights[t][-1]) for t in LOSS_TYPES}
    notes = [
        f"grpo: a token of the {lengths[0]}-token response counts {ratio['grpo']:.2f} times as "
        f"much as a token of the {lengths[-1]}-token one; every response counts the same in total, "
        "so a long wrong answer is penalised less per token (the length bias Dr. GRPO removes)",
        f"dr_grpo: every token counts 1 / (G x {max_completion_length}) = "
        f"{weights['dr_grpo'][0]:.4e}, whatever its response's length (ratio {ratio['dr_grpo']:.4f})",
        f"dapo / bnpo: every token counts 1 / (tokens in the batch) = 1 / {int(lengths.sum())} = "
        f"{weights['dapo'][0]:.4e} (ratio {ratio['dapo']:.4f})",
    ]
    return LengthBiasState(lengths, int(max_completion_length), weights, totals, ratio, tuple(notes))


class LengthBiasExplorer(Explorer):
    """Sliders for G, the range of response lengths and max_completion_length; the weight
    of one token, and of a whole response, against its length under each loss type.

        explorer = LengthBiasExplorer()
        explorer.lengths.value = (10, 1000)
        explorer.state.weights["grpo"]     # (G,), from grpo_edu.algorithm.aggregation.aggregation_weights
    """

    css = "grpo-length-bias-explorer"

    def __init__(self, group_size: int = 4, lengths: tuple[int, int] = (20, 400),
                 max_completion_length: int = 512):
        super().__init__()
        self.group_size = widgets.IntSlider(value=group_size, min=2, max=16, description="G")
        self.max_completion_length = widgets.SelectionSlider(
            options=MAX_LENGTHS, value=max_completion_length, description="max length")
        self.lengths = widgets.IntRangeSlider(value=lengths, min=1, max=max_completion_length,
                                              description="lengths")
        self.table = widgets.HTML()
        self.notes = widgets.HTML()
        self.plot = Plot(8.0, 3.0, ncols=2)
        self._artists = None
        self._limits = [None, None, None]     # x, y of the token panel, y of the response panel
        self._observe(self.group_size, self.lengths)
        self.max_completion_length.observe(self._limit_lengths, names="value")
        self.widget = self._assemble(
            widgets.HBox([self.group_size, self.lengths, self.max_completion_length]),
            self.plot.image, self.notes, self.table)
        self.update()

    def _limit_lengths(self, change) -> None:
        # No response is longer than the generation limit: the range slider's max
        # follows it (which may clamp the range), then one update.
        with self.hold():
            self.lengths.max = change["new"]

    def compute(self) -> LengthBiasState:
        shortest, longest = self.lengths.value
        return compute_state(self.group_size.value, shortest, longest,
                             self.max_completion_length.value)

    def show(self, state: LengthBiasState) -> None:
        header = ["length"] + [f"w {t}" for t, _ in CURVES] + [f"L x w {t}" for t, _ in CURVES]
        rows = []
        for i, length in enumerate(state.lengths):
            rows.append([str(length)]
                        + [_weight_cell(state.weights[t][i], f"weight {t}", i) for t, _ in CURVES]
                        + [_weight_cell(state.totals[t][i], f"total {t}", i) for t, _ in CURVES])
        self.table.value = table("grpo-length-table", header, rows)
        self.notes.value = notes_html("grpo-length-notes", list(state.notes))
        self._draw(state)

    def _draw(self, state: LengthBiasState) -> None:
        token_ax, total_ax = self.plot.axes
        if self._artists is None:
            self._artists = {}
            for ax, title in ((token_ax, "weight of one token"), (total_ax, "weight of the response (L x w)")):
                ax.set_xscale("log")
                ax.set_yscale("log")
                ax.set_xlabel("response length L (tokens)")
                ax.set_title(title, fontsize=10)
            for name, colour in CURVES:
                label = "dapo / bnpo" if name == "dapo" else name
                self._artists[name] = (token_ax.plot([1], [1], "o-", color=colour, label=label)[0],
                                       total_ax.plot([1], [1], "o-", color=colour)[0])
            self._legend = token_ax.legend(loc="upper right", fontsize=8)
            self.plot.figure.tight_layout()
        animated = []
        for name, _ in CURVES:
            token_line, total_line = self._artists[name]
            token_line.set_data(state.lengths, state.weights[name])
            total_line.set_data(state.lengths, state.totals[name])
            animated += [token_line, total_line]
        # Whole decades, kept while the data fits: most slider moves then reuse the
        # cached background.
        self._limits[0] = sticky_limits(self._limits[0], state.lengths.min(),
                                        state.max_completion_length, decade_limits, slack=30.0)
        for k, (ax, values) in enumerate(((token_ax, state.weights), (total_ax, state.totals)), 1):
            ys = np.concatenate([values[t] for t, _ in CURVES])
            self._limits[k] = sticky_limits(self._limits[k], ys.min(), ys.max(), decade_limits,
                                            slack=30.0)
            ax.set_xlim(*self._limits[0])
            ax.set_ylim(*self._limits[k])
        self.plot.render([*animated, self._legend], layout=tuple(self._limits))

    def describe(self) -> str:
        s = self.state
        return (f"G = {len(s.lengths)}, lengths {s.lengths.tolist()}, "
                f"max_completion_length = {s.max_completion_length}")

    def report(self) -> str:
        s = self.state
        lines = [self.describe(),
                 "length   " + "".join(f"{'w ' + t:>13}" for t, _ in CURVES)
                 + "".join(f"{'L x w ' + t:>15}" for t, _ in CURVES)]
        for i, length in enumerate(s.lengths):
            lines.append(f"{length:>6}   " + "".join(f"{s.weights[t][i]:>13.4e}" for t, _ in CURVES)
                         + "".join(f"{s.totals[t][i]:>15.4f}" for t, _ in CURVES))
        lines += [f"note: {n}" for n in s.notes]
        return "\n".join(lines)


def _weight_cell(value: float, css: str, index: int) -> str:
    return (f'<td class="{css}" data-value="{float(value)!r}" data-response="{index}" '
            f'style="{PAD}">{value:.4e}</td>')
