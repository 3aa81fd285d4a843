"""Chapter 7's measures: split conformal sets on the stored runs of chapters 5 and 6.

The protocol of ``book/claims/07.yaml``: a run's test set is split at random into a
calibration half and an evaluation half, ``splits`` times (split ``r`` drawn with seed
``r``); a number is the mean over the splits. Temperature scaling (``temperature="val"``)
is fitted by NLL on the run's validation logits. Under a shift the calibration half is
read unshifted and the evaluation half shifted (the run's stored logits on its first
``n_images`` test images, :func:`calnotes.runs.shift.run_shift_logits`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from calnotes import conformal as cf
from calnotes._threads import cpu_threads
from calnotes.calibrators import TemperatureScaling
from calnotes.runs import shift as shifts
from calnotes.runs.claims import register_measure
from calnotes.runs.store import StoredRun

__all__ = ["METRICS", "class_coverage_table", "confidence_coverage_table", "conformal",
           "conformal_splits", "conformal_table", "shift_coverage_table"]

#: What :func:`conformal` can return, each a mean over the splits.
METRICS = ("coverage", "size", "hard_coverage")
_TEMPERATURES: dict[str, float] = {}
_SPLITS: dict[tuple[str, tuple[tuple[str, Any], ...]], dict[str, np.ndarray]] = {}


def _temperature(run: StoredRun) -> float:
    key = str(run.path.resolve())
    if key not in _TEMPERATURES:
        if run.val_logits is None or run.val_labels is None:
            raise ValueError(f"run {run.path.name} stores no validation logits")
        ts = TemperatureScaling().fit(run.val_logits.double(), run.val_labels)
        _TEMPERATURES[key] = float(ts.temperature_)
    return _TEMPERATURES[key]


def _pools(run: StoredRun, temperature: str | None, shift: str | None, level: float | None,
           n_images: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(calibration probs, evaluation probs, labels, raw evaluation confidences)."""
    if temperature not in (None, "val"):
        raise ValueError(f"temperature must be None or 'val', got {temperature!r}")
    if shift is None:
        cal_logits = ev_logits = run.test_logits.double()
        labels = run.test_labels
    else:
        if level is None:
            raise ValueError("a shift needs a level")
        cal_logits = run.test_logits[:n_images].double()
        ev_logits = shifts.run_shift_logits(run, shift, [level], n_images=n_images)[level]
        ev_logits = ev_logits.double()
        labels = run.test_labels[:n_images]
    raw_conf = torch.softmax(ev_logits, dim=1).amax(dim=1)
    t = _temperature(run) if temperature == "val" else 1.0
    return (torch.softmax(cal_logits / t, dim=1), torch.softmax(ev_logits / t, dim=1),
            labels.long(), raw_conf)


def _ranks(p: torch.Tensor) -> torch.Tensor:
    """Rank of every class (1 = most probable; ties in class order), as float64."""
    order = torch.argsort(-p, dim=1, stable=True)
    ranks = torch.empty_like(order)
    ranks.scatter_(1, order, torch.arange(1, p.shape[1] + 1).expand_as(order).contiguous())
    return ranks.double()


