"""Chapter 2's measures and studies: NLL overfitting read from a run's history, and the
old-against-modern comparison with weight decay chosen by a rule declared in advance; the
tables and glued numbers of the chapter's experiments (its figures are in
``calnotes.book.evidence.ch02_figures``), and the exercises' table builders."""

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
from calnotes.runs.sweeps import describe_run

__all__ = ["WEIGHT_DECAY_GRID", "ch01_config", "ch01_glue", "ece_by_epoch", "exercise_run",
           "fair_glue", "fair_rows", "fair_summary", "history_change", "library_summary",
           "overfitting_glue", "pair_glue", "pilot_table", "reference_epoch", "run_statistics",
           "seed_runs", "seed_trends", "shrink", "sweep_config", "sweep_glue", "sweep_table",
           "test_probs", "tick", "tuned_choice", "tuned_glue", "tuned_pair"]
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


# --- The chapter's experiments: tables and glued numbers ------------------------------------

#: The statistics of :func:`describe_run` the old-and-modern pair glues, in percent.
PAIR_COLUMNS = ("test_error", "test_accuracy", "test_confidence", "test_ece", "train_acc")
#: The per-seed statistics of the fair test of the old and the modern network.
FAIR_COLUMNS = ("test_ece", "test_error", "overconfidence", "train_acc", "test_confidence",
                "test_accuracy")
#: The sweeps :func:`sweep_glue` reads, by name.
SWEEP_NAMES = ("depth", "width", "batch_norm", "weight_decay")


def _check_mapping(value: Any, name: str, keys: tuple[str, ...] = ()) -> Mapping[Any, Any]:
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a mapping, got {type(value).__name__}")
    missing = [k for k in keys if k not in value]
    if missing:
        raise ValueError(f"{name} lacks the key(s) {missing}; it has {list(value)}")
    return value


def test_probs(run: Any) -> torch.Tensor:
    """A run's test probabilities: a float64 softmax of its stored logits."""
    return torch.softmax(torch.as_tensor(run.test_logits).double(), dim=1)


def library_summary(run: Any) -> dict[str, float]:
    """The from-scratch summary's four numbers from the library: the NLL
    (:func:`calnotes.metrics.nll` of the float64 softmax), and the accuracy
    :math:`\\bar a`, the average confidence :math:`\\bar c` and the overconfidence
    :math:`\\bar c - \\bar a` of :func:`~calnotes.runs.sweeps.describe_run`."""
    row = describe_run(run)
    return {"nll": float(metrics.nll(test_probs(run), run.test_labels)),
            "accuracy": row["test_accuracy"], "confidence": row["test_confidence"],
            "overconfidence": row["overconfidence"]}


def _paired(metric: Any, a: Any, b: Any, n_bins: int, n_boot: int, seed: int) -> Any:
    """``metric(a) - metric(b)`` on the same resampled test images, in points (95%)."""
    return metrics.bootstrap_interval(metric, test_probs(a), a.test_labels, test_probs(b),
                                      n_bins=n_bins, n_boot=n_boot, seed=seed).scaled(100)


def pair_glue(old: Any, modern: Any, *, n_bins: int = 15, n_boot: int = 1000,
              seed: int = 0) -> dict[str, Any]:
    """The glued numbers of the old-and-modern pair trained the same way: per network
    (``old``, ``modern``) the ``PAIR_COLUMNS`` in percent, the final validation logit
    norm and a 95% bootstrap interval of the test ECE; the ratio of the norms (old over
    modern); the modern network's ECE and error minus the old one's on the same resampled
    test images; the training images and epochs of ``old``'s config."""
    rows = {"old": describe_run(old), "modern": describe_run(modern)}
    out: dict[str, Any] = {}
    for key, row in rows.items():
        for column in PAIR_COLUMNS:
            out[f"ch02_{key}_{column}"] = 100 * row[column]
        out[f"ch02_{key}_norm"] = row["val_logit_norm"]
    out["ch02_norm_ratio"] = rows["old"]["val_logit_norm"] / rows["modern"]["val_logit_norm"]
    for key, run in (("old", old), ("modern", modern)):
        iv = metrics.bootstrap_interval("ece", test_probs(run), run.test_labels, n_bins=n_bins,
                                        n_boot=n_boot, seed=seed).scaled(100)
        out[f"ch02_{key}_ece_ci"] = f"[{iv.low:.2f}, {iv.high:.2f}]"
    for m in ("ece", "error"):
        out[f"ch02_pair_{m}_ci"] = f"{_paired(m, modern, old, n_bins, n_boot, seed):+.2f}"
    out["ch02_train_images"] = old.config["train_subset"] or "all"
    out["ch02_epochs"] = old.config["epochs"]
    return out


