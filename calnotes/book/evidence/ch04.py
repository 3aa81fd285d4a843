"""Chapter 4 (LogitNorm): its run configs, selection rules, measures and run driver.

The rules below were written down before the runs they select (see ``book/claims/04.yaml``):

* **learning rate, per loss** (``own_lr``): the rate of the LeNet-5 pilot (``PILOT_LRS``,
  ``PILOT_EPOCHS`` epochs, seed 0, official recipe) with the highest validation accuracy
  of that loss;
* **regime where the premise can hold** (``choose_regime``): the first candidate of
  ``REGIMES`` (cheapest first) in which cross-entropy at its own rate, trained with the
  pilot seed ``PILOT_SEED``, has a positive slope of the log validation logit norm over
  the epochs and a mean validation confidence above its validation accuracy; if none
  qualifies, the candidate with the largest validation confidence gap;
* **tau** (``choose_tau``): the value of ``TAUS`` whose LogitNorm run (pilot seed,
  official recipe) has the lowest FPR95 of the raw MSP with its validation images as the
  in-distribution set and ``NOISE_VAL`` Gaussian-noise images drawn with seed
  ``NOISE_VAL_SEED`` as OOD (the paper tunes on Gaussian noise); ties go to the larger tau.
  The rule was declared per regime; for the CPU budget the regime uses the official
  recipe's choice (changed before any LogitNorm run of the regime existed), as the paper
  uses one tau per dataset.

No test image and no natural OOD image enters any choice.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from calnotes import calibrators, data, ood
from calnotes.book.evidence.ch04_detection import validation
from calnotes.runs.claims import register_measure
from calnotes.runs.executor import chapter_runs
from calnotes.runs.experiment import default_config
from calnotes.runs.ood import run_odin_logits, run_ood_logits, run_test_images
from calnotes.runs.store import RunNotFound, StoredRun, load_or_run

__all__ = [
    "LABEL", "NATURAL_SETS", "NOISE_SETS", "PILOT_LRS", "PILOT_SEED", "REGIMES", "SEEDS",
    "TAUS", "choose_regime", "choose_tau", "lenet_config", "log_norm_slope", "noise_val_fpr",
    "ood_confidence", "ood_measure", "ood_pool", "own_lr", "val_confidence_gap",
    "gradnorm_factor_table", "normalised_score_table", "test_fitted_temperature",
]

LABEL = "ch04_logitnorm"
#: OOD sets of each in-distribution dataset: natural images, and noise reported apart.
NATURAL_SETS = {"fashion_mnist": ("mnist", "animals", "letters"),
                "mnist": ("fashion_mnist", "animals", "letters")}
NOISE_SETS = ("gaussian", "uniform")
POOL, N_DRAW, N_DRAWS = 5000, 2000, 10
ODIN_T, ODIN_EPS = 1000.0, 0.0014
PILOT_LRS = (0.1, 0.05, 0.02, 0.01, 0.005)
PILOT_EPOCHS = 4
PILOT_SEED = 100
SEEDS = tuple(range(10))
TAUS = (0.005, 0.01, 0.02, 0.04, 0.08)
NOISE_VAL, NOISE_VAL_SEED = 2000, 1
#: The official recipe (weight decay, 20,000 images, 30 epochs) and the candidates of a
#: regime in which cross-entropy's norm may keep growing: no weight decay, fewer images
#: or longer training. Cheapest first.
OFFICIAL: dict[str, Any] = {"weight_decay": 5e-4, "train_subset": 20000, "epochs": 30}
REGIMES: tuple[dict[str, Any], ...] = (
    {"weight_decay": 0.0, "train_subset": 5000, "epochs": 60},
    {"weight_decay": 0.0, "train_subset": 20000, "epochs": 30})


def lenet_config(loss: str = "ce", tau: float | None = None, seed: int = 0, lr: float = 0.05,
                 dataset: str = "fashion_mnist", weight_decay: float = 5e-4,
                 train_subset: int = 20000, epochs: int = 30, smoke: bool = False,
                 model: str = "lenet5") -> dict[str, Any]:
    """The chapter's recipe (the official one scaled down) for one run."""
    return default_config(
        dataset=dataset, model=model, model_options={}, lr=lr, momentum=0.9, batch_size=128,
        weight_decay=weight_decay, schedule="step", milestones=[0.4, 0.7], lr_gamma=0.1,
        epochs=3 if smoke else epochs, augment=True,
        flip=True if dataset == "fashion_mnist" else None,
        train_subset=1000 if smoke else train_subset, test_subset=500 if smoke else None,
        val_size=1000 if smoke else 5000, seed=seed, loss=loss,
        loss_options={"tau": tau} if loss == "logitnorm" else {})


