"""Calibration report of your own model: from validation and test logits to a verdict.

::

    from calnotes import report
    val_logits, val_labels = report.load_logits("val.npz")
    test_logits, test_labels = report.load_logits("test.npz")
    rep = report.make_report(val_logits, val_labels, test_logits, test_labels)
    print(rep.summary())            # error, NLL, Brier, ECE, MCE before and after calibration
    rep.save_figures("report/")     # reliability diagrams and the confidence histogram
    rep.calibrators["temperature"].save("temperature.json")

Every calibrator is fitted on the validation split and measured on the test split
(:func:`calnotes.evaluation.compare_calibrators`); the test split is never used to fit or
to choose anything. Every test metric comes with a bootstrap interval over the test
samples (percentile; for ECE, MCE and the score decomposition the debiased one, which never
excludes its own estimate), beside the tests of calibration with their p-values and the
CORP decomposition of the top-label Brier score. The calibrator the report recommends is chosen on
the validation split alone, by K-fold cross-validation there (:func:`cross_validate`), and
only if it beats the uncalibrated model beyond its paired bootstrap interval; otherwise it
recommends none.
The same report from a shell: ``python -m calnotes report VAL TEST`` (``--json`` for
scripts).

Input that looks like probabilities (every row non-negative and summing to 1) is refused
as logits: softmax of probabilities is a much flatter distribution, which would reverse
the diagnosis. Pass ``probs=True`` (``--probs``) to read probabilities; their logarithm is
then used as the logits (softmax of ``log p`` is ``p``).

Files hold two arrays, ``logits (N, C)`` (float) and ``labels (N,)`` (integers in
``[0, C)``): a ``.npz`` written by ``numpy.savez(path, logits=..., labels=...)`` or a
``.pt``/``.pth`` written by ``torch.save({"logits": ..., "labels": ...}, path)``, read back
with ``torch.load(weights_only=True)``, which loads tensors and never runs pickled code.
"""

from __future__ import annotations

import json
import math
import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from . import metrics, plots
from ._checks import (
    ArrayLike,
    check_labels,
    check_logits,
    check_positive_int,
)
from .calibrators import CALIBRATORS, Calibrator, TemperatureScaling
from .evaluation import (
    BINARY_METHODS,
    LABELS,
    MULTICLASS_METHODS,
    UNCALIBRATED,
    CalibrationComparison,
    compare_calibrators,
)
from .report_conformal import conformal_report, save_conformal_sets
from .report_probs import check_not_probs, logits_from_probs, simplex_tolerance
from .report_tests import calibration_tests

__all__ = [
    "FILE_SUFFIXES",
    "REPORT_COLUMNS",
    "Report",
    "conformal_report",
    "save_conformal_sets",
    "calibration_tests",
    "cross_validate",
    "default_methods",
    "load_logits",
    "load_pair",
    "logits_from_probs",
    "simplex_tolerance",
    "make_report",
]

#: File types :func:`load_logits` reads.
FILE_SUFFIXES = (".npz", ".pt", ".pth")
_KEYS = ("logits", "labels")


def _read(path: Path) -> dict[str, Any]:
    """The arrays stored in ``path`` (numpy for .npz, tensors for .pt), without validation."""
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as npz:
                return {key: npz[key] for key in npz.files}
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            why = str(err) or type(err).__name__
            raise ValueError(f"{path}: not a readable .npz file ({why})") from None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises UnpicklingError, RuntimeError, EOFError, ...
        raise ValueError(
            f"{path}: not a readable tensor file for torch.load(weights_only=True) "
            f"({type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''})"
        ) from None
    if not isinstance(data, dict):
        raise ValueError(
            f"{path}: expected a dict {{'logits': ..., 'labels': ...}}, got {type(data).__name__}"
        )
    return data


