r"""Bands for reliability diagrams: how far a bin's accuracy can be trusted.

For each confidence bin :math:`B_m` with :math:`n_m` samples of which :math:`k_m` are
correct, two different questions get two different bands:

* the *accuracy band* (``low``, ``high``): an interval for the bin's true accuracy
  :math:`P(r = 1 \mid c \in B_m)` at ``level``. ``method="clopper-pearson"`` is the exact
  binomial interval :math:`[\mathrm{Beta}_{\alpha/2}(k, n-k+1),\,
  \mathrm{Beta}_{1-\alpha/2}(k+1, n-k)]` (never shorter than its level needs);
  ``"wilson"`` the score interval
  :math:`\frac{\hat a + z^2/2n \pm z\sqrt{\hat a(1-\hat a)/n + z^2/4n^2}}{1 + z^2/n}`;
  ``"bootstrap"`` the percentile interval of the bin's accuracy over resamples of all N
  samples, widened to the Clopper-Pearson limit on the side where every resample agrees
  (a bin that is all correct or all wrong gives every resample the same accuracy, and a
  zero-width band would claim certainty that 12 samples cannot give).
* the *consistency band* (``consistency_low``, ``consistency_high``): where the bin's
  accuracy falls if the model were perfectly calibrated. Each resample keeps the
  confidences and draws :math:`r_i^* \sim \mathrm{Bernoulli}(c_i)` (consistency
  resampling, Bröcker & Smith 2007); the band is the central ``level`` range of the bin's
  mean :math:`r^*`. A bar outside it is a miscalibration the bin's size cannot explain.

Bins with fewer than ``min_count`` samples are flagged (``enough`` is False): their bands are
computed but so wide that a diagram should draw them hollow.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from calnotes._checks import ArrayLike, check_choice, check_positive_float, check_positive_int
from calnotes.metrics._common import _bin_index, _edges_for, _top_label_checked, resolve_n_bins

BAND_METHODS = ("clopper-pearson", "wilson", "bootstrap")
#: Resamples per block in the resampled bands (a block holds ``block x N`` draws).
_BLOCK = 32


@dataclass
class ReliabilityBands:
    """Per-bin statistics and bands (numpy arrays, one entry per bin; NaN in empty bins).

    ``edges (M + 1,)``, ``counts``, ``accuracy``, ``confidence``, the accuracy band ``low`` /
    ``high`` of ``method`` at ``level``, the consistency band ``consistency_low`` /
    ``consistency_high`` and ``enough`` (``counts >= min_count``).
    """

    edges: np.ndarray
    counts: np.ndarray
    accuracy: np.ndarray
    confidence: np.ndarray
    low: np.ndarray
    high: np.ndarray
    consistency_low: np.ndarray
    consistency_high: np.ndarray
    enough: np.ndarray
    method: str
    level: float

    def to_frame(self) -> pd.DataFrame:
        """One row per bin: lower, upper, count, accuracy, confidence, low, high,
        consistency_low, consistency_high, enough."""
        frame = pd.DataFrame({
            "lower": self.edges[:-1], "upper": self.edges[1:], "count": self.counts,
            "accuracy": self.accuracy, "confidence": self.confidence, "low": self.low,
            "high": self.high, "consistency_low": self.consistency_low,
            "consistency_high": self.consistency_high, "enough": self.enough,
        })
        frame.index.name = "bin"
        return frame


def clopper_pearson(k: Any, n: Any, level: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    r"""Exact binomial interval for :math:`k` successes in :math:`n` trials (NaN where
    :math:`n = 0`): the :math:`\alpha/2` quantile of :math:`\mathrm{Beta}(k, n-k+1)` (0 when
    :math:`k = 0`) and the :math:`1-\alpha/2` quantile of :math:`\mathrm{Beta}(k+1, n-k)`
    (1 when :math:`k = n`), :math:`\alpha = 1 -` ``level``."""
    from scipy.stats import beta

    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    alpha = 1 - _level(level)
    with np.errstate(invalid="ignore", divide="ignore"):
        lo = np.where(k > 0, beta.ppf(alpha / 2, np.maximum(k, 1), n - k + 1), 0.0)
        hi = np.where(k < n, beta.ppf(1 - alpha / 2, k + 1, np.maximum(n - k, 1)), 1.0)
    empty = n <= 0
    return np.where(empty, np.nan, lo), np.where(empty, np.nan, hi)


def wilson(k: Any, n: Any, level: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
    r"""Wilson score interval for :math:`k` successes in :math:`n` trials (NaN where
    :math:`n = 0`), :math:`z` the :math:`(1 + \text{level})/2` normal quantile."""
    from scipy.stats import norm

    k, n = np.asarray(k, dtype=np.float64), np.asarray(n, dtype=np.float64)
    z = float(norm.ppf((1 + _level(level)) / 2))
    with np.errstate(invalid="ignore", divide="ignore"):
        a = k / n
        centre = (a + z * z / (2 * n)) / (1 + z * z / n)
        half = z * np.sqrt(a * (1 - a) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return np.clip(centre - half, 0, 1), np.clip(centre + half, 0, 1)


def _level(level: Any) -> float:
    level = check_positive_float(level, "level")
    if level >= 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    return level


def _resampled_bin_means(idx: np.ndarray, n_bins: int, draw: Any, n_boot: int,
                         rng: np.random.Generator) -> np.ndarray:
    """``(n_boot, M)`` per-bin means of ``draw(rng, b) -> (weights (b, N), hits (b, N))``."""
    out = []
    for b0 in range(0, n_boot, _BLOCK):
        b = min(_BLOCK, n_boot - b0)
        weights, hits = draw(rng, b)
        rows = np.repeat(np.arange(b), idx.size) * n_bins + np.tile(idx, b)
        counts = np.bincount(rows, weights=weights.ravel(), minlength=b * n_bins)
        sums = np.bincount(rows, weights=hits.ravel(), minlength=b * n_bins)
        with np.errstate(invalid="ignore", divide="ignore"):
            out.append((sums / counts).reshape(b, n_bins))
    return np.concatenate(out)


def _quantiles(values: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """Central ``level`` range of each column, ignoring NaN (NaN where all are NaN)."""
    lo, hi = np.full(values.shape[1], np.nan), np.full(values.shape[1], np.nan)
    seen = ~np.isnan(values).all(axis=0)
    if seen.any():
        q = np.nanquantile(values[:, seen], [(1 - level) / 2, (1 + level) / 2], axis=0)
        lo[seen], hi[seen] = q
    return lo, hi


def reliability_bands(
    probs: ArrayLike,
    labels: ArrayLike,
    n_bins: int | str = 15,
    binning: str = "uniform",
    *,
    method: str = "clopper-pearson",
    level: float = 0.9,
    min_count: int = 10,
    n_boot: int = 1000,
    seed: int = 0,
    consistency: bool = True,
) -> ReliabilityBands:
    """Per-bin accuracy band (``method``) and consistency band of the top-label confidences.

    The bins are those of :func:`~calnotes.metrics.reliability_bins` (``n_bins="auto"``:
    see :func:`~calnotes.metrics.resolve_n_bins`). The consistency band and
    ``method="bootstrap"`` use ``n_boot`` resamples from ``numpy.random.default_rng(seed)``;
    ``consistency=False`` skips the consistency band (NaN). See the module docstring for
    what each band means.
    """
    method = check_choice(method, "method", BAND_METHODS)
    level = _level(level)
    min_count = check_positive_int(min_count, "min_count", minimum=0)
    n_boot = check_positive_int(n_boot, "n_boot", minimum=2)
    seed = check_positive_int(seed, "seed", minimum=0)
    with torch.no_grad():
        conf_t, correct_t, _, _ = _top_label_checked(probs, labels)
        n_bins = resolve_n_bins(n_bins, conf_t.shape[0])
        binning = check_choice(binning, "binning", ("uniform", "quantile"))
        values = conf_t.detach().unsqueeze(0)
        edges_t = _edges_for(values, n_bins, binning).reshape(-1)
        idx = _bin_index(values, edges_t, binning == "uniform")[0].cpu().numpy()
    conf = conf_t.detach().cpu().double().numpy()
    correct = correct_t.detach().cpu().double().numpy()
    counts = np.bincount(idx, minlength=n_bins)
    hits = np.bincount(idx, weights=correct, minlength=n_bins)
    with np.errstate(invalid="ignore", divide="ignore"):
        accuracy = np.where(counts > 0, hits / counts, np.nan)
        confidence = np.where(counts > 0, np.bincount(idx, weights=conf, minlength=n_bins)
                              / counts, np.nan)
    rng = np.random.default_rng(seed)
    n = conf.size
    if method == "wilson":
        low, high = wilson(hits, counts, level)
        low, high = np.where(counts > 0, low, np.nan), np.where(counts > 0, high, np.nan)
    else:
        low, high = clopper_pearson(hits, counts, level)
    if method == "bootstrap":
        def resample(g: np.random.Generator, b: int) -> tuple[np.ndarray, np.ndarray]:
            w = np.stack([np.bincount(g.integers(0, n, n), minlength=n) for _ in range(b)])
            return w.astype(np.float64), w * correct
        boot_lo, boot_hi = _quantiles(_resampled_bin_means(idx, n_bins, resample, n_boot, rng),
                                      level)
        # all correct (or all wrong): every resample agrees; keep the exact limit there
        low = np.where(hits < counts, boot_lo, low)
        high = np.where(hits > 0, boot_hi, high)

    def consistent(g: np.random.Generator, b: int) -> tuple[np.ndarray, np.ndarray]:
        return np.ones((b, n)), (g.random((b, n)) < conf).astype(np.float64)

    if not isinstance(consistency, bool):
        raise TypeError(f"consistency must be a bool, got {type(consistency).__name__}")
    c_lo = c_hi = np.full(n_bins, np.nan)
    if consistency:
        c_lo, c_hi = _quantiles(_resampled_bin_means(idx, n_bins, consistent, n_boot, rng),
                                level)
    return ReliabilityBands(
        edges=edges_t.detach().cpu().double().numpy(), counts=counts, accuracy=accuracy,
        confidence=confidence, low=low, high=high, consistency_low=c_lo,
        consistency_high=c_hi, enough=counts >= min_count, method=method, level=level)
