"""Bands of reliability diagrams: exact intervals, the bootstrap fix, consistency bands,
and the ``n_bins="auto"`` rule."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import binom, binomtest

from calnotes import metrics, plots


def _one_bin(k: int, n: int, conf: float = 0.7) -> tuple[np.ndarray, np.ndarray]:
    """n binary predictions at confidence ``conf`` for class 1, k of them correct."""
    probs = np.tile([1 - conf, conf], (n, 1))
    labels = np.r_[np.ones(k, int), np.zeros(n - k, int)]
    return probs, labels


def test_twelve_of_twelve_gets_the_exact_lower_limit():
    probs, labels = _one_bin(12, 12)
    # hand-computed: Beta(12, 1) has cdf x^12, so the 5% quantile is 0.05^(1/12)
    expected = 0.05 ** (1 / 12)
    for method in ("clopper-pearson", "bootstrap"):
        b = metrics.reliability_bands(probs, labels, n_bins=10, method=method)
        m = int(np.flatnonzero(b.counts)[0])
        assert b.low[m] == pytest.approx(expected, rel=1e-12)
        assert b.high[m] == 1.0
        assert b.low[m] <= 0.78 <= b.high[m]
    lo, hi = plots.bootstrap_bin_accuracy(probs, labels, n_bins=10)
    m = 6  # (0.6, 0.7]
    assert lo[m] <= 0.78 <= hi[m] and hi[m] - lo[m] > 0.2


def test_zero_of_twelve_mirrors_it():
    probs, labels = _one_bin(0, 12)
    b = metrics.reliability_bands(probs, labels, n_bins=10, method="bootstrap")
    m = int(np.flatnonzero(b.counts)[0])
    assert b.low[m] == 0.0 and b.high[m] == pytest.approx(1 - 0.05 ** (1 / 12), rel=1e-12)


@pytest.mark.parametrize(("k", "n"), [(0, 5), (3, 5), (5, 5), (17, 40), (1, 1), (90, 100)])
@pytest.mark.parametrize("level", [0.9, 0.95])
def test_exact_and_wilson_intervals_match_scipy(k, n, level):
    lo, hi = metrics.clopper_pearson(k, n, level)
    ref = binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
    assert (float(lo), float(hi)) == pytest.approx((ref.low, ref.high), abs=1e-10)
    lo, hi = metrics.wilson(k, n, level)
    ref = binomtest(k, n).proportion_ci(confidence_level=level, method="wilson")
    assert (float(lo), float(hi)) == pytest.approx((ref.low, ref.high), abs=1e-10)


@pytest.mark.parametrize("p", [0.55, 0.8, 0.97])
def test_clopper_pearson_covers_at_least_its_level_exactly(p):
    n = 12
    k = np.arange(n + 1)
    lo, hi = metrics.clopper_pearson(k, np.full(n + 1, n), 0.9)
    coverage = binom.pmf(k, n, p)[(lo <= p) & (p <= hi)].sum()
    assert coverage >= 0.9


def test_bands_agree_with_reliability_bins_and_bracket_the_accuracy():
    rng = np.random.default_rng(0)
    probs = rng.dirichlet(np.ones(4) * 0.5, size=600)
    labels = rng.integers(0, 4, 600)
    bins = metrics.reliability_bins(probs, labels, n_bins=8)
    for method in metrics.BAND_METHODS:
        b = metrics.reliability_bands(probs, labels, n_bins=8, method=method, n_boot=200)
        assert np.array_equal(b.counts, bins.counts)
        np.testing.assert_allclose(b.accuracy, bins.accuracy, rtol=1e-6, equal_nan=True)
        filled = b.counts > 0
        assert np.all(b.low[filled] <= b.accuracy[filled] + 1e-12)
        assert np.all(b.high[filled] >= b.accuracy[filled] - 1e-12)
        assert np.all(np.isnan(b.low[~filled]))
        assert list(b.to_frame().columns[-1:]) == ["enough"]


def test_consistency_band_of_certain_predictions_is_a_point():
    probs, labels = _one_bin(12, 12, conf=1.0)
    b = metrics.reliability_bands(probs, labels, n_bins=10)
    assert (b.consistency_low[-1], b.consistency_high[-1]) == (1.0, 1.0)


def test_consistency_band_holds_calibrated_bins_and_rejects_overconfident_ones():
    rng = np.random.default_rng(1)
    n = 4000
    conf = rng.uniform(0.5, 1.0, n)
    probs = np.stack([1 - conf, conf], axis=1)
    calibrated = (rng.random(n) < conf).astype(int)
    b = metrics.reliability_bands(probs, calibrated, n_bins=10, n_boot=400)
    inside = (b.consistency_low <= b.accuracy) & (b.accuracy <= b.consistency_high)
    filled = b.counts > 0
    # 5 filled bins at 90%: all of them outside by chance has probability about 1e-5
    assert inside[filled].sum() >= 3
    overconfident = (rng.random(n) < conf - 0.15).astype(int)
    b = metrics.reliability_bands(probs, overconfident, n_bins=10, n_boot=400)
    assert np.all(b.accuracy[filled] < b.consistency_low[filled])


def test_min_count_flags_sparse_bins_and_torch_input_works():
    probs, labels = _one_bin(5, 6)
    b = metrics.reliability_bands(torch.from_numpy(probs), torch.from_numpy(labels),
                                  n_bins=10, min_count=10, consistency=False)
    assert not b.enough.any() and np.isnan(b.consistency_low).all()


def test_bad_arguments_are_named():
    probs, labels = _one_bin(5, 6)
    with pytest.raises(ValueError, match="method"):
        metrics.reliability_bands(probs, labels, method="jeffreys")
    with pytest.raises(ValueError, match="level"):
        metrics.reliability_bands(probs, labels, level=1.0)
    with pytest.raises(TypeError, match="n_bins"):
        metrics.reliability_bands(probs, labels, n_bins="many")
    with pytest.raises(TypeError, match="consistency"):
        metrics.reliability_bands(probs, labels, consistency=1)
    with pytest.raises(ValueError, match="band"):
        plots.reliability_diagram(probs, labels, band="normal")


def test_diagram_names_its_band_and_draws_sparse_bins_hollow():
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(2)
    conf = np.r_[rng.uniform(0.9, 1.0, 200), np.full(3, 0.55)]
    probs = np.stack([1 - conf, conf], axis=1)
    labels = (rng.random(conf.size) < conf).astype(int)
    ax = plots.reliability_diagram(probs, labels, n_bins=10, consistency=True)
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "90% Clopper-Pearson" in legend and "90% if calibrated" in legend
    hollow = [p for p in ax.containers[0].patches if p.get_facecolor()[3] == 0]
    assert len(hollow) == 1
    plt.close(ax.figure)


@pytest.mark.parametrize(("n", "bins"), [(1, 1), (8, 2), (27, 3), (28, 4), (1000, 10),
                                         (1001, 11), (100_000, 47)])
def test_auto_bins_are_the_rounded_up_cube_root(n, bins):
    assert metrics.resolve_n_bins("auto", n) == bins
    assert metrics.resolve_n_bins(7, n) == 7


def test_auto_bins_wherever_n_bins_is_taken():
    rng = np.random.default_rng(3)
    probs = rng.dirichlet(np.ones(3), size=1000)
    labels = rng.integers(0, 3, 1000)
    for f in (metrics.ece, metrics.mce, metrics.classwise_ece, metrics.ace,
              metrics.debiased_l2_ce):
        assert f(probs, labels, n_bins="auto") == f(probs, labels, n_bins=10)
    assert metrics.reliability_bins(probs, labels, n_bins="auto").n_bins == 10
    assert metrics.ece(probs, labels, n_bins="auto", binning="quantile") == metrics.ece(
        probs, labels, n_bins=10, binning="quantile")
    iv = metrics.bootstrap("ece", probs, labels, n_bins="auto", n_boot=50)
    assert iv == metrics.bootstrap("ece", probs, labels, n_bins=10, n_boot=50)
    table = metrics.calibration_report(probs, labels, n_bins="auto")
    assert float(table["ece"].iloc[0]) == pytest.approx(metrics.ece(probs, labels, n_bins=10))


def test_debiased_l2_needs_a_bin_per_sample_to_match_the_reference_on_ties():
    calibration = pytest.importorskip("calibration")
    p = np.r_[[0.1] * 4, [0.5] * 20, [0.9] * 4]
    probs = np.stack([1 - p, p], axis=1)
    labels = (np.random.default_rng(0).random(p.size) < np.where(p == 0.5, 0.8, p)).astype(int)
    ref = calibration.get_calibration_error(probs, labels, p=2, debias=True)
    ours = metrics.debiased_l2_ce(probs, labels, n_bins=p.size, mode="marginal")
    assert ours == pytest.approx(ref, rel=1e-9)
    assert metrics.debiased_l2_ce(probs, labels, n_bins=3, mode="marginal") != pytest.approx(
        ref, rel=1e-3)


def test_smece_and_relplot_differ_near_one_as_the_api_page_says():
    relplot = pytest.importorskip("relplot")
    rng = np.random.default_rng(0)
    n = 2000
    conf = rng.uniform(0.6, 0.9, n)
    labels = (rng.random(n) < 0.95 * conf).astype(int)
    probs = np.stack([1 - conf, conf], axis=1)
    away = metrics.smece(probs, labels, bandwidth=0.02)
    assert relplot.smECE_sigma(conf, labels, 0.02) == pytest.approx(away, rel=0.01)
    conf[: n // 2] = 1 - rng.uniform(0, 1e-3, n // 2)
    labels = (rng.random(n) < 0.95 * conf).astype(int)
    probs = np.stack([1 - conf, conf], axis=1)
    ours = metrics.smece(probs, labels, bandwidth=0.1)
    gap = abs(relplot.smECE_sigma(conf, labels, 0.1) - ours) / ours
    assert 0.01 < gap < 0.05  # measured 1.8% here, 2.8-3.4% on other draws


def test_positive_class_diagram_draws_exact_bands():
    import matplotlib.pyplot as plt

    p = np.full(12, 0.7)
    ax = plots.positive_class_diagram(p, np.ones(12, int), n_bins=10)
    bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    (segment,) = bars[0].lines[2][0].get_segments()
    assert segment[:, 1] == pytest.approx([0.05 ** (1 / 12), 1.0])
    assert "90% Clopper-Pearson" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(ax.figure)
