"""Report cards: bias, SD and RMSE of estimators, coverage of intervals, rejection rates."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from calnotes import metrics
from calnotes.report_cards import estimator_card, interval_card, rejection_card
from calnotes.synthetic import SyntheticModel

MODEL = SyntheticModel("overconfident")


def test_constant_estimator_has_exact_bias_and_no_spread():
    card = estimator_card(MODEL, [50, 100], {"const": lambda p, y: 0.1}, repeats=5)
    truth = MODEL.true_calibration_error()
    assert list(card["n"]) == [50, 100]
    np.testing.assert_allclose(card["bias"], 0.1 - truth)
    np.testing.assert_allclose(card["sd"], 0.0)
    np.testing.assert_allclose(card["rmse"], abs(0.1 - truth))
    np.testing.assert_allclose(card["target"], truth)


def test_rmse_is_bias_and_sd_together():
    card = estimator_card(MODEL, [200], {"ece": lambda p, y: metrics.ece(p, y, 10)},
                          repeats=20, targets={"ece": 0.05})
    row = card.iloc[0]
    # rmse^2 = bias^2 + sd^2 (n - 1) / n, with the sd's ddof=1
    assert row["rmse"] ** 2 == pytest.approx(row["bias"] ** 2 + row["sd"] ** 2 * 19 / 20)
    assert row["target"] == 0.05


def test_interval_card_counts_coverage_and_self_exclusion():
    def wide(p, y):
        return SimpleNamespace(estimate=0.5, low=0.0, high=1.0)

    def off(p, y):
        return SimpleNamespace(estimate=0.0, low=2.0, high=3.0)

    card = interval_card(MODEL, [30], {"wide": wide, "off": off}, repeats=8).set_index(
        "interval")
    assert card.loc["wide", "coverage"] == 1.0 and card.loc["wide", "width"] == 1.0
    assert card.loc["off", "coverage"] == 0.0 and card.loc["off", "excludes_estimate"] == 1.0
    assert card.loc["wide", "coverage_low"] < 1.0  # the Wilson interval of 8 of 8


def test_rejection_card_of_a_valid_test_on_a_calibrated_model():
    always = rejection_card(MODEL, [30], {"p": lambda p, y: SimpleNamespace(p_value=0.01)},
                            repeats=4)
    assert always["rejection"].tolist() == [1.0]
    calibrated = SyntheticModel("calibrated")
    card = rejection_card(calibrated, [300], {
        "spiegelhalter": metrics.spiegelhalter_test,
        "consistency": lambda p, y: metrics.consistency_test(p, y, 10, n_boot=100),
    }, repeats=40)
    # valid tests at 5%: more than 8 of 40 rejections has probability below 1e-3
    assert (card["rejection"] <= 8 / 40).all()


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="estimators"):
        estimator_card(MODEL, [10], {})
    with pytest.raises(ValueError, match="level"):
        rejection_card(MODEL, [10], {"x": metrics.spiegelhalter_test}, level=2.0)
    with pytest.raises(ValueError, match="sizes"):
        estimator_card(MODEL, [0], {"c": lambda p, y: 0.0})
