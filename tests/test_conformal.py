"""Tests of calnotes.conformal: hand-computed scores, quantiles and sets; the finite-sample
guarantee by simulation (coverage within the beta-binomial band over many random splits);
class-conditional coverage; MAPIE as a peer (skipped when absent); bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from calnotes import conformal as cf


def softmax_data(seed: int, n: int, c: int = 5, scale: float = 2.0):
    """Labels drawn from the model's own probabilities: exchangeable, a calibrated model."""
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(scale * torch.randn(n, c, generator=g, dtype=torch.float64), dim=1)
    y = torch.multinomial(p, 1, generator=g).squeeze(1)
    return p, y


P = torch.tensor([[0.5, 0.3, 0.2], [0.1, 0.6, 0.3]], dtype=torch.float64)


# ----------------------------------------------------------------- hand-computed cases

def test_lac_scores_by_hand():
    torch.testing.assert_close(cf.class_scores(P, "lac"), 1 - P)


def test_aps_scores_by_hand():
    want = torch.tensor([[0.5, 0.8, 1.0], [1.0, 0.6, 0.9]], dtype=torch.float64)
    torch.testing.assert_close(cf.class_scores(P, "aps"), want)


def test_raps_penalty_by_hand():
    # ranks 1, 2, 3 with k_reg = 1: penalties 0, lam, 2 lam
    want = torch.tensor([[0.5, 0.9, 1.2], [1.2, 0.6, 1.0]], dtype=torch.float64)
    torch.testing.assert_close(cf.class_scores(P, "raps", k_reg=1, lam=0.1), want)
    # lam = 0 is APS
    torch.testing.assert_close(cf.class_scores(P, "raps", k_reg=0, lam=0.0),
                               cf.class_scores(P, "aps"))


def test_randomized_aps_lies_between_mass_above_and_mass_up_to():
    p, _ = softmax_data(0, 200)
    g = torch.Generator().manual_seed(1)
    s = cf.class_scores(p, "aps", randomized=True, generator=g)
    full = cf.class_scores(p, "aps")
    assert bool((s <= full + 1e-15).all()) and bool((s >= full - p - 1e-15).all())


def test_true_label_rank_and_label_scores():
    y = torch.tensor([2, 0])
    assert cf.true_label_rank(P, y).tolist() == [3, 3]
    torch.testing.assert_close(cf.label_scores(cf.class_scores(P, "lac"), y),
                               torch.tensor([0.8, 0.9], dtype=torch.float64))


def test_conformal_quantile_is_the_kth_smallest():
    s = torch.arange(1, 10, dtype=torch.float64)  # n = 9
    # k = ceil(10 * 0.8) = 8 -> the 8th smallest
    assert cf.conformal_quantile(s, 0.2) == 8.0
    # k = ceil(10 * 0.9) = 9
    assert cf.conformal_quantile(s, 0.1) == 9.0
    # k = ceil(10 * 0.95) = 10 > n: no finite threshold
    assert math.isinf(cf.conformal_quantile(s, 0.05))


def test_sets_by_hand():
    # dyadic probabilities: the scores are exact in float64
    cal = torch.tensor([[0.75, 0.25, 0.0], [0.25, 0.75, 0.0], [0.5, 0.5, 0.0],
                        [0.0, 0.125, 0.875]], dtype=torch.float64)
    y = torch.tensor([0, 1, 0, 2])  # LAC scores 0.25, 0.25, 0.5, 0.125
    test = torch.tensor([[0.5, 0.5, 0.0], [0.75, 0.25, 0.0], [0.25, 0.25, 0.5]],
                        dtype=torch.float64)
    # n = 4, alpha = 0.2: k = ceil(5 * 0.8) = 4 -> threshold 0.5
    sets = cf.prediction_sets(cal, y, test, alpha=0.2, score="lac")
    assert sets.tolist() == [[True, True, False], [True, False, False], [False, False, True]]
    # alpha = 0.4: k = 3 -> threshold 0.25: the last input's set is empty
    sets = cf.prediction_sets(cal, y, test, alpha=0.4, score="lac")
    assert sets.tolist() == [[False, False, False], [True, False, False], [False, False, False]]


def test_mondrian_thresholds_per_class():
    cal = torch.tensor([[0.9, 0.1], [0.8, 0.2], [0.3, 0.7], [0.4, 0.6]], dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 1])
    m = cf.SplitConformal(alpha=0.4, score="lac", mondrian=True).fit(cal, y)
    # class 0 scores 0.1, 0.2 (n = 2, k = ceil(3 * 0.6) = 2 -> 0.2); class 1: 0.3, 0.4 -> 0.4
    torch.testing.assert_close(m.threshold_, torch.tensor([0.2, 0.4], dtype=torch.float64))