def load_logits(
    path: str | os.PathLike, probs: bool = False
) -> tuple[ArrayLike, ArrayLike]:
    """``(logits (N, C), labels (N,))`` from a ``.npz`` or ``.pt``/``.pth`` file.

    numpy arrays come back from ``.npz``, tensors from ``.pt``. Every problem (missing
    file, unknown type, missing array, wrong shape or dtype, NaN) raises ``ValueError`` or
    ``TypeError`` with the path in the message, and so does an array of logits that looks
    like probabilities (see :func:`~calnotes.report.check_not_probs`). With ``probs=True``
    the array named
    ``logits`` must hold probabilities, and their logarithm comes back
    (:func:`logits_from_probs`).
    """
    if not isinstance(probs, bool):
        raise TypeError(f"probs must be a bool, got {type(probs).__name__}")
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: no such file")
    if path.suffix not in FILE_SUFFIXES:
        raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use one of "
                         f"{', '.join(FILE_SUFFIXES)}")
    data = _read(path)
    missing = [key for key in _KEYS if key not in data]
    if missing:
        raise ValueError(f"{path}: no array named {' or '.join(map(repr, missing))}; "
                         f"found {sorted(map(str, data)) or 'nothing'}")
    logits, labels = data["logits"], data["labels"]
    try:
        if probs:
            logits = logits_from_probs(logits, "logits")
        z, _ = check_logits(logits, "logits")
        check_labels(labels, z.shape[0], z.shape[1], "labels")
        if not probs:
            check_not_probs(z, "logits")
    except (TypeError, ValueError) as err:
        raise type(err)(f"{path}: {err}") from None
    return logits, labels


def load_pair(
    val: str | os.PathLike, test: str | os.PathLike, probs: bool = False
) -> tuple[ArrayLike, ArrayLike, ArrayLike, ArrayLike]:
    """``(val_logits, val_labels, test_logits, test_labels)`` from the VAL and TEST files
    (:func:`load_logits`); every error says which of VAL and TEST it is about. They must
    have the same number of classes, and the validation labels at least two classes (no
    calibrator can be fitted on one)."""
    out: list[ArrayLike] = []
    for role, path in (("VAL", val), ("TEST", test)):
        try:
            out.extend(load_logits(path, probs=probs))
        except (TypeError, ValueError) as err:
            raise type(err)(f"{role} file {err}") from None
    zv, yv, zt, _ = out
    if zv.shape[1] != zt.shape[1]:
        raise ValueError(f"VAL file {val} has {zv.shape[1]} classes but TEST file {test} "
                         f"has {zt.shape[1]}")
    present = np.unique(_numpy(yv))
    if len(present) < 2:
        raise ValueError(f"VAL file {val}: labels hold only class {int(present[0])}: a "
                         f"calibrator cannot be fitted on validation labels of one class")
    return out[0], out[1], out[2], out[3]


def default_methods(n_classes: int) -> tuple[str, ...]:
    """Guo et al.'s calibrators for ``n_classes``: their Table 1, plus Platt when binary."""
    n_classes = check_positive_int(n_classes, "n_classes", minimum=2)
    if n_classes == 2:
        return (*BINARY_METHODS, "temperature")
    return MULTICLASS_METHODS


#: The report's columns: the test metrics of every row, in this order (error, ECE, MCE and
#: the selective-prediction numbers as fractions; ``risk@90`` is the error rate on the 90%
#: most confident test samples, ``aurc`` the area under the risk-coverage curve).
REPORT_COLUMNS = ("error", "nll", "brier", "ece", "mce", "aurc", "risk@90")
_PERCENT = ("error", "ece", "mce", "aurc", "risk@90")
_HEADERS = {"error": "error (%)", "nll": "NLL", "brier": "Brier", "ece": "ECE (%)",
            "mce": "MCE (%)", "aurc": "AURC (%)", "risk@90": "risk@90% (%)"}


