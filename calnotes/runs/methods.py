"""Training-time calibration methods, run by the same code on the same splits, in one table.

::

    configs = method_configs(default_config(model="resnet14", epochs=15))
    runs = {name: chapter_run(cfg, label="ch05_meta", ...) for name, cfg in configs.items()}
    table = methods_table({name: run.test_logits for ...}, test_labels)
    ece_vs_bins({name: probs, ...}, test_labels, [10, 30, 100, 300, 1000])

:data:`METHODS` holds the rows of Wang & Golebiowski's Table 1 as config overrides, with
hyper-parameters that are common choices of the calibration literature (fixed before any
run, never tuned on the test split): focal loss with gamma = 3 and FLSD-53 (Mukhoti et al.
2020), label smoothing 0.05, mixup with alpha = 0.2 (Thulasidasan et al. 2019), MMCE with
weight 2 (Kumar et al. 2018), CE + DECE with weight 1 (Bohdal et al. 2021), and the two
meta-regularized focal losses, FLgamma-DECE and FLgamma-SECE. CE+TS, the other row of the
paper's table, needs no training: temperature scaling of the CE run (see
:func:`temperature_scaled`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from calnotes import metrics
from calnotes._checks import ArrayLike, check_positive_int
from calnotes.runs.experiment import default_config

__all__ = [
    "METHODS",
    "TABLE_COLUMNS",
    "ece_vs_bins",
    "method_configs",
    "methods_table",
    "temperature_scaled",
]

#: Method name -> config overrides (``loss``, ``loss_options``, ``meta``).
METHODS: dict[str, dict[str, Any]] = {
    "CE": {"loss": "ce"},
    "Focal (gamma=3)": {"loss": "focal", "loss_options": {"gamma": 3.0}},
    "FLSD-53": {"loss": "flsd53"},
    "LS (0.05)": {"loss": "label_smoothing", "loss_options": {"smoothing": 0.05}},
    "Mixup (alpha=0.2)": {"loss": "mixup", "loss_options": {"alpha": 0.2}},
    "MMCE": {"loss": "mmce", "loss_options": {"weight": 2.0}},
    "CE-DECE": {"loss": "dece", "loss_options": {"weight": 1.0}},
    "FLgamma-DECE": {"loss": "focal", "meta": {"outer": "dece"}},
    "FLgamma-SECE": {"loss": "focal", "meta": {"outer": "sece"}},
}

#: Columns of :func:`methods_table`, as in the paper's Table 1.
TABLE_COLUMNS = ("error", "nll", "ece", "mce", "ace", "classwise_ece")


def method_configs(
    base: Mapping[str, Any], methods: Iterable[str] | None = None
) -> dict[str, dict[str, Any]]:
    """``{name: full config}``: ``base`` with each method's overrides (all of
    :data:`METHODS` by default, in its order). ``base`` must train with plain CE
    settings: its ``loss``, ``loss_options`` and ``meta`` are replaced."""
    if not isinstance(base, Mapping):
        raise TypeError(f"base must be a config dict, got {type(base).__name__}")
    names = list(METHODS) if methods is None else list(methods)
    if isinstance(methods, str) or not names:
        raise ValueError(f"methods must be a non-empty list of names from {list(METHODS)}")
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known methods are {list(METHODS)}")
    common = {k: v for k, v in base.items() if k not in ("loss", "loss_options", "meta")}
    return {name: default_config(**common, **METHODS[name]) for name in names}


def temperature_scaled(
    val_logits: ArrayLike, val_labels: ArrayLike, test_logits: ArrayLike
) -> tuple[ArrayLike, float]:
    """``(softmax(test_logits / T), T)`` with ``T`` fitted by NLL on the validation split."""
    from calnotes.calibrators import TemperatureScaling

    scaler = TemperatureScaling().fit(val_logits, val_labels)
    return scaler.predict_proba(test_logits), float(scaler.temperature_)


def methods_table(
    probs: Mapping[str, ArrayLike], labels: ArrayLike, n_bins: int = 15
) -> pd.DataFrame:
    """One row per method: :data:`TABLE_COLUMNS` in percent (NLL as is), ``n_bins`` bins."""
    table = metrics.calibration_report(dict(probs), labels, n_bins=n_bins,
                                       metrics=list(TABLE_COLUMNS))
    percent = [c for c in TABLE_COLUMNS if c != "nll"]
    table[percent] = table[percent] * 100
    table.index.name = "method"
    return table


def ece_vs_bins(
    probs: Mapping[str, ArrayLike], labels: ArrayLike, bins: Sequence[int]
) -> pd.DataFrame:
    """Long table ``method, n_bins, ece, mce`` (percent) for every bin count in ``bins``.

    With many bins most are near-empty and the binned estimates grow by noise alone; a
    method whose ECE grows slowest is the one whose calibration holds at fine resolution
    (Wang & Golebiowski, Fig. 5).
    """
    if isinstance(bins, (str, bytes)) or not isinstance(bins, Sequence) or len(bins) == 0:
        raise ValueError("bins must be a non-empty sequence of positive ints")
    counts = [check_positive_int(b, "bins") for b in bins]
    if not isinstance(probs, Mapping) or len(probs) == 0:
        raise ValueError("probs must be a non-empty dict {method: probabilities}")
    rows = []
    for name, p in probs.items():
        for b in counts:
            rows.append({
                "method": name, "n_bins": b,
                "ece": 100 * float(metrics.ece(p, labels, n_bins=b)),
                "mce": 100 * float(metrics.mce(p, labels, n_bins=b)),
            })
    return pd.DataFrame(rows)
