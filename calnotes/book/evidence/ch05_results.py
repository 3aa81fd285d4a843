r"""Chapter 5 (meta-regularization): the chapter's runs read into its tables, figures and
glued numbers.

The runs follow one recipe (:class:`Runner`): the paper's summed-loss SGD written as a step
on the batch mean (:func:`calnotes.runs.methods.summed_loss_recipe`), a step schedule with
the reference's decays, and the methods of :data:`calnotes.runs.methods.METHODS`. Runs are
keyed ``runs[method][seed]``; per-seed tables are :func:`calnotes.runs.methods.per_seed_table`
(index ``(method, seed)``, metrics in percent). Methods are compared paired by seed
(:func:`paired`): within a seed both share the data split, the initialization and the test
set, and the interval is the Student-t interval of the mean of the per-seed differences,
:math:`\bar d \pm t_{0.975,\,n-1}\, s_d / \sqrt{n}`. Every ``*_glue`` function returns
``{glue name: value}`` for the numbers the prose quotes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch

from calnotes import losses, metrics, stats
from calnotes.book.evidence.ch05_gamma import MILESTONES, SECE
from calnotes.metrics.intervals import SeedInterval
from calnotes.runs.executor import chapter_runs, compute_runs
from calnotes.runs.experiment import default_config
from calnotes.runs.methods import (
    METHODS,
    ece_vs_bins,
    method_configs,
    summed_loss_recipe,
    temperature_scaled,
)
from calnotes.runs.store import StoredRun, config_hash
from calnotes.synthetic import SyntheticModel, estimator_study

__all__ = [
    "BASELINES", "CORE", "PRETTY", "Runner", "Sizes", "beside_paper", "bias_glue", "bias_intervals",
    "bins_curves", "bins_figure", "bins_glue", "claim_interval_glue", "claims_glue",
    "cost_glue", "ece_glue", "ece_kinds", "estimator_table", "focal_rule", "mce_glue",
    "mce_table", "method_probs", "method_runs", "outer_cost_table", "paired", "paper_table",
    "pilot_glue", "pilot_view", "rows", "sizes", "versus_table",
]

#: The methods trained with every seed, and the baselines trained with fewer.
CORE = ["FLgamma-SECE", "CE", "CE-DECE", "FLgamma-DECE",
        "Focal (gamma=0.5)", "Focal (gamma=1)", "Focal (gamma=2)", "Focal (gamma=3)"]
BASELINES = ["FLSD-53", "LS (0.05)", "Mixup (alpha=0.2)", "MMCE"]
#: Column labels of the tables.
PRETTY = {"error": "Error", "nll": "NLL", "ece": "ECE", "mce": "MCE",
          "mce_em": "MCE (equal-mass)", "adaptive_ece": "ACE (top-label, equal-mass)",
          "classwise_ece": "classwise ECE"}
#: DECE in Bohdal et al.'s form: the options of :data:`calnotes.losses.RANKED_DECE`.
_RANKED: dict[str, Any] = dict(losses.RANKED_DECE)


class Sizes(NamedTuple):
    """The chapter's sizes (see :func:`sizes`)."""

    scale: dict[str, Any]
    meta_val_size: int
    seeds: list[int]
    baseline_seeds: list[int]
    lr_candidates: list[float]
    n_boot: int


def sizes(smoke: bool, seed: int, n_seeds: int, n_baseline_seeds: int, model: str, epochs: int,
          train_subset: int, val_size: int, meta_val_size: int,
          lr_candidates: Sequence[float]) -> Sizes:
    """The chapter's sizes at its parameters, or SMOKE's tiny ones: ``scale`` (config keys),
    ``meta_val_size``, ``seeds``, ``baseline_seeds``, ``lr_candidates`` and ``n_boot``."""
    if not isinstance(smoke, bool):
        raise TypeError(f"smoke must be a bool, got {type(smoke).__name__}")
    scale = (dict(model="resnet8", epochs=3, train_subset=400, val_size=200, test_subset=500)
             if smoke else dict(model=model, epochs=epochs, train_subset=train_subset,
                                val_size=val_size, test_subset=None))
    return Sizes(scale, 100 if smoke else meta_val_size,
                 [seed + i for i in range(2 if smoke else n_seeds)],
                 [seed + i for i in range(1 if smoke else n_baseline_seeds)],
                 list(lr_candidates[:2] if smoke else lr_candidates), 50 if smoke else 1000)


