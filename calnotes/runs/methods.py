"""Training-time calibration methods, run by the same code on the same splits, in one table.

::

    base = default_config(model="resnet14", epochs=21, **summed_loss_recipe(0.1, 5e-4, 2.0))
    configs = method_configs(base, meta={"meta_val_size": 1000, "inner_reduction": "mean"})
    runs = {name: chapter_run(cfg, label="ch05_meta", ...) for name, cfg in configs.items()}
    table = per_seed_table({name: {seed: probs, ...}, ...}, test_labels)
    mean_std(table)
    ece_vs_bins({name: probs, ...}, test_labels, [10, 30, 100, 300, 1000])

:data:`METHODS` holds the rows of Wang & Golebiowski's Table 1 as config overrides, with
hyper-parameters that are common choices of the calibration literature (fixed before any
run, never tuned on the test split): focal loss with a fixed gamma of 0.5, 1, 2 or 3 and
FLSD-53 (Mukhoti et al. 2020), label smoothing 0.05, mixup with alpha = 0.2 (Thulasidasan
et al. 2019), MMCE with weight 2 (Kumar et al. 2018), CE-DECE (Meta-Calibration, Bohdal et
al. 2021: cross-entropy with a meta-learned L2 of the classifier head, DECE as the outer
loss), and the two meta-regularized focal losses, FLgamma-DECE and FLgamma-SECE. CE+TS, the
other row of the paper's table, needs no training: temperature scaling of the CE run (see
:func:`temperature_scaled`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from calnotes import metrics
from calnotes._checks import ArrayLike, check_positive_float, check_positive_int
from calnotes.runs.experiment import default_config

__all__ = [
    "METHODS",
    "TABLE_COLUMNS",
    "choose_lr",
    "ece_vs_bins",
    "mean_std",
    "method_configs",
    "methods_table",
    "per_seed_table",
    "summed_loss_recipe",
    "temperature_scaled",
]

#: Method name -> config overrides (``loss``, ``loss_options``, ``meta``).
METHODS: dict[str, dict[str, Any]] = {
    "CE": {"loss": "ce"},
    "Focal (gamma=0.5)": {"loss": "focal", "loss_options": {"gamma": 0.5}},
    "Focal (gamma=1)": {"loss": "focal", "loss_options": {"gamma": 1.0}},
    "Focal (gamma=2)": {"loss": "focal", "loss_options": {"gamma": 2.0}},
    "Focal (gamma=3)": {"loss": "focal", "loss_options": {"gamma": 3.0}},
    "FLSD-53": {"loss": "flsd53"},
    "LS (0.05)": {"loss": "label_smoothing", "loss_options": {"smoothing": 0.05}},
    "Mixup (alpha=0.2)": {"loss": "mixup", "loss_options": {"alpha": 0.2}},
    "MMCE": {"loss": "mmce", "loss_options": {"weight": 2.0}},
    "CE-DECE": {"loss": "ce", "meta": {"learner": "l2", "outer": "dece"}},
    "FLgamma-DECE": {"loss": "focal", "meta": {"outer": "dece"}},
    "FLgamma-SECE": {"loss": "focal", "meta": {"outer": "sece"}},
}

#: Columns of :func:`methods_table` (Table 1 of the paper, with the MCE also on equal-mass
#: bins): ``error``, ``nll``, ``ece``, ``mce`` (equal-width bins), ``mce_em`` (the MCE on
#: equal-mass bins), ``adaptive_ece`` (the top-label ECE on equal-mass bins, the "ACE" of
#: the code the paper adapts) and ``classwise_ece``.
TABLE_COLUMNS = ("error", "nll", "ece", "mce", "mce_em", "adaptive_ece", "classwise_ece")


def summed_loss_recipe(
    lr: float, weight_decay: float, grad_clip: float, batch_size: int = 128
) -> dict[str, Any]:
    r"""Config keys for training on the batch *mean* that takes exactly the steps SGD takes on
    the loss *summed* over a batch of ``batch_size`` (``B``) with ``lr``, ``weight_decay`` and
    the gradient norm clipped to ``grad_clip`` (as in Bohdal et al.'s code).

    With :math:`\nabla\Sigma = B \nabla\mu` the gradient of the sum, that step adds
    :math:`\eta\,(\mathrm{clip}_c(B\nabla\mu) + \lambda\theta) = B\eta\,(\mathrm{clip}_{c/B}
    (\nabla\mu) + (\lambda/B)\theta)` to the momentum buffer; so ``lr = B lr``,
    ``weight_decay = weight_decay / B`` and ``grad_clip = grad_clip / B`` (returned with
    ``batch_size``). (Exact up to the ``1e-6`` that ``torch.nn.utils.clip_grad_norm_`` adds
    to the norm it divides by.) A meta run's look-ahead then needs
    ``inner_reduction="mean"``: the backbone's learning rate times the mean gradient is the
    summed-loss step.
    """
    lr = check_positive_float(lr, "lr")
    grad_clip = check_positive_float(grad_clip, "grad_clip")
    batch_size = check_positive_int(batch_size, "batch_size")
    if isinstance(weight_decay, bool) or not isinstance(weight_decay, (int, float)) or not (
            weight_decay >= 0):
        raise ValueError(f"weight_decay must be a float >= 0, got {weight_decay!r}")
    return {"batch_size": batch_size, "lr": lr * batch_size,
            "weight_decay": float(weight_decay) / batch_size,
            "grad_clip": grad_clip / batch_size}


def method_configs(
    base: Mapping[str, Any], methods: Iterable[str] | None = None,
    meta: Mapping[str, Any] | None = None,
) -> dict[str, dict[str, Any]]:
    """``{name: full config}``: ``base`` with each method's overrides (all of
    :data:`METHODS` by default, in its order). ``base`` must train with plain CE
    settings: its ``loss``, ``loss_options`` and ``meta`` are replaced. ``meta`` options
    (e.g. ``{"meta_val_size": 1000}``) join every meta method's own ones; a method's own
    option wins."""
    if not isinstance(base, Mapping):
        raise TypeError(f"base must be a config dict, got {type(base).__name__}")
    if meta is not None and not isinstance(meta, Mapping):
        raise TypeError(f"meta must be a dict of meta options, got {type(meta).__name__}")
    names = list(METHODS) if methods is None else list(methods)
    if isinstance(methods, str) or not names:
        raise ValueError(f"methods must be a non-empty list of names from {list(METHODS)}")
    unknown = [n for n in names if n not in METHODS]
    if unknown:
        raise ValueError(f"unknown method(s) {unknown}; known methods are {list(METHODS)}")
    common = {k: v for k, v in base.items() if k not in ("loss", "loss_options", "meta")}
    configs = {}
    for name in names:
        overrides = dict(METHODS[name])
        if "meta" in overrides:
            overrides["meta"] = {**dict(meta or {}), **overrides["meta"]}
        configs[name] = default_config(**common, **overrides)
    return configs


def choose_lr(
    pilots: Mapping[float, tuple[ArrayLike, ArrayLike]], *, min_ece: float = 0.01,
    n_bins: int = 15, n_boot: int = 1000, seed: int = 0,
) -> tuple[float, pd.DataFrame]:
    """The learning rate of the regime, chosen on validation data only.

    ``pilots`` maps each candidate learning rate (the first is the default, e.g. the
    reference's) to the ``(logits, labels)`` of a cross-entropy run's *validation* split.
    The rule: a candidate is eligible if the run is overconfident (mean confidence above
    accuracy) and the lower end of the 95% bootstrap interval of its ECE (``n_bins``
    equal-width bins) exceeds ``min_ece``, so that there is miscalibration to remove; the
    choice is the eligible candidate of highest validation accuracy (the first on a tie);
    without an eligible one, the first candidate. Returns ``(lr, table)`` with one row per
    candidate: ``val_acc``, ``mean_conf``, ``val_ece`` and its interval ``ece_low``,
    ``ece_high`` (fractions), ``eligible`` and ``chosen``.
    """
    if not isinstance(pilots, Mapping) or not pilots:
        raise ValueError("pilots must be a non-empty dict {lr: (val_logits, val_labels)}")
    min_ece = float(min_ece)
    if not 0 <= min_ece < 1:
        raise ValueError(f"min_ece must lie in [0, 1), got {min_ece}")
    rows = {}
    for lr, pair in pilots.items():
        if not isinstance(pair, tuple) or len(pair) != 2:
            raise TypeError(f"pilots[{lr!r}] must be a (logits, labels) pair")
        probs = metrics.probs_from_logits(pair[0])
        conf, correct = metrics.confidences_and_correct(probs, pair[1])
        interval = metrics.bootstrap_interval("ece", probs, pair[1], n_bins=n_bins,
                                              n_boot=n_boot, seed=seed)
        acc, mean_conf = float(np.mean(np.asarray(correct))), float(np.mean(np.asarray(conf)))
        rows[lr] = {"val_acc": acc, "mean_conf": mean_conf, "val_ece": interval.estimate,
                    "ece_low": interval.low, "ece_high": interval.high,
                    "eligible": bool(mean_conf > acc and interval.low > min_ece)}
    table = pd.DataFrame.from_dict(rows, orient="index").rename_axis("lr")
    eligible = table[table["eligible"]]
    chosen = eligible["val_acc"].idxmax() if len(eligible) else table.index[0]
    table["chosen"] = table.index == chosen
    return float(chosen), table


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
                                       metrics=["error", "nll", "ece", "mce", "classwise_ece"])
    table["mce_em"] = [float(metrics.mce(p, labels, n_bins=n_bins, binning="quantile"))
                       for p in probs.values()]
    table["adaptive_ece"] = [float(metrics.ece(p, labels, n_bins=n_bins, binning="quantile"))
                             for p in probs.values()]
    table = table[list(TABLE_COLUMNS)]
    percent = [c for c in TABLE_COLUMNS if c != "nll"]
    table[percent] = table[percent] * 100
    table.index.name = "method"
    return table


def per_seed_table(
    probs: Mapping[str, Mapping[int, ArrayLike]], labels: ArrayLike, n_bins: int = 15
) -> pd.DataFrame:
    """:func:`methods_table` of every method and training seed, indexed by
    ``(method, seed)``: ``probs`` maps a method to ``{seed: probabilities}``."""
    if not isinstance(probs, Mapping) or not probs:
        raise ValueError("probs must be a non-empty dict {method: {seed: probabilities}}")
    parts = []
    for name, by_seed in probs.items():
        if not isinstance(by_seed, Mapping) or not by_seed:
            raise ValueError(f"probs[{name!r}] must be a non-empty dict {{seed: probabilities}}")
        table = methods_table({str(s): p for s, p in by_seed.items()}, labels, n_bins=n_bins)
        table.index = pd.MultiIndex.from_tuples([(name, s) for s in by_seed],
                                                names=["method", "seed"])
        parts.append(table)
    return pd.concat(parts)


def mean_std(table: pd.DataFrame, decimals: int = 2) -> pd.DataFrame:
    """A ``(method, seed)`` table (:func:`per_seed_table`) as text ``"mean ± std"`` per method
    (sample std over seeds; a method with one seed shows its value alone), with the count
    of seeds in ``n``. Methods keep their order."""
    if not isinstance(table, pd.DataFrame) or table.index.nlevels != 2:
        raise ValueError("table must be a DataFrame indexed by (method, seed)")
    decimals = check_positive_int(decimals, "decimals", minimum=0)
    order = list(table.index.get_level_values(0).unique())
    groups = table.groupby(level=0, sort=False)
    mean, std, count = groups.mean(), groups.std(ddof=1), groups.size()
    text = pd.DataFrame(index=pd.Index(order, name="method"), columns=list(table.columns))
    for name in order:
        for column in table.columns:
            m, s = mean.loc[name, column], std.loc[name, column]
            text.loc[name, column] = (f"{m:.{decimals}f}" if count[name] == 1
                                      else f"{m:.{decimals}f} ± {s:.{decimals}f}")
    text["n"] = [int(count[name]) for name in order]
    return text


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