def pilot_table(pilots: Mapping[float, Any], network: str) -> pd.DataFrame:
    """The pilots of the old network's weight decay: per weight decay (the keys of
    ``pilots``), the final validation error (%) and NLL and the final training accuracy (%)
    of its run. The fair test takes the weight decay of lowest validation error."""
    _check_mapping(pilots, "pilots")
    rows = {}
    for wd, run in pilots.items():
        h = run.history.to_frame()
        rows[wd] = {"val_error (%)": 100 * (1 - h["val_acc"].iloc[-1]),
                    "val_nll": h["val_loss"].iloc[-1],
                    "train_acc (%)": 100 * h["train_acc"].iloc[-1]}
    return pd.DataFrame(rows).T.rename_axis(f"{network} weight decay")


def seed_runs(runner: Any, configs: Mapping[str, Mapping[str, Any]],
              seeds: list[int]) -> dict[str, list[Any]]:
    """Every config of ``configs`` at every seed of ``seeds``, run (or loaded) by the
    :class:`~calnotes.runs.sweeps.SweepRunner` ``runner`` in one batch: ``{name: [run per
    seed]}``."""
    _check_mapping(configs, "configs")
    if not seeds:
        raise ValueError("seeds must not be empty")
    runner.runs([{**cfg, "seed": s} for cfg in configs.values() for s in seeds])
    return {name: [runner.run({**cfg, "seed": s}) for s in seeds]
            for name, cfg in configs.items()}


def fair_rows(fair: Mapping[str, list[Any]]) -> pd.DataFrame:
    """One row per network and seed of ``fair`` (:func:`seed_runs`): ``network``, ``seed``
    and :func:`~calnotes.runs.sweeps.describe_run`'s statistics."""
    _check_mapping(fair, "fair")
    return pd.DataFrame([{"network": name, "seed": run.config["seed"], **describe_run(run)}
                         for name, runs in fair.items() for run in runs])


def fair_summary(rows: pd.DataFrame) -> pd.DataFrame:
    """Mean and sample standard deviation (``ddof=1``) over seeds of the test error,
    confidence, accuracy, ECE and training accuracy per network of ``rows``
    (:func:`fair_rows`), in percent, rounded to 2 decimals."""
    columns = ["test_error", "test_confidence", "test_accuracy", "test_ece", "train_acc"]
    return (100 * rows.groupby("network", sort=False)[columns].agg(["mean", "std"])).round(2)


def fair_glue(fair: Mapping[str, list[Any]], config: Mapping[str, Any], old_wd: float,
              baseline: str, model: str) -> dict[str, Any]:
    """The fair test's glued numbers: its regime (training and validation images, epochs,
    the old network's chosen weight decay ``old_wd``, the number of seeds), where the first
    seed of ``model`` has its lowest validation NLL and how far the NLL ends above it; per
    network (``old`` is ``baseline``, ``modern`` is ``model``) the mean and standard
    deviation over seeds of ``FAIR_COLUMNS`` in percent; and Welch's 95% interval over
    seeds (:func:`calnotes.metrics.seed_interval`) of the modern minus the old network's
    test ECE and error, in points. ``config`` is the modern network's config."""
    _check_mapping(fair, "fair", (baseline, model))
    curve = fair[model][0].history.to_frame()  # the first seed: the regime's pilot
    values = {name: {k: part[k].to_numpy() for k in FAIR_COLUMNS}
              for name, part in fair_rows(fair).groupby("network", sort=False)}
    out: dict[str, Any] = {
        "ch02_fair_images": f"{config['train_subset'] or 'all':,}",
        "ch02_fair_val": f"{config['val_size']:,}", "ch02_fair_epochs": config["epochs"],
        "ch02_fair_wd": old_wd, "ch02_fair_seeds": len(fair[model]),
        "ch02_fair_nll_epoch": int(curve.loc[int(curve["val_loss"].idxmin()), "epoch"]),
        "ch02_fair_nll_rise": curve["val_loss"].iloc[-1] - curve["val_loss"].min()}
    for key, name in (("old", baseline), ("modern", model)):
        for k, v in values[name].items():
            out[f"ch02_fair_{key}_{k}"] = 100 * v.mean()
            out[f"ch02_fair_{key}_{k}_std"] = 100 * v.std(ddof=1)
    for k, short in (("test_ece", "ece"), ("test_error", "error")):
        iv = metrics.seed_interval(100 * values[model][k], 100 * values[baseline][k])
        out[f"ch02_fair_{short}_ci"] = f"{iv:+.2f}"
    return out


