"""Chapter 2's explorers without a kernel: what the static HTML edition sends to the browser.

The site builder replaces each explorer's output with a `.grpo-live` block holding
`spec(kind)` as JSON, and grpo_edu/book/static/explorers.js recomputes the explorer in
the browser from it. Every number or label the JavaScript needs from the Python explorer
(slider ranges and defaults, the toggles' options, chapter 1's token ratios, the uniforms
behind the KL explorer's samples) is read here from the widget modules and grpo_edu, so
nothing is typed twice.

`python_state(kind, config)` is the reference: the Python explorer's state, table and
notes for a config, in the JSON shape `GrpoExplorers.compute[kind](config, spec)` returns.
A config holds compute_state's arguments (the controls' values):

    advantage     {"rewards": [[...G], [...G]], "scale": "group", "std": "population", "shift": 0.0}
    clipping      {"advantage": 1.0, "epsilon_low": 0.2, "epsilon_high": 0.2}
    kl            {"logits": [..3], "ref_logits": [..3], "num_samples": 1000}
    length_bias   {"group_size": 4, "shortest": 20, "longest": 400, "max_completion_length": 512}
"""

from __future__ import annotations

import dataclasses
import inspect
from types import SimpleNamespace

import numpy as np

from grpo_edu import widgets
from grpo_edu.algorithm import worked_example
from grpo_edu.algorithm.advantages import group_advantages
from grpo_edu.algorithm.estimators import ClippedObjective, clipped_objective
from grpo_edu.algorithm.kl import KL_ESTIMATORS
from grpo_edu.widgets import advantages, clipping, kl, length_bias
from grpo_edu.widgets._base import snap

KINDS = {"AdvantageExplorer": "advantage", "ClippingExplorer": "clipping", "KLExplorer": "kl",
         "LengthBiasExplorer": "length_bias"}
EXPLORERS = {kind: getattr(widgets, name) for name, kind in KINDS.items()}
MODULES = {"advantage": advantages, "clipping": clipping, "kl": kl, "length_bias": length_bias}


def spec(kind: str) -> dict:
    """Everything explorers.js needs to run the explorer `kind` (JSON-serialisable)."""
    explorer = EXPLORERS[_check_kind(kind)]()
    image = explorer.plot.image.layout        # the Python figure's size: "675px"
    figure = [int(image.width.removesuffix("px")), int(image.height.removesuffix("px"))]
    return {"kind": kind, "explorer": type(explorer).__name__, "css": explorer.css, "figure": figure,
            **_SPECS[kind](explorer)}


def default_config(kind: str) -> dict:
    """The config of the explorer as chapter 2 builds it (`AdvantageExplorer()`, ...)."""
    return _config(EXPLORERS[_check_kind(kind)]())


def python_state(kind: str, config: dict) -> dict:
    """The Python explorer's state for `config` as plain JSON-like data (lists, dicts, floats;
    an open interval end is float("inf")), plus "table" and "notes_html": the HTML its
    show() writes into its table and notes widgets."""
    state = _compute(kind, config)
    page = _Page()
    EXPLORERS[kind].show(page, state)
    return {**_plain(state), "table": page.table.value, "notes_html": page.notes.value}


def live_explorer(kind: str, config: dict):
    """A live Python explorer with its controls set to `config` (slow: it draws its figure)."""
    _check_config(kind, config)
    live = EXPLORERS[kind]()
    with live.hold():
        _SET_CONTROLS[kind](live, config)
    return live


def describe(kind: str, config: dict | None = None) -> str:
    """The explorer's repr (its text/plain output in the notebook) for `config`, by default
    the default one."""
    return repr(live_explorer(kind, default_config(kind) if config is None else config))


# --------------------------------------------------------------------------- specs

def _slider(widget) -> dict:
    return {"description": widget.description, "min": widget.min, "max": widget.max,
            "step": widget.step, "value": widget.value, "readout_format": widget.readout_format}


def _selection(widget) -> dict:
    """A SelectionSlider: the browser's range input runs over the index of `options`."""
    return {"description": widget.description, "options": list(widget.options), "value": widget.value}


def _toggle(widget) -> dict:
    return {"description": widget.description, "options": [list(o) for o in widget.options],
            "value": widget.value}


