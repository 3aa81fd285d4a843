"""Intervals: bootstrap over test samples, t intervals over training seeds."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from calnotes._checks import (
    ArrayLike,
    check_choice,
    check_labels,
    check_positive_float,
    check_positive_int,
    check_probs,
)
from calnotes.metrics._common import (  # the bootstrap's limits, kept importable here
    MAX_BOOT,  # noqa: F401
    MAX_BOOT_DRAWS,  # noqa: F401
    _bin_index,
    _calibration_error,
    _check_draws,
    _top_label_checked,
    _uniform_edges,
    resolve_n_bins,
)
from calnotes.metrics.calibration_tests import consistency_test
from calnotes.metrics.summary import _metric_function

# --------------------------------------------------------------------------- bootstrap


class _Interval:
    """What an interval ``estimate [low, high]`` says and how it prints (for dataclasses
    with those fields)."""

    estimate: float
    low: float
    high: float

    def contains(self, value: float) -> bool:
        """``low <= value <= high``."""
        return self.low <= value <= self.high

    def __format__(self, spec: str) -> str:
        return f"{self.estimate:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


@dataclass(frozen=True)
class BootstrapInterval(_Interval):
    """A statistic of the test samples and its percentile bootstrap interval.

    ``estimate`` is the statistic on all N samples; ``low`` and ``high`` are the
    ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the statistic over ``n_boot``
    resamples of the N samples. ``format(iv, ".2f")`` (or an f-string) writes
    ``"1.23 [0.98, 1.50]"``; :meth:`scaled` multiplies all three (e.g. by 100 for percent).
    """

    estimate: float
    low: float
    high: float
    level: float
    n_boot: int

    def scaled(self, factor: float) -> BootstrapInterval:
        """The same interval with ``estimate``, ``low`` and ``high`` times ``factor`` > 0."""
        factor = check_positive_float(factor, "factor")
        return BootstrapInterval(self.estimate * factor, self.low * factor,
                                 self.high * factor, self.level, self.n_boot)


@dataclass(frozen=True)
class SeedInterval(_Interval):
    """A mean over training seeds (or a difference of two such means) and its t interval.

    ``format(iv, ".2f")`` writes ``"1.23 [0.98, 1.50]"``; :meth:`excludes` says whether the
    interval lies wholly on one side of a value (e.g. 0 for a difference: the two means
    differ beyond the seed spread).
    """

    estimate: float
    low: float
    high: float
    level: float
    dof: float

    def excludes(self, value: float) -> bool:
        """``value`` lies outside ``[low, high]``."""
        return not self.contains(value)


def _seed_values(x: Any, name: str) -> np.ndarray:
    values = np.asarray(x, dtype=np.float64).ravel()
    if values.size < 2 or not np.isfinite(values).all():
        raise ValueError(f"{name} must hold at least 2 finite values (one per seed), got "
                         f"{values.size}")
    return values


def seed_interval(a: Any, b: Any = None, level: float = 0.95) -> SeedInterval:
    r"""Student-t interval of the mean of per-seed values ``a``, or (with ``b``) Welch's
    interval of the difference of means :math:`\bar a - \bar b`.

    With :math:`s^2` the sample variances (``ddof=1``) and :math:`n` the seed counts, the
    standard error of the difference is :math:`\sqrt{s_a^2/n_a + s_b^2/n_b}` and its
    degrees of freedom Welch-Satterthwaite's; the interval is the estimate :math:`\pm\,
    t_{(1+\text{level})/2,\,\nu}` standard errors. With three seeds per arm :math:`t`
    is about 2.8 to 4.3, so only a difference several seed spreads wide excludes 0.
    Training seeds, not test samples, are the unit here (compare :func:`bootstrap_interval`).
    """
    from scipy.stats import t as student_t

    level = check_positive_float(level, "level")
    if level >= 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    va = _seed_values(a, "a")
    if b is None:
        estimate, var, dof = va.mean(), va.var(ddof=1) / va.size, va.size - 1.0
    else:
        vb = _seed_values(b, "b")
        qa, qb = va.var(ddof=1) / va.size, vb.var(ddof=1) / vb.size
        estimate, var = va.mean() - vb.mean(), qa + qb
        dof = (var**2 / (qa**2 / (va.size - 1) + qb**2 / (vb.size - 1))
               if var > 0 else va.size + vb.size - 2.0)
    half = float(student_t.ppf((1 + level) / 2, dof)) * math.sqrt(var)
    return SeedInterval(float(estimate), float(estimate - half), float(estimate + half),
                        level, float(dof))


#: How :func:`bootstrap_interval` turns resampled values into an interval.
INTERVAL_METHODS = ("percentile", "debiased")
#: Metrics that :func:`bootstrap_interval` computes from resampled per-bin sums.
_TOP_LABEL_BOOTSTRAP = ("ece", "mce", "error")
#: Resamples per block of the per-bin sums (a block holds ``block x N`` counts).
_BOOT_BLOCK = 64


def _resampled_top_label(metric: str, probs: Any, labels: Any, n_bins: int,
                         draws: np.ndarray) -> np.ndarray:
    """``metric`` ("ece", "mce" or "error") on each resample, from per-bin sums.

    ``draws (B, N)`` holds the resampled indices. A resample is a count ``w_i`` of each
    sample, so its per-bin sums are ``sum_i w_i [bin_i = m] (1, c_i, r_i)``: one product of
    the ``(B, N)`` counts with the samples' bin indicators, instead of B metric calls. The
    bins are those of :func:`ece` (the same index function on the same confidences, in
    their own dtype); the sums are float64.
    """
    conf, correct, _, _ = _top_label_checked(probs, labels)
    n_bins = resolve_n_bins(n_bins, conf.shape[0])
    edges = _uniform_edges(n_bins, conf.dtype, conf.device)
    bins = _bin_index(conf.detach()[None], edges, uniform=True)[0].cpu()
    conf, correct = conf.detach().cpu().double(), correct.detach().cpu().double()
    n = conf.shape[0]
    out = []
    if metric != "error":
        onehot = F.one_hot(bins, n_bins).double()
        columns = torch.cat([onehot, onehot * conf[:, None], onehot * correct[:, None]], dim=1)
    for b0 in range(0, draws.shape[0], _BOOT_BLOCK):
        block = draws[b0 : b0 + _BOOT_BLOCK]
        rows = np.arange(block.shape[0])[:, None]
        weights = torch.from_numpy(
            np.bincount((block + n * rows).ravel(), minlength=block.size).reshape(block.shape)
        ).double()
        if metric == "error":
            out.append(1.0 - (weights @ correct) / n)
            continue
        counts, sum_v, sum_t = (weights @ columns).split(n_bins, dim=1)
        out.append(_calibration_error(counts, sum_v, sum_t, "l1" if metric == "ece" else "max"))
    return torch.cat(out).numpy()


def _from_resamples(estimate: float, resampled: np.ndarray, level: float,
                    method: str) -> tuple[float, float]:
    """``(low, high)`` of :func:`bootstrap_interval` from the statistic on the data and on
    the resamples (without the consistency test of ECE and MCE)."""
    low, high = np.quantile(resampled, [(1 - level) / 2, (1 + level) / 2])
    if method == "debiased":
        bias = float(resampled.mean()) - estimate
        low, high = min(low - bias, estimate), max(high - bias, estimate)
        if (resampled >= 0).all() and estimate >= 0:
            low = max(low, 0.0)
    return float(low), float(high)


def interval_from_resamples(estimate: float, resampled: Any, level: float = 0.95,
                            method: str = "percentile", n_boot: int | None = None
                            ) -> BootstrapInterval:
    """A :class:`BootstrapInterval` of ``estimate`` from its values on resamples that the
    caller drew (several statistics of one set of resamples), by ``method`` as in
    :func:`bootstrap_interval`."""
    method = check_choice(method, "method", INTERVAL_METHODS)
    level = check_positive_float(level, "level")
    if level >= 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    values = np.asarray(resampled, dtype=np.float64).ravel()
    if values.size < 2 or not np.isfinite(values).all():
        raise ValueError(f"resampled must hold at least 2 finite values, got {values.size}")
    low, high = _from_resamples(float(estimate), values, level, method)
    return BootstrapInterval(float(estimate), low, high, level,
                             values.size if n_boot is None else n_boot)


def bootstrap_interval(
    metric: str | Any,
    probs: ArrayLike,
    labels: ArrayLike,
    baseline: ArrayLike | None = None,
    *,
    relative: bool = False,
    n_bins: int = 15,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    method: str = "percentile",
) -> BootstrapInterval:
    r"""Percentile bootstrap interval of a metric, or of a difference of two predictions'
    metrics on the same samples.

    ``metric`` is a name of :data:`REPORT_METRICS` (the binned ones use ``n_bins``
    equal-width bins) or a callable ``f(probs, labels) -> number``, which gets resampled
    rows of the arrays it was given (numpy arrays stay numpy). The statistic is

    * :math:`f(P)` without ``baseline``;
    * :math:`f(P) - f(Q)` with ``baseline`` :math:`Q` (predictions of another method for the
      same samples, e.g. the uncalibrated model), paired: each resample draws the same
      samples for both, so noise common to both cancels;
    * :math:`(f(P) - f(Q)) / f(Q)` with ``relative=True`` (-0.2 is 20% lower).

    Each of ``n_boot`` resamples draws N of the N samples with replacement
    (``numpy.random.default_rng(seed)``: the same seed gives the same resamples, whatever
    the metric), and the interval is the central ``level`` range of the statistic over the
    resamples (linear interpolation between order statistics). ``"ece"``, ``"mce"`` and
    ``"error"`` are computed for all resamples at once from per-bin sums (equal to a call
    of the metric per resample up to float64 summation order); other metrics are called
    once per resample. The interval measures the noise of a finite test set only: the
    model and any calibrator stay fixed, so it says nothing about another training seed
    or validation split.

    ``method="debiased"`` shifts the interval by the bootstrap estimate of the statistic's
    bias, :math:`[q_{lo} - \hat b, q_{hi} - \hat b]` with :math:`\hat b = \overline{T^*} -
    T`, widens it to contain the estimate :math:`T` if it does not, and clips it at 0 when the
    statistic is non-negative on every resample. Binned calibration errors are biased
    upward, and resampling adds the same bias again: a percentile interval of the ECE of a
    well-calibrated model can lie wholly above its own estimate, a debiased one cannot.
    For ``"ece"`` and ``"mce"`` without a baseline, ``low`` is 0 when
    :func:`~calnotes.metrics.consistency_test` does not reject perfect calibration at
    :math:`(1 - \text{level})/2`: near 0 the shifted interval still misses the truth (the
    bias of a binned error is largest there), while the test holds its level.
    """
    f = _metric_function(metric, n_bins)
    method = check_choice(method, "method", INTERVAL_METHODS)
    if not isinstance(relative, bool):
        raise TypeError(f"relative must be a bool, got {type(relative).__name__}")
    if relative and baseline is None:
        raise ValueError("relative=True needs a baseline to compare with")
    n_boot = check_positive_int(n_boot, "n_boot", minimum=2)
    level = check_positive_float(level, "level")
    if level >= 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    seed = check_positive_int(seed, "seed", minimum=0)
    p, _ = check_probs(probs, "probs")
    check_labels(labels, p.shape[0], p.shape[1], "labels")
    models = [probs]
    if baseline is not None:
        q, _ = check_probs(baseline, "baseline")
        if q.shape != p.shape:
            raise ValueError(f"baseline has shape {tuple(q.shape)} but probs has "
                             f"{tuple(p.shape)}; both must hold the same samples")
        models.append(baseline)

    def rows(x: Any, index: np.ndarray) -> Any:
        """The resampled rows of ``x``, in the kind (and on the device) it came in."""
        if isinstance(x, torch.Tensor):
            return x[torch.from_numpy(index).to(x.device)]
        return x[index]

    n = p.shape[0]
    _check_draws(n_boot, n)
    rng = np.random.default_rng(seed)
    draws = np.stack([rng.integers(0, n, n) for _ in range(n_boot)])
    with torch.no_grad():
        estimates = np.array([float(f(m, labels)) for m in models])
        if isinstance(metric, str) and metric in _TOP_LABEL_BOOTSTRAP:
            values = np.stack([_resampled_top_label(metric, m, labels, n_bins, draws)
                               for m in models], axis=1)
        else:
            values = np.array([[float(f(rows(m, i), rows(labels, i))) for m in models]
                               for i in draws])

    def statistic(v: np.ndarray) -> np.ndarray:
        """Rows of per-model values -> the statistic of each row."""
        if baseline is None:
            return v[..., 0]
        if relative and (v[..., 1] == 0).any():
            raise ValueError("the baseline's metric is 0 on the samples or on a resample: "
                             "a relative change is undefined there")
        diff = v[..., 0] - v[..., 1]
        return diff / v[..., 1] if relative else diff

    resampled, estimate = statistic(values), float(statistic(estimates))
    low, high = _from_resamples(estimate, resampled, level, method)
    if method == "debiased":
        if baseline is None and isinstance(metric, str) and metric in ("ece", "mce"):
            test = consistency_test(probs, labels, n_bins, n_boot=n_boot, seed=seed,
                                    norm="l1" if metric == "ece" else "max")
            if test.p_value > (1 - level) / 2:  # consistent with perfect calibration
                low = 0.0
    return BootstrapInterval(estimate, float(low), float(high), level,
                             n_boot)


def bootstrap(
    metric: str | Any,
    probs: ArrayLike,
    labels: ArrayLike,
    *,
    baseline: ArrayLike | None = None,
    relative: bool = False,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
    method: str = "percentile",
    **metric_kwargs: Any,
) -> BootstrapInterval:
    r"""Percentile bootstrap interval of any metric over the test samples.

    ``metric`` is a name of :data:`~calnotes.metrics.summary.METRICS` (``"ece"``,
    ``"smece"``, ``"debiased_l2_ce"``, ``"aurc"``, ...) or a callable
    ``f(probs, labels, **metric_kwargs) -> number``;
    ``metric_kwargs`` (``n_bins=10``, ``bandwidth=0.05``, ``mode="marginal"``, ...) are
    passed to it on every resample. As :func:`bootstrap_interval`: the estimate is the
    metric on all N samples and the interval the central ``level`` range of its values on
    ``n_boot`` resamples of N of the N samples drawn with replacement
    (``numpy.random.default_rng(seed)``); with ``baseline`` the statistic is the paired
    difference :math:`f(P) - f(Q)` (``relative=True``: :math:`(f(P) - f(Q)) / f(Q)`).
    ``method`` (``"percentile"`` or ``"debiased"``) as in :func:`bootstrap_interval`.
    """
    fast = (isinstance(metric, str) and metric in _TOP_LABEL_BOOTSTRAP
            and set(metric_kwargs) <= {"n_bins"})
    if fast:
        return bootstrap_interval(metric, probs, labels, baseline, relative=relative,
                                  n_bins=metric_kwargs.get("n_bins", 15), n_boot=n_boot,
                                  level=level, seed=seed, method=method)
    f = _metric_function(metric, **metric_kwargs)
    return bootstrap_interval(f, probs, labels, baseline, relative=relative, n_boot=n_boot,
                              level=level, seed=seed, method=method)
