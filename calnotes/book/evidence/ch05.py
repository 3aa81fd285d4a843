"""Chapter 5 (meta-regularization): the measures and studies its claims file names, and the
tables its prose reads from the stored runs.

Measures (one stored run -> one number; see ``book/claims/05.yaml``):

* ``ece_over_bins`` / ``mce_over_bins`` -- the mean over the bin counts of Figure 5 (10 to
  1000 equal-width bins) of the ECE / MCE: a curve that stays lower has the lower mean
  (the CE+TS arm reads them with ``temperature: val``, as the evaluator's ``ece`` does);
* ``classwise_ece`` -- Table 1's classwise ECE, also after temperature scaling (``temperature:
  val``), which the stored ``test_classwise_ece`` cannot give;
* ``ece_bin_growth`` / ``mce_bin_growth`` -- Figure 5's growth: the ECE / MCE at 1000
  equal-width bins minus at 10 (options ``low``, ``high``);
* ``gamma_std_growth`` -- Figure 3(d): the std of gamma over the test images after the last
  epoch minus after the epoch of the first learning-rate drop.

Studies (replicate values of an effect):

* ``ch05_bias_gap`` -- on a perfectly calibrated synthetic model (true error 0), per draw,
  SECE minus DECE (Bohdal et al.'s form) or minus the 15-bin ECE;
* ``ch05_outer_cost`` -- per timing round, ``log(t_DECE / t_SECE)`` of one forward and
  backward pass from a batch of logits, with DECE in the form of Meta-Calibration's code
  (:func:`reference_dece`: the soft rank of every class from all ``B C^2`` pairwise
  differences) or the library's (:func:`calnotes.losses.dece`, the true class's rank
  alone, ``O(BC)``, the same value).
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from calnotes import losses, metrics
from calnotes._checks import check_choice, check_positive_int
from calnotes.calibrators import TemperatureScaling
from calnotes.ood import auroc
from calnotes.runs.claims import register_measure, register_study, run_measure
from calnotes.runs.gamma import GAMMA_FOLDER, run_test_gamma
from calnotes.runs.store import RunNotFound
from calnotes.synthetic import SyntheticModel

__all__ = [
    "BIN_COUNTS", "LABEL", "bias_gap", "classwise_ece", "ece_bin_growth", "ece_over_bins",
    "epoch_cost",
    "gamma_misclassification_auroc", "gamma_phases", "gamma_summary", "gamma_std_growth",
    "l2_coefficients",
    "mce_bin_growth", "mce_over_bins", "meta_steps", "outer_cost", "reference_dece",
]

LABEL = "ch05_meta"
#: The bin counts of the paper's Figure 5 (10 to 1000) at which the chapter reads the curves.
BIN_COUNTS = (10, 15, 30, 50, 100, 200, 500, 1000)


# ---------------------------------------------------------------- measures on stored runs

def _bins(bins: Any) -> list[int]:
    if isinstance(bins, (int, np.integer)):
        return [check_positive_int(int(bins), "bins")]
    if isinstance(bins, (str, bytes)) or not isinstance(bins, Sequence) or not bins:
        raise ValueError(f"bins must be a positive int or a non-empty list of them, got {bins!r}")
    return [check_positive_int(b, "bins") for b in bins]


def _over_bins(measure: str, run: Any, index: Any, bins: Any, binning: str,
               temperature: Any) -> float:
    """Mean over ``bins`` of the evaluator's measure ``measure`` (``"ece"``/``"mce"``)."""
    check_choice(binning, "binning", ("width", "mass"))
    return float(np.mean([run_measure(measure, run, index=index, bins=b, binning=binning,
                                      temperature=temperature) for b in _bins(bins)]))


@register_measure("ece_over_bins")
def ece_over_bins(run: Any, index: Any = None, bins: Any = BIN_COUNTS, binning: str = "width",
                  temperature: Any = None) -> float:
    """``mean_b ECE_b`` over the bin counts ``bins`` (Figure 5's curve, averaged);
    ``temperature="val"``: after temperature scaling fitted on the run's validation split."""
    return _over_bins("ece", run, index, bins, binning, temperature)


