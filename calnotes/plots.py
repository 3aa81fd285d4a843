"""Figures for calibration: reliability diagrams, confidence histograms, curves.

Every function takes ``ax=None`` (a new figure is made when it is None) and returns the
axes it drew on. Nothing here sets a global style: chapters choose their own.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.axes import Axes

from . import metrics
from ._checks import check_choice, check_positive_float, check_positive_int, check_probs


def _numpy(x: Any) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def _axes(ax: Axes | None, figsize: tuple[float, float] = (4.0, 4.0)) -> Axes:
    if ax is None:
        _, ax = plt.subplots(figsize=figsize)
    return ax


def bootstrap_bin_accuracy(
    probs: Any, labels: Any, n_bins: int = 15, n_boot: int = 200, level: float = 0.9,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray]:
    """Percentile bootstrap band for the accuracy of each equal-width confidence bin.

    Resamples the N predictions with replacement ``n_boot`` times and returns the lower and
    upper ``level`` quantiles of the per-bin accuracy (NaN where a bin is empty). In a bin
    that is all correct (all wrong) every resample agrees, so the lower (upper) end is the
    Clopper-Pearson limit instead of a zero-width band:
    ``metrics.reliability_bands(method="bootstrap")``.
    """
    bands = metrics.reliability_bands(probs, labels, n_bins=n_bins, method="bootstrap",
                                      level=level, n_boot=check_positive_int(n_boot, "n_boot"),
                                      seed=seed)
    return bands.low, bands.high


#: The names of the bands :func:`reliability_diagram` draws, as its legend writes them.
_BAND_LABELS = {"clopper-pearson": "Clopper-Pearson", "wilson": "Wilson",
                "bootstrap": "bootstrap"}


def reliability_diagram(
    probs: Any,
    labels: Any,
    n_bins: int | str = 15,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    bootstrap: int = 0,
    min_count: int = 10,
    show_histogram: bool = True,
    color: str = "C0",
    band: str | None = "clopper-pearson",
    consistency: bool = False,
    level: float = 0.9,
) -> Axes:
    """Guo-style reliability diagram with a band on each bin's accuracy.

    Bars show the accuracy of each equal-width confidence bin, red hatched bars the gap to
    the diagonal (the per-bin calibration error ``conf_m - acc_m``), and the inset text the
    ECE and MCE. With ``show_histogram`` a small panel under the diagram shows the share of
    samples per bin (most modern networks put nearly all of them in the last bin).
    ``band`` (``"clopper-pearson"``, ``"wilson"``, ``"bootstrap"`` or None) draws the
    ``level`` interval of each bin's accuracy (:func:`calnotes.metrics.reliability_bands`),
    named in the legend; ``bootstrap > 0`` is ``band="bootstrap"`` with that many
    resamples. ``consistency`` shades where each bin's accuracy would fall under perfect
    calibration. Bins with fewer than ``min_count`` samples are drawn hollow, without a band.
    """
    ax = _axes(ax)
    if bootstrap:
        band = "bootstrap"
    if band is not None:
        check_choice(band, "band", tuple(_BAND_LABELS))
    min_count = check_positive_int(min_count, "min_count")
    bands = metrics.reliability_bands(
        probs, labels, n_bins=n_bins, method=band or "clopper-pearson", level=level,
        min_count=min_count, n_boot=check_positive_int(bootstrap, "bootstrap") if bootstrap
        else 1000, consistency=consistency)
    edges, acc, conf, counts = bands.edges, bands.accuracy, bands.confidence, bands.counts
    width = np.diff(edges)
    left = edges[:-1]
    drawn = counts > 0
    filled = bands.enough & drawn
    bars = ax.bar(left[drawn], acc[drawn], width=width[drawn], align="edge", color=color,
                  edgecolor="black", linewidth=0.6)
    ax.bar([], [], color=color, edgecolor="black", linewidth=0.6, label="accuracy")
    for patch, enough in zip(bars.patches, filled[drawn], strict=True):
        if not enough:  # hollow: too few samples for the bar to mean much
            patch.set_facecolor("none")
            patch.set_edgecolor(color)
            patch.set_linestyle("--")
    if (drawn & ~filled).any():
        ax.plot([], [], color=color, linestyle="--", linewidth=0.8,
                label=f"hollow: < {min_count} samples")
    gap_bottom = np.minimum(acc, conf)
    ax.bar(left[filled], np.abs(conf - acc)[filled], bottom=gap_bottom[filled],
           width=width[filled], align="edge", color="tab:red", alpha=0.35, edgecolor="tab:red",
           hatch="//", linewidth=0.6, label="gap")
    centers = left + width / 2
    if consistency:
        ax.bar(left[filled], (bands.consistency_high - bands.consistency_low)[filled],
               bottom=bands.consistency_low[filled], width=width[filled], align="edge",
               color="gray", alpha=0.3, linewidth=0,
               label=f"{100 * level:.0f}% if calibrated")
    if band is not None:
        ax.errorbar(centers[filled], acc[filled],
                    yerr=[(acc - bands.low)[filled], (bands.high - acc)[filled]], fmt="none",
                    ecolor="black", elinewidth=0.8, capsize=2,
                    label=f"{100 * level:.0f}% {_BAND_LABELS[band]}")
    ax.plot([0, 1], [0, 1], "--", color="gray", linewidth=1)
    ece = float(metrics.ece(probs, labels, n_bins=counts.size))
    mce = float(metrics.mce(probs, labels, n_bins=counts.size))
    ax.text(0.04, 0.93, f"ECE {100 * ece:.2f}%\nMCE {100 * mce:.2f}%", transform=ax.transAxes,
            va="top", fontsize=9, zorder=10,
            bbox={"facecolor": "white", "alpha": 0.95, "linewidth": 0})
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("accuracy")
    ax.legend(loc="lower right", fontsize=8)
    if title:
        ax.set_title(title)
    if show_histogram:
        _share_strip(ax, left, width, counts)
    return ax


def _share_strip(ax: Axes, left: Any, width: Any, counts: Any) -> Axes:
    """A strip under ``ax`` with the share of samples per bin (bars at ``left``, ``width``
    wide), sharing its x-axis: the strip takes over the x tick labels and the x label, so
    that a diagram with its strip needs no more room below than one without."""
    strip = ax.inset_axes((0.0, -0.27, 1.0, 0.2), sharex=ax)
    strip.bar(left, counts / max(counts.sum(), 1), width=width, align="edge", color="gray",
              edgecolor="black", linewidth=0.4)
    strip.set_ylabel("share", fontsize=8)
    strip.set_ylim(0, 1)
    strip.tick_params(labelsize=7)
    strip.set_xlabel(ax.get_xlabel())
    ax.set_xlabel("")
    ax.tick_params(labelbottom=False)
    return strip


def positive_class_diagram(
    p: Any,
    labels: Any,
    n_bins: int = 15,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    color: str = "C2",
    level: float | None = 0.9,
    show_histogram: bool = True,
) -> Axes:
    r"""Reliability diagram of a binary problem's positive class: equal-width bins
    :math:`(b_{m-1}, b_m]` of :math:`\hat p = P(y = 1)` over :math:`[0, 1]`, bars at the share
    of positives in each bin, the gap to the diagonal hatched, and the positive-class ECE
    :math:`\sum_m \frac{|B_m|}{N} |\bar y_m - \bar p_m|` in the corner. Empty bins get no bar.
    Each bar carries the ``level`` Clopper-Pearson interval of its share (None: no band).
    With ``show_histogram`` a strip under the diagram shows the share of samples per bin, as
    in :func:`reliability_diagram`.
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    probs, _ = check_probs(p, "p")  # (N, 2): [1 - p, p]
    q = _numpy(probs[:, 1]).astype(np.float64)
    y = _numpy(labels).astype(np.float64)
    if y.shape != q.shape or not np.isin(y, (0, 1)).all():
        raise ValueError(f"labels must be {len(q)} values in {{0, 1}}, got shape {y.shape}")
    index = np.clip(np.ceil(q * n_bins).astype(int) - 1, 0, n_bins - 1)
    counts = np.bincount(index, minlength=n_bins)
    filled = counts > 0
    share = np.bincount(index, weights=y, minlength=n_bins)[filled] / counts[filled]
    mean = np.bincount(index, weights=q, minlength=n_bins)[filled] / counts[filled]
    ax = _axes(ax)
    left = (np.arange(n_bins) / n_bins)[filled]
    ax.bar(left, share, width=1 / n_bins, align="edge", color=color, edgecolor="black",
           linewidth=0.6, label="share of positives")
    ax.bar(left, np.abs(mean - share), bottom=np.minimum(mean, share), width=1 / n_bins,
           align="edge", color="tab:red", alpha=0.35, edgecolor="tab:red", hatch="//",
           linewidth=0.6, label="gap")
    if level is not None:
        hits = np.bincount(index, weights=y, minlength=n_bins)[filled]
        lo, hi = metrics.clopper_pearson(hits, counts[filled], level)
        ax.errorbar(left + 0.5 / n_bins, share, yerr=[share - lo, hi - share], fmt="none",
                    ecolor="black", elinewidth=0.8, capsize=2,
                    label=f"{100 * level:.0f}% Clopper-Pearson")
    ax.plot([0, 1], [0, 1], "--", color="gray", linewidth=1)
    ece = float((counts[filled] * np.abs(mean - share)).sum() / len(q))
    ax.text(0.04, 0.93, f"ECE {100 * ece:.2f}%", transform=ax.transAxes, va="top", fontsize=9,
            zorder=10, bbox={"facecolor": "white", "alpha": 0.95, "linewidth": 0})
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("probability of the positive class")
    ax.set_ylabel("share of positives")
    ax.legend(loc="lower right", fontsize=8)
    if title:
        ax.set_title(title)
    if show_histogram:
        _share_strip(ax, np.arange(n_bins) / n_bins, np.full(n_bins, 1 / n_bins), counts)
    return ax