def _last(run: StoredRun, column: str) -> float:
    return float(run.history[column][-1])


def own_lr(pilot: Mapping[float, StoredRun]) -> float:
    """The pilot rate with the highest final validation accuracy (ties: the larger rate)."""
    if not pilot:
        raise ValueError("pilot must map at least one learning rate to its run")
    return max(pilot, key=lambda lr: (_last(pilot[lr], "val_acc"), lr))


def val_confidence_gap(run: StoredRun) -> float:
    """Mean max-softmax confidence minus accuracy on the run's validation images."""
    val_logits, val_labels = validation(run)
    probs = torch.softmax(val_logits.double(), dim=1)
    conf, pred = probs.max(dim=1)
    return float(conf.mean() - (pred == val_labels).double().mean())


@register_measure("log_norm_slope")
def log_norm_slope(run: StoredRun, index: Any = None, column: str = "val_logit_norm") -> float:
    r"""Least-squares slope of :math:`\log` (mean validation logit norm) against the epoch,
    over every epoch of the run: > 0 when the norm keeps growing over the trajectory."""
    if index is not None:
        raise ValueError("log_norm_slope is read from the training history: index must be None")
    values = np.asarray(run.history[column], dtype=float)
    if values.size < 2 or not np.all(values > 0):
        raise ValueError(f"run {run.path.name}: {column} needs >= 2 positive epochs")
    epochs = np.arange(1, values.size + 1, dtype=float)
    return float(np.polyfit(epochs, np.log(values), 1)[0])


def choose_regime(pilots: Sequence[StoredRun]) -> int:
    """Index of the regime (see the module's rule) among the cross-entropy pilot runs."""
    if not pilots:
        raise ValueError("pilots must hold one cross-entropy run per candidate regime")
    for i, run in enumerate(pilots):
        if log_norm_slope(run) > 0 and val_confidence_gap(run) > 0:
            return i
    return max(range(len(pilots)), key=lambda i: val_confidence_gap(pilots[i]))


@functools.lru_cache(maxsize=8)
def _splits(dataset: str) -> Any:
    return data.load_dataset(dataset, seed=0)


@functools.lru_cache(maxsize=8)
def ood_pool(dataset: str, kind: str = "natural", smoke: bool = False) -> dict[str, torch.Tensor]:
    """The chapter's OOD images for ``dataset``: ``POOL`` of each natural set or ``N_DRAW``
    of each noise set, drawn once with seed 0 (the same tensors the chapter scores)."""
    if kind not in ("natural", "noise"):
        raise ValueError(f"kind must be 'natural' or 'noise', got {kind!r}")
    if dataset not in NATURAL_SETS:
        raise ValueError(f"dataset must be one of {sorted(NATURAL_SETS)}, got {dataset!r}")
    pool, n_draw = (200, 100) if smoke else (POOL, N_DRAW)
    names = NATURAL_SETS[dataset] if kind == "natural" else NOISE_SETS
    return {name: data.ood_images(name, _splits(dataset), n=n_draw if kind == "noise" else pool,
                                  seed=0) for name in names}


def noise_val_fpr(run: StoredRun, device: str = "cpu") -> float:
    """FPR95 of the raw MSP: the run's validation images against ``NOISE_VAL`` Gaussian-noise
    images drawn with seed ``NOISE_VAL_SEED`` (never the test-time noise)."""
    noise = data.ood_images("gaussian", _splits(run.config["dataset"]), n=NOISE_VAL,
                            seed=NOISE_VAL_SEED)
    out = run_ood_logits(run, {"gaussian (validation)": noise}, device=device)
    return float(ood.fpr_at_tpr(ood.msp(validation(run)[0].double()),
                                ood.msp(out["gaussian (validation)"].double())))


