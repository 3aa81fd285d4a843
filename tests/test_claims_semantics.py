"""calnotes.runs.claims and calnotes.runs.verdicts: a premise beside the claim's own
verdict, reported sizes ruled out, paper values on the claimed side, non-inferiority
margins, methods that did not train, seeds resampled first, multiplicity families and
counts by question."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from calnotes import stats as st
from calnotes.runs import claims as cl
from calnotes.runs import verdicts as vd
from calnotes.runs.store import RunStore
from tests.test_claims import ARMS, ECE, make_store, write


@pytest.fixture()
def store(tmp_path: Path) -> RunStore:
    return make_store(tmp_path)


@pytest.fixture()
def trained(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake runs' logits are random: count them as trained."""
    monkeypatch.setattr(cl, "did_not_train", lambda logits, labels: None)
    monkeypatch.setattr(cl, "_TRAINED", {})


def claim(cid: str, test: str, extra: str = "") -> str:
    return (f"  - id: {cid}\n    claim: x\n    work: k\n    where: w\n{extra}"
            f"    test: {{{test}}}\n")


def test_an_inconclusive_premise_is_noted_not_imposed(tmp_path: Path, store: RunStore,
                                                      trained: None) -> None:
    # CE's ECE (5-8%) against 6.5: inconclusive; the claim on it keeps its own verdict.
    path = write(tmp_path, ARMS
                 + claim("pre", "a: CE, statistic: test_ece, scale: 100, direction: above, "
                                "null: 6.5")
                 + claim("on-it", "a: FL, b: CE, statistic: test_ece, direction: below",
                         "    premise: pre\n"))
    table = cl.evaluate_claims(path, store).set_index("id")
    assert table.loc["pre", "verdict_raw"] == st.INCONCLUSIVE
    assert table.loc["on-it", "verdict"] == st.REPRODUCES
    assert table.loc["on-it", "premise_state"] == "inconclusive"
    assert "Premise 'pre': inconclusive" in table.loc["on-it", "evidence"]
    assert vd.premise_note("inconclusive") == "(premise inconclusive)"
    assert vd.premise_note("fails here") == "(premise fails here)"
    assert vd.premise_note("holds") == ""


@pytest.mark.parametrize("test, message", [
    ("direction: below, paper: 0.5", "other side of null"),
    ("direction: above, null: 1, paper: 0.5", "other side of null"),
    ("direction: below, margin: 1, null: 0", "margin .* or a null, not both"),
    ("direction: below, margin: -1", "non-inferiority margin"),
    ("direction: above, margin: 1", "non-inferiority margin"),
    ("direction: below, margin: .nan", "margin must be"),
])
def test_a_paper_value_or_margin_on_the_wrong_side_is_refused(tmp_path: Path, test: str,
                                                              message: str) -> None:
    path = write(tmp_path, ARMS + claim("c", f"a: FL, b: CE, statistic: test_ece, {test}"))
    with pytest.raises(ValueError, match=message) as err:
        cl.load_claims(path)
    assert str(path) in str(err.value) and "claim 'c'" in str(err.value)


def test_non_inferiority_tests_against_the_margin(tmp_path: Path, store: RunStore,
                                                 trained: None) -> None:
    # CE minus FL is about +1 point of ECE: "CE is no worse than FL by 2 points" holds
    # (the interval lies below +2); the paper's +1 (a small loss) is allowed beside it.
    path = write(tmp_path, ARMS + claim(
        "ni", "a: CE, b: FL, statistic: test_ece, scale: 100, direction: below, margin: 2, "
              "paper: 1.0"))
    row = cl.evaluate_claims(path, store).set_index("id").loc["ni"]
    assert row["null"] == 2 and row["margin"] == 2 and row["high"] < 2
    assert row["verdict"] == st.REPRODUCES
    assert "non-inferiority with margin +2" in row["evidence"]


def test_did_not_train_rule() -> None:
    labels = torch.arange(100) % 10
    good = torch.nn.functional.one_hot(labels, 10).double() * 5
    assert vd.did_not_train(good, labels) is None
    chance = torch.zeros(100, 10)
    chance[:, 0] = 1  # always class 0: 10% accuracy, chance for 10 classes
    assert "within 5 points of chance" in vd.did_not_train(chance, labels)
    # right on rows 0-5 and on the class-0 rows: 6 + 9 = 15% (within 5 points): not
    # trained; right on rows 0-6 as well: 16%, trained
    near = chance.clone()
    near[:6] = good[:6]
    assert vd.did_not_train(near, labels) is not None
    near[6] = good[6]
    assert vd.did_not_train(near, labels) is None
    nan = good.clone()
    nan[3, 2] = math.nan
    assert "non-finite" in vd.did_not_train(nan, labels)
    with pytest.raises(ValueError, match="logits must be"):
        vd.did_not_train(torch.zeros(3), labels)


def test_a_method_that_did_not_train_is_not_testable(tmp_path: Path,
                                                     store: RunStore) -> None:
    # The fake runs' logits are random over 4 classes: chance accuracy, so they did not
    # train by the declared rule.
    path = write(tmp_path, ARMS + claim("c", "a: FL, b: CE, statistic: test_ece, "
                                             "direction: below"))
    row = cl.evaluate_claims(path, store).set_index("id").loc["c"]
    assert row["verdict"] == st.NOT_TRAINED == row["verdict_raw"]
    assert "did not train" in row["evidence"] and math.isnan(row["p"])