@cpu_threads(1)
def conformal_splits(run: StoredRun, *, score: str = "lac", alpha: float = 0.1,
                     splits: int = 100, randomized: bool = False, lam: float = 0.01,
                     temperature: str | None = None, shift: str | None = None,
                     level: float | None = None, n_images: int = 1000,
                     fraction: float = 0.1, mondrian: bool = False) -> dict[str, np.ndarray]:
    """Per split: ``coverage``, ``size``, ``hard_coverage`` (on the ``fraction`` of the
    evaluation half least confident as trained) and ``class_coverage (splits, C)``.

    The scores of the whole pool are computed once (a randomized score draws each image's
    ``u`` once, independently of the splits, which keeps the images exchangeable); RAPS's
    ``k_reg`` is chosen on each calibration half (:func:`calnotes.conformal.raps_k_reg`).
    One intra-op thread: the operations are small (1,000 x C), so a second thread gains
    nothing, and while another process holds a core each operation waits on the thread that
    lost it (20 splits of three runs took 16-17 s with one thread, 48-258 s with two, on a
    2-core machine with one other busy process).
    """
    if score not in cf.SCORES:
        raise ValueError(f"score must be one of {cf.SCORES}, got {score!r}")
    cal_p, ev_p, labels, raw_conf = _pools(run, temperature, shift, level, n_images)
    base = "lac" if score == "lac" else "aps"
    s_cal = torch.as_tensor(cf.class_scores(cal_p, base, randomized=randomized,
                                            generator=torch.Generator().manual_seed(0)))
    s_ev = torch.as_tensor(cf.class_scores(ev_p, base, randomized=randomized,
                                           generator=torch.Generator().manual_seed(1)))
    r_cal, r_ev = _ranks(cal_p), _ranks(ev_p)
    n, c = cal_p.shape
    out: dict[str, list[Any]] = {"coverage": [], "size": [], "hard_coverage": [],
                                 "class_coverage": []}
    for r in range(int(splits)):
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(r))
        cal, ev = perm[: n // 2], perm[n // 2:]
        sc, se = s_cal[cal], s_ev[ev]
        if score == "raps":
            # raps_k_reg's rule on the ranks computed once: the conformal quantile of the
            # true labels' ranks in the calibration half
            k = min(c, cf.conformal_quantile(r_cal[cal].gather(1, labels[cal][:, None])
                                             .squeeze(1), alpha))
            sc = sc + lam * (r_cal[cal] - k).clamp(min=0)
            se = se + lam * (r_ev[ev] - k).clamp(min=0)
        true = sc.gather(1, labels[cal][:, None]).squeeze(1)
        if mondrian:
            q = torch.tensor([cf.conformal_quantile(true[labels[cal] == j], alpha)
                              if bool((labels[cal] == j).any()) else float("inf")
                              for j in range(c)], dtype=torch.float64)
        else:
            q = torch.tensor(cf.conformal_quantile(true, alpha), dtype=torch.float64)
        sets = se <= q
        y = labels[ev]
        out["coverage"].append(cf.coverage(sets, y))
        out["size"].append(cf.set_size(sets))
        hard = torch.argsort(raw_conf[ev], stable=True)[: max(1, int(fraction * len(ev)))]
        out["hard_coverage"].append(cf.coverage(sets[hard], y[hard]))
        out["class_coverage"].append(cf.class_coverage(sets, y))
    return {k: np.asarray(v, dtype=float) for k, v in out.items()}


@register_measure("conformal")
def conformal(run: StoredRun, index: Any = None, metric: str = "coverage",
              **options: Any) -> float:
    """Mean over the splits of :func:`conformal_splits`'s ``metric`` (one of
    :data:`METRICS`); answered over seeds, so ``index`` is not supported."""
    if index is not None:
        raise ValueError("conformal is a per-seed measure: it takes no index")
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    # one computation per run and protocol serves every metric the claims ask of it
    key = (str(Path(run.path).resolve()), tuple(sorted(options.items())))
    if key not in _SPLITS:
        _SPLITS[key] = conformal_splits(run, **options)
    return float(_SPLITS[key][metric].mean())


def conformal_table(runs: Mapping[str, Mapping[int, StoredRun]], *,
                    alphas: Sequence[float] = (0.1, 0.05),
                    scores: Sequence[str] = ("lac", "aps", "raps"),
                    temperatures: Sequence[str | None] = (None, "val"),
                    splits: int = 100) -> pd.DataFrame:
    """Long table ``method, seed, score, alpha, ts, coverage, size`` (means over splits;
    APS and RAPS randomized, as in the claims)."""
    rows = []
    for method, by_seed in runs.items():
        for seed, run in by_seed.items():
            for score in scores:
                for alpha in alphas:
                    for t in temperatures:
                        res = conformal_splits(run, score=score, alpha=alpha, splits=splits,
                                               randomized=score != "lac", temperature=t)
                        rows.append({"method": method, "seed": seed, "score": score.upper(),
                                     "alpha": alpha, "ts": t == "val",
                                     "coverage": res["coverage"].mean(),
                                     "size": res["size"].mean()})
    return pd.DataFrame(rows)


def class_coverage_table(runs: Mapping[int, StoredRun], *, alpha: float = 0.1,
                         splits: int = 100) -> pd.DataFrame:
    """Coverage of each class (mean over splits and seeds) for LAC, APS and class-
    conditional (Mondrian) LAC: columns ``class`` and one per method."""
    methods: dict[str, dict[str, Any]] = {
        "LAC": {"score": "lac"}, "APS": {"score": "aps", "randomized": True},
        "Mondrian LAC": {"score": "lac", "mondrian": True}}
    cols = {}
    for name, opts in methods.items():
        per_seed = [np.nanmean(conformal_splits(run, alpha=alpha, splits=splits, **opts)
                               ["class_coverage"], axis=0) for run in runs.values()]
        cols[name] = np.mean(per_seed, axis=0)
    return pd.DataFrame({"class": np.arange(len(next(iter(cols.values())))), **cols})


def confidence_coverage_table(run: StoredRun, *, alpha: float = 0.1, splits: int = 20,
                              n_bins: int = 10) -> pd.DataFrame:
    """Coverage in ``n_bins`` equal-mass bins of the top-class probability (as trained),
    LAC and APS, averaged over splits: columns ``score, bin, confidence, coverage``."""
    cal_p, ev_p, labels, raw_conf = _pools(run, None, None, None, 0)
    n = labels.shape[0]
    rows = []
    for score in ("lac", "aps"):
        conf_sum = np.zeros(n_bins)
        cov_sum = np.zeros(n_bins)
        for r in range(splits):
            perm = torch.randperm(n, generator=torch.Generator().manual_seed(r))
            cal, ev = perm[: n // 2], perm[n // 2:]
            sets = cf.prediction_sets(cal_p[cal], labels[cal], ev_p[ev], alpha, score,
                                      randomized=score == "aps", seed=r)
            mean, cov, _ = cf.binned_coverage(sets, labels[ev], raw_conf[ev], n_bins)
            conf_sum += mean
            cov_sum += cov
        rows += [{"score": score.upper(), "bin": b, "confidence": conf_sum[b] / splits,
                  "coverage": cov_sum[b] / splits} for b in range(n_bins)]
    return pd.DataFrame(rows)


def shift_coverage_table(runs: Mapping[int, StoredRun], levels: Sequence[float], *,
                         shift: str = "rotate", alpha: float = 0.1, splits: int = 100,
                         n_images: int = 1000) -> pd.DataFrame:
    """Coverage and size under ``shift`` at each level (calibrated unshifted):
    columns ``seed, score, level, coverage, size``."""
    rows = []
    for seed, run in runs.items():
        for score in ("lac", "aps"):
            for level in levels:
                res = conformal_splits(run, score=score, alpha=alpha, splits=splits,
                                       randomized=score == "aps", shift=shift, level=level,
                                       n_images=n_images)
                rows.append({"seed": seed, "score": score.upper(), "level": level,
                             "coverage": res["coverage"].mean(), "size": res["size"].mean()})
    return pd.DataFrame(rows)