@register_measure("mce_over_bins")
def mce_over_bins(run: Any, index: Any = None, bins: Any = BIN_COUNTS, binning: str = "width",
                  temperature: Any = None) -> float:
    """``mean_b MCE_b`` over the bin counts ``bins`` (``temperature`` as
    ``ece_over_bins``)."""
    return _over_bins("mce", run, index, bins, binning, temperature)


@register_measure("classwise_ece")
def classwise_ece(run: Any, index: Any = None, bins: int = 15, temperature: Any = None) -> float:
    r"""Classwise ECE (Table 1's "Classwise ECE", ``bins`` equal-width bins per class) of the
    run's test predictions, :math:`\frac1K \sum_k \sum_m \frac{|B_{mk}|}{N}
    |\bar y_{mk} - \bar p_{mk}|`; ``temperature="val"``: after temperature scaling fitted by
    NLL on the run's validation split (how the CE+TS arm reads it)."""
    if temperature is not None and temperature != "val":
        raise ValueError(f"temperature must be None or 'val', got {temperature!r}")
    logits = run.test_logits.double()
    if temperature == "val":
        scale = TemperatureScaling().fit(run.val_logits.double(), run.val_labels).temperature_
        logits = logits / float(scale)
    probs, labels = torch.softmax(logits, dim=1), run.test_labels
    if index is not None:
        idx = torch.as_tensor(np.asarray(index), dtype=torch.long)
        probs, labels = probs[idx], labels[idx]
    return float(metrics.classwise_ece(probs, labels, n_bins=check_positive_int(bins, "bins")))


def _bin_growth(measure: str, run: Any, index: Any, low: int, high: int, binning: str,
                temperature: Any) -> float:
    """``m_high - m_low`` of the evaluator's measure ``measure`` (``"ece"``/``"mce"``)."""
    low, high = check_positive_int(low, "low"), check_positive_int(high, "high")
    if low >= high:
        raise ValueError(f"low must be fewer bins than high, got low={low}, high={high}")
    return (_over_bins(measure, run, index, high, binning, temperature)
            - _over_bins(measure, run, index, low, binning, temperature))


@register_measure("ece_bin_growth")
def ece_bin_growth(run: Any, index: Any = None, low: int = BIN_COUNTS[0],
                   high: int = BIN_COUNTS[-1], binning: str = "width",
                   temperature: Any = None) -> float:
    """``ECE_high - ECE_low``: how much the binned ECE grows as the bins go from ``low`` (10)
    to ``high`` (1000), Figure 5's growth (``temperature`` as ``ece_over_bins``)."""
    return _bin_growth("ece", run, index, low, high, binning, temperature)


@register_measure("mce_bin_growth")
def mce_bin_growth(run: Any, index: Any = None, low: int = BIN_COUNTS[0],
                   high: int = BIN_COUNTS[-1], binning: str = "width",
                   temperature: Any = None) -> float:
    """``MCE_high - MCE_low`` from ``low`` (10) to ``high`` (1000) bins (as
    :func:`ece_bin_growth`)."""
    return _bin_growth("mce", run, index, low, high, binning, temperature)


def _records(run: Any, key: str) -> list[dict[str, Any]]:
    records = run.history.to_frame().to_dict("records")
    if not records or key not in records[-1]:
        raise ValueError(f"run {run.path} has no per-epoch {key!r} in its history")
    return records


def _first_drop_epoch(config: Mapping[str, Any]) -> int:
    """The epoch after which the learning rate first drops (milestone of a step schedule)."""
    milestones = config.get("milestones") or []
    if config.get("schedule") != "step" or not milestones:
        raise ValueError("the run has no step schedule with milestones")
    return max(1, round(float(milestones[0]) * int(config["epochs"])))


