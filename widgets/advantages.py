"""The advantage explorer: drag the rewards of two prompts' groups, watch the
group-relative advantages of grpo_edu.algorithm.advantages.group_advantages move."""

from __future__ import annotations

from dataclasses import dataclass

import ipywidgets as widgets
import numpy as np

from grpo_edu.algorithm import reference, worked_example
from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.widgets._base import Explorer, Plot, cell, fmt, notes_html, snap, table

SCALES = (("group std (GRPO)", "group"), ("batch std", "batch"), ("none (Dr. GRPO)", "none"))
STDS = (("population (/G)", "population"), ("sample (/(G-1))", "sample"))
# Prompt 1 is chapter 1's group; prompt 2 is a prompt the policy nearly always gets
# right, whose small reward differences group scaling blows up to the same size.
DEFAULT_REWARDS = (worked_example.REWARDS, (1.0, 0.9, 1.0, 0.9))
EXTRA_REWARD = 0.0          # the reward of a response added by raising G
REWARD_RANGE = (-1.0, 1.0)
MAX_G = 8


@dataclass(frozen=True)
class AdvantageState:
    """What the explorer shows. rewards and advantages are (B = 2, G)."""

    rewards: np.ndarray            # (B, G) slider values + shift: what group_advantages got
    advantages: np.ndarray         # (B, G)
    scale: str                     # "group" | "batch" | "none"
    std: str                       # "population" | "sample"
    shift: float                   # added to every reward
    means: np.ndarray              # (B,) each group's mean reward (the baseline)
    scales: np.ndarray             # (B,) the std each group is divided by (1 for "none")
    silent: np.ndarray             # (B,) bool: all rewards equal, so all advantages are 0
    shift_change: float            # max |A(rewards + shift) - A(rewards)|
    notes: tuple[str, ...]


def compute_state(rewards, *, scale: str = "group", std: str = "population",
                  shift: float = 0.0) -> AdvantageState:
    """The explorer's numbers for slider rewards (B, G): grpo_edu does the maths."""
    base = np.asarray(rewards, dtype=np.float64)
    shifted = base + shift
    advantages = group_advantages(shifted, scale=scale, std=std)
    unshifted = group_advantages(base, scale=scale, std=std)
    B, G = shifted.shape
    means = np.array([shifted[b].mean() for b in range(B)])
    if scale == "group":
        scales = np.array([reference.group_std(shifted[b], std) for b in range(B)])
    elif scale == "batch":
        scales = np.full(B, reference.group_std(shifted.reshape(-1), std))
    else:
        scales = np.ones(B)
    silent = np.array([np.all(row == row[0]) for row in shifted])
    shift_change = float(np.max(np.abs(advantages - unshifted)))

    notes = []
    for b in range(B):
        if silent[b]:
            notes.append(f"prompt {b + 1}: all {G} rewards are {fmt(shifted[b, 0], 2)}, so every "
                         f"advantage is {np.max(np.abs(advantages[b])):.4f}: this group teaches "
                         "nothing (its policy gradient is zero)")
    if shift != 0.0:
        notes.append(f"shifting every reward by {fmt(shift, 2)} changes the advantages by at "
                     f"most {shift_change:.4f}: only differences within a group matter")
    if scale == "group" and not silent.any():
        spreads = [reference.group_std(row, std) for row in shifted]
        unit = [reference.group_std(row, std) for row in advantages]
        notes.append(f"group scaling: reward stds {spreads[0]:.4f} and {spreads[1]:.4f} both "
                     f"become advantage stds {unit[0]:.4f} and {unit[1]:.4f}")
    return AdvantageState(shifted, advantages, scale, std, float(shift), means, scales, silent,
                          shift_change, tuple(notes))