def test_metrics_by_hand():
    sets = torch.tensor([[True, False, False], [True, True, False], [False, False, True],
                         [True, True, True]])
    y = torch.tensor([0, 2, 2, 1])
    assert cf.coverage(sets, y) == 0.75
    assert cf.set_size(sets) == 7 / 4
    np.testing.assert_allclose(cf.class_coverage(sets, y), [1.0, 1.0, 0.5])
    assert cf.size_stratified_coverage(sets, y) == {1: (1.0, 2), 2: (0.0, 1), 3: (1.0, 1)}
    mean, cov, count = cf.binned_coverage(sets, y, torch.tensor([0.1, 0.2, 0.3, 0.4]), 2)
    np.testing.assert_allclose(mean, [0.15, 0.35])
    np.testing.assert_allclose(cov, [0.5, 1.0])
    assert count.tolist() == [2, 2]


def test_numpy_in_numpy_out():
    p, y = softmax_data(1, 50)
    sets = cf.prediction_sets(p.numpy(), y.numpy(), p.numpy(), 0.1, "lac")
    assert isinstance(sets, np.ndarray) and sets.dtype == bool
    assert isinstance(cf.class_scores(p.numpy(), "aps"), np.ndarray)


def test_raps_k_reg_rule():
    # true-label ranks 1, 1, 2, 3 (n = 4); alpha = 0.5: k = ceil(5 * 0.5) = 3 -> rank 2
    p = torch.tensor([[0.6, 0.3, 0.1]] * 4, dtype=torch.float64)
    y = torch.tensor([0, 0, 1, 2])
    assert cf.raps_k_reg(p, y, 0.5) == 2


# -------------------------------------------------------------------- the guarantee

@pytest.mark.parametrize("score,randomized,mondrian", [
    ("lac", False, False), ("aps", False, False), ("aps", True, False),
    ("raps", True, False), ("lac", False, True)])
def test_coverage_within_the_guaranteed_band(score, randomized, mondrian):
    """Over many random calibration/test splits of exchangeable data, each split's test
    coverage follows the beta-binomial law of the guarantee: count the splits outside its
    central 98% band and compare with what a 2% rate allows (binomial, one-sided 1e-4)."""
    from scipy import stats

    n_cal, n_test, alpha, reps = 200, 300, 0.1, 200
    p, y = softmax_data(7, (n_cal + n_test) * reps, c=5, scale=1.5)
    p, y = p.view(reps, n_cal + n_test, -1), y.view(reps, -1)
    lo, hi = cf.coverage_band(n_cal, n_test, alpha, level=0.98)
    outside, covs = 0, []
    for r in range(reps):
        model = cf.SplitConformal(alpha, score, randomized=randomized, mondrian=mondrian,
                                  seed=r)
        sets = model.fit(p[r, :n_cal], y[r, :n_cal]).predict_sets(p[r, n_cal:])
        cov = cf.coverage(sets, y[r, n_cal:])
        covs.append(cov)
        outside += not lo <= cov <= hi
    # the band holds each split's coverage with probability >= 0.98 (exactly for
    # continuous scores; Mondrian is conservative, its per-class bands are wider)
    assert outside <= stats.binom.isf(1e-4, reps, 0.02)
    # the mean over splits is >= 1 - alpha up to its own sampling error (4 standard errors)
    assert np.mean(covs) >= 1 - alpha - 4 * np.std(covs) / math.sqrt(reps)


def test_mondrian_covers_every_class_where_marginal_does_not():
    """A model that is useless on class 0 only: marginal sets under-cover class 0,
    class-conditional sets cover each class at least 1 - alpha on average."""
    g = torch.Generator().manual_seed(3)
    n, c = 20000, 4
    y = torch.randint(0, c, (n,), generator=g)
    z = 3.0 * torch.nn.functional.one_hot(y, c).double() + torch.randn(n, c, generator=g)
    z[y == 0] = torch.randn(int((y == 0).sum()), c, generator=g, dtype=torch.float64)
    p = torch.softmax(z, dim=1)
    half = n // 2
    for mondrian in (False, True):
        sets = cf.prediction_sets(p[:half], y[:half], p[half:], 0.1, "lac", mondrian=mondrian)
        per_class = cf.class_coverage(sets, y[half:])
        if mondrian:
            se = math.sqrt(0.1 * 0.9 / (half / c))
            assert per_class.min() >= 0.9 - 4 * se
        else:
            assert per_class[0] < 0.9 - 0.1  # the failure marginal coverage hides


