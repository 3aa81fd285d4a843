r"""Chapter 4 (LogitNorm): the chapter's runs read into its tables, figures and glued numbers,
all but OOD detection (:mod:`calnotes.book.evidence.ch04_detection`).

Every function here reads stored runs (or tables built from them) and returns one table, one
figure or one dictionary ``{glue name: value}`` of the numbers the prose quotes. The ResNet-8
runs follow one :class:`Recipe`; runs are keyed ``(loss name, seed)``, the loss names being
:data:`CE` and :func:`ln_name`. Differences between the losses are paired by seed, with the
Student-t interval of the mean of the per-seed differences
(:func:`calnotes.metrics.seed_interval` of one argument).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import torch

from calnotes import calibrators, data, losses, metrics, models, plots, stats
from calnotes.book.evidence.ch04_detection import interval_reading, validation
from calnotes.runs.executor import chapter_runs
from calnotes.runs.experiment import default_config
from calnotes.runs.ood import run_ood_logits
from calnotes.runs.store import StoredRun

__all__ = [
    "CE", "Recipe", "bound_glue", "calibration_glue", "calibration_table", "calibration_view",
    "claims_glue", "costs_table", "exercise_glue", "lenet_arms", "lenet_norm_figure",
    "lenet_runs", "ln_name", "loss_names", "lr_table", "natural_logits", "norm_curve",
    "norm_glue", "ood_count_glue", "ood_set_images", "parameter_glue", "pilot_glue", "recipe_runs",
    "regime_table", "reliability_grid", "scaled_probs", "scaling_table", "seed_count_glue",
    "tau_table", "training_figure",
]

CE = "cross-entropy"
Key = tuple[str, int]
Runs = Mapping[Key, StoredRun]
Tables = Mapping[Key, pd.DataFrame]


def _md(text: str) -> Any:
    from IPython.display import Markdown

    return Markdown(text)


def ln_name(tau: float) -> str:
    """The name of LogitNorm at temperature ``tau`` in the chapter's tables."""
    if isinstance(tau, bool) or not isinstance(tau, (int, float)) or not tau > 0:
        raise ValueError(f"tau must be a positive number, got {tau!r}")
    return f"LogitNorm, tau={tau:g}"


def loss_names(taus: Sequence[float]) -> dict[str, tuple[str, float | None]]:
    """Cross-entropy and LogitNorm at each of ``taus``: name -> (loss, tau)."""
    if not taus:
        raise ValueError("taus must hold at least one temperature")
    return {CE: ("ce", None)} | {ln_name(t): ("logitnorm", t) for t in taus}


# --- The runs ------------------------------------------------------------------------------

@dataclass(frozen=True)
class Recipe:
    """The chapter's ResNet-8 recipe (the official one scaled down): runs differ only in the
    arguments of :meth:`config`. SMOKE shrinks the data and the epochs."""

    dataset: str
    model: str
    lr: float
    weight_decay: float
    milestones: Sequence[float]
    epochs: int
    train_subset: int
    flip: bool
    model_options: Mapping[str, Any] = field(default_factory=dict)
    smoke: bool = False

    def config(self, loss: str = "ce", tau: float | None = None, seed: int = 0,
               dataset: str | None = None) -> dict[str, Any]:
        """The config of one run: ``loss`` (``ce`` or ``logitnorm`` at ``tau``), ``seed``, and
        ``dataset`` (default: the recipe's; another dataset gets no model options, no flips)."""
        dataset = self.dataset if dataset is None else dataset
        return default_config(
            dataset=dataset, model=self.model,
            model_options=dict(self.model_options) if dataset == self.dataset else {},
            lr=self.lr, momentum=0.9, batch_size=128, weight_decay=self.weight_decay,
            schedule="step", milestones=list(self.milestones), lr_gamma=0.1,
            epochs=3 if self.smoke else self.epochs, augment=True,
            flip=self.flip if dataset == self.dataset else None,
            train_subset=1000 if self.smoke else self.train_subset,
            test_subset=500 if self.smoke else None, val_size=1000 if self.smoke else 5000,
            seed=seed, loss=loss, loss_options={"tau": tau} if loss == "logitnorm" else {})