class Runner:
    """The chapter's recipe and its runs: :meth:`config` of ``(method, seed, lr)``,
    :meth:`compute` trains the missing ones ``workers`` at a time, :meth:`run` loads one (or
    trains it, in SMOKE one by one in a scratch store); :attr:`trained` holds every run
    loaded, by config hash, in order."""

    def __init__(self, dataset: str, scale: Mapping[str, Any], meta_val_size: int,
                 weight_decay: float, grad_clip: float, batch_size: int, workers: int = 1, *,
                 use_store: bool, smoke: bool, device: Any = "cpu",
                 label: str = "ch05_meta") -> None:
        self.dataset, self.scale = dataset, dict(scale)
        self.meta = {"meta_val_size": meta_val_size, "inner_reduction": "mean"}
        self.weight_decay, self.grad_clip, self.batch_size = weight_decay, grad_clip, batch_size
        self.workers, self.use_store, self.smoke = workers, use_store, smoke
        self.device, self.label = device, label
        self.trained: dict[str, StoredRun] = {}

    def config(self, name: str, seed: int, lr: float) -> dict[str, Any]:
        """The config of method ``name`` with ``seed`` at the summed-loss rate ``lr``."""
        base = default_config(dataset=self.dataset, **self.scale, seed=seed, momentum=0.9,
                              augment=False, schedule="step", milestones=MILESTONES,
                              **summed_loss_recipe(lr, self.weight_decay, self.grad_clip,
                                                   self.batch_size))
        return method_configs(base, [name], meta=self.meta)[name]

    def run(self, name: str, seed: int, lr: float) -> StoredRun:
        """The stored run (trained now if missing), each config once."""
        cfg = self.config(name, seed, lr)
        key = config_hash(cfg)
        if key not in self.trained:
            self.trained[key] = chapter_runs([cfg], label=self.label, use_store=self.use_store,
                                             smoke=self.smoke, device=self.device)[0]
        return self.trained[key]

    def compute(self, triples: Iterable[tuple[str, int, float]]) -> None:
        """Train the missing runs of ``(name, seed, lr)`` triples, ``workers`` at a time, in
        order (nothing in SMOKE or without the store: :meth:`run` trains those)."""
        if self.use_store and not self.smoke:
            compute_runs([self.config(*t) for t in triples], label=self.label,
                         workers=self.workers, device=self.device)


def method_runs(runner: Runner, seeds: Sequence[int], baseline_seeds: Sequence[int],
                lr: float) -> dict[str, dict[int, StoredRun]]:
    """``runs[method][seed]``: :data:`CORE` with every seed (seed by seed), then
    :data:`BASELINES` with ``baseline_seeds``, trained first where missing."""
    order = ([(m, s) for s in seeds for m in CORE]
             + [(m, s) for s in baseline_seeds for m in BASELINES])
    runner.compute([(name, seed, lr) for name, seed in order])
    runs: dict[str, dict[int, StoredRun]] = {}
    for name, seed in order:
        runs.setdefault(name, {})[seed] = runner.run(name, seed, lr)
    return runs


# --- the learning rate and the runs' cost --------------------------------------------------

PERCENT = ["val_acc", "mean_conf", "val_ece", "ece_low", "ece_high"]


def pilot_view(pilot_table: pd.DataFrame) -> pd.DataFrame:
    """The rate pilot's table with its rates of :data:`PERCENT` in percent, two decimals."""
    return pilot_table.assign(**{c: 100 * pilot_table[c] for c in PERCENT}).round(2)


def pilot_glue(pilot_table: pd.DataFrame, lr: float, pilot: StoredRun, min_val_ece: float,
               batch_size: int) -> dict[str, Any]:
    """The rate the rule chose, its batch-mean rate, its run's validation ECE with its
    interval and accuracy (%), how many candidates passed, and its seconds per epoch."""
    row = pilot_table.loc[lr]
    return {"ch05_min_val_ece": 100 * min_val_ece, "ch05_lr": lr, "ch05_lr_mean": lr * batch_size,
            "ch05_pilot_ece": 100 * row["val_ece"], "ch05_pilot_ece_low": 100 * row["ece_low"],
            "ch05_pilot_ece_high": 100 * row["ece_high"], "ch05_pilot_acc": 100 * row["val_acc"],
            "ch05_pilot_eligible": int(pilot_table["eligible"].sum()),
            "ch05_n_candidates": len(pilot_table),
            "ch05_epoch_seconds": float(np.mean(pilot.history["seconds"]))}


