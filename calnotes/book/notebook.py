"""Small helpers the chapters share: set-up, where runs are stored, provenance lines."""

from __future__ import annotations

from typing import Any

import torch

from calnotes.runs.store import chapter_run
from calnotes.training import seed_everything, select_device

__all__ = ["chapter_run", "glue", "setup_chapter"]


def setup_chapter(seed: int = 0, device: str = "auto", style: bool = True) -> torch.device:
    """Seed every generator, pick the device and set the book's plot style.

    The style is set here, by the chapter, never when ``calnotes`` is imported.
    """
    seed_everything(seed)
    if style:
        import matplotlib.pyplot as plt
        import seaborn as sns

        sns.set_theme(style="whitegrid", context="notebook", font_scale=0.9)
        plt.rcParams["figure.dpi"] = 110
    return select_device(device)


def glue(name: str, value: Any) -> None:
    """``myst_nb.glue`` for numbers in prose: numpy and 0-d torch scalars become plain
    Python numbers first, so ``{glue:text}`name:.2f``` can format them."""
    from myst_nb import glue as myst_glue

    if isinstance(value, torch.Tensor):
        value = value.item()
    elif hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()
    myst_glue(name, value, display=False)
