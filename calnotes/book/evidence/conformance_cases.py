"""Minimal reproducers of the conventions in :mod:`calnotes.book.evidence.conformance`:
the smallest inputs on which each library's convention changes the number, with the values
worked out by hand."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from calnotes.book.evidence.conformance import conformance_table

__all__ = ["Reproducer", "reproducer_table", "reproducers"]


@dataclass(frozen=True)
class Reproducer:
    """Tiny ``probs (N, C)`` and ``labels (N,)`` on which ``metric`` depends on
    ``convention``; ``by_hand`` maps a convention to its value computed by hand."""

    name: str
    metric: str
    convention: str
    probs: np.ndarray
    labels: np.ndarray
    by_hand: dict[str, float] = field(default_factory=dict)
    n_bins: int = 15


def _binary(p1: Iterable[float], labels: Iterable[int]) -> tuple[np.ndarray, np.ndarray]:
    p = np.asarray(list(p1), dtype=np.float64)
    return np.stack([1 - p, p], axis=1), np.asarray(list(labels), dtype=np.int64)


def _saturated() -> Reproducer:
    # confidences 0.95 (right) and 1.0 (wrong). (lo, hi]: both in (14/15, 1]:
    # |0.5 - 0.975| = 0.475. A bin of its own for 1.0: 0.5 |1 - 0.95| + 0.5 |0 - 1| = 0.525.
    probs, labels = _binary([0.95, 1.0], [1, 0])
    return Reproducer("saturated confidence", "ECE", "left-closed-own-bin", probs, labels,
                      {"same": 0.475, "left-closed-own-bin": 0.525,
                       "left-closed-float32": 0.525})


def _edge_tie() -> Reproducer:
    # confidences 0.6 = 9/15 (right) and 0.65 (wrong). (lo, hi]: 0.6 alone in (8/15, 9/15]:
    # 0.5 * 0.4 + 0.5 * 0.65 = 0.525. [lo, hi): both in [9/15, 10/15): |0.5 - 0.625| = 0.125.
    probs, labels = _binary([0.6, 0.35], [1, 1])
    # (netcal reads these two-valued labels as a binary task and bins the positive-class
    # probabilities 0.6 and 0.35 against 1, 1: 0.5 * 0.4 + 0.5 * 0.65 = 0.525 as well)
    return Reproducer("confidence on a bin edge", "ECE", "left-closed", probs, labels,
                      {"same": 0.525, "left-closed": 0.125, "left-closed-float32": 0.125,
                       "left-closed-own-bin": 0.125, "binary-positive-class": 0.525})


def _edges_count() -> Reproducer:
    # confidences 0.93 (right) and 0.94 (wrong): 15 bins cut at 14/15 = 0.9333 between them,
    # 0.5 * 0.07 + 0.5 * 0.94 = 0.505; 14 bins (edges 0, 1/14, ..., 1) put both in
    # (13/14, 1]: |0.5 - 0.935| = 0.435.
    probs, labels = _binary([0.93, 0.94], [1, 0])
    return Reproducer("num_bins counts edges", "ECE", "edges-count", probs, labels,
                      {"same": 0.505, "edges-count": 0.435})


def _near_one() -> Reproducer:
    # half of 2,000 confidences within 1e-3 of 1: relplot's end cell weighs half and its
    # kernel is cut at 0.5, so its smooth ECE moves away from the integral
    rng = np.random.default_rng(0)
    conf = np.r_[rng.uniform(0.6, 0.9, 1000), 1 - rng.uniform(0, 1e-3, 1000)]
    correct = (rng.random(2000) < 0.95 * conf).astype(np.int64)
    probs, labels = _binary(conf, correct)
    return Reproducer("confidences near 1", "smooth ECE", "relplot-grid", probs, labels)


def _discrete() -> Reproducer:
    # a binning calibrator's output: 20 distinct values, 5 samples each (fewer than 100 / 4
    # distinct values), so uncertainty-calibration gives each value a bin of its own where
    # 15 equal-mass bins pool some of them
    p = np.repeat(np.linspace(0.5, 0.975, 20), 5)
    labels = (np.random.default_rng(0).random(p.size) < 0.9 * p).astype(int)
    probs, y = _binary(p, labels)
    return Reproducer("few distinct values", "debiased L2", "discrete-switch", probs, y)


def _underflow() -> Reproducer:
    # a softmax that underflowed: the true class got probability 0. calnotes clamps at 1e-12,
    # scikit-learn at the float64 machine epsilon: (-log(1e-12) - log(0.9)) / 2 = 13.8682
    # against (-log(2^-52) - log(0.9)) / 2 = 18.0748
    probs, labels = _binary([1.0, 0.1], [0, 0])
    eps = float(np.finfo(np.float64).eps)
    return Reproducer("true class underflowed", "NLL", "machine-eps-clip", probs, labels,
                      {"same": (-math.log(1e-12) - math.log(0.9)) / 2,
                       "machine-eps-clip": (-math.log(eps) - math.log(0.9)) / 2})


def reproducers() -> dict[str, Reproducer]:
    """Every reproducer by name."""
    cases = [_saturated(), _edge_tie(), _edges_count(), _near_one(), _discrete(), _underflow()]
    return {c.name: c for c in cases}


def reproducer_table(case: Reproducer, peers: Iterable[str] | None = None) -> pd.DataFrame:
    """:func:`~calnotes.book.evidence.conformance.conformance_table` of ``case``'s inputs,
    its metric only, with the value worked out by hand for each row's convention (NaN
    where none was) beside each library's."""
    table = conformance_table(case.probs, case.labels, n_bins=case.n_bins, peers=peers,
                              metric_names=[case.metric])
    rows = table[(table["metric"] == case.metric) | (table["status"] == "not available")]
    rows = rows.assign(by_hand=[case.by_hand.get(c, np.nan) for c in rows["convention"]])
    return rows.reset_index(drop=True)
