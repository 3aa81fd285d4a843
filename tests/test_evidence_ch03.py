"""Chapter 3's measures: the lecture's evaluation loop and the post-hoc measure."""

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from calnotes import metrics
from calnotes.book.evidence import ch03


def _binary_probs(n, seed):
    rng = np.random.default_rng(seed)
    p = rng.uniform(0.01, 0.99, n)
    y = (rng.uniform(size=n) < p ** 1.5).astype(np.int64)
    return torch.tensor(np.stack([1 - p, p], axis=1)), torch.tensor(y)


def _fake_run(tmp_path, seed=0, n=600):
    g = torch.Generator().manual_seed(seed)
    def split(m):
        y = torch.randint(0, 2, (m,), generator=g)
        z = torch.randn(m, 2, generator=g) * 2
        z[torch.arange(m), y] += 1.5
        return z.float(), y
    val_z, val_y = split(n)
    test_z, test_y = split(n)
    return SimpleNamespace(path=tmp_path / f"run{seed}", val_logits=val_z, val_labels=val_y,
                           test_logits=test_z, test_labels=test_y)


def test_lecture_loop_drops_exactly_one_and_fills_empty_bins():
    conf = np.array([0.05, 0.95, 1.0, 1.0])
    outcome = np.array([0.0, 1.0, 1.0, 0.0])
    count, acc, mean = ch03.lecture_bins(conf, outcome, n_bins=10)
    assert count.sum() == 2  # the two confidences of exactly 1.0 fall in no bin [low, high)
    assert count[0] == 1 and count[9] == 1
    assert acc[4] == 0 and mean[4] == pytest.approx(0.45)  # an empty bin: 0 at its midpoint
    # the MCE sees the empty bins: the largest midpoint among them is 0.85
    probs = torch.tensor(np.stack([1 - conf, conf], axis=1))
    labels = torch.tensor([0, 1, 1, 0])
    mce = ch03.evaluate(probs, labels, "mce", bins=10, convention="lecture", target="positive")
    assert mce == pytest.approx(0.85)
    # the ECE divides by all four samples, the dropped ones included: |0 - .05| / 4 + |1 - .95| / 4
    ece = ch03.evaluate(probs, labels, "ece", bins=10, convention="lecture", target="positive")
    assert ece == pytest.approx(0.025)


def test_lecture_ece_equals_book_ece_without_edges_or_ones():
    # continuous confidences almost surely avoid every edge and 1.0, where [low, high) and
    # (low, high] agree, and an empty bin has weight 0 in both ECEs: the two code paths
    # (the lecture's loop, the library's vectorized binning) must give the same number up to
    # float64 summation order (about 1e-16 per term; 1e-12 leaves room)
    probs, labels = _binary_probs(5000, seed=1)
    lecture = ch03.evaluate(probs, labels, "ece", convention="lecture")
    book = float(metrics.ece(probs, labels, n_bins=15))
    assert abs(lecture - book) < 1e-12
    # the positive-class view in the book's convention against a direct loop over bins
    p, y = probs[:, 1].numpy(), labels.numpy()
    edges = np.linspace(0, 1, 16)
    total = 0.0
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        mask = (p > lo) & (p <= hi) if lo > 0 else (p <= hi)
        if mask.any():
            total += mask.sum() * abs(y[mask].mean() - p[mask].mean())
    positive = ch03.evaluate(probs, labels, "ece", convention="book", target="positive")
    assert abs(positive - total / len(p)) < 1e-12


def test_lecture_mce_differs_when_a_bin_is_empty():
    probs, labels = _binary_probs(2000, seed=2)  # top-label confidences all >= 0.5
    lecture = ch03.evaluate(probs, labels, "mce", convention="lecture")
    book = ch03.evaluate(probs, labels, "mce", convention="book")
    # bins below 0.5 are empty: the lecture's loop counts the largest empty midpoint, 13/30
    assert lecture >= 13 / 30 - 1e-12
    assert book < lecture


def test_posthoc_change_and_index(tmp_path):
    run = _fake_run(tmp_path)
    iso = ch03.posthoc(run, method="isotonic", metric="ece")
    unc = ch03.posthoc(run, metric="ece")
    rel = ch03.posthoc(run, method="isotonic", metric="ece", change="relative")
    assert rel == pytest.approx((iso - unc) / unc, rel=1e-12)
    diff = ch03.posthoc(run, method="temperature", reference="histogram", metric="ece",
                        binning="mass", change="difference")
    assert diff == pytest.approx(
        ch03.posthoc(run, method="temperature", metric="ece", binning="mass")
        - ch03.posthoc(run, method="histogram", metric="ece", binning="mass"), abs=1e-12)
    index = np.arange(0, 600, 3)
    sub = ch03.posthoc(run, index=index, method="platt", metric="nll")
    probs = ch03.calibrated_probs(run, "platt")[torch.as_tensor(index)]
    assert sub == pytest.approx(float(metrics.nll(probs, run.test_labels[index])), rel=1e-12)