def corp_diagram(
    probs: Any, labels: Any, *, ax: Axes | None = None, title: str | None = None,
    color: str = "C0", level: float = 0.9, n_boot: int = 200, seed: int = 0,
) -> Axes:
    """CORP reliability diagram (Dimitriadis, Gneiting & Jordan 2021): the isotonic fit of
    correctness on the top-label confidence as a step line, the ``level`` consistency band
    around it (where the fit falls when the model is calibrated), and the Brier score's
    miscalibration (MCB), discrimination (DSC) and uncertainty (UNC) in the corner
    (:func:`calnotes.metrics.corp_curve`, :func:`calnotes.metrics.score_decomposition`).
    """
    curve = metrics.corp_curve(probs, labels, level=level, n_boot=n_boot, seed=seed)
    parts = metrics.score_decomposition(probs, labels, "brier")
    ax = _axes(ax)
    ax.fill_between(curve.x, curve.low, curve.high, step="post", color="gray", alpha=0.3,
                    linewidth=0, label=f"{100 * level:.0f}% if calibrated")
    ax.step(curve.x, curve.fitted, where="post", color=color, label="isotonic fit")
    ax.plot([0, 1], [0, 1], "--", color="gray", linewidth=1)
    ax.text(0.04, 0.93, f"MCB {parts.miscalibration:.4f}\nDSC {parts.discrimination:.4f}\n"
            f"UNC {parts.uncertainty:.4f}", transform=ax.transAxes, va="top", fontsize=9,
            zorder=10, bbox={"facecolor": "white", "alpha": 0.95, "linewidth": 0})
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("recalibrated accuracy")
    ax.legend(loc="lower right", fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def confidence_histogram(
    probs: Any, labels: Any, n_bins: int = 20, *, ax: Axes | None = None,
    title: str | None = None,
) -> Axes:
    """Histogram of top-label confidence with the mean accuracy and mean confidence marked."""
    n_bins = check_positive_int(n_bins, "n_bins")
    ax = _axes(ax)
    conf, correct = metrics.confidences_and_correct(probs, labels)
    conf_np = _numpy(conf)
    ax.hist(conf_np, bins=np.linspace(0, 1, n_bins + 1).tolist(), color="C0", edgecolor="black",
            linewidth=0.5, weights=np.full(len(conf_np), 1 / len(conf_np)))
    ax.axvline(float(_numpy(correct).mean()), color="tab:red", linestyle="--", label="accuracy")
    ax.axvline(float(conf_np.mean()), color="black", linestyle=":", label="avg. confidence")
    ax.set_xlim(0, 1)
    ax.set_xlabel("confidence")
    ax.set_ylabel("share of samples")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def value_by_confidence(
    values: Any, probs: Any, labels: Any, n_bins: int = 10, *, name: str = "value",
    ax: Axes | None = None, title: str | None = None,
) -> Axes:
    """Mean of a per-sample ``values`` (e.g. gamma-Net's gamma) against top-label
    confidence, for the correctly classified and the misclassified samples apart: the
    samples are cut into ``n_bins`` equal-mass confidence bins (quantiles of all samples),
    and each group's mean value is drawn at its mean confidence in each bin where it has
    samples; marker area grows with the group's count in the bin."""
    n_bins = check_positive_int(n_bins, "n_bins")
    conf, correct = metrics.confidences_and_correct(probs, labels)
    conf_np, right = _numpy(conf).astype(np.float64), _numpy(correct).astype(bool)
    vals = _numpy(values).astype(np.float64)
    if vals.shape != conf_np.shape:
        raise ValueError(f"values must hold one value per sample: shape {conf_np.shape}, "
                         f"got {vals.shape}")
    ax = _axes(ax, (5.0, 3.6))
    edges = np.quantile(conf_np, np.linspace(0, 1, n_bins + 1))
    which = np.clip(np.searchsorted(edges, conf_np, side="right") - 1, 0, n_bins - 1)
    for group, label, color in ((right, "correct", "C0"), (~right, "misclassified", "C3")):
        xs, ys, ns = [], [], []
        for b in range(n_bins):
            members = group & (which == b)
            if members.any():
                xs.append(conf_np[members].mean())
                ys.append(vals[members].mean())
                ns.append(int(members.sum()))
        sizes = 12 + 60 * np.sqrt(np.asarray(ns, dtype=float) / max(ns, default=1))
        ax.plot(xs, ys, color=color, linewidth=1)
        ax.scatter(xs, ys, s=sizes, color=color, label=f"{label} ({int(group.sum()):,})",
                   zorder=3)
    ax.set_xlabel("confidence (mean in each equal-mass bin)")
    ax.set_ylabel(f"mean {name}")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def risk_coverage(
    probs: Any | Mapping[str, Any], labels: Any, *, ax: Axes | None = None,
    title: str | None = None,
) -> Axes:
    """Selective risk against coverage (:func:`calnotes.metrics.risk_coverage_curve`), one
    step line per model (``probs`` one array or ``{name: probs}``), its AURC in the legend,
    and the oracle that ranks every error last (dotted, for the first model)."""
    ax = _axes(ax)
    models = dict(probs) if isinstance(probs, Mapping) else {"model": probs}
    if not models:
        raise ValueError("probs is an empty mapping; give at least one model")
    for i, (name, p) in enumerate(models.items()):
        rc = metrics.risk_coverage_curve(p, labels)
        cov, risk = _numpy(rc.coverage), _numpy(rc.risk)
        area = float(metrics.aurc(p, labels))
        ax.step(np.r_[0.0, cov], 100 * np.r_[risk[0], risk], where="post", color=f"C{i}",
                label=f"{name}: AURC {100 * area:.2f}%")
        if i == 0:
            _, correct = metrics.confidences_and_correct(p, labels)
            n, err = len(correct), 1.0 - float(_numpy(correct).mean())
            k = np.arange(1, n + 1)
            oracle = np.clip(k - n * (1 - err), 0, None) / k
            ax.plot(k / n, 100 * oracle, color="gray", linestyle=":", label="oracle ranking")
    ax.set_xlim(0, 1)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("coverage (share of samples kept)")
    ax.set_ylabel("selective risk (% errors kept)")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def metric_curves(
    x: Sequence[float],
    curves: Mapping[str, Sequence[float]],
    *,
    ax: Axes | None = None,
    xlabel: str = "",
    ylabel: str = "",
    logx: bool = False,
    bands: Mapping[str, tuple[Sequence[float], Sequence[float]]] | None = None,
) -> Axes:
    """One line per named curve over a shared x axis, with optional shaded bands."""
    ax = _axes(ax, figsize=(5.0, 3.5))
    for i, (name, ys) in enumerate(curves.items()):
        ax.plot(x, ys, marker="o", markersize=3, label=name, color=f"C{i}")
        if bands and name in bands:
            lo, hi = bands[name]
            ax.fill_between(x, lo, hi, color=f"C{i}", alpha=0.2, linewidth=0)
    if logx:
        ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=8)
    return ax


