r"""Tests of calibration with p-values: Spiegelhalter's z, the kernel calibration error
(SKCE) with its asymptotic and resampling tests, and a binned consistency-resampling test.

Each test treats the predictions as fixed and asks whether the labels could have been drawn
from them. Two views of a prediction :math:`p_i \in \Delta^{C-1}` and label :math:`y_i`:

* ``mode="top-label"``: the confidence :math:`c_i = \max_k p_{ik}` and the indicator
  :math:`r_i = 1[\arg\max_k p_{ik} = y_i]`; the null is :math:`r_i \sim
  \mathrm{Bernoulli}(c_i)`, independently (the top-label calibration that ECE measures);
* ``mode="canonical"`` (SKCE) or ``"positive"`` (Spiegelhalter, binary problems): the
  whole vector, or the positive class; the null is :math:`y_i \sim
  \mathrm{Categorical}(p_i)`, independently (canonical calibration).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from calnotes._checks import (
    ArrayLike,
    check_choice,
    check_positive_float,
    check_positive_int,
)
from calnotes.metrics._common import (
    _bin_index,
    _check_bins,
    _check_draws,
    _edges_for,
    _prepare,
    _top_label_checked,
    resolve_n_bins,
)

SPIEGELHALTER_MODES = ("top-label", "positive")
SKCE_MODES = ("top-label", "canonical")
SKCE_TESTS = ("asymptotic", "bootstrap")
#: The kernel matrix is computed in blocks of rows of about this many differences.
_BLOCK_ELEMENTS = 1 << 22
#: The asymptotic SKCE test estimates the null's eigenvalues on at most this many samples.
SKCE_SPECTRUM_MAX_N = 1000


@dataclass(frozen=True)
class CalibrationTest:
    """A test's ``statistic``, its ``p_value``, the ``null`` hypothesis in words and the
    ``method`` that gave the p-value."""

    statistic: float
    p_value: float
    null: str
    method: str

    def rejects(self, level: float = 0.05) -> bool:
        """``p_value < level``: the labels are unlikely under the null."""
        return self.p_value < level


_TOP_NULL = "r_i ~ Bernoulli(c_i) independently (top-label calibration)"
_CANON_NULL = "y_i ~ Categorical(p_i) independently (canonical calibration)"
_POS_NULL = "y_i ~ Bernoulli(p_i1) independently (binary calibration)"


def _views(probs: Any, labels: Any, mode: str) -> tuple[np.ndarray, np.ndarray, str]:
    """``(p, y, null)``: ``(N,)`` float64 prediction and outcome of the binary views, or
    ``(N, C)`` probabilities and ``(N, C)`` one-hot labels for ``"canonical"``."""
    if mode == "top-label":
        conf, correct, _, _ = _top_label_checked(probs, labels)
        return (conf.detach().cpu().double().numpy(), correct.detach().cpu().double().numpy(),
                _TOP_NULL)
    p, y, _ = _prepare(probs, labels)
    p64, y64 = p.detach().cpu().double().numpy(), y.cpu().numpy()
    if mode == "positive":
        if p64.shape[1] != 2:
            raise ValueError(f"mode='positive' needs a binary problem (probs (N,) or (N, 2)), "
                             f"got {p64.shape[1]} classes")
        return p64[:, 1], (y64 == 1).astype(np.float64), _POS_NULL
    return p64, np.eye(p64.shape[1])[y64], _CANON_NULL


def _two_sided_normal(z: float) -> float:
    return math.erfc(abs(z) / math.sqrt(2)) if math.isfinite(z) else math.nan


def spiegelhalter_test(
    probs: ArrayLike, labels: ArrayLike, mode: str = "top-label"
) -> CalibrationTest:
    r"""Spiegelhalter's (1986) z test of calibration.

    For a prediction :math:`p_i` of a binary outcome :math:`y_i` (``mode="top-label"``:
    :math:`c_i, r_i`; ``"positive"``: :math:`p_{i1}, 1[y_i = 1]` of a binary problem),

    .. math:: Z = \frac{\sum_i (y_i - p_i)(1 - 2p_i)}
                      {\sqrt{\sum_i (1 - 2p_i)^2\, p_i (1 - p_i)}},

    the Brier score minus its expectation under the null, over its standard deviation.
    **Null**: :math:`y_i \sim \mathrm{Bernoulli}(p_i)` independently; then :math:`Z` is
    asymptotically standard normal and the p-value is :math:`2(1 - \Phi(|Z|))`. NaN when
    every :math:`p_i` is 0, 1/2 or 1 (the denominator vanishes).
    """
    mode = check_choice(mode, "mode", SPIEGELHALTER_MODES)
    p, y, null = _views(probs, labels, mode)
    num = float(np.sum((y - p) * (1 - 2 * p)))
    den = float(np.sqrt(np.sum((1 - 2 * p) ** 2 * p * (1 - p))))
    z = num / den if den > 0 else math.nan
    return CalibrationTest(z, _two_sided_normal(z), null, "normal")


# --------------------------------------------------------------------------- SKCE


def _bandwidth(p: np.ndarray, bandwidth: Any) -> float:
    """``bandwidth`` itself, or the median of the pairwise distances of (at most the first
    1,000) predictions, the median heuristic of Widmann et al.; 1 when that median is 0."""
    if bandwidth is not None:
        return check_positive_float(bandwidth, "bandwidth")
    q = p[:1000].reshape(min(len(p), 1000), -1)
    d = np.sqrt(((q[:, None, :] - q[None, :, :]) ** 2).sum(-1))
    med = float(np.median(d[np.triu_indices(len(q), 1)])) if len(q) > 1 else 0.0
    return med if med > 0 else 1.0


def _kernel_rows(p: np.ndarray, rows: slice, nu: float) -> np.ndarray:
    r"""Laplacian kernel :math:`k(p_i, p_j) = \exp(-\|p_i - p_j\|_2 / \nu)` for ``rows``."""
    b = p.reshape(len(p), -1)
    # differences, not |a|^2 + |b|^2 - 2ab: its rounding near 0 is magnified by the root
    d = np.sqrt(((b[rows][:, None, :] - b[None, :, :]) ** 2).sum(-1))
    return np.exp(-d / nu)


def _skce_stat(p: np.ndarray, residual: np.ndarray, nu: float) -> float:
    """``sum_{i != j} k_ij <R_i, R_j> / (n (n - 1))``, the kernel in blocks of rows."""
    n = len(p)
    r = residual.reshape(n, -1)
    total = 0.0
    step = max(1, _BLOCK_ELEMENTS // (n * r.shape[1]))
    for r0 in range(0, n, step):
        rows = slice(r0, min(r0 + step, n))
        total += float(np.sum(_kernel_rows(p, rows, nu) * (r[rows] @ r.T)))
    total -= float(np.sum(r * r))  # the diagonal: k(p_i, p_i) = 1
    return total / (n * (n - 1))


def _skce_setup(probs: Any, labels: Any, mode: str, bandwidth: Any
                ) -> tuple[np.ndarray, np.ndarray, float, str]:
    mode = check_choice(mode, "mode", SKCE_MODES)
    p, y, null = _views(probs, labels, mode)
    if len(p) < 2:
        raise ValueError(f"probs must hold at least 2 samples for the SKCE, got {len(p)}")
    return p, y, _bandwidth(p, bandwidth), null


def skce(
    probs: ArrayLike, labels: ArrayLike, mode: str = "canonical",
    bandwidth: float | None = None,
) -> float:
    r"""Unbiased squared kernel calibration error of Widmann, Lindsten & Zachariah (2019).

    With the matrix-valued kernel :math:`k(p, p') I_C`, :math:`k(p, p') = \exp(-\|p -
    p'\|_2 / \nu)` and the residuals :math:`R_i = e_{y_i} - p_i`,

    .. math:: \widehat{\mathrm{SKCE}}_{uq} = \frac{1}{N(N-1)} \sum_{i \ne j}
              k(p_i, p_j)\, \langle R_i, R_j \rangle,

    an unbiased U-statistic of :math:`\mathrm{SKCE} = E[k(p, p')\langle e_y - p,
    e_{y'} - p' \rangle]`, which is 0 exactly when the model is calibrated (for a
    characteristic kernel). It can be negative. ``mode="top-label"`` uses the scalars
    :math:`c_i` and :math:`R_i = r_i - c_i`. ``bandwidth`` :math:`\nu` defaults to the
    median pairwise distance of the predictions. :math:`O(N^2 C)` time, in blocks of rows.
    """
    p, y, nu, _ = _skce_setup(probs, labels, mode, bandwidth)
    return _skce_stat(p, y - p, nu)


def _null_labels(p: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Labels drawn under the null: Bernoulli(p) for ``(N,)``, one-hot Categorical rows."""
    if p.ndim == 1:
        return (rng.random(len(p)) < p).astype(np.float64)
    u = rng.random((len(p), 1))
    k = (p.cumsum(1) < u).sum(1).clip(max=p.shape[1] - 1)
    return np.eye(p.shape[1])[k]