def test_coverage_band_by_hand():
    # n_cal = 9, alpha = 0.1: k = 9, Beta(9, 1): coverage of one test point has mean 0.9
    lo, hi = cf.coverage_band(9, 1, 0.1, level=0.5)
    assert (lo, hi) == (1.0, 1.0)
    lo, hi = cf.coverage_band(1000, 1000, 0.1, level=0.99)
    assert lo < 0.9 < hi and hi - lo < 0.07


# --------------------------------------------------------------------------- the peer

class _ProbsAsFeatures:
    """A fitted 'classifier' whose features are already the probabilities."""

    _estimator_type = "classifier"

    def __init__(self, c: int) -> None:
        self.classes_ = np.arange(c)
        self.n_features_in_ = c

    def fit(self, x, y):
        return self

    def predict_proba(self, x):
        return np.asarray(x, dtype=np.float64)

    def predict(self, x):
        return np.asarray(x).argmax(axis=1)

    def get_params(self, deep=True):
        return {"c": len(self.classes_)}

    def __sklearn_tags__(self):
        from sklearn.utils import ClassifierTags, Tags, TargetTags

        return Tags(estimator_type="classifier", target_tags=TargetTags(required=True),
                    classifier_tags=ClassifierTags())


def test_lac_sets_equal_mapie():
    classification = pytest.importorskip("mapie.classification")
    p, y = softmax_data(11, 3000, c=6)
    cal_p, cal_y, test_p = p[:1000], y[:1000], p[1000:]
    for alpha in (0.05, 0.1, 0.2):
        peer = classification.SplitConformalClassifier(
            _ProbsAsFeatures(6), confidence_level=1 - alpha, conformity_score="lac",
            prefit=True)
        peer.conformalize(cal_p.numpy(), cal_y.numpy())
        _, peer_sets = peer.predict_set(test_p.numpy())
        ours = cf.prediction_sets(cal_p, cal_y, test_p, alpha, "lac").numpy()
        # the same float64 scores compared with <= against the same order statistic: the
        # sets can differ only on a test score tied with the threshold, which has
        # probability 0 for these continuous scores
        assert np.array_equal(ours, peer_sets[:, :, 0]), alpha


def test_aps_convention_against_mapie():
    """MAPIE's APS (include_last_label=True) keeps the classes whose mass ranked strictly
    above them is below its threshold: with our APS scores, {y : s(x, y) - p_y < q}. Its
    calibration scores are randomized but these sets are not, so they over-cover: its
    threshold is compared with ours only through what the guarantee promises, ours within
    the band, MAPIE's at least its lower end."""
    classification = pytest.importorskip("mapie.classification")
    p, y = softmax_data(11, 3000, c=6)
    cal_p, cal_y, test_p, test_y = p[:1000], y[:1000], p[1000:], y[1000:]
    peer = classification.SplitConformalClassifier(
        _ProbsAsFeatures(6), confidence_level=0.9, conformity_score="aps", prefit=True,
        random_state=0)
    peer.conformalize(cal_p.numpy(), cal_y.numpy())
    _, peer_sets = peer.predict_set(test_p.numpy(),
                                    conformity_score_params={"include_last_label": True})
    peer_sets = peer_sets[:, :, 0]
    q = float(np.asarray(peer._mapie_classifier.quantiles_).ravel()[0])
    above = torch.as_tensor(cf.class_scores(test_p, "aps")) - test_p
    assert np.array_equal((above < q).numpy(), peer_sets)
    lo, hi = cf.coverage_band(1000, 2000, 0.1, level=0.999)
    ours = cf.prediction_sets(cal_p, cal_y, test_p, 0.1, "aps", randomized=True)
    assert lo <= cf.coverage(ours, test_y) <= hi
    assert cf.coverage(torch.from_numpy(peer_sets), test_y) >= lo


# ------------------------------------------------------------------------- bad input

