"""The table of every metric (:func:`calibration_report`) and the metric names."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import torch

from calnotes._checks import (
    ArrayLike,
    check_choice,
    check_positive_float,
    check_probs,
)
from calnotes.metrics._common import _check_bins
from calnotes.metrics.binned import ace, classwise_ece, debiased_l2_ce, ece, mce
from calnotes.metrics.scores import brier, error, nll
from calnotes.metrics.selective import aurc, eaurc
from calnotes.metrics.smooth import sece, smece

#: The metrics of :func:`calibration_report`, in its column order.
REPORT_METRICS = ("error", "nll", "brier", "ece", "mce", "ace", "classwise_ece", "sece")



def calibration_report(
    probs: ArrayLike | Mapping[str, ArrayLike],
    labels: ArrayLike,
    n_bins: int = 15,
    bandwidth: float = 0.05,
    metrics: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Table of metrics: one row per model, columns ``metrics`` (default all of
    error, nll, brier, ece, mce, ace, classwise_ece, sece), values plain floats.

    ``probs`` is one array (a single row named ``"model"``) or a mapping
    ``{name: probs}`` sharing ``labels`` (one row per name, in order). ``n_bins`` is used by
    the binned metrics, ``bandwidth`` by SECE (exact up to ``SECE_EXACT_MAX_N`` samples,
    on a grid with an error below ``SECE_GRID_TOL`` above; see :func:`sece`).
    """
    n_bins = _check_bins(n_bins, "uniform")[0]
    bandwidth = check_positive_float(bandwidth, "bandwidth")
    if metrics is None:
        metrics = REPORT_METRICS
    elif isinstance(metrics, str) or not isinstance(metrics, Sequence) or len(metrics) == 0:
        raise ValueError(f"metrics must be a non-empty sequence of names from {REPORT_METRICS}")
    names = [check_choice(m, "metrics", REPORT_METRICS) for m in metrics]

    if isinstance(probs, Mapping):
        if len(probs) == 0:
            raise ValueError("probs is an empty mapping; give at least one model")
        models = dict(probs)
        for key in models:
            if not isinstance(key, str):
                raise TypeError(f"probs keys must be model names (str), got {type(key).__name__}")
    else:
        models = {"model": probs}

    compute = {
        "error": lambda p: error(p, labels),
        "nll": lambda p: nll(p, labels),
        "brier": lambda p: brier(p, labels),
        "ece": lambda p: ece(p, labels, n_bins=n_bins),
        "mce": lambda p: mce(p, labels, n_bins=n_bins),
        "ace": lambda p: ace(p, labels, n_bins=n_bins),
        "classwise_ece": lambda p: classwise_ece(p, labels, n_bins=n_bins),
        "sece": lambda p: sece(p, labels, bandwidth=bandwidth),
    }
    rows = []
    for name, model_probs in models.items():
        p, _ = check_probs(model_probs, f"probs[{name!r}]" if name != "model" else "probs")
        with torch.no_grad():
            rows.append({m: float(compute[m](p.detach())) for m in names})
    frame = pd.DataFrame(rows, index=pd.Index(list(models), name="model"), columns=names)
    return frame



#: Every scalar metric by name: what :func:`calnotes.metrics.bootstrap` and
#: :func:`calnotes.metrics.bootstrap_interval` accept as ``metric``.
METRICS: dict[str, Any] = {
    "error": error, "nll": nll, "brier": brier, "ece": ece, "mce": mce, "ace": ace,
    "classwise_ece": classwise_ece, "sece": sece, "smece": smece,
    "debiased_l2_ce": debiased_l2_ce, "aurc": aurc, "eaurc": eaurc,
}
#: The metrics of :data:`~calnotes.metrics.summary.METRICS` that take ``n_bins``.
BINNED_METRICS = ("ece", "mce", "ace", "classwise_ece", "debiased_l2_ce")


def _metric_function(metric: Any, n_bins: int | None = None, **kwargs: Any) -> Any:
    """A callable ``(probs, labels) -> number`` for a name of
    :data:`~calnotes.metrics.summary.METRICS` or a callable;
    ``n_bins`` (binned metrics only) and ``kwargs`` are bound to it."""
    if n_bins is not None:
        n_bins = _check_bins(n_bins, "uniform")[0]
    if callable(metric):
        return (lambda p, y: metric(p, y, **kwargs)) if kwargs else metric
    name = check_choice(metric, "metric", METRICS)
    f = METRICS[name]
    if n_bins is not None and name in BINNED_METRICS:
        kwargs = {"n_bins": n_bins, **kwargs}
    return (lambda p, y: f(p, y, **kwargs)) if kwargs else f