def _advantage_spec(explorer) -> dict:
    reward = _slider(explorer.reward_sliders[0][0])
    del reward["value"], reward["description"]          # per slider: the rewards, "r1", "r2", ...
    return {"controls": {"G": _slider(explorer.group_size), "shift": _slider(explorer.shift),
                         "reward": reward, "scale": _toggle(explorer.scale), "std": _toggle(explorer.std)},
            "rewards": explorer.rewards().tolist(),
            "extra_reward": advantages.EXTRA_REWARD,
            "eps": _default(group_advantages, "eps")}


def _loss_ratios(ratios: np.ndarray) -> np.ndarray:
    """The ratios grpo_loss works with. clipped_objective hands it log(rho) - OFFSET and
    grpo_loss takes exp() of the difference again, which can move rho by an ulp; at the clip
    bounds that ulp decides whether a grid point is clipped. With A = 1 and a clip range
    that never binds, min(rho A, clip(rho) A) is that ratio, bit for bit. (torch's exp()
    kernel sets the last bit: under the book's pinned kernels, grpo_edu.runtime.numerics, these are
    the bits the notebook's explorer used.)"""
    return clipped_objective(ratios, 1.0, epsilon=0.999, epsilon_high=1e9).objective


def _clipping_spec(explorer) -> dict:
    ratios = worked_example.token_ratios()
    return {"controls": {name: _slider(getattr(explorer, name))
                         for name in ("advantage", "epsilon_low", "epsilon_high")},
            "ratio_range": list(clipping.RATIO_RANGE),
            "grid": clipping.GRID.tolist(), "grid_loss_ratio": _loss_ratios(clipping.GRID).tolist(),
            "token_ratio": ratios.tolist(), "token_loss_ratio": _loss_ratios(ratios).tolist(),
            "token_labels": worked_example.token_labels()}


def _kl_spec(explorer) -> dict:
    n = max(kl.SAMPLE_SIZES)
    return {"controls": {"logits": [_slider(s) for s in explorer.logit_sliders],
                         "ref_logits": [_slider(s) for s in explorer.ref_logit_sliders],
                         "samples": _selection(explorer.num_samples)},
            "estimators": list(KL_ESTIMATORS), "colours": dict(kl.COLOURS),
            "log_ratio_grid": kl.LOG_RATIO_GRID.tolist(),
            "seed": explorer.seed, "uniforms": _uniforms(explorer.seed, n).tolist()}


def _length_bias_spec(explorer) -> dict:
    return {"controls": {"G": _slider(explorer.group_size),
                         "lengths": {**_slider(explorer.lengths), "value": list(explorer.lengths.value)},
                         "max_length": _selection(explorer.max_completion_length)},
            "loss_types": list(length_bias.LOSS_TYPES), "curves": [list(c) for c in length_bias.CURVES]}


_SPECS = {"advantage": _advantage_spec, "clipping": _clipping_spec, "kl": _kl_spec,
          "length_bias": _length_bias_spec}


# --------------------------------------------------------------------------- sampling

def choice_from_uniforms(probs, uniforms) -> np.ndarray:
    """`np.random.default_rng(seed).choice(len(probs), size=n, p=probs)` from the first n
    uniforms of `default_rng(seed).random()`: numpy's Generator.choice (numpy/random/
    _generator.pyx, with replacement and p given) inverts the cumulative distribution,
    exactly as explorers.js does."""
    cdf = np.asarray(probs, dtype=np.float64).cumsum()
    cdf /= cdf[-1]
    return cdf.searchsorted(np.asarray(uniforms), side="right")


def _uniforms(seed: int, n: int) -> np.ndarray:
    """The uniforms behind the KL explorer's samples, after checking that inverting the CDF
    at them is what this numpy's choice() does (else the site would show other samples)."""
    uniforms = np.random.default_rng(seed).random(n)
    for probs in ([0.2, 0.3, 0.5], [1 / 3] * 3, [0.98, 0.015, 0.005], [0.0, 0.6, 0.4]):
        for size in (1, 97, n):
            drawn = np.random.default_rng(seed).choice(len(probs), size=size, p=probs)
            if not np.array_equal(drawn, choice_from_uniforms(probs, uniforms[:size])):
                raise RuntimeError(f"numpy {np.__version__}'s Generator.choice no longer inverts the "
                                   f"CDF at Generator.random()'s uniforms (p = {probs}); explorers.js "
                                   "would draw other samples than the Python KL explorer")
    return uniforms