def cost_glue(every_run: Sequence[StoredRun], cores: int = 2) -> dict[str, Any]:
    """The runs' count, stored wall hours and devices, and core hours (wall time times the
    threads each used; machine hours on ``cores`` cores)."""
    core_hours = sum(r.provenance["seconds"] * (r.provenance.get("cpu_threads") or 1)
                     for r in every_run) / 3600
    return {"ch05_n_runs": len(every_run),
            "ch05_stored_hours": sum(r.provenance["seconds"] for r in every_run) / 3600,
            "ch05_stored_device": ", ".join(sorted({r.provenance["device"] for r in every_run})),
            "ch05_core_hours": core_hours, "ch05_machine_hours": core_hours / cores}


# --- the methods' test probabilities and tables --------------------------------------------

def rows() -> list[str]:
    """The rows of the tables: CE, CE after temperature scaling, then every other method."""
    return ["CE", "CE+TS", *[m for m in METHODS if m != "CE"]]


def method_probs(runs: Mapping[str, Mapping[int, StoredRun]]
                 ) -> tuple[dict[str, dict[int, torch.Tensor]], dict[int, float]]:
    """Test probabilities ``probs[row][seed]`` of every row of :func:`rows` (CE+TS: CE's test
    logits at the temperature fitted on its validation logits) and those temperatures."""
    probs: dict[str, dict[int, Any]] = {
        name: {s: torch.softmax(r.test_logits, dim=1) for s, r in runs[name].items()}
        for name in METHODS}
    probs["CE+TS"], temperatures = {}, {}
    for s, r in runs["CE"].items():
        probs["CE+TS"][s], temperatures[s] = temperature_scaled(*_validation(r), r.test_logits)
    return {name: probs[name] for name in rows()}, temperatures


def _validation(run: StoredRun) -> tuple[torch.Tensor, torch.Tensor]:
    if run.val_logits is None or run.val_labels is None:
        raise ValueError(f"run {run.path.name} has no validation logits")
    return run.val_logits, run.val_labels


def paired(table: pd.DataFrame, a: str, b: str, column: str) -> SeedInterval:
    """95% t-interval of the mean over the seeds both share of ``a - b`` in ``column`` of a
    ``(method, seed)`` table: within a seed both rows share the data split, the
    initialization and the test set."""
    for name, value in (("a", a), ("b", b)):
        if value not in table.index.get_level_values(0):
            raise ValueError(f"{name} must be a method of the table, got {value!r}")
    common = sorted(set(table.loc[a].index) & set(table.loc[b].index))
    return metrics.seed_interval(table.loc[a, column].loc[common].to_numpy()
                                 - table.loc[b, column].loc[common].to_numpy())


def _worst_bin(p: torch.Tensor, labels: torch.Tensor, n_bins: int) -> int:
    bins = metrics.reliability_bins(p, labels, n_bins=n_bins)
    gaps = torch.as_tensor(bins.accuracy - bins.confidence).abs().nan_to_num(-1.0)
    return int(torch.as_tensor(bins.counts)[int(gaps.argmax())])


def mce_table(probs: Mapping[str, Mapping[int, torch.Tensor]], labels: torch.Tensor, seed: int,
              n_bins: int = 15, n_boot: int = 1000) -> pd.DataFrame:
    """Per row, seed ``seed``'s MCE (%) with its percentile bootstrap interval over the test
    images (seeded by ``seed``) and the images in the bin that sets it (the largest gap)."""
    out = {}
    for name, by_seed in probs.items():
        p = by_seed[seed]
        boot = metrics.bootstrap_interval("mce", p, labels, n_bins=n_bins, n_boot=n_boot,
                                          seed=seed).scaled(100)
        out[name] = {"MCE": boot.estimate, "low": boot.low, "high": boot.high,
                     "images in its bin": _worst_bin(p, labels, n_bins)}
    return pd.DataFrame(out).T