def _curve(values: Any, name: str, n: int | None = None) -> np.ndarray:
    """A finite 1-d float64 array, of length ``n`` unless ``n`` is None."""
    try:
        arr = np.asarray(_numpy(values), dtype=np.float64)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must hold numbers") from None
    if arr.ndim != 1 or arr.size == 0:
        raise ValueError(f"{name} must be a non-empty 1-d sequence, got shape {arr.shape}")
    if n is not None and arr.size != n:
        raise ValueError(f"{name} has {arr.size} values but epochs has {n}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{name} contains NaN or inf")
    return arr


def error_and_nll(
    epochs: Any,
    error: Any,
    nll: Any,
    *,
    ax: Axes | None = None,
    title: str | None = None,
    marks: Sequence[float] = (),
    error_label: str = "error (%)",
    nll_label: str = "NLL",
    legend: bool = True,
) -> tuple[Axes, Axes]:
    """Guo et al.'s Figure 3: the error and the NLL over training, each on its own y axis.

    The error (solid, left axis) and the NLL (dashed, right axis, a twin of ``ax``) each
    get an axis scaled to their own range, so a rise of the NLL by a few percent of its
    value stays visible beside an error in percent; each axis label has its curve's color.
    A dot marks the NLL's minimum; ``marks`` are epochs drawn as dotted vertical lines
    (for example the first epoch at each lower learning rate). The legend (``legend=True``)
    sits above the axes, outside the plotting area, so it covers no curve. Returns
    ``(ax, nll_ax)``.
    """
    x = _curve(epochs, "epochs")
    err, loss = _curve(error, "error", x.size), _curve(nll, "nll", x.size)
    ax = _axes(ax, figsize=(6.0, 3.5))
    nll_ax = ax.twinx()
    ax.plot(x, err, color="C0", label=error_label)
    nll_ax.plot(x, loss, color="C1", linestyle="--", label=nll_label)
    best = int(np.argmin(loss))
    nll_ax.plot(x[best], loss[best], "o", color="C1", label=f"{nll_label} minimum")
    for epoch in marks:
        ax.axvline(float(epoch), color="gray", linestyle=":", linewidth=1)
    for axis, values in ((ax, err), (nll_ax, loss)):
        span = float(values.max() - values.min()) or max(abs(float(values.max())), 1.0) * 0.1
        axis.set_ylim(float(values.min()) - 0.08 * span, float(values.max()) + 0.08 * span)
    ax.set_xlabel("epoch")
    ax.set_ylabel(error_label, color="C0")
    nll_ax.set_ylabel(nll_label, color="C1")
    ax.tick_params(axis="y", colors="C0")
    nll_ax.tick_params(axis="y", colors="C1")
    nll_ax.grid(False)
    handles = ax.get_lines()[:1] + nll_ax.get_lines()
    if legend:
        ax.legend(handles, [str(h.get_label()) for h in handles], loc="lower center",
                  bbox_to_anchor=(0.5, 1.0), ncol=3, fontsize=8, frameon=False)
    if title:
        ax.set_title(title, pad=22 if legend else None)
    return ax, nll_ax