@register_measure("gamma_std_growth")
def gamma_std_growth(run: Any, index: Any = None) -> float:
    """std of gamma on the test images after the last epoch minus after the first drop
    (read from the run's history: it cannot be recomputed on resampled test indices)."""
    if index is not None:
        raise ValueError("index: gamma_std_growth is read from the stored history and "
                         "cannot be bootstrapped over test samples")
    records = _records(run, "gamma_std")
    start = _first_drop_epoch(run.config)
    return float(records[-1]["gamma_std"] - records[start - 1]["gamma_std"])


@register_measure("gamma_misclassification_auroc")
def gamma_misclassification_auroc(run: Any, index: Any = None) -> float:
    """AUROC of gamma-Net's per-sample test gamma as a score of misclassification:
    ``P(gamma_wrong > gamma_right) + P(tie) / 2`` over the test images ``index`` (all by
    default), an image wrong where the network gamma was read from misclassifies it. Reads
    what :func:`calnotes.runs.gamma.run_test_gamma` stored;
    :class:`~calnotes.runs.store.RunNotFound` while it is not stored (the claim waits)."""
    if not (Path(run.path) / GAMMA_FOLDER).is_dir():
        raise RunNotFound(f"the per-sample test gamma of run {run.path.name} is not stored "
                          "yet (tools/ch05_gamma.py computes it)")
    stored = run_test_gamma(run, retrain=False)
    gamma = stored.gamma.double()
    wrong = stored.logits.argmax(1) != run.test_labels
    if index is not None:
        gamma, wrong = gamma[index], wrong[index]
    if bool(wrong.all()) or not bool(wrong.any()):
        raise ValueError(f"run {run.path.name}: the test images hold no correct or no "
                         "misclassified image; the AUROC is undefined")
    return auroc(gamma[wrong], gamma[~wrong])


def gamma_summary(run: Any, test_gamma: Any) -> dict[str, float]:
    """What chapter 5 says of a run's per-sample test gamma (a
    :class:`~calnotes.runs.gamma.TestGamma`): mean gamma of the correctly classified
    (``right``) and misclassified (``wrong``) images of the network it was read from, their
    ``auroc`` (:func:`gamma_misclassification_auroc`, NaN unless both groups exist and the
    gamma is stored with the run), the ``spread`` (std) and ``mean_network`` of gamma, the
    stored run's last recorded mean (``mean_stored``), the largest logit difference
    (``diff``), and the test error in percent of the stored run and of that network."""
    wrong = test_gamma.logits.argmax(1) != run.test_labels
    both = bool(wrong.any()) and not bool(wrong.all())
    stored = (Path(run.path) / GAMMA_FOLDER).is_dir()
    nan = float("nan")
    return {
        "right": float(test_gamma.gamma[~wrong].mean()) if both else nan,
        "wrong": float(test_gamma.gamma[wrong].mean()) if both else nan,
        "auroc": gamma_misclassification_auroc(run) if both and stored else nan,
        "spread": float(test_gamma.gamma.std()),
        "mean_network": float(test_gamma.gamma.mean()),
        "mean_stored": float(run.history["gamma_mean"][-1]),
        "diff": float(test_gamma.max_logit_diff),
        "err_stored": 100 * float((run.test_logits.argmax(1) != run.test_labels)
                                  .double().mean()),
        "err_network": 100 * float(wrong.double().mean()),
    }


# ---------------------------------------------------------------- DECE as the reference computes it

