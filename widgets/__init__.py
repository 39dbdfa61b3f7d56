"""Interactive explorers for the book (ipywidgets + matplotlib), imported as
`grpo_edu.widgets`. The core library never imports this package, so a GPU
cluster can install grpo_edu without Jupyter.

Each explorer is a small class: display it in a notebook, drive its controls from
Python, read its `state` (plain numbers, all computed by grpo_edu's own functions):

    advantages.py   AdvantageExplorer: rewards of two prompts' groups -> group-relative advantages
    clipping.py     ClippingExplorer: the clipped surrogate and its gradient against the ratio
    kl.py           KLExplorer: k1 / k2 / k3 estimators of KL(pi || pi_ref) vs the exact KL
    length_bias.py  LengthBiasExplorer: per-token loss weight against response length, per loss_type
    _base.py        what the explorers share: the layout, plots, tables, slider snapping
"""

from grpo_edu.widgets.advantages import AdvantageExplorer
from grpo_edu.widgets.clipping import ClippingExplorer
from grpo_edu.widgets.kl import KLExplorer
from grpo_edu.widgets.length_bias import LengthBiasExplorer

__all__ = ["AdvantageExplorer", "ClippingExplorer", "KLExplorer", "LengthBiasExplorer"]