def flow_diagram(
    boxes: Mapping[str, tuple[float, float, str]],
    arrows: Sequence[tuple[str, str, str, float]],
    *,
    ax: Axes | None = None,
    colors: Mapping[str, str] | None = None,
    fontsize: float = 8.0,
) -> Axes:
    """A diagram drawn by code: text boxes joined by labelled arrows.

    ``boxes`` maps a name to ``(x, y, text)``, the box's centre in axes coordinates
    ``[0, 1]^2``; ``arrows`` holds ``(from, to, label, bend)`` with ``bend`` the curvature
    of the arrow (0: straight; positive bends it to the right of its direction, as
    matplotlib's ``arc3``). ``colors``
    gives some boxes a face colour. Arrows end at the boxes' edges; each label sits at its
    arrow's middle. Returns the axes (without ticks or frame).
    """
    if not isinstance(boxes, Mapping) or not boxes:
        raise ValueError("boxes must be a non-empty dict {name: (x, y, text)}")
    ax = _axes(ax, figsize=(9.0, 5.0))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_axis_off()
    colors = dict(colors or {})
    unknown = sorted(set(colors) - set(boxes))
    if unknown:
        raise ValueError(f"colors names unknown box(es) {unknown}")
    texts = {}
    for name, spec in boxes.items():
        if not (isinstance(spec, tuple) and len(spec) == 3 and isinstance(spec[2], str)):
            raise TypeError(f"boxes[{name!r}] must be (x, y, text)")
        x, y, text = spec
        texts[name] = ax.text(x, y, text, ha="center", va="center", fontsize=fontsize,
                              bbox={"boxstyle": "round,pad=0.4", "linewidth": 0.8,
                                    "facecolor": colors.get(name, "white"),
                                    "edgecolor": "0.3"}, zorder=3)
    ax.figure.canvas.draw()  # the boxes' patches get their sizes, which the arrows clip to
    for arrow in arrows:
        if not (isinstance(arrow, tuple) and len(arrow) == 4):
            raise TypeError(f"each arrow must be (from, to, label, bend), got {arrow!r}")
        start, end, label, bend = arrow
        for end_name in (start, end):
            if end_name not in texts:
                raise ValueError(f"arrow {arrow!r} names no box {end_name!r}")
        (x0, y0), (x1, y1) = boxes[start][:2], boxes[end][:2]
        ax.annotate("", xy=(x1, y1), xytext=(x0, y0), zorder=3.5, arrowprops={
            "arrowstyle": "-|>", "facecolor": "0.25", "edgecolor": "0.25", "linewidth": 1.0,
            "patchA": texts[start].get_bbox_patch(), "patchB": texts[end].get_bbox_patch(),
            "connectionstyle": f"arc3,rad={float(bend)}"})
        if label:
            # the middle of an arc3 curve: the chord's midpoint moved by bend/2 times the
            # chord turned clockwise, in display units (the axes need not be square)
            width, height = ax.bbox.width, ax.bbox.height
            mx = (x0 + x1) / 2 + bend / 2 * (y1 - y0) * height / width
            my = (y0 + y1) / 2 - bend / 2 * (x1 - x0) * width / height
            ax.text(mx, my, label, ha="center", va="center", fontsize=fontsize - 1,
                    color="0.15", zorder=4,
                    bbox={"boxstyle": "round,pad=0.15", "facecolor": "white",
                          "edgecolor": "none", "alpha": 0.85})
    return ax


