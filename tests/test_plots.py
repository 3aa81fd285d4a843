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


def _figure3_curves():
    """An error that falls throughout and an NLL that falls, then rises by 8% of its value:
    on an axis shared with the error in percent (0-40) the rise would be a sliver."""
    epochs = np.arange(1, 21)
    error = 40 * np.exp(-epochs / 6) + 10
    nll = 0.48 + 0.002 * (epochs - 9) ** 2
    return epochs, error, nll


def test_error_and_nll_each_on_its_own_axis():
    epochs, error, nll = _figure3_curves()
    fig, ax = plt.subplots()
    out, nll_ax = plots.error_and_nll(epochs, error, nll, ax=ax, marks=[10, 15], title="t")
    assert out is ax and nll_ax is not ax and nll_ax.get_shared_x_axes().joined(ax, nll_ax)
    (err_line,) = ax.get_lines()[:1]
    np.testing.assert_array_equal(err_line.get_ydata(), error)
    np.testing.assert_array_equal(nll_ax.get_lines()[0].get_ydata(), nll)
    # each axis spans its own curve (with a margin of 8% of the range on either side), so
    # the NLL's rise fills most of its axis instead of a sliver of the error's
    lo, hi = nll_ax.get_ylim()
    assert lo < nll.min() and hi > nll.max()
    assert (nll.max() - nll.min()) / (hi - lo) > 0.8
    lo, hi = ax.get_ylim()
    assert (error.max() - error.min()) / (hi - lo) > 0.8
    # the dot marks the NLL minimum, the marks are vertical lines
    dot = nll_ax.get_lines()[1]
    assert (dot.get_xdata()[0], dot.get_ydata()[0]) == (epochs[8], nll[8])
    vertical = [ln for ln in ax.get_lines() if np.ptp(ln.get_xdata()) == 0]
    assert sorted(float(ln.get_xdata()[0]) for ln in vertical) == [10.0, 15.0]
    assert ax.get_title() == "t"
    plt.close(fig)


def test_error_and_nll_legend_covers_no_curve():
    epochs, error, nll = _figure3_curves()
    fig, ax = plt.subplots()
    ax, nll_ax = plots.error_and_nll(epochs, error, nll, ax=ax)
    fig.canvas.draw()
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["error (%)", "NLL", "NLL minimum"]
    box, area = legend.get_window_extent(), ax.get_window_extent()
    assert box.y0 >= area.y1 - 1  # above the plotting area (1 pixel of rounding)
    plt.close(fig)
    ax, nll_ax = plots.error_and_nll(epochs, error, nll, legend=False)
    assert ax.get_legend() is None and nll_ax.get_legend() is None
    plt.close(ax.figure)


@pytest.mark.parametrize(
    ("args", "error", "match"),
    [
        (([1, 2, 3], [1, 2], [1, 2, 3]), ValueError, "error has 2 values"),
        (([1, 2, 3], [1, 2, 3], [1, np.nan, 3]), ValueError, "nll contains NaN"),
        (([], [], []), ValueError, "epochs must be a non-empty"),
        (([1, 2], ["a", "b"], [1, 2]), TypeError, "error must hold numbers"),
    ],
)
def test_error_and_nll_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        plots.error_and_nll(*args)
    plt.close("all")