def test_bootstrap_resamples_seeds_first(tmp_path: Path, store: RunStore,
                                         trained: None) -> None:
    path = write(tmp_path, ARMS
                 + claim("all", "a: FL, b: CE, statistic: ece, design: bootstrap, "
                                "direction: below, resamples: 200")
                 + claim("one", "a: FL1, b: CE1, statistic: ece, design: bootstrap, "
                                "direction: below, resamples: 200"))
    table = cl.evaluate_claims(path, store).set_index("id")
    assert table.loc["all", "design"] == cl.HIERARCHICAL and table.loc["all", "n"] == 4
    assert table.loc["all", "n_seeds"] == 4
    # the estimate is the mean of the seeds' effects on their full test sets
    runs_a, runs_b = cl.arm_runs(cl.load_claims(path), "FL", store), cl.arm_runs(
        cl.load_claims(path), "CE", store)
    each = [cl.run_measure("ece", runs_a[s]) - cl.run_measure("ece", runs_b[s])
            for s in sorted(runs_a)]
    assert table.loc["all", "estimate"] == pytest.approx(np.mean(each), rel=1e-12)
    assert table.loc["one", "design"] == "bootstrap" and table.loc["one", "n_seeds"] == 1
    assert "conditional on one trained network" in table.loc["one", "evidence"]
    assert "conditional on one trained network" not in table.loc["all", "evidence"]


def test_p_value_and_post_hoc_detectable(tmp_path: Path, store: RunStore,
                                         trained: None) -> None:
    path = write(tmp_path, ARMS + claim("c", "a: FL, b: CE, statistic: test_ece, "
                                             "scale: 100, direction: below"))
    row = cl.evaluate_claims(path, store).set_index("id").loc["c"]
    diffs = 100 * (np.array(ECE["focal"]) - np.array(ECE["ce"]))
    from scipy import stats as sps

    assert row["p"] == pytest.approx(sps.ttest_1samp(diffs, 0.0).pvalue, rel=1e-9)
    assert row["detectable"] == pytest.approx(
        st.detectable_effect_t(float(diffs.std(ddof=1)), 4, 0.05), rel=1e-9)
    assert "noncentral t, post hoc" in row["evidence"]


def test_a_claim_without_runs_says_so(tmp_path: Path, store: RunStore,
                                      trained: None) -> None:
    path = write(tmp_path, ARMS.replace("claims:", "  NONE: {label: nothing}\nclaims:")
                 + claim("c", "a: NONE, b: CE, statistic: test_ece, direction: below"))
    row = cl.evaluate_claims(path, store).set_index("id").loc["c"]
    assert row["declared"] == "declared; no runs yet"


def _book(rows: list[tuple[str, bool, str, float, str]]) -> pd.DataFrame:
    return pd.DataFrame([{"id": i, "key": k, "phase": ph, "p": p, "verdict_raw": v,
                          "claim": i, "question": ""} for i, k, ph, p, v in rows])


def test_adjusted_verdicts_by_family() -> None:
    table = _book([
        ("k1", True, "exploratory", 0.001, st.REPRODUCES),
        # Holm over the 3 key claims: 3(.001); max(.003, 2(.03)) = .06; max(.06, .04)
        ("k2", True, "exploratory", 0.03, st.REPRODUCES),
        ("k3", True, "exploratory", 0.04, st.FAILS),
        ("c1", False, "confirmatory", 0.03, st.FAILS),      # its own family of one: 0.03
        # BH over the 6 tested: 6(.04)/5 = .048, below 6(.5)/6
        ("e1", False, "exploratory", 0.04, st.SIZE_RULED_OUT_DIRECTION),
        ("e2", False, "exploratory", 0.5, st.INCONCLUSIVE),
        ("nt", False, "exploratory", math.nan, st.NOT_TESTABLE),
    ])
    out = vd.adjust_verdicts(table).set_index("id")
    assert out.loc["k1", "verdict"] == st.REPRODUCES
    assert out.loc["k2", "p_adjusted"] == pytest.approx(0.06)
    assert out.loc["k2", "verdict"] == st.INCONCLUSIVE
    assert out.loc["k2", "verdict_raw"] == st.REPRODUCES
    assert out.loc["k3", "verdict"] == st.INCONCLUSIVE and out.loc["k3", "adjusted"] == (
        vd.FAMILY_KEY)
    assert out.loc["c1", "adjusted"] == vd.FAMILY_CONFIRMATORY
    assert out.loc["c1", "verdict"] == st.FAILS
    assert out.loc["e1", "adjusted"] == vd.FAMILY_BH
    assert out.loc["e1", "p_adjusted"] == pytest.approx(0.048)
    assert out.loc["e1", "verdict"] == st.SIZE_RULED_OUT_DIRECTION
    assert out.loc["nt", "adjusted"] == "" and out.loc["nt", "verdict"] == st.NOT_TESTABLE
    with pytest.raises(ValueError, match="column 'p'"):
        vd.adjust_verdicts(table.drop(columns="p"))


def test_counts_by_question_and_by_claim() -> None:
    table = pd.DataFrame({
        "claim": ["a", "b", "c", "d"],
        "question": ["Q1", "Q1", "", "Q2"],
        "verdict": [st.REPRODUCES, st.FAILS, st.REPRODUCES, st.INCONCLUSIVE],
    })
    got = vd.counts(table)
    assert got["claims"] == {st.REPRODUCES: 2, st.FAILS: 1, st.INCONCLUSIVE: 1}
    # Q1 mixed; "c" is its own question; Q2 inconclusive
    assert got["questions"] == {"mixed": 1, st.REPRODUCES: 1, st.INCONCLUSIVE: 1}
