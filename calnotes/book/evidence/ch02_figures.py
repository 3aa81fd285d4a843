"""Chapter 2's figures: confidence histograms beside reliability diagrams, the sweeps'
error and ECE with bootstrap intervals, and the validation error and NLL over training.

Each returns its :class:`matplotlib.figure.Figure`; the chapter shows it. matplotlib is
imported when a figure is drawn, not when the claims' evaluator imports this package.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from calnotes import metrics
from calnotes.book.evidence.ch02 import SWEEP_NAMES, test_probs, tick

__all__ = ["confidence_and_reliability", "nll_curve", "overfitting_curves", "sweep_figure"]

#: The x-axis label of each sweep of :func:`sweep_figure`.
SWEEP_AXES = {"depth": "depth (layers)", "width": "filters in the first stage",
              "batch_norm": "batch normalization", "weight_decay": "weight decay"}


def confidence_and_reliability(runs: Mapping[str, Any], n_bins: int = 15,
                               float64: bool = True) -> Any:
    """One column per run of ``runs`` (``{title: run}``, two of them): its test
    confidence histogram (titled) above its reliability diagram with ``n_bins`` bins, as
    in Guo et al.'s Figure 1. The probabilities are the softmax of the test logits, in
    float64 (``float64=True``) or in the logits' own dtype."""
    import matplotlib.pyplot as plt

    from calnotes import plots

    if not isinstance(runs, Mapping) or len(runs) != 2:
        raise ValueError("runs must be a mapping of two titles to runs")
    fig, axes = plt.subplots(2, 2, figsize=(9, 7.4),
                             gridspec_kw={"hspace": 0.35, "wspace": 0.3})
    for column, (title, run) in enumerate(runs.items()):
        probs = test_probs(run) if float64 else torch.softmax(run.test_logits, dim=1)
        plots.confidence_histogram(probs, run.test_labels, ax=axes[0, column], title=title)
        plots.reliability_diagram(probs, run.test_labels, n_bins=n_bins, ax=axes[1, column],
                                  show_histogram=False)
    return fig


def sweep_figure(sweeps: Mapping[str, Any], *, n_bins: int = 15, n_boot: int = 1000,
                 seed: int = 0) -> Any:
    """The four sweeps (``SWEEP_NAMES``), one panel each:
    test error and ECE (%) of every run with a 95% percentile bootstrap interval over the
    test images (:func:`calnotes.metrics.bootstrap_interval`, ``n_boot`` resamples)."""
    import matplotlib.pyplot as plt
    import numpy as np

    if not isinstance(sweeps, Mapping) or list(sweeps) != list(SWEEP_NAMES):
        raise ValueError(f"sweeps must map the names {list(SWEEP_NAMES)} to sweeps, in order")
    fig, axes = plt.subplots(2, 2, figsize=(8.4, 6.6), gridspec_kw={"wspace": 0.3, "hspace": 0.45})
    for ax, (name, sweep) in zip(axes.flat, sweeps.items(), strict=True):
        x = np.arange(len(sweep.runs))
        for metric, marker, label in (("error", "o", "error"), ("ece", "s", "ECE")):
            ivs = [metrics.bootstrap_interval(metric, test_probs(r), r.test_labels,
                                              n_bins=n_bins, n_boot=n_boot,
                                              seed=seed).scaled(100) for r in sweep.runs]
            ax.errorbar(x, [iv.estimate for iv in ivs], marker=marker, capsize=3, label=label,
                        yerr=[[iv.estimate - iv.low for iv in ivs],
                              [iv.high - iv.estimate for iv in ivs]])
        ax.set_xticks(x, [tick(v) for v in sweep.labels])
        ax.set_xlabel(SWEEP_AXES[name])
        ax.set_ylabel("test error / ECE (%)")
        ax.set_ylim(bottom=0)
    fig.legend(*axes[0, 0].get_legend_handles_labels(), loc="upper center", ncol=2, fontsize=8,
               bbox_to_anchor=(0.5, 0.97), frameon=False)
    return fig


def nll_curve(curve: Any, reference: int, title: str) -> Any:
    """Validation error (%) and NLL over the epochs of a run's history ``curve``
    (:func:`calnotes.plots.error_and_nll`), the ``reference`` epoch dotted."""
    import matplotlib.pyplot as plt

    from calnotes import plots

    fig, ax = plt.subplots(figsize=(5.2, 3.4))
    plots.error_and_nll(curve["epoch"], 100 * (1 - curve["val_acc"]), curve["val_loss"], ax=ax,
                        marks=[reference], error_label="val. error (%)", nll_label="val. NLL",
                        title=title)
    return fig


def overfitting_curves(stepped: Any, runs: Mapping[str, Any], title: str) -> Any:
    """NLL overfitting over training. Top: the step-schedule run ``stepped``'s validation
    error and NLL over all epochs and from the epoch before the first learning-rate drop,
    the drops dotted (titled ``"{title}: epochs a-b"``). Bottom: every run of ``runs``
    through the second half of training, NLL (its minimum dotted) and error."""
    import matplotlib.pyplot as plt

    from calnotes import plots

    history = stepped.history.to_frame()
    drops = history["epoch"][history["lr"].diff() < 0]  # first epoch at each lower rate
    after = history[history["epoch"] >= (drops.iloc[0] - 1 if len(drops) else 1)]
    fig, axes = plt.subplots(2, 2, figsize=(9, 7.6), gridspec_kw={"wspace": 0.6, "hspace": 0.6})
    for ax, h in ((axes[0, 0], history), (axes[0, 1], after)):
        span = f"epochs {h['epoch'].iloc[0]}-{h['epoch'].iloc[-1]}"
        plots.error_and_nll(h["epoch"], 100 * (1 - h["val_acc"]), h["val_loss"], ax=ax,
                            marks=drops - 0.5, error_label="val. error (%)",
                            nll_label="val. NLL", legend=False, title=f"{title}: {span}")
    start = max(1, int(history["epoch"].max()) // 2)  # the second half of training
    for i, (name, run) in enumerate(runs.items()):
        h = run.history.to_frame()
        best = h["val_loss"].idxmin()
        h = h[h["epoch"] >= start]
        axes[1, 0].plot(h["epoch"], h["val_loss"], color=f"C{i}", label=name)
        if best in h.index:
            axes[1, 0].plot(h["epoch"][best], h["val_loss"][best], "o", color=f"C{i}")
        axes[1, 1].plot(h["epoch"], 100 * (1 - h["val_acc"]), color=f"C{i}")
    for ax, label in ((axes[1, 0], "val. NLL (dot: minimum)"), (axes[1, 1], "val. error (%)")):
        ax.set(xlabel="epoch", ylabel=label, title="every run, second half of training")
    fig.legend(*axes[1, 0].get_legend_handles_labels(), loc="upper center", ncol=3, fontsize=8,
               bbox_to_anchor=(0.5, 0.03), frameon=False)
    return fig
