"""Intervals, detectable effects and verdicts for claims about an effect.

Every interval is two-sided at ``level`` (default 95%). For a Student-t design with
standard error ``se`` and ``df`` degrees of freedom the interval is
``estimate ± t_{(1+level)/2, df} se`` and the smallest effect it detects with probability
``power`` (two-sided test at ``1 - level``) is

    detectable = (t_{(1+level)/2, df} + t_{power, df}) se,

the usual approximation to the noncentral-t power (it errs by a few percent at df >= 2;
``tests/test_stats.py`` pins it against a simulation). For a bootstrap the same formula
uses normal quantiles and the bootstrap standard error.

Verdicts read an interval ``[low, high]`` of an effect whose claimed side is ``direction``
(``"below"`` or ``"above"`` the value ``null``), beside the effect ``paper`` the work
reports, if any (:data:`VERDICTS`):

- ``reproduces``: the interval lies on the claimed side and contains ``paper``;
- ``reproduces, smaller than reported`` / ``larger than reported``: on the claimed side,
  with ``paper`` beyond the interval's far end / between the interval and ``null``;
- ``does not reproduce``: the interval lies wholly on the other side;
- ``inconclusive``: the interval contains ``null``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as _st

__all__ = [
    "Effect", "SampleSize", "VERDICTS", "bootstrap_effect", "detectable_effect",
    "detectable_effect_t", "one_sample_effect", "paired_effect", "power_t", "seeds_for_power",
    "verdict", "welch_effect",
]

REPRODUCES = "reproduces"
SMALLER = "reproduces, smaller than reported"
LARGER = "reproduces, larger than reported"
FAILS = "does not reproduce"
INCONCLUSIVE = "inconclusive"
PREMISE_FAILS = "premise fails here"
NOT_TESTABLE = "not testable at this scale"
#: The fixed vocabulary of verdicts, in the order tables sort them.
VERDICTS = (REPRODUCES, SMALLER, LARGER, INCONCLUSIVE, FAILS, PREMISE_FAILS, NOT_TESTABLE)


@dataclass(frozen=True)
class Effect:
    """An estimated effect with its interval: ``design`` says how it was obtained, ``n``
    the replicates (seeds, draws or test samples), ``detectable`` the smallest effect the
    design detects at 80% power (``nan`` where undefined, e.g. one seed)."""

    estimate: float
    low: float
    high: float
    n: int
    design: str
    se: float = math.nan
    detectable: float = math.nan

    def scaled(self, factor: float) -> Effect:
        """The same effect in other units (``factor`` > 0)."""
        if not factor > 0:
            raise ValueError(f"factor must be positive, got {factor}")
        return Effect(self.estimate * factor, self.low * factor, self.high * factor, self.n,
                      self.design, self.se * factor, self.detectable * factor)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sample(values: Any, name: str) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {x.shape}")
    if x.size == 0:
        raise ValueError(f"{name} must not be empty")
    if not np.isfinite(x).all():
        raise ValueError(f"{name} contains NaN or inf")
    return x


def _check_level(level: float, power: float = 0.8) -> None:
    if not 0 < level < 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    if not 0 < power < 1:
        raise ValueError(f"power must lie in (0, 1), got {power}")


def detectable_effect(se: float, df: float | None, level: float = 0.95,
                      power: float = 0.8) -> float:
    """``(q_{(1+level)/2} + q_{power}) se`` with Student-t quantiles at ``df`` degrees of
    freedom, or normal ones when ``df`` is None (bootstrap)."""
    _check_level(level, power)
    if not math.isfinite(se) or (df is not None and not df > 0):
        return math.nan
    dist = _st.norm if df is None else _st.t(df)
    return float((dist.ppf((1 + level) / 2) + dist.ppf(power)) * se)


# --- exact power of the one-sample / paired t test (noncentral t) ----------------------

def _check_power_args(sd: float, n: int, alpha: float, sides: int) -> None:
    if isinstance(sd, bool) or not isinstance(sd, (int, float)) or not (
            math.isfinite(sd) and sd > 0):
        raise ValueError(f"sd must be a finite positive number, got {sd!r}")
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 2:
        raise ValueError(f"n must be an int of at least 2, got {n!r}")
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie in (0, 1), got {alpha}")
    if sides not in (1, 2):
        raise ValueError(f"sides must be 1 or 2, got {sides!r}")


def power_t(effect: float, sd: float, n: int, alpha: float, sides: int = 2) -> float:
    """Exact power of the t test of ``n`` differences (paired or one sample) with standard
    deviation ``sd`` when the true mean difference is ``effect``:

        df = n - 1,  λ = effect √n / sd,  c = t_{1-α/sides, df},
        power = P(T'_{df,λ} > c) + [sides = 2] P(T'_{df,λ} < -c),

    with ``T'`` noncentral t. One-sided (``sides=1``) tests the side of a positive
    ``effect``."""
    _check_power_args(sd, n, alpha, sides)
    if not math.isfinite(effect):
        raise ValueError(f"effect must be finite, got {effect!r}")
    df, ncp = n - 1, effect * math.sqrt(n) / sd
    c = float(_st.t.ppf(1 - alpha / sides, df))
    power = float(_st.nct.sf(c, df, ncp))
    if sides == 2:
        power += float(_st.nct.cdf(-c, df, ncp))
    return min(max(power, 0.0), 1.0)


@dataclass(frozen=True)
class SampleSize:
    """The smallest ``n`` reaching the asked power (``reached``), or ``max_n`` where no
    ``n`` up to it does (``reached`` False); ``power`` is the power at ``n``."""

    n: int
    power: float
    reached: bool


def seeds_for_power(effect: float, sd: float, alpha: float, power: float = 0.8,
                    sides: int = 2, max_n: int = 200) -> SampleSize:
    """Smallest number of paired seeds ``n >= 2`` whose t test (:func:`power_t`) detects
    ``effect`` with probability at least ``power``."""
    if not 0 < power < 1:
        raise ValueError(f"power must lie in (0, 1), got {power}")
    if isinstance(max_n, bool) or not isinstance(max_n, int) or max_n < 2:
        raise ValueError(f"max_n must be an int of at least 2, got {max_n!r}")
    _check_power_args(sd, 2, alpha, sides)
    if effect == 0 or not math.isfinite(effect):
        raise ValueError(f"effect must be finite and non-zero, got {effect!r}")
    for n in range(2, max_n + 1):  # power grows with n: the first n reaching it is smallest
        p = power_t(effect, sd, n, alpha, sides)
        if p >= power:
            return SampleSize(n, p, True)
    return SampleSize(max_n, p, False)


def detectable_effect_t(sd: float, n: int, alpha: float, power: float = 0.8,
                        sides: int = 2) -> float:
    """The effect ``δ > 0`` that the t test of ``n`` differences with standard deviation
    ``sd`` detects with probability ``power``: the root of ``power_t(δ, sd, n, alpha) =
    power`` (exact, unlike :func:`detectable_effect`'s ``(t + t) se``)."""
    _check_power_args(sd, n, alpha, sides)
    if not 0 < power < 1:
        raise ValueError(f"power must lie in (0, 1), got {power}")
    if power <= alpha / sides:
        raise ValueError(f"power must exceed alpha / sides = {alpha / sides}, got {power}")
    hi = sd
    while power_t(hi, sd, n, alpha, sides) < power:
        hi *= 2
    from scipy.optimize import brentq

    return float(brentq(lambda d: power_t(d, sd, n, alpha, sides) - power, 0.0, hi,
                        xtol=1e-12 * sd, rtol=1e-12))


def _t_effect(estimate: float, se: float, df: float, n: int, design: str,
              level: float) -> Effect:
    if n < 2 or not se >= 0:
        return Effect(estimate, math.nan, math.nan, n, design)
    half = float(_st.t.ppf((1 + level) / 2, df)) * se
    return Effect(estimate, estimate - half, estimate + half, n, design, se,
                  detectable_effect(se, df, level))


def one_sample_effect(values: Any, level: float = 0.95, design: str = "one-sample t") -> Effect:
    """Mean of ``values`` with its Student-t interval (n - 1 degrees of freedom)."""
    _check_level(level)
    x = _sample(values, "values")
    n = x.size
    se = float(x.std(ddof=1) / math.sqrt(n)) if n > 1 else math.nan
    return _t_effect(float(x.mean()), se, n - 1, n, design, level)


def paired_effect(a: Any, b: Any, level: float = 0.95) -> Effect:
    """Mean of the paired differences ``a - b`` (e.g. two methods on the same seeds)."""
    x, y = _sample(a, "a"), _sample(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"a and b must pair one to one, got {x.size} and {y.size} values")
    return one_sample_effect(x - y, level, design="paired t")


def welch_effect(a: Any, b: Any, level: float = 0.95) -> Effect:
    """``mean(a) - mean(b)`` with Welch's interval (unpaired, unequal variances;
    Welch-Satterthwaite degrees of freedom)."""
    _check_level(level)
    x, y = _sample(a, "a"), _sample(b, "b")
    estimate = float(x.mean() - y.mean())
    if x.size < 2 or y.size < 2:
        return Effect(estimate, math.nan, math.nan, min(x.size, y.size), "Welch")
    va, vb = x.var(ddof=1) / x.size, y.var(ddof=1) / y.size
    se = math.sqrt(va + vb)
    if se == 0:
        df = float(x.size + y.size - 2)
    else:
        df = (va + vb) ** 2 / (va**2 / (x.size - 1) + vb**2 / (y.size - 1))
    return _t_effect(estimate, se, df, min(x.size, y.size), "Welch", level)


def bootstrap_effect(estimate: float, replicates: Any, n: int, level: float = 0.95) -> Effect:
    """Percentile interval of bootstrap ``replicates`` around ``estimate`` (the statistic on
    the full sample); ``n`` is the number of resampled units (e.g. test samples)."""
    _check_level(level)
    r = _sample(replicates, "replicates")
    if r.size < 2:
        raise ValueError(f"replicates must hold at least 2 values, got {r.size}")
    low, high = np.quantile(r, [(1 - level) / 2, (1 + level) / 2])
    se = float(r.std(ddof=1))
    return Effect(float(estimate), float(low), float(high), int(n), "bootstrap", se,
                  detectable_effect(se, None, level))


def verdict(low: float, high: float, direction: str, null: float = 0.0,
            paper: float | None = None) -> str:
    """The verdict the interval ``[low, high]`` gives a claim that the effect lies
    ``direction`` (``"below"`` or ``"above"``) ``null``; see the module docstring."""
    if direction not in ("below", "above"):
        raise ValueError(f"direction must be 'below' or 'above', got {direction!r}")
    if math.isnan(low) or math.isnan(high):
        return INCONCLUSIVE
    if not low <= high:
        raise ValueError(f"need low <= high, got [{low}, {high}]")
    sign = 1.0 if direction == "above" else -1.0
    # Mirror onto the claim "effect above null": lo, hi in claimed-side coordinates.
    lo, hi = sorted((sign * (low - null), sign * (high - null)))
    if lo > 0:
        if paper is None or math.isnan(paper):
            return REPRODUCES
        p = sign * (paper - null)
        if p > hi:
            return SMALLER
        if p < lo:
            return LARGER
        return REPRODUCES
    if hi < 0:
        return FAILS
    return INCONCLUSIVE