def test_posthoc_bad_options(tmp_path):
    run = _fake_run(tmp_path, seed=3)
    with pytest.raises(ValueError, match="method"):
        ch03.posthoc(run, method="nope")
    with pytest.raises(ValueError, match="convention"):
        ch03.posthoc(run, convention="guo")
    with pytest.raises(ValueError, match="change"):
        ch03.posthoc(run, change="ratio")
    with pytest.raises(ValueError, match="binning"):
        ch03.posthoc(run, binning="mass", convention="lecture")
    with pytest.raises(ValueError, match="target"):
        ch03.posthoc(run, metric="nll", target="positive")


def test_share_at_one():
    probs = torch.tensor([[0.0, 1.0], [0.2, 0.8], [1.0, 0.0], [0.5, 0.5]], dtype=torch.float64)
    assert ch03.share_at_one(probs) == 0.5


@pytest.mark.parametrize("method", ["uncalibrated", "isotonic", "beta", "dirichlet"])
def test_posthoc_binned_fast_path_matches_the_library(tmp_path, method):
    run = _fake_run(tmp_path, seed=5)
    index = np.random.default_rng(1).integers(0, 600, 600)
    probs = ch03.calibrated_probs(run, method)[torch.as_tensor(index)]
    y = run.test_labels[index]
    for metric in ("ece", "mce"):
        fn = metrics.ece if metric == "ece" else metrics.mce
        # both sum the same float64 values over the same (b_{m-1}, b_m] bins in another
        # order: a few ulps of a number below 1
        assert ch03.posthoc(run, index=index, method=method, metric=metric) == pytest.approx(
            float(fn(probs, y, n_bins=15, binning="uniform")), abs=1e-12)
        for convention, target in (("lecture", "top"), ("book", "positive")):
            assert ch03.posthoc(run, index=index, method=method, metric=metric,
                                convention=convention, target=target) == pytest.approx(
                ch03.evaluate(probs, y, metric, convention=convention, target=target),
                abs=1e-12)


# --- the exercises' solutions


def _multi_run(tmp_path, n=800, k=4, scale=3.0, seed=0):
    """Overconfident K-class logits: labels drawn from softmax(z / scale)."""
    g = torch.Generator().manual_seed(seed)

    def split(m):
        z = torch.randn(m, k, generator=g, dtype=torch.float64) * 2 * scale
        y = torch.multinomial(torch.softmax(z / scale, dim=1), 1, generator=g).squeeze(1)
        return z, y

    (vz, vy), (tz, ty) = split(n), split(n)
    return SimpleNamespace(path=tmp_path / "run", val_logits=vz, val_labels=vy,
                           test_logits=tz, test_labels=ty,
                           config={"train_subset": 4000, "val_size": 1000, "epochs": 2},
                           provenance={"seconds": 120.0})


def test_temperature_objectives_recover_the_generating_temperature(tmp_path):
    table = ch03.temperature_objectives(_multi_run(tmp_path))
    assert list(table.index) == ["nll", "ece"]
    assert table.loc["nll", "T"] == pytest.approx(3.0, rel=0.15)  # statistical recovery
    assert table.loc["ece", "T"] == pytest.approx(3.0, rel=0.3)
    run = _multi_run(tmp_path)
    scaled = torch.softmax(run.test_logits / table.loc["nll", "T"], dim=1)
    assert table.loc["nll", "test ECE (%)"] == pytest.approx(
        100 * float(metrics.ece(scaled, run.test_labels)))


def test_small_validation_full_column_and_subset_bounds(tmp_path):
    run = _multi_run(tmp_path)
    table = ch03.small_validation(run, 100, 2, ["temperature", "histogram"], seed=1)
    assert list(table.columns) == ["all 800", "100, mean", "100, largest"]
    assert (table["100, largest"] >= table["100, mean"] - 1e-12).all()
    # the uncalibrated row does not depend on the validation data
    assert table.loc["uncalibrated"].nunique() == 1
    with pytest.raises(ValueError, match="size"):
        ch03.small_validation(run, 801, 1, ["temperature"])


def test_odir_sweep_first_draw_is_small_validations(tmp_path):
    run = _multi_run(tmp_path)
    odir = ch03.odir_sweep(run, [0.0, 10.0], size=200, seed=3)
    small = ch03.small_validation(run, 200, 1, ["matrix"], seed=3)
    assert odir.loc[0.0, "test ECE (%)"] == pytest.approx(small.loc["matrix", "200, mean"])
    assert list(odir.index) == [0.0, 10.0]


def test_vector_spread_and_training_seconds(tmp_path):
    spread = ch03.vector_spread([0.5, 1.0, 1.5], 2.0)  # w T = 1, 2, 3
    assert spread["min"] == 1.0 and spread["max"] == 3.0
    assert spread["cv"] == pytest.approx(np.std([1, 2, 3]) / 2)
    run = _multi_run(tmp_path)  # 120 s for 4,000 images x 2 epochs
    assert ch03.training_seconds(run, 40_000, 10) == pytest.approx(120 * 50)
    run.provenance = {}
    with pytest.raises(ValueError, match="wall time"):
        ch03.training_seconds(run, 1, 1)
