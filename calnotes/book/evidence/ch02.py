"""Chapter 2's measures and studies: NLL overfitting read from a run's history, and the
old-against-modern comparison with weight decay chosen by a rule declared in advance."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from calnotes import metrics
from calnotes.book.evidence.ch02_runs import SEEDS, WEIGHT_DECAY_GRID, ch01_config, sweep_config
from calnotes.runs.claims import register_measure, register_study
from calnotes.runs.experiment import default_config

__all__ = ["WEIGHT_DECAY_GRID", "ch01_config", "exercise_run", "history_change",
           "reference_epoch", "seed_trends", "shrink", "sweep_config", "ece_by_epoch",
           "run_statistics", "tuned_choice", "tuned_pair"]
HISTORY_COLUMNS = ("val_loss", "val_error", "val_ece", "val_acc")
TUNED_STATISTICS = ("ece", "error")


def reference_epoch(epochs: int) -> int:
    """The epoch NLL overfitting is measured from, fixed in advance: ``round(E / 3)``
    (at least 1): epoch 10 of 30, epoch 7 of 20."""
    return max(1, int(round(epochs / 3)))


@register_measure("ch02_history_change")
def history_change(run: Any, index: Any = None, column: str = "val_loss") -> float:
    """A validation metric at the last epoch minus its value at :func:`reference_epoch`
    (``val_error`` is ``1 - val_acc``). Per-epoch values are aggregates, so ``index``
    (test-set resampling) is not supported."""
    if index is not None:
        raise ValueError("ch02_history_change reads per-epoch aggregates: index must be None")
    if column not in HISTORY_COLUMNS:
        raise ValueError(f"column must be one of {HISTORY_COLUMNS}, got {column!r}")
    h = run.history.to_frame().set_index("epoch")
    values = 1.0 - h["val_acc"] if column == "val_error" else h[column]
    last = int(h.index.max())
    return float(values.loc[last] - values.loc[reference_epoch(last)])


def _load(config: dict[str, Any]) -> Any:
    from calnotes.runs.store import RunStore

    return RunStore().load(config)


def _final_val_error(run: Any) -> float:
    return float(1.0 - run.history.to_frame()["val_acc"].iloc[-1])


def tuned_choice(seeds: tuple[int, ...] = SEEDS,
                 grid: tuple[float, ...] = WEIGHT_DECAY_GRID) -> pd.DataFrame:
    """The declared rule: per network, mean final validation error over ``seeds`` for each
    weight decay of ``grid``, and ``chosen`` (the lowest; ties to the smaller weight decay).
    One row per (network, weight decay)."""
    rows = []
    for model in ("lenet5", "resnet8"):
        for wd in grid:
            errors = [_final_val_error(_load(sweep_config(model, s, wd))) for s in seeds]
            rows.append({"network": model, "weight_decay": wd,
                         "val_error": float(np.mean(errors))})
    table = pd.DataFrame(rows)
    table["chosen"] = False
    for _, part in table.groupby("network"):
        best = part.sort_values(["val_error", "weight_decay"]).index[0]  # ties: smaller wd
        table.loc[best, "chosen"] = True
    return table


def _test_statistic(run: Any, statistic: str) -> float:
    probs = torch.softmax(run.test_logits.double(), dim=1)
    if statistic == "ece":
        return float(metrics.ece(probs, run.test_labels, n_bins=15))
    return float((probs.argmax(dim=1) != run.test_labels).double().mean())


@register_study("ch02_tuned_pair")
def tuned_pair(statistic: str = "ece", seed: int = 0) -> np.ndarray:
    """Per seed of ``SEEDS``: ResNet-8 minus LeNet-5 on the test ``statistic`` (15-bin ECE or
    error), each at the weight decay :func:`tuned_choice` picks on validation error. Both
    networks of a seed share its data split, so the values are paired differences.
    ``seed`` is unused (the runs are stored); it is accepted for the study interface."""
    if statistic not in TUNED_STATISTICS:
        raise ValueError(f"statistic must be one of {TUNED_STATISTICS}, got {statistic!r}")
    choice = tuned_choice().query("chosen").set_index("network")["weight_decay"]
    return np.array([
        _test_statistic(_load(sweep_config("resnet8", s, float(choice["resnet8"]))), statistic)
        - _test_statistic(_load(sweep_config("lenet5", s, float(choice["lenet5"]))), statistic)
        for s in SEEDS])


# --- The exercises' solutions --------------------------------------------------------------

def shrink(config: Mapping[str, Any], smoke: bool) -> dict[str, Any]:
    """``config`` as it is, or in SMOKE mode on 200 training images for 1 epoch."""
    out = dict(config)
    if smoke:
        out.update(epochs=1, train_subset=200, val_size=200, test_subset=500)
    return out


def exercise_run(config: Mapping[str, Any], root: str | os.PathLike, *, use_store: bool,
                 smoke: bool, device: str | torch.device = "auto") -> Any:
    """A run an exercise needs: loaded from ``results/`` when it is stored there (and
    ``use_store`` and not ``smoke``), otherwise trained into the scratch store under
    ``root``, never into ``results/``."""
    from calnotes.runs.store import RunStore, load_or_run

    if use_store and not smoke and RunStore().exists(default_config(**config)):
        return RunStore().load(config)
    root = Path(root)
    return load_or_run(config, label="ch02_exercises", store=RunStore(root / "results"),
                       checkpoint_root=root / "checkpoints", device=device, progress=False)


def run_statistics(runs: Mapping[Any, Any]) -> pd.DataFrame:
    """Test ECE and error (15 bins, %) of named runs, one row per name (a tuple name makes
    a MultiIndex)."""
    rows = {name: {"test ECE": 100 * _test_statistic(run, "ece"),
                   "test error": 100 * _test_statistic(run, "error")}
            for name, run in runs.items()}
    frame = pd.DataFrame(rows).T
    if all(isinstance(name, tuple) for name in rows):
        frame.index = pd.MultiIndex.from_tuples(list(rows))
    return frame


def seed_trends(table: pd.DataFrame, statistic: str = "test ECE") -> pd.DataFrame:
    """From :func:`run_statistics` of runs named ``(model, weight decay, seed)``: per model
    and seed, ``statistic`` at the largest weight decay minus at the smallest, and per model
    the number of seeds where it falls."""
    values = table[statistic].unstack(1)
    change = values[values.columns.max()] - values[values.columns.min()]
    by_model = change.groupby(level=0)
    return pd.DataFrame({"mean change": by_model.mean(), "smallest": by_model.min(),
                         "largest": by_model.max(),
                         "seeds where it falls": by_model.apply(lambda c: int((c < 0).sum())),
                         "seeds": by_model.size()})


def ece_by_epoch(config: Mapping[str, Any], device: str | torch.device = "auto",
                      ) -> pd.DataFrame:
    """Train ``config`` (not stored) and record, after every epoch, the validation NLL and
    ECE and the *test* ECE (``epoch_callback`` of :func:`calnotes.runs.experiment.train_run`)."""
    from calnotes import data
    from calnotes.runs import experiment

    cfg = default_config(**config)
    dev = experiment.select_device(device)
    splits = experiment.load_splits(cfg)
    test_loader = data.make_loaders(splits, batch_size=cfg["batch_size"], device=dev,
                                    seed=cfg["seed"])[2]
    rows: list[dict[str, float]] = []

    def record(epoch: int, trainer: Any, values: dict) -> None:
        rows.append({"epoch": epoch, "val. NLL": values["val_loss"],
                     "val. ECE (%)": 100 * values["val_ece"],
                     "test ECE (%)": 100 * trainer.validate(test_loader)["val_ece"]})

    experiment.train_run(cfg, device=dev, progress=False, epoch_callback=record)
    return pd.DataFrame(rows).set_index("epoch")
