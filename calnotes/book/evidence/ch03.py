r"""Chapter 3's measures: a stored run's test metrics after a post-hoc calibrator.

:func:`posthoc` fits a calibrator of :data:`calnotes.calibrators.CALIBRATORS` (or none:
``"uncalibrated"``) on the run's validation logits and measures its test predictions, under
one of two evaluations of the binned errors:

* ``convention="book"``: equal-width bins :math:`(b_{m-1}, b_m]` (or equal-mass bins), empty
  bins left out, as everywhere in the book (:func:`calnotes.metrics.ece`);
* ``convention="lecture"``: the reliability-diagram loop of the lecture on Guo et al.: bins
  :math:`[b_{m-1}, b_m)` of ``np.linspace(0, 1, M + 1)``, so that a confidence of exactly 1
  falls in no bin; an empty bin has accuracy 0 and confidence at its midpoint, and so enters
  the MCE (``lecture_bins``). The ECE weights are :math:`|B_m| / n` with :math:`n` all
  test samples, as the lecture's formula writes it.

A new calibrator is a new key of ``CALIBRATORS``: every measure here takes it by name.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from calnotes import metrics
from calnotes.calibrators import CALIBRATORS
from calnotes.evaluation import UNCALIBRATED, compare_calibrators
from calnotes.runs.claims import register_measure, register_rule
from calnotes.runs.experiment import default_config
from calnotes.runs.store import RunStore

__all__ = ["RULE_EPOCHS", "RULE_SEEDS", "binary_r18_config", "calibrated_probs", "confidences",
           "evaluate", "lecture_bins", "posthoc", "r18_binary_epochs", "rule_epochs",
           "share_at_one", "validation_error", "odir_sweep", "small_validation",
           "temperature_objectives", "training_seconds", "vector_spread"]

#: The declared rule of the binary ResNet-18 (claims file, "R18-bin"): its candidate numbers of
#: epochs, chosen on seed 0's validation error, and the seeds its claims are measured on.
RULE_EPOCHS = (2, 4)
RULE_SEEDS = (0, 1, 2)

METRICS = ("ece", "mce", "sece", "nll", "error", "brier")
BINNINGS = {"width": "uniform", "mass": "quantile"}
CONVENTIONS = ("book", "lecture")
TARGETS = ("top", "positive")
CHANGES = (None, "difference", "relative")

#: (run folder, method) -> float64 test probabilities: a calibrator is fitted once per run,
#: whatever the test resamples asked for.
_PROBS: dict[tuple[str, str], torch.Tensor] = {}
#: (run folder, method, target) -> (confidence, outcome) as float64 arrays, for the binned
#: errors of the test resamples (one indexing and a bincount per resample).
_CONF: dict[tuple[str, str, str], tuple[np.ndarray, np.ndarray]] = {}


def binary_r18_config(seed: int, epochs: int) -> dict[str, Any]:
    """The config of the binary ResNet-18 ("9 vs not-9" on 4,000 MNIST training images, SGD
    at lr 0.05 with the cosine schedule, no weight decay) for ``seed`` and ``epochs``."""
    return default_config(dataset="mnist", model="resnet18", positive_class=9,
                          weight_decay=0.0, lr=0.05, seed=seed, epochs=epochs,
                          train_subset=4000)


def validation_error(run: Any) -> float:
    """A stored run's top-label error on its validation split, in percent."""
    return 100 * float((run.val_logits.argmax(1) != run.val_labels).double().mean())


def rule_epochs(candidates: dict[int, Any]) -> int:
    """The declared rule's choice: the number of epochs whose seed-0 run (``{epochs: run}``,
    every candidate of ``RULE_EPOCHS``) has the lowest validation error; a tie goes to
    fewer epochs. The test set plays no part."""
    if sorted(candidates) != sorted(RULE_EPOCHS):
        raise ValueError(f"candidates must hold runs for epochs {list(RULE_EPOCHS)}, "
                         f"got {sorted(candidates)}")
    return min(candidates, key=lambda e: (validation_error(candidates[e]), e))


