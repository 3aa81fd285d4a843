"""Chapter 1's studies: the binned ECE and SECE as estimators of a known calibration error.

Every study draws synthetic binary predictions (:class:`calnotes.synthetic.SyntheticModel`)
with draw ``r`` seeded by ``SeedSequence([seed, n, r])``, computes every estimator on the same
draw, and returns one value per draw (a 1-D array), in probability units.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd
import torch

from calnotes import metrics
from calnotes.book.evidence.ch02_runs import WEIGHT_DECAY_GRID as WEIGHT_DECAY_GRID
from calnotes.book.evidence.ch02_runs import ch01_config, sweep_config
from calnotes.runs.claims import register_study
from calnotes.synthetic import SyntheticModel, estimator_study

DENSITIES = ("beta", "network")
SMOOTHING = ("accuracy", "both")
_GRID_STEP = 5e-4  # kernel-smoother grid spacing; see kernel_smooth


def _check(name: str, value: object, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return str(value)


@lru_cache(maxsize=1)
def network_beta() -> tuple[float, float]:
    """``(a, b)`` of ``0.5 + 0.5 Beta(a, b)`` fitted by moments to the test confidences of
    chapter 1's LeNet-5 (seed 0, the book's parameters; trained and stored first if the
    store lacks it): ``B = 2c - 1`` clipped to ``[1e-6, 1 - 1e-6]``, ``a = m k``,
    ``b = (1 - m) k`` with ``k = m (1 - m) / v - 1``."""
    from calnotes.runs.store import load_or_run

    run = load_or_run(ch01_config(0), label="ch01_measuring", progress=False)
    conf = torch.softmax(run.test_logits.double(), dim=1).max(dim=1).values.numpy()
    b = np.clip(2.0 * conf - 1.0, 1e-6, 1.0 - 1e-6)
    m, v = float(b.mean()), float(b.var())
    k = m * (1.0 - m) / v - 1.0
    return m * k, (1.0 - m) * k


def synthetic_model(curve: str, density: str) -> SyntheticModel:
    """The synthetic model of a study: calibration ``curve`` and confidence ``density``."""
    density = _check("density", density, DENSITIES)
    if density == "beta":
        return SyntheticModel(curve)
    a, b = network_beta()
    return SyntheticModel(curve, a=a, b=b)


def kernel_smooth(conf: np.ndarray, values: np.ndarray, bandwidth: float) -> np.ndarray:
    r"""Nadaraya-Watson average of ``values`` at each confidence,
    :math:`\sum_j K_{ij} v_j / \sum_j K_{ij}`, :math:`K_{ij} = e^{-(c_i - c_j)^2 / 2h^2}`.

    Samples are spread linearly onto a grid of spacing ``_GRID_STEP`` over ``[0, 1]``, the
    grid is convolved with the kernel and read back linearly: each kernel value moves by at
    most about ``(step / h)^2 / 8`` relative (1.3e-5 at h = 0.05), far below the effects
    the studies compare."""
    if bandwidth <= 0:
        raise ValueError(f"bandwidth must be positive, got {bandwidth!r}")
    cells = int(round(1.0 / _GRID_STEP))
    t = np.clip(conf, 0.0, 1.0) * cells
    left = np.minimum(np.floor(t).astype(int), cells - 1)
    frac = t - left
    half = int(math.ceil(8 * bandwidth / _GRID_STEP))
    kernel = np.exp(-0.5 * (np.arange(-half, half + 1) * _GRID_STEP / bandwidth) ** 2)

    def smooth(weights: np.ndarray) -> np.ndarray:
        grid = np.bincount(left, weights * (1 - frac), cells + 1)
        grid += np.bincount(left + 1, weights * frac, cells + 1)
        # "full" then the grid's own span: mode="same" would return the kernel's length,
        # misaligned, once the kernel is longer than the grid (h > 1/16)
        out = np.convolve(grid, kernel, mode="full")[half:half + cells + 1]
        return out[left] * (1 - frac) + out[left + 1] * frac

    return smooth(np.asarray(values, dtype=np.float64)) / smooth(np.ones_like(t))


def smooth_ece(conf: np.ndarray, correct: np.ndarray, bandwidth: float = 0.05,
               smooth: str = "accuracy") -> float:
    """SECE: mean ``|SACC_i - conf_i|`` (the paper's, ``smooth="accuracy"``) or mean
    ``|SACC_i - SCONF_i|`` with the confidence smoothed by the same weights (``"both"``)."""
    smooth = _check("smooth", smooth, SMOOTHING)
    soft_acc = kernel_smooth(conf, correct, bandwidth)
    target = conf if smooth == "accuracy" else kernel_smooth(conf, conf, bandwidth)
    return float(np.abs(soft_acc - target).mean())


def _draws(model: SyntheticModel, n: int, draws: int, seed: int):
    if isinstance(draws, bool) or not isinstance(draws, int) or draws < 2:
        raise ValueError(f"draws must be an int >= 2, got {draws!r}")
    for r in range(draws):
        yield model.sample(n, seed=np.random.SeedSequence([seed, n, r]))


@register_study("ch01_binned_bias")
def binned_bias(n: int, draws: int, bins: int = 15, curve: str = "overconfident",
                density: str = "beta", seed: int = 0) -> np.ndarray:
    """Per draw: the equal-width ``bins``-bin ECE minus the true calibration error."""
    model = synthetic_model(curve, density)
    truth = model.true_calibration_error()
    return np.array([float(metrics.ece(p, y, n_bins=bins)) - truth
                     for p, y in _draws(model, n, draws, seed)])


@register_study("ch01_bins_difference")
def bins_difference(n: int, draws: int, bins: tuple[int, int] = (100, 15),
                    curve: str = "overconfident", density: str = "beta",
                    seed: int = 0) -> np.ndarray:
    """Per draw: the ECE with ``bins[0]`` bins minus that with ``bins[1]``, same samples."""
    many, few = bins
    model = synthetic_model(curve, density)
    return np.array([float(metrics.ece(p, y, n_bins=many)) - float(metrics.ece(p, y, n_bins=few))
                     for p, y in _draws(model, n, draws, seed)])


@register_study("ch01_sece_vs_ece")
def sece_vs_ece(n: int, draws: int, density: str = "beta", smooth: str = "accuracy",
                bandwidth: float = 0.05, bins: int = 15, curve: str = "calibrated",
                seed: int = 0) -> np.ndarray:
    """Per draw: ``|SECE - truth| - |ECE_bins - truth|`` (negative: SECE the less biased)."""
    model = synthetic_model(curve, density)
    truth = model.true_calibration_error()
    out = []
    for probs, labels in _draws(model, n, draws, seed):
        conf, correct = probs[:, 1], labels.astype(np.float64)  # class 1 is predicted
        sece = smooth_ece(conf, correct, bandwidth, smooth)
        ece = float(metrics.ece(probs, labels, n_bins=bins))
        out.append(abs(sece - truth) - abs(ece - truth))
    return np.array(out)


def estimator_table(n: int, draws: int, density: str, curve: str = "calibrated",
                    bandwidth: float = 0.05, bins: int = 15,
                    seed: int = 0) -> dict[str, np.ndarray]:
    """Per-draw estimates of the 15-bin ECE and both SECEs, and the truth (for the prose)."""
    model = synthetic_model(curve, density)
    rows: dict[str, list[float]] = {"ECE": [], "SECE (paper)": [], "SECE (both smoothed)": []}
    for probs, labels in _draws(model, n, draws, seed):
        conf, correct = probs[:, 1], labels.astype(np.float64)
        rows["ECE"].append(float(metrics.ece(probs, labels, n_bins=bins)))
        rows["SECE (paper)"].append(smooth_ece(conf, correct, bandwidth, "accuracy"))
        rows["SECE (both smoothed)"].append(smooth_ece(conf, correct, bandwidth, "both"))
    out = {k: np.array(v) for k, v in rows.items()}
    out["truth"] = np.full(draws, model.true_calibration_error())
    return out


# --- The exercises' solutions --------------------------------------------------------------

def exercise_config(smoke: bool, **changes: Any) -> dict[str, Any]:
    """Chapter 2's sweep regime (2,000 images, 20 epochs: stored) with ``changes``; in SMOKE
    mode 200 training images, 1 epoch, so that the solution runs in seconds."""
    config = sweep_config(**changes)
    if smoke:
        config.update(epochs=1, train_subset=200, val_size=200, test_subset=500)
    return config


def compare_runs(runs: Mapping[str, Any]) -> pd.DataFrame:
    """One row per named run: test error, mean confidence and ECE (15 bins), and the drift of
    the validation ECE (its last value minus its smallest along training), all in %."""
    rows = {}
    for name, run in runs.items():
        probs = torch.softmax(run.test_logits.double(), dim=1)
        conf, correct = metrics.confidences_and_correct(probs, run.test_labels)
        val_ece = run.history.to_frame()["val_ece"]
        rows[name] = {"test error": 100 * (1 - float(correct.mean())),
                      "mean confidence": 100 * float(conf.mean()),
                      "test ECE": 100 * float(metrics.ece(probs, run.test_labels)),
                      "val. ECE drift": 100 * float(val_ece.iloc[-1] - val_ece.min())}
    return pd.DataFrame(rows).T


def bandwidth_table(n: int, draws: int, bandwidths: Sequence[float], density: str = "network",
                    seed: int = 0) -> pd.DataFrame:
    """Bias (mean estimate minus the truth, here 0) and spread (std over draws) of both SECEs
    on a calibrated model, one row per bandwidth, in %."""
    rows = {}
    for h in bandwidths:
        table = estimator_table(n, draws, density, bandwidth=h, seed=seed)
        for name in ("SECE (paper)", "SECE (both smoothed)"):
            error = table[name] - table["truth"]
            rows[(h, name)] = {"bias": 100 * error.mean(), "std": 100 * error.std(ddof=1)}
    frame = pd.DataFrame(rows).T
    frame.index.names = ["bandwidth", "estimator"]
    return frame


def l2_debiasing(sizes: Sequence[int], repeats: int, seed: int = 0,
                 bins: int = 15) -> pd.DataFrame:
    """Plug-in L2 ECE against the debiased L2 error on a calibrated model (true error 0): mean
    estimate per N in %, and the share of the plug-in's bias the correction removes."""
    model = SyntheticModel("calibrated")
    estimators = {
        "plug-in L2 ECE": lambda p, y: metrics.ece(p, y, n_bins=bins, norm="l2"),
        "debiased L2 error": lambda p, y: metrics.debiased_l2_ce(p, y, n_bins=bins),
    }
    study = estimator_study(model, sizes, estimators, repeats=repeats, seed=seed)
    table = 100 * study.groupby(["n", "estimator"])["error"].mean().unstack("estimator")
    table["bias removed (share)"] = 1 - table["debiased L2 error"] / table["plug-in L2 ECE"]
    return table