def choose_tau(runs: Mapping[float, StoredRun], device: str = "cpu") -> float:
    """The tau whose LogitNorm run has the lowest validation noise FPR95 (ties: larger tau)."""
    if not runs:
        raise ValueError("runs must map at least one tau to its LogitNorm run")
    return min(runs, key=lambda t: (noise_val_fpr(runs[t], device), -t))


@register_measure("ood")
def ood_measure(run: StoredRun, index: Any = None, sets: str = "natural", score: str = "msp",
                metric: str = "fpr@95tpr", temperature: float | str = 1.0,
                device: str = "cpu") -> float:
    """A detection metric of one run, averaged over the OOD sets of ``sets`` (natural images or
    noise) and over ``N_DRAWS`` draws of ``N_DRAW`` images per set (the official protocol),
    all test images (or those of ``index``) as the positives.

    ``score``: ``msp``, ``max_logit``, ``energy`` or ``odin`` (ODIN at its own temperature
    ``ODIN_T`` and step ``ODIN_EPS``); ``temperature``: the logits are divided by it before
    scoring (a number, e.g. the energy's T, or ``"val"``: temperature scaling fitted on the
    run's validation logits). ``metric``: ``fpr@95tpr``, ``auroc`` or ``aupr_in``.
    """
    pool = ood_pool(run.config["dataset"], sets)
    if score == "odin":
        if temperature != 1.0:
            raise ValueError("odin brings its own temperature: temperature must be 1.0")
        logits = run_odin_logits(run, {"ID test": run_test_images(run)} | pool,
                                 temperature=ODIN_T, epsilon=ODIN_EPS, device=device)
        id_logits, out, t, name = logits.pop("ID test"), logits, ODIN_T, "msp"
    else:
        out, id_logits, name = run_ood_logits(run, pool, device=device), run.test_logits, score
        t = (calibrators.TemperatureScaling().fit(*validation(run)).temperature_
             if temperature == "val" else float(temperature))
    if index is not None:
        id_logits = id_logits[torch.as_tensor(index, dtype=torch.long)]
    table = ood.mean_over_draws(
        lambda drawn: ood.score_report(id_logits, drawn, name, temperature=t,
                                       averages={"average": list(drawn)}),
        out, N_DRAW, N_DRAWS)
    value = float(table.loc["average", metric])
    if not math.isfinite(value):
        raise ValueError(f"run {run.path.name}: {metric} is not finite")
    return value


@register_measure("ood_confidence")
def ood_confidence(run: StoredRun, index: Any = None, sets: str = "natural",
                   device: str = "cpu") -> float:
    r"""Mean maximum softmax probability of the run on OOD images,
    :math:`\frac{1}{S}\sum_s \frac{1}{N_s}\sum_{x \in s} \max_k \sigma(f(x))_k`, averaged over
    the OOD sets of ``sets`` (each set's whole pool, weighted equally): how sure the network
    is of a class the image does not have."""
    if index is not None:
        raise ValueError("ood_confidence reads the OOD images, not the test images: index must "
                         "be None")
    out = run_ood_logits(run, ood_pool(run.config["dataset"], sets), device=device)
    return float(np.mean([torch.softmax(x.double(), 1).max(1).values.mean().item()
                          for x in out.values()]))