def reference_dece(probs: torch.Tensor, labels: torch.Tensor, n_bins: int = 15,
                   temperature: float = 0.01, accuracy_temperature: float = 0.01) -> torch.Tensor:
    r"""Meta-Calibration's DECE in the layout of its code: soft bins from linear logits,
    bin shares smoothed by :math:`10^{-6}`, and the soft rank of *every* class from all
    :math:`B C^2` pairwise differences, :math:`\mathrm{rank}_{ic} = \tfrac12 + \sum_k
    \sigma((p_{ik} - p_{ic}) / t_a)`, of which only the true class's is used. Same value as
    :func:`calnotes.losses.dece` (``form="ranked"``) up to the smoothing (< (2M+1) 1e-6)."""
    n = probs.shape[0]
    conf = probs.max(dim=1).values
    m = torch.arange(1, n_bins + 1, dtype=probs.dtype, device=probs.device)
    shares = F.softmax((conf.unsqueeze(1) * m - m * (m - 1) / (2 * n_bins)) / temperature, 1)
    shares = (shares + 1e-6) / (1.0 + n_bins * 1e-6)
    counts = shares.sum(dim=0)
    ranks = torch.sigmoid((probs.unsqueeze(1) - probs.unsqueeze(2)) / accuracy_temperature)
    ranks = ranks.sum(dim=2) + 0.5  # (B, C): the soft rank of every class
    acc = F.relu(2.0 - ranks[torch.arange(n, device=probs.device), labels])
    gap = shares.t() @ acc / counts - shares.t() @ conf / counts
    return (counts * gap.abs()).sum() / n


_OUTER: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    # torch input: both give a tensor
    "sece": lambda p, y: cast(torch.Tensor, metrics.sece(p, y, bandwidth=0.05, method="exact")),
    "reference": reference_dece,
    "library": lambda p, y: cast(torch.Tensor,
                                 losses.dece(p, y, form="ranked", **losses.RANKED_DECE)),
}


