"""Tests for the smooth ECE, the debiased L2 calibration error, selective prediction and the
generic bootstrap: hand-computed cases, an independent quadrature, the reference packages
(relplot, uncertainty-calibration; skipped when absent) and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.integrate import quad

import calnotes.metrics as M


def make_data(seed: int, n: int, c: int, scale: float = 2.0, acc: float = 0.7):
    rng = np.random.default_rng(seed)
    z = scale * rng.normal(size=(n, c))
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    y = np.where(rng.random(n) < acc, p.argmax(1), rng.integers(0, c, n))
    return p, y


def smece_by_quadrature(conf: np.ndarray, correct: np.ndarray, sigma: float) -> float:
    """The smooth ECE's integral written out: the reflected Gaussian kernel summed over
    images and integrated with scipy's adaptive quadrature."""
    r = conf - correct

    def h(t: float) -> float:
        k = sum(np.exp(-0.5 * ((t - conf - 2 * j) / sigma) ** 2)
                + np.exp(-0.5 * ((t + conf - 2 * j) / sigma) ** 2) for j in range(-3, 4))
        return float(np.mean(r * k) / (sigma * math.sqrt(2 * math.pi)))

    return quad(lambda t: abs(h(t)), 0, 1, limit=400, epsabs=1e-11)[0]


# ------------------------------------------------------------------------------ smooth ECE


@pytest.mark.parametrize("sigma", [0.03, 0.1, 0.4])
def test_smece_is_the_integral_of_the_reflected_kernel(sigma):
    p, y = make_data(0, 300, 5, scale=3.0)
    conf, correct = M.confidences_and_correct(p, y)
    # grid error bound of the docstring: about 0.25 mean|r| (delta/sigma)^2 per step, < 1e-7
    # here; quad's own tolerance is 1e-11
    assert M.smece(p, y, bandwidth=sigma) == pytest.approx(
        smece_by_quadrature(conf, correct, sigma), abs=1e-7)


def test_smece_hand_cases():
    # all correct at confidence 1: every residual is 0
    p = np.eye(3)[[0, 1, 2, 0]]
    assert M.smece(p, np.array([0, 1, 2, 0]), bandwidth=0.1) == pytest.approx(0.0, abs=1e-15)
    # one sample, confidence 0.5, wrong: |h| integrates to r * int K = 0.5 (mass preserved)
    p = np.array([[0.5, 0.3, 0.2]])
    assert M.smece(p, np.array([1]), bandwidth=0.05) == pytest.approx(0.5, abs=1e-6)
    # the same residuals of both signs cancel under a wide kernel but not under a narrow one
    p = np.array([[0.9, 0.1], [0.9, 0.1], [0.6, 0.4], [0.6, 0.4]])
    y = np.array([0, 0, 1, 1])  # residuals -0.1, -0.1 at 0.9 and +0.6, +0.6 at 0.6
    assert M.smece(p, y, bandwidth=0.01) == pytest.approx((0.2 + 1.2) / 4, abs=1e-4)


def test_smece_fixed_point_bandwidth():
    p, y = make_data(1, 1000, 10)
    sigma = M.smece_bandwidth(p, y)
    assert M.SMECE_MIN_BANDWIDTH < sigma < 1
    assert M.smece(p, y, bandwidth=sigma) == pytest.approx(sigma, abs=2e-6)
    assert M.smece(p, y) == pytest.approx(sigma, abs=2e-6)


def test_smece_torch_and_numpy_agree_and_keep_the_device():
    p, y = make_data(2, 400, 4)
    value = M.smece(torch.tensor(p), torch.tensor(y), bandwidth=0.05)
    assert isinstance(value, torch.Tensor) and value.dtype == torch.float64
    assert float(value) == M.smece(p, y, bandwidth=0.05)  # same float64 CPU computation


def test_smece_bad_input():
    p, y = make_data(3, 50, 3)
    with pytest.raises(ValueError, match="bandwidth"):
        M.smece(p, y, bandwidth=0.0)
    with pytest.raises(TypeError, match="bandwidth"):
        M.smece(p, y, bandwidth="wide")
    with pytest.raises(ValueError, match="probs"):
        M.smece(p * 2, y)
    with pytest.raises(ValueError, match="labels"):
        M.smece(p, y[:-1])