def tuned_glue(choice: pd.DataFrame) -> dict[str, str]:
    """The weight decays the declared rule picks (:func:`tuned_choice`), as glued text."""
    chosen = choice.query("chosen").set_index("network")["weight_decay"]
    return {"ch02_tuned_lenet_wd": f"{chosen['lenet5']:g}",
            "ch02_tuned_resnet_wd": f"{chosen['resnet8']:g}"}


def tick(value: Any) -> str:
    """Axis label of a sweep value: ``on``/``off`` for a flag, ``5e-4`` for a value in
    (0, 0.01), otherwise ``16`` or ``0.02`` (``:g``)."""
    if isinstance(value, (bool, np.bool_)):
        return "on" if value else "off"
    if 0 < value < 0.01:
        return f"{value:.0e}".replace("e-0", "e-")
    return f"{value:g}"


def sweep_table(sweeps: Mapping[str, Any]) -> pd.DataFrame:
    """The sweeps' runs, one row per sweep and value (:func:`tick`): test error, ECE,
    overconfidence and NLL, final training accuracy and validation logit norm, rounded to
    4 decimals."""
    _check_mapping(sweeps, "sweeps")
    columns = ["test_error", "test_ece", "overconfidence", "test_nll", "train_acc",
               "val_logit_norm"]
    return pd.concat({name: s.table().assign(value=lambda t, n=name: t[n].map(tick))
                      .set_index("value")[columns] for name, s in sweeps.items()},
                     names=["sweep", "value"]).round(4)


def _overconfidence(probs: Any, labels: Any) -> float:
    """Average confidence minus accuracy."""
    conf, correct = metrics.confidences_and_correct(probs, labels)
    return float(conf.mean() - correct.mean())


def sweep_glue(sweeps: Mapping[str, Any], base: Any, *, n_bins: int = 15, n_boot: int = 1000,
               seed: int = 0) -> dict[str, Any]:
    """The sweeps' glued numbers (``sweeps`` has ``SWEEP_NAMES``; ``base`` is the run
    they share): depth and width at both ends with their test ECE and error (%); with and
    without batch normalization, test error, ECE and training accuracy (%); the narrowest
    network's training accuracy and ECE; the weight-decay sweep's overconfidence at its
    first value and at its lowest ECE, its last value's confidence, accuracy and ECE, where
    its error is lowest and its spread; the binomial standard error
    :math:`\\sqrt{p(1-p)/N}` of ``base``'s test error :math:`p` on its :math:`N` test
    images; and paired bootstrap intervals on the same test images (points): last minus
    first depth and width, with minus without batch normalization (ECE and error), and the
    overconfidence without minus with the largest weight decay."""
    _check_mapping(sweeps, "sweeps", SWEEP_NAMES)
    tables = {name: s.table() for name, s in sweeps.items()}
    out: dict[str, Any] = {}
    for name in ("depth", "width"):
        t = tables[name]
        for end, i in (("first", 0), ("last", -1)):
            out[f"ch02_{name}_{end}"] = t[name].iloc[i]
            out[f"ch02_{name}_{end}_ece"] = 100 * t["test_ece"].iloc[i]
            out[f"ch02_{name}_{end}_error"] = 100 * t["test_error"].iloc[i]
    bn = tables["batch_norm"].set_index("batch_norm")
    for flag, key in ((True, "on"), (False, "off")):
        for column in ("test_error", "test_ece", "train_acc"):
            out[f"ch02_bn_{key}_{column}"] = 100 * bn.loc[flag, column]
    narrow = tables["width"].iloc[0]
    out["ch02_narrow_train_acc"] = 100 * narrow["train_acc"]
    out["ch02_narrow_ece"] = 100 * narrow["test_ece"]
    base_row = describe_run(base)
    out["ch02_base_ece"] = 100 * base_row["test_ece"]
    wd = tables["weight_decay"]
    best_wd = wd.loc[wd["test_ece"].idxmin()]
    out.update({
        "ch02_wd_first": tick(wd["weight_decay"].iloc[0]),
        "ch02_wd_first_gap": 100 * wd["overconfidence"].iloc[0],
        "ch02_wd_best": tick(best_wd["weight_decay"]),
        "ch02_wd_best_ece": 100 * best_wd["test_ece"],
        "ch02_wd_best_gap": 100 * best_wd["overconfidence"],
        "ch02_wd_last": tick(wd["weight_decay"].iloc[-1]),
        "ch02_wd_last_conf": 100 * wd["test_confidence"].iloc[-1],
        "ch02_wd_last_acc": 100 * wd["test_accuracy"].iloc[-1],
        "ch02_wd_last_ece": 100 * wd["test_ece"].iloc[-1],
        "ch02_wd_min_error_wd": tick(wd.loc[wd["test_error"].idxmin(), "weight_decay"]),
        "ch02_wd_error_spread": 100 * (wd["test_error"].max() - wd["test_error"].min())})
    n_test = len(base.test_labels)
    p_err = base_row["test_error"]
    out["ch02_error_se"] = 100 * np.sqrt(p_err * (1 - p_err) / n_test)
    out["ch02_n_test"] = n_test
    depth, width, bn_sweep = sweeps["depth"], sweeps["width"], sweeps["batch_norm"]
    pairs = {"depth": (depth.runs[-1], depth.runs[0]), "width": (width.runs[-1], width.runs[0]),
             "bn": (bn_sweep.run_for(True), bn_sweep.run_for(False))}
    for key, (a, b) in pairs.items():
        for m in ("ece", "error"):
            out[f"ch02_ci_{key}_{m}"] = f"{_paired(m, a, b, n_bins, n_boot, seed):+.2f}"
    decay = sweeps["weight_decay"]
    gap = _paired(_overconfidence, decay.runs[0], decay.runs[-1], n_bins, n_boot, seed)
    out["ch02_ci_wd_gap"] = f"{gap:+.2f}"
    return out


