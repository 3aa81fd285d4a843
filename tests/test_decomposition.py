"""CORP score decomposition and reliability curve."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.optimize import isotonic_regression

from calnotes import metrics
from calnotes.metrics.decomposition import pav


def _predictions(n: int, c: int, seed: int, sharpen: float = 1.0):
    rng = np.random.default_rng(seed)
    probs = rng.dirichlet(np.ones(c), size=n)
    labels = (probs.cumsum(1) < rng.random((n, 1))).sum(1).clip(max=c - 1)
    q = probs**sharpen
    return q / q.sum(1, keepdims=True), labels


def test_pav_hand_computed_with_ties():
    x = np.array([0.2, 0.8, 0.8, 0.6])
    y = np.array([0.0, 1.0, 0.0, 1.0])
    # pooled: 0.2 -> 0, 0.6 -> 1 (1 sample), 0.8 -> 0.5 (2 samples); the violation
    # 1 > 0.5 pools the three samples to 2/3
    np.testing.assert_allclose(pav(x, y), [0.0, 2 / 3, 2 / 3, 2 / 3])


def test_pav_matches_scipy_on_distinct_forecasts():
    rng = np.random.default_rng(0)
    x = rng.random(300)
    y = (rng.random(300) < x**2).astype(float)
    order = np.argsort(x)
    ref = np.empty(300)
    ref[order] = isotonic_regression(y[order]).x
    np.testing.assert_allclose(pav(x, y), ref, atol=1e-12)


def test_brier_decomposition_hand_computed():
    x = np.array([0.2, 0.8, 0.8, 0.6])
    probs = np.stack([1 - x, x], axis=1)
    labels = np.array([0, 1, 0, 1])
    d = metrics.score_decomposition(probs, labels, "brier", "classwise")
    # one class: S(x) = 0.88/4, S(fit) = (0 + 1/9 + 4/9 + 1/9)/4 = 1/6, S(base rate 0.5) =
    # 0.25; the other class is the mirror image and gives the same three numbers
    assert d.score == pytest.approx(2 * 0.22)
    assert d.miscalibration == pytest.approx(2 * (0.22 - 1 / 6))
    assert d.discrimination == pytest.approx(2 * (0.25 - 1 / 6))
    assert d.uncertainty == pytest.approx(2 * 0.25)


@pytest.mark.parametrize("score", metrics.SCORES)
@pytest.mark.parametrize("mode", ["top-label", "classwise"])
def test_decomposition_identity_and_signs(score, mode):
    probs, labels = _predictions(800, 4, seed=1, sharpen=2.0)
    d = metrics.score_decomposition(torch.from_numpy(probs), torch.from_numpy(labels),
                                    score, mode)
    assert d.score == pytest.approx(d.miscalibration - d.discrimination + d.uncertainty,
                                    rel=1e-12)
    assert d.miscalibration > 0 and d.discrimination >= 0
    conf, correct = metrics.confidences_and_correct(probs, labels)
    reference = {
        ("brier", "classwise"): metrics.brier(probs, labels),
        ("log", "classwise"): -np.mean(np.log(np.where(np.eye(4)[labels] == 1, probs,
                                                       1 - probs)).sum(1)),
        ("brier", "top-label"): np.mean((conf - correct) ** 2),
        ("log", "top-label"): -np.mean(np.log(np.where(correct == 1, conf, 1 - conf))),
    }[score, mode]
    assert d.score == pytest.approx(reference, rel=1e-12)


def test_recalibrated_forecasts_have_no_miscalibration():
    rng = np.random.default_rng(2)
    x = rng.uniform(0.5, 1.0, 500)
    y = (rng.random(500) < x).astype(int)
    fit = np.clip(pav(x, y), 0.5, 1.0)  # top-label forecasts stay in [1/2, 1]
    probs = np.stack([1 - fit, fit], axis=1)
    correct_labels = y  # class 1 is the argmax where fit > 1/2
    keep = fit > 0.5
    d = metrics.score_decomposition(probs[keep], correct_labels[keep])
    assert d.miscalibration == pytest.approx(0.0, abs=1e-12)


def test_corp_curve_band_and_overconfidence():
    probs, labels = _predictions(2000, 3, seed=3)
    curve = metrics.corp_curve(probs, labels, n_boot=100)
    assert np.all(np.diff(curve.fitted) >= 0) and np.all(curve.low <= curve.high)
    inside = (curve.low <= curve.fitted) & (curve.fitted <= curve.high)
    assert inside.mean() > 0.7
    probs, labels = _predictions(2000, 3, seed=3, sharpen=3.0)
    curve = metrics.corp_curve(probs, labels, n_boot=100)
    top = curve.x > 0.9
    assert np.mean(curve.fitted[top] < curve.low[top]) > 0.5


def test_bad_arguments_are_named():
    probs, labels = _predictions(20, 3, seed=0)
    with pytest.raises(ValueError, match="score"):
        metrics.score_decomposition(probs, labels, score="crps")
    with pytest.raises(ValueError, match="mode"):
        metrics.score_decomposition(probs, labels, mode="marginal")
    with pytest.raises(ValueError, match="level"):
        metrics.corp_curve(probs, labels, level=1.5)


def test_corp_diagram_draws_the_fit_and_names_the_parts():
    import matplotlib.pyplot as plt

    from calnotes import plots

    probs, labels = _predictions(300, 3, seed=4, sharpen=2.0)
    ax = plots.corp_diagram(probs, labels, n_boot=20)
    curve = metrics.corp_curve(probs, labels, n_boot=20)
    np.testing.assert_allclose(ax.lines[0].get_ydata(), curve.fitted)
    d = metrics.score_decomposition(probs, labels)
    assert f"MCB {d.miscalibration:.4f}" in ax.texts[0].get_text()
    plt.close(ax.figure)
