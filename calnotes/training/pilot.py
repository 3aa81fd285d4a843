"""The fast path's equivalence pilot: per-run measures and the paired equivalence test.

A regime's fast path (bfloat16 autocast, NHWC) is *equivalent* to float32 on a measure
``m`` when both one-sided paired t tests at level ``alpha`` reject, i.e. (two one-sided
tests, TOST) when the ``1 - 2 alpha`` Student-t interval of the mean paired difference
``d_s = m(fast, seed s) - m(float32, seed s)`` lies inside ``(-margin, +margin)``. A regime
passes only when every measure is equivalent.

Measures of one run (all computed in float64 from its stored float32 logits):
``error`` (top-1 test error), ``ece`` (15 equal-width bins), ``nll``, and for a meta run
``gamma_trajectory``: the mean over epochs of the per-epoch mean test gamma
``(1/E) sum_e gamma_mean_e``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from calnotes import metrics, stats

__all__ = ["MEASURES", "equivalence_row", "load_declaration", "margin_from_sd", "pilot_configs",
           "pilot_table", "run_measures"]

#: The pilot's measures, in table order.
MEASURES = ("error", "ece", "nll", "gamma_trajectory")


def run_measures(logits: Any, labels: Any, history: Mapping[str, Any] | None = None,
                 *, n_bins: int = 15) -> dict[str, float]:
    """``error``, ``ece`` (``n_bins`` equal-width bins) and ``nll`` of ``softmax(logits)``;
    with a ``history`` (``{"records": [...]}`` or a :class:`~calnotes.training.History`)
    whose records carry ``gamma_mean``, also ``gamma_trajectory``."""
    z = torch.as_tensor(logits).double()
    y = torch.as_tensor(labels).long()
    if z.ndim != 2 or y.ndim != 1 or z.shape[0] != y.shape[0]:
        raise ValueError(f"logits must be (N, C) and labels (N,), got {tuple(z.shape)} and "
                         f"{tuple(y.shape)}")
    p = torch.softmax(z, dim=1)
    out = {"error": float(metrics.error(p, y)), "ece": float(metrics.ece(p, y, n_bins=n_bins)),
           "nll": float(metrics.nll(p, y))}
    if history is not None:
        records = history["records"] if isinstance(history, Mapping) else list(history)
        gammas = [r.get("gamma_mean") for r in records]
        if gammas and all(g is not None for g in gammas):
            out["gamma_trajectory"] = float(np.mean(gammas))
    return out


def margin_from_sd(values: Sequence[float], fraction: float) -> float:
    """``fraction`` times the sample standard deviation (``ddof=1``) of ``values`` (one
    measure over the exploratory seeds of a regime)."""
    x = np.asarray(values, dtype=float)
    if x.ndim != 1 or x.size < 2:
        raise ValueError(f"values must hold at least two numbers, got {x.size}")
    if not fraction > 0:
        raise ValueError(f"fraction must be positive, got {fraction}")
    return float(fraction * x.std(ddof=1))


def equivalence_row(fast: Sequence[float], base: Sequence[float], margin: float,
                    alpha: float = 0.05) -> dict[str, Any]:
    """TOST of paired ``fast - base`` against ``margin`` at level ``alpha``: the mean
    difference, its ``1 - 2 alpha`` interval, the standard deviation of the differences,
    the two one-sided p values and ``equivalent`` (both below ``alpha``)."""
    if not margin > 0 or not math.isfinite(margin):
        raise ValueError(f"margin must be a positive number, got {margin}")
    if not 0 < alpha < 0.5:
        raise ValueError(f"alpha must be in (0, 0.5), got {alpha}")
    effect = stats.paired_effect(fast, base, level=1 - 2 * alpha)
    from scipy import stats as sps

    n, se = effect.n, effect.se
    if n < 2 or not se > 0:
        p_low = p_high = 0.0 if (n >= 2 and abs(effect.estimate) < margin) else 1.0
    else:
        p_low = float(sps.t.sf((effect.estimate + margin) / se, n - 1))   # H0: d <= -margin
        p_high = float(sps.t.cdf((effect.estimate - margin) / se, n - 1))  # H0: d >= +margin
    return {"n": n, "difference": effect.estimate, "low": effect.low, "high": effect.high,
            "sd_difference": se * math.sqrt(n), "margin": float(margin), "p_lower": p_low,
            "p_upper": p_high, "equivalent": bool(p_low < alpha and p_high < alpha)}


# --------------------------------------------------------------------------- the declaration


def load_declaration(path: str | Path) -> dict[str, Any]:
    """The pilot's declaration (YAML: ``label``, ``seeds``, ``alpha``, ``margin_fraction``,
    ``arms`` ``{name: config keys}`` with ``float32`` and ``fast``, ``regimes``
    ``{name: {config, measures, margins, exploratory}}``)."""
    import yaml

    path = Path(path)
    with open(path, encoding="utf-8") as f:
        decl = yaml.safe_load(f)
    missing = {"label", "seeds", "alpha", "margin_fraction", "arms", "regimes"} - set(decl or {})
    if missing:
        raise ValueError(f"{path}: the declaration lacks {sorted(missing)}")
    if set(decl["arms"]) != {"float32", "fast"}:
        raise ValueError(f"{path}: arms must be float32 and fast, got {sorted(decl['arms'])}")
    for name, spec in decl["regimes"].items():
        if set(spec["measures"]) - set(MEASURES) or set(spec["measures"]) != set(spec["margins"]):
            raise ValueError(f"{path}: regime {name!r} needs a margin for each of its measures "
                             f"(known measures: {', '.join(MEASURES)})")
    return decl


def pilot_configs(decl: Mapping[str, Any]) -> list[tuple[str, int, str, dict[str, Any]]]:
    """``(regime, seed, arm, config)`` in the declared training order: regime by regime,
    seed by seed, float32 before fast."""
    return [(regime, seed, arm, {**spec["config"], "seed": seed, **decl["arms"][arm]})
            for regime, spec in decl["regimes"].items() for seed in decl["seeds"]
            for arm in ("float32", "fast")]


def pilot_table(decl: Mapping[str, Any], load: Callable[[dict[str, Any]], Any]) -> list[dict]:
    """One row per regime and measure: :func:`equivalence_row` over the seeds whose two runs
    ``load(config)`` returns (objects with ``test_logits``, ``test_labels`` and a
    ``history``; ``None`` for a run not stored). A regime ``passes`` when all its seeds are
    complete and every measure is equivalent."""
    rows = []
    for regime, spec in decl["regimes"].items():
        values: dict[str, dict[str, list[float]]] = {"float32": {}, "fast": {}}
        seeds = []
        for seed in decl["seeds"]:
            runs = {arm: load({**spec["config"], "seed": seed, **decl["arms"][arm]})
                    for arm in ("float32", "fast")}
            if any(run is None for run in runs.values()):
                continue
            seeds.append(seed)
            for arm, run in runs.items():
                measured = run_measures(run.test_logits, run.test_labels, run.history.to_dict())
                for m in spec["measures"]:
                    values[arm].setdefault(m, []).append(measured[m])
        regime_rows = []
        for m in spec["measures"]:
            row: dict[str, Any] = {"regime": regime, "measure": m, "n": len(seeds),
                                   "margin": float(spec["margins"][m])}
            if len(seeds) >= 2:
                row.update(equivalence_row(values["fast"][m], values["float32"][m],
                                           spec["margins"][m], decl["alpha"]))
            else:  # one pair: its difference, no interval; none: nothing
                one = (values["fast"][m][0] - values["float32"][m][0]) if seeds else math.nan
                row.update(difference=one, low=math.nan, high=math.nan, equivalent=False)
            regime_rows.append(row)
        complete = len(seeds) == len(decl["seeds"])
        for row in regime_rows:
            row["passes"] = complete and all(r["equivalent"] for r in regime_rows)
        rows.extend(regime_rows)
    return rows