def test_flow_diagram_draws_boxes_and_arrows_that_end_at_their_edges():
    boxes = {"a": (0.2, 0.5, "train batch"), "b": (0.8, 0.5, "look-ahead"),
             "c": (0.5, 0.15, "outer loss")}
    arrows = [("a", "b", "step", 0.0), ("b", "c", "", 0.3), ("c", "a", "Adam", -0.2)]
    ax = plots.flow_diagram(boxes, arrows, colors={"c": "#fde"})
    texts = {t.get_text(): t for t in ax.texts}
    assert {"train batch", "look-ahead", "outer loss", "step", "Adam"} <= set(texts)
    assert texts["outer loss"].get_bbox_patch().get_facecolor()[:3] != (1.0, 1.0, 1.0)
    annotations = [c for c in ax.get_children() if isinstance(c, matplotlib.text.Annotation)]
    assert len(annotations) == 3
    # the straight arrow stops at the boxes, not at their centres
    ax.figure.canvas.draw()
    path = annotations[0].arrow_patch.get_path()
    drawn = path.vertices[path.codes != path.CLOSEPOLY]
    xs = ax.transData.inverted().transform(
        annotations[0].arrow_patch.get_transform().transform(drawn))[:, 0]
    assert 0.2 < xs.min() and xs.max() < 0.8
    # the label of a straight arrow sits at its middle; a bent arrow's at its curve's middle
    assert texts["step"].get_position() == pytest.approx((0.5, 0.5))
    bent = annotations[2].arrow_patch.get_path()
    curve = ax.transData.inverted().transform(annotations[2].arrow_patch.get_transform()
                                              .transform(bent.vertices[:3]))
    middle = (curve[0] + 2 * curve[1] + curve[2]) / 4  # of the clipped quadratic curve
    label = np.array(texts["Adam"].get_position())
    assert np.linalg.norm(label - middle) < 0.05  # clipping at the boxes moves it a little
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="names no box"):
        plots.flow_diagram(boxes, [("a", "z", "", 0.0)])
    with pytest.raises(ValueError, match="colors"):
        plots.flow_diagram(boxes, [], colors={"z": "red"})
    with pytest.raises(TypeError, match="arrow"):
        plots.flow_diagram(boxes, [("a", "b")])
    with pytest.raises(ValueError, match="boxes"):
        plots.flow_diagram({}, [])
    plt.close("all")


def test_flow_diagram_arrows_keep_their_colour_under_a_style_with_white_patch_edges():
    # seaborn's themes force white patch edges, which hid the filled arrow heads
    with plt.rc_context({"patch.force_edgecolor": True, "patch.edgecolor": "w"}):
        ax = plots.flow_diagram({"a": (0.2, 0.5, "A"), "b": (0.8, 0.5, "B")},
                                [("a", "b", "", 0.0)])
        ax.figure.canvas.draw()
    arrow = next(c for c in ax.get_children() if isinstance(c, matplotlib.text.Annotation))
    assert arrow.arrow_patch.get_edgecolor()[:3] == pytest.approx((0.25, 0.25, 0.25))
    assert arrow.arrow_patch.get_facecolor()[:3] == pytest.approx((0.25, 0.25, 0.25))
    plt.close("all")


def test_positive_class_diagram_bars_are_shares_of_positives():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from calnotes import plots

    p = np.array([0.05, 0.05, 0.95, 0.95, 0.95, 0.5])
    y = np.array([0, 1, 1, 1, 0, 1])
    ax = plots.positive_class_diagram(p, y, n_bins=10)
    heights = sorted(round(b.get_height(), 6) for b in ax.containers[0])
    assert heights == [0.5, round(2 / 3, 6), 1.0]  # bins of 0.05, 0.95 and 0.5
    assert "ECE" in ax.texts[0].get_text()
    plt.close(ax.figure)
    with pytest.raises(ValueError, match="labels"):
        plots.positive_class_diagram(p, y[:3])


def test_share_strips_take_the_x_labels_and_show_each_bins_share(predictions):
    probs, labels = predictions
    fig, (left, right) = plt.subplots(1, 2)
    plots.reliability_diagram(probs, labels, n_bins=10, ax=left)
    p, y = probs[:, :2] / probs[:, :2].sum(1, keepdims=True), (labels == 1).astype(int)
    plots.positive_class_diagram(p[:, 1], y, n_bins=10, ax=right)
    for ax, xlabel in ((left, "confidence"), (right, "probability of the positive class")):
        (strip,) = ax.child_axes
        shares = [b.get_height() for b in strip.containers[0]]
        assert np.isclose(sum(shares), 1.0) and len(shares) == 10
        assert strip.get_xlabel() == xlabel and ax.get_xlabel() == ""
        assert not ax.xaxis.get_tick_params()["labelbottom"]  # the strip carries the ticks
    bins = metrics.reliability_bins(probs, labels, n_bins=10)
    counts = np.asarray(bins.counts)
    assert np.allclose([b.get_height() for b in left.child_axes[0].containers[0]],
                       counts / counts.sum())
    plt.close(fig)