#: Colour of each verdict of :mod:`calnotes.stats` in the forest plots (and the book's CSS).
VERDICT_COLORS = {
    "reproduces": "#2e7d32",
    "reproduces, smaller than reported": "#7cb342",
    "reproduces, larger than reported": "#00897b",
    "inconclusive": "#757575",
    "does not reproduce": "#c62828",
    "premise fails here": "#ef6c00",
    "not testable at this scale": "#bdbdbd",
    "direction reproduces; reported size ruled out": "#9e9d24",
    "reported size ruled out": "#8d6e63",
    "not testable: the method did not train here": "#bdbdbd",
}
_FOREST_COLUMNS = ("claim", "estimate", "low", "high", "paper", "null", "direction", "unit",
                   "verdict")


def _claims_with_intervals(table: Any, columns: Sequence[str]) -> Any:
    """The rows of a claims table (or records) that have an interval, as a DataFrame;
    ``ValueError`` naming the missing ``columns`` or when no row has an interval."""
    import pandas as pd

    df = pd.DataFrame(table)
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise ValueError(f"table lacks the column(s) {missing}")
    df = df[np.isfinite(df["low"].astype(float)) & np.isfinite(df["high"].astype(float))]
    if df.empty:
        raise ValueError("table has no claim with an interval to plot")
    return df.copy()