def recipe_runs(recipe: Recipe, names: Mapping[str, tuple[str, float | None]],
                seeds: Iterable[int], *, dataset: str | None = None, use_store: bool,
                device: Any = "cpu", label: str = "ch04_logitnorm") -> dict[Key, StoredRun]:
    """The runs of ``recipe`` for every loss of ``names`` (name -> (loss, tau)) and seed,
    keyed ``(name, seed)``: loaded from the store, or trained (one at a time) and stored."""
    if not isinstance(recipe, Recipe):
        raise TypeError(f"recipe must be a Recipe, got {type(recipe).__name__}")
    return {(name, s): chapter_runs([recipe.config(*names[name], s, dataset=dataset)],
                                    label=label, use_store=use_store, smoke=recipe.smoke,
                                    device=device)[0]
            for name in names for s in seeds}


def lenet_arms(lenet: Mapping[str, Any]) -> dict[str, dict[Key, StoredRun]]:
    """The LeNet-5 runs of :func:`calnotes.book.evidence.ch04.compute_runs` by setting
    (``official``, ``regime``, ``mnist``), keyed ``(name, seed)`` with LogitNorm named by
    the official setting's tau."""
    names = {"ce": CE, "logitnorm": ln_name(lenet["taus"]["official"])}
    return {setting: {(names[loss], s): r for (name, loss, s), r in lenet["runs"].items()
                      if name == setting}
            for setting in ("official", "regime", "mnist")}


def seed_count_glue(arms: Mapping[str, Runs], ln: str) -> dict[str, int]:
    """``ch04_{l5,reg,m5}_seeds_{ce,ln}``: the stored seeds of each loss in each setting."""
    out = {}
    for key, setting in [("l5", "official"), ("reg", "regime"), ("m5", "mnist")]:
        for short, name in [("ce", CE), ("ln", ln)]:
            out[f"ch04_{key}_seeds_{short}"] = sum(n == name for n, _ in arms[setting])
    return out


def ood_set_images(dataset: str, names: Sequence[str], noise_sets: Sequence[str], pool: int,
                   n_draw: int) -> dict[str, torch.Tensor]:
    """Up to ``pool`` images of each image set of ``names`` and ``n_draw`` of each noise set,
    shaped like ``dataset`` and drawn once with seed 0."""
    splits = data.load_dataset(dataset, seed=0)
    return {name: data.ood_images(name, splits, n=n_draw if name in noise_sets else pool, seed=0)
            for name in names}


def natural_logits(run: StoredRun, ood_sets: Mapping[str, torch.Tensor],
                   natural: Sequence[str], device: Any = "cpu") -> dict[str, torch.Tensor]:
    """A run's stored logits on the sets of ``ood_sets`` named in ``natural``."""
    return {k: v for k, v in run_ood_logits(run, ood_sets, device=device).items()
            if k in natural}


# --- Glue of the set-up and the pilots -----------------------------------------------------

def bound_glue(taus: Sequence[float], k: int = 10) -> dict[str, float]:
    r"""LogitNorm's lower bound :math:`\log(1 + (k-1)e^{-2/\tau})` at the first and last of
    ``taus`` and at :math:`\tau = 1`, the two taus and :math:`1/\tau` of the first."""
    if not taus:
        raise ValueError("taus must hold at least one temperature")
    bound = losses.LogitNormLoss.lower_bound
    return {"ch04_bound_tau": float(bound(taus[0], k)),
            "ch04_bound_tau2": float(bound(taus[-1], k)),
            "ch04_bound_1": float(bound(1.0, k)), "ch04_tau": float(taus[0]),
            "ch04_tau2": float(taus[-1]), "ch04_inv_tau": float(1 / taus[0])}


