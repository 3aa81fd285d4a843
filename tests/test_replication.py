"""calnotes.book.replication: verdict sides, agreement of the two rounds, the replication
table from the book's claims table and the plan, and the winner's curse."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from calnotes import stats as st
from calnotes.book import replication as rep


@pytest.mark.parametrize("verdict, expected", [
    (st.REPRODUCES, "supported"), (st.LARGER, "supported"),
    (st.SIZE_RULED_OUT_DIRECTION, "supported"),
    (st.REPRODUCES + " (premise inconclusive)", "supported"),
    (st.FAILS, "contradicted"), (st.FAILS + " (premise fails here)", "contradicted"),
    (st.INCONCLUSIVE, "open"), (st.SIZE_RULED_OUT, "open"), (st.NOT_TESTABLE, "open"),
])
def test_side(verdict: str, expected: str) -> None:
    assert rep.side(verdict) == expected


def test_side_refuses_a_non_string() -> None:
    with pytest.raises(TypeError, match="verdict"):
        rep.side(None)  # type: ignore[arg-type]


@pytest.mark.parametrize("a, b, expected", [
    (st.REPRODUCES, st.REPRODUCES, "replicated"),
    (st.FAILS, st.FAILS, "confirmed a failure"),
    (st.INCONCLUSIVE, st.REPRODUCES, "newly decided"),
    (st.REPRODUCES, st.INCONCLUSIVE, "not replicated"),
    (st.REPRODUCES, st.FAILS, "reversed"),
    (st.INCONCLUSIVE, st.SIZE_RULED_OUT, "both open"),
])
def test_agreement(a: str, b: str, expected: str) -> None:
    assert rep.agreement(a, b) == expected
    assert expected in rep.AGREEMENTS


def _book() -> pd.DataFrame:
    return pd.DataFrame([
        {"id": "x", "chapter": "02", "work": "w", "estimate": 2.0, "low": 1.0, "high": 3.0,
         "n": 5, "verdict": st.REPRODUCES, "under_way": False},
        {"id": "c-x", "chapter": "02", "work": "w", "estimate": 1.5, "low": 0.9, "high": 2.1,
         "n": 8, "verdict": st.REPRODUCES, "declared": "before its runs", "under_way": False},
        {"id": "y", "chapter": "02", "work": "w", "estimate": -1.0, "low": -3.0, "high": 1.0,
         "n": 3, "verdict": st.INCONCLUSIVE, "under_way": False},
        {"id": "c-y", "chapter": "02", "work": "w", "estimate": -0.5, "low": -2.0,
         "high": 1.0, "n": 2, "verdict": st.INCONCLUSIVE, "under_way": True},
    ])


def _plan() -> pd.DataFrame:
    return pd.DataFrame([
        {"claim": "c-x", "twin": "x", "sesoi": 1.0, "alpha": 0.01, "planned": 8,
         "power_planned": 0.9},
        {"claim": "c-y", "twin": "y", "sesoi": 1.0, "alpha": 0.01, "planned": 6,
         "power_planned": 0.5},
    ])


def test_replication_table_reads_finished_claims_and_waits_for_the_rest() -> None:
    table = rep.replication_table(_book(), _plan()).set_index("claim")
    assert table.loc["c-x", "agreement"] == "replicated"
    assert table.loc["c-x", "ratio"] == pytest.approx(0.75)
    # post hoc power: sd from the interval's half-width over t_{0.975, 7}
    from scipy import stats as sp
    se = 0.6 / sp.t.ppf(0.975, 7)
    assert table.loc["c-x", "power_achieved"] == pytest.approx(
        st.power_t(1.0, se * math.sqrt(8), 8, 0.01))
    # the seeds a new round needs at this spread: the smallest n whose power reaches 80%
    needed = table.loc["c-x", "seeds_needed"]
    sd = se * math.sqrt(8)
    assert st.power_t(1.0, sd, int(needed), 0.01) >= 0.8 > st.power_t(1.0, sd,
                                                                      int(needed) - 1, 0.01)
    assert math.isnan(table.loc["c-y", "seeds_needed"])
    # a spread no affordable round detects the SESOI under: counted as infinite
    wide = _book()
    wide.loc[wide["id"] == "c-x", ["low", "high"]] = (-300.0, 303.0)
    assert rep.replication_table(wide, _plan()).set_index("claim").loc[
        "c-x", "seeds_needed"] == math.inf
    assert table.loc["c-y", "agreement"] == "under way"
    assert table.loc["c-y", "confirmatory_verdict"] == "under way (2 of 6)"
    assert math.isnan(table.loc["c-y", "confirmatory"])


def test_replication_table_takes_the_evaluators_reading_of_the_plan() -> None:
    # under way is the evaluator's call (its ``under_way`` column), not a recount here
    book = _book()
    book.loc[book["id"] == "c-x", "under_way"] = True
    table = rep.replication_table(book, _plan()).set_index("claim")
    assert table.loc["c-x", "agreement"] == "under way"
    assert math.isnan(table.loc["c-x", "power_achieved"])
    with pytest.raises(ValueError, match="under_way"):
        rep.replication_table(_book().drop(columns="under_way"), _plan())


def test_replication_table_prefers_the_adjusted_verdict() -> None:
    book = _book()
    book["verdict_adjusted"] = [st.REPRODUCES, st.INCONCLUSIVE, st.INCONCLUSIVE,
                                st.INCONCLUSIVE]
    table = rep.replication_table(book, _plan()).set_index("claim")
    assert table.loc["c-x", "agreement"] == "not replicated"


def test_replication_table_refuses_a_plan_naming_unknown_claims() -> None:
    plan = _plan()
    plan.loc[0, "twin"] = "nowhere"
    with pytest.raises(ValueError, match="nowhere"):
        rep.replication_table(_book(), plan)


def test_winners_curse_counts_supported_twins_only() -> None:
    table = rep.replication_table(_book(), _plan())
    curse = rep.winners_curse(table)
    assert curse == {"pairs": 1, "median_ratio": pytest.approx(0.75), "shrank": 1.0}


def test_read_plan_refuses_a_missing_file(tmp_path) -> None:
    with pytest.raises(ValueError, match="no confirmatory plan"):
        rep.read_plan(tmp_path / "plan.csv")


def test_the_stored_plan_reads() -> None:
    plan = rep.read_plan()
    assert len(plan) >= 20 and plan["claim"].str.startswith("c-").all()
    assert (plan["planned"] >= 4).all()


def test_held_up_groups_claims_by_work_and_where_the_fresh_seeds_left_them() -> None:
    table = rep.replication_table(_book(), _plan())
    assert rep.held_up(table) == {"w": {"Holds on fresh seeds": ["c-x"],
                                        "Still training": ["c-y"]}}
    for verdict, heading in [
            (st.FAILS, "Does not hold"), (st.INCONCLUSIVE, "Undecided on fresh seeds"),
            (st.SIZE_RULED_OUT_DIRECTION, rep.HELD_UP["direction"]),
            (st.SIZE_RULED_OUT, rep.HELD_UP["size"]),
            (st.LARGER + " (premise inconclusive)", "Holds on fresh seeds")]:
        table.loc[0, "confirmatory_verdict"] = verdict
        assert rep.held_up(table)["w"] == {heading: ["c-x"], "Still training": ["c-y"]}


def test_held_up_orders_works_by_year() -> None:
    table = pd.DataFrame({"work": ["wang2023metareg", "guo2017calibration"],
                          "claim": ["c-a", "c-b"], "agreement": ["under way"] * 2,
                          "confirmatory_verdict": ["under way (0 of 8)"] * 2})
    assert list(rep.held_up(table)) == ["guo2017calibration", "wang2023metareg"]


def test_held_up_html_links_each_claim_to_its_chapter_row() -> None:
    book = _book().assign(claim=["X holds.", "X holds.", "Y <b> holds.", "Y <b> holds."],
                          unit="points")
    out = rep.held_up_html(rep.replication_table(book, _plan()), book)
    assert "<strong>w</strong>: 2 claims on fresh seeds" in out
    assert out.index("Holds on fresh seeds (1)") < out.index("Still training (1)")
    assert 'href="02_diagnosing_miscalibration.html#claim-02-c-x">X holds.</a>' in out
    assert "+1.50 [+0.90, +2.10] points; first round: reproduces (replicated)" in out
    assert "Y &lt;b&gt; holds." in out and "2 of 6 seeds stored; first round: inconclusive" in out
    assert "-0.50" not in out  # no effect is read from a claim still training
    with pytest.raises(ValueError, match="claims table"):
        rep.held_up_html(rep.replication_table(_book(), _plan()), _book())


def test_confirmatory_sentence_reads_a_claim_only_at_its_planned_seeds() -> None:
    book = _book().assign(phase=["exploratory", "confirmatory"] * 2, planned_seeds=[0, 8, 0, 6],
                          unit="points", verdict_adjusted=[st.REPRODUCES, st.INCONCLUSIVE,
                                                           st.INCONCLUSIVE, st.INCONCLUSIVE])
    assert rep.confirmatory_sentence(book, "c-x") == (
        "+1.50 [+0.90, +2.10] points over 8 fresh seeds; verdict after Holm over the round: "
        "inconclusive")
    assert rep.confirmatory_sentence(book, "c-y") == (
        "under way, 2 of its 6 fresh seeds stored; nothing is read before the last")
    for wrong in ("x", "nowhere"):
        with pytest.raises(ValueError, match="claim_id"):
            rep.confirmatory_sentence(book, wrong)


def test_confirmatory_glue_names_each_claim_of_the_chapter_by_its_twin() -> None:
    book = _book().assign(phase=["exploratory", "confirmatory"] * 2, planned_seeds=[0, 8, 0, 6],
                          unit="points")
    plan = _plan().assign(chapter=[2, 3])
    glued = rep.confirmatory_glue("02", book, plan)
    assert glued == {"ch02_confirm_x": rep.confirmatory_sentence(book, "c-x")}
    assert rep.confirmatory_glue("04", book, plan) == {}
    with pytest.raises(ValueError, match="chapter"):
        rep.confirmatory_glue("two", book, plan)


def test_round_cost_sums_the_provenance_of_confirmatory_arms(tmp_path) -> None:
    from calnotes.runs import claims as cl
    from calnotes.runs.store import RunStore
    from tests.test_store import fake_result

    store = RunStore(tmp_path / "results")
    for seed in (0, 1000, 1001):
        store.save(fake_result({"loss": "ce", "seed": seed}, seed=seed), label="chXX")
    path = tmp_path / "XX.yaml"
    path.write_text("""chapter: XX
arms:
  CE: {label: chXX, where: {loss: ce}, seeds: [0]}
  c-CE: {label: chXX, where: {loss: ce}, seeds: [1000, 1001]}
claims:
  - id: a
    claim: c.
    work: w
    where: s
    test: {a: CE, statistic: test_ece, direction: above}
""", encoding="utf-8")
    cost = rep.round_cost({"XX": cl.load_claims(path)}, store)
    assert cost.to_dict("records") == [{"chapter": "XX", "runs": 2,
                                        "seconds": pytest.approx(2 * 123.4),
                                        "devices": "cpu"}]