@pytest.mark.parametrize("call,err,word", [
    (lambda: cf.class_scores(P, "thr"), ValueError, "score"),
    (lambda: cf.class_scores(P * 2, "lac"), ValueError, "probs"),
    (lambda: cf.class_scores(P.float().log(), "lac"), ValueError, "probs"),
    (lambda: cf.class_scores([[0.5, 0.5]], "lac"), TypeError, "probs"),
    (lambda: cf.class_scores(P, "aps", randomized=1), TypeError, "randomized"),
    (lambda: cf.class_scores(P, "raps", lam=-1.0), ValueError, "lam"),
    (lambda: cf.SplitConformal(alpha=1.0), ValueError, "alpha"),
    (lambda: cf.SplitConformal(alpha=0), ValueError, "alpha"),
    (lambda: cf.SplitConformal(alpha="0.1"), TypeError, "alpha"),
    (lambda: cf.SplitConformal(score="naive"), ValueError, "score"),
    (lambda: cf.SplitConformal().fit(P, torch.tensor([0, 3])), ValueError, "labels"),
    (lambda: cf.SplitConformal().fit(P, torch.tensor([0.0, 1.0])), TypeError, "labels"),
    (lambda: cf.SplitConformal().fit(P, torch.tensor([0])), ValueError, "labels"),
    (lambda: cf.SplitConformal().predict_sets(P), ValueError, "fit"),
    (lambda: cf.conformal_quantile(torch.tensor([]), 0.1), ValueError, "scores"),
    (lambda: cf.conformal_quantile(torch.tensor([float("nan")]), 0.1), ValueError, "NaN"),
    (lambda: cf.coverage(torch.ones(2, 3), torch.tensor([0, 1])), TypeError, "sets"),
    (lambda: cf.coverage(torch.ones(2, 3, dtype=torch.bool), torch.tensor([0])),
     ValueError, "labels"),
    (lambda: cf.binned_coverage(torch.ones(2, 3, dtype=torch.bool), torch.tensor([0, 1]),
                                torch.tensor([0.1]), 2), ValueError, "values"),
    (lambda: cf.coverage_band(0, 10, 0.1), ValueError, "n_cal"),
])
def test_bad_input_is_refused(call, err, word):
    with pytest.raises(err, match=word):
        call()


# ------------------------------------------------- python -m calnotes report --alpha

def _logit_files(tmp_path):
    g = torch.Generator().manual_seed(5)
    out = {}
    for name, n in (("val", 800), ("test", 600)):
        z = 2.0 * torch.randn(n, 4, generator=g, dtype=torch.float64)
        y = torch.multinomial(torch.softmax(z, dim=1), 1, generator=g)[:, 0]
        np.savez(tmp_path / f"{name}.npz", logits=(3.0 * z).float().numpy(), labels=y.numpy())
        out[name] = (tmp_path / f"{name}.npz", z, y)
    return out


def test_conformal_report_calibrates_on_val_and_measures_on_test(tmp_path):
    from calnotes.report import conformal_report

    f = _logit_files(tmp_path)
    (_, zv, yv), (_, zt, yt) = f["val"], f["test"]
    table, sets = conformal_report(3.0 * zv, yv, 3.0 * zt, yt, alpha=0.2)
    assert list(table.index) == ["LAC", "APS", "RAPS"]
    want = cf.prediction_sets(torch.softmax(3.0 * zv, 1), yv, torch.softmax(3.0 * zt, 1),
                              0.2, "lac").numpy()
    assert np.array_equal(sets["lac"], want)
    assert table.loc["LAC", "coverage"] == cf.coverage(torch.from_numpy(want), yt)
    assert table.loc["LAC", "band_low"] < 0.8 < table.loc["LAC", "band_high"]
    with pytest.raises(ValueError, match="alpha"):
        conformal_report(zv, yv, zt, yt, alpha=1.5)


def test_cli_alpha_prints_the_sets_table_and_writes_the_sets(tmp_path, capsys):
    import json

    from calnotes.__main__ import main

    f = _logit_files(tmp_path)
    out = tmp_path / "out"
    rc = main(["report", str(f["val"][0]), str(f["test"][0]), "--out", str(out),
               "--alpha", "0.1", "--boot", "20", "--folds", "2"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "conformal sets at alpha = 0.1" in text and "RAPS" in text
    with np.load(out / "conformal_sets.npz") as saved:
        assert set(saved.files) == {"lac", "aps", "raps"}
        assert saved["aps"].shape == (600, 4) and saved["aps"].dtype == bool
    rc = main(["report", str(f["val"][0]), str(f["test"][0]), "--out", str(out),
               "--alpha", "0.1", "--boot", "20", "--folds", "2", "--json"])
    data = json.loads(capsys.readouterr().out)
    assert rc == 0 and set(data["conformal"]["scores"]) == {"LAC", "APS", "RAPS"}
    assert main(["report", str(f["val"][0]), str(f["test"][0]), "--out", str(out),
                 "--alpha", "2"]) == 2
