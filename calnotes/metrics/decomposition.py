r"""The CORP decomposition of a proper score and the CORP reliability curve (Dimitriadis,
Gneiting & Jordan 2021).

For forecasts :math:`x_i \in [0, 1]` of binary outcomes :math:`y_i`, the CORP
(consistent, optimally binned, reproducible, PAV-based) recalibration :math:`\hat x_i` is the
isotonic (non-decreasing) least-squares fit of :math:`y` on :math:`x`, computed by the
pool-adjacent-violators algorithm with equal forecasts pooled first (so :math:`\hat x` is a
function of :math:`x`). With :math:`\bar S(z) = \frac1N \sum_i s(z_i, y_i)` the mean score
and :math:`\bar y` the base rate,

.. math:: \mathrm{MCB} = \bar S(x) - \bar S(\hat x), \quad
          \mathrm{DSC} = \bar S(\bar y) - \bar S(\hat x), \quad
          \mathrm{UNC} = \bar S(\bar y), \qquad
          \bar S(x) = \mathrm{MCB} - \mathrm{DSC} + \mathrm{UNC}

exactly. The isotonic fit minimises every proper score among monotone recalibrations at
once, so MCB and DSC are non-negative for both the Brier score :math:`(x - y)^2` and the
log score :math:`-y \log x - (1 - y) \log(1 - x)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.special import xlogy

from calnotes._checks import ArrayLike, check_choice, check_positive_float, check_positive_int
from calnotes.metrics._common import _prepare, _top_label_checked

SCORES = ("brier", "log")
DECOMPOSITION_MODES = ("top-label", "classwise")


def pav(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    r"""Isotonic least-squares fit of ``y`` on ``x`` (both ``(N,)``), equal ``x`` pooled
    first; returns the fitted value of each sample (in the input order)."""
    from sklearn.isotonic import isotonic_regression

    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    ux, inverse, counts = np.unique(x, return_inverse=True, return_counts=True)
    means = np.bincount(inverse, weights=y, minlength=ux.size) / counts
    fitted = isotonic_regression(means, sample_weight=counts.astype(np.float64))
    return np.clip(fitted, 0.0, 1.0)[inverse]


def _mean_score(x: np.ndarray, y: np.ndarray, score: str) -> float:
    if score == "brier":
        return float(np.mean((x - y) ** 2))
    return float(np.mean(-xlogy(y, x) - xlogy(1 - y, 1 - x)))


@dataclass(frozen=True)
class ScoreDecomposition:
    """``score = miscalibration - discrimination + uncertainty`` (mean scores, lower is
    better) of ``score_name`` in ``mode``."""

    score: float
    miscalibration: float
    discrimination: float
    uncertainty: float
    score_name: str
    mode: str


def _binary(x: np.ndarray, y: np.ndarray, score: str) -> tuple[float, float, float, float]:
    fit = pav(x, y)
    base = np.full_like(y, y.mean())
    s_x, s_fit, s_base = (_mean_score(v, y, score) for v in (x, fit, base))
    return s_x, s_x - s_fit, s_base - s_fit, s_base


def score_decomposition(
    probs: ArrayLike, labels: ArrayLike, score: str = "brier", mode: str = "top-label"
) -> ScoreDecomposition:
    r"""CORP decomposition of the Brier or log score into miscalibration (MCB),
    discrimination (DSC) and uncertainty (UNC): :math:`\bar S = \mathrm{MCB} - \mathrm{DSC}
    + \mathrm{UNC}` (module docstring).

    ``mode="top-label"`` decomposes the score of the confidences :math:`c_i` as forecasts
    of correctness :math:`r_i` (the MCB is the score's version of the ECE);
    ``"classwise"`` sums the decompositions of the one-vs-rest forecasts :math:`p_{ik}` of
    :math:`1[y_i = k]` over the classes (for the Brier score their sum is the multiclass
    Brier score of :func:`~calnotes.metrics.brier`). The log score of a forecast of 0 or 1
    that turns out wrong is infinite, and so is its MCB. Computed in float64.
    """
    score = check_choice(score, "score", SCORES)
    mode = check_choice(mode, "mode", DECOMPOSITION_MODES)
    if mode == "top-label":
        conf, correct, _, _ = _top_label_checked(probs, labels)
        parts = _binary(conf.detach().cpu().double().numpy(),
                        correct.detach().cpu().double().numpy(), score)
    else:
        p, y, _ = _prepare(probs, labels)
        p64, y64 = p.detach().cpu().double().numpy(), y.cpu().numpy()
        per_class = [_binary(p64[:, k], (y64 == k).astype(np.float64), score)
                     for k in range(p64.shape[1])]
        s_x, mcb, dsc, unc = (float(sum(v)) for v in zip(*per_class, strict=True))
        parts = (s_x, mcb, dsc, unc)
    return ScoreDecomposition(*parts, score_name=score, mode=mode)


@dataclass(frozen=True)
class CorpCurve:
    """The CORP reliability curve of the confidences: at each distinct confidence ``x`` the
    isotonic recalibration ``fitted`` and the ``level`` consistency band ``low``/``high``
    (where the fit falls when the model is calibrated)."""

    x: np.ndarray
    fitted: np.ndarray
    low: np.ndarray
    high: np.ndarray
    level: float


def corp_curve(
    probs: ArrayLike, labels: ArrayLike, *, level: float = 0.9, n_boot: int = 200,
    seed: int = 0,
) -> CorpCurve:
    r"""CORP reliability curve of the top-label confidence: the PAV fit of correctness on
    confidence at each distinct confidence, with a consistency band from ``n_boot`` sets of
    :math:`r_i^* \sim \mathrm{Bernoulli}(c_i)` refitted (``numpy.random.default_rng(seed)``),
    their central ``level`` range at each confidence.
    """
    level = check_positive_float(level, "level")
    if level >= 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    n_boot = check_positive_int(n_boot, "n_boot", minimum=2)
    seed = check_positive_int(seed, "seed", minimum=0)
    conf_t, correct_t, _, _ = _top_label_checked(probs, labels)
    c = conf_t.detach().cpu().double().numpy()
    r = correct_t.detach().cpu().double().numpy()
    ux, first = np.unique(c, return_index=True)
    fitted = pav(c, r)[first]
    rng = np.random.default_rng(seed)
    refits = np.stack([pav(c, (rng.random(c.size) < c).astype(np.float64))[first]
                       for _ in range(n_boot)])
    low, high = np.quantile(refits, [(1 - level) / 2, (1 + level) / 2], axis=0)
    return CorpCurve(ux, fitted, low, high, level)
