"""Chapter 7's measures: the split protocol against the library's SplitConformal, the
guarantee on a run whose labels are drawn from its own softmax, and bad options."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from calnotes import conformal as cf
from calnotes.book.evidence import ch07


def fake_run(n: int = 2000, c: int = 5, seed: int = 0, name: str = "fake"):
    g = torch.Generator().manual_seed(seed)
    logits = 2.0 * torch.randn(n, c, generator=g)
    labels = torch.multinomial(torch.softmax(logits.double(), 1), 1, generator=g).squeeze(1)
    val = 2.0 * torch.randn(500, c, generator=g)
    val_y = torch.multinomial(torch.softmax(val.double(), 1), 1, generator=g).squeeze(1)
    return SimpleNamespace(test_logits=logits, test_labels=labels, val_logits=val,
                           val_labels=val_y, path=Path(f"/nonexistent/{name}-{seed}"))


def test_lac_splits_equal_the_library_split_by_split():
    run = fake_run()
    got = ch07.conformal_splits(run, score="lac", alpha=0.1, splits=5)
    p = torch.softmax(run.test_logits.double(), 1)
    for r in range(5):
        perm = torch.randperm(p.shape[0], generator=torch.Generator().manual_seed(r))
        cal, ev = perm[:1000], perm[1000:]
        sets = cf.prediction_sets(p[cal], run.test_labels[cal], p[ev], 0.1, "lac")
        # the same float64 scores and the same order statistic: equal, not close
        assert got["coverage"][r] == cf.coverage(sets, run.test_labels[ev])
        assert got["size"][r] == cf.set_size(sets)


def test_splits_run_on_one_thread_and_restore_the_setting(monkeypatch):
    seen = []
    scores = cf.class_scores

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return scores(*args, **kwargs)

    monkeypatch.setattr(cf, "class_scores", spy)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ch07.conformal_splits(fake_run(), splits=2)
        assert seen == [1, 1] and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)


def test_raps_without_penalty_is_aps():
    run = fake_run(seed=1)
    aps = ch07.conformal_splits(run, score="aps", randomized=True, splits=3)
    raps = ch07.conformal_splits(run, score="raps", randomized=True, lam=0.0, splits=3)
    np.testing.assert_array_equal(aps["size"], raps["size"])


@pytest.mark.parametrize("opts", [{"score": "lac"}, {"score": "aps", "randomized": True},
                                  {"score": "raps", "randomized": True},
                                  {"score": "lac", "mondrian": True},
                                  {"score": "aps", "randomized": True, "temperature": "val"}])
def test_mean_coverage_over_splits_is_within_the_band(opts):
    """Labels drawn from the run's own softmax are exchangeable: each split's coverage lies
    in the guarantee's band, up to the rate the band allows (40 splits, 99.9% band: more
    than 3 outside has probability below 1e-4 even were the splits independent)."""
    run = fake_run(seed=2)
    res = ch07.conformal_splits(run, alpha=0.1, splits=40, **opts)
    lo, hi = cf.coverage_band(1000, 1000, 0.1, level=0.999)
    assert int(((res["coverage"] < lo) | (res["coverage"] > hi)).sum()) <= 3


def test_measure_and_tables():
    run = fake_run(seed=3)
    cov = ch07.conformal(run, metric="coverage", score="lac", splits=4)
    assert cov == ch07.conformal_splits(run, score="lac", splits=4)["coverage"].mean()
    table = ch07.conformal_table({"A": {0: run}}, alphas=(0.1,), scores=("lac",),
                                 temperatures=(None, "val"), splits=2)
    assert len(table) == 2 and set(table["ts"]) == {True, False}
    classes = ch07.class_coverage_table({0: run}, splits=2)
    assert list(classes.columns) == ["class", "LAC", "APS", "Mondrian LAC"]
    conf = ch07.confidence_coverage_table(run, splits=2, n_bins=4)
    assert len(conf) == 8 and conf["coverage"].between(0, 1).all()


@pytest.mark.parametrize("kwargs,word", [
    ({"metric": "width"}, "metric"), ({"index": [0]}, "index"),
    ({"score": "thr"}, "score"), ({"temperature": "test"}, "temperature"),
    ({"shift": "rotate"}, "level")])
def test_bad_options_are_refused(kwargs, word):
    with pytest.raises(ValueError, match=word):
        ch07.conformal(fake_run(), splits=1, **kwargs)


def test_raps_k_reg_from_the_rank_matrix_is_the_library_rule():
    run = fake_run(seed=4)
    p = torch.softmax(run.test_logits.double(), 1)
    ranks = ch07._ranks(p).gather(1, run.test_labels[:, None]).squeeze(1)
    torch.testing.assert_close(ranks.long(), cf.true_label_rank(p, run.test_labels))
    assert min(5, cf.conformal_quantile(ranks, 0.1)) == cf.raps_k_reg(p, run.test_labels, 0.1)
