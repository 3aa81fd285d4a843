"""Chapter 1's studies (calnotes/book/evidence/ch01.py)."""

import numpy as np
import pytest
import torch

from calnotes import metrics
from calnotes.book.evidence import ch01
from calnotes.synthetic import SyntheticModel


def test_kernel_smoother_reproduces_the_library_sece():
    probs, labels = SyntheticModel("overconfident").sample(3000, seed=1)
    ours = ch01.smooth_ece(probs[:, 1], labels.astype(float), 0.05, "accuracy")
    # The grid smoother moves each kernel value by at most (step / h)^2 / 8 = 1.25e-5
    # relative, so each soft accuracy by at most twice that; the library's own grid path is
    # within 1e-7 of its exact sums. 5e-5 bounds the difference of the two means.
    assert abs(ours - float(metrics.sece(probs, labels, bandwidth=0.05))) < 5e-5


def test_constant_confidence_matching_accuracy_gives_zero_for_both_variants():
    conf = np.full(4, 0.75)
    correct = np.array([1.0, 1.0, 1.0, 0.0])  # accuracy 3/4 = the confidence
    for smooth in ch01.SMOOTHING:  # every weight is equal: SACC = 0.75, SCONF = 0.75
        assert ch01.smooth_ece(conf, correct, 0.05, smooth) == pytest.approx(0.0, abs=1e-12)


def test_both_smoothed_removes_the_boundary_bias_of_a_calibrated_model():
    # Calibrated model with confidences piled near 1: the paper's SECE compares a soft
    # accuracy pulled down by the left-only neighbours with the raw confidence.
    probs, labels = SyntheticModel("calibrated", a=4.0, b=0.5).sample(20000, seed=3)
    conf, correct = probs[:, 1], labels.astype(float)
    assert ch01.smooth_ece(conf, correct, 0.05, "both") < ch01.smooth_ece(conf, correct, 0.05,
                                                                             "accuracy")


def test_studies_are_deterministic_per_seed():
    a = ch01.sece_vs_ece(n=400, draws=3, seed=1)
    np.testing.assert_array_equal(a, ch01.sece_vs_ece(n=400, draws=3, seed=1))
    assert not np.array_equal(a, ch01.sece_vs_ece(n=400, draws=3, seed=2))
    assert ch01.binned_bias(n=300, draws=4).shape == (4,)


def test_bins_difference_is_the_difference_of_two_library_eces():
    values = ch01.bins_difference(n=500, draws=2, bins=(30, 10), seed=5)
    draw = np.random.SeedSequence([5, 500, 1])  # the study's second draw
    probs, labels = SyntheticModel("overconfident").sample(500, seed=draw)
    expected = (float(metrics.ece(probs, labels, n_bins=30))
                - float(metrics.ece(probs, labels, n_bins=10)))
    assert values[1] == expected


def test_network_density_is_fitted_by_moments_to_chapter_1s_run():
    from calnotes.book.evidence.ch02_runs import ch01_config
    from calnotes.runs.store import RunStore

    store = RunStore()
    if not store.exists(ch01_config(0)):
        pytest.skip("chapter 1's stored run is not in results/")
    a, b = ch01.network_beta()
    run = store.load(ch01_config(0))
    conf = torch.softmax(run.test_logits.double(), dim=1).max(dim=1).values.numpy()
    x = np.clip(2 * conf - 1, 1e-6, 1 - 1e-6)
    mean, var = a / (a + b), a * b / ((a + b) ** 2 * (a + b + 1))  # Beta(a, b) moments
    assert mean == pytest.approx(x.mean(), rel=1e-9)
    assert var == pytest.approx(x.var(), rel=1e-9)


@pytest.mark.parametrize("kwargs, name", [({"density": "flat"}, "density"),
                                          ({"smooth": "none"}, "smooth"),
                                          ({"draws": 1}, "draws")])
def test_bad_options_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        ch01.sece_vs_ece(n=100, **{"draws": 2, **kwargs})


# --- the exercises' solutions


class _History:
    def __init__(self, val_ece):
        self.val_ece = val_ece

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame({"epoch": range(1, len(self.val_ece) + 1), "val_ece": self.val_ece})


def test_compare_runs_hand_computed():
    from types import SimpleNamespace

    # two samples, both predicted class 0 with confidence 0.75 (logits log 3 and 0); one right
    logits = torch.tensor([[np.log(3.0), 0.0], [np.log(3.0), 0.0]])
    run = SimpleNamespace(test_logits=logits, test_labels=torch.tensor([0, 1]),
                          history=_History([0.3, 0.1, 0.25]))
    row = ch01.compare_runs({"a": run}).loc["a"]
    assert row["test error"] == pytest.approx(50.0)
    assert row["mean confidence"] == pytest.approx(75.0)
    assert row["test ECE"] == pytest.approx(25.0)  # one bin: |0.75 - 0.5|
    assert row["val. ECE drift"] == pytest.approx(15.0)  # 0.25 - 0.1


def test_exercise_config_is_chapter_2s_regime_or_tiny():
    from calnotes.book.evidence.ch02_runs import sweep_config

    assert ch01.exercise_config(False, model="lenet5") == sweep_config("lenet5")
    tiny = ch01.exercise_config(True, model="resnet20", weight_decay=0.005)
    assert (tiny["epochs"], tiny["train_subset"], tiny["weight_decay"]) == (1, 200, 0.005)


def test_bandwidth_table_is_the_estimator_tables_bias():
    table = ch01.bandwidth_table(500, 3, [0.02, 0.1], density="beta", seed=4)
    assert list(table.index.get_level_values("bandwidth").unique()) == [0.02, 0.1]
    direct = ch01.estimator_table(500, 3, "beta", bandwidth=0.1, seed=4)
    expected = 100 * (direct["SECE (paper)"] - direct["truth"])
    assert table.loc[(0.1, "SECE (paper)"), "bias"] == pytest.approx(expected.mean())
    assert table.loc[(0.1, "SECE (paper)"), "std"] == pytest.approx(expected.std(ddof=1))


def test_l2_debiasing_removes_part_of_the_plug_in_bias():
    table = ch01.l2_debiasing([200, 2000], repeats=5, seed=1)
    assert list(table.index) == [200, 2000]
    # calibrated model: the plug-in L2 estimate is positive noise, the debiased one smaller
    assert (table["plug-in L2 ECE"] > table["debiased L2 error"]).all()
    share = 1 - table["debiased L2 error"] / table["plug-in L2 ECE"]
    assert np.allclose(table["bias removed (share)"], share)


@pytest.mark.parametrize("bandwidth", [0.02, 0.1, 0.2, 0.5])
def test_kernel_smoother_matches_the_library_at_wide_bandwidths(bandwidth):
    # a kernel longer than the grid (h > 1/16) once misaligned the convolution
    probs, labels = ch01.synthetic_model("calibrated", "network").sample(300, seed=2)
    ours = ch01.smooth_ece(probs[:, 1], labels.astype(float), bandwidth, "accuracy")
    assert abs(ours - float(metrics.sece(probs, labels, bandwidth=bandwidth))) < 5e-4