def test_risk_coverage_plot_draws_one_step_line_per_model_and_the_oracle():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(3), size=200)
    y = rng.integers(0, 3, 200)
    ax = plots.risk_coverage({"a": p, "b": p[:, ::-1].copy()}, y, title="rc")
    labels = [line.get_label() for line in ax.get_lines()]
    assert labels[0].startswith("a: AURC") and "oracle ranking" in labels
    assert labels[-1].startswith("b: AURC")
    assert f"{100 * metrics.aurc(p, y):.2f}%" in labels[0]
    with pytest.raises(ValueError, match="empty"):
        plots.risk_coverage({}, y)

def test_grid_figsize_fits_the_page_or_says_how_many_rows_do() -> None:
    from calnotes.plots import PAGE_WIDTH, SCREEN_HEIGHT, grid_figsize

    # 2 x 2 panels: each 3.35 in wide, 0.9 * 3.35 = 3.015 in tall, plus 0.6 in per row
    width, height = grid_figsize(2, 2)
    assert width == PAGE_WIDTH and height == pytest.approx(2 * (0.9 * 3.35 + 0.6))
    assert height <= SCREEN_HEIGHT
    # the 5 x 2 grid of reliability diagrams: 18.1 in, and only 2 rows of 3.6 in fit
    with pytest.raises(ValueError, match=r"nrows: 5 rows .* 18\.1 in tall.* at most 2 row"):
        grid_figsize(5, 2)
    assert grid_figsize(1, 8, aspect=1.0)[1] == pytest.approx(6.7 / 8 + 0.6)
    with pytest.raises(ValueError, match="at most 0 row.* more columns"):
        grid_figsize(1, 1, aspect=1.2)
    with pytest.raises(TypeError, match="ncols"):
        grid_figsize(1, 2.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="row_pad"):
        grid_figsize(1, 2, row_pad=-1)


def test_value_by_confidence_draws_each_groups_mean_per_equal_mass_bin(predictions):
    probs, labels = predictions
    conf = probs.max(1)
    right = probs.argmax(1) == labels
    values = np.where(right, 1.0, 3.0) + conf  # known means per group and bin
    ax = plots.value_by_confidence(values, probs, labels, n_bins=4, name="γ")
    correct, wrong = ax.get_lines()[:2]
    edges = np.quantile(conf, [0, 0.25, 0.5, 0.75, 1])
    first = right & (conf <= edges[1])
    assert correct.get_xdata()[0] == pytest.approx(conf[first].mean())
    assert correct.get_ydata()[0] == pytest.approx(1.0 + conf[first].mean())
    assert np.allclose(np.asarray(wrong.get_ydata()) - np.asarray(wrong.get_xdata()), 3.0)
    assert ax.get_ylabel() == "mean γ"
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == [f"correct ({right.sum():,})", f"misclassified ({(~right).sum():,})"]
    with pytest.raises(ValueError, match="one value per sample"):
        plots.value_by_confidence(values[:-1], probs, labels)
    plt.close("all")


def _forest_records(n: int, units: tuple[str, ...] = ("points", "labels", "ratio")) -> list:
    """``n`` claims with intervals, spread over ``units`` (one panel each)."""
    return [{"claim": f"claim {i}: method {i} lowers the error of method {i + 1}",
             "estimate": -1.0 + 0.1 * i, "low": -2.0 + 0.1 * i, "high": 0.1 * i,
             "paper": -1.5, "null": 0.0, "direction": "below", "unit": units[i % len(units)],
             "verdict": "reproduces" if i % 2 else "inconclusive"} for i in range(n)]


