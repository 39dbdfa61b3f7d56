"""The book's schematics (grpo_edu/book/schematics.py): each draws, and the numbers a picture
shows are the library's, not typed in."""

import re

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402

from grpo_edu.algorithm.advantages import group_advantages  # noqa: E402
from grpo_edu.book import schematics  # noqa: E402

NAMES = re.findall(r"^    (\w+)\s+chapter", schematics.__doc__, re.M)


def _texts(figure):
    return [t.get_text() for axes in figure.axes for t in axes.texts]


def test_the_docstring_lists_every_schematic():
    public = {n for n, f in vars(schematics).items()
              if callable(f) and not n.startswith("_") and getattr(f, "__module__", "") == schematics.__name__}
    assert set(NAMES) == public and len(NAMES) == 16


@pytest.mark.parametrize("name", NAMES)
def test_each_schematic_draws_a_figure(name):
    figure = getattr(schematics, name)()
    assert isinstance(figure, matplotlib.figure.Figure) and figure.axes
    plt.close(figure)


@pytest.mark.parametrize("rewards", [(1.0, 0.0, 0.0, 1.0), (0.2, 0.9, 0.4), (3.0, 1.0, 1.0, 1.0, 0.0)])
def test_group_advantages_shows_the_librarys_advantages(rewards):
    figure = schematics.group_advantages(rewards)
    want = group_advantages(np.array([rewards]))[0]
    shown = [float(m) for t in _texts(figure) for m in re.findall(r"\$A_\d+\$ = ([-+]\d\.\d{3})", t)]
    np.testing.assert_allclose(shown, want, atol=5e-4)
    plt.close(figure)


def test_token_weights_shows_the_aggregations_weights():
    figure = schematics.token_weights(lengths=(4, 12), loss_types=("grpo", "dr_grpo"), max_completion_length=16)
    shown = [float(m) for t in _texts(figure) for m in re.findall(r"tokens: (\d\.\d{3}) each", t)]
    # grpo: 1/(G * length); dr_grpo: 1/(G * max_completion_length)
    np.testing.assert_allclose(shown, [1 / 8, 1 / 24, 1 / 32, 1 / 32], atol=5e-4)
    plt.close(figure)


def test_bgs_tensor_masks_exactly_the_completion_tokens():
    lengths = ((4, 6, 2), (5, 3, 1))
    figure = schematics.bgs_tensor((3, 5), lengths)
    texts = _texts(figure)
    ones, zeros = sum(t == "1" for t in texts), sum(t == "0" for t in texts)
    assert ones == sum(map(sum, lengths))
    assert ones + zeros == 6 * 6                      # the mask is written on the S = 6 completion columns only
    plt.close(figure)


def test_bgs_tensor_names_prompt_and_completion_columns_apart():
    """P, S and T = P + S are three numbers: the picture labels each block and the seam."""
    figure = schematics.bgs_tensor((3, 5), ((4, 6, 2), (5, 3, 1)))
    texts = _texts(figure)
    assert "P = 5 prompt columns" in texts and "S = 6 completion columns" in texts
    assert any(t.startswith("T = P + S = 11 columns") for t in texts) and any("seam" in t for t in texts)
    assert not any(t.startswith("S = 11") for t in texts)
    plt.close(figure)


def test_ppo_vs_grpo_draws_every_part_and_counts_the_networks():
    figure = schematics.ppo_vs_grpo()
    texts = _texts(figure)
    for method, parts in schematics.PARTS.items():
        assert {name for name, *_ in parts} <= set(texts), method
    assert {name for name, *_ in schematics.PARTS["PPO"]} == {"policy", "critic", "reward model", "reference"}
    assert "critic" not in {name for name, *_ in schematics.PARTS["GRPO"]}
    assert "PPO: 4 networks, 2 trained" in texts
    assert "GRPO: 1 network + 1 optional, 1 trained" in texts
    plt.close(figure)


def test_dapo_toolbox_names_real_config_keys_at_their_stage():
    from grpo_edu.config import TrainConfig
    fields = set(TrainConfig.keys())
    keys = [key for _, _, knobs in schematics.TOOLBOX for key, _ in knobs]
    assert len(keys) == 5 and set(keys) <= fields, set(keys) - fields
    figure = schematics.dapo_toolbox()
    assert set(keys) <= set(_texts(figure))
    plt.close(figure)