def parameter_glue() -> dict[str, int]:
    """Parameter counts of the official WRN-40-2 (CIFAR-sized) and of ResNet-8 (28x28 grey),
    counted on the meta device without allocating them."""
    out = {}
    for key, name, (channels, size) in [("wrn", "wrn-40-2", (3, 32)),
                                        ("resnet", "resnet8", (1, 28))]:
        with torch.device("meta"):
            net = models.build_model(name, num_classes=10, in_channels=channels, image_size=size)
        out[f"ch04_{key}_params"] = sum(p.numel() for p in net.parameters())
    return out


def lr_table(lenet: Mapping[str, Any]) -> pd.DataFrame:
    """The LeNet-5 learning-rate pilot: the last validation accuracy and logit norm of each
    loss at each rate."""
    return pd.DataFrame({
        (loss, what): {lr: r.history[column][-1]
                       for (name, lr), r in lenet["lr_pilot"].items() if name == loss}
        for loss in ("ce", "logitnorm")
        for what, column in [("val. accuracy", "val_acc"), ("val. logit norm", "val_logit_norm")]
    }).rename_axis("learning rate")


def regime_table(lenet: Mapping[str, Any]) -> pd.DataFrame:
    """The regime pilots: each candidate's settings, the slope of cross-entropy's log
    validation logit norm (% per epoch), its validation confidence minus accuracy (points)
    and its validation accuracy."""
    from calnotes.book.evidence import ch04

    return pd.DataFrame([
        {"weight decay": c["weight_decay"], "images": c["train_subset"], "epochs": c["epochs"],
         "slope of log norm (% per epoch)": 100 * ch04.log_norm_slope(r),
         "val. confidence - accuracy (points)": 100 * ch04.val_confidence_gap(r),
         "val. accuracy": r.history["val_acc"][-1]}
        for c, r in zip(ch04.REGIMES, lenet["regime_pilots"], strict=True)])


def tau_table(lenet: Mapping[str, Any], device: Any = "cpu") -> pd.DataFrame:
    """The tau pilots: validation FPR95 (%) of the raw MSP against Gaussian noise, per tau."""
    from calnotes.book.evidence import ch04

    return pd.DataFrame({
        setting: {t: 100 * ch04.noise_val_fpr(r, device) for t, r in runs.items()}
        for setting, runs in lenet["tau_pilots"].items()}).rename_axis("tau")


def pilot_glue(lenet: Mapping[str, Any]) -> dict[str, Any]:
    """The pilots' outcomes: each loss's rate, LogitNorm's largest logit norm in the rate
    pilot, the regime's images and epochs, and the tau chosen on noise."""
    table = lr_table(lenet)
    return {"ch04_lr_ce": lenet["lrs"]["ce"], "ch04_lr_ln": lenet["lrs"]["logitnorm"],
            "ch04_pilot_worst_norm": float(table[("logitnorm", "val. logit norm")].max()),
            "ch04_regime_n": lenet["regime"]["train_subset"],
            "ch04_regime_epochs": lenet["regime"]["epochs"],
            "ch04_tau_official": lenet["taus"]["official"]}


# --- The logit norm while training ---------------------------------------------------------

def norm_curve(runs: Runs, name: str, column: str = "val_logit_norm") -> np.ndarray:
    """``column`` of the history by epoch, one row per seed of loss ``name`` (seed order)."""
    seeds = sorted(s for n, s in runs if n == name)
    if not seeds:
        raise ValueError(f"name {name!r} has no run in runs")
    return np.stack([np.asarray(runs[(name, s)].history.to_frame()[column].to_numpy(),
                                dtype=float) for s in seeds])


def _band(axis: Any, epochs: Any, values: np.ndarray, **kwargs: Any) -> None:
    line, = axis.plot(epochs, values.mean(0), **kwargs)
    axis.fill_between(epochs, values.min(0), values.max(0), alpha=0.2, color=line.get_color(),
                      linewidth=0)


