r"""How calnotes's calibration metrics compare with other libraries' on the same numbers.

:func:`conformance_table` scores one set of probabilities with calnotes and with every
peer library that is installed, and explains each difference by a *convention*: for every
(metric, library) pair it also computes calnotes's estimate under that library's
convention (its bin edges, which side of an edge a tie joins, its clipping, its
quadrature, its precision). A difference is *explained* when the peer's value equals that
re-computation within the rounding the two computations allow; a pair that measures
another quantity says so instead. :mod:`calnotes.book.evidence.conformance_cases` holds
the minimal reproducers.

The peers are test extras: each is imported inside the function that calls it, and a
missing or unimportable one becomes a row whose status says so.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch

from calnotes import metrics

__all__ = ["CALNOTES_METRICS", "CONVENTIONS", "PEERS", "binned_error", "conformance_table",
           "peer_versions", "relplot_grid_smece", "rounding_tolerance"]

#: The peer libraries: display name -> (distribution, import name).
PEERS: dict[str, tuple[str, str]] = {
    "torchmetrics": ("torchmetrics", "torchmetrics"),
    "netcal": ("netcal", "netcal"),
    "relplot": ("relplot", "relplot"),
    "uncertainty-calibration": ("uncertainty-calibration", "calibration"),
    "scikit-learn": ("scikit-learn", "sklearn"),
    "MAPIE": ("mapie", "mapie.metrics.calibration"),
    "probmetrics": ("probmetrics", "probmetrics.metrics"),
    "probcal": ("probcal", "probcal.metrics"),
    "model-diagnostics": ("model-diagnostics", "model_diagnostics.scoring"),
}

#: Why a peer's value may differ from calnotes's, one sentence per convention.
CONVENTIONS: dict[str, str] = {
    "same": "the same definition and binning; differences are floating-point rounding",
    "left-closed-own-bin":
        "bins are [lo, hi) and a confidence of exactly 1.0 gets a bin of its own, so a "
        "saturated softmax is not pooled with the confidences just below 1",
    "left-closed-float32":
        "bins are [lo, hi) with float32 edges and sums, and a confidence of exactly 1.0 "
        "gets a bin of its own",
    "left-closed":
        "bins are [lo, hi) (a value on an inner edge joins the upper bin) after clipping "
        "to (0, 1); 1.0 stays in the last bin",
    "binary-positive-class":
        "labels with at most two distinct values make it a binary task: it bins the "
        "positive-class probability against the label, not the top-label confidence",
    "edges-count": "num_bins counts the edges 0, ..., 1, so num_bins=15 gives 14 "
                   "equal-width bins (and one for exactly 0)",
    "midpoint-edges": "equal-mass edges halfway between consecutive equal-count groups of "
                      "the sorted values, instead of interpolated quantiles",
    "quantile-left-closed": "the same interpolated quantile edges, but a value on an edge "
                            "joins the upper bin and repeated edges merge",
    "percentile-edges-count": "num_bins percentiles from the minimum to the maximum: the "
                              "minimum gets a bin of its own and num_bins - 1 bins remain",
    "relplot-grid":
        "samples rounded to a grid, the integral a 200-point ratio of sums whose end cells "
        "weigh half, the kernel cut at distance 0.5, and the bandwidth bisected 10 times",
    "other": "a different quantity, not emulated here",
    "logit-kernel": "a different quantity: the residuals are smoothed on the logit scale, "
                    "not on [0, 1] with a reflected kernel",
    "discrete-switch": "with fewer than N/4 distinct values in every column it bins by "
                       "distinct value instead of 15 equal-mass bins",
    "machine-eps-clip": "probabilities are clipped at the machine epsilon of their dtype "
                        "(2.2e-16 for float64) instead of 1e-12",
    "per-class-sum": "the multiclass score as the sum of the one-vs-rest binary scores",
    "clipped-per-class-sum": "the sum of one-vs-rest binary scores after clipping the "
                             "probabilities to [1e-12, 1 - 1e-12]",
}


def peer_versions(peers: Iterable[str] | None = None) -> pd.DataFrame:
    """The installed version of each peer (``None`` when absent) and whether the module the
    conformance table calls imports (``error`` says why not)."""
    rows = []
    for name in peers or PEERS:
        dist, module = PEERS[name]
        try:
            version: str | None = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = None
        error = _import_error(module) if version is not None else "not installed"
        rows.append({"library": name, "distribution": dist, "version": version,
                     "importable": error is None, "error": error})
    return pd.DataFrame(rows)


def _import_error(module: str) -> str | None:
    try:
        if module.startswith("torchmetrics"):
            _torchmetrics()
        else:
            importlib.import_module(module)
    except Exception as exc:  # an import that fails for any reason is reported, not raised
        return f"{type(exc).__name__}: {exc}"
    return None


def _torchmetrics() -> Any:
    # torchmetrics imports torchvision, which next to a CPU torch needs its operators
    # declared first (calnotes.data does this)
    from calnotes.data.sources import _import_torchvision

    _import_torchvision()
    return importlib.import_module("torchmetrics.functional.classification")


# ----------------------------------------------------------------- the conventions, emulated


def rounding_tolerance(n: int, dtype: Any, scale: float = 1.0) -> float:
    r"""Largest difference rounding alone can make between two means of ``n`` terms of
    size at most ``scale`` summed in ``dtype`` in any order: each recursive sum errs by at
    most :math:`(n - 1) u \sum |x_i|` (Higham, *Accuracy and Stability*, 4.2) with
    :math:`u` half the machine epsilon, so two of them by :math:`2 n\,\mathrm{eps}\,
    \mathrm{scale}` at most."""
    return 2.0 * n * float(np.finfo(dtype).eps) * max(scale, 1e-300)


def binned_error(values: np.ndarray, targets: np.ndarray, index: np.ndarray, n_bins: int,
                 norm: str = "l1", dtype: Any = np.float64) -> float:
    """Binned calibration error of ``values`` against 0/1 ``targets`` with the bin of each
    sample given (``index`` in ``[0, n_bins)``), sums in ``dtype``: the ECE (``"l1"``)
    or the MCE (``"max"``, over non-empty bins)."""
    counts = np.bincount(index, minlength=n_bins)
    sum_v = np.zeros(n_bins, dtype=dtype)
    sum_t = np.zeros(n_bins, dtype=dtype)
    np.add.at(sum_v, index, values.astype(dtype))
    np.add.at(sum_t, index, targets.astype(dtype))
    full = counts > 0
    gap = np.abs(sum_t[full] / counts[full].astype(dtype) - sum_v[full] / counts[full])
    if norm == "max":
        return float(gap.max())
    return float(np.sum(counts[full] / counts.sum() * gap))


def _cut(values: np.ndarray, cuts: np.ndarray, closed: str) -> np.ndarray:
    """Bin index with interior ``cuts``: ``closed="right"`` makes bins (lo, hi],
    ``"left"`` [lo, hi)."""
    return np.searchsorted(cuts, values, side="left" if closed == "right" else "right")


def _uniform_index(v: np.ndarray, m: int, convention: str) -> tuple[np.ndarray, int, Any]:
    """``(bin index, number of bins, dtype of the sums)`` of equal-width binning."""
    if convention == "calnotes":
        return _cut(v, np.arange(1, m) / m, "right"), m, np.float64
    if convention == "left-closed":  # netcal, probcal: numpy linspace edges, clipped input
        return _cut(v, np.linspace(0.0, 1.0, m + 1)[1:-1], "left"), m, np.float64
    if convention == "left-closed-float32":  # torchmetrics
        edges = torch.linspace(0, 1, m + 1, dtype=torch.float32).numpy()
        return _cut(v.astype(np.float32), edges[1:], "left"), m + 1, np.float32
    if convention == "left-closed-own-bin":  # relplot's binnedECE: int(f / (1 / M))
        return (v / (1.0 / m)).astype(int), m + 1, np.float64
    if convention == "edges-count":  # MAPIE: np.digitize(v, linspace(0, 1, M), right=True)
        return np.digitize(v, np.linspace(0.0, 1.0, m), right=True), m, np.float64
    raise ValueError(f"unknown equal-width convention {convention!r}")


def _mass_index(v: np.ndarray, m: int, convention: str) -> tuple[np.ndarray, int]:
    """``(bin index, number of bins)`` of equal-mass binning."""
    if convention == "calnotes":
        edges = np.quantile(v, np.arange(m + 1) / m)
        return _cut(v, edges[1:-1], "right"), m
    if convention == "quantile-left-closed":  # probcal
        cuts = np.unique(np.quantile(v, np.linspace(0.0, 1.0, m + 1)[1:-1]))
        return _cut(v, cuts, "left"), cuts.size + 1
    if convention == "midpoint-edges":  # uncertainty-calibration's get_equal_bins
        groups = np.array_split(np.sort(v), min(m, v.size))
        mids = {(a[-1] + b[0]) / 2.0 for a, b in zip(groups[:-1], groups[1:], strict=True)}
        upper = np.asarray(sorted(mids | {1.0}))
        return np.searchsorted(upper, v, side="left"), upper.size
    if convention == "percentile-edges-count":  # MAPIE's "quantile"
        return np.digitize(v, np.percentile(v, np.linspace(0, 1, m) * 100), right=True), m
    raise ValueError(f"unknown equal-mass convention {convention!r}")


def relplot_grid_smece(conf: np.ndarray, correct: np.ndarray,
                       bandwidth: float | None = None) -> tuple[float, float]:
    r"""The smooth ECE as relplot's quadrature computes it: ``(value, bandwidth)``.

    The residuals :math:`c_i - r_i` and the unit masses are spread linearly onto
    :math:`G = \lfloor\max(2000, 20/\sigma)/2\rfloor + 1` nodes of [0, 1], convolved with
    the reflected Gaussian sampled on offsets in [-0.5, 0.5] (cut beyond that, and not
    renormalised), read at :math:`T = \max(200, 10/\sigma)` points, and the integral is
    the ratio :math:`\sum_t |\hat r(t)| / \sum_t (\hat\delta(t) + 10^{-4})`, in which the
    two end points count fully though a trapezoid would halve them. Without
    ``bandwidth`` it bisects :math:`\sigma = \mathrm{smECE}_\sigma` ten times on [0, 1]
    and keeps the upper end. Written from that description, to explain the
    difference from :func:`calnotes.metrics.smece`, which integrates finely."""
    f = np.asarray(conf, dtype=np.float64)
    y = np.asarray(correct, dtype=np.float64)

    def at(sigma: float) -> float:
        g = max(2000, round(20 / sigma)) // 2 + 1
        nodes = np.linspace(0.0, 1.0, g)
        kernel = np.exp(-((nodes - 0.5) ** 2) / (2 * sigma**2)) / (np.sqrt(2 * np.pi) * sigma)
        t = np.linspace(0.0, 1.0, max(round(10 / sigma), 200))

        def smooth(weights: np.ndarray) -> np.ndarray:
            cell = np.clip((f * (g - 1)).astype(int), 0, g - 2)
            frac = f * (g - 1) - cell
            grid = np.zeros(g)
            np.add.at(grid, cell, (1 - frac) * weights)
            np.add.at(grid, cell + 1, frac * weights)
            mirrored = np.concatenate([grid[::-1][:-1], grid, grid[::-1][1:]])
            out = np.convolve(mirrored, kernel, "valid")[g // 2: g // 2 + g]
            return np.interp(t, nodes, out)

        density = smooth(np.ones_like(f)) + 1e-4
        return float(np.sum(np.abs(smooth(f - y))) / np.sum(density))

    if bandwidth is not None:
        return at(bandwidth), bandwidth
    hi = 1.0
    if not (hi < 1e-3 or hi < at(hi)):
        lo = 0.0
        for _ in range(10):
            mid = (hi + lo) / 2
            if mid < 1e-3 or mid < at(mid):
                lo = mid
            else:
                hi = mid
    return at(hi), hi


# ------------------------------------------------------------------------------ the table


@dataclass(frozen=True)
class _Row:
    metric: str
    library: str
    call: str
    value: float
    calnotes: float
    adjusted: float | None
    tolerance: float
    convention: str


#: calnotes's side of each metric of the table.
CALNOTES_METRICS: dict[str, Callable[[np.ndarray, np.ndarray, int], Any]] = {
    "ECE": lambda p, y, m: metrics.ece(p, y, n_bins=m),
    "ECE (equal mass)": lambda p, y, m: metrics.ece(p, y, n_bins=m, binning="quantile"),
    "MCE": lambda p, y, m: metrics.mce(p, y, n_bins=m),
    "classwise ECE": lambda p, y, m: metrics.classwise_ece(p, y, n_bins=m),
    "smooth ECE": lambda p, y, m: metrics.smece(p, y),
    "debiased L2": lambda p, y, m: metrics.debiased_l2_ce(p, y, n_bins=m),
    "Brier": lambda p, y, m: metrics.brier(p, y),
    "NLL": lambda p, y, m: metrics.nll(p, y),
    "CORP miscalibration": lambda p, y, m: metrics.score_decomposition(
        p, y, "brier", "top-label").miscalibration,
}


class _Context:
    """The inputs every peer reads, computed once."""

    def __init__(self, probs: Any, labels: Any, n_bins: int, wanted: set[str]) -> None:
        self.p = np.asarray(torch.as_tensor(probs).detach().cpu().double())
        self.y = np.asarray(torch.as_tensor(labels).detach().cpu().long())
        self.n, self.c = self.p.shape
        self.m = n_bins
        conf, correct = metrics.confidences_and_correct(self.p, self.y)
        self.conf, self.correct = np.asarray(conf), np.asarray(correct)
        self.wanted = wanted
        self.ours = {k: float(CALNOTES_METRICS[k](self.p, self.y, n_bins)) for k in wanted}
        # probcal's binary metrics need both outcomes among the top-label predictions
        self.both = 0 < self.correct.sum() < self.n
        self.tol64 = rounding_tolerance(self.n, np.float64)
        self.tol32 = rounding_tolerance(self.n, np.float32)

    def uniform(self, convention: str, norm: str = "l1", clip: float = 0.0,
                classwise: bool = False) -> float:
        def one(v: np.ndarray, t: np.ndarray) -> float:
            v = np.clip(v, clip, 1 - clip) if clip else v
            index, bins, dtype = _uniform_index(v, self.m, convention)
            return binned_error(v, t, index, bins, norm, dtype)

        if not classwise:
            return one(self.conf, self.correct)
        return float(np.mean([one(self.p[:, k], (self.y == k).astype(float))
                              for k in range(self.c)]))

    def netcal_top(self, eps: float, norm: str) -> float | None:
        """netcal's top-label ECE or MCE; for labels with at most two distinct values it
        bins the positive-class probability of a two-class problem."""
        if np.unique(self.y).size > 2:
            return self.uniform("left-closed", norm, clip=eps)
        if self.c != 2:
            return None
        v = np.clip(self.p[:, 1], eps, 1 - eps)
        index, bins, dtype = _uniform_index(v, self.m, "left-closed")
        return binned_error(v, self.y.astype(np.float64), index, bins, norm, dtype)

    def mass(self, convention: str, clip: float = 0.0) -> float:
        v = np.clip(self.conf, clip, 1 - clip) if clip else self.conf
        index, bins = _mass_index(v, self.m, convention)
        return binned_error(v, self.correct, index, bins)


Thunk = Callable[[], Any]


def _rows(x: _Context, library: str,
          specs: list[tuple[str, str, Thunk, Thunk | None, float, str]]) -> list[_Row]:
    """The rows of ``specs`` (metric, call, value, adjusted, tolerance, convention) whose
    metric is wanted; the values are computed only for those."""
    rows = []
    for metric, call, value, adjusted, tol, convention in specs:
        if metric in x.wanted:
            other = adjusted() if adjusted is not None else None
            rows.append(_Row(metric, library, call, float(value()), x.ours[metric],
                             None if other is None else float(other), tol, convention))
    return rows


def _torchmetrics_rows(x: _Context) -> list[_Row]:
    tm = _torchmetrics()
    pt, yt = torch.from_numpy(x.p), torch.from_numpy(x.y)

    def top(norm: str) -> float:
        return float(tm.multiclass_calibration_error(pt, yt, num_classes=x.c, n_bins=x.m,
                                                     norm=norm))

    def classwise() -> float:
        return float(np.mean([float(tm.binary_calibration_error(
            pt[:, k].contiguous(), (yt == k).long(), n_bins=x.m)) for k in range(x.c)]))

    conv = "left-closed-float32"
    return _rows(x, "torchmetrics", [
        ("ECE", "multiclass_calibration_error(norm='l1')", lambda: top("l1"),
         lambda: x.uniform(conv), x.tol32, conv),
        ("MCE", "multiclass_calibration_error(norm='max')", lambda: top("max"),
         lambda: x.uniform(conv, "max"), x.tol32, conv),
        ("classwise ECE", "mean of binary_calibration_error", classwise,
         lambda: x.uniform(conv, classwise=True), x.tol32, conv),
    ])


def _netcal_rows(x: _Context) -> list[_Row]:
    from netcal.metrics import ECE, MCE

    eps = float(np.finfo(np.float64).eps)  # netcal clips to [eps, 1 - eps]

    def classwise() -> float:
        return float(np.mean([ECE(bins=x.m).measure(x.p[:, k], (x.y == k).astype(np.int64))
                              for k in range(x.c)]))

    conv = "left-closed"
    if np.unique(x.y).size <= 2:  # netcal then reads the task as binary
        conv = "binary-positive-class" if x.c == 2 else "other"
    return _rows(x, "netcal", [
        ("ECE", "ECE(bins).measure", lambda: ECE(bins=x.m).measure(x.p, x.y),
         lambda: x.netcal_top(eps, "l1"), x.tol64, conv),
        ("MCE", "MCE(bins).measure", lambda: MCE(bins=x.m).measure(x.p, x.y),
         lambda: x.netcal_top(eps, "max"), x.tol64, conv),
        ("classwise ECE", "mean of ECE(bins).measure per class", classwise,
         lambda: x.uniform(conv, clip=eps, classwise=True), x.tol64, conv),
    ])


def _relplot_rows(x: _Context) -> list[_Row]:
    import relplot

    return _rows(x, "relplot", [
        ("ECE", "metrics.binnedECE(nbins)",
         lambda: relplot.metrics.binnedECE(x.conf, x.correct, nbins=x.m),
         lambda: x.uniform("left-closed-own-bin"), x.tol64, "left-closed-own-bin"),
        ("smooth ECE", "smECE", lambda: relplot.smECE(x.conf, x.correct),
         lambda: relplot_grid_smece(x.conf, x.correct)[0], x.tol64, "relplot-grid"),
    ])


def _uncertainty_calibration_rows(x: _Context) -> list[_Row]:
    import calibration as cal

    discrete = bool(cal.utils.is_discrete(x.p))

    def adjusted_l2() -> float:
        n_bins = x.n if discrete else x.m
        return float(metrics.debiased_l2_ce(x.p, x.y, n_bins=n_bins))

    return _rows(x, "uncertainty-calibration", [
        ("ECE", "get_ece(num_bins)", lambda: cal.get_ece(x.p, x.y, num_bins=x.m),
         lambda: x.uniform("calnotes"), x.tol64, "same"),
        ("ECE (equal mass)", "get_ece_em(num_bins)",
         lambda: cal.get_ece_em(x.p, x.y, num_bins=x.m),
         lambda: x.mass("midpoint-edges"), x.tol64, "midpoint-edges"),
        ("debiased L2", "get_calibration_error(p=2, debias=True, mode='top-label')",
         lambda: cal.get_calibration_error(x.p, x.y, p=2, debias=True, mode="top-label"),
         adjusted_l2, x.tol64, "discrete-switch" if discrete else "same"),
    ])


def _sklearn_rows(x: _Context) -> list[_Row]:
    from sklearn.metrics import brier_score_loss, log_loss

    classes = list(range(x.c))
    eps = float(np.finfo(np.float64).eps)
    return _rows(x, "scikit-learn", [
        ("Brier", "brier_score_loss", lambda: brier_score_loss(x.y, x.p, labels=classes),
         lambda: x.ours["Brier"], rounding_tolerance(x.n, np.float64, 2.0), "same"),
        ("NLL", "log_loss", lambda: log_loss(x.y, x.p, labels=classes),
         lambda: metrics.nll(x.p, x.y, eps=eps),
         rounding_tolerance(x.n, np.float64, -np.log(eps)), "machine-eps-clip"),
    ])


def _mapie_rows(x: _Context) -> list[_Row]:
    from mapie.metrics.calibration import expected_calibration_error as mapie_ece

    return _rows(x, "MAPIE", [
        ("ECE", "expected_calibration_error(num_bins)",
         lambda: mapie_ece(x.correct, x.p, num_bins=x.m),
         lambda: x.uniform("edges-count"), x.tol64, "edges-count"),
        ("ECE (equal mass)", "expected_calibration_error(split_strategy='quantile')",
         lambda: mapie_ece(x.correct, x.p, num_bins=x.m, split_strategy="quantile"),
         lambda: x.mass("percentile-edges-count"), x.tol64, "percentile-edges-count"),
        ("classwise ECE", "expected_calibration_error(classwise=True)",
         lambda: mapie_ece(x.y, x.p, num_bins=x.m, classwise=True, class_labels=x.y),
         lambda: x.uniform("edges-count", classwise=True), x.tol64, "edges-count"),
    ])


def _probmetrics_rows(x: _Context) -> list[_Row]:
    importlib.import_module("probmetrics.metrics")  # 1.3.0 needs its optional numba here
    return []


def _probcal_rows(x: _Context) -> list[_Row]:
    import probcal.metrics as pm

    clip = 1e-12  # probcal clips every probability to [1e-12, 1 - 1e-12]
    onehot = np.eye(x.c)[x.y]

    def brier() -> float:
        return sum(float(pm.brier_score(onehot[:, k], x.p[:, k])) for k in range(x.c))

    def clipped_brier() -> float:
        return float(np.mean(((np.clip(x.p, clip, 1 - clip) - onehot) ** 2).sum(axis=1)))

    specs: list[tuple[str, str, Thunk, Thunk | None, float, str]] = []
    if x.both:  # its binary metrics refuse a y with one outcome only
        specs += [
            ("ECE", "ece(strategy='width')",
             lambda: pm.ece(x.correct, x.conf, n_bins=x.m, strategy="width"),
             lambda: x.uniform("left-closed", clip=clip), x.tol64, "left-closed"),
            ("ECE (equal mass)", "ece(strategy='mass')",
             lambda: pm.ece(x.correct, x.conf, n_bins=x.m),
             lambda: x.mass("quantile-left-closed", clip=clip), x.tol64,
             "quantile-left-closed"),
            ("MCE", "ece(strategy='width', norm='max')",
             lambda: pm.ece(x.correct, x.conf, n_bins=x.m, strategy="width", norm="max"),
             lambda: x.uniform("left-closed", "max", clip=clip), x.tol64, "left-closed"),
            ("smooth ECE", "smooth_ece", lambda: pm.smooth_ece(x.correct, x.conf), None,
             0.0, "logit-kernel"),
        ]
    if all(0 < onehot[:, k].sum() < x.n for k in range(x.c)):
        specs.append(("Brier", "sum of brier_score per class", brier, clipped_brier,
                      rounding_tolerance(x.n, np.float64, 2.0), "clipped-per-class-sum"))
    return _rows(x, "probcal", specs)


def _model_diagnostics_rows(x: _Context) -> list[_Row]:
    from model_diagnostics.scoring import SquaredError, decompose

    onehot = np.eye(x.c)[x.y]

    def brier() -> float:
        return sum(float(SquaredError()(onehot[:, k], x.p[:, k])) for k in range(x.c))

    def mcb() -> float:
        frame = decompose(x.correct, x.conf, scoring_function=SquaredError())
        return float(frame["miscalibration"][0])

    return _rows(x, "model-diagnostics", [
        ("Brier", "sum of SquaredError per class", brier, lambda: x.ours["Brier"],
         rounding_tolerance(x.n, np.float64, 2.0), "per-class-sum"),
        ("CORP miscalibration", "decompose(SquaredError())['miscalibration']", mcb,
         lambda: x.ours["CORP miscalibration"], x.tol64, "same"),
    ])


_PEER_ROWS: dict[str, Callable[[_Context], list[_Row]]] = {
    "torchmetrics": _torchmetrics_rows,
    "netcal": _netcal_rows,
    "relplot": _relplot_rows,
    "uncertainty-calibration": _uncertainty_calibration_rows,
    "scikit-learn": _sklearn_rows,
    "MAPIE": _mapie_rows,
    "probmetrics": _probmetrics_rows,
    "probcal": _probcal_rows,
    "model-diagnostics": _model_diagnostics_rows,
}

COLUMNS = ["metric", "library", "call", "value", "calnotes", "difference", "adjusted",
           "residual", "tolerance", "status", "convention", "explanation"]


def _status(row: _Row) -> str:
    if row.adjusted is None:
        return "other quantity"
    if abs(row.value - row.calnotes) <= row.tolerance:
        return "agrees"
    if abs(row.value - row.adjusted) <= row.tolerance:
        return "explained"
    return "unexplained"


def conformance_table(probs: Any, labels: Any, *, n_bins: int = 15,
                      peers: Iterable[str] | None = None,
                      metric_names: Iterable[str] | None = None) -> pd.DataFrame:
    r"""Every metric that calnotes and an installed peer both compute, on the same
    ``probs (N, C)`` (float64 copies, so every library reads the same numbers) and
    ``labels (N,)``: one row per (metric, library).

    Columns: ``value`` (the peer's), ``calnotes``, ``difference`` (value - calnotes),
    ``adjusted`` (calnotes's estimate recomputed under the peer's convention),
    ``residual`` (value - adjusted), ``tolerance`` (:func:`rounding_tolerance` for the
    dtype the peer sums in), ``status`` (``agrees``: the difference is within the
    tolerance; ``explained``: the residual is; ``unexplained``; ``other quantity``: the
    peer measures something else; ``not available``: the peer is missing or does not
    import, ``explanation`` then says why) and ``convention`` with its ``explanation``
    from ``CONVENTIONS``. ``peers`` and ``metric_names`` (keys of
    ``CALNOTES_METRICS``) restrict the table; only what it shows is computed.
    """
    wanted = set(metric_names or CALNOTES_METRICS)
    if not wanted <= set(CALNOTES_METRICS):
        raise ValueError(f"metric_names: unknown {sorted(wanted - set(CALNOTES_METRICS))}; "
                         f"choose from {list(CALNOTES_METRICS)}")
    x = _Context(probs, labels, n_bins, wanted)
    rows: list[dict[str, Any]] = []
    for name in peers or PEERS:
        if name not in _PEER_ROWS:
            raise ValueError(f"peers: unknown library {name!r}; choose from {list(PEERS)}")
        error = _import_error(PEERS[name][1])
        if error is not None:
            rows.append({"library": name, "status": "not available", "explanation": error})
            continue
        for r in _PEER_ROWS[name](x):
            adjusted = np.nan if r.adjusted is None else r.adjusted
            rows.append({
                "metric": r.metric, "library": r.library, "call": r.call, "value": r.value,
                "calnotes": r.calnotes, "difference": r.value - r.calnotes,
                "adjusted": adjusted, "residual": r.value - adjusted,
                "tolerance": r.tolerance, "status": _status(r), "convention": r.convention,
                "explanation": CONVENTIONS[r.convention]})
    return pd.DataFrame(rows, columns=COLUMNS)
