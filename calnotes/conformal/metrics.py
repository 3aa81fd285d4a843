r"""How prediction sets perform: coverage, size, and coverage within groups.

``sets (N, C)`` boolean, ``labels (N,)``. Coverage is :math:`\frac1N \sum_i 1[y_i \in
C(x_i)]`; size is :math:`\frac1N \sum_i |C(x_i)|`. Conditional coverage splits the samples
into groups (the true class, the set's size, or bins of a value such as the confidence)
and gives each group's coverage, where a marginal 90% may hide a group at 60%.

:func:`coverage_band` is what the guarantee promises a finite test set: with ``n_cal``
exchangeable calibration samples and continuous scores the coverage of a fresh test point
is :math:`\mathrm{Beta}(k, n + 1 - k)`, :math:`k = \lceil (n+1)(1-\alpha) \rceil`, so the
number of covered points among ``n_test`` is beta-binomial (Vovk 2012; Angelopoulos &
Bates 2023, Section 3.2).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from calnotes._checks import as_tensor, check_labels, check_positive_int
from calnotes.conformal.split import check_alpha

__all__ = ["binned_coverage", "class_coverage", "coverage", "coverage_band", "set_size",
           "size_stratified_coverage"]


def _sets(sets: Any) -> torch.Tensor:
    s, _ = as_tensor(sets, "sets")
    if s.dtype != torch.bool:
        raise TypeError(f"sets must be boolean, got {s.dtype}")
    if s.ndim != 2 or s.shape[0] == 0 or s.shape[1] < 2:
        raise ValueError(f"sets must have shape (N, C) with N > 0 and C >= 2, got "
                         f"{tuple(s.shape)}")
    return s


def _covered(sets: Any, labels: Any) -> torch.Tensor:
    s = _sets(sets)
    y = check_labels(labels, s.shape[0], s.shape[1]).to(s.device)
    return s.gather(1, y[:, None]).squeeze(1)


def coverage(sets: Any, labels: Any) -> float:
    """Share of samples whose label is in their set."""
    return float(_covered(sets, labels).double().mean())


def set_size(sets: Any) -> float:
    """Mean number of classes per set."""
    return float(_sets(sets).sum(dim=1).double().mean())


def class_coverage(sets: Any, labels: Any) -> np.ndarray:
    """Coverage among the samples of each class, shape ``(C,)`` (NaN for an absent class)."""
    s = _sets(sets)
    y = check_labels(labels, s.shape[0], s.shape[1]).to(s.device)
    cov = _covered(s, y).double()
    n = torch.bincount(y, minlength=s.shape[1]).double()
    hit = torch.bincount(y, weights=cov, minlength=s.shape[1])
    out = torch.where(n > 0, hit / n.clamp(min=1), torch.full_like(n, math.nan))
    return out.cpu().numpy()


def size_stratified_coverage(sets: Any, labels: Any) -> dict[int, tuple[float, int]]:
    """``{size: (coverage, count)}`` over the set sizes that occur (Angelopoulos et al.
    2021, Section 4)."""
    cov = _covered(sets, labels).double()
    sizes = _sets(sets).sum(dim=1)
    out = {}
    for k in torch.unique(sizes).tolist():
        mine = sizes == k
        out[int(k)] = (float(cov[mine].mean()), int(mine.sum()))
    return out


def binned_coverage(sets: Any, labels: Any, values: Any, n_bins: int = 10
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Coverage in ``n_bins`` equal-mass bins of ``values (N,)`` (for example the
    confidence): ``(bin mean of values, coverage, count)``, bins in increasing order."""
    cov = _covered(sets, labels).double().cpu()
    v, _ = as_tensor(values, "values")
    if v.ndim != 1 or v.shape[0] != cov.shape[0]:
        raise ValueError(f"values must have shape ({cov.shape[0]},), got {tuple(v.shape)}")
    if not torch.is_floating_point(v) or not bool(torch.isfinite(v).all()):
        raise ValueError("values must be finite floating-point numbers")
    n_bins = check_positive_int(n_bins, "n_bins")
    order = torch.argsort(v.detach().cpu().double(), stable=True)
    chunks = [c for c in torch.tensor_split(order, n_bins) if c.numel()]
    vd = v.detach().cpu().double()
    return (np.array([float(vd[c].mean()) for c in chunks]),
            np.array([float(cov[c].mean()) for c in chunks]),
            np.array([c.numel() for c in chunks]))


def coverage_band(n_cal: int, n_test: int, alpha: float, level: float = 0.99
                  ) -> tuple[float, float]:
    """The central ``level`` interval of the test coverage of split conformal sets under
    exchangeability (beta-binomial, see the module docstring)."""
    from scipy import stats

    n_cal = check_positive_int(n_cal, "n_cal")
    n_test = check_positive_int(n_test, "n_test")
    alpha = check_alpha(alpha)
    level = check_alpha(level, "level")
    k = math.ceil((n_cal + 1) * (1 - alpha) - 1e-12)
    if k > n_cal:
        return 1.0, 1.0
    dist = stats.betabinom(n_test, k, n_cal + 1 - k)
    tail = (1 - level) / 2
    return float(dist.ppf(tail)) / n_test, float(dist.isf(tail)) / n_test