def training_figure(runs: Runs, names: Iterable[str]) -> Any:
    """Validation logit norm (log scale) and validation accuracy by epoch of each loss: the
    mean over its seeds, the band spanning them."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.4), gridspec_kw={"wspace": 0.3})
    for name in names:
        epochs = next(r for (n, _), r in runs.items() if n == name).history.to_frame()["epoch"]
        for axis, column in zip(ax, ("val_logit_norm", "val_acc"), strict=True):
            _band(axis, epochs, norm_curve(runs, name, column), marker="o", markersize=3,
                  label=name)
    ax[0].set(xlabel="epoch", ylabel="mean ||f(x)||, validation", yscale="log")
    ax[1].set(xlabel="epoch", ylabel="validation accuracy")
    ax[0].legend(fontsize=8)
    return fig


def lenet_norm_figure(panels: Mapping[str, Runs], names: Sequence[str]) -> Any:
    """One panel per setting (title -> runs): the validation logit norm by epoch of each of
    ``names`` that has stored runs there, mean over its seeds and the band spanning them."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, len(panels), figsize=(10, 3.4), gridspec_kw={"wspace": 0.3},
                           sharey=True, squeeze=False)
    for axis, (title, runs) in zip(ax[0], panels.items(), strict=True):
        for name in names:
            if any(n == name for n, _ in runs):
                values = norm_curve(runs, name)
                _band(axis, np.arange(1, values.shape[1] + 1), values, label=name)
        axis.set(xlabel="epoch", title=title, yscale="log")
    ax[0, 0].set(ylabel="mean ||f(x)||, validation")
    ax[0, 0].legend(fontsize=8)
    return fig


def norm_glue(main: Runs, small: Runs, ce: str, ln: str, milestones: Sequence[float]
              ) -> dict[str, float]:
    r"""The logit norms the prose quotes: cross-entropy's and LogitNorm's mean validation norm
    after the first and the last epoch (means over seeds), cross-entropy's peak, its growth
    :math:`100\,(\lVert f\rVert_{\text{last}} / \lVert f\rVert_{\text{first}} - 1)` averaged
    over seeds (ResNet-8, ``main``; LeNet-5, ``small``), the last epoch at the first rate, and
    cross-entropy's final training and validation accuracy (%)."""
    ce_norm, ln_norm, small_ce = norm_curve(main, ce), norm_curve(main, ln), norm_curve(small, ce)
    ce_runs = [main[(ce, s)] for s in sorted(s for n, s in main if n == ce)]
    return {
        "ch04_epochs": ce_norm.shape[1],
        "ch04_milestone": max(1, round(milestones[0] * ce_norm.shape[1])),
        "ch04_ce_norm_first": float(ce_norm[:, 0].mean()),
        "ch04_ce_norm_peak": float(ce_norm.max(axis=1).mean()),
        "ch04_ce_norm_last": float(ce_norm[:, -1].mean()),
        "ch04_ln_norm_first": float(ln_norm[:, 0].mean()),
        "ch04_ln_norm_last": float(ln_norm[:, -1].mean()),
        "ch04_small_ce_norm_first": float(small_ce[:, 0].mean()),
        "ch04_small_ce_norm_last": float(small_ce[:, -1].mean()),
        "ch04_ce_train_acc": float(100 * np.mean([r.history["train_acc"][-1] for r in ce_runs])),
        "ch04_ce_val_acc": float(100 * np.mean([r.history["val_acc"][-1] for r in ce_runs])),
        "ch04_ce_norm_growth": float(100 * (ce_norm[:, -1] / ce_norm[:, 0] - 1).mean()),
        "ch04_small_ce_norm_growth": float(100 * (small_ce[:, -1] / small_ce[:, 0] - 1).mean()),
    }


SCALES = (0.25, 0.5, 1.0, 2.0, 4.0)


