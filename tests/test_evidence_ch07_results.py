"""evidence.ch07_results: chapter 7's coverage-and-size figure and the numbers its prose
quotes, checked on a small table against the computation the chapter did inline."""

from __future__ import annotations

import itertools

import matplotlib
import numpy as np
import pandas as pd
import pytest

from calnotes.book.evidence import ch07_results

matplotlib.use("Agg")
ALPHAS = [0.1, 0.05]


def _table() -> pd.DataFrame:
    rng = np.random.default_rng(0)
    rows = [{"method": m, "score": s, "alpha": a, "ts": ts, "seed": seed,
             "coverage": 1 - a + rng.normal(0, 0.01), "size": rng.uniform(1, 3)}
            for m, s, a, ts, seed in itertools.product(
                ["CE", "Focal-best", "LS"], ["LAC", "APS", "RAPS"], ALPHAS, [False, True],
                [0, 1])]
    return pd.DataFrame(rows)


def test_glue_is_the_chapters_former_computation():
    table = _table()
    out = ch07_results.results_glue(table, ALPHAS)
    mean = table.groupby(["method", "score", "alpha", "ts"])[["coverage", "size"]].mean()
    assert out["ch07_ce_aps_ts_size"] == mean.loc[("CE", "APS", 0.1, True), "size"]
    assert out["ch07_ce_raps_cov"] == 100 * mean.loc[("CE", "RAPS", 0.1, False), "coverage"]
    last = table.loc[table["alpha"] == 0.05, "coverage"]
    assert out["ch07_cov_min_last"] == 100 * last.min()
    assert out["ch07_cov_max_last"] == 100 * last.max()
    assert (out["ch07_alpha"], out["ch07_alpha_last"]) == (0.1, 0.05)
    lac = table[(table["score"] == "LAC") & (table["alpha"] == 0.1) & ~table["ts"]]
    by_method = lac.groupby("method")["size"].mean()
    assert out["ch07_lac_size_argmin"] == by_method.idxmin()
    assert out["ch07_lac_size_max"] == by_method.max()
    assert len(out) == 2 * 2 * 3 + 4 + 2 + 4


def test_figure_has_a_coverage_and_a_size_row_per_level():
    fig = ch07_results.coverage_size_figure(_table(), ALPHAS)
    axes = np.array(fig.axes).reshape(2, 2)
    assert [ax.get_title() for ax in axes[:, 1]] == ["coverage, alpha = 0.05",
                                                     "size, alpha = 0.05"]
    # the guarantee's line on the coverage panels only
    assert any(np.allclose(line.get_ydata(), 0.95) for line in axes[0, 1].lines)
    one = ch07_results.coverage_size_figure(_table(), [0.1])
    assert len(one.axes) == 2


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="table must be a DataFrame"):
        ch07_results.results_glue([], ALPHAS)
    with pytest.raises(ValueError, match="lacks the columns"):
        ch07_results.results_glue(_table().drop(columns="size"), ALPHAS)
    with pytest.raises(ValueError, match="alphas must be levels"):
        ch07_results.coverage_size_figure(_table(), [0.2])
