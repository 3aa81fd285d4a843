r"""scikit-learn scorers of the calibration metrics, for ``cross_val_score``,
``GridSearchCV`` and any other ``scoring=`` argument.

``sklearn_scorer("ece", n_bins=15)`` returns a scorer ``(estimator, X, y) -> float`` that
calls ``estimator.predict_proba(X)``, maps the labels ``y`` to the columns of
``estimator.classes_`` and returns the *negated* metric, as scikit-learn's scorers are
"greater is better" (like its ``neg_log_loss``): the best model maximises
:math:`-\mathrm{ECE}`. ``sample_weight`` reaches the metric when the scorer is called
with it, and through metadata routing (``sklearn.set_config(enable_metadata_routing=True)``,
then ``params={"sample_weight": w}``): the scorer requests it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import numpy as np
from sklearn.utils.metadata_routing import MetadataRequest

from calnotes.metrics.binned import ace, classwise_ece, ece, mce
from calnotes.metrics.scores import brier, nll
from calnotes.metrics.smooth import sece

#: Metrics a scorer can compute, by name; ``sece`` takes no ``sample_weight``.
SCORER_METRICS: dict[str, Callable[..., Any]] = {
    "ece": ece,
    "mce": mce,
    "classwise_ece": classwise_ece,
    "ace": ace,
    "nll": nll,
    "brier": brier,
    "sece": sece,
}


class CalibrationScorer:
    """A scikit-learn scorer of ``-metric(estimator.predict_proba(X), y, **kwargs)``."""

    def __init__(self, metric: str, **kwargs: Any) -> None:
        if not isinstance(metric, str) or metric not in SCORER_METRICS:
            raise ValueError(f"metric must be one of {sorted(SCORER_METRICS)}, got {metric!r}")
        function = SCORER_METRICS[metric]
        options = set(inspect.signature(function).parameters) - {
            "probs", "labels", "sample_weight"}
        unknown = sorted(set(kwargs) - options)
        if unknown:
            raise ValueError(f"{metric} takes no option(s) {unknown}; valid: {sorted(options)}")
        self.metric, self.kwargs, self._function = metric, kwargs, function

    def __call__(self, estimator: Any, X: Any, y_true: Any,
                 sample_weight: Any = None) -> float:
        """``-metric`` of ``estimator`` on ``(X, y_true)``; greater is better."""
        if not hasattr(estimator, "predict_proba"):
            raise TypeError(f"estimator must have predict_proba, got "
                            f"{type(estimator).__name__}")
        probs = np.asarray(estimator.predict_proba(X), dtype=np.float64)
        labels = _label_indices(y_true, np.asarray(estimator.classes_))
        kwargs = dict(self.kwargs)
        if sample_weight is not None:
            if self.metric == "sece":
                raise ValueError("sample_weight is not supported by the sece scorer")
            kwargs["sample_weight"] = np.asarray(sample_weight, dtype=np.float64)
        return -float(self._function(probs, labels, **kwargs))

    def get_metadata_routing(self) -> Any:
        """The scorer requests ``sample_weight`` when metadata routing is on."""
        request = MetadataRequest(owner=type(self).__name__)
        if self.metric != "sece":
            request.score.add_request(param="sample_weight", alias=True)
        return request

    def __repr__(self) -> str:
        args = "".join(f", {k}={v!r}" for k, v in self.kwargs.items())
        return f"sklearn_scorer({self.metric!r}{args})"


def _label_indices(y_true: Any, classes: np.ndarray) -> np.ndarray:
    """Column of each label in ``classes`` (sorted, as scikit-learn keeps them)."""
    y = np.asarray(y_true)
    if y.ndim != 1:
        raise ValueError(f"y must have shape (N,), got shape {y.shape}")
    idx = np.searchsorted(classes, y)
    bad = (idx >= len(classes)) | (classes[np.minimum(idx, len(classes) - 1)] != y)
    if bad.any():
        raise ValueError(f"y holds labels the estimator was not fitted on: "
                         f"{sorted(set(y[bad].tolist()))[:5]}; its classes_ are {classes.tolist()}")
    return idx.astype(np.int64)


def sklearn_scorer(metric: str, **kwargs: Any) -> CalibrationScorer:
    """A scorer of ``-metric`` (greater is better) for ``scoring=`` in scikit-learn.

    ``metric`` is a name in :data:`calnotes.metrics.sklearn.SCORER_METRICS`; ``kwargs`` go
    to the metric (``n_bins``, ``binning``, ``norm``, ``bandwidth``, ...) and are checked
    here.
    """
    return CalibrationScorer(metric, **kwargs)