@register_rule("r18-binary-epochs")
def r18_binary_epochs(store: RunStore) -> dict[str, int]:
    """The claims' selection rule: ``{"epochs": E}`` by :func:`rule_epochs` on seed 0's
    stored candidates (:class:`~calnotes.runs.store.RunNotFound` while one is missing)."""
    return {"epochs": rule_epochs({e: store.load(binary_r18_config(0, e))
                                   for e in RULE_EPOCHS})}


def _choice(value: Any, name: str, allowed: tuple | dict) -> Any:
    if value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")
    return value


def calibrated_probs(run: Any, method: str) -> torch.Tensor:
    """Test probabilities ``(N, C)`` in float64 of ``method`` fitted on the run's validation
    logits (``"uncalibrated"``: the softmax of the test logits)."""
    if method != UNCALIBRATED and method not in CALIBRATORS:
        raise ValueError(f"method must be 'uncalibrated' or one of {sorted(CALIBRATORS)}, "
                         f"got {method!r}")
    key = (str(run.path), method)
    if key not in _PROBS:
        test = run.test_logits.double()
        if method == UNCALIBRATED:
            probs = torch.softmax(test, dim=1)
        else:
            if run.val_logits is None:
                raise ValueError(f"run {run.path} has no validation logits to fit {method!r} on")
            cal = CALIBRATORS[method]().fit(run.val_logits.double(), run.val_labels)
            probs = torch.as_tensor(cal.predict_proba(test)).double()
        _PROBS[key] = probs
    return _PROBS[key]


def confidences(probs: torch.Tensor, labels: torch.Tensor, target: str = "top"
                ) -> tuple[np.ndarray, np.ndarray]:
    """``(confidence, outcome)`` as float64 arrays: the top-label confidence and whether the
    prediction is right (``"top"``), or the probability of class 1 and whether the label is 1
    (``"positive"``, binary problems: the "is it a 9" view)."""
    _choice(target, "target", TARGETS)
    p = torch.as_tensor(probs).double()
    y = torch.as_tensor(labels).long()
    if target == "positive":
        if p.shape[1] != 2:
            raise ValueError(f"target='positive' needs 2 classes, got {p.shape[1]}")
        return p[:, 1].numpy(), (y == 1).double().numpy()
    conf, pred = p.max(dim=1)
    return conf.numpy(), (pred == y).double().numpy()