def ece_kinds(probs: Mapping[str, Mapping[int, torch.Tensor]], labels: torch.Tensor, seed: int,
              n_bins: int = 15) -> pd.DataFrame:
    """Per row, seed ``seed``'s ECE, the paper's ACE (top-label ECE on equal-mass bins) and
    Nixon et al.'s ACE (classwise, adaptive bins), in percent."""
    return pd.DataFrame({
        name: {"ECE": 100 * float(metrics.ece(p[seed], labels, n_bins=n_bins)),
               "ACE, top-label equal-mass (paper)": 100 * float(
                   metrics.ece(p[seed], labels, n_bins=n_bins, binning="quantile")),
               "ACE, Nixon et al. (classwise)": 100 * float(
                   metrics.ace(p[seed], labels, n_bins=n_bins))}
        for name, p in probs.items()}).T


COMPARED = ["error", "nll", "ece", "mce", "mce_em", "adaptive_ece", "classwise_ece"]


def versus_table(per_seed: pd.DataFrame, multi: Iterable[str], method: str = SECE
                 ) -> pd.DataFrame:
    """``method`` minus each other row of ``multi`` (rows with a seed spread), paired by
    seed, as "estimate [low, high]" for every metric of :data:`COMPARED`."""
    return pd.DataFrame({
        name: {PRETTY[c]: format(paired(per_seed, method, name, c), ".2f") for c in COMPARED}
        for name in multi if name != method}).T.rename_axis("FLγ-SECE minus")


def focal_rule(runs: Mapping[str, Mapping[int, StoredRun]], n_bins: int = 15
               ) -> tuple[str, float]:
    """The fixed gamma a practitioner would pick: the focal run with the lowest validation
    ECE, mean over its seeds; returns the method and that mean ECE (a fraction)."""
    def val_ece_of(run: StoredRun) -> float:
        logits, labels = _validation(run)
        return float(metrics.ece(torch.softmax(logits, dim=1), labels, n_bins=n_bins))

    val_ece = {m: float(np.mean([val_ece_of(r) for r in by_seed.values()]))
               for m, by_seed in runs.items() if m.startswith("Focal")}
    if not val_ece:
        raise ValueError("runs must hold at least one focal method")
    best = min(val_ece, key=val_ece.__getitem__)
    return best, val_ece[best]


def ece_glue(per_seed: pd.DataFrame, runs: Mapping[str, Mapping[int, StoredRun]],
             n_bins: int = 15) -> dict[str, Any]:
    """The ECE numbers of the prose: FLγ-SECE minus CE paired by seed and unpaired (Welch)
    with both widths, the mean ECE of FLγ-SECE, CE and CE+TS, their ratio and cut, the best
    row, and the focal rule's gamma with its validation and test ECE."""
    mean = per_seed.groupby(level=0, sort=False).mean()
    ece_vs_ce = paired(per_seed, SECE, "CE", "ece")
    welch = metrics.seed_interval(per_seed.loc[SECE, "ece"], per_seed.loc["CE", "ece"])
    ratio = mean.loc[SECE, "ece"] / mean.loc["CE", "ece"]
    best = mean["ece"].idxmin()
    best_focal, focal_val_ece = focal_rule(runs, n_bins)
    return {"ch05_welch_width": welch.high - welch.low,
            "ch05_paired_width": ece_vs_ce.high - ece_vs_ce.low,
            "ch05_ece_sece": mean.loc[SECE, "ece"], "ch05_ece_ce": mean.loc["CE", "ece"],
            "ch05_ece_ce_ts": mean.loc["CE+TS", "ece"], "ch05_ece_diff": ece_vs_ce.estimate,
            "ch05_ece_diff_low": ece_vs_ce.low, "ch05_ece_diff_high": ece_vs_ce.high,
            "ch05_ece_ratio": ratio, "ch05_best_method": best,
            "ch05_best_ece": mean.loc[best, "ece"], "ch05_ece_cut": 100 * (1 - ratio),
            "ch05_best_focal": best_focal, "ch05_best_focal_val_ece": 100 * focal_val_ece,
            "ch05_best_focal_ece": mean.loc[best_focal, "ece"]}


