"""Sweeps: train a family of runs that differ in one setting and tabulate them.

A chapter that asks "what does depth (or width, batch normalization, weight decay) do to
calibration?" trains one run per value of that setting and compares their test metrics and
training curves. :class:`SweepRunner` does the bookkeeping::

    runner = SweepRunner(label="ch02_diagnosing", use_store=True, smoke=False)
    base = default_config(model="resnet8", epochs=20)
    depth = runner.sweep(base, "model", ["resnet8", "resnet14", "resnet20"],
                         name="depth", labels=[8, 14, 20])
    depth.table()       # one row per run: depth, test error, ECE, NLL, confidence, ...
    depth.histories()   # one row per (run, epoch): train/validation curves

Runs go through the executor (:func:`calnotes.runs.executor.chapter_runs`: stored runs are
loaded, missing ones trained and stored, on the cluster ``$RAY_ADDRESS`` names if any); a
sweep (and :meth:`SweepRunner.runs`) hands all its missing runs to it at once, so they may
train in parallel, and the runner trains each distinct config once: sweeps that share a
run (the base config is usually in every sweep) reuse it, also in SMOKE mode where
nothing is stored.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import torch

from calnotes import metrics
from calnotes.runs.executor import chapter_runs
from calnotes.runs.experiment import default_config
from calnotes.runs.store import config_hash

__all__ = ["Sweep", "SweepRunner", "describe_run", "get_key", "nll_overfitting", "set_key", "vary"]

#: Test metrics copied from a run's ``metrics`` into :func:`describe_run` rows.
TEST_METRICS = ("error", "ece", "mce", "nll", "brier")

RunFn = Callable[..., Any]


def _split_key(key: Any) -> list[str]:
    if not isinstance(key, str) or not key:
        raise TypeError(f"key must be a non-empty str, got {key!r}")
    parts = key.split(".")
    if any(not p for p in parts):
        raise ValueError(f"key {key!r} has an empty part; use e.g. 'model_options.width'")
    return parts


def set_key(config: Mapping[str, Any], key: str, value: Any) -> dict[str, Any]:
    """A deep copy of ``config`` with ``key`` set to ``value``.

    ``key`` is a config key (``"weight_decay"``) or a dotted path into a nested dict
    (``"model_options.width"``); missing nested dicts are created. The top-level key must
    be a config key (see :data:`calnotes.runs.experiment.DEFAULT_CONFIG`), else ``ValueError``.
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    parts = _split_key(key)
    out = default_config(**config)
    if parts[0] not in out:
        raise ValueError(f"unknown config key {parts[0]!r}; valid keys are {sorted(out)}")
    node = out
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ValueError(f"cannot set {key!r}: config[{part!r}] is not a dict")
        node = child
    node[parts[-1]] = copy.deepcopy(value)
    return default_config(**out)


def get_key(config: Mapping[str, Any], key: str, default: Any = None) -> Any:
    """The value at ``key`` (plain or dotted, as in :func:`set_key`), or ``default``."""
    node: Any = config
    for part in _split_key(key):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node


def vary(base: Mapping[str, Any], key: str, values: Sequence[Any]) -> list[dict[str, Any]]:
    """One full config per value: ``base`` with ``key`` set to that value (see :func:`set_key`)."""
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise ValueError(f"values must be a non-empty list, got {values!r}")
    return [set_key(base, key, v) for v in values]


def _final(history: Any, key: str) -> float:
    """Last non-missing value of a history column, NaN if there is none."""
    try:
        column = history[key]
    except KeyError:
        return float("nan")
    values = [v for v in column if v is not None]
    return float(values[-1]) if values else float("nan")


def describe_run(run: Any) -> dict[str, Any]:
    """One flat row describing a run (a :class:`~calnotes.runs.store.StoredRun` or alike).

    Keys: ``model``, ``model_options`` (as ``"k=v, ..."``, empty for the defaults),
    ``weight_decay``, ``schedule``, ``epochs``, ``train_subset``, ``seed``; ``test_<m>`` for
    ``m`` in :data:`TEST_METRICS`; ``test_accuracy`` and ``test_confidence`` (mean top-label
    softmax probability) computed from the test logits, and their difference
    ``overconfidence = test_confidence - test_accuracy``; the last epoch's ``train_loss``,
    ``train_acc`` and ``val_logit_norm``; ``seconds`` (wall time of the run, from its
    provenance) and ``config_hash``.
    """
    config = run.config
    options = config.get("model_options") or {}
    probs = torch.softmax(torch.as_tensor(run.test_logits).float(), dim=1)
    conf, correct = metrics.confidences_and_correct(probs, torch.as_tensor(run.test_labels))
    accuracy, confidence = float(correct.mean()), float(conf.mean())
    row: dict[str, Any] = {
        "model": config.get("model"),
        "model_options": ", ".join(f"{k}={v}" for k, v in sorted(options.items())),
        "weight_decay": config.get("weight_decay"),
        "schedule": config.get("schedule"),
        "epochs": config.get("epochs"),
        "train_subset": config.get("train_subset"),
        "seed": config.get("seed"),
    }
    for name in TEST_METRICS:
        row[f"test_{name}"] = float(run.metrics.get(f"test_{name}", float("nan")))
    row["test_accuracy"] = accuracy
    row["test_confidence"] = confidence
    row["overconfidence"] = confidence - accuracy
    for key in ("train_loss", "train_acc", "val_logit_norm"):
        row[key] = _final(run.history, key)
    provenance = getattr(run, "provenance", None) or {}
    seconds = provenance.get("seconds")
    row["seconds"] = float(seconds) if seconds is not None else float("nan")
    row["config_hash"] = config_hash(default_config(**config))
    return row