def test_smece_agrees_with_relplot():
    relplot = pytest.importorskip("relplot")
    for seed, (n, c, scale) in enumerate([(2000, 10, 2.0), (500, 10, 4.0), (3000, 3, 1.0)]):
        p, y = make_data(seed, n, c, scale)
        conf, correct = M.confidences_and_correct(p, y)
        for sigma in (0.02, 0.05, 0.1):
            ours = M.smece(p, y, bandwidth=sigma)
            ref = relplot.smECE_sigma(conf, correct, sigma)
            # relplot rounds the samples to a grid of about max(1000, 10/sigma) nodes and
            # integrates with a ratio of two 200-point Riemann sums, whose end points weigh
            # 1/199 instead of 1/398: measured up to 1.1e-3 from the exact integral (which
            # ours matches to 1e-7, test above). 1% of the value bounds that here.
            assert ours == pytest.approx(ref, rel=0.01, abs=1e-3)
        ref_value, ref_sigma = relplot.smECE(conf, correct, return_width=True)
        # relplot bisects the bandwidth 10 times on [0, 1] and returns the upper end:
        # within 2^-10 above the fixed point of its own (1%-off) estimate
        assert M.smece_bandwidth(p, y) == pytest.approx(ref_sigma, abs=2**-10 + 0.01 * ref_sigma)
        assert M.smece(p, y) == pytest.approx(ref_value, rel=0.02, abs=2e-3)


# ---------------------------------------------------------------------------- debiased L2


def test_debiased_l2_hand_case():
    # 4 samples, 2 equal-mass bins of 2: confidences sorted 0.6, 0.7 | 0.8, 0.9
    p = np.array([[0.6, 0.4], [0.7, 0.3], [0.8, 0.2], [0.9, 0.1]])
    y = np.array([0, 1, 0, 0])  # correct: 1, 0, 1, 1
    # bin 1: mean conf 0.65, acc 0.5: 0.15^2 - 0.25/1 ; bin 2: 0.85, 1.0: 0.15^2 - 0
    square = 0.5 * (0.0225 - 0.25) + 0.5 * 0.0225
    assert square < 0
    assert M.debiased_l2_ce(p, y, n_bins=2) == 0.0  # clipped at 0
    y2 = np.array([0, 0, 0, 0])  # bin 1 acc 1: (0.35)^2 - 0 ; bin 2: 0.15^2
    expect = math.sqrt(0.5 * 0.35**2 + 0.5 * 0.15**2)
    assert M.debiased_l2_ce(p, y2, n_bins=2) == pytest.approx(expect, rel=1e-12)


def test_debiased_l2_is_less_biased_than_the_plugin_error():
    # calibrated data: labels drawn from the predicted probabilities; the true error is 0
    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.ones(3), size=(200, 400))
    y = (rng.random((200, 400, 1)) > p.cumsum(-1)).sum(-1)
    debiased = np.mean([M.debiased_l2_ce(p[i], y[i]) ** 2 for i in range(200)])
    plugin = np.mean([M.ece(p[i], y[i], norm="l2", binning="quantile") ** 2 for i in range(200)])
    assert debiased < 0.25 * plugin


@pytest.mark.parametrize("mode", ["top-label", "marginal"])
def test_debiased_l2_agrees_with_uncertainty_calibration(mode):
    cal = pytest.importorskip("calibration")
    for seed, (n, c) in enumerate([(1000, 10), (5000, 3), (300, 2), (37, 4)]):
        p, y = make_data(seed, n, c)
        ref = cal.get_calibration_error(p, y, p=2, debias=True, mode=mode)
        # the same sums in another order: float64 rounding only
        assert M.debiased_l2_ce(p, y, mode=mode) == pytest.approx(ref, rel=1e-12, abs=1e-15)
        t = M.debiased_l2_ce(torch.tensor(p), torch.tensor(y), mode=mode)
        assert float(t) == M.debiased_l2_ce(p, y, mode=mode)


