"""The book's schematic pictures, drawn in code so that they are rebuilt with their chapter.

One function per idea; each returns a matplotlib Figure (a notebook shows it). Where a
picture shows numbers (advantages, a mask, a weight), they are computed here by the library,
never typed in.

    grpo_ladder        chapter 0: from REINFORCE to GRPO, one change at a time
    ppo_vs_grpo        chapter 0: the models PPO runs beside the policy, and what GRPO keeps
    group_advantages   chapter 1: one prompt, G completions, their rewards and advantages
    clip_regions       chapter 2: where PPO's clipped objective stops the gradient
    bgs_tensor         chapter 3: the (B, G, S) tensor: prompt, completion and padding, the mask
    token_weights      chapter 4: what one token weighs under each loss aggregation
    reward_paths       chapter 5: one completion, an outcome reward and a reward per step
    grpo_loop          chapter 6: the training loop, one rollout per step
    failure_lab        chapter 7: one knob changed, the run, the doctor's reading
    dapo_toolbox       chapter 8: where each of DAPO's settings, and two others, acts in a step
    three_formats      chapter 9: one digit-sum problem answered three ways, and the bases' mixtures
    groups_to_ranks    chapter 10: whole groups dealt out to ranks
    one_gpu            chapter 11: the trainer and the sampler on one GPU, the weight sync
    rollouts_in_flight chapter 12: the sampler k rollouts ahead of the trainer
    episode_writers    chapter 13: who wrote each token of an episode, and the loss mask
    runbook_path       chapter 14: from an empty GPU machine to a trained model, step by step
"""

from __future__ import annotations

import numpy as np

POLICY, ENV, PROMPT, PAD, OFF = "#4a6fa5", "#e39b3b", "#9aa5b1", "#f1f1f1", "#ffffff"
GOOD, BAD = "#3c8d5a", "#c2493d"


def _figure(width: float, height: float):
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(width, height))
    axes.axis("off")
    return figure, axes


def _box(axes, x, y, w, h, text, color=POLICY, fill=0.15, size=9, weight="normal"):
    from matplotlib.colors import to_rgba
    from matplotlib.patches import FancyBboxPatch

    axes.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.02",
                                  facecolor=to_rgba(color, fill), edgecolor=color))
    axes.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=size, weight=weight)


def _arrow(axes, start, end, text="", bend=0.0, color="#555555"):
    axes.annotate("", xy=end, xytext=start,
                  arrowprops=dict(arrowstyle="->", color=color, lw=1.2, connectionstyle=f"arc3,rad={bend}"))
    if text:
        axes.text((start[0] + end[0]) / 2, (start[1] + end[1]) / 2 + 0.12, text, ha="center",
                  va="bottom", fontsize=8, color=color)


def _done(figure, axes=None, xlim=None, ylim=None):
    """Lay the figure out and hand it back closed: a notebook shows the returned figure once
    (pyplot's own end-of-cell display would show an open one a second time)."""
    import matplotlib.pyplot as plt

    if axes is not None:
        axes.set_xlim(*xlim)
        axes.set_ylim(*ylim)
    figure.tight_layout()
    plt.close(figure)
    return figure


# ----------------------------------------------------------------------------- chapter 0

def grpo_ladder():
    """Four steps from REINFORCE to GRPO, each one change to the last."""
    figure, axes = _figure(10, 2.2)
    steps = [("REINFORCE", "push up each sample\nby its reward $r$"),
             ("+ a baseline", "by $r - b$:\nsame mean, less variance"),
             ("+ the group", "$b$ = the mean of $G$ samples\nof the same prompt"),
             ("GRPO", "÷ the group's std,\n+ PPO's clip, + a KL term")]
    for i, (title, text) in enumerate(steps):
        _box(axes, i * 2.6, 0, 2.2, 1.5, "", fill=0.1 if i < 3 else 0.3)
        axes.text(i * 2.6 + 1.1, 1.15, title, ha="center", va="center", fontsize=10, weight="bold")
        axes.text(i * 2.6 + 1.1, 0.55, text, ha="center", va="center", fontsize=8.5)
        if i:
            _arrow(axes, (i * 2.6 - 0.38, 0.75), (i * 2.6 - 0.02, 0.75))
    return _done(figure, axes, (-0.1, 10.3), (-0.1, 1.7))