@dataclass
class Report:
    """What :func:`make_report` measured.

    ``comparison.table`` has one row per method (the uncalibrated model first) and the
    columns error, nll, brier, ece, mce on the test split, as fractions. ``intervals`` holds
    a :class:`~calnotes.metrics.BootstrapInterval` per method (rows) and column of
    :data:`REPORT_COLUMNS`, over ``n_boot`` resamples of the test samples. ``validation`` is
    :func:`cross_validate`'s table on the validation split and ``recommended`` the method
    it recommends, or ``None``. ``tests`` and ``decomposition`` are the two tables of
    :func:`calibration_tests` on the test split.
    """

    comparison: CalibrationComparison
    n_val: int
    n_test: int
    n_classes: int
    intervals: pd.DataFrame = field(repr=False)
    gap: metrics.BootstrapInterval
    validation: pd.DataFrame = field(repr=False)
    recommended: str | None
    n_folds: int = 5
    n_boot: int = 200
    tests: pd.DataFrame | None = field(default=None, repr=False)
    decomposition: pd.DataFrame | None = field(default=None, repr=False)

    @property
    def table(self) -> pd.DataFrame:
        """Test metrics per method: error, ECE, MCE, AURC and risk@90% in percent, NLL and
        Brier as is (the estimates of ``intervals``)."""
        out = self.intervals.map(lambda iv: iv.estimate).astype(float)
        out[list(_PERCENT)] *= 100
        out.index = pd.Index([LABELS.get(m, m) for m in out.index], name="method")
        return out.rename(columns=_HEADERS)

    def interval_table(self, digits: int = 2) -> pd.DataFrame:
        """:attr:`table` as text, each cell ``estimate [low, high]`` (95% bootstrap)."""
        def cell(iv: metrics.BootstrapInterval, column: str) -> str:
            iv = iv.scaled(100) if column in _PERCENT else iv
            return f"{iv:.{digits if column in _PERCENT else digits + 1}f}"

        out = pd.DataFrame({_HEADERS[c]: [cell(iv, c) for iv in self.intervals[c]]
                            for c in self.intervals.columns})
        out.index = pd.Index([LABELS.get(m, m) for m in self.intervals.index], name="method")
        return out

    @property
    def calibrators(self) -> dict[str, Calibrator]:
        """The fitted calibrators by method name; each has ``save(path)``."""
        return self.comparison.calibrators

    def summary(self) -> str:
        """The table and what it says, as plain text."""
        gap = self.gap.scaled(100)
        lines = [
            f"validation: {self.n_val} samples, test: {self.n_test} samples, "
            f"{self.n_classes} classes",
            f"calibrators fitted on validation, measured on test; ECE and MCE with "
            f"{self.comparison.n_bins} equal-width bins; [95% interval] from {self.n_boot} "
            f"bootstrap resamples of the test samples",
            "",
            self.interval_table().to_string(),
            "",
            f"uncalibrated: average confidence minus accuracy = {gap.estimate:+.2f} points "
            f"[{gap.low:+.2f}, {gap.high:+.2f}] ({_direction(self.gap)})",
        ]
        if self.tests is not None:
            lines += ["", "tests of top-label calibration on test (null: each prediction is "
                      "right with probability its confidence; p-values):",
                      self.tests.rename(index=lambda m: LABELS.get(m, m)).to_string(
                          float_format=lambda x: f"{x:.3g}")]
        if self.decomposition is not None:
            lines += ["", "Brier score = miscalibration - discrimination + uncertainty "
                      "(CORP, top-label; [95% debiased bootstrap interval]):",
                      self.decomposition.map(lambda iv: f"{iv:.4f}").rename(
                          index=lambda m: LABELS.get(m, m)).to_string()]
        ts = self.calibrators.get("temperature")
        if isinstance(ts, TemperatureScaling):
            lines.append(f"temperature scaling: T = {ts.temperature_:.3f} (T > 1 softens, "
                         f"T < 1 sharpens)")
        lines.append(self.recommendation())
        return "\n".join(lines)

    def recommendation(self) -> str:
        """The recommendation, said as what it is: chosen on validation data only."""
        v = self.validation
        head = (f"recommended (chosen on the validation split alone, {self.n_folds}-fold "
                f"cross-validated ECE; the test split played no part): ")
        base = 100 * v.loc[UNCALIBRATED, "ece"]
        if self.recommended is None:
            best = str(v.drop(index=UNCALIBRATED)["ece"].idxmin())
            row = v.loc[best]
            return (head + f"none. No calibrator beat the uncalibrated model beyond its "
                    f"interval: the best, {LABELS.get(best, best)}, has a cross-validated ECE "
                    f"of {100 * row['ece']:.2f}% against {base:.2f}% uncalibrated, difference "
                    f"{100 * row['diff']:+.2f} [{100 * row['diff_low']:+.2f}, "
                    f"{100 * row['diff_high']:+.2f}] points")
        row = v.loc[self.recommended]
        return (head + f"{LABELS.get(self.recommended, self.recommended)}, cross-validated ECE "
                f"{100 * row['ece']:.2f}% against {base:.2f}% uncalibrated, difference "
                f"{100 * row['diff']:+.2f} [{100 * row['diff_low']:+.2f}, "
                f"{100 * row['diff_high']:+.2f}] points")

    def to_dict(self) -> dict[str, Any]:
        """Everything :meth:`summary` says, as JSON-able data (fractions, not percent)."""
        def iv(x: metrics.BootstrapInterval) -> dict[str, float]:
            return {"estimate": x.estimate, "low": x.low, "high": x.high}

        ts = self.calibrators.get("temperature")
        return {
            "n_val": self.n_val, "n_test": self.n_test, "n_classes": self.n_classes,
            "n_bins": self.comparison.n_bins, "n_boot": self.n_boot, "level": 0.95,
            "test": {m: {c: iv(self.intervals.loc[m, c]) for c in self.intervals.columns}
                     for m in self.intervals.index},
            "confidence_minus_accuracy": iv(self.gap),
            "temperature": ts.temperature_ if isinstance(ts, TemperatureScaling) else None,
            "validation": {
                "n_folds": self.n_folds, "criterion": "ece",
                "methods": {m: {k: float(x) for k, x in row.items()}
                            for m, row in self.validation.iterrows()},
            },
            "recommended": self.recommended,
            "tests": (None if self.tests is None else
                      {m: {k: float(x) for k, x in row.items()}
                       for m, row in self.tests.iterrows()}),
            "decomposition": (None if self.decomposition is None else
                              {m: {c: iv(self.decomposition.loc[m, c])
                                   for c in self.decomposition.columns}
                               for m in self.decomposition.index}),
        }

    def to_json(self) -> str:
        """:meth:`to_dict` as a JSON string (NaN written as null)."""
        def clean(x: Any) -> Any:
            if isinstance(x, dict):
                return {k: clean(v) for k, v in x.items()}
            return None if isinstance(x, float) and not math.isfinite(x) else x

        return json.dumps(clean(self.to_dict()), indent=1)

    def figures(self) -> dict[str, Any]:
        """Matplotlib figures by file stem: ``reliability`` (one diagram per method),
        ``confidence`` (histogram of the uncalibrated confidences) and ``risk_coverage``
        (the uncalibrated model's selective risk against coverage)."""
        import matplotlib.pyplot as plt

        probs, labels = self.comparison.probs, self._labels()
        n_bins = self.comparison.n_bins
        ncols = min(4, len(probs))
        nrows = -(-len(probs) // ncols)
        fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 4.4 * nrows),
                                 squeeze=False, gridspec_kw={"hspace": 0.8, "wspace": 0.35})
        for ax, (method, p) in zip(axes.flat[:len(probs)], probs.items(), strict=True):
            plots.reliability_diagram(p, labels, n_bins=n_bins, ax=ax,
                                      title=LABELS.get(method, method))
        for ax in axes.flat[len(probs):]:
            ax.set_visible(False)
        hist_fig, hist_ax = plt.subplots(figsize=(5, 3.6))
        plots.confidence_histogram(probs[UNCALIBRATED], labels, ax=hist_ax,
                                   title="uncalibrated test confidences")
        rc_fig, rc_ax = plt.subplots(figsize=(5, 3.6))
        plots.risk_coverage(probs[UNCALIBRATED], labels, ax=rc_ax,
                            title="uncalibrated: risk against coverage")
        return {"reliability": fig, "confidence": hist_fig, "risk_coverage": rc_fig}

    def _labels(self) -> ArrayLike:
        if self.comparison.labels is None:
            raise ValueError("this report's comparison holds no test labels")
        return self.comparison.labels

    def save_figures(self, out_dir: str | os.PathLike) -> list[Path]:
        """Write :meth:`figures` as PNG files into ``out_dir``; returns their paths."""
        import matplotlib.pyplot as plt

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = []
        for stem, fig in self.figures().items():
            path = out / f"{stem}.png"
            fig.savefig(path, dpi=110, bbox_inches="tight")
            plt.close(fig)
            paths.append(path)
        return paths