def scaled_probs(logits: torch.Tensor, scales: Sequence[float] = SCALES
                 ) -> dict[float, torch.Tensor]:
    """``softmax(s * logits)`` in float64 for each scale ``s``."""
    if not isinstance(logits, torch.Tensor) or logits.ndim != 2:
        raise TypeError("logits must be a 2-d torch tensor (N, C)")
    return {s: torch.softmax(s * logits.double(), dim=1) for s in scales}


def scaling_table(run: StoredRun, scales: Sequence[float] = SCALES) -> pd.DataFrame:
    """Accuracy, mean confidence and NLL of the run's test logits multiplied by each scale."""
    scaled = scaled_probs(run.test_logits, scales)
    return pd.DataFrame({
        "accuracy": {s: 1 - float(metrics.error(p, run.test_labels)) for s, p in scaled.items()},
        "mean confidence": {s: float(p.max(dim=1).values.mean()) for s, p in scaled.items()},
        "NLL": {s: float(metrics.nll(p, run.test_labels)) for s, p in scaled.items()},
    }).rename_axis("scale s")


# --- Accuracy and calibration --------------------------------------------------------------

def _ts_probs(run: StoredRun) -> tuple[Any, dict[str, Any]]:
    ts = calibrators.TemperatureScaling().fit(*validation(run))
    return ts, {"raw": torch.softmax(run.test_logits.double(), dim=1),
                "TS": ts.predict_proba(run.test_logits)}


def _calibration_rows(runs: Runs, names: Iterable[str], n_bins: int) -> pd.DataFrame:
    names = set(names)
    rows = {}
    for (name, s), r in runs.items():
        if name in names:
            ts, probs = _ts_probs(r)
            table = metrics.calibration_report(probs, r.test_labels, n_bins=n_bins,
                                               metrics=["error", "nll", "ece"])
            table["confidence"] = [float(p.max(dim=1).values.mean()) for p in probs.values()]
            table["T"] = [1.0, ts.temperature_]
            for output, row in table.iterrows():
                rows[(name, output, s)] = row
    return pd.DataFrame(rows).T.rename_axis(["loss", "output", "seed"])


def calibration_table(networks: Mapping[str, tuple[Runs, Iterable[str]]], n_bins: int = 15
                      ) -> pd.DataFrame:
    """Test error, NLL, ECE, mean confidence and temperature, raw and after temperature
    scaling fitted on the validation logits, one row per (network, loss, output, seed);
    ``networks`` maps a network's label to its runs and the losses to read."""
    if not networks:
        raise ValueError("networks must name at least one network")
    return pd.concat({label: _calibration_rows(runs, names, n_bins)
                      for label, (runs, names) in networks.items()}, names=["network"])


def _calibration_stats(calib: pd.DataFrame) -> pd.DataFrame:
    return calib.groupby(level=["network", "loss", "output"], sort=False).agg(["mean", "std"])


def calibration_view(calib: pd.DataFrame) -> pd.DataFrame:
    """Mean and std over seeds of each metric in percent (the temperature left out)."""
    view = _calibration_stats(calib).drop(columns="T", level=0).copy()
    view[view.columns] = 100 * view[view.columns]
    return view


