"""Chapter 6's measures and studies: calibration of stored runs under dataset shift.

``shift_ece`` is :func:`calnotes.runs.shift.shift_metric` (a run's ECE, Brier score, NLL,
error or confidence on shifted test images, optionally after temperature scaling or as the
first member of an ensemble, minus another level or another method's paired run);
``shift_rank_transfer`` returns, per seed, the rank correlation across the chapter's
methods between the unshifted ECE and the ECE under shift.
``shift_rank_transfer_trained`` the same over the methods that trained
(:func:`trained_methods`).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from calnotes.runs import shift as shifts
from calnotes.runs.claims import register_measure, register_study
from calnotes.runs.experiment import default_config
from calnotes.runs.store import RunStore, StoredRun
from calnotes.runs.verdicts import CHANCE_MARGIN, did_not_train

__all__ = ["BASE", "CLAIMS_GLUED", "claims_glue", "ensemble_growth", "exercise_runs",
           "level_table", "shift_ece",
           "shift_rank_transfer", "shift_rank_transfer_trained",
           "shifted_temperature_table", "trained_methods"]

#: The recipe of the chapter's runs at its own parameters (LeNet-5 on 20,000 MNIST images,
#: 3 epochs, the library's default SGD recipe); the methods change only their keys of it.
BASE: dict[str, Any] = default_config(dataset="mnist", model="lenet5", epochs=3,
                                      train_subset=20000)


@register_measure("shift_ece")
def shift_ece(run: StoredRun, index: Any = None, **options: Any) -> float:
    """:func:`calnotes.runs.shift.shift_metric` of ``run`` (``index`` is not supported: the
    claims of this chapter are answered over seeds)."""
    if index is not None:
        raise ValueError("shift_ece is a per-seed measure: it takes no index")
    return shifts.shift_metric(run, **options)


@register_study("shift_rank_transfer")
def shift_rank_transfer(seeds: Sequence[int] = (0, 1, 2), metric: str = "ece",
                        shift: str = "rotate", level: float = 60,
                        store: RunStore | None = None, **options: Any) -> np.ndarray:
    """Per seed, :func:`calnotes.runs.shift.rank_transfer` over every method of
    ``calnotes.runs.shift.SHIFT_METHODS``, on the stored runs of the chapter's
    :data:`BASE` recipe."""
    runs = RunStore() if store is None else store
    values = []
    for seed in seeds:
        by_method = {name: runs.load(shifts.method_config(name, BASE, seed))
                     for name in shifts.SHIFT_METHODS}
        values.append(shifts.rank_transfer(by_method, metric, shift, level, **options))
    return np.asarray(values, dtype=float)


def trained_methods(seeds: Sequence[int] = (0, 1, 2), store: RunStore | None = None) -> list[str]:
    """The methods of ``calnotes.runs.shift.SHIFT_METHODS`` whose stored runs of every seed
    of ``seeds`` trained (:func:`calnotes.runs.verdicts.did_not_train` on their test logits:
    accuracy clear of chance, finite logits), in the table's order."""
    runs = RunStore() if store is None else store
    out = []
    for name in shifts.SHIFT_METHODS:
        loaded = [runs.load(shifts.method_config(name, BASE, seed)) for seed in seeds]
        if all(did_not_train(r.test_logits, r.test_labels) is None for r in loaded):
            out.append(name)
    return out


@register_study("shift_rank_transfer_trained")
def shift_rank_transfer_trained(seeds: Sequence[int] = (0, 1, 2), metric: str = "ece",
                                shift: str = "rotate", level: float = 60,
                                store: RunStore | None = None, **options: Any) -> np.ndarray:
    """``shift_rank_transfer`` over the methods that trained (:func:`trained_methods`): a
    method that did not train leaves the ranking."""
    runs = RunStore() if store is None else store
    names = trained_methods(seeds, runs)
    values = []
    for seed in seeds:
        by_method = {name: runs.load(shifts.method_config(name, BASE, seed)) for name in names}
        values.append(shifts.rank_transfer(by_method, metric, shift, level, **options))
    return np.asarray(values, dtype=float)


# --- The exercises' solutions --------------------------------------------------------------

def exercise_runs(base: dict[str, Any], seed: int, methods: Sequence[str], ensemble_size: int,
                  root: str | os.PathLike, device: str | torch.device = "auto",
                  ) -> dict[str, dict[int, StoredRun]]:
    """The runs of ``methods`` at ``seed`` (and the ensemble's members), trained into a
    scratch store under ``root`` with their checkpoints beside it, so that their logits on
    new shifts are computed from the checkpoints and stored there, never in ``results/``."""
    from calnotes.runs.executor import compute_runs

    store = RunStore(Path(root) / "results")
    configs: list[Any] = shifts.shift_run_configs(base, [seed], list(methods), ensemble_size)
    compute_runs(configs, label="ch06_exercises", store=store,
                 checkpoint_root=Path(root) / "checkpoints", device=device)
    return {name: {seed: store.load(shifts.method_config(name, base, seed))}
            for name in methods}


def level_table(table: pd.DataFrame, metric: str = "ece") -> pd.DataFrame:
    """``metric`` of a ``calnotes.runs.shift.shift_table``, mean over seeds: one row per
    level, one column per method (in the table's order)."""
    means = table.groupby(["level", "method"], sort=False)[metric].mean()
    return means.unstack("method")


