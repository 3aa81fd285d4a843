"""Tests of calibration: Spiegelhalter's z, SKCE and its tests, the binned consistency test."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import binom, norm

from calnotes import metrics


def _calibrated(n: int, c: int, seed: int, sharpen: float = 1.0):
    """Dirichlet predictions and labels drawn from them; ``sharpen > 1`` then makes the
    predictions overconfident (p^sharpen, renormalised) for the same labels."""
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(c), size=n)
    labels = (probs.cumsum(1) < rng.random((n, 1))).sum(1).clip(max=c - 1)
    q = probs**sharpen
    return q / q.sum(1, keepdims=True), labels


def test_spiegelhalter_hand_computed():
    probs = np.array([[0.8, 0.2], [0.2, 0.8]])
    labels = np.array([0, 1])
    # positive class: p = (0.2, 0.8), y = (0, 1): numerator (-0.2)(0.6) + (0.2)(-0.6) = -0.24,
    # denominator sqrt(2 * 0.36 * 0.16); top-label: c = 0.8, r = 1 twice: (0.2)(-0.6) * 2
    t = metrics.spiegelhalter_test(probs, labels, mode="positive")
    z = -0.24 / math.sqrt(2 * 0.36 * 0.16)
    assert t.statistic == pytest.approx(z, rel=1e-12)
    assert t.p_value == pytest.approx(2 * norm.sf(abs(z)), rel=1e-12)
    t = metrics.spiegelhalter_test(probs, labels)
    assert t.statistic == pytest.approx(-0.24 / math.sqrt(2 * 0.36 * 0.16), rel=1e-12)
    assert "Bernoulli(c_i)" in t.null


def test_spiegelhalter_undefined_at_half_and_binary_only_for_positive():
    t = metrics.spiegelhalter_test(np.full((4, 2), 0.5), np.array([0, 1, 1, 0]), "positive")
    assert math.isnan(t.statistic) and math.isnan(t.p_value)
    with pytest.raises(ValueError, match="binary"):
        metrics.spiegelhalter_test(np.full((3, 3), 1 / 3), np.array([0, 1, 2]), "positive")
    with pytest.raises(ValueError, match="mode"):
        metrics.spiegelhalter_test(np.full((3, 3), 1 / 3), np.array([0, 1, 2]), "binary")


def _skce_loop(probs, labels, nu, top_label=False):
    """The definition, one pair at a time."""
    n = len(labels)
    if top_label:
        v = probs.max(1)[:, None]
        r = (probs.argmax(1) == labels).astype(float)[:, None] - v
    else:
        v = probs
        r = np.eye(probs.shape[1])[labels] - probs
    total = 0.0
    for i in range(n):
        for j in range(n):
            if i != j:
                total += math.exp(-np.linalg.norm(v[i] - v[j]) / nu) * float(r[i] @ r[j])
    return total / (n * (n - 1))


@pytest.mark.parametrize("mode", ["canonical", "top-label"])
def test_skce_matches_the_pairwise_definition(mode):
    probs, labels = _calibrated(40, 3, seed=0, sharpen=2.0)
    got = metrics.skce(probs, labels, mode=mode, bandwidth=0.3)
    assert got == pytest.approx(_skce_loop(probs, labels, 0.3, mode == "top-label"),
                                rel=1e-9, abs=1e-12)
    torch_in = metrics.skce(torch.from_numpy(probs), torch.from_numpy(labels), mode=mode,
                            bandwidth=0.3)
    assert torch_in == pytest.approx(got, rel=1e-9, abs=1e-12)


def test_skce_is_unbiased_under_calibration_and_positive_when_overconfident():
    values = [metrics.skce(*_calibrated(60, 3, seed=s), bandwidth=0.5) for s in range(200)]
    mean, se = np.mean(values), np.std(values, ddof=1) / math.sqrt(len(values))
    assert abs(mean) < 4 * se  # unbiased: E = 0 under the null
    assert metrics.skce(*_calibrated(300, 3, seed=1, sharpen=3.0), bandwidth=0.5) > 10 * se


@pytest.mark.parametrize("method", ["asymptotic", "bootstrap"])
def test_skce_test_rejects_overconfidence(method):
    probs, labels = _calibrated(300, 4, seed=2, sharpen=3.0)
    t = metrics.skce_test(probs, labels, method=method, n_boot=200)
    assert t.p_value < 0.01 and t.rejects()


@pytest.mark.parametrize("mode", ["canonical", "top-label"])
def test_asymptotic_skce_test_holds_its_level(mode):
    # 120 calibrated data sets at level 0.05: more than 15 rejections has probability
    # binom.sf(15, 120, 0.05) < 1e-3 if the test holds its level
    rejections = sum(metrics.skce_test(*_calibrated(80, 3, seed=s), mode=mode,
                                       n_boot=500, seed=s).rejects(0.05) for s in range(120))
    assert binom.sf(15, 120, 0.05) < 1e-3
    assert rejections <= 15


def test_consistency_test_holds_its_level_and_rejects_overconfidence():
    rejections = sum(metrics.consistency_test(*_calibrated(200, 5, seed=s), n_bins=10,
                                              n_boot=200, seed=s).rejects(0.05)
                     for s in range(100))
    assert binom.sf(13, 100, 0.05) < 1e-3
    assert rejections <= 13
    t = metrics.consistency_test(*_calibrated(500, 5, seed=3, sharpen=2.0), n_bins="auto",
                                 binning="quantile", n_boot=200)
    assert t.p_value == pytest.approx(1 / 201)


def test_consistency_test_statistic_is_the_ece():
    probs, labels = _calibrated(300, 4, seed=4, sharpen=1.5)
    for binning in ("uniform", "quantile"):
        t = metrics.consistency_test(probs, labels, n_bins=7, binning=binning, n_boot=10)
        assert t.statistic == pytest.approx(metrics.ece(probs, labels, 7, binning), rel=1e-9)


def test_bad_arguments_are_named():
    probs, labels = _calibrated(10, 3, seed=0)
    with pytest.raises(ValueError, match="method"):
        metrics.skce_test(probs, labels, method="exact")
    with pytest.raises(ValueError, match="bandwidth"):
        metrics.skce(probs, labels, bandwidth=-1.0)
    with pytest.raises(ValueError, match="probs"):
        metrics.skce(probs[:1], labels[:1])
    with pytest.raises(ValueError, match="n_boot"):
        metrics.consistency_test(probs, labels, n_boot=0)


def test_mce_consistency_statistic_is_the_mce():
    probs, labels = _calibrated(300, 4, seed=5, sharpen=1.5)
    t = metrics.consistency_test(probs, labels, n_bins=7, n_boot=10, norm="max")
    assert t.statistic == pytest.approx(metrics.mce(probs, labels, 7), rel=1e-9)


def test_debiased_interval_contains_its_estimate_where_the_percentile_one_does_not():
    from calnotes.synthetic import SyntheticModel

    model = SyntheticModel("calibrated")
    percentile_misses, zero_misses = 0, 0
    for r in range(40):
        probs, labels = model.sample(500, seed=r)
        for metric in ("ece", "mce"):
            pct = metrics.bootstrap(metric, probs, labels, n_boot=100, seed=r)
            deb = metrics.bootstrap(metric, probs, labels, n_boot=100, seed=r,
                                    method="debiased")
            assert deb.contains(deb.estimate) and deb.estimate == pct.estimate
            percentile_misses += not pct.contains(pct.estimate)
            zero_misses += metric == "ece" and not deb.contains(0.0)
    assert percentile_misses > 0  # the failure the debiased interval removes
    # the true ECE of this model is 0; the lower end is 0 unless the consistency test
    # rejects at 2.5%: more than 5 of 40 has probability binom.sf(5, 40, 0.025) < 1e-3
    assert binom.sf(5, 40, 0.025) < 1e-3
    assert zero_misses <= 5
    with pytest.raises(ValueError, match="method"):
        metrics.bootstrap("ece", probs, labels, method="bca")


def test_report_tables_of_tests_and_decomposition():
    from calnotes import report

    calibrated = _calibrated(400, 3, seed=6)
    overconfident = _calibrated(400, 3, seed=6, sharpen=3.0)
    tests, parts = report.calibration_tests({"a": calibrated[0], "b": overconfident[0]},
                                            calibrated[1], n_boot=100)
    assert list(tests.index) == ["a", "b"]
    assert tests.loc["b", "consistency_p"] < 0.05 < tests.loc["a", "consistency_p"]
    assert tests.loc["b", "spiegelhalter_p"] < 0.05
    for name in ("a", "b"):
        row = parts.loc[name]
        assert row["score"].estimate == pytest.approx(
            row["miscalibration"].estimate - row["discrimination"].estimate
            + row["uncertainty"].estimate, rel=1e-12)
        assert all(iv.contains(iv.estimate) for iv in row)


def test_asymptotic_skce_test_refuses_n_boot_beyond_the_draw_limit(monkeypatch):
    """The spectral p-value draws an ``(n_boot, m)`` array: n_boot is bounded like the
    bootstrap's (a limit lowered here so that the refused call would be cheap)."""
    from calnotes.metrics import _common

    probs = torch.full((20, 3), 1 / 3, dtype=torch.float64)
    labels = torch.arange(20) % 3
    monkeypatch.setattr(_common, "MAX_BOOT_DRAWS", 20 * 50)
    metrics.skce_test(probs, labels, n_boot=50)  # n_boot * m at the limit: allowed
    with pytest.raises(ValueError, match=r"n_boot=51 .*N=20.*limit is n_boot \* N <= 1e\+03"):
        metrics.skce_test(probs, labels, n_boot=51)
    with pytest.raises(ValueError, match=r"n_boot must be at most 1000000 \(the limit\)"):
        metrics.skce_test(probs, labels, n_boot=_common.MAX_BOOT + 1)
