"""Intervals, detectable effects and verdicts for claims about an effect.

Every interval is two-sided at ``level`` (default 95%). For a Student-t design with
standard error ``se`` and ``df`` degrees of freedom the interval is
``estimate ± t_{(1+level)/2, df} se`` and the smallest effect it detects with probability
``power`` (two-sided test at ``1 - level``) is

    detectable = (t_{(1+level)/2, df} + t_{power, df}) se,

the usual approximation to the noncentral-t power (at df = 2 it gives 76.6% power, not
80%). The Student-t designs report instead the exact detectable effect, the root of the
noncentral-t power (:func:`power_t`), from the *observed* standard error (post hoc). For a
bootstrap the approximation uses normal quantiles and the bootstrap standard error.

Verdicts read an interval ``[low, high]`` of an effect whose claimed side is ``direction``
(``"below"`` or ``"above"`` the value ``null``), beside the effect ``paper`` the work
reports, if any (:data:`VERDICTS`):

- ``reproduces``: the interval lies on the claimed side and contains ``paper``;
- ``reproduces, larger than reported``: on the claimed side, with ``paper`` between the
  interval and ``null``;
- ``direction reproduces; reported size ruled out``: on the claimed side, with ``paper``
  beyond the interval's far end;
- ``reported size ruled out``: the interval contains ``null`` but excludes ``paper``;
- ``does not reproduce``: the interval lies wholly on the other side;
- ``inconclusive``: the interval contains ``null`` (and ``paper``, if any).

Multiplicity: :func:`p_value` gives a two-sided p-value against ``null`` from an effect's
design; :func:`holm` and :func:`benjamini_hochberg` adjust a family of them, and
:func:`adjusted_verdict` reads a verdict again at the adjusted p-value.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as _st

__all__ = [
    "Effect", "REPORTED_SIZE_FAILURES", "SampleSize", "VERDICTS", "adjusted_verdict",
    "benjamini_hochberg", "bootstrap_effect", "detectable_effect", "detectable_effect_t",
    "holm", "one_sample_effect", "p_value", "paired_effect", "power_t", "seeds_for_power",
    "verdict", "welch_effect",
]

REPRODUCES = "reproduces"
LARGER = "reproduces, larger than reported"
SIZE_RULED_OUT_DIRECTION = "direction reproduces; reported size ruled out"
SIZE_RULED_OUT = "reported size ruled out"
FAILS = "does not reproduce"
INCONCLUSIVE = "inconclusive"
NOT_TESTABLE = "not testable at this scale"
NOT_TRAINED = "not testable: the method did not train here"
#: The fixed vocabulary of verdicts, in the order tables sort them.
VERDICTS = (REPRODUCES, LARGER, SIZE_RULED_OUT_DIRECTION, SIZE_RULED_OUT, INCONCLUSIVE, FAILS,
            NOT_TESTABLE, NOT_TRAINED)
#: Verdicts whose interval excludes the effect the work reports: failures of its size.
REPORTED_SIZE_FAILURES = (SIZE_RULED_OUT_DIRECTION, SIZE_RULED_OUT)
#: Notes a premise adds beside a claim's own verdict (never replacing it).
PREMISE_FAILS = "premise fails here"
PREMISE_INCONCLUSIVE = "premise inconclusive"


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
    df: float = math.nan  # of a Student-t design; nan: normal (bootstrap)

    def scaled(self, factor: float) -> Effect:
        """The same effect in other units (``factor`` > 0)."""
        if not factor > 0:
            raise ValueError(f"factor must be positive, got {factor}")
        return Effect(self.estimate * factor, self.low * factor, self.high * factor, self.n,
                      self.design, self.se * factor, self.detectable * factor, self.df)

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
    return _power_se(effect, sd / math.sqrt(n), n - 1, alpha, sides)


def _power_se(effect: float, se: float, df: float, alpha: float, sides: int = 2) -> float:
    """Power of the t test whose statistic has standard error ``se`` and ``df`` degrees of
    freedom (noncentrality ``effect / se``)."""
    ncp = effect / se
    c = float(_st.t.ppf(1 - alpha / sides, df))
    # P(T' > c) and P(T' < -c) = P(T'' > c) with T'' of noncentrality -ncp: scipy's nct
    # returns NaN for some far tails (nct.cdf(-5, 7, 28.4)), never for sf of either sign
    power = float(_st.nct.sf(c, df, ncp))
    if sides == 2:
        power += float(_st.nct.sf(c, df, -ncp))
    if not math.isfinite(power):
        raise ValueError(f"power of the t test is not finite (effect {effect}, se {se}, "
                         f"df {df})")
    return min(max(power, 0.0), 1.0)


def _detectable_se(se: float, df: float, alpha: float, power: float = 0.8,
                   sides: int = 2) -> float:
    """The effect detected with probability ``power`` (root of :func:`_power_se`)."""
    from scipy.optimize import brentq

    hi = se
    while _power_se(hi, se, df, alpha, sides) < power:
        hi *= 2
    return float(brentq(lambda d: _power_se(d, se, df, alpha, sides) - power, 0.0, hi,
                        xtol=1e-12 * se, rtol=1e-12))


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
    return _detectable_se(sd / math.sqrt(n), n - 1, alpha, power, sides)


def _t_effect(estimate: float, se: float, df: float, n: int, design: str,
              level: float) -> Effect:
    if n < 2 or not se >= 0:
        return Effect(estimate, math.nan, math.nan, n, design)
    half = float(_st.t.ppf((1 + level) / 2, df)) * se
    detectable = _detectable_se(se, df, 1 - level) if se > 0 else 0.0
    return Effect(estimate, estimate - half, estimate + half, n, design, se, detectable,
                  float(df))


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
            return SIZE_RULED_OUT_DIRECTION
        if p < lo:
            return LARGER
        return REPRODUCES
    if hi < 0:
        return FAILS
    if paper is not None and not math.isnan(paper) and not lo <= sign * (paper - null) <= hi:
        return SIZE_RULED_OUT
    return INCONCLUSIVE


# --- multiplicity ------------------------------------------------------------------------

def p_value(effect: Effect, null: float = 0.0) -> float:
    """Two-sided p-value of ``effect`` against ``null``: ``2 P(T_df > |est - null| / se)``
    (normal where ``df`` is nan, e.g. a bootstrap's standard error); nan without an
    interval. It is below ``1 - level`` exactly when the Student-t interval excludes
    ``null``."""
    if not math.isfinite(effect.se) or math.isnan(effect.low):
        return math.nan
    if effect.se == 0:
        return 0.0 if effect.estimate != null else 1.0
    z = abs(effect.estimate - null) / effect.se
    dist = _st.norm if math.isnan(effect.df) else _st.t(effect.df)
    return float(min(1.0, 2 * dist.sf(z)))


def _pvalues(p: Any) -> np.ndarray:
    x = np.asarray(p, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"p must be one-dimensional, got shape {x.shape}")
    if ((x < 0) | (x > 1)).any():
        raise ValueError("p must lie in [0, 1]")
    return x


def holm(p: Any) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error): with the ``m`` p-values
    sorted, ``p~_(i) = max_{j <= i} min(1, (m - j + 1) p_(j))``. NaN (untested) entries stay
    NaN and do not count in ``m``."""
    x = _pvalues(p)
    out = np.full_like(x, np.nan)
    ok = np.flatnonzero(~np.isnan(x))
    m = ok.size
    order = ok[np.argsort(x[ok], kind="stable")]
    running = 0.0
    for i, j in enumerate(order):
        running = max(running, min(1.0, (m - i) * x[j]))
        out[j] = running
    return out


def benjamini_hochberg(p: Any) -> np.ndarray:
    """Benjamini-Hochberg adjusted p-values (false discovery rate): with the ``m`` p-values
    sorted, ``p~_(i) = min_{j >= i} min(1, m p_(j) / j)``; NaN entries stay NaN and do not
    count in ``m``. A claim is a discovery at level ``q`` where ``p~ <= q``."""
    x = _pvalues(p)
    out = np.full_like(x, np.nan)
    ok = np.flatnonzero(~np.isnan(x))
    m = ok.size
    order = ok[np.argsort(x[ok], kind="stable")]
    running = 1.0
    for i in range(m - 1, -1, -1):
        running = min(running, m * x[order[i]] / (i + 1))
        out[order[i]] = running
    return out


def adjusted_verdict(raw: str, p_adjusted: float, alpha: float = 0.05) -> str:
    """``raw`` read again at the adjusted p-value of its test against ``null``: where it no
    longer rejects (``p_adjusted > alpha``), a decisive direction becomes
    ``inconclusive`` (a size still ruled out stays ``reported size ruled out``: the
    adjustment concerns the test against the null only)."""
    if raw not in VERDICTS:
        raise ValueError(f"raw must be a verdict of VERDICTS, got {raw!r}")
    if math.isnan(p_adjusted) or p_adjusted <= alpha:
        return raw
    if raw == SIZE_RULED_OUT_DIRECTION:
        return SIZE_RULED_OUT
    if raw in (REPRODUCES, LARGER, FAILS):
        return INCONCLUSIVE
    return raw
