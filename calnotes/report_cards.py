r"""Report cards of calibration diagnostics on synthetic models with a known truth.

For a :class:`~calnotes.synthetic.SyntheticModel` and sample sizes :math:`n`, each card
draws ``repeats`` independent test sets (seeded by ``(seed, n, repeat)``, so every
diagnostic sees the same samples) and summarizes

* an **estimator** :math:`\hat\theta` of a target :math:`\theta` by its bias
  :math:`E[\hat\theta] - \theta`, standard deviation and root-mean-square error
  :math:`\sqrt{\mathrm{bias}^2 + \mathrm{SD}^2}` (:func:`estimator_card`);
* an **interval** by its coverage :math:`P(\text{low} \le \theta \le \text{high})`, its
  mean width and how often it excludes its own estimate (:func:`interval_card`);
* a **test** by its rejection rate at ``level`` (on a calibrated model: the
  false-rejection rate, which a valid test keeps at or below ``level``;
  :func:`rejection_card`).

Every rate comes with its Wilson interval over the repeats.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import pandas as pd

from ._checks import check_positive_float, check_positive_int
from .metrics.bands import wilson
from .synthetic import SyntheticModel


def _samples(model: SyntheticModel, sizes: Iterable[int], repeats: int, seed: int
             ) -> Iterable[tuple[int, int, np.ndarray, np.ndarray]]:
    repeats = check_positive_int(repeats, "repeats")
    seed = check_positive_int(seed, "seed", minimum=0)
    for n in sizes:
        n = check_positive_int(n, "sizes")
        for r in range(repeats):
            probs, labels = model.sample(n, seed=np.random.SeedSequence([seed, n, r]))
            yield n, r, probs, labels


def _targets(model: SyntheticModel, names: Iterable[str],
             targets: Mapping[str, float] | None) -> dict[str, float]:
    """The target of each name: ``targets[name]``, else the model's true calibration error."""
    truth = model.true_calibration_error()
    return {name: float((targets or {}).get(name, truth)) for name in names}


def _rate(hits: int, total: int, level: float = 0.95) -> tuple[float, float, float]:
    low, high = wilson(hits, total, level)
    return hits / total, float(low), float(high)


def estimator_card(
    model: SyntheticModel, sizes: Iterable[int],
    estimators: Mapping[str, Callable[[np.ndarray, np.ndarray], Any]], *,
    repeats: int = 50, seed: int = 0, targets: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """Bias, SD and RMSE of each estimator at each size: one row per ``(n, estimator)``
    with ``target``, ``mean``, ``bias``, ``sd`` (``ddof=1``) and ``rmse``."""
    if not estimators:
        raise ValueError("estimators must name at least one estimator")
    goal = _targets(model, estimators, targets)
    rows = [{"n": n, "estimator": name, "estimate": float(f(probs, labels))}
            for n, _, probs, labels in _samples(model, sizes, repeats, seed)
            for name, f in estimators.items()]
    frame = pd.DataFrame(rows)
    frame["error"] = frame["estimate"] - frame["estimator"].map(goal)
    out = frame.groupby(["n", "estimator"], sort=False).agg(
        mean=("estimate", "mean"), bias=("error", "mean"), sd=("estimate", "std"),
        rmse=("error", lambda e: float(np.sqrt(np.mean(np.square(e))))))
    out.insert(0, "target", [goal[e] for e in out.index.get_level_values("estimator")])
    return out.reset_index()


def interval_card(
    model: SyntheticModel, sizes: Iterable[int],
    intervals: Mapping[str, Callable[[np.ndarray, np.ndarray], Any]], *,
    repeats: int = 50, seed: int = 0, targets: Mapping[str, float] | None = None,
) -> pd.DataFrame:
    """Coverage of each interval (a callable returning an object with ``estimate``,
    ``low`` and ``high``) at each size: one row per ``(n, interval)`` with ``target``,
    ``coverage`` and its 95% Wilson ``coverage_low``/``coverage_high``, the mean ``width``
    and ``excludes_estimate``, the share of intervals that exclude their own estimate."""
    if not intervals:
        raise ValueError("intervals must name at least one interval")
    goal = _targets(model, intervals, targets)
    hits: dict[tuple[int, str], list[tuple[bool, float, bool]]] = {}
    for n, _, probs, labels in _samples(model, sizes, repeats, seed):
        for name, f in intervals.items():
            iv = f(probs, labels)
            hits.setdefault((n, name), []).append(
                (iv.low <= goal[name] <= iv.high, iv.high - iv.low,
                 not iv.low <= iv.estimate <= iv.high))
    rows = []
    for (n, name), values in hits.items():
        covered, width, excludes = (np.array(v) for v in zip(*values, strict=True))
        rate, low, high = _rate(int(covered.sum()), len(covered))
        rows.append({"n": n, "interval": name, "target": goal[name], "coverage": rate,
                     "coverage_low": low, "coverage_high": high, "width": float(width.mean()),
                     "excludes_estimate": float(excludes.mean())})
    return pd.DataFrame(rows)


def rejection_card(
    model: SyntheticModel, sizes: Iterable[int],
    tests: Mapping[str, Callable[[np.ndarray, np.ndarray], Any]], *,
    repeats: int = 50, seed: int = 0, level: float = 0.05,
) -> pd.DataFrame:
    """Rejection rate at ``level`` of each test (a callable returning an object with
    ``p_value``) at each size: one row per ``(n, test)`` with ``rejection`` and its 95%
    Wilson ``rejection_low``/``rejection_high``. On a calibrated model this is the
    false-rejection rate."""
    if not tests:
        raise ValueError("tests must name at least one test")
    level = check_positive_float(level, "level")
    if level >= 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    rejected: dict[tuple[int, str], list[bool]] = {}
    for n, _, probs, labels in _samples(model, sizes, repeats, seed):
        for name, f in tests.items():
            rejected.setdefault((n, name), []).append(bool(f(probs, labels).p_value < level))
    rows = []
    for (n, name), values in rejected.items():
        rate, low, high = _rate(int(np.sum(values)), len(values))
        rows.append({"n": n, "test": name, "rejection": rate, "rejection_low": low,
                     "rejection_high": high})
    return pd.DataFrame(rows)