def _seconds_per_call(fn: Callable, logits: torch.Tensor, labels: torch.Tensor,
                      calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        z = logits.detach().requires_grad_(True)
        fn(torch.softmax(z, dim=1), labels).backward()
    return (time.perf_counter() - start) / calls


@register_study("ch05_outer_cost")
def outer_cost(classes: int, batch: int = 128, rounds: int = 15, calls: int = 30,
               form: str = "reference", seed: int = 0) -> np.ndarray:
    """Per round, ``log(t_DECE / t_SECE)``, seconds per forward + backward call from float32
    logits ``3 z`` (``z ~ N(0, 1)``), one thread; the two alternate within each round."""
    classes, batch = check_positive_int(classes, "classes"), check_positive_int(batch, "batch")
    rounds, calls = check_positive_int(rounds, "rounds"), check_positive_int(calls, "calls")
    form = check_choice(form, "form", ("reference", "library"))
    gen = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(batch, classes, generator=gen)
    labels = torch.randint(0, classes, (batch,), generator=gen)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name in ("sece", form):  # warm-up
            _seconds_per_call(_OUTER[name], logits, labels, max(1, calls // 5))
        out = []
        for _ in range(rounds):
            t_sece = _seconds_per_call(_OUTER["sece"], logits, labels, calls)
            t_dece = _seconds_per_call(_OUTER[form], logits, labels, calls)
            out.append(math.log(t_dece / t_sece))
    finally:
        torch.set_num_threads(threads)
    return np.asarray(out)


@functools.lru_cache(maxsize=16)
def _calibrated_estimates(n: int, draws: int, seed: int) -> pd.DataFrame:
    """SECE, DECE and 15-bin ECE of ``draws`` samples of ``n`` predictions of a perfectly
    calibrated model (:class:`calnotes.synthetic.SyntheticModel`), draw ``r`` seeded by
    ``(seed, n, r)``."""
    model = SyntheticModel("calibrated")
    rows = []
    for r in range(draws):
        probs, labels = model.sample(n, seed=np.random.SeedSequence([seed, n, r]))
        p, y = torch.as_tensor(probs), torch.as_tensor(labels)
        rows.append({"sece": float(metrics.sece(p, y, bandwidth=0.05)),
                     "dece": float(losses.dece(p, y, form="ranked", **losses.RANKED_DECE)),
                     "ece": float(metrics.ece(p, y, n_bins=15))})
    return pd.DataFrame(rows)


@register_study("ch05_bias_gap")
def bias_gap(n: int, draws: int = 200, other: str = "dece", seed: int = 0) -> np.ndarray:
    """Per draw, SECE minus ``other`` (``"dece"`` or ``"ece"``) on a perfectly calibrated
    model: the difference of their biases, as the true error is 0."""
    n, draws = check_positive_int(n, "n"), check_positive_int(draws, "draws")
    other = check_choice(other, "other", ("dece", "ece"))
    frame = _calibrated_estimates(n, draws, int(seed))
    return (frame["sece"] - frame[other]).to_numpy()


# ---------------------------------------------------------------- tables for the prose

def l2_coefficients(runs: Mapping[int, Any]) -> pd.DataFrame:
    """CE-DECE's learned L2 coefficients after the last epoch, per seed: their mean and
    (population) std, beside the fixed weight decay in the same (summed-loss) units.

    The penalty is :math:`\\sum_j \\lambda_j w_j^2` on the summed loss, whose gradient
    :math:`2\\lambda_j w_j` matches weight decay ``wd`` at :math:`\\lambda_j = wd/2`."""
    rows = {}
    for seed, run in runs.items():
        last = _records(run, "l2_mean")[-1]
        wd = float(run.config["weight_decay"]) * int(run.config["batch_size"])  # summed units
        rows[seed] = {"mean λ": last["l2_mean"], "std λ": last["l2_std"],
                      "weight decay (summed loss)": wd,
                      "std λ / weight decay": last["l2_std"] / wd if wd else math.nan}
    return pd.DataFrame(rows).T.rename_axis("seed")


def meta_steps(train_images: int, batch: int, epochs: int,
               milestones: Sequence[float]) -> pd.DataFrame:
    """Meta (gamma-Net) steps in each learning-rate phase of a step schedule: one per
    training batch, ``ceil(train_images / batch)`` per epoch."""
    per_epoch = math.ceil(check_positive_int(train_images, "train_images")
                          / check_positive_int(batch, "batch"))
    edges = [0, *[max(1, round(f * epochs)) for f in milestones], epochs]
    return pd.DataFrame([{"phase": f"lr × {10.0 ** -i:g}", "epochs": b - a,
                          "meta steps": (b - a) * per_epoch}
                         for i, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True))])


def gamma_phases(runs: Mapping[int, Any]) -> pd.DataFrame:
    """Mean gamma on the test images at the end of each learning-rate phase, per seed, and
    its mean change per epoch within the phase (the meta-learner's pace)."""
    rows = []
    for seed, run in runs.items():
        records = _records(run, "gamma_mean")
        epochs = len(records)
        edges = [0, *[max(1, round(float(f) * epochs)) for f in run.config["milestones"]],
                 epochs]
        for i, (a, b) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
            before = records[a - 1]["gamma_mean"] if a else records[0]["gamma_mean"]
            span = b - a if a else b - 1
            rows.append({"seed": seed, "phase": i + 1, "epochs": f"{a + 1}-{b}",
                         "γ at end": records[b - 1]["gamma_mean"],
                         "change per epoch": (records[b - 1]["gamma_mean"] - before)
                         / max(span, 1)})
    return pd.DataFrame(rows).set_index(["seed", "phase"])


def epoch_cost(runs: Mapping[str, Mapping[int, Any]]) -> pd.DataFrame:
    """Per method: mean seconds per epoch and per training step (batches of the run's
    training images less its meta-validation split), and whether an epoch's time includes
    a gamma-Net forward over the test images (FLγ runs record gamma's statistics there)."""
    rows = {}
    for name, by_seed in runs.items():
        seconds, steps = [], []
        for run in by_seed.values():
            meta = run.config.get("meta") or {}
            images = int(run.config["train_subset"]) - int(meta.get("meta_val_size") or 0)
            n_steps = math.ceil(images / int(run.config["batch_size"]))
            s = [r["seconds"] for r in _records(run, "seconds")]
            seconds.append(float(np.mean(s)))
            steps.append(float(np.mean(s)) / n_steps)
        meta = next(iter(by_seed.values())).config.get("meta") or {}
        rows[name] = {"s per epoch": float(np.mean(seconds)), "ms per step": 1e3 * float(
            np.mean(steps)), "test forward in epoch": meta.get("learner") == "gamma-net"}
    return pd.DataFrame(rows).T