def reliability_grid(runs: Mapping[str, StoredRun], n_bins: int = 15) -> Any:
    """Reliability diagrams of each run (name -> run), raw and after temperature scaling."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(runs), 2, figsize=(7.6, 4.6 * len(runs)), squeeze=False,
                             gridspec_kw={"wspace": 0.35, "hspace": 0.75})
    for row, (name, r) in zip(axes, runs.items(), strict=True):
        _, probs = _ts_probs(r)
        for ax, (label, p) in zip(row, probs.items(), strict=True):
            plots.reliability_diagram(p, r.test_labels, n_bins=n_bins, ax=ax,
                                      title=f"{name}, {label}")
    return fig


def calibration_glue(calib: pd.DataFrame, norms: pd.DataFrame, ce: str, ln: str, ln2: str,
                     network: str = "ResNet-8") -> dict[str, Any]:
    """The accuracy and calibration numbers of the prose for ``network``: each loss's test
    accuracy, confidence, ECE raw and after TS and fitted T (means over seeds); the paired
    differences of the error (LogitNorm - cross-entropy) and of the ECE (cross-entropy -
    LogitNorm) in points with their intervals and readings; LogitNorm's mean test norm and
    its accuracy minus confidence."""
    stats = _calibration_stats(calib)
    by_key = calib.sort_index()  # sorted by seed within each (network, loss, output)

    def cal(name: str, output: str, column: str) -> float:
        return float(stats.loc[(network, name, output), (column, "mean")])

    def seeds(name: str, output: str, column: str) -> np.ndarray:
        return by_key.loc[(network, name, output), column].to_numpy(dtype=float)

    ece_gain = {out: metrics.seed_interval(100 * seeds(ce, out, "ece")
                                           - 100 * seeds(ln, out, "ece"))
                for out in ("raw", "TS")}
    acc_drops = {name: metrics.seed_interval(100 * seeds(name, "raw", "error")
                                             - 100 * seeds(ce, "raw", "error"))
                 for name in (ln, ln2)}
    out: dict[str, Any] = {"ch04_ln2_acc": 100 * (1 - cal(ln2, "raw", "error")),
                           "ch04_acc_drop2_ci": _md(f"{acc_drops[ln2]:.2f}")}
    for key, name in [("ce", ce), ("ln", ln)]:
        for output in ("raw", "TS"):
            out[f"ch04_{key}_{output}_ece"] = 100 * cal(name, output, "ece")
        out[f"ch04_{key}_acc"] = 100 * (1 - cal(name, "raw", "error"))
        out[f"ch04_{key}_conf"] = 100 * cal(name, "raw", "confidence")
        out[f"ch04_{key}_temp"] = cal(name, "TS", "T")
    out |= {
        "ch04_acc_drop_ci": _md(f"{acc_drops[ln]:.2f}"),
        "ch04_ece_gain_raw_ci": _md(f"{ece_gain['raw']:.2f}"),
        "ch04_ece_gain_ts_ci": _md(f"{ece_gain['TS']:.2f}"),
        "ch04_ece_gain_ts_reading": _md(interval_reading(ece_gain["TS"])),
        "ch04_acc_drop_reading": _md(interval_reading(acc_drops[ln], "LogitNorm less accurate",
                                                      "cross-entropy less accurate")),
        "ch04_ln_test_norm": float(norms.loc["ID (test)", ln]),
        "ch04_ln_conf_gap": 100 * (1 - cal(ln, "raw", "error")) - 100 * cal(ln, "raw",
                                                                           "confidence"),
    }
    return out


# --- Claims, costs and exercises -----------------------------------------------------------

DATINGS = {"before": "before its runs", "after_some": "after some of its runs",
           "after": "after its runs"}


def claims_glue(claims: pd.DataFrame, verdicts: Mapping[str, str],
                format_effect: Callable[[Any], str]) -> dict[str, Any]:
    """The claims' words of the prose: ``ch04_v_<id>`` (the verdict of ``verdicts``) and
    ``ch04_e_<id>`` (``format_effect`` of its row) of every claim, how many claims answered
    by stored runs were declared before, after some or after all of their runs, the seeds of
    the two MNIST AUROC claims, and the verdict vocabulary the prose quotes."""
    rows = claims.set_index("id")
    out: dict[str, Any] = {"ch04_word_inconclusive": stats.INCONCLUSIVE,
                           "ch04_word_premise_fails": stats.PREMISE_FAILS,
                           "ch04_word_premise_inconclusive": stats.PREMISE_INCONCLUSIVE}
    for cid, word in verdicts.items():
        out[f"ch04_v_{cid.replace('-', '_')}"] = word
        out[f"ch04_e_{cid.replace('-', '_')}"] = _md(format_effect(rows.loc[cid]))
    dated = claims["declared"].isin(list(DATINGS.values())) & (claims["n"] > 0)
    out["ch04_n_dated"] = int(dated.sum())
    for key, word in DATINGS.items():
        out[f"ch04_n_{key}"] = int((dated & (claims["declared"] == word)).sum())
    for key in ("r8", "l5"):
        out[f"ch04_n_mnist_{key}"] = int(rows.loc[f"ln-msp-auroc-mnist-{key}", "n"])
    return out


def costs_table(runs: Iterable[StoredRun]) -> pd.DataFrame:
    """One row per run: its folder, data, model, loss, tau, rate, seed, epochs, device,
    threads and recorded training time in minutes."""
    return pd.DataFrame([
        {"run": r.path.name, "data": r.config["dataset"], "model": r.config["model"],
         "loss": r.config["loss"], "tau": r.config["loss_options"].get("tau"),
         "lr": r.config["lr"], "seed": r.config["seed"], "epochs": r.config["epochs"],
         "device": r.provenance["device"], "threads": r.provenance.get("cpu_threads"),
         "minutes": round(r.provenance["seconds"] / 60, 2)}
        for r in runs])


def lenet_runs(lenet: Mapping[str, Any]) -> list[StoredRun]:
    """Every LeNet-5 run of :func:`calnotes.book.evidence.ch04.compute_runs`: the pilots of
    the rate, the regime and tau, then the claims' seeds."""
    return [*lenet["lr_pilot"].values(), *lenet["regime_pilots"],
            *(r for runs in lenet["tau_pilots"].values() for r in runs.values()),
            *lenet["runs"].values()]


