"""Small helpers the chapters share: set-up, where runs are stored, provenance lines."""

from __future__ import annotations

import tempfile
from pathlib import Path
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


def chapter_run(
    config: dict[str, Any], *, label: str | None = None, use_store: bool, smoke: bool,
    device: str | torch.device = "auto", progress: bool = False,
) -> Any:
    """Load a run from ``results/`` (keyed by its config alone), or compute and store it.

    ``label`` (the chapter) is recorded in the provenance of a run this call stores.
    SMOKE runs and ``USE_STORE=False`` use a fresh temporary store and checkpoint folder,
    so they always recompute and never touch the stored results. The per-batch progress
    bar is off by default: in an executed notebook every update would become output.
    """
    from .store import RunStore, load_or_run

    if use_store and not smoke:
        return load_or_run(config, label=label, device=device, progress=progress)
    scratch = Path(tempfile.mkdtemp(prefix="calnotes-runs-"))
    return load_or_run(config, label=label, store=RunStore(scratch / "results"),
                       checkpoint_root=scratch / "checkpoints", device=device,
                       progress=progress)


def glue(name: str, value: Any) -> None:
    """``myst_nb.glue`` for numbers in prose: numpy and 0-d torch scalars become plain
    Python numbers first, so ``{glue:text}`name:.2f``` can format them."""
    from myst_nb import glue as myst_glue

    if isinstance(value, torch.Tensor):
        value = value.item()
    elif hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()
    myst_glue(name, value, display=False)