def skce_test(
    probs: ArrayLike, labels: ArrayLike, mode: str = "canonical", *,
    method: str = "asymptotic", bandwidth: float | None = None, n_boot: int = 1000,
    seed: int = 0,
) -> CalibrationTest:
    r"""Test of calibration by :func:`skce` (Widmann et al. 2019, Section 4).

    **Null**: the labels are drawn from the predictions, :math:`y_i \sim
    \mathrm{Categorical}(p_i)` independently (``mode="top-label"``: :math:`r_i \sim
    \mathrm{Bernoulli}(c_i)`). Large values of the statistic reject it.

    * ``method="asymptotic"``: under the null the U-statistic is degenerate and
      :math:`N\,\widehat{\mathrm{SKCE}}_{uq} \to \sum_j \lambda_j (Z_j^2 - 1)` with
      :math:`Z_j` standard normal and :math:`\lambda_j` the eigenvalues of the kernel
      :math:`h((p,y),(p',y')) = k(p,p')\langle e_y - p, e_{y'} - p'\rangle`; they are
      estimated by the eigenvalues of :math:`H/m` on (a seeded subsample of at most
      ``SKCE_SPECTRUM_MAX_N`` of) the samples, with labels drawn under the null, and
      the p-value by ``n_boot`` draws of the sum.
    * ``method="bootstrap"``: consistency resampling; ``n_boot`` label sets drawn under the
      null with the predictions fixed, the p-value :math:`(1 + \#\{T^* \ge T\})/(1 +
      n_{boot})` (exact for any N, :math:`O(n_{boot} N^2 C)`).
    """
    method = check_choice(method, "method", SKCE_TESTS)
    n_boot = check_positive_int(n_boot, "n_boot")
    seed = check_positive_int(seed, "seed", minimum=0)
    p, y, nu, null = _skce_setup(probs, labels, mode, bandwidth)
    stat = _skce_stat(p, y - p, nu)
    rng = np.random.default_rng(seed)
    n = len(p)
    if method == "bootstrap":
        null_stats = np.array([_skce_stat(p, _null_labels(p, rng) - p, nu)
                               for _ in range(n_boot)])
        p_value = (1 + np.sum(null_stats >= stat)) / (1 + n_boot)
        return CalibrationTest(stat, float(p_value), null, "consistency resampling")
    m = min(n, SKCE_SPECTRUM_MAX_N)
    _check_draws(n_boot, m, "normal draws")  # the (n_boot, m) draws below
    sub = rng.choice(n, m, replace=False) if m < n else np.arange(n)
    ps = p[sub]
    r = (_null_labels(ps, rng) - ps).reshape(m, -1)
    step = max(1, _BLOCK_ELEMENTS // (m * r.shape[1]))
    h = np.concatenate([_kernel_rows(ps, slice(i, i + step), nu) for i in range(0, m, step)])
    h *= r @ r.T
    lam = np.linalg.eigvalsh(h / m)
    draws = (rng.standard_normal((n_boot, m)) ** 2 - 1) @ lam
    p_value = (1 + np.sum(draws >= n * stat)) / (1 + n_boot)
    return CalibrationTest(stat, float(p_value), null, "asymptotic (spectral)")


# --------------------------------------------------------------------------- binned


def consistency_test(
    probs: ArrayLike, labels: ArrayLike, n_bins: int | str = 15, binning: str = "uniform",
    *, n_boot: int = 1000, seed: int = 0, norm: str = "l1",
) -> CalibrationTest:
    r"""Binned consistency-resampling test of top-label calibration (Bröcker & Smith 2007).

    The statistic is the top-label ECE with ``n_bins`` bins (``binning`` as in
    :func:`~calnotes.metrics.ece`; ``norm="max"``: the MCE). **Null**: :math:`r_i \sim
    \mathrm{Bernoulli}(c_i)` independently, the confidences fixed. ``n_boot`` sets of
    :math:`r^*` are drawn under the null (``numpy.random.default_rng(seed)``), the ECE
    recomputed on the same bins, and the p-value is
    :math:`(1 + \#\{\mathrm{ECE}^* \ge \mathrm{ECE}\})/(1 + n_{boot})`, exact at any N.
    It accounts for the upward bias of the binned ECE that a comparison with 0 ignores.
    """
    n_bins, binning = _check_bins(n_bins, binning)
    n_boot = check_positive_int(n_boot, "n_boot")
    seed = check_positive_int(seed, "seed", minimum=0)
    norm = check_choice(norm, "norm", ("l1", "max"))
    with torch.no_grad():
        conf_t, correct_t, _, _ = _top_label_checked(probs, labels)
        n_bins = resolve_n_bins(n_bins, conf_t.shape[0])
        values = conf_t.detach().unsqueeze(0)
        edges = _edges_for(values, n_bins, binning).reshape(-1)
        idx = _bin_index(values, edges, binning == "uniform")[0].cpu().numpy()
    c = conf_t.detach().cpu().double().numpy()
    r = correct_t.detach().cpu().double().numpy()
    n = c.size
    sum_c = np.bincount(idx, weights=c, minlength=n_bins)
    counts = np.maximum(np.bincount(idx, minlength=n_bins), 1)  # empty bins add 0

    def ece_of(hits: np.ndarray) -> np.ndarray:
        if norm == "max":
            return (np.abs(hits - sum_c) / counts).max(-1)
        return np.abs(hits - sum_c).sum(-1) / n

    stat = float(ece_of(np.bincount(idx, weights=r, minlength=n_bins)))
    rng = np.random.default_rng(seed)
    null_stats = []
    for b0 in range(0, n_boot, 64):
        b = min(64, n_boot - b0)
        draws = (rng.random((b, n)) < c).astype(np.float64)
        rows = (np.arange(b)[:, None] * n_bins + idx[None, :]).ravel()
        hits = np.bincount(rows, weights=draws.ravel(), minlength=b * n_bins)
        null_stats.append(ece_of(hits.reshape(b, n_bins)))
    # the same arithmetic on the same bins gives the null values: ties are exact
    p_value = (1 + np.sum(np.concatenate(null_stats) >= stat)) / (1 + n_boot)
    return CalibrationTest(stat, float(p_value), _TOP_NULL, "consistency resampling")
