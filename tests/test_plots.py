"""Figures: they draw what the metrics say and never touch the global style."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from calnotes import metrics, plots  # noqa: E402


@pytest.fixture
def predictions():
    rng = np.random.default_rng(0)
    logits = 3 * rng.normal(size=(2000, 4))
    probs = torch.softmax(torch.from_numpy(logits), dim=1).numpy()
    labels = rng.integers(0, 4, size=2000)
    return probs, labels


def test_importing_calnotes_sets_no_style():
    import importlib

    before = dict(plt.rcParams)
    importlib.reload(plots)
    assert dict(plt.rcParams) == before


def test_reliability_diagram_draws_per_bin_accuracy(predictions):
    probs, labels = predictions
    fig, ax = plt.subplots()
    out = plots.reliability_diagram(probs, labels, n_bins=10, ax=ax)
    assert out is ax
    bins = metrics.reliability_bins(probs, labels, n_bins=10)
    counts = np.asarray(bins.counts)
    accuracy = np.asarray(bins.accuracy)[counts > 0]
    heights = [p.get_height() for p in ax.containers[0].patches]
    assert np.allclose(heights, accuracy)
    text = " ".join(t.get_text() for t in ax.texts)
    assert f"ECE {100 * metrics.ece(probs, labels, n_bins=10):.2f}%" in text
    plt.close(fig)


def test_reliability_diagram_new_axes_and_torch_input(predictions):
    probs, labels = predictions
    ax = plots.reliability_diagram(torch.from_numpy(probs), torch.from_numpy(labels),
                                   bootstrap=20, show_histogram=False, title="t")
    assert ax.get_title() == "t"
    plt.close(ax.figure)


def test_bootstrap_band_brackets_the_bin_accuracy(predictions):
    probs, labels = predictions
    lo, hi = plots.bootstrap_bin_accuracy(probs, labels, n_bins=10, n_boot=100)
    bins = metrics.reliability_bins(probs, labels, n_bins=10)
    acc, counts = np.asarray(bins.accuracy), np.asarray(bins.counts)
    filled = counts > 0
    assert np.all(lo[filled] <= acc[filled] + 1e-12)
    assert np.all(hi[filled] >= acc[filled] - 1e-12)
    assert np.all(hi[counts >= 20] - lo[counts >= 20] > 0)  # real uncertainty when populated
    assert np.all(np.isnan(lo[~filled]))


def test_confidence_histogram_and_curves(predictions):
    probs, labels = predictions
    ax = plots.confidence_histogram(probs, labels)
    assert sum(p.get_height() for p in ax.patches) == pytest.approx(1.0)
    plt.close(ax.figure)
    ax = plots.metric_curves([1, 2, 3], {"a": [1, 2, 3], "b": [3, 2, 1]},
                             bands={"a": ([0, 1, 2], [2, 3, 4])}, logx=True)
    assert len(ax.lines) == 2 and ax.get_xscale() == "log"
    plt.close(ax.figure)


def test_bad_input_names_the_argument(predictions):
    probs, labels = predictions
    with pytest.raises(ValueError, match="probs"):
        plots.reliability_diagram(probs * 2, labels)
    with pytest.raises(ValueError, match="labels"):
        plots.reliability_diagram(probs, labels[:-1])
    with pytest.raises(ValueError, match="level"):
        plots.bootstrap_bin_accuracy(probs, labels, level=1.5)
    with pytest.raises(ValueError, match="n_boot"):
        plots.bootstrap_bin_accuracy(probs, labels, n_boot=0)


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"n_bins": 0}, ValueError, "n_bins"),
        ({"n_bins": 2.5}, TypeError, "n_bins"),
        ({"level": 0.0}, ValueError, "level"),
        ({"level": float("nan")}, ValueError, "level"),
        ({"level": "0.9"}, TypeError, "level"),
        ({"seed": -1}, ValueError, "seed"),
        ({"seed": 0.5}, TypeError, "seed"),
    ],
)
def test_bootstrap_checks_bins_level_and_seed(predictions, kwargs, error, name):
    probs, labels = predictions
    with pytest.raises(error, match=name):
        plots.bootstrap_bin_accuracy(probs, labels, **kwargs)


@pytest.mark.parametrize("n_bins", [0, -3])
def test_confidence_histogram_checks_n_bins(predictions, n_bins):
    probs, labels = predictions
    with pytest.raises(ValueError, match="n_bins"):
        plots.confidence_histogram(probs, labels, n_bins=n_bins)


def test_bootstrap_bars_only_for_populated_bins(predictions):
    probs, labels = predictions
    counts = np.asarray(metrics.reliability_bins(probs, labels, n_bins=10).counts)
    ax = plots.reliability_diagram(probs, labels, n_bins=10, bootstrap=20, min_count=50)
    bars = [c for c in ax.containers if type(c).__name__ == "ErrorbarContainer"]
    segments = bars[0].lines[2][0].get_segments()
    assert len(segments) == int((counts >= 50).sum()) < int((counts > 0).sum())
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="min_count"):
        plots.reliability_diagram(probs, labels, bootstrap=5, min_count=0)