def nll_overfitting(history: Any) -> dict[str, float]:
    """Where the validation NLL of a run bottoms out, and what happens after that epoch.

    ``history`` is a :class:`~calnotes.training.History` (or anything with ``to_frame()``)
    with ``epoch``, ``val_loss`` and ``val_acc`` columns (``val_logit_norm`` optional).
    Returns ``best_epoch`` (first epoch of lowest validation NLL), ``best_nll``,
    ``final_nll``, ``nll_rise = final_nll - best_nll`` (>= 0), ``best_error`` and
    ``final_error`` (validation error at those epochs), ``error_change = final_error -
    best_error`` (negative: the error still fell), ``min_error`` and ``min_error_epoch``
    (lowest validation error of the run and the first epoch reaching it), ``best_norm`` and
    ``final_norm`` (mean logit norm, NaN if not recorded) and ``epochs`` (the last epoch).
    """
    frame = history.to_frame() if hasattr(history, "to_frame") else pd.DataFrame(history)
    missing = [c for c in ("epoch", "val_loss", "val_acc") if c not in frame]
    if missing:
        raise ValueError(f"history lacks the column(s) {missing}: was it run with validation?")
    frame = frame.dropna(subset=["val_loss", "val_acc"]).reset_index(drop=True)
    if frame.empty:
        raise ValueError("history has no epoch with a validation NLL")
    best = int(frame["val_loss"].to_numpy().argmin())
    last = len(frame) - 1
    error = 1.0 - frame["val_acc"].astype(float)
    norm = frame["val_logit_norm"].astype(float) if "val_logit_norm" in frame else None
    return {
        "best_epoch": int(frame["epoch"][best]),
        "epochs": int(frame["epoch"][last]),
        "best_nll": float(frame["val_loss"][best]),
        "final_nll": float(frame["val_loss"][last]),
        "nll_rise": float(frame["val_loss"][last] - frame["val_loss"][best]),
        "best_error": float(error[best]),
        "final_error": float(error[last]),
        "error_change": float(error[last] - error[best]),
        "min_error": float(error.min()),
        "min_error_epoch": int(frame["epoch"][int(error.to_numpy().argmin())]),
        "best_norm": float(norm[best]) if norm is not None else float("nan"),
        "final_norm": float(norm[last]) if norm is not None else float("nan"),
    }


@dataclass
class Sweep:
    """Runs that differ in one setting ``key``; ``labels[i]`` names ``runs[i]``.

    ``name`` is the column the labels go in (the last part of ``key`` unless given).
    """

    key: str
    name: str
    labels: list[Any]
    configs: list[dict[str, Any]]
    runs: list[Any] = field(repr=False)

    def __len__(self) -> int:
        return len(self.runs)

    def run_for(self, label: Any) -> Any:
        """The run whose label is ``label`` (``KeyError`` listing the labels if none is)."""
        for lab, run in zip(self.labels, self.runs, strict=True):
            if lab == label:
                return run
        raise KeyError(f"no run labelled {label!r} in the {self.name} sweep; labels: {self.labels}")

    def table(self) -> pd.DataFrame:
        """One row per run (:func:`describe_run`), the label first, in sweep order."""
        rows = []
        for label, run in zip(self.labels, self.runs, strict=True):
            described = describe_run(run)
            described.pop(self.name, None)
            rows.append({self.name: label, **described})
        return pd.DataFrame(rows)

    def histories(self) -> pd.DataFrame:
        """Per-epoch records of every run, stacked: the label column, then the history's
        columns (``epoch``, ``train_loss``, ``val_loss``, ``val_acc``, ...), plus
        ``val_error = 1 - val_acc`` where validation was recorded."""
        frames = []
        for label, run in zip(self.labels, self.runs, strict=True):
            frame = run.history.to_frame()
            if "val_acc" in frame:
                frame["val_error"] = 1.0 - frame["val_acc"]
            frame.insert(0, self.name, [label] * len(frame))
            frames.append(frame)
        return pd.concat(frames, ignore_index=True)


