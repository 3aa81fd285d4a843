"""Synthetic predictions with a known calibration error."""

import numpy as np
import pytest

from calnotes.synthetic import CURVES, SyntheticModel, estimator_study


def test_calibrated_model_has_zero_true_error():
    assert SyntheticModel("calibrated").true_calibration_error() == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("curve", ["overconfident", "underconfident"])
def test_true_error_matches_monte_carlo(curve):
    model = SyntheticModel(curve, a=3.0, b=2.0)
    probs, _ = model.sample(400_000, seed=1)
    conf = probs[:, 1]
    monte_carlo = np.mean(np.abs(CURVES[curve](conf) - conf))
    assert model.true_calibration_error() == pytest.approx(monte_carlo, abs=2e-3)


def test_sample_accuracy_follows_the_curve():
    model = SyntheticModel("overconfident")
    probs, labels = model.sample(200_000, seed=2)
    conf = probs[:, 1]
    assert probs.shape == (200_000, 2) and np.allclose(probs.sum(1), 1)
    assert labels.mean() == pytest.approx(CURVES["overconfident"](conf).mean(), abs=5e-3)
    assert labels.mean() < conf.mean()  # overconfident


def test_sample_is_deterministic_by_seed():
    a = SyntheticModel().sample(100, seed=3)
    b = SyntheticModel().sample(100, seed=3)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_bad_arguments():
    with pytest.raises(ValueError, match="curve"):
        SyntheticModel("wiggly")
    with pytest.raises(ValueError, match="a must be"):
        SyntheticModel(a=-1.0)
    with pytest.raises(ValueError, match="n must be"):
        SyntheticModel().sample(0)
    with pytest.raises(ValueError, match="estimators"):
        estimator_study(SyntheticModel(), [10], {})


def test_estimator_study_shares_samples_across_estimators():
    def mean_conf(p, y):
        return p[:, 1].mean()

    study = estimator_study(SyntheticModel(), [50, 80], {"a": mean_conf, "b": mean_conf},
                            repeats=3, seed=5)
    assert len(study) == 2 * 3 * 2
    a = study[study.estimator == "a"]["estimate"].to_numpy()
    b = study[study.estimator == "b"]["estimate"].to_numpy()
    assert np.array_equal(a, b)
    assert np.allclose(study["error"], study["estimate"] - study["truth"])