def claim_interval_glue(claim_rows: pd.DataFrame) -> dict[str, float]:
    """The intervals the prose quotes beside two verdicts, the claims table's own: the
    learned against the fixed gamma, and FLγ-SECE against CE+TS (ECE)."""
    out = {}
    for key, claim_id in (("focal", "learned-gamma-vs-fixed"), ("ts", "flsece-vs-cets-ece")):
        for column, suffix in (("estimate", ""), ("low", "_low"), ("high", "_high")):
            out[f"ch05_ece_vs_{key}{suffix}"] = float(claim_rows.loc[claim_id, column])
    return out


# --- the paper's Table 1 -------------------------------------------------------------------

PAPER_COLUMNS = ["error", "nll", "ece", "mce", "adaptive_ece", "classwise_ece"]
#: Published values, typed from the paper's Table 1 (as summarized).
_PAPER = [
    ["CIFAR-10", "CE", 4.812, 0.335, 4.056, 33.932, 4.022, 0.848],
    ["CIFAR-10", "CE+TS", 4.812, 0.211, 3.083, 26.695, 3.046, 0.656],
    ["CIFAR-10", "Focal", 4.874, 0.207, 3.193, 28.034, 3.174, 0.690],
    ["CIFAR-10", "CE-DECE", 5.194, 0.301, 4.106, 41.346, 4.088, 0.868],
    ["CIFAR-10", "FLgamma-DECE", 5.434, 0.193, 2.257, 56.633, 2.396, 0.557],
    ["CIFAR-10", "FLgamma-SECE", 5.428, 0.193, 2.138, 22.725, 2.357, 0.556],
    ["CIFAR-100", "CE", 22.570, 0.997, 8.380, 23.250, 8.347, 0.233],
    ["CIFAR-100", "CE+TS", 22.570, 0.959, 5.388, 13.454, 5.360, 0.208],
    ["CIFAR-100", "Focal", 22.498, 0.900, 5.044, 12.454, 5.015, 0.203],
    ["CIFAR-100", "CE-DECE", 23.406, 1.148, 7.309, 22.565, 7.253, 0.241],
    ["CIFAR-100", "FLgamma-DECE", 23.712, 0.888, 1.879, 8.271, 1.838, 0.195],
    ["CIFAR-100", "FLgamma-SECE", 23.686, 0.877, 1.940, 7.480, 1.939, 0.192],
    ["Tiny-ImageNet", "CE", 40.110, 1.838, 8.059, 15.73, 8.006, 0.154],
    ["Tiny-ImageNet", "Focal", 39.415, 1.896, 7.600, 13.771, 7.469, 0.152],
    ["Tiny-ImageNet", "CE-DECE", 41.350, 2.228, 10.694, 20.888, 10.553, 0.160],
    ["Tiny-ImageNet", "FLgamma-DECE", 40.625, 1.826, 5.944, 11.542, 6.077, 0.155],
    ["Tiny-ImageNet", "FLgamma-SECE", 40.850, 1.829, 5.794, 11.477, 5.848, 0.156]]
OURS = ["CE", "CE+TS", "Focal (gamma=0.5)", "Focal (gamma=1)", "Focal (gamma=2)",
        "Focal (gamma=3)", "CE-DECE", "FLgamma-DECE", "FLgamma-SECE"]


def paper_table() -> pd.DataFrame:
    """The paper's Table 1 (error, NLL, ECE, MCE, ACE and classwise ECE), by dataset and
    method."""
    return pd.DataFrame(_PAPER, columns=["dataset", "method", *PAPER_COLUMNS]).set_index(
        ["dataset", "method"])


def beside_paper(per_seed: pd.DataFrame) -> pd.DataFrame:
    """The paper's Table 1 with our means over seeds of its methods beneath it."""
    mean = per_seed.groupby(level=0, sort=False).mean()
    ours = mean.loc[OURS, PAPER_COLUMNS]
    ours.index = pd.MultiIndex.from_product([["Fashion-MNIST (ours, mean)"], ours.index])
    return pd.concat([paper_table(), ours])