class AdvantageExplorer(Explorer):
    """G reward sliders for each of two prompts; toggles for the std scaling (group,
    batch, none = Dr. GRPO) and the std (population or sample); a shift of every reward.

        explorer = AdvantageExplorer()
        explorer                                # the widget, in a notebook
        explorer.reward_sliders[0][1].value = 0.8
        explorer.state.advantages               # (2, G), from grpo_edu.algorithm.advantages
    """

    css = "grpo-advantage-explorer"

    def __init__(self, rewards=DEFAULT_REWARDS, *, scale: str = "group", std: str = "population"):
        super().__init__()
        rewards = np.asarray(rewards, dtype=np.float64)
        if rewards.ndim != 2 or rewards.shape[0] != 2 or not 2 <= rewards.shape[1] <= MAX_G:
            raise ValueError(f"rewards must have shape (2, G) with 2 <= G <= {MAX_G}, "
                             f"got {rewards.shape}")
        self.group_size = widgets.IntSlider(value=rewards.shape[1], min=2, max=MAX_G,
                                            description="G")
        self.scale = widgets.ToggleButtons(options=SCALES, value=scale, description="scale")
        self.std = widgets.ToggleButtons(options=STDS, value=std, description="std")
        self.shift = widgets.FloatSlider(value=0.0, min=-1.0, max=1.0, step=0.05,
                                         description="shift all", readout_format="+.2f")
        self.reward_sliders = [[self._reward_slider(b, i, r) for i, r in enumerate(row)]
                               for b, row in enumerate(rewards)]
        self.rows = [widgets.HBox(sliders) for sliders in self.reward_sliders]
        self.table = widgets.HTML()
        self.notes = widgets.HTML()
        self.plot = Plot(7.5, 2.8, ncols=2)
        self._bars = None
        self._observe(self.scale, self.std, self.shift)
        self.group_size.observe(self._resize, names="value")
        for sliders in self.reward_sliders:
            self._observe(*sliders)
        labels = [widgets.HTML(f"<b>prompt {b + 1}</b>", layout=widgets.Layout(width="70px"))
                  for b in range(2)]
        sliders = widgets.VBox([widgets.HBox([label, row]) for label, row in zip(labels, self.rows)])
        self.widget = self._assemble(
            widgets.HBox([self.group_size, self.shift]), self.scale, self.std,
            widgets.HBox([sliders, self.table]), self.plot.image, self.notes)
        self.update()

    def _reward_slider(self, prompt: int, response: int, value: float) -> widgets.FloatSlider:
        slider = widgets.FloatSlider(
            value=value, min=REWARD_RANGE[0], max=REWARD_RANGE[1], step=0.05,
            description=f"r{response + 1}", orientation="vertical", readout_format=".2f",
            layout=widgets.Layout(height="150px", width="60px"))
        slider.add_class(f"grpo-reward-p{prompt}-r{response}")
        return slider

    def _resize(self, change) -> None:
        """Add or remove reward sliders so each prompt has G of them."""
        G = change["new"]
        for b, sliders in enumerate(self.reward_sliders):
            while len(sliders) < G:
                slider = self._reward_slider(b, len(sliders), EXTRA_REWARD)
                self._observe(slider)
                sliders.append(slider)
            del sliders[G:]
            self.rows[b].children = tuple(sliders)
        self._bars = None
        self.update()

    def rewards(self) -> np.ndarray:
        """The slider values, (2, G)."""
        return np.array([[snap(s.value) for s in sliders] for sliders in self.reward_sliders])

    def compute(self) -> AdvantageState:
        return compute_state(self.rewards(), scale=self.scale.value, std=self.std.value,
                             shift=snap(self.shift.value))

    def show(self, state: AdvantageState) -> None:
        B, G = state.rewards.shape
        rows = []
        for b in range(B):
            for i in range(G):
                rows.append([f"{b + 1}", f"o{i + 1}",
                             cell(state.rewards[b, i], "reward", 2, prompt=b, response=i),
                             cell(state.advantages[b, i], "advantage", prompt=b, response=i),
                             cell(state.means[b], "mean") if i == 0 else "",
                             cell(state.scales[b], "scale") if i == 0 else ""])
        self.table.value = table("grpo-advantage-table",
                                 ["prompt", "resp", "reward", "advantage", "mean", "std used"], rows)
        self.notes.value = notes_html("grpo-advantage-notes", list(state.notes))
        self._draw(state)

    def _draw(self, state: AdvantageState) -> None:
        B, G = state.rewards.shape
        x = np.arange(G)
        if self._bars is None:          # new G: new bars, new background
            self._bars = []
            for b, ax in enumerate(self.plot.axes):
                ax.clear()
                rewards = ax.bar(x - 0.2, state.rewards[b], 0.4, color="#9ecae1", label="reward")
                advantages = ax.bar(x + 0.2, state.advantages[b], 0.4, color="#08519c",
                                    label="advantage")
                status = ax.text(0.5, 0.04, "", transform=ax.transAxes, ha="center",
                                 color="#a50f15", fontsize=9)
                ax.axhline(0.0, color="black", linewidth=0.8)
                ax.set_xticks(x, [f"o{i + 1}" for i in range(G)])
                ax.set_ylim(-3.0, 3.0)
                ax.set_title(f"prompt {b + 1}", fontsize=10)
                self._bars.append((rewards, advantages, status))
            self.plot.axes[0].legend(loc="upper right", fontsize=8)
            self.plot.figure.tight_layout()
            self.plot.invalidate()
        animated = []
        for b, (rewards, advantages, status) in enumerate(self._bars):
            for bar, value in zip(rewards, state.rewards[b]):
                bar.set_height(value)
            for bar, value in zip(advantages, state.advantages[b]):
                bar.set_height(value)
            status.set_text("all rewards equal: teaches nothing" if state.silent[b] else "")
            animated += [*rewards, *advantages, status]
        self.plot.render(animated, layout=G)

    def describe(self) -> str:
        G = self.state.rewards.shape[1]
        return f"B = 2 prompts, G = {G}, scale={self.state.scale!r}, std={self.state.std!r}"

    def report(self) -> str:
        state = self.state
        lines = [f"scale={state.scale!r}, std={state.std!r}, shift={fmt(state.shift, 2)}"]
        for b in range(state.rewards.shape[0]):
            rewards = ", ".join(fmt(r, 2) for r in state.rewards[b])
            advantages = ", ".join(fmt(a) for a in state.advantages[b])
            lines.append(f"prompt {b + 1}: rewards [{rewards}]  mean {fmt(state.means[b])}  "
                         f"std used {state.scales[b]:.4f}")
            lines.append(f"          advantages [{advantages}]")
        lines += [f"note: {n}" for n in state.notes]
        return "\n".join(lines)