class SweepRunner:
    """Trains (or loads) runs, each distinct config once.

    ``label`` (e.g. the chapter), ``use_store``, ``smoke`` and ``device`` are passed to
    the executor (:func:`calnotes.runs.executor.chapter_runs`, the default: a missing run
    goes to the cluster that ``$RAY_ADDRESS`` names, if any) or to a ``run_fn`` called as
    ``run_fn(config, label=..., use_store=..., smoke=..., device=...)``. Configs are
    completed with their defaults and identified by :func:`calnotes.runs.store.config_hash`.
    """

    def __init__(
        self,
        label: str | None = None,
        *,
        use_store: bool = True,
        smoke: bool = False,
        device: str | torch.device = "auto",
        run_fn: RunFn | None = None,
    ) -> None:
        if label is not None and (not isinstance(label, str) or not label):
            raise TypeError(f"label must be None or a non-empty str, got {label!r}")
        for flag, value in (("use_store", use_store), ("smoke", smoke)):
            if not isinstance(value, bool):
                raise TypeError(f"{flag} must be a bool, got {type(value).__name__}")
        if run_fn is not None and not callable(run_fn):
            raise TypeError(f"run_fn must be callable, got {type(run_fn).__name__}")
        self.label = label
        self.use_store = use_store
        self.smoke = smoke
        self.device = device
        self.run_fn = run_fn
        self._runs: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"SweepRunner({self.label!r}, {len(self._runs)} runs)"

    @property
    def all_runs(self) -> list[Any]:
        """The distinct runs so far, in the order first requested."""
        return list(self._runs.values())

    def run(self, config: Mapping[str, Any]) -> Any:
        """The run of ``config``: trained or loaded on first request, then cached."""
        if not isinstance(config, Mapping):
            raise TypeError(f"config must be a dict, got {type(config).__name__}")
        cfg = default_config(**config)
        digest = config_hash(cfg)
        if digest not in self._runs:
            if self.run_fn is None:
                self._runs[digest] = self._execute([cfg])[0]
            else:
                self._runs[digest] = self.run_fn(cfg, label=self.label,
                                                 use_store=self.use_store, smoke=self.smoke,
                                                 device=self.device)
        return self._runs[digest]

    def _execute(self, configs: list[dict[str, Any]]) -> list[Any]:
        return chapter_runs(configs, label=self.label, use_store=self.use_store,
                            smoke=self.smoke, device=self.device)

    def runs(self, configs: Sequence[Mapping[str, Any]]) -> list[Any]:
        """The runs of ``configs``, in order. Without a ``run_fn`` the missing ones go to
        the executor together (:func:`calnotes.runs.executor.chapter_runs`), so they may
        train in parallel; otherwise each goes through :meth:`run`."""
        if isinstance(configs, (str, bytes, Mapping)) or not isinstance(configs, Sequence):
            raise TypeError(f"configs must be a list of dicts, got {type(configs).__name__}")
        for config in configs:
            if not isinstance(config, Mapping):
                raise TypeError(f"config must be a dict, got {type(config).__name__}")
        cfgs = [default_config(**config) for config in configs]
        new = {config_hash(c): c for c in cfgs if config_hash(c) not in self._runs}
        if self.run_fn is None and new:
            self._runs.update(zip(new, self._execute(list(new.values())), strict=True))
        return [self.run(c) for c in cfgs]

    def sweep(
        self,
        base: Mapping[str, Any],
        key: str,
        values: Sequence[Any],
        *,
        name: str | None = None,
        labels: Sequence[Any] | None = None,
    ) -> Sweep:
        """Run ``base`` once per value of ``key`` (see :func:`vary`) and return the sweep.

        ``labels`` (default ``values``) name the runs in the tables, in a column called
        ``name`` (default: the last part of ``key``).
        """
        configs = vary(base, key, values)
        if labels is None:
            labels = list(values)
        elif isinstance(labels, (str, bytes)) or len(labels) != len(values):
            raise ValueError(f"labels must be a list as long as values ({len(values)})")
        column = _split_key(key)[-1] if name is None else name
        if not isinstance(column, str) or not column:
            raise TypeError(f"name must be a non-empty str, got {column!r}")
        runs = self.runs(configs)
        return Sweep(key=key, name=column, labels=list(labels), configs=configs, runs=runs)

    def cost(self) -> pd.DataFrame:
        """One row per distinct run so far: what it is and its wall time (``seconds``)."""
        rows = [describe_run(run) for run in self._runs.values()]
        columns = ["config_hash", "model", "model_options", "weight_decay", "schedule",
                   "epochs", "train_subset", "seed", "seconds"]
        return pd.DataFrame(rows, columns=columns)
