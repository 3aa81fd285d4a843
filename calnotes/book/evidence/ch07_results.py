"""Chapter 7's results across training methods: the coverage-and-size figure and the
numbers its prose quotes, from the table of ``ch07.conformal_table``
(one row per method, score, miscoverage level, temperature scaling and seed).

matplotlib is imported when the figure is drawn, not when the claims' evaluator imports
this package.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["SCORES", "coverage_size_figure", "results_glue"]

#: The conformity scores of the chapter's table, in the order the prose names them.
SCORES = ("LAC", "APS", "RAPS")
_COLUMNS = {"method", "score", "alpha", "ts", "coverage", "size"}


def _check(table: Any, alphas: Sequence[float]) -> list[float]:
    if not isinstance(table, pd.DataFrame):
        raise TypeError(f"table must be a DataFrame, got {type(table).__name__}")
    missing = _COLUMNS - set(table.columns)
    if missing:
        raise ValueError(f"table lacks the columns {sorted(missing)}")
    levels = [float(a) for a in alphas]
    if not levels or any(a not in set(table["alpha"]) for a in levels):
        raise ValueError(f"alphas must be levels of the table, got {list(alphas)!r}")
    return levels


def coverage_size_figure(table: pd.DataFrame, alphas: Sequence[float]) -> Any:
    """Coverage (top row, with the dashed line at 1 - alpha) and mean set size (bottom
    row) of every method, one column per level of ``alphas``: per score and temperature
    (``+ TS``), the mean over seeds with a bar from the lowest to the highest seed."""
    import matplotlib.pyplot as plt

    levels = _check(table, alphas)
    fig, axes = plt.subplots(2, len(levels), figsize=(10, 6.5), sharey="row", squeeze=False)
    for col, alpha in enumerate(levels):
        sub = table[table["alpha"] == alpha]
        for row, metric in enumerate(("coverage", "size")):
            ax = axes[row, col]
            for k, ((score, ts), grp) in enumerate(sub.groupby(["score", "ts"])):
                g = grp.groupby("method", sort=False)[metric].agg(["mean", "min", "max"])
                x = np.arange(len(g)) + (k - 2.5) * 0.12
                ax.errorbar(x, g["mean"], yerr=[g["mean"] - g["min"], g["max"] - g["mean"]],
                            fmt="s" if ts else "o", ms=3,
                            label=f"{score}{' + TS' if ts else ''}")
            if metric == "coverage":
                ax.axhline(1 - alpha, ls="--", c="k", lw=0.8)
            ax.set_xticks(range(len(g)), g.index, rotation=60, fontsize=7)
            ax.set_title(f"{metric}, alpha = {alpha}", fontsize=9)
    axes[0, 0].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig


def results_glue(table: pd.DataFrame, alphas: Sequence[float]) -> dict[str, Any]:
    """The numbers the prose quotes, keyed by their glue names: cross-entropy's mean set
    size and coverage (in %) per score, with and without temperature scaling, at the first
    level; the range of the mean coverage over every row at the first and the last level;
    the least and the largest LAC set size over methods (and which) at the first level."""
    levels = _check(table, alphas)
    first, last = levels[0], levels[-1]
    out: dict[str, Any] = {}
    mean = table.groupby(["method", "score", "alpha", "ts"])[["coverage", "size"]].mean()
    for score in SCORES:
        for ts in (False, True):
            key = f"{score.lower()}{'_ts' if ts else ''}"
            out[f"ch07_ce_{key}_size"] = float(mean.loc[("CE", score, first, ts), "size"])
            out[f"ch07_ce_{key}_cov"] = 100 * float(mean.loc[("CE", score, first, ts),
                                                               "coverage"])
    for name, alpha in (("first", first), ("last", last)):
        cov = table.loc[table["alpha"] == alpha, "coverage"]
        out[f"ch07_cov_min_{name}"] = 100 * float(cov.min())
        out[f"ch07_cov_max_{name}"] = 100 * float(cov.max())
    out["ch07_alpha"], out["ch07_alpha_last"] = first, last
    lac = table[(table["score"] == "LAC") & (table["alpha"] == first) & ~table["ts"]]
    by_method = lac.groupby("method")["size"].mean()
    out["ch07_lac_size_min"] = float(by_method.min())
    out["ch07_lac_size_max"] = float(by_method.max())
    out["ch07_lac_size_argmin"] = str(by_method.idxmin())
    out["ch07_lac_size_argmax"] = str(by_method.idxmax())
    return out