def shifted_temperature_table(run: StoredRun, shift: str, fit_level: float,
                              levels: Sequence[float], n_images: int = 1000,
                              n_bins: int = 15, device: str | torch.device = "auto",
                              ) -> pd.DataFrame:
    """ECE (%) of ``run`` on its test images under ``shift`` at ``levels``: raw, after
    temperature scaling fitted on its upright validation images, and after one fitted on
    its validation images shifted by ``fit_level``; the last row holds the temperatures."""
    from calnotes import data
    from calnotes.calibrators import TemperatureScaling
    from calnotes.runs import experiment, ood

    if run.val_labels is None:
        raise ValueError(f"run {run.path.name} has no validation split to fit a temperature")
    val = experiment.load_splits(experiment.default_config(**run.config)).val
    if not torch.equal(val.labels.cpu(), run.val_labels):
        raise RuntimeError(f"the validation split of run {run.path.name} is not its stored one")
    name = f"val {shift}:{fit_level:g}"
    images = {name: data.shift_images(val.images, shift, fit_level)}
    shifted_val = ood.run_ood_logits(run, images, device=device)[name]
    temperatures = {"CE": 1.0, "TS, upright val.": shifts.temperature_of(run),
                    f"TS, val. at {fit_level:g}": float(TemperatureScaling().fit(
                        shifted_val, run.val_labels).temperature_)}
    logits = shifts.run_shift_logits(run, shift, levels, n_images=n_images, device=device)
    labels = run.test_labels[:n_images]
    rows: dict[Any, dict[str, float]] = {
        level: {k: shifts.level_metrics(logits[level].double() / t, labels, n_bins)["ece"]
                for k, t in temperatures.items()} for level in levels}
    rows["temperature"] = temperatures
    return pd.DataFrame(rows).T


def ensemble_growth(run: StoredRun, sizes: Sequence[int], shift: str, level: float,
                    n_images: int = 1000, n_bins: int = 15,
                    device: str | torch.device = "auto") -> pd.DataFrame:
    """Accuracy and ECE (%) of the deep ensemble whose first member is ``run``, for each
    number of members in ``sizes``, on its test images under ``shift`` at ``level``."""
    labels = run.test_labels[:n_images]
    rows = {}
    for size in sizes:
        logits = shifts.ensemble_of(run, size).shift_logits(shift, [level], n_images=n_images,
                                                            device=device)[level]
        m = shifts.level_metrics(logits, labels, n_bins)
        rows[size] = {"accuracy": m["accuracy"], "ece": m["ece"]}
    frame = pd.DataFrame(rows).T
    frame.index.name = "members"
    return frame


#: The claims whose estimate and interval the chapter's prose quotes.
CLAIMS_GLUED = ("degrade-ce", "degrade-ce-roll", "degrade-logitnorm", "ts-iid",
                "ts-vs-ensemble-shift", "ensemble-vs-ce", "ensemble-vs-ls",
                "iid-does-not-transfer")


def claims_glue(claims: pd.DataFrame, seeds: Sequence[int] = (0, 1, 2),
                store: RunStore | None = None) -> dict[str, Any]:
    """The numbers the chapter's claims section quotes, keyed by their glue names, from
    its claims table (``claims``, one row per claim ``id``) and the stored runs at the
    chapter's own parameters: the seeds of the paired claims, LogitNorm's mean test
    accuracy (%) over ``seeds``, each claim of ``CLAIMS_GLUED``'s estimate and interval,
    LogitNorm's degradation as text (or "no interval"), the chance margin of the
    did-not-train rule (%), and the methods the ranking claim keeps (those that trained)."""
    if not isinstance(claims, pd.DataFrame) or "id" not in claims.columns:
        raise ValueError("claims must be a claims table with an 'id' column")
    effects = claims.set_index("id")
    missing = [c for c in (*CLAIMS_GLUED, "degrade-ce") if c not in effects.index]
    if missing:
        raise ValueError(f"claims lacks the claims {missing}")
    store = RunStore() if store is None else store
    logitnorm = [store.load(shifts.method_config("LogitNorm", BASE, s)) for s in seeds]
    out: dict[str, Any] = {
        "ch06_claim_seeds": int(effects.loc["degrade-ce", "n"]),
        "ch06_logitnorm_acc": 100 * (1 - float(np.mean([r.metrics["test_error"]
                                                         for r in logitnorm]))),
    }
    for claim_id in CLAIMS_GLUED:
        key = claim_id.replace("-", "_")
        for column in ("estimate", "low", "high"):
            out[f"ch06_{key}_{column}"] = float(effects.loc[claim_id, column])
    row = effects.loc["degrade-logitnorm"]
    out["ch06_degrade_logitnorm_effect"] = (
        f"{row['estimate']:+.1f} points, [{row['low']:+.1f}, {row['high']:+.1f}]"
        if np.isfinite(row["estimate"]) else "no interval")
    out["ch06_chance_margin"] = 100 * CHANCE_MARGIN
    ranked = trained_methods(tuple(seeds), store)
    out["ch06_n_ranked"] = len(ranked)
    out["ch06_not_ranked"] = (", ".join(m for m in shifts.SHIFT_METHODS if m not in ranked)
                              or "none")
    return out