def compute_runs(smoke: bool = False, device: str = "cpu", mnist: bool = True,
                 log: Callable[[str], None] | None = None,
                 use_store: bool = True, train: bool = True) -> dict[str, Any]:
    """Train and store (or load) every LeNet-5 run of the chapter, stage by stage through the
    executor (:func:`~calnotes.runs.executor.chapter_runs`): the pilots, the
    selections by the module's rules, then the claims' seeds, each followed by its OOD logits
    (plain and ODIN) so that the stored run holds what the measures read. SMOKE: two rates,
    two taus, two seeds, tiny runs in a scratch store.

    ``train=False`` (with the store, not SMOKE) trains nothing: the pilots must be stored
    (:class:`~calnotes.runs.store.RunNotFound` otherwise) and a claims' seed that is not
    stored is left out of ``runs``, so that its arm's claims wait for it.

    Returns ``lrs`` {loss: rate}, ``regime`` (config overrides), ``taus`` {setting: tau},
    ``lr_pilot`` {(loss, rate): run}, ``regime_pilots`` [run per candidate], ``tau_pilots``
    {setting: {tau: run}} and ``runs`` {(setting, loss, seed): run} with the settings
    ``official``, ``regime`` and ``mnist``.
    """
    if not isinstance(train, bool):
        raise TypeError(f"train must be a bool, got {type(train).__name__}")
    stored_only = not train and use_store and not smoke

    def runs_of(configs: Sequence[Mapping[str, Any]]) -> list[StoredRun | None]:
        """The runs of ``configs`` in order, trained together by the executor where missing
        (Ray on this machine's cores when installed), or, trained nothing, the stored ones
        (``None`` for a missing run, which only the claims' seeds may be)."""
        if stored_only:
            out: list[StoredRun | None] = []
            for config in configs:
                try:
                    out.append(load_or_run(dict(config), label=LABEL, compute=False,
                                           device=device))
                except RunNotFound:
                    out.append(None)
        else:
            out = list(chapter_runs([dict(c) for c in configs], label=LABEL,
                                    use_store=use_store, smoke=smoke, device=device))
        for config, r in zip(configs, out, strict=True):
            if log is not None and r is not None:
                log(f"{r.path.name} {config['loss']} {config.get('loss_options')} "
                    f"lr {config['lr']} seed {config['seed']} wd {config['weight_decay']} "
                    f"n {config['train_subset']}: {r.provenance['seconds']:.0f} s")
        return out

    def stored(configs: Sequence[Mapping[str, Any]]) -> list[StoredRun]:
        """The pilots: every one must be stored (or trained)."""
        out = runs_of(configs)
        for config, r in zip(configs, out, strict=True):
            if r is None:
                raise RunNotFound(f"chapter 4's pilot is not stored: {dict(config)}")
        return out  # type: ignore[return-value]

    def with_ood(r: StoredRun) -> StoredRun:
        dataset = r.config["dataset"]
        for kind in ("natural", "noise"):
            run_ood_logits(r, ood_pool(dataset, kind, smoke), device=device)
        run_odin_logits(r, {"ID test": run_test_images(r)} | ood_pool(dataset, "natural", smoke),
                        temperature=ODIN_T, epsilon=ODIN_EPS, device=device)
        return r

    pilot_lrs, taus_grid = (PILOT_LRS[-2:], TAUS[1::2]) if smoke else (PILOT_LRS, TAUS)
    seeds = SEEDS[:2] if smoke else SEEDS
    lr_keys = [(loss, lr) for loss in ("ce", "logitnorm") for lr in pilot_lrs]
    lr_pilot = dict(zip(lr_keys, stored(
        [lenet_config(loss, 0.04 if loss == "logitnorm" else None, 0, lr,
                      epochs=PILOT_EPOCHS, smoke=smoke) for loss, lr in lr_keys]), strict=True))
    lrs = {loss: own_lr({lr: r for (name, lr), r in lr_pilot.items() if name == loss})
           for loss in ("ce", "logitnorm")}
    regime_pilots = stored([lenet_config("ce", None, PILOT_SEED, lrs["ce"], smoke=smoke,
                                         **regime) for regime in REGIMES])
    regime = REGIMES[choose_regime(regime_pilots)]
    tau_pilots = {"official": dict(zip(taus_grid, stored(
        [lenet_config("logitnorm", t, PILOT_SEED, lrs["logitnorm"], smoke=smoke, **OFFICIAL)
         for t in taus_grid]), strict=True))}
    chosen = choose_tau(tau_pilots["official"], device)
    # one tau for every setting: the regime and MNIST in distribution use the official choice
    taus = {"official": chosen, "regime": chosen, "mnist": chosen}
    # seed by seed, the regime first, so that runs stopped early leave complete pairs
    plan = [(seed, name, setting, "fashion_mnist") for seed in seeds
            for name, setting in (("regime", regime), ("official", OFFICIAL))]
    plan += [(seed, "mnist", OFFICIAL, "mnist") for seed in seeds[:5]] if mnist else []
    keys = [(name, loss, seed) for seed, name, _, _ in plan for loss in ("ce", "logitnorm")]
    configs = [lenet_config(loss, taus[name] if loss == "logitnorm" else None, seed, lrs[loss],
                            dataset=dataset, smoke=smoke, **setting)
               for seed, name, setting, dataset in plan for loss in ("ce", "logitnorm")]
    # a missing run (only without training) leaves its arm's claims waiting for it
    runs = {key: with_ood(r) for key, r in zip(keys, runs_of(configs), strict=True)
            if r is not None}
    return {"lrs": lrs, "regime": regime, "taus": taus, "lr_pilot": lr_pilot,
            "regime_pilots": regime_pilots, "tau_pilots": tau_pilots, "runs": runs}


