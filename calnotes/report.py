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
(:func:`calnotes.evaluation.compare_calibrators`); the test split is never used to fit
anything. The same report from a shell: ``python -m calnotes report VAL TEST``.

Files hold two arrays, ``logits (N, C)`` (float) and ``labels (N,)`` (integers in
``[0, C)``): a ``.npz`` written by ``numpy.savez(path, logits=..., labels=...)`` or a
``.pt``/``.pth`` written by ``torch.save({"logits": ..., "labels": ...}, path)``, read back
with ``torch.load(weights_only=True)``, which loads tensors and never runs pickled code.
"""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from . import metrics, plots
from ._checks import ArrayLike, check_labels, check_logits, check_positive_int
from .calibrators import Calibrator, TemperatureScaling
from .evaluation import (
    BINARY_METHODS,
    LABELS,
    MULTICLASS_METHODS,
    UNCALIBRATED,
    CalibrationComparison,
    compare_calibrators,
)

__all__ = ["FILE_SUFFIXES", "Report", "default_methods", "load_logits", "make_report"]

#: File types :func:`load_logits` reads.
FILE_SUFFIXES = (".npz", ".pt", ".pth")
_KEYS = ("logits", "labels")


def _read(path: Path) -> dict[str, Any]:
    """The arrays stored in ``path`` (numpy for .npz, tensors for .pt), without validation."""
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as npz:
                return {key: npz[key] for key in npz.files}
        except (OSError, ValueError, zipfile.BadZipFile) as err:
            raise ValueError(f"{path}: not a readable .npz file ({err})") from None
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


def load_logits(path: str | os.PathLike) -> tuple[ArrayLike, ArrayLike]:
    """``(logits (N, C), labels (N,))`` from a ``.npz`` or ``.pt``/``.pth`` file.

    numpy arrays come back from ``.npz``, tensors from ``.pt``. Every problem (missing
    file, unknown type, missing array, wrong shape or dtype, NaN) raises ``ValueError`` or
    ``TypeError`` with the path in the message.
    """
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
        z, _ = check_logits(logits, "logits")
        check_labels(labels, z.shape[0], z.shape[1], "labels")
    except (TypeError, ValueError) as err:
        raise type(err)(f"{path}: {err}") from None
    return logits, labels


def default_methods(n_classes: int) -> tuple[str, ...]:
    """Guo et al.'s calibrators for ``n_classes``: their Table 1, plus Platt when binary."""
    n_classes = check_positive_int(n_classes, "n_classes", minimum=2)
    if n_classes == 2:
        return (*BINARY_METHODS, "temperature")
    return MULTICLASS_METHODS


@dataclass
class Report:
    """What :func:`make_report` measured.

    ``comparison.table`` has one row per method (the uncalibrated model first) and the
    columns error, nll, brier, ece, mce on the test split, as fractions.
    """

    comparison: CalibrationComparison
    n_val: int
    n_test: int
    n_classes: int

    @property
    def table(self) -> pd.DataFrame:
        """Test metrics per method: error, ECE and MCE in percent, NLL and Brier as is."""
        out = self.comparison.table.copy()
        out[["error", "ece", "mce"]] *= 100
        out.index = pd.Index([LABELS.get(m, m) for m in out.index], name="method")
        return out.rename(columns={"error": "error (%)", "ece": "ECE (%)", "mce": "MCE (%)",
                                   "nll": "NLL", "brier": "Brier"})

    @property
    def calibrators(self) -> dict[str, Calibrator]:
        """The fitted calibrators by method name; each has ``save(path)``."""
        return self.comparison.calibrators

    def summary(self) -> str:
        """The table and what it says, as plain text."""
        tab = self.comparison.table
        base = tab.loc[UNCALIBRATED]
        conf, correct = metrics.confidences_and_correct(self.comparison.probs[UNCALIBRATED],
                                                        self._labels())
        gap = float(np.mean(_numpy(conf)) - np.mean(_numpy(correct)))
        lines = [
            f"validation: {self.n_val} samples, test: {self.n_test} samples, "
            f"{self.n_classes} classes",
            f"ECE and MCE with {self.comparison.n_bins} equal-width bins; calibrators fitted "
            f"on validation, measured on test",
            "",
            self.table.round(3).to_string(),
            "",
            f"uncalibrated: average confidence minus accuracy = {100 * gap:+.2f} points "
            f"({'overconfident' if gap > 0 else 'underconfident' if gap < 0 else 'balanced'})",
        ]
        ts = self.calibrators.get("temperature")
        if isinstance(ts, TemperatureScaling):
            t = ts.temperature_
            lines.append(f"temperature scaling: T = {t:.3f} (T > 1 softens, T < 1 sharpens)")
        calibrated = tab.drop(index=UNCALIBRATED)
        best = str(calibrated["ece"].idxmin())
        lines.append(
            f"lowest test ECE: {LABELS.get(best, best)} ({100 * calibrated.loc[best, 'ece']:.2f}% "
            f"against {100 * base['ece']:.2f}% uncalibrated)"
        )
        return "\n".join(lines)

    def figures(self) -> dict[str, Any]:
        """Matplotlib figures by file stem: ``reliability`` (one diagram per method) and
        ``confidence`` (histogram of the uncalibrated confidences)."""
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
        return {"reliability": fig, "confidence": hist_fig}

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
) -> Report:
    """Fit each calibrator in ``methods`` on validation logits; measure all on test logits.

    ``methods`` defaults to :func:`default_methods` for the number of classes; names are
    keys of :data:`calnotes.calibrators.CALIBRATORS`. numpy and torch inputs both work.
    """
    zv, _ = check_logits(val_logits, "val_logits")
    chosen = default_methods(int(zv.shape[1])) if methods is None else methods
    comparison = compare_calibrators(val_logits, val_labels, test_logits, test_labels,
                                     methods=chosen, n_bins=n_bins)
    return Report(comparison=comparison, n_val=int(zv.shape[0]), n_test=len(test_logits),
                  n_classes=int(zv.shape[1]))