def ch01_glue(curve: pd.DataFrame, reference: int) -> dict[str, Any]:
    """Chapter 1's LeNet-5 at the ``reference`` epoch and the last (validation NLL, and
    error in %), and the epoch of its lowest validation NLL; ``curve`` is its history."""
    at = curve.set_index("epoch")
    last = int(at.index.max())
    if reference not in at.index:
        raise ValueError(f"reference must be an epoch of curve (1 to {last}), got {reference}")
    return {"ch02_ch01_ref": reference, "ch02_ch01_last": last,
            "ch02_ch01_ref_nll": at.loc[reference, "val_loss"],
            "ch02_ch01_last_nll": at.loc[last, "val_loss"],
            "ch02_ch01_ref_err": 100 * (1 - at.loc[reference, "val_acc"]),
            "ch02_ch01_last_err": 100 * (1 - at.loc[last, "val_acc"]),
            "ch02_ch01_min_epoch": int(at["val_loss"].idxmin())}


def overfitting_glue(overfitting: pd.DataFrame, stepped: str, baseline: str) -> dict[str, Any]:
    """The NLL-overfitting table's glued numbers (one row per run of
    :func:`~calnotes.runs.sweeps.nll_overfitting`): the step-schedule run ``stepped``'s
    best and final NLL, its error at the NLL minimum and lowest error (%) and their epochs;
    the ``baseline`` run's NLL and logit norm at its NLL minimum and at the end; the largest
    change of the error after the NLL minimum over every run, and the largest fall with its
    run."""
    if stepped not in overfitting.index or baseline not in overfitting.index:
        raise ValueError(f"overfitting must have the rows {stepped!r} and {baseline!r}; "
                         f"it has {list(overfitting.index)}")
    step, old = overfitting.loc[stepped], overfitting.loc[baseline]
    out: dict[str, Any] = {f"ch02_step_{c}": step[c] for c in ("best_nll", "final_nll")}
    out.update({f"ch02_step_{c}": 100 * step[c] for c in ("best_error", "min_error")})
    out.update({f"ch02_step_{c}": int(step[c]) for c in ("best_epoch", "min_error_epoch",
                                                        "epochs")})
    out.update({"ch02_old_best_epoch": int(old["best_epoch"]),
                "ch02_old_best_nll": old["best_nll"], "ch02_old_final_nll": old["final_nll"],
                "ch02_old_best_norm": old["best_norm"],
                "ch02_old_final_norm": old["final_norm"]})
    falls = overfitting["error_change"]
    out["ch02_max_error_change"] = 100 * falls.abs().max()
    out["ch02_largest_fall_run"] = falls.idxmin()
    out["ch02_largest_fall"] = -100 * falls.min()
    return out


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