# --- The exercises' solutions --------------------------------------------------------------

def _unit(z: torch.Tensor) -> torch.Tensor:
    z = z.double()
    return z / z.norm(dim=1, keepdim=True).clamp_min(1e-12)


def _detection(scores: Callable[[torch.Tensor], Any], test_logits: torch.Tensor,
               ood_logits: Mapping[str, torch.Tensor]) -> dict[str, dict[str, float]]:
    s_in = scores(test_logits)
    return {name: {"FPR95 (%)": 100 * ood.fpr_at_tpr(s_in, scores(z)),
                   "AUROC (%)": 100 * ood.auroc(s_in, scores(z))}
            for name, z in ood_logits.items()}


def normalised_score_table(test_logits: torch.Tensor, ood_logits: Mapping[str, torch.Tensor],
                           tau: float) -> pd.DataFrame:
    r"""FPR95 and AUROC (%) per OOD set of three scores of one network's logits :math:`f`:
    the raw MSP, the MSP of :math:`f / (\tau \lVert f\rVert)` (what LogitNorm's loss sees)
    and the maximum cosine :math:`\max_c f_c / \lVert f\rVert`."""
    scores = {"raw MSP": lambda z: ood.msp(z.double()),
              "MSP of f/(tau ||f||)": lambda z: ood.msp(_unit(z) / tau),
              "max cosine": lambda z: _unit(z).max(dim=1).values}
    return pd.concat({name: pd.DataFrame(_detection(fn, test_logits, ood_logits)).T
                      for name, fn in scores.items()}, names=["score", "OOD set"])


def gradnorm_factor_table(test_logits: torch.Tensor, ood_logits: Mapping[str, torch.Tensor],
                          temperature: float = 1.0) -> pd.DataFrame:
    r"""The logit factor of GradNorm, :math:`\lVert k\,\mathrm{softmax}(f/T) - 1\rVert_1`,
    as a score on its own: its mean on the test images and each OOD set, and FPR95 and
    AUROC (%) per OOD set. (The other factor, :math:`\lVert h\rVert_1`, needs the
    network's penultimate features.)"""
    def factor(z: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(z.double() / temperature, dim=1)
        return (p.shape[1] * p - 1).abs().sum(dim=1)

    table = pd.DataFrame(_detection(factor, test_logits, ood_logits)).T
    table["mean factor"] = [float(factor(z).mean()) for z in ood_logits.values()]
    table.loc["ID (test)", "mean factor"] = float(factor(test_logits).mean())
    return table


def test_fitted_temperature(run: StoredRun, n_bins: int = 15) -> pd.DataFrame:
    """Temperature scaling fitted (NLL) on the validation logits, as the chapter does, and
    on the test logits it is then scored on, as the official code's ``--optimal_t`` does:
    the temperature and the test ECE (%) and NLL of each, beside the raw network."""
    from calnotes import metrics

    if run.val_logits is None or run.val_labels is None:
        raise ValueError(f"run {run.path.name} has no validation logits to fit a temperature")
    rows = {"raw": 1.0}
    fits: dict[str, tuple[torch.Tensor, torch.Tensor]] = {
        "TS fitted on validation": (run.val_logits, run.val_labels),
        "TS fitted on test": (run.test_logits, run.test_labels)}
    for name, (z, y) in fits.items():
        rows[name] = float(calibrators.TemperatureScaling().fit(z, y).temperature_)
    out = {}
    for name, t in rows.items():
        probs = torch.softmax(run.test_logits.double() / t, dim=1)
        out[name] = {"T": t, "test ECE (%)": 100 * float(metrics.ece(probs, run.test_labels,
                                                                     n_bins=n_bins)),
                     "test NLL": float(metrics.nll(probs, run.test_labels))}
    return pd.DataFrame(out).T