def test_debiased_l2_bad_input():
    p, y = make_data(0, 20, 3)
    with pytest.raises(ValueError, match="mode"):
        M.debiased_l2_ce(p, y, mode="classwise")
    with pytest.raises(ValueError, match="n_bins"):
        M.debiased_l2_ce(p, y, n_bins=0)
    with pytest.raises(ValueError, match="labels"):
        M.debiased_l2_ce(p, np.full(20, 3))


# ------------------------------------------------------------------------- selective


def test_risk_coverage_hand_case_with_ties():
    p = np.array([[0.9, 0.1], [0.8, 0.2], [0.8, 0.2], [0.6, 0.4]])
    y = np.array([0, 1, 0, 1])  # correct, wrong, correct, wrong
    rc = M.risk_coverage_curve(p, y)
    np.testing.assert_allclose(rc.thresholds, [0.9, 0.8, 0.6])
    np.testing.assert_allclose(rc.coverage, [0.25, 0.75, 1.0])
    np.testing.assert_allclose(rc.risk, [0.0, 1 / 3, 0.5])
    assert M.aurc(p, y) == pytest.approx(0.25 * 0 + 0.5 * (1 / 3) + 0.25 * 0.5)
    assert M.selective_risk(p, y, coverage=0.5) == pytest.approx(1 / 3)
    # oracle with 2 errors of 4: (1/3 + 2/4) / 4
    assert M.eaurc(p, y) == pytest.approx(M.aurc(p, y) - (1 / 3 + 2 / 4) / 4)


def test_eaurc_is_zero_when_errors_rank_last():
    rng = np.random.default_rng(0)
    conf = np.sort(rng.uniform(0.5, 1.0, 100))[::-1]
    p = np.stack([conf, 1 - conf], axis=1)
    y = np.r_[np.zeros(70, int), np.ones(30, int)]  # the 30 least confident are wrong
    assert M.eaurc(p, y) == pytest.approx(0.0, abs=1e-15)
    assert M.aurc(p, y) > 0


def test_aurc_agrees_with_uncertainty_calibration():
    cal = pytest.importorskip("calibration")
    p, y = make_data(4, 2000, 10)  # continuous confidences: no ties
    conf, correct = M.confidences_and_correct(p, y)
    area, _ = cal.get_selective_stats(conf, correct)  # mean accuracy of the k most confident
    assert M.aurc(p, y) == pytest.approx(1 - area, abs=1e-12)  # summation order only
    assert float(M.aurc(torch.tensor(p), torch.tensor(y))) == M.aurc(p, y)


def test_selective_bad_input():
    p, y = make_data(0, 20, 3)
    with pytest.raises(ValueError, match="coverage"):
        M.selective_risk(p, y, coverage=1.5)
    with pytest.raises(ValueError, match="coverage"):
        M.selective_risk(p, y, coverage=0)
    with pytest.raises(ValueError, match="probs"):
        M.aurc(p[:, :1] * 2, y)


# ------------------------------------------------------------------------- bootstrap


def test_bootstrap_any_metric_uses_the_same_resamples():
    p, y = make_data(6, 300, 4)
    iv = M.bootstrap("smece", p, y, n_boot=50, bandwidth=0.05)
    rng = np.random.default_rng(0)
    values = [M.smece(p[i], y[i], bandwidth=0.05)
              for i in (rng.integers(0, 300, 300) for _ in range(50))]
    assert iv.estimate == M.smece(p, y, bandwidth=0.05)
    assert (iv.low, iv.high) == tuple(np.quantile(values, [0.025, 0.975]))
    # ECE takes the per-bin-sums path; same numbers as bootstrap_interval
    assert M.bootstrap("ece", p, y, n_bins=10) == M.bootstrap_interval("ece", p, y, n_bins=10)
    dl2 = M.bootstrap("debiased_l2_ce", p, y, n_boot=20, mode="marginal")
    assert dl2.estimate == M.debiased_l2_ce(p, y, mode="marginal")


