"""Chapter 6's ranking study without the methods that did not train
(calnotes/book/evidence/ch06.py: trained_methods, shift_rank_transfer_trained), on the
chapter's stored runs."""

from __future__ import annotations

import pandas as pd
import pytest

from calnotes.book.evidence import ch06
from calnotes.runs import shift as S
from calnotes.runs.store import RunStore
from calnotes.runs.verdicts import CHANCE_MARGIN


def test_a_method_that_did_not_train_leaves_the_ranking():
    store = RunStore()  # the chapter's stored runs
    names = ch06.trained_methods((0, 1, 2), store)
    for name in S.SHIFT_METHODS:  # the rule by hand: accuracy clear of chance in every seed
        runs = [store.load(S.method_config(name, ch06.BASE, s)) for s in (0, 1, 2)]
        accuracy = min(float((r.test_logits.argmax(1) == r.test_labels).double().mean())
                       for r in runs)
        assert (name in names) == (accuracy > 1 / 10 + CHANCE_MARGIN), name
    assert "CE" in names and "LogitNorm" not in names  # chapter 6's LogitNorm diverged
    got = ch06.shift_rank_transfer_trained(seeds=(0,), store=store)
    by_method = {name: store.load(S.method_config(name, ch06.BASE, 0)) for name in names}
    assert got.shape == (1,)
    assert got[0] == pytest.approx(S.rank_transfer(by_method, "ece", "rotate", 60), abs=1e-12)


def test_claims_glue_reads_the_table_and_the_stored_runs():
    store = RunStore()
    ids = [*ch06.CLAIMS_GLUED, "ensemble-vs-logitnorm"]
    table = pd.DataFrame({"id": ids, "n": 3, "estimate": range(len(ids)),
                          "low": -1.0, "high": 9.0})
    table.loc[table["id"] == "degrade-logitnorm", "estimate"] = float("nan")
    out = ch06.claims_glue(table, (0, 1, 2), store)
    runs = [store.load(S.method_config("LogitNorm", ch06.BASE, s)) for s in (0, 1, 2)]
    accuracy = 100 * (1 - sum(r.metrics["test_error"] for r in runs) / 3)
    assert out["ch06_logitnorm_acc"] == pytest.approx(accuracy, rel=1e-12)
    assert out["ch06_claim_seeds"] == 3
    assert out["ch06_ts_iid_estimate"] == ids.index("ts-iid")
    assert out["ch06_degrade_logitnorm_effect"] == "no interval"
    trained = ch06.trained_methods((0, 1, 2), store)
    assert out["ch06_n_ranked"] == len(trained)
    assert out["ch06_not_ranked"] == (", ".join(m for m in S.SHIFT_METHODS
                                                if m not in trained) or "none")
    with pytest.raises(ValueError, match="lacks the claims"):
        ch06.claims_glue(table[table["id"] != "ts-iid"], (0, 1, 2), store)