# --------------------------------------------------------------------------- states

def _compute(kind: str, config: dict):
    _check_config(kind, config)
    fixed = {"seed": _default(widgets.KLExplorer, "seed")} if kind == "kl" else {}
    return MODULES[kind].compute_state(**config, **fixed)


class _Page:
    """What an explorer's show() writes to, minus the figure: the table and notes HTML."""

    def __init__(self):
        self.table = SimpleNamespace(value="")
        self.notes = SimpleNamespace(value="")

    def _draw(self, state) -> None:
        pass


def _plain(value):
    """A state as lists, dicts and Python scalars, in the shape explorers.js returns."""
    if isinstance(value, ClippedObjective):       # per token; the scalar A is in the state
        return {name: _plain(getattr(value, name)) for name in ("ratio", "objective", "gradient", "clipped")}
    if dataclasses.is_dataclass(value):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (np.ndarray, np.generic)):
        return value.tolist()
    return value


# --------------------------------------------------------------------------- configs

def _config(explorer) -> dict:
    """The config a live explorer's controls hold (what its compute() passes on)."""
    if isinstance(explorer, widgets.AdvantageExplorer):
        return {"rewards": explorer.rewards().tolist(), "scale": explorer.scale.value,
                "std": explorer.std.value, "shift": snap(explorer.shift.value)}
    if isinstance(explorer, widgets.ClippingExplorer):
        return {name: snap(getattr(explorer, name).value) for name in ("advantage", "epsilon_low", "epsilon_high")}
    if isinstance(explorer, widgets.KLExplorer):
        return {"logits": [snap(s.value) for s in explorer.logit_sliders],
                "ref_logits": [snap(s.value) for s in explorer.ref_logit_sliders],
                "num_samples": explorer.num_samples.value}
    shortest, longest = explorer.lengths.value
    return {"group_size": explorer.group_size.value, "shortest": shortest, "longest": longest,
            "max_completion_length": explorer.max_completion_length.value}


def _set_advantage(explorer, config) -> None:
    rewards = config["rewards"]
    explorer.group_size.value = len(rewards[0])
    for sliders, row in zip(explorer.reward_sliders, rewards):
        for slider, value in zip(sliders, row):
            slider.value = value
    explorer.scale.value, explorer.std.value = config["scale"], config["std"]
    explorer.shift.value = config["shift"]


def _set_clipping(explorer, config) -> None:
    for name in ("advantage", "epsilon_low", "epsilon_high"):
        getattr(explorer, name).value = config[name]


def _set_kl(explorer, config) -> None:
    for sliders, values in ((explorer.logit_sliders, config["logits"]),
                            (explorer.ref_logit_sliders, config["ref_logits"])):
        for slider, value in zip(sliders, values):
            slider.value = value
    explorer.num_samples.value = config["num_samples"]


def _set_length_bias(explorer, config) -> None:
    explorer.group_size.value = config["group_size"]
    explorer.max_completion_length.value = config["max_completion_length"]
    explorer.lengths.value = (config["shortest"], config["longest"])


_SET_CONTROLS = {"advantage": _set_advantage, "clipping": _set_clipping, "kl": _set_kl,
                 "length_bias": _set_length_bias}


# --------------------------------------------------------------------------- checks

def _default(function, name: str):
    return inspect.signature(function).parameters[name].default


def _config_keys(kind: str) -> set[str]:
    return set(inspect.signature(MODULES[kind].compute_state).parameters) - {"seed"}


def _check_kind(kind: str) -> str:
    if kind not in MODULES:
        raise ValueError(f"kind must be one of {tuple(MODULES)}, got {kind!r}")
    return kind


def _check_config(kind: str, config: dict) -> None:
    expected = _config_keys(_check_kind(kind))
    if not isinstance(config, dict) or set(config) != expected:
        got = sorted(config) if isinstance(config, dict) else type(config).__name__
        raise ValueError(f"config for kind {kind!r} must be a dict with the keys {sorted(expected)}, got {got}")
