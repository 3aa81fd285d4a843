"""Small helpers the chapters share: set-up, where runs are stored, provenance lines."""

from __future__ import annotations

import tempfile
from typing import Any

import torch


def setup_chapter(seed: int = 0, device: str = "auto", style: bool = True) -> torch.device:
    """Seed every generator, pick the device and set the book's plot style.

    The style is set here, by the chapter, never when ``calnotes`` is imported.
    """
    from .training import seed_everything, select_device

    seed_everything(seed)
    if style:
        import matplotlib.pyplot as plt
        import seaborn as sns

        sns.set_theme(style="whitegrid", context="notebook", font_scale=0.9)
        plt.rcParams["figure.dpi"] = 110
    return select_device(device)


def chapter_store(use_store: bool, smoke: bool) -> Any:
    """The run store a chapter reads: ``results/`` for the published book, otherwise a
    fresh temporary store so SMOKE runs and ``USE_STORE=False`` recompute everything and
    never touch the stored results."""
    from .store import RunStore

    if use_store and not smoke:
        return RunStore()
    return RunStore(tempfile.mkdtemp(prefix="calnotes-runs-"))
