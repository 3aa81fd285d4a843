"""scikit-learn: the scorers (check_scoring, cross_val_score, GridSearchCV, label mapping,
sample weights through metadata routing) and the calibrators as estimators (get_params,
set_params, clone, Pipeline, scikit-learn's own estimator checks)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import sklearn
from sklearn.base import clone
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import check_scoring
from sklearn.model_selection import GridSearchCV, KFold, cross_val_score, cross_validate
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import FunctionTransformer
from sklearn.utils import estimator_checks as checks

import calnotes.calibrators as C
import calnotes.metrics as M
from calnotes.metrics.sklearn import SCORER_METRICS, sklearn_scorer


@pytest.fixture(scope="module")
def digits():
    x, y = load_digits(return_X_y=True)
    return x / 16.0, y


@pytest.fixture(scope="module")
def fitted(digits):
    x, y = digits
    return LogisticRegression(C=0.1, max_iter=300).fit(x[:1000], y[:1000])


# ---------------------------------------------------------------- scorers


@pytest.mark.parametrize("name", sorted(SCORER_METRICS))
def test_scorer_is_the_negated_metric(digits, fitted, name):
    x, y = digits
    scorer = sklearn_scorer(name)
    assert check_scoring(fitted, scoring=scorer) is scorer
    want = SCORER_METRICS[name](fitted.predict_proba(x[1000:]), y[1000:])
    assert scorer(fitted, x[1000:], y[1000:]) == -want


def test_scorer_passes_options_and_weights(digits, fitted):
    x, y = digits
    p = fitted.predict_proba(x[1000:])
    w = np.random.default_rng(0).uniform(0, 2, len(p))
    scorer = sklearn_scorer("ece", n_bins=10, binning="quantile")
    assert scorer(fitted, x[1000:], y[1000:]) == -M.ece(p, y[1000:], n_bins=10,
                                                        binning="quantile")
    assert scorer(fitted, x[1000:], y[1000:], sample_weight=w) == -M.ece(
        p, y[1000:], n_bins=10, binning="quantile", sample_weight=w)


def test_scorer_maps_labels_to_the_columns_of_classes(digits):
    x, y = digits
    names = np.array(["zero", "one", "two", "three", "four", "five", "six", "seven",
                      "eight", "nine"])[y]  # classes_ sorted alphabetically, not by digit
    model = LogisticRegression(C=0.1, max_iter=300).fit(x[:1000], names[:1000])
    want = M.nll(model.predict_proba(x[1000:]),
                 np.searchsorted(model.classes_, names[1000:]))
    assert sklearn_scorer("nll")(model, x[1000:], names[1000:]) == -want
    with pytest.raises(ValueError, match="labels the estimator was not fitted on"):
        sklearn_scorer("nll")(model, x[:3], np.array(["ten", "one", "two"]))


def test_scorer_in_cross_val_score_and_grid_search(digits):
    x, y = digits
    scorer = sklearn_scorer("ece", n_bins=15)
    scores = cross_val_score(LogisticRegression(max_iter=300), x, y, scoring=scorer, cv=3)
    assert scores.shape == (3,) and (scores <= 0).all() and (scores >= -1).all()
    search = GridSearchCV(LogisticRegression(max_iter=300), {"C": [0.01, 1.0]},
                          scoring=scorer, cv=3).fit(x, y)
    means = search.cv_results_["mean_test_score"]
    assert search.best_score_ == means.max()  # the least ECE wins
    assert search.best_params_ == {"C": [0.01, 1.0][int(means.argmax())]}


def test_scorer_weights_through_metadata_routing(digits):
    x, y = digits
    w = np.random.default_rng(1).uniform(0, 2, len(y))
    scorer = sklearn_scorer("brier")
    with sklearn.config_context(enable_metadata_routing=True):
        model = LogisticRegression(max_iter=300).set_fit_request(sample_weight=False)
        got = cross_validate(model, x, y, scoring=scorer, cv=KFold(2),
                             params={"sample_weight": w}, return_estimator=True)
    half = np.arange(len(y)) >= len(y) // 2 + len(y) % 2  # KFold(2): the second fold
    est = got["estimator"][0]  # trained on the second half, tested on the first
    want = M.brier(est.predict_proba(x[~half]), y[~half], sample_weight=w[~half])
    assert got["test_score"][0] == pytest.approx(-want, abs=1e-15)


def test_scorer_bad_arguments():
    with pytest.raises(ValueError, match="metric must be one of"):
        sklearn_scorer("accuracy")
    with pytest.raises(ValueError, match="ece takes no option"):
        sklearn_scorer("ece", nbins=10)
    with pytest.raises(TypeError, match="estimator must have predict_proba"):
        sklearn_scorer("ece")(object(), np.zeros((2, 2)), np.zeros(2))


# ---------------------------------------------------------------- calibrators as estimators

CALIBRATORS = sorted(C.CALIBRATORS.items())
IDS = [name for name, _ in CALIBRATORS]
# scikit-learn's checks that apply to an estimator of logits (X has one column per class,
# y holds classes 0 .. C-1): parameters, cloning, unfitted errors, fitting on such data.
CHECKS = [
    checks.check_parameters_default_constructible,
    checks.check_no_attributes_set_in_init,
    checks.check_get_params_invariance,
    checks.check_set_params,
    checks.check_estimator_cloneable,
    checks.check_estimator_repr,
    checks.check_estimators_unfitted,
    checks.check_fit_check_is_fitted,
    checks.check_dont_overwrite_parameters,
]


@pytest.mark.parametrize(("name", "klass"), CALIBRATORS, ids=IDS)
@pytest.mark.parametrize("check", CHECKS, ids=[c.__name__ for c in CHECKS])
def test_calibrators_pass_sklearn_estimator_checks(name, klass, check):
    with warnings.catch_warnings():
        # check_set_params warns (only) when a rejected value changed the parameters; the
        # calibrators validate in set_params on purpose (bad input raises at once)
        warnings.filterwarnings("ignore", message=".*It is recommended to delay parameter")
        warnings.filterwarnings("error", message="Estimator's parameters changed")
        check(klass.__name__, klass())


@pytest.mark.parametrize("name", ["temperature", "vector", "matrix", "platt", "dirichlet"])
def test_scaling_calibrators_fit_idempotent(name):
    # (the binning calibrators have no transform, which this check calls)
    klass = C.CALIBRATORS[name]
    checks.check_fit_idempotent(klass.__name__, klass())


def test_get_set_params_and_clone():
    cal = C.HistogramBinning(n_bins=10)
    assert cal.get_params() == {"n_bins": 10, "binning": "uniform"}
    assert cal.set_params(n_bins=20) is cal and cal.n_bins == 20
    with pytest.raises(ValueError, match="n_bins must be >= 1"):
        cal.set_params(binning="quantile", n_bins=0)
    assert cal.get_params() == {"n_bins": 20, "binning": "uniform"}  # nothing changed
    with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['bins'\]"):
        cal.set_params(bins=3)
    bbq = clone(C.BBQ(n_bins=[2, 3]))  # the constructor's tuple, not the identity check
    assert bbq.n_bins == (2, 3) and not hasattr(bbq, "n_classes_")


def test_calibrator_in_pipeline_and_grid_search(digits, fitted):
    x, y = digits
    probs = fitted.predict_proba(x[1000:])
    logits = np.log(np.clip(probs, 1e-300, None))
    pipe = make_pipeline(FunctionTransformer(lambda p: np.log(np.clip(p, 1e-300, None))),
                         C.TemperatureScaling())
    pipe.fit(probs[:400], y[1000:1400])
    direct = C.TemperatureScaling().fit(logits[:400], y[1000:1400])
    np.testing.assert_array_equal(pipe.predict_proba(probs[400:]),
                                  direct.predict_proba(logits[400:]))
    np.testing.assert_array_equal(pipe.predict(probs[400:]),
                                  direct.predict_proba(logits[400:]).argmax(axis=1))
    assert list(pipe.classes_) == list(range(10))
    search = GridSearchCV(C.HistogramBinning(), {"n_bins": [5, 15]},
                          scoring=sklearn_scorer("ece"), cv=3).fit(logits, y[1000:])
    means = search.cv_results_["mean_test_score"]
    assert np.isfinite(means).all() and (means <= 0).all()  # -ECE of each setting
    assert search.best_params_ == {"n_bins": [5, 15][int(means.argmax())]}
    assert isinstance(search.best_estimator_, C.HistogramBinning)
    assert search.best_estimator_.n_bins == search.best_params_["n_bins"]