def _direction(gap: metrics.BootstrapInterval) -> str:
    """Over- or underconfident only when the interval excludes 0."""
    if gap.low > 0:
        return "overconfident"
    if gap.high < 0:
        return "underconfident"
    return "neither over- nor underconfident beyond the interval"


def _gap(p: ArrayLike, y: ArrayLike) -> float:
    conf, correct = metrics.confidences_and_correct(p, y)
    return float(_numpy(conf).mean() - _numpy(correct).mean())


def _risk90(p: ArrayLike, y: ArrayLike) -> float:
    return float(metrics.selective_risk(p, y, coverage=0.9))


def _folds(labels: np.ndarray, n_folds: int, seed: int) -> list[np.ndarray]:
    """Stratified folds: each class's samples shuffled and dealt round-robin."""
    rng = np.random.default_rng(seed)
    fold_of = np.empty(len(labels), dtype=np.int64)
    offset = 0
    for k in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == k))
        fold_of[idx] = (offset + np.arange(len(idx))) % n_folds
        offset += len(idx)
    return [np.flatnonzero(fold_of == f) for f in range(n_folds)]


def cross_validate(
    val_logits: ArrayLike,
    val_labels: ArrayLike,
    methods: Sequence[str],
    *,
    n_folds: int = 5,
    n_bins: int = 15,
    n_boot: int = 200,
    seed: int = 0,
) -> tuple[pd.DataFrame, str | None]:
    """Choose a calibrator on the validation split alone: ``(table, recommended)``.

    Each method is fitted on ``n_folds - 1`` stratified folds and predicts the held-out
    fold, so every validation sample gets an out-of-fold prediction. ``table`` has per
    method (and :data:`~calnotes.evaluation.UNCALIBRATED`) the ``ece`` of those
    predictions and ``diff``, ``diff_low``, ``diff_high``: the paired percentile bootstrap
    interval (``n_boot`` resamples of the validation samples) of its ECE minus the
    uncalibrated ECE. ``recommended`` is the method with the lowest cross-validated ECE
    among those whose whole interval lies below 0, or ``None``. A method that cannot be
    fitted on some fold (a class missing from it) gets NaN and is not recommended.
    """
    n_folds = check_positive_int(n_folds, "n_folds", minimum=2)
    zt, _ = check_logits(val_logits, "val_logits")
    z = zt.detach().cpu().double().numpy()
    y = _numpy(check_labels(val_labels, z.shape[0], z.shape[1], "val_labels"))
    if len(y) < 2 * n_folds:
        raise ValueError(f"val_logits has {len(y)} samples, too few for {n_folds} folds")
    folds = _folds(y, n_folds, seed)
    base = _numpy(metrics.probs_from_logits(z))
    rows = {UNCALIBRATED: {"ece": metrics.ece(base, y, n_bins=n_bins), "diff": 0.0,
                           "diff_low": 0.0, "diff_high": 0.0}}
    for name in methods:
        out = np.empty_like(base)
        try:
            for held in folds:
                train = np.setdiff1d(np.arange(len(y)), held)
                cal = CALIBRATORS[name]().fit(z[train], y[train])
                out[held] = _numpy(cal.predict_proba(z[held]))
        except ValueError:
            rows[name] = dict.fromkeys(("ece", "diff", "diff_low", "diff_high"), math.nan)
            continue
        iv = metrics.bootstrap("ece", out, y, baseline=base, n_bins=n_bins, n_boot=n_boot,
                               seed=seed)
        rows[name] = {"ece": metrics.ece(out, y, n_bins=n_bins), "diff": iv.estimate,
                      "diff_low": iv.low, "diff_high": iv.high}
    table = pd.DataFrame.from_dict(rows, orient="index")
    table.index.name = "method"
    winners = table.drop(index=UNCALIBRATED)
    winners = winners[winners["diff_high"] < 0]
    recommended = None if winners.empty else str(winners["ece"].idxmin())
    return table, recommended