def test_bootstrap_agrees_with_scipy():
    stats = pytest.importorskip("scipy.stats")
    p, y = make_data(7, 400, 3)
    ours = M.bootstrap("error", p, y, n_boot=4000)
    _, correct = M.confidences_and_correct(p, y)
    ref = stats.bootstrap((1 - correct,), np.mean, n_resamples=4000, method="percentile",
                          random_state=1).confidence_interval
    # two independent sets of 4000 resamples: each 2.5% quantile has a Monte-Carlo standard
    # error of about sqrt(.025 * .975 / 4000) / density ~ 0.0025 * sd; sd of the error
    # rate is sqrt(e(1-e)/400) ~ 0.024, so 4 standard errors of the difference ~ 0.004
    assert ours.low == pytest.approx(ref.low, abs=0.004)
    assert ours.high == pytest.approx(ref.high, abs=0.004)


def test_bootstrap_bad_input():
    p, y = make_data(0, 20, 3)
    with pytest.raises(ValueError, match="metric"):
        M.bootstrap("accuracy", p, y)
    with pytest.raises(TypeError, match="bandwidth"):
        M.bootstrap("smece", p, y, n_boot=2, bandwidth="x")
    with pytest.raises(ValueError, match="n_boot"):
        M.bootstrap("aurc", p, y, n_boot=1)


@pytest.mark.parametrize(("bandwidth", "message"), [
    (1e-9, r"bandwidth 1e-09 needs a grid of 6\.4e\+10 cells .*the limit is bandwidth >= "
           r"3\.81e-06"),
    (1e9, r"bandwidth 1e\+09 is wider than needed: .*the limit is bandwidth <= 100"),
])
def test_smece_refuses_bandwidths_beyond_memory(bandwidth, message):
    p, y = make_data(0, 50, 3, scale=3.0)
    with pytest.raises(ValueError, match=message):
        M.smece(p, y, bandwidth=bandwidth)


def test_smece_at_its_bandwidth_limits_is_computed():
    p, y = make_data(0, 50, 3, scale=3.0)
    conf, correct = M.confidences_and_correct(p, y)
    # the widest kernel is flat on [0, 1]: the smoothed residual is the mean residual
    flat = abs(float(np.mean(np.asarray(conf) - np.asarray(correct))))
    assert M.smece(p, y, bandwidth=100.0) == pytest.approx(flat, abs=1e-9)
    narrow = M.smece(p, y, bandwidth=64 / M.smooth.SMECE_MAX_CELLS)
    # at a bandwidth far below the spacing of 50 samples nothing is smoothed: mean |r|
    assert narrow == pytest.approx(float(np.mean(np.abs(np.asarray(conf)
                                                        - np.asarray(correct)))), rel=1e-3)


def test_bootstrap_refuses_resamples_beyond_memory():
    p, y = make_data(0, 1000, 3)
    with pytest.raises(ValueError, match=r"n_boot=1000000 resamples of N=1000 samples draw "
                                         r"1e\+09 indices \(about 8 GB\); the limit is "
                                         r"n_boot \* N <= 2\.5e\+08"):
        M.bootstrap("ece", p, y, n_boot=10**6)
    with pytest.raises(ValueError, match=r"n_boot must be at most 1000000 \(the limit\), "
                                         r"got 1000000000"):
        M.bootstrap("error", p[:10], y[:10], n_boot=10**9)


@pytest.mark.parametrize("name", ["ece", "mce", "ace", "classwise_ece", "reliability_bins"])
def test_bin_counts_beyond_memory_are_refused(name):
    p, y = make_data(0, 20, 3)
    with pytest.raises(ValueError, match=r"n_bins must be at most 1000000 \(the limit"):
        getattr(M, name)(p, y, n_bins=10**8)


def test_smece_leaves_torch_threads_as_they_were():
    p, y = make_data(0, 200, 3, scale=3.0)
    before = torch.get_num_threads()
    M.smece(p, y)  # the fixed point runs on one thread inside
    M.smece(p, y, bandwidth=1e-5)  # a grid finer than 2^16 cells: torch's threads
    assert torch.get_num_threads() == before