def test_forest_plot_gives_each_quantity_its_axis_and_cuts_labels_at_a_word() -> None:
    records = _forest_records(4, ("points",))
    for r, quantity in zip(records, ("ece", "mce", "ece", "fpr@95tpr"), strict=True):
        r["quantity"] = quantity
    records[3]["unit"] = "FPR95 points"
    records[0]["claim"] = "FLγ-SECE has a lower test ECE than cross-entropy " * 3
    fig = plots.forest_plot(records)
    # ECE and MCE share a unit but not an axis; a unit naming its quantity stays as it is
    assert [ax.get_xlabel() for ax in fig.axes] == ["ECE (points)", "MCE (points)",
                                                    "FPR95 points"]
    labels = [t.get_text() for ax in fig.axes for t in ax.get_yticklabels()]
    cut = [t for t in labels if t.startswith("FLγ-SECE")]
    assert len(cut) == 1 and len(cut[0]) <= plots.FOREST_LABEL_CHARS
    assert cut[0].endswith(" …") and cut[0][:-2] in records[0]["claim"]
    assert records[0]["claim"].startswith(cut[0][:-2] + " ")  # whole words only
    # a table without the column groups by unit, as before
    plain = plots.forest_plot([{k: v for k, v in r.items() if k != "quantity"}
                               for r in records])
    assert [ax.get_xlabel() for ax in plain.axes] == ["points", "FPR95 points"]
    plt.close("all")


def test_forest_plot_legend_names_the_reported_cross_only_when_one_is_drawn() -> None:
    def legend(records: list) -> list[str]:
        fig = plots.forest_plot(records)
        (lg,) = fig.legends
        return [t.get_text() for t in lg.get_texts()]

    records = _forest_records(2, ("points",))
    assert legend(records) == ["reproduces", "inconclusive", "reported"]
    for r in records:
        r["paper"] = None
    assert legend(records) == ["reproduces", "inconclusive"]
    plt.close("all")


def test_forest_plot_fits_a_screen_with_labels_apart() -> None:
    import io

    from PIL import Image

    from calnotes.plots import FOREST_MIN_ROW, SCREEN_HEIGHT

    # a few claims keep rows of 0.32 in: 0.9 in of legend and 0.6 in per panel
    small = plots.forest_plot(_forest_records(4, ("points",)))
    assert small.get_figheight() == pytest.approx(0.9 + 0.6 + 4 * 0.32)
    # 24 claims in 3 panels took 0.9 + 1.8 + 24 * 0.32 = 10.4 in; now one screen, and the
    # PNG the book shows (110 dpi, tight box) is no taller than the screen in pixels
    for n in (24, 27):
        fig = plots.forest_plot(_forest_records(n))
        assert fig.get_figheight() <= SCREEN_HEIGHT + 1e-9
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
        assert Image.open(buf).size[1] <= SCREEN_HEIGHT * 110
        # every claim keeps a row of FOREST_MIN_ROW or more: its label clears the next one
        fig.canvas.draw()
        renderer = fig.canvas.get_renderer()
        for ax in fig.axes:
            boxes = sorted((t.get_window_extent(renderer) for t in ax.get_yticklabels()),
                           key=lambda b: b.y0)
            assert len(boxes) == n // 3
            gaps = [up.y0 - low.y1 for low, up in zip(boxes[:-1], boxes[1:], strict=True)]
            assert min(gaps) > 0
            centres = np.diff([(b.y0 + b.y1) / 2 for b in boxes])
            assert centres.min() >= FOREST_MIN_ROW * fig.dpi * 0.99
        plt.close(fig)
    # more claims than fit at FOREST_MIN_ROW: the error says how many do
    fit = int((SCREEN_HEIGHT - 0.9 - 1.8) // FOREST_MIN_ROW)
    with pytest.raises(ValueError, match=rf"max_height: 60 claims in 3 panel.*at most {fit} "):
        plots.forest_plot(_forest_records(60))
    with pytest.raises(ValueError, match="max_height"):
        plots.forest_plot(_forest_records(3), max_height=0)
    plt.close("all")