def _numpy(x: ArrayLike) -> np.ndarray:
    return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def make_report(
    val_logits: ArrayLike,
    val_labels: ArrayLike,
    test_logits: ArrayLike,
    test_labels: ArrayLike,
    methods: Sequence[str] | None = None,
    *,
    n_bins: int = 15,
    n_boot: int = 200,
    n_folds: int = 5,
    seed: int = 0,
    probs: bool = False,
) -> Report:
    """Fit each calibrator in ``methods`` on validation logits; measure all on test logits
    with bootstrap intervals; recommend one by cross-validation on the validation split.

    ``methods`` defaults to :func:`default_methods` for the number of classes; names are
    keys of :data:`calnotes.calibrators.CALIBRATORS`. numpy and torch inputs both work.
    Logits that look like probabilities raise ``ValueError``
    (:func:`~calnotes.report.check_not_probs`);
    ``probs=True`` reads both inputs as probabilities and uses their log.
    """
    if not isinstance(probs, bool):
        raise TypeError(f"probs must be a bool, got {type(probs).__name__}")
    if probs:
        val_logits = logits_from_probs(val_logits, "val_logits")
        test_logits = logits_from_probs(test_logits, "test_logits")
    else:
        check_not_probs(val_logits, "val_logits")
        check_not_probs(test_logits, "test_logits")
    n_boot = check_positive_int(n_boot, "n_boot", minimum=2)
    zv, _ = check_logits(val_logits, "val_logits")
    chosen = default_methods(int(zv.shape[1])) if methods is None else methods
    comparison = compare_calibrators(val_logits, val_labels, test_logits, test_labels,
                                     methods=chosen, n_bins=n_bins)
    columns: dict[str, Any] = {
        "error": "error", "nll": "nll", "brier": "brier", "ece": "ece", "mce": "mce",
        "aurc": "aurc", "risk@90": _risk90,
    }
    binned: dict[str, Any] = {"n_bins": n_bins, "method": "debiased"}
    intervals = pd.DataFrame(
        [[metrics.bootstrap(f, p, test_labels, n_boot=n_boot, seed=seed,
                            **(binned if c in ("ece", "mce") else {}))
          for c, f in columns.items()] for p in comparison.probs.values()],
        index=pd.Index(list(comparison.probs), name="method"), columns=list(columns))
    gap = metrics.bootstrap(_gap, comparison.probs[UNCALIBRATED], test_labels,
                            n_boot=n_boot, seed=seed)
    validation, recommended = cross_validate(val_logits, val_labels, list(comparison.calibrators),
                                             n_folds=n_folds, n_bins=n_bins, n_boot=n_boot,
                                             seed=seed)
    tests, decomposition = calibration_tests(comparison.probs, test_labels, n_bins=n_bins,
                                             n_boot=n_boot, seed=seed)
    return Report(comparison=comparison, n_val=int(zv.shape[0]), n_test=len(test_logits),
                  n_classes=int(zv.shape[1]), intervals=intervals, gap=gap,
                  validation=validation, recommended=recommended, n_folds=n_folds,
                  n_boot=n_boot, tests=tests, decomposition=decomposition)