def mce_glue(per_seed: pd.DataFrame) -> dict[str, Any]:
    """The MCE numbers of the prose: the paper's MCE gain of FLγ-SECE over CE-DECE on each
    dataset, in points and relative to CE-DECE's (%); ours, paired by seed, with equal-width
    and equal-mass bins; and the paper's largest gap between its ACE and ECE relative to
    the ECE (%)."""
    paper = paper_table()
    mean = per_seed.groupby(level=0, sort=False).mean()
    out: dict[str, Any] = {}
    for ds, key in (("CIFAR-10", "c10"), ("CIFAR-100", "c100"), ("Tiny-ImageNet", "tiny")):
        gain = paper.loc[(ds, "CE-DECE"), "mce"] - paper.loc[(ds, SECE), "mce"]
        out[f"ch05_paper_mce_gain_{key}"] = gain
        out[f"ch05_paper_mce_rel_{key}"] = 100 * gain / paper.loc[(ds, "CE-DECE"), "mce"]
    mce_vs_dece = paired(per_seed, SECE, "CE-DECE", "mce")
    mce_em_vs_dece = paired(per_seed, SECE, "CE-DECE", "mce_em")
    out |= {"ch05_mce_sece": mean.loc[SECE, "mce"], "ch05_mce_dece": mean.loc["CE-DECE", "mce"],
            "ch05_mce_diff": mce_vs_dece.estimate, "ch05_mce_diff_low": mce_vs_dece.low,
            "ch05_mce_diff_high": mce_vs_dece.high, "ch05_mce_em_diff_low": mce_em_vs_dece.low,
            "ch05_mce_em_diff_high": mce_em_vs_dece.high,
            "ch05_paper_ace_gap": float(100 * ((paper["adaptive_ece"] - paper["ece"]).abs()
                                               / paper["ece"]).max())}
    return out


# --- estimators and their bias -------------------------------------------------------------

def estimator_table(probs: Mapping[str, torch.Tensor], labels: torch.Tensor) -> pd.DataFrame:
    """The calibration-error estimators of the chapter (%) on each network's probabilities:
    ECE at 15 and 100 bins and 15 equal-mass bins, DECE in Bohdal et al.'s form, SECE at
    bandwidth 0.05."""
    def estimates(p: torch.Tensor) -> dict[str, float]:
        return {
            "ECE, 15 bins": 100 * float(metrics.ece(p, labels, n_bins=15)),
            "ECE, 100 bins": 100 * float(metrics.ece(p, labels, n_bins=100)),
            "ECE, 15 equal-mass bins": 100 * float(metrics.ece(p, labels, n_bins=15,
                                                               binning="quantile")),
            "DECE (Bohdal et al.), 15 bins": 100 * float(
                losses.dece(p, labels, form="ranked", **_RANKED)),
            "SECE, h = 0.05": 100 * float(metrics.sece(p, labels, bandwidth=0.05)),
        }
    return pd.DataFrame({name: estimates(p) for name, p in probs.items()})


BIAS_ESTIMATORS = {
    "ECE, 15 bins": lambda p, y: metrics.ece(p, y, n_bins=15),
    "DECE (Bohdal et al.)": lambda p, y: losses.dece(p, y, form="ranked", **_RANKED),
    "SECE, h = 0.05": lambda p, y: metrics.sece(p, y, bandwidth=0.05),
}


def bias_intervals(sizes_: Sequence[int], draws: int, seed: int
                   ) -> dict[tuple[str, int], SeedInterval]:
    r"""On a perfectly calibrated synthetic model (true error 0), the bias of each estimator
    of :data:`BIAS_ESTIMATORS` at each sample size, in points: the t-interval over ``draws``
    draws of :math:`100\,(\hat e - 0)`."""
    study = estimator_study(SyntheticModel("calibrated"), list(sizes_), BIAS_ESTIMATORS,
                            repeats=draws, seed=seed)
    return {(name, n): metrics.seed_interval(100 * part["error"])
            for (name, n), part in study.groupby(["estimator", "n"])}


def bias_glue(bias: Mapping[tuple[str, int], SeedInterval], batch: int, test: int,
              draws: int) -> dict[str, Any]:
    """Each estimator's bias with its interval at the batch and the test size, the draws,
    and SECE's bias over the binned ECE's at the test size."""
    out: dict[str, Any] = {"ch05_n_batch": batch, "ch05_bias_draws": draws}
    for n, key in ((batch, "batch"), (test, "test")):
        for name, short in zip(BIAS_ESTIMATORS, ("ece", "dece", "sece"), strict=True):
            out[f"ch05_bias_{short}_{key}"] = bias[(name, n)].estimate
            out[f"ch05_bias_{short}_{key}_low"] = bias[(name, n)].low
            out[f"ch05_bias_{short}_{key}_high"] = bias[(name, n)].high
    out["ch05_bias_sece_over_ece_test"] = (bias[("SECE, h = 0.05", test)].estimate
                                           / bias[("ECE, 15 bins", test)].estimate)
    return out


