"""calnotes.stats: intervals against scipy, the detectable effect against a simulation,
and every verdict on constructed intervals."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from calnotes import stats as st


def test_paired_interval_matches_scipy_one_sample_t() -> None:
    a = np.array([3.1, 2.4, 5.0, 4.2, 3.3])
    b = np.array([2.0, 2.5, 3.9, 3.0, 3.1])
    eff = st.paired_effect(a, b)
    ci = sps.ttest_1samp(a - b, 0.0).confidence_interval(0.95)
    assert eff.design == "paired t" and eff.n == 5
    assert eff.estimate == pytest.approx(np.mean(a - b))
    assert (eff.low, eff.high) == pytest.approx((ci.low, ci.high), rel=1e-12)


def test_welch_interval_matches_scipy() -> None:
    rng = np.random.default_rng(1)
    a, b = rng.normal(0, 1, 7), rng.normal(1, 3, 4)
    eff = st.welch_effect(a, b)
    ci = sps.ttest_ind(a, b, equal_var=False).confidence_interval(0.95)
    assert (eff.low, eff.high) == pytest.approx((ci.low, ci.high), rel=1e-10)


def test_issue_example_pairing_narrows_the_interval() -> None:
    # Per-seed ECE points of two methods sharing each seed's split: the paired interval
    # excludes zero, Welch's does not (the seeds' common offsets cancel when paired).
    a = np.array([4.10, 5.35, 3.02])
    b = a - np.array([-1.08, -1.01, -1.32])
    paired, welch = st.paired_effect(a, b), st.welch_effect(a, b)
    assert paired.high < 0 < welch.high
    assert paired.estimate == pytest.approx(welch.estimate)


def test_detectable_effect_gives_80_percent_power_in_simulation() -> None:
    # Effects of the detectable size are found (interval excludes 0) about 80% of the time.
    rng = np.random.default_rng(0)
    n, sd = 5, 1.0
    se = sd / math.sqrt(n)
    delta = st.detectable_effect(se, n - 1)
    hits = 0
    trials = 4000
    for _ in range(trials):
        eff = st.one_sample_effect(rng.normal(delta, sd, n))
        hits += eff.low > 0
    # The (t + t) approximation of the noncentral t sits a few points above 80% at df = 4;
    # 4000 trials give a standard error of 0.6 points.
    assert 0.78 < hits / trials < 0.88


def test_bootstrap_effect_percentiles_and_detectable() -> None:
    reps = np.arange(1, 1001, dtype=float)
    eff = st.bootstrap_effect(500.0, reps, n=1000)
    assert eff.low == pytest.approx(np.quantile(reps, 0.025))
    assert eff.high == pytest.approx(np.quantile(reps, 0.975))
    assert eff.detectable == pytest.approx((1.959964 + 0.841621) * reps.std(ddof=1), rel=1e-5)


def test_one_seed_has_no_interval_and_is_inconclusive() -> None:
    eff = st.one_sample_effect([1.5])
    assert math.isnan(eff.low) and math.isnan(eff.detectable)
    assert st.verdict(eff.low, eff.high, "above") == st.INCONCLUSIVE


@pytest.mark.parametrize("low, high, direction, paper, expected", [
    (-3.0, -1.0, "below", None, st.REPRODUCES),
    (-3.0, -1.0, "below", -2.0, st.REPRODUCES),
    (-3.0, -1.0, "below", -5.0, st.SIZE_RULED_OUT_DIRECTION),
    (-3.0, -1.0, "below", -0.5, st.LARGER),
    (1.0, 3.0, "below", -2.0, st.FAILS),
    (-1.0, 1.0, "below", -2.0, st.SIZE_RULED_OUT),
    (-1.0, 1.0, "below", -0.5, st.INCONCLUSIVE),
    (1.0, 3.0, "above", 2.0, st.REPRODUCES),
    (1.0, 3.0, "above", 5.0, st.SIZE_RULED_OUT_DIRECTION),
    # The interval holds the null but excludes the reported effect: its size is ruled out.
    (-14.9, 22.3, "below", -33.9, st.SIZE_RULED_OUT),
    (-1.0, 1.0, "above", 5.0, st.SIZE_RULED_OUT),
    (-1.0, 1.0, "above", 0.5, st.INCONCLUSIVE),
    (1.0, 3.0, "above", 0.5, st.LARGER),
    (-3.0, -1.0, "above", None, st.FAILS),
])
def test_verdicts_on_constructed_intervals(low, high, direction, paper, expected) -> None:
    assert st.verdict(low, high, direction, 0.0, paper) == expected


def test_verdict_respects_a_nonzero_null() -> None:
    assert st.verdict(1.5, 2.5, "above", null=1.0) == st.REPRODUCES
    assert st.verdict(0.5, 2.5, "above", null=1.0) == st.INCONCLUSIVE
    assert st.verdict(0.2, 0.8, "above", null=1.0) == st.FAILS


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="direction"):
        st.verdict(0, 1, "sideways")
    with pytest.raises(ValueError, match="low <= high"):
        st.verdict(2, 1, "above")
    with pytest.raises(ValueError, match="pair one to one"):
        st.paired_effect([1, 2], [1, 2, 3])
    with pytest.raises(ValueError, match="NaN"):
        st.one_sample_effect([1.0, float("nan")])
    with pytest.raises(ValueError, match="empty"):
        st.one_sample_effect([])
    with pytest.raises(ValueError, match="level"):
        st.one_sample_effect([1, 2], level=1.5)


# --- exact noncentral-t power ------------------------------------------------------------

@pytest.mark.parametrize("effect, n, sides, expected", [
    # Published values of the one-sample / paired t test's power (Cohen's d = effect / sd),
    # as G*Power and Cohen (1988) tabulate them: d = 0.5, n = 34, two-sided: 0.8078;
    # d = 0.5, n = 27, one-sided: 0.8118; d = 1, n = 10, two-sided: 0.8031.
    (0.5, 34, 2, 0.8077775),
    (0.5, 27, 1, 0.8118316),
    (1.0, 10, 2, 0.803097),
])
def test_power_t_matches_published_values(effect, n, sides, expected) -> None:
    assert st.power_t(effect, 1.0, n, 0.05, sides) == pytest.approx(expected, abs=2e-6)
    # d is what counts: the same standardized effect at another sd has the same power.
    assert st.power_t(3 * effect, 3.0, n, 0.05, sides) == pytest.approx(expected, abs=2e-6)


def test_power_t_against_simulation_at_three_seeds() -> None:
    # The case the (t + t) approximation gets wrong: df = 2. Simulated t tests of 3 paired
    # differences; 20000 trials give a standard error of 0.3 points.
    rng = np.random.default_rng(3)
    effect, sd, n = 2.0, 1.0, 3
    x = rng.normal(effect, sd, (20000, n))
    p = sps.ttest_1samp(x, 0.0, axis=1).pvalue
    assert np.mean(p < 0.05) == pytest.approx(st.power_t(effect, sd, n, 0.05), abs=0.012)


def test_power_t_at_zero_effect_is_alpha() -> None:
    assert st.power_t(0.0, 1.0, 5, 0.05) == pytest.approx(0.05, rel=1e-9)
    assert st.power_t(0.0, 1.0, 5, 0.05, sides=1) == pytest.approx(0.05, rel=1e-9)


def test_seeds_for_power_is_the_smallest_n() -> None:
    got = st.seeds_for_power(0.5, 1.0, 0.05)
    assert (got.n, got.reached) == (34, True)
    assert st.power_t(0.5, 1.0, 33, 0.05) < 0.8 <= got.power
    tiny = st.seeds_for_power(0.01, 1.0, 0.05, max_n=50)
    assert (tiny.n, tiny.reached) == (50, False) and tiny.power < 0.8


def test_detectable_effect_t_is_exact_where_the_approximation_is_not() -> None:
    sd, n = 1.3, 3
    delta = st.detectable_effect_t(sd, n, 0.05)
    assert st.power_t(delta, sd, n, 0.05) == pytest.approx(0.8, abs=1e-9)
    # The (t + t) se approximation at df = 2 reaches only about 76.6% power.
    approx = st.detectable_effect(sd / math.sqrt(n), n - 1)
    assert st.power_t(approx, sd, n, 0.05) == pytest.approx(0.766, abs=0.001)
    assert delta > approx
    # Inverse of seeds_for_power: at n = 34, d = 0.5 is just above the detectable effect.
    assert st.detectable_effect_t(1.0, 34, 0.05) < 0.5 < st.detectable_effect_t(1.0, 33, 0.05)


def test_power_functions_name_bad_input() -> None:
    with pytest.raises(ValueError, match="sd"):
        st.power_t(1.0, 0.0, 5, 0.05)
    with pytest.raises(ValueError, match="n must"):
        st.power_t(1.0, 1.0, 1, 0.05)
    with pytest.raises(ValueError, match="alpha"):
        st.power_t(1.0, 1.0, 5, 1.5)
    with pytest.raises(ValueError, match="sides"):
        st.detectable_effect_t(1.0, 5, 0.05, sides=3)
    with pytest.raises(ValueError, match="effect"):
        st.seeds_for_power(0.0, 1.0, 0.05)
    with pytest.raises(ValueError, match="max_n"):
        st.seeds_for_power(1.0, 1.0, 0.05, max_n=1)



# --- multiplicity ------------------------------------------------------------------------

def test_p_value_matches_scipy_and_the_interval() -> None:
    x = np.array([1.0, 2.0, 3.5, 0.4])
    eff = st.one_sample_effect(x)
    assert st.p_value(eff) == pytest.approx(sps.ttest_1samp(x, 0.0).pvalue, rel=1e-10)
    assert st.p_value(eff, 0.3) == pytest.approx(sps.ttest_1samp(x, 0.3).pvalue, rel=1e-10)
    # the 95% interval's end is exactly where p = 0.05
    assert st.p_value(eff, eff.low) == pytest.approx(0.05, rel=1e-9)
    rng = np.random.default_rng(2)
    a, b = rng.normal(0, 1, 6), rng.normal(1, 2, 5)
    assert st.p_value(st.welch_effect(a, b)) == pytest.approx(
        sps.ttest_ind(a, b, equal_var=False).pvalue, rel=1e-10)
    assert math.isnan(st.p_value(st.one_sample_effect([1.0])))


def test_holm_and_bh_by_hand_and_against_scipy() -> None:
    p = np.array([0.01, 0.04, 0.03, 0.2, np.nan])
    # sorted 0.01, 0.03, 0.04, 0.2 (m = 4): 4(0.01); max(.04, 3(.03)); max(.09, 2(.04)); .2
    assert st.holm(p)[:4] == pytest.approx([0.04, 0.09, 0.09, 0.2])
    assert math.isnan(st.holm(p)[4]) and math.isnan(st.benjamini_hochberg(p)[4])
    # BH: 4(.01)/1 = .04; min(4(.03)/2, 4(.04)/3) = .0533 for both; .2
    assert st.benjamini_hochberg(p)[:4] == pytest.approx([0.04, 0.16 / 3, 0.16 / 3, 0.2])
    q = np.random.default_rng(4).uniform(0, 0.2, 40)
    assert st.benjamini_hochberg(q) == pytest.approx(sps.false_discovery_control(q))
    assert (st.holm(q) >= st.benjamini_hochberg(q) - 1e-15).all()
    with pytest.raises(ValueError, match="p must lie"):
        st.holm([0.5, 1.5])


@pytest.mark.parametrize("raw, p, expected", [
    (st.REPRODUCES, 0.01, st.REPRODUCES),
    (st.REPRODUCES, 0.2, st.INCONCLUSIVE),
    (st.FAILS, 0.2, st.INCONCLUSIVE),
    (st.LARGER, 0.06, st.INCONCLUSIVE),
    (st.SIZE_RULED_OUT_DIRECTION, 0.3, st.SIZE_RULED_OUT),
    (st.SIZE_RULED_OUT_DIRECTION, 0.04, st.SIZE_RULED_OUT_DIRECTION),
    (st.INCONCLUSIVE, 0.9, st.INCONCLUSIVE),
    (st.NOT_TESTABLE, math.nan, st.NOT_TESTABLE),
])
def test_adjusted_verdict(raw, p, expected) -> None:
    assert st.adjusted_verdict(raw, p) == expected


def test_t_designs_report_the_exact_detectable_effect() -> None:
    x = np.array([1.0, 2.0, 3.5])
    eff = st.one_sample_effect(x)
    sd = float(x.std(ddof=1))
    assert eff.detectable == pytest.approx(st.detectable_effect_t(sd, 3, 0.05), rel=1e-9)
    assert st.power_t(eff.detectable, sd, 3, 0.05) == pytest.approx(0.8, abs=1e-9)
