"""Chapter 3's figures: a network's errors on the positive class, reliability diagrams of
the binary networks (top label and positive class, before and after calibration), and
of the multiclass rows before and after temperature scaling.

Each returns its :class:`matplotlib.figure.Figure`; the chapter shows it. matplotlib is
imported when a figure is drawn, not when the claims' evaluator imports this package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from calnotes.evaluation import LABELS, UNCALIBRATED

__all__ = ["binary_diagrams", "calibrated_diagrams", "positive_class_errors",
           "temperature_diagrams"]


def positive_class_errors(run: Any, positive_class: int, n: int = 16) -> Any:
    """The first ``n`` (at most 16) test images of a run on which "``positive_class`` vs
    not" is wrong, each titled "true as predicted", read from the run's own test split
    (``ValueError`` if its labels are not the run's test labels)."""
    import matplotlib.pyplot as plt

    from calnotes.runs.experiment import load_splits

    if not 1 <= int(n) <= 16:
        raise ValueError(f"n must be between 1 and 16, got {n}")
    test_images = load_splits(run.config).test  # the run's own test split, in its order
    if not torch.equal(torch.as_tensor(test_images.labels).long(), run.test_labels):
        raise ValueError("run: its test labels are not those of its config's test split")
    pred = run.test_logits.argmax(1)
    picked = torch.nonzero((run.test_labels == positive_class) != (pred == positive_class)
                           ).flatten()[:n].tolist()
    fig, axes = plt.subplots(2, 8, figsize=(9, 2.9))
    for ax, i in zip(axes.flat, picked, strict=False):
        ax.imshow(np.asarray(test_images.images[i]).squeeze(), cmap="gray_r")
        ax.set_title(f"{int(run.test_labels[i])} as {int(pred[i])}", fontsize=9)
    for ax in axes.flat:
        ax.axis("off")
    return fig


def _grid(nrows: int, ncols: int, hspace: float, wspace: float, **size: Any) -> Any:
    import matplotlib.pyplot as plt

    from calnotes import plots

    return plt.subplots(nrows, ncols, figsize=plots.grid_figsize(nrows, ncols, **size),
                        gridspec_kw={"hspace": hspace, "wspace": wspace})


def binary_diagrams(comparisons: Mapping[str, Any], runs: Mapping[str, Any],
                    positive_class: int, n_bins: int = 15) -> Any:
    """Per binary network (a row): the uncalibrated test predictions' top-label reliability
    diagram and the positive-class diagram of :math:`\\hat p = P(\\text{positive})`."""
    from calnotes import plots

    fig, axes = _grid(2, 2, 0.6, 0.35)
    for row, (name, cmp) in enumerate(comparisons.items()):
        labels = runs[name].test_labels
        probs = cmp.probs[UNCALIBRATED]
        plots.reliability_diagram(probs, labels, n_bins=n_bins, ax=axes[row, 0],
                                  title=f"{name}: top label")
        plots.positive_class_diagram(probs[:, 1], labels, n_bins=n_bins, ax=axes[row, 1],
                                     title=f"{name}: is it a {positive_class}?")
    return fig


def calibrated_diagrams(comparisons: Mapping[str, Any], runs: Mapping[str, Any],
                        methods: tuple[str, str] = ("isotonic", "platt"),
                        n_bins: int = 15) -> Any:
    """Per network (a row), the top-label reliability diagram after each of two
    ``methods``."""
    from calnotes import plots

    if len(methods) != 2:
        raise ValueError(f"methods must name two calibrators, got {methods!r}")
    fig, axes = _grid(2, 2, 0.6, 0.35)
    for row, (name, cmp) in enumerate(comparisons.items()):
        for col, method in enumerate(methods):
            plots.reliability_diagram(cmp.probs[method], runs[name].test_labels,
                                      n_bins=n_bins, ax=axes[row, col],
                                      title=f"{name}: {LABELS[method]}")
    return fig


def temperature_diagrams(comparisons: Mapping[str, Any], runs: Mapping[str, Any],
                         titles: Mapping[str, str], *, by_column: bool, n_bins: int = 15,
                         bootstrap: int = 200) -> Any:
    """Reliability diagrams uncalibrated and after temperature scaling, with ``bootstrap``
    resamples per bin: a column per comparison (``by_column=True``, a 2-by-n grid) or a
    row per comparison (2-by-2); each titled ``titles[name]`` over the method."""
    from calnotes import plots

    n = len(comparisons)
    if by_column:
        fig, axes = _grid(2, n, 0.75, 0.4, aspect=1.0)
    else:
        fig, axes = _grid(n, 2, 0.75, 0.35)
    for i, (name, cmp) in enumerate(comparisons.items()):
        for j, method in enumerate([UNCALIBRATED, "temperature"]):
            ax = axes[j, i] if by_column else axes[i, j]
            plots.reliability_diagram(cmp.probs[method], runs[name].test_labels,
                                      n_bins=n_bins, ax=ax, bootstrap=bootstrap,
                                      title=f"{titles[name]}\n{LABELS[method]}")
    return fig