def exercise_glue(which: str, table: pd.DataFrame, keys: Mapping[str, str] | None = None,
                  natural: Sequence[str] = ()) -> dict[str, float]:
    """The numbers of an exercise's solution from its table: ``normalised`` (mean FPR95 of
    each score over the OOD sets), ``gradnorm`` (per loss of ``keys``, name -> short key: the
    mean logit factor on the test images and over the ``natural`` sets, and its FPR95 over
    them) or ``optimal_t`` (per loss of ``keys``: test ECE with T fitted on validation and
    on test)."""
    if which not in ("normalised", "gradnorm", "optimal_t"):
        raise ValueError(f"which must be one of 'normalised', 'gradnorm', 'optimal_t', "
                         f"got {which!r}")
    if which == "normalised":
        fpr = table["FPR95 (%)"].groupby(level="score", sort=False).mean()
        return {"ch04_ex1_raw": fpr["raw MSP"], "ch04_ex1_norm": fpr["MSP of f/(tau ||f||)"],
                "ch04_ex1_cos": fpr["max cosine"]}
    if not keys:
        raise ValueError(f"keys must map each loss of the {which} table to a short key")
    if which == "gradnorm":
        out = {}
        for name, key in keys.items():
            part = table.loc[name]
            out[f"ch04_ex2_{key}_id"] = part.loc["ID (test)", "mean factor"]
            out[f"ch04_ex2_{key}_ood"] = part.loc[list(natural), "mean factor"].mean()
            out[f"ch04_ex2_{key}_fpr"] = part.loc[list(natural), "FPR95 (%)"].mean()
        return out
    out = {}
    for name, key in keys.items():
        part = table.loc[name, "test ECE (%)"]
        out[f"ch04_ex4_{key}_val"] = part["TS fitted on validation"]
        out[f"ch04_ex4_{key}_test"] = part["TS fitted on test"]
    return out


def ood_count_glue(ood_sets: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """The typefaces of the printed letters and the images of the small ``digits`` set
    (0 when the chapter does not score it)."""
    return {"ch04_n_faces": sum(len(faces) for faces in data.packaged.LETTER_FONTS.values()),
            "ch04_n_digits": len(ood_sets["digits"]) if "digits" in ood_sets else 0}