# (name, what it is, trained, a network) for ppo_vs_grpo: the parts each method runs in a step.
# PPO for language models as in InstructGPT (Ouyang et al., 2022); GRPO as DeepSeekMath
# (Shao et al., 2024) introduced it, with DeepSeek-R1's rule rewards (DeepSeek-AI, 2025).
PARTS = {
    "PPO": [("policy", "the model trained", True, True),
            ("critic", "the value model: as large\nas the policy, also trained", True, True),
            ("reward model", "a learned scorer,\nfrozen", False, True),
            ("reference", "the frozen start,\nfor the KL term", False, True)],
    "GRPO": [("policy", "the model trained", True, True),
             ("the group", "G completions per prompt:\ntheir mean is the baseline", False, False),
             ("rule reward", "a function that checks\nthe answer: no model", False, False),
             ("reference", "optional: the frozen\nstart, for the KL term", False, True)],
}


def ppo_vs_grpo(parts=PARTS):
    """What each method runs beside the policy, side by side: PPO's critic, reward model and
    reference against GRPO's group, rule reward and optional reference. Blue: a trained
    network; grey: a frozen one; green: no network at all; dashed: optional."""
    figure, axes = _figure(10, 3.6)
    for column, (method, items) in enumerate(parts.items()):
        x0 = column * 5.2
        networks = [text for _, text, _, network in items if network]
        optional = sum(text.startswith("optional") for text in networks)
        trained = sum(is_trained for _, _, is_trained, _ in items)
        title = (f"{method}: {len(networks) - optional} networks" if not optional else
                 f"{method}: {len(networks) - optional} network + {optional} optional")
        axes.text(x0 + 2.3, 3.05, f"{title}, {trained} trained", ha="center", fontsize=10.5, weight="bold")
        for i, (name, text, is_trained, network) in enumerate(items):
            x, y = x0 + (i % 2) * 2.4, 1.55 - (i // 2) * 1.45
            color = POLICY if is_trained else PROMPT if network else GOOD
            _box(axes, x, y, 2.15, 1.15, "", color=color, fill=0.3 if network else 0.08)
            if text.startswith("optional"):
                axes.patches[-1].set_linestyle("--")
            axes.text(x + 1.075, y + 0.85, name, ha="center", va="center", fontsize=9.5, weight="bold")
            axes.text(x + 1.075, y + 0.38, text, ha="center", va="center", fontsize=7.8)
    axes.plot([4.95, 4.95], [0.0, 3.2], color="#cccccc", lw=1)
    axes.text(5.0, -0.3, "blue: a trained network    grey: a frozen network    green: no network    "
              "dashed: optional", ha="center", va="center", fontsize=8, color="#555555")
    return _done(figure, axes, (-0.1, 10.1), (-0.5, 3.3))


# ----------------------------------------------------------------------------- chapter 1

def group_advantages(rewards=(1.0, 0.0, 0.0, 1.0), prompt="q"):
    """One prompt, G completions with their rewards, and each completion's advantage
    (group mean and std, as grpo_edu.algorithm.advantages.group_advantages computes them)."""
    from grpo_edu.algorithm.advantages import group_advantages as advantages

    rewards = np.asarray(rewards, dtype=np.float64)
    values = np.asarray(advantages(rewards[None, :])[0], dtype=np.float64)
    G = len(rewards)
    figure, axes = _figure(9, 3.2)
    _box(axes, 0, 1.3, 1.4, 0.8, f"prompt ${prompt}$", color=PROMPT, fill=0.3)
    for i, (r, a) in enumerate(zip(rewards, values)):
        y = 3.0 - i * (3.4 / max(G - 1, 1)) - 0.1
        _arrow(axes, (1.45, 1.7), (2.35, y + 0.3))
        _box(axes, 2.4, y, 1.8, 0.6, f"$o_{i + 1}$", size=10)
        axes.text(4.5, y + 0.3, f"$r_{i + 1}$ = {r:g}", va="center", fontsize=10)
        color = GOOD if a > 0 else BAD if a < 0 else "#777777"
        axes.barh(y + 0.3, a, left=8.0, height=0.4, color=color)
        axes.text(8.0 + a + (0.08 if a >= 0 else -0.08), y + 0.3, f"$A_{i + 1}$ = {a:+.3f}", va="center",
                  ha="left" if a >= 0 else "right", fontsize=10)
    axes.plot([8.0, 8.0], [-0.4, 3.4], color="#999999", lw=0.8)
    axes.text(8.0, -0.75, f"mean = {rewards.mean():g}: above it pushed up, below it pushed down",
              ha="center", fontsize=8.5, color="#555555")
    return _done(figure, axes, (-0.1, 11.0), (-1.0, 3.7))


# ----------------------------------------------------------------------------- chapter 2

def clip_regions(epsilon_low=0.2, epsilon_high=0.2):
    """PPO's clipped objective against the ratio, for A > 0 and A < 0: where it is flat, the
    gradient is zero (the token is clipped)."""
    import matplotlib.pyplot as plt

    ratio = np.linspace(0.4, 1.8, 281)
    figure, panels = plt.subplots(1, 2, figsize=(9, 3), sharey=False)
    for axes, advantage in zip(panels, (1.0, -1.0)):
        clipped = np.clip(ratio, 1 - epsilon_low, 1 + epsilon_high)
        objective = np.minimum(ratio * advantage, clipped * advantage)
        flat = np.isclose(np.gradient(objective, ratio), 0.0, atol=1e-9)
        axes.plot(ratio, objective, color=POLICY, lw=2)
        axes.fill_between(ratio, objective.min() - 0.1, objective.max() + 0.1, where=flat,
                          color=BAD, alpha=0.12, label="clipped: no gradient")
        for edge in (1 - epsilon_low, 1 + epsilon_high):
            axes.axvline(edge, color="#999999", lw=0.8, ls="--")
        axes.set_title(f"A {'>' if advantage > 0 else '<'} 0", fontsize=10)
        axes.set_xlabel(r"ratio $\rho = \pi_\theta / \pi_{old}$")
        axes.set_ylabel(r"$\min(\rho A, \mathrm{clip}(\rho) A)$")
        axes.legend(loc="upper left" if advantage > 0 else "lower left", fontsize=8, frameon=False)
    return _done(figure)


# ----------------------------------------------------------------------------- chapter 3

def bgs_tensor(prompt_lengths=(3, 5), completion_lengths=((4, 6, 2), (5, 3, 1))):
    """B prompts x G completions x T = P + S columns: P prompt columns (left-padded), S completion
    columns (right-padded), the seam between them, and the completion mask, which is defined on
    the S completion columns only and keeps only completion tokens in the loss."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    B, G = len(prompt_lengths), len(completion_lengths[0])
    P, S = max(prompt_lengths), max(max(c) for c in completion_lengths)
    T = P + S
    figure, axes = plt.subplots(figsize=(9, 0.42 * B * G + 1.9))
    rows = 0
    for b in range(B):
        for g in range(G):
            p, c = prompt_lengths[b], completion_lengths[b][g]
            pad_left = P - p                            # prompts padded on the left
            for s in range(T):
                if s < P:                               # prompt columns: no completion mask here
                    color, mark = (PAD if s < pad_left else PROMPT), ""
                else:
                    color, mark = (POLICY, "1") if s < P + c else (PAD, "0")
                axes.add_patch(plt.Rectangle((s, -rows), 0.95, 0.9, color=color))
                if mark:
                    axes.text(s + 0.47, -rows + 0.45, mark, ha="center", va="center", fontsize=7,
                              color="white" if mark == "1" else "#777777")
            axes.text(-0.3, -rows + 0.45, f"b={b}, g={g}", ha="right", va="center", fontsize=8)
            rows += 1
        rows += 0.4
    seam = P - 0.025
    axes.plot([seam, seam], [-rows + 0.3, 1.4], color=BAD, lw=1.5, ls="--")
    axes.text(seam, -rows + 0.15, "the seam: every completion starts at column P", ha="center", va="top",
              fontsize=8, color=BAD)
    axes.text(P / 2, 1.05, f"P = {P} prompt columns", ha="center", fontsize=9)
    axes.text(P + S / 2, 1.05, f"S = {S} completion columns", ha="center", fontsize=9)
    axes.text(T / 2, 1.65, f"T = P + S = {T} columns; the completion mask is defined on the S columns only",
              ha="center", fontsize=9)
    axes.set_xlim(-2.2, T + 0.2)
    axes.set_ylim(-rows - 0.35, 2.0)
    axes.axis("off")
    axes.legend(handles=[Patch(color=PROMPT, label="prompt"), Patch(color=POLICY, label="completion (mask 1)"),
                         Patch(color=PAD, label="padding (mask 0)")],
                loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize=8, frameon=False)
    return _done(figure)


# ----------------------------------------------------------------------------- chapter 4

def token_weights(lengths=(4, 12), loss_types=("grpo", "bnpo", "dr_grpo", "dapo"), max_completion_length=16):
    """What one token of each completion weighs in the loss, under each aggregation (the
    weights grpo_edu.algorithm.aggregation computes, one group of these lengths)."""
    import torch

    from grpo_edu.algorithm.aggregation import aggregation_weights

    S = max(lengths)
    mask = torch.zeros(1, len(lengths), S)
    for i, n in enumerate(lengths):
        mask[0, i, :n] = 1
    figure, axes = _figure(9, 0.9 * len(loss_types) + 0.8)
    for row, loss_type in enumerate(loss_types):
        weights = aggregation_weights(mask, loss_type, max_completion_length=max_completion_length)
        y = -row * 0.9
        axes.text(-0.4, y - 0.1, loss_type, ha="right", va="center", fontsize=9, family="monospace")
        x = 0.0
        for i, n in enumerate(lengths):
            w = float(weights[0, i, 0])
            for _ in range(n):
                axes.add_patch(_rect(x, y - 0.35, 0.9, 0.5, POLICY, min(1.0, 0.15 + w * 8)))
                x += 1
            axes.text(x - n / 2 - 0.05, y + 0.28, f"{n} tokens: {w:.3f} each", ha="center", fontsize=7.5)
            x += 1
    axes.text(sum(lengths) / 2, 0.75, "one token's share of the loss (darker: more)", ha="center", fontsize=9)
    return _done(figure, axes, (-2.6, sum(lengths) + len(lengths) + 0.5), (-0.9 * len(loss_types) + 0.3, 1.0))


def _rect(x, y, w, h, color, alpha):
    from matplotlib.colors import to_rgba
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, h, facecolor=to_rgba(color, alpha), edgecolor="white")


# ----------------------------------------------------------------------------- chapter 5

def reward_paths():
    """One completion, scored two ways: one outcome reward for the whole, or a reward per step."""
    figure, axes = _figure(9.5, 2.8)
    steps = ["step 1", "step 2", "step 3", "answer"]
    for i, name in enumerate(steps):
        _box(axes, 1.5 + i * 1.6, 1.1, 1.4, 0.6, name, size=9)
    axes.text(0.7, 1.4, "completion", ha="center", va="center", fontsize=9)
    _box(axes, 1.5, 2.2, 6.2, 0.5, "outcome: one reward for the whole completion (right or wrong)",
         color=GOOD, size=8.5)
    for i in range(4):
        _box(axes, 1.55 + i * 1.6, 0.1, 1.3, 0.5, f"$r^{{({i + 1})}}$", color=ENV, size=9)
        _arrow(axes, (2.2 + i * 1.6, 1.05), (2.2 + i * 1.6, 0.65))
    axes.text(8.1, 0.35, "process: a reward\nper step", va="center", fontsize=8.5)
    return _done(figure, axes, (0, 9.6), (0, 2.9))


# ----------------------------------------------------------------------------- chapter 6

def grpo_loop():
    """The training loop: one rollout per step, scored, turned into advantages, one update."""
    figure, axes = _figure(9, 3.4)
    stages = [("prompts", "B problems"), ("roll out", "G completions each"), ("score", "rewards $r_i$"),
              ("advantages", "$A_i$ within\neach group"), ("update", "the clipped loss,\none optimizer step")]
    centres = [(1.0, 2.3), (3.6, 2.3), (6.2, 2.3), (6.2, 0.4), (3.6, 0.4)]
    for (title, text), (x, y) in zip(stages, centres):
        _box(axes, x - 1.0, y - 0.5, 2.0, 1.0, "", fill=0.12)
        axes.text(x, y + 0.2, title, ha="center", fontsize=10, weight="bold")
        axes.text(x, y - 0.22, text, ha="center", va="center", fontsize=8)
    for (a, b) in [(0, 1), (1, 2), (2, 3), (3, 4)]:
        (x0, y0), (x1, y1) = centres[a], centres[b]
        if y0 == y1:
            start, end = ((x0 + 1.0, y0), (x1 - 1.0, y1)) if x1 > x0 else ((x0 - 1.0, y0), (x1 + 1.0, y1))
        else:
            start, end = (x0, y0 - 0.5), (x1, y1 + 0.5)
        _arrow(axes, start, end)
    _arrow(axes, (2.6, 0.4), (1.0, 1.8), "next step", bend=-0.3)
    _box(axes, 8.0, 1.1, 1.6, 0.8, "every N steps:\nheld-out accuracy", color=GOOD, size=8)
    return _done(figure, axes, (-0.1, 9.8), (-0.3, 3.0))


# ----------------------------------------------------------------------------- chapter 7

def failure_lab():
    """The failure lab: a healthy run, one knob changed, the metrics, the doctor's reading."""
    figure, axes = _figure(10, 1.9)
    stages = [("healthy config", PROMPT), ("one knob changed", BAD), ("the run", POLICY),
              ("metrics.jsonl", POLICY), ("doctor: symptom\n+ evidence", GOOD)]
    for i, (text, color) in enumerate(stages):
        _box(axes, i * 2.05, 0.2, 1.75, 0.9, text, color=color, size=8.5)
        if i:
            _arrow(axes, (i * 2.05 - 0.28, 0.65), (i * 2.05 - 0.02, 0.65))
    return _done(figure, axes, (-0.1, 10.2), (0, 1.4))


# ----------------------------------------------------------------------------- chapter 8

# (stage, what it makes, [(config key, what it does there)]) for dapo_toolbox; a test holds each
# key to grpo_edu.config.TrainConfig.
TOOLBOX = [
    ("roll out", "G completions\nper prompt", [("dynamic_sampling_rounds", "refill groups whose\nrewards are all equal")]),
    ("score", "rewards $r_i$", [("overlong_cache", "a penalty for the last\nc tokens before the limit")]),
    ("advantages", "$A_i$ within\neach group", []),
    ("loss", "over the\ncompletion tokens", [("mask_truncated_completions", "leave cut completions\nout of the loss"),
                                               ("top_entropy_quantile", "train only the\nuncertain tokens"),
                                               ("ref_sync_steps", "move the reference\nthe KL pulls toward")]),
]


def dapo_toolbox(stages=TOOLBOX):
    """One GRPO step as four stages in a row, and under each the settings of chapter 8 that act
    there, by their config key: where in the step each assumption enters."""
    figure, axes = _figure(10, 3.9)
    width = 2.2
    for i, (title, made, knobs) in enumerate(stages):
        x = i * 2.6
        _box(axes, x, 2.9, width, 0.9, "", fill=0.12)
        axes.text(x + width / 2, 3.52, title, ha="center", fontsize=10, weight="bold")
        axes.text(x + width / 2, 3.12, made, ha="center", va="center", fontsize=8)
        if i:
            _arrow(axes, (x - 0.38, 3.35), (x - 0.02, 3.35))
        for k, (key, does) in enumerate(knobs):
            y = 1.85 - k * 0.92
            _box(axes, x, y, width, 0.78, "", color=ENV, fill=0.12)
            axes.text(x + width / 2, y + 0.58, key, ha="center", fontsize=7.5, family="monospace")
            axes.text(x + width / 2, y + 0.25, does, ha="center", va="center", fontsize=7.5)
            if k == 0:
                _arrow(axes, (x + width / 2, y + 0.8), (x + width / 2, 2.88), color=ENV)
    return _done(figure, axes, (-0.1, 2.6 * (len(stages) - 1) + width + 0.1), (-0.1, 3.9))


# ----------------------------------------------------------------------------- chapter 9

BASES = (("digitsum-start", "direct=0.5,worked=0.4,check=0.1", 0),
         ("digitsum-no-check", "direct=0.5,worked=0.5", 0),
         ("digitsum-no-top-worked", "direct=0.5,worked=0.4,check=0.1", 11))


def three_formats(digits=(3, 8, 5, 1, 9), bases=BASES, seed=1):
    """One digit-sum problem answered in each of the three formats (the library writes them),
    and each base's pretraining mixture: the share of each format it was taught."""
    import random

    from grpo_edu.environment.digitsum import FORMATS, Mixture, check_completion, digitsum_sample, read_format

    sample = digitsum_sample(digits)
    texts = {"direct": sample["direct_solution"], "worked": sample["solution"],
             "check": check_completion(digits, random.Random(seed))}
    assert [read_format(texts[name]) for name in FORMATS] == list(FORMATS)
    colors = {"direct": PROMPT, "worked": POLICY, "check": GOOD}
    figure, axes = _figure(10, 3.6)
    axes.text(0.1, 3.25, f"prompt  {sample['prompt']}    answer {sample['answer']}  "
              f"(the sum of the digits, mod 10)", fontsize=10, family="monospace", weight="bold")
    for row, name in enumerate(FORMATS):
        y = 2.55 - row * 0.62
        _box(axes, 0.1, y, 1.1, 0.45, name, color=colors[name], size=9)
        axes.text(1.35, y + 0.22, texts[name], fontsize=9.5, family="monospace", va="center")
    axes.text(0.1, 0.35, "a step, as in b81: the letter b, the digit it reads (8), the running value (1)\n"
              "a check, as in c51!c56: a wrong value, flagged with !, then the step redone", fontsize=8.5,
              va="center", color="#555555")
    axes.text(6.3, 2.95, "what each base was taught", fontsize=9.5, weight="bold")
    for column, (name, text, worked_max_depth) in enumerate(bases):
        mixture = Mixture.parse(text, worked_max_depth=worked_max_depth)
        x, bottom = 6.3 + column * 1.25, 0.55
        for name_of_format in FORMATS:
            height = 2.3 * getattr(mixture, name_of_format)
            if height:
                axes.add_patch(_rect(x, bottom, 0.9, height, colors[name_of_format], 0.55))
                axes.text(x + 0.45, bottom + height / 2, f"{getattr(mixture, name_of_format):.0%}",
                          ha="center", va="center", fontsize=8)
            bottom += height
        label = name.replace("digitsum-", "") + ("\n(depth 12: direct\nonly)" if worked_max_depth else "")
        axes.text(x + 0.45, 0.45, label, ha="center", va="top", fontsize=8)
    return _done(figure, axes, (0, 10.2), (-0.35, 3.5))


# ----------------------------------------------------------------------------- chapter 10

def groups_to_ranks(groups=4, G=4, ranks=2):
    """Whole groups dealt out to ranks: every rank holds complete groups, so each group's mean
    and std are computed where its rewards are."""
    figure, axes = _figure(9, 0.55 * groups + 1.2)
    colors = ["#4a6fa5", "#e39b3b", "#3c8d5a", "#8e5ea2", "#c2493d", "#6b8e23"]
    per_rank = groups // ranks
    for g in range(groups):
        color = colors[g % len(colors)]
        for i in range(G):
            axes.add_patch(_rect(i * 0.7, -g * 0.55, 0.6, 0.42, color, 0.7))
        axes.text(-0.2, -g * 0.55 + 0.2, f"group {g}", ha="right", va="center", fontsize=8)
        rank = g // per_rank
        x0 = 5.5 + rank * 2.4
        slot = g % per_rank
        for i in range(G):
            axes.add_patch(_rect(x0 + i * 0.45, -slot * 0.55 - 0.2, 0.4, 0.42, color, 0.7))
        _arrow(axes, (G * 0.7 + 0.05, -g * 0.55 + 0.2), (x0 - 0.1, -slot * 0.55), bend=0.0, color="#bbbbbb")
    for rank in range(ranks):
        x0 = 5.5 + rank * 2.4
        axes.text(x0 + G * 0.45 / 2, 0.55, f"rank {rank}", ha="center", fontsize=9, weight="bold")
    axes.text(G * 0.35, 0.55, f"{groups} groups of G = {G}", ha="center", fontsize=9, weight="bold")
    return _done(figure, axes, (-1.4, 5.5 + ranks * 2.4), (-groups * 0.55 + 0.1, 0.9))


# ----------------------------------------------------------------------------- chapter 11

def one_gpu():
    """One GPU shared by the trainer and the sampler (vLLM): memory for each, the weight sync
    after every update, the sampler asleep while the trainer works."""
    figure, axes = _figure(9, 2.8)
    _box(axes, 0, 0, 9, 2.4, "", color="#777777", fill=0.04)
    axes.text(0.15, 2.2, "one GPU", fontsize=9, weight="bold", va="center")
    _box(axes, 0.3, 0.3, 3.6, 1.5, "trainer\npolicy weights, gradients,\noptimizer state, activations",
         color=POLICY, size=8.5)
    _box(axes, 5.1, 0.3, 3.6, 1.5, "sampler (vLLM)\na copy of the weights,\nthe KV cache", color=ENV, size=8.5)
    _arrow(axes, (3.95, 1.3), (5.05, 1.3), "weights after each update")
    _arrow(axes, (5.05, 0.7), (3.95, 0.7), "completions + log-probs")
    return _done(figure, axes, (-0.1, 9.1), (-0.1, 2.5))


# ----------------------------------------------------------------------------- chapter 12

def rollouts_in_flight(k=2, steps=6):
    """The sampler runs k rollouts ahead: update n trains on the rollout sampled with the
    weights of update n - k."""
    figure, axes = _figure(9.5, 2.2)
    for n in range(steps):
        _box(axes, n * 1.5, 1.1, 1.3, 0.55, f"rollout {n}", color=ENV, size=8)
        if n >= k:
            _box(axes, n * 1.5, 0.1, 1.3, 0.55, f"update {n}:\nrollout {n - k}", color=POLICY, size=8)
            _arrow(axes, ((n - k) * 1.5 + 1.2, 1.08), (n * 1.5 + 0.3, 0.68), color="#999999")
    axes.text(-0.2, 1.37, "sampler", ha="right", va="center", fontsize=9)
    axes.text(-0.2, 0.37, "trainer", ha="right", va="center", fontsize=9)
    axes.text(steps * 0.75, 1.9, f"k = {k}: each update trains on a rollout {k} updates old",
              ha="center", fontsize=9)
    return _done(figure, axes, (-1.5, steps * 1.5), (0, 2.1))


# ----------------------------------------------------------------------------- chapter 13

def episode_writers(segments=(("prompt", "47*85=", PROMPT), ("policy", "<think>[47*85]", POLICY),
                              ("calculator", "=3995", ENV), ("policy", "</think>\\boxed{3995}", POLICY))):
    """One multi-turn episode: who wrote each span, and the loss mask, which keeps only the
    policy's own tokens."""
    figure, axes = _figure(10, 1.9)
    x = 0.0
    for writer, text, color in segments:
        width = 0.14 * len(text) + 0.4
        axes.add_patch(_rect(x, 0.8, width, 0.6, color, 0.8))
        axes.text(x + width / 2, 1.1, text, ha="center", va="center", fontsize=8.5, family="monospace",
                  color="white")
        axes.text(x + width / 2, 1.55, writer, ha="center", fontsize=8)
        mask = "1" if writer == "policy" else "0"
        axes.add_patch(_rect(x, 0.1, width, 0.45, GOOD if mask == "1" else "#bbbbbb", 0.35))
        axes.text(x + width / 2, 0.33, f"mask {mask}", ha="center", va="center", fontsize=8)
        x += width + 0.1
    axes.text(-0.15, 1.1, "tokens", ha="right", va="center", fontsize=9)
    axes.text(-0.15, 0.33, "in the loss", ha="right", va="center", fontsize=9)
    return _done(figure, axes, (-1.6, x + 0.1), (0, 1.8))


# ----------------------------------------------------------------------------- chapter 14

def runbook_path(steps=(("install", "torch (CUDA build),\npip install '.[gpu]'", PROMPT),
                        ("check", "grpo-edu doctor --gpu", GOOD),
                        ("train", "grpo-edu train\n--config ...toml", POLICY),
                        ("the run directory", "sampler_init/,\ncheckpoints/, model/", ENV),
                        ("use", "grpo-edu eval RUN_DIR,\ngrpo-edu sample", GOOD))):
    """A GPU run from start to end: the install, the machine's check, the run, what it leaves on
    disk, and the commands that use the trained model."""
    figure, axes = _figure(10.5, 1.9)
    width, gap = 1.85, 0.28
    for i, (title, command, color) in enumerate(steps):
        x = i * (width + gap)
        _box(axes, x, 0.15, width, 0.95, "", color=color)
        axes.text(x + width / 2, 0.85, title, ha="center", va="center", fontsize=9, weight="bold")
        axes.text(x + width / 2, 0.45, command, ha="center", va="center", fontsize=7.5, family="monospace")
        if i:
            _arrow(axes, (x - gap + 0.02, 0.62), (x - 0.02, 0.62))
    right = len(steps) * (width + gap) - gap
    axes.text(right / 2, 1.35, "from an empty GPU machine to a trained model", ha="center", fontsize=9)
    return _done(figure, axes, (-0.1, right + 0.1), (0, 1.6))