# --- ECE and MCE against the number of bins ------------------------------------------------

def bins_curves(probs: Mapping[str, Mapping[int, torch.Tensor]], labels: torch.Tensor,
                bin_counts: Sequence[int]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """ECE and MCE (%) of every row and seed at every bin count (long table), and their
    means over seeds by (method, bin count)."""
    frame = pd.concat([ece_vs_bins({name: p}, labels, list(bin_counts)).assign(seed=s)
                       for name, by_seed in probs.items() for s, p in by_seed.items()])
    return frame, frame.groupby(["method", "n_bins"], sort=False)[["ece", "mce"]].mean()


def bins_figure(curves: pd.DataFrame, rows_: Sequence[str]) -> Any:
    """ECE (left) and MCE (right) against the number of bins, one line per row."""
    import matplotlib.pyplot as plt

    from calnotes import plots

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for ax, column in zip(axes, ["ece", "mce"], strict=True):
        wide = curves[column].unstack("method")[list(rows_)]
        plots.metric_curves(wide.index, {m: wide[m] for m in wide.columns}, ax=ax, logx=True,
                            xlabel="number of bins", ylabel=f"{column.upper()} (%)")
    axes[1].get_legend().remove()
    axes[0].legend(fontsize=6.5, ncol=2)
    fig.tight_layout()
    return fig


def bins_glue(curves: pd.DataFrame, bin_counts: Sequence[int], n_rows: int) -> dict[str, Any]:
    """The bin range, and FLγ-SECE's ECE at the most bins with its rank and the best row."""
    lo, hi = bin_counts[0], bin_counts[-1]
    at_hi = curves.xs(hi, level="n_bins")
    return {"ch05_n_bin_counts": len(bin_counts), "ch05_lo_bins": lo, "ch05_hi_bins": hi,
            "ch05_hi_ece_sece": float(at_hi.loc[SECE, "ece"]),
            "ch05_hi_ece_best": at_hi["ece"].idxmin(),
            "ch05_hi_ece_best_value": float(at_hi["ece"].min()),
            "ch05_hi_ece_rank": int(at_hi["ece"].rank(method="min")[SECE]),
            "ch05_n_rows": n_rows}


# --- cost and claims -----------------------------------------------------------------------

def outer_cost_table(batch: int, rounds: int, calls: int,
                     classes: Sequence[int] = (10, 100, 200)) -> pd.DataFrame:
    """DECE's time over SECE's per outer step (geometric mean over ``rounds``), DECE in the
    reference's form and in the library's, by number of classes."""
    from calnotes.book.evidence import ch05

    cost = pd.DataFrame({
        form: {k: float(np.exp(np.mean(ch05.outer_cost(k, batch, rounds, calls, form=form))))
               for k in classes}
        for form in ("reference", "library")}).rename_axis("classes")
    cost.columns = ["reference DECE / SECE", "library DECE / SECE"]
    return cost


def claims_glue(claims: pd.DataFrame, verdicts: Mapping[str, str],
                runs: Mapping[int, StoredRun]) -> tuple[dict[str, Any], pd.DataFrame]:
    """The verdict of every claim (``verdicts``), the key claims whose detectable effect
    exceeds the paper's ("underpowered") and those powered enough but still inconclusive,
    and the mean minutes of a FLγ-SECE run (``runs``); also returns the underpowered rows."""
    out: dict[str, Any] = {f"ch05_v_{cid}": word for cid, word in verdicts.items()}
    key = claims[claims["key"].astype(bool) & claims["detectable"].notna()
                 & claims["paper"].notna()]
    underpowered = key[key["detectable"] > key["paper"].abs()]
    powered_open = key[(key["detectable"] <= key["paper"].abs())
                       & (key["verdict"] == stats.INCONCLUSIVE)]
    out["ch05_underpowered"] = ", ".join(underpowered["id"]) or "none"
    out["ch05_powered_open"] = ", ".join(powered_open["id"]) or "none"
    out["ch05_meta_minutes"] = np.mean([r.provenance["seconds"] for r in runs.values()]) / 60
    return out, underpowered