def lecture_bins(conf: np.ndarray, outcome: np.ndarray, n_bins: int = 15
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(count, accuracy, confidence)`` per bin with the lecture's loop: ``conf >= low`` and
    ``conf < high``; an empty bin gets accuracy 0 and the midpoint ``(low + high) / 2``."""
    edges = np.linspace(0, 1, n_bins + 1)
    count, acc, mean = np.zeros(n_bins), np.zeros(n_bins), np.zeros(n_bins)
    for m in range(n_bins):
        low, high = edges[m], edges[m + 1]
        mask = (conf >= low) & (conf < high)
        count[m] = mask.sum()
        if count[m] > 0:
            acc[m], mean[m] = outcome[mask].mean(), conf[mask].mean()
        else:
            mean[m] = (low + high) / 2
    return count, acc, mean


def _book_bins(conf: np.ndarray, outcome: np.ndarray, n_bins: int):
    """Equal-width bins ``(b_{m-1}, b_m]`` (the first also holds 0), empty bins dropped."""
    index = np.clip(np.ceil(conf * n_bins).astype(int) - 1, 0, n_bins - 1)
    count = np.bincount(index, minlength=n_bins).astype(float)
    hit = np.bincount(index, weights=outcome, minlength=n_bins)
    total = np.bincount(index, weights=conf, minlength=n_bins)
    keep = count > 0
    return count[keep], hit[keep] / count[keep], total[keep] / count[keep]


def evaluate(probs: torch.Tensor, labels: torch.Tensor, metric: str = "ece", bins: int = 15,
             binning: str = "width", convention: str = "book", target: str = "top") -> float:
    r"""One metric of ``probs`` against ``labels``.

    ECE :math:`\sum_m \frac{|B_m|}{n} |acc_m - conf_m|`, MCE :math:`\max_m |acc_m - conf_m|`
    over the bins of the convention; ``sece`` the library's smooth ECE; ``nll``, ``error``,
    ``brier`` as in :mod:`calnotes.metrics` (no binning).
    """
    _choice(metric, "metric", METRICS)
    _choice(binning, "binning", BINNINGS)
    _choice(convention, "convention", CONVENTIONS)
    _choice(target, "target", TARGETS)
    if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
        raise ValueError(f"bins must be a positive int, got {bins!r}")
    if metric in ("nll", "error", "brier", "sece"):
        if target != "top":
            raise ValueError(f"metric {metric!r} is top-label only; got target={target!r}")
        return float(getattr(metrics, metric)(probs, labels))
    if convention == "book" and target == "top":
        fn = metrics.ece if metric == "ece" else metrics.mce
        return float(fn(probs, labels, n_bins=bins, binning=BINNINGS[binning]))
    if binning != "width":
        raise ValueError("binning='mass' is implemented for the book's top-label errors only")
    conf, outcome = confidences(probs, labels, target)
    count, acc, mean = (lecture_bins if convention == "lecture" else _book_bins)(
        conf, outcome, bins)
    gap = np.abs(acc - mean)
    return float(gap.max() if metric == "mce" else (count * gap).sum() / len(conf))


@register_measure("posthoc")
def posthoc(run: Any, index: Any = None, method: str = UNCALIBRATED, metric: str = "ece",
            change: str | None = None, reference: str = UNCALIBRATED, bins: int = 15,
            binning: str = "width", convention: str = "book", target: str = "top") -> float:
    r"""A test metric of ``method`` fitted on the run's validation split; with ``change``,
    its difference :math:`m_{method} - m_{ref}` or relative change
    :math:`(m_{method} - m_{ref}) / m_{ref}` against ``reference`` on the same test samples
    (``index``: test-sample indices, ``None`` = all)."""
    _choice(change, "change", CHANGES)
    labels = run.test_labels

    binned = metric in ("ece", "mce") and binning == "width"

    def value(name: str) -> float:
        if binned:  # the same bins as evaluate(), on the cached confidences
            _choice(convention, "convention", CONVENTIONS)
            if isinstance(bins, bool) or not isinstance(bins, int) or bins < 1:
                raise ValueError(f"bins must be a positive int, got {bins!r}")
            key = (str(run.path), name, target)
            if key not in _CONF:
                _CONF[key] = confidences(calibrated_probs(run, name), labels, target)
            conf, outcome = _CONF[key]
            if index is not None:
                idx = np.asarray(index)
                conf, outcome = conf[idx], outcome[idx]
            count, acc, mean = (lecture_bins if convention == "lecture" else _book_bins)(
                conf, outcome, bins)
            gap = np.abs(acc - mean)
            return float(gap.max() if metric == "mce" else (count * gap).sum() / len(conf))
        probs = calibrated_probs(run, name)
        y = labels
        if index is not None:
            rows = torch.as_tensor(np.asarray(index), dtype=torch.long)
            probs, y = probs[rows], y[rows]
        return evaluate(probs, y, metric, bins, binning, convention, target)

    mine = value(method)
    if change is None:
        return mine
    ref = value(reference)
    if change == "difference":
        return mine - ref
    if ref == 0:
        raise ValueError(f"the reference {reference!r} has {metric} 0: no relative change")
    return (mine - ref) / ref


def share_at_one(probs: torch.Tensor) -> float:
    """The share of top-label confidences that equal 1.0 exactly (the lecture's loop drops
    them)."""
    conf = torch.as_tensor(probs).double().max(dim=1).values
    return float((conf == 1.0).double().mean())


# --- The exercises' solutions --------------------------------------------------------------

def _test_metrics(logits: Any, labels: Any, n_bins: int) -> dict[str, float]:
    probs = torch.softmax(torch.as_tensor(logits).double(), dim=1)
    return {"test ECE (%)": 100 * float(metrics.ece(probs, labels, n_bins=n_bins)),
            "test NLL": float(metrics.nll(probs, labels))}


def temperature_objectives(run: Any, n_bins: int = 15) -> pd.DataFrame:
    """Temperature scaling of a stored run fitted by the validation NLL and by the validation
    ECE (``TemperatureScaling(selection=...)``): the temperature and the test ECE and NLL."""
    rows = {}
    for selection in ("nll", "ece"):
        ts = CALIBRATORS["temperature"](selection=selection).fit(run.val_logits, run.val_labels)
        z = run.test_logits.double() / ts.temperature_
        rows[selection] = {"T": float(ts.temperature_),
                           **_test_metrics(z, run.test_labels, n_bins)}
    frame = pd.DataFrame(rows).T
    frame.index.name = "fitted by"
    return frame


def small_validation(run: Any, size: int, draws: int, methods: Sequence[str],
                     n_bins: int = 15, seed: int = 0) -> pd.DataFrame:
    """Test ECE (%) of each calibrator fitted on all of a run's validation logits and on
    ``draws`` random subsets of ``size`` of them (mean and largest over the draws): what a
    smaller validation split costs each method, without retraining the network."""
    n = run.val_logits.shape[0]
    args = (run.test_logits, run.test_labels)
    full = compare_calibrators(run.val_logits, run.val_labels, *args, methods=methods,
                               n_bins=n_bins).table["ece"]
    small = []
    for draw in range(draws):
        small.append(compare_calibrators(*_val_subset(run, size, seed + draw), *args,
                                         methods=methods, n_bins=n_bins).table["ece"])
    drawn = pd.concat(small, axis=1)
    return 100 * pd.DataFrame({f"all {n}": full, f"{size}, mean": drawn.mean(axis=1),
                               f"{size}, largest": drawn.max(axis=1)})


def _val_subset(run: Any, size: int | None, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    n = run.val_logits.shape[0]
    if size is None:
        return run.val_logits, run.val_labels
    if not 1 <= size <= n:
        raise ValueError(f"size must be between 1 and the run's {n} validation images, "
                         f"got {size}")
    idx = torch.randperm(n, generator=torch.Generator().manual_seed(seed))[:size]
    return run.val_logits[idx], run.val_labels[idx]


def odir_sweep(run: Any, regs: Sequence[float], size: int | None = None, seed: int = 0,
               n_bins: int = 15) -> pd.DataFrame:
    """Matrix scaling with the ODIR penalty ``reg`` (Kull et al. 2019) for each value of
    ``regs``, fitted on a run's validation logits (or a random ``size`` of them, the first
    draw of :func:`small_validation` with the same seed): test ECE (%), NLL and error (%)."""
    val_logits, val_labels = _val_subset(run, size, seed)
    rows = {}
    for reg in regs:
        table = compare_calibrators(val_logits, val_labels, run.test_logits,
                                    run.test_labels, methods=["matrix"], n_bins=n_bins,
                                    options={"matrix": {"reg": reg}}).table.loc["matrix"]
        rows[reg] = {"test ECE (%)": 100 * table["ece"], "test NLL": table["nll"],
                     "test error (%)": 100 * table["error"]}
    frame = pd.DataFrame(rows).T
    frame.index.name = "reg"
    return frame


def vector_spread(weight: Any, temperature: float) -> dict[str, float]:
    """Vector scaling's per-class weights :math:`w_k` against :math:`1/T`: the smallest and
    largest :math:`w_k T` and their coefficient of variation (1 everywhere would be
    temperature scaling)."""
    wt = np.asarray(weight, dtype=np.float64) * float(temperature)
    return {"min": float(wt.min()), "max": float(wt.max()),
            "cv": float(wt.std() / abs(wt.mean()))}


def training_seconds(run: Any, images: int, epochs: int) -> float:
    """A stored run's wall time scaled to ``images`` training images and ``epochs`` epochs
    (time per image and epoch held fixed: an estimate on the run's own device)."""
    seconds = run.provenance.get("seconds")
    if seconds is None:
        raise ValueError(f"run {run.path.name} has no wall time in its provenance")
    config = run.config
    trained = config["train_subset"] or (60_000 - config["val_size"])
    return float(seconds) * images * epochs / (trained * config["epochs"])