def _standardized(df: Any, column: str) -> Any:
    """``column`` oriented so that the claimed side is positive, from the claim's null value,
    in units of the half-width of its interval (each interval becomes ``x ± 1``)."""
    sign = np.where(df["direction"] == "above", 1.0, -1.0)
    half = ((df["high"] - df["low"]).astype(float) / 2).where(lambda h: h > 0, 1.0)
    return sign * (df[column].astype(float) - df["null"].astype(float)) / half


#: The book's text column at a 1280 px window (740 px) and the height of a figure a
#: 900 px window shows whole (less the page header), in inches at the book's 110 dpi.
PAGE_WIDTH = 6.7
SCREEN_HEIGHT = 7.6


#: The smallest row of a forest plot, in inches: 19 px at 110 dpi, for 8-point labels.
FOREST_MIN_ROW = 0.17


def _forest_height(n_rows: int, n_panels: int, max_height: float) -> float:
    """The height in inches of a forest plot of ``n_rows`` claims in ``n_panels`` panels:
    0.9 in for the legend, 0.6 in per panel for its axis, and 0.32 in per row, or as much
    as ``max_height`` leaves, down to ``FOREST_MIN_ROW``."""
    max_height = check_positive_float(max_height, "max_height")
    fixed = 0.9 + 0.6 * n_panels
    row = min(0.32, (max_height - fixed) / n_rows)
    if row < FOREST_MIN_ROW:
        fit = max(0, int((max_height - fixed) // FOREST_MIN_ROW))
        raise ValueError(
            f"max_height: {n_rows} claims in {n_panels} panel(s) need "
            f"{fixed + FOREST_MIN_ROW * n_rows:.1f} in, more than {max_height} in; plot at "
            f"most {fit} claims in one figure, or split them over several")
    return fixed + row * n_rows


#: How an axis names a claim's quantity (the evaluator's ``quantity`` column); any other
#: quantity is named by its identifier with spaces for underscores.
QUANTITY_NAMES = {"ece": "ECE", "mce": "MCE", "sece": "SECE", "nll": "NLL", "error": "error",
                  "classwise_ece": "classwise ECE", "test_classwise_ece": "classwise ECE",
                  "fpr@95tpr": "FPR95", "auroc": "AUROC",
                  "confidence_gap": "confidence − accuracy",
                  "val_loss": "validation NLL", "val_error": "validation error"}
#: The longest label a forest plot's row shows, in characters (cut at a word, with "…").
FOREST_LABEL_CHARS = 56


def _axis_name(quantity: str, unit: str) -> str:
    """An axis label from a claim's quantity and unit: ``"MCE (points)"``, or the unit alone
    where it names the quantity already (``"FPR95 points"``) or there is no quantity."""
    name = QUANTITY_NAMES.get(quantity, quantity.replace("_", " "))
    if not name or name.lower() in unit.lower():
        return unit or "effect"
    return f"{name} ({unit})" if unit else name


def _short_label(text: Any) -> str:
    """A row label of at most :data:`FOREST_LABEL_CHARS` characters, cut at a space (never
    inside a word such as "FLγ-SECE") and ended with " …"."""
    text = " ".join(str(text).split())
    if len(text) <= FOREST_LABEL_CHARS:
        return text
    return text[:FOREST_LABEL_CHARS - 1].rsplit(" ", 1)[0] + " …"


def forest_plot(table: Any, standardized: bool = False, label: str = "claim",
                width: float = 7.5, max_height: float = SCREEN_HEIGHT) -> Any:
    """Forest plot of claims' effects: one row per claim with an interval (a table of
    :func:`calnotes.runs.claims.evaluate_claims`, or records with the same columns), the
    95% interval as a bar coloured by verdict, the estimate as a dot, the reported effect
    as a cross (named in the legend where a claim has one) and the claim's null value as a
    dashed line.

    By default claims are grouped in one panel per quantity and unit (the table's
    ``quantity`` column where it has one: ECE and MCE, both in points, get an axis each);
    labels longer than :data:`FOREST_LABEL_CHARS` are cut at a word. ``standardized=True``
    puts all claims on one axis: the effect oriented so that the claimed side is positive, divided
    by the half-width of its interval (each interval is then ``x ± 1`` and clears zero on
    the claimed side when ``x > 1``). Returns the figure.

    The figure is at most ``max_height`` inches tall (default ``SCREEN_HEIGHT``, what a
    screen shows whole): each claim gets a row of 0.32 in, fewer when that would be taller,
    down to ``FOREST_MIN_ROW`` (0.17 in, the 8-point labels still apart). Claims that do
    not fit even then raise a ``ValueError`` that says how many rows do, so that they can
    be split over several figures.
    """
    df = _claims_with_intervals(table, _FOREST_COLUMNS)
    if label not in df.columns:
        raise ValueError(f"label must name a column of table, got {label!r}")
    if standardized:
        df = df.assign(**{col: _standardized(df, col)
                          for col in ("estimate", "low", "high", "paper")})
        df[["low", "high"]] = np.sort(df[["low", "high"]].to_numpy(), axis=1)
        df["null"], df["unit"] = 0.0, "oriented effect / interval half-width"
        df["quantity"] = ""
    if "quantity" not in df.columns:
        df["quantity"] = ""
    df["axis"] = [_axis_name(str(q or ""), str(u or ""))
                  for q, u in zip(df["quantity"], df["unit"], strict=True)]
    groups = list(dict.fromkeys(df["axis"]))
    heights = [max(1, int((df["axis"] == a).sum())) for a in groups]
    fig, axes = plt.subplots(len(groups), 1, squeeze=False,
                             figsize=(width, _forest_height(sum(heights), len(groups),
                                                            max_height)),
                             gridspec_kw={"height_ratios": heights})
    for ax, axis in zip(axes[:, 0], groups, strict=True):
        part = df[df["axis"] == axis].iloc[::-1]
        y = np.arange(len(part))
        colors = [VERDICT_COLORS.get(v, "#000000") for v in part["verdict"]]
        ax.hlines(y, part["low"], part["high"], colors=colors, linewidth=4, alpha=0.8)
        ax.scatter(part["estimate"], y, color="black", s=14, zorder=3)
        paper = part["paper"].astype(float)
        ax.scatter(paper, y, marker="x", color="black", s=30, zorder=4, linewidths=1.2)
        for null in set(part["null"].astype(float)):
            ax.axvline(null, color="black", linestyle="--", linewidth=0.8)
        ax.set_yticks(y)
        ax.set_yticklabels([_short_label(t) for t in part[label]], fontsize=8)
        ax.set_xlabel(axis, fontsize=9)
        ax.grid(axis="y", visible=False)
    handles = [plt.Line2D([], [], color=c, linewidth=4, label=v)
               for v, c in VERDICT_COLORS.items() if v in set(df["verdict"])]
    if np.isfinite(df["paper"].astype(float)).any():
        handles.append(plt.Line2D([], [], color="black", marker="x", linestyle="none",
                                  label="reported"))
    fig.legend(handles=handles, loc="upper center", ncol=3, fontsize=8, frameon=False,
               bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.5 / fig.get_figheight()))
    return fig


def grid_figsize(nrows: int, ncols: int, *, aspect: float = 0.9, row_pad: float = 0.6,
                 width: float = PAGE_WIDTH) -> tuple[float, float]:
    """A figure size for ``nrows x ncols`` panels that fits the book's page.

    The figure is ``width`` inches wide; each panel is ``width / ncols`` wide and ``aspect``
    times that tall, plus ``row_pad`` inches per row for titles and tick labels:
    ``height = nrows * (aspect * width / ncols + row_pad)``. A grid taller than
    ``SCREEN_HEIGHT`` (7.6 in) cannot be seen whole on a screen: a ``ValueError`` says how
    many rows fit, so that the panels can be split over several figures of that many rows.
    """
    nrows = check_positive_int(nrows, "nrows")
    ncols = check_positive_int(ncols, "ncols")
    aspect = check_positive_float(aspect, "aspect")
    width = check_positive_float(width, "width")
    if not isinstance(row_pad, (int, float)) or not 0 <= row_pad < SCREEN_HEIGHT:
        raise ValueError(f"row_pad must be a number of inches in [0, {SCREEN_HEIGHT}), "
                         f"got {row_pad!r}")
    row = aspect * width / ncols + row_pad
    height = nrows * row
    if height > SCREEN_HEIGHT:
        fit = int(SCREEN_HEIGHT // row)
        raise ValueError(
            f"nrows: {nrows} rows of panels are {height:.1f} in tall, more than a screen "
            f"shows ({SCREEN_HEIGHT} in); split them into figures of at most {fit} row(s)"
            + ("" if fit else " or use more columns"))
    return (width, height)


def evidence_overview(table: Any, by: str = "chapter", ncols: int = 3,
                      width: float = 7.5) -> Any:
    """Every claim with an interval, one small panel per value of ``by`` (e.g. chapter):
    the standardized forest plot of :func:`forest_plot` (effect oriented to the claimed
    side, divided by its interval's half-width, so each bar is ``x ± 1``) without labels,
    one thin bar per claim coloured by verdict, sorted by ``x``. It fits a page however many
    claims there are; the tables name them. Returns the figure."""
    columns = [c for c in _FOREST_COLUMNS if c not in ("claim", "unit", "paper")] + [by]
    df = _claims_with_intervals(table, columns)
    df = df.assign(x=np.clip(_standardized(df, "estimate"), -8, 8))
    groups = list(dict.fromkeys(df[by]))
    nrows = -(-len(groups) // ncols)
    fig, axes = plt.subplots(nrows, ncols, squeeze=False, sharex=True,
                             figsize=(width, 0.6 + 2.3 * nrows))
    for ax in axes.flat[len(groups):]:
        ax.set_axis_off()
    for ax, group in zip(axes.flat, groups, strict=False):
        part = df[df[by] == group].sort_values("x")
        y = np.arange(len(part))
        colors = [VERDICT_COLORS.get(v, "#000000") for v in part["verdict"]]
        ax.hlines(y, part["x"] - 1, part["x"] + 1, colors=colors, linewidth=1.6)
        ax.axvline(0, color="black", linestyle="--", linewidth=0.7)
        ax.set_yticks([])
        ax.set_title(f"{group} ({len(part)} claims)", fontsize=9)
        ax.grid(axis="y", visible=False)
    for ax in axes[-1]:
        ax.set_xlabel("effect toward the claim / half-width", fontsize=8)
    handles = [plt.Line2D([], [], color=c, linewidth=3, label=v)
               for v, c in VERDICT_COLORS.items() if v in set(df["verdict"])]
    fig.legend(handles=handles, loc="upper center", ncol=3, fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0, 1, 1 - 0.55 / fig.get_figheight()))
    return fig
