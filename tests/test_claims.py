"""calnotes.runs.claims: claims files validated, arms resolved from a store, the design
chosen (paired, Welch, bootstrap, study), premises and the CLI's table."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from calnotes import stats as st
from calnotes.runs import claims as cl
from calnotes.runs.experiment import default_config
from calnotes.runs.store import RunStore
from tests.test_store import fake_result

ECE = {  # per seed: the two arms share each seed's split, with a common seed offset
    "ce": [0.060, 0.080, 0.050, 0.070],
    "focal": [0.050, 0.069, 0.041, 0.060],
}


@pytest.fixture(autouse=True)
def _trained(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake runs' logits are random (chance accuracy): here every run counts as
    trained; tests/test_claims_semantics.py tests the rule itself."""
    monkeypatch.setattr(cl, "did_not_train", lambda logits, labels: None)
    monkeypatch.setattr(cl, "_TRAINED", {})


@pytest.fixture()
def store(tmp_path: Path) -> RunStore:
    return make_store(tmp_path)


def make_store(tmp_path: Path) -> RunStore:
    """Runs of two arms sharing each seed's split, and of another label and split."""
    s = RunStore(tmp_path / "results")
    for loss, values in ECE.items():
        for seed, value in enumerate(values):
            cfg = {"loss": loss, "seed": seed}
            if loss == "focal":
                cfg["loss_options"] = {"gamma": 2.0}
            s.save(fake_result(cfg, seed=seed, ece=value), label="chXX")
    # A run of another label and a split of its own (another train subset), for Welch.
    for seed, value in enumerate([0.02, 0.03, 0.025]):
        s.save(fake_result({"loss": "cross_entropy", "seed": seed, "train_subset": 20},
                           seed=10 + seed, ece=value), label="other")
    return s


#: CE overconfident (the premise) and focal loss lowering the ECE, which rests on it; a
#: test appends its own test line for the second claim.
PREMISED = """  - id: ce-overconfident
    claim: CE's stored ECE is above 4%.
    work: guo2017calibration
    where: Section 3
    test: {a: CE, statistic: test_ece, scale: 100, unit: points, direction: above, null: 4}
  - id: focal-lowers-ece
    claim: Focal loss lowers the ECE.
    work: guo2017calibration
    where: Table 1
    premise: ce-overconfident
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "XX.yaml"
    path.write_text(text, encoding="utf-8")
    return path


ARMS = """
chapter: "XX"
arms:
  CE: {label: chXX, where: {loss: ce}}
  FL: {label: chXX, where: {loss: focal, loss_options.gamma: 2.0}}
  SMALL: {label: other, where: {loss: cross_entropy}}
  CE1: {label: chXX, where: {loss: ce}, seeds: [0]}
  FL1: {label: chXX, where: {loss: focal}, seeds: [0]}
claims:
"""


def test_paired_design_and_verdicts(tmp_path: Path, store: RunStore) -> None:
    path = write(tmp_path, ARMS + PREMISED + """
    key: true
    test: {a: FL, b: CE, statistic: test_ece, scale: 100, unit: points, direction: below,
           paper: -3.0}
""")
    table = cl.evaluate_claims(path, store).set_index("id")
    row = table.loc["focal-lowers-ece"]
    diffs = 100 * (np.array(ECE["focal"]) - np.array(ECE["ce"]))
    expected = st.one_sample_effect(diffs)
    assert row["design"] == "paired t over seeds" and row["n"] == 4
    assert (row["low"], row["high"]) == pytest.approx((expected.low, expected.high))
    # -3 lies beyond the interval's far end: the direction holds, the size is ruled out
    assert row["verdict"] == st.SIZE_RULED_OUT_DIRECTION
    assert table.loc["ce-overconfident", "design"] == "one-sample t over seeds"
    assert table.loc["ce-overconfident", "verdict"] == st.REPRODUCES
    assert "detectable at 80% power" in row["evidence"]
    assert row["key"]


def test_failed_premise_stands_beside_the_verdict(tmp_path: Path, store: RunStore) -> None:
    path = write(tmp_path, ARMS + """
  - id: ce-very-overconfident
    claim: CE's ECE is above 20%.
    work: guo2017calibration
    where: Section 3
    test: {a: CE, statistic: test_ece, scale: 100, direction: above, null: 20}
  - id: focal-lowers-ece
    claim: Focal loss lowers the ECE.
    work: guo2017calibration
    where: Table 1
    premise: ce-very-overconfident
    test: {a: FL, b: CE, statistic: test_ece, direction: below}
""")
    table = cl.evaluate_claims(path, store).set_index("id")
    assert table.loc["ce-very-overconfident", "verdict"] == st.FAILS
    # the claim's own verdict stands; the premise's state is noted beside it
    assert table.loc["focal-lowers-ece", "verdict"] == st.REPRODUCES
    assert table.loc["focal-lowers-ece", "premise_state"] == "fails here"
    assert table.loc["focal-lowers-ece", "high"] < 0
    # the chapter's table renders a premise on its claim only, beside claims without one
    from calnotes.book.claims import _ClaimsView

    view = _ClaimsView.__new__(_ClaimsView)
    view.chapter, view.table = "00", table.reset_index()
    page = view._repr_html_()
    assert page.count('class="claim-premise"') == 1
    assert "premise: ce-very-overconfident" in page


def test_unpaired_arms_fall_back_to_welch(tmp_path: Path, store: RunStore) -> None:
    path = write(tmp_path, ARMS + """
  - id: small-lower
    claim: The small run has the lower ECE.
    work: guo2017calibration
    where: Figure 2
    test: {a: SMALL, b: CE, statistic: test_ece, direction: below}
""")
    row = cl.evaluate_claims(path, store).iloc[0]
    assert row["design"] == "Welch (unpaired) over seeds"
    welch = st.welch_effect([0.02, 0.03, 0.025], ECE["ce"])
    assert (row["low"], row["high"]) == pytest.approx((welch.low, welch.high))


def test_one_seed_is_bootstrapped_on_shared_test_indices(tmp_path: Path,
                                                         store: RunStore) -> None:
    path = write(tmp_path, ARMS + """
  - id: one-seed
    claim: Focal loss changes the error.
    work: guo2017calibration
    where: Table 1
    test: {a: FL1, b: CE1, statistic: error, direction: below, resamples: 200,
           design: bootstrap}
  - id: one-seed-no-design
    claim: Focal loss changes the error.
    work: guo2017calibration
    where: Table 1
    test: {a: FL1, b: CE1, statistic: error, direction: below}
""")
    table = cl.evaluate_claims(path, store)
    row = table.iloc[0]
    assert row["design"] == "bootstrap" and row["n"] == 40
    assert row["low"] <= row["estimate"] <= row["high"]
    one = table.iloc[1]  # one seed and no declared bootstrap: an estimate, no interval
    assert one["n"] == 1 and math.isnan(one["low"]) and one["verdict"] == st.INCONCLUSIVE


def test_not_testable_and_study_claims(tmp_path: Path, store: RunStore,
                                       monkeypatch) -> None:
    monkeypatch.setitem(cl.STUDIES, "halves", lambda n: np.full(n, 0.5) +
                        np.linspace(-0.1, 0.1, n))
    path = write(tmp_path, ARMS + """
  - id: cifar
    claim: On CIFAR-100 the ECE is 10%.
    work: guo2017calibration
    where: Table 1
    not_testable: CIFAR-100 cannot be downloaded here.
  - id: study
    claim: The study's effect is positive.
    work: guo2017calibration
    where: Section 4
    test: {study: halves, options: {n: 11}, direction: above}
""")
    table = cl.evaluate_claims(path, store).set_index("id")
    assert table.loc["cifar", "verdict"] == st.NOT_TESTABLE
    assert table.loc["study", "verdict"] == st.REPRODUCES
    assert table.loc["study", "estimate"] == pytest.approx(0.5)
    assert table.loc["study", "declared"] == "computed when the book is built"


def test_computed_measures_agree_with_the_library(store: RunStore) -> None:
    from calnotes import metrics

    run = store.load(default_config(loss="ce", seed=1))
    probs = torch.softmax(run.test_logits.double(), dim=1)
    assert cl.run_measure("ece", run, bins=10, binning="mass") == pytest.approx(
        float(metrics.ece(probs, run.test_labels, n_bins=10, binning="quantile")))
    assert cl.run_measure("test_ece", run) == pytest.approx(ECE["ce"][1])
    idx = torch.arange(10)
    assert cl.run_measure("error", run, index=idx) == pytest.approx(
        float(metrics.error(probs[:10], run.test_labels[:10])))
    ts = cl.run_measure("ece", run, temperature="val")
    assert math.isfinite(ts)
    with pytest.raises(ValueError, match="cannot be bootstrapped"):
        cl.run_measure("test_ece", run, index=idx)
    with pytest.raises(ValueError, match="unknown measure"):
        cl.run_measure("no_such_thing", run)


@pytest.mark.parametrize("body, message", [
    ("  - {id: Bad_Id, claim: x, work: k, where: w, not_testable: y}\n", "id must be"),
    ("  - {id: a, claim: x, work: k, where: w}\n", "either a test or not_testable"),
    ("  - {id: a, claim: x, work: k, where: w, test: {a: NOPE, statistic: e, "
     "direction: below}}\n", "names no arm"),
    ("  - {id: a, claim: x, work: k, where: w, test: {a: CE, statistic: e, "
     "direction: up}}\n", "direction must be"),
    ("  - {id: a, claim: x, work: k, where: w, premise: b, not_testable: y}\n",
     "premise names no claim"),
    ("  - {id: a, claim: x, work: k, where: w, not_testable: y}\n"
     "  - {id: a, claim: x, work: k, where: w, not_testable: y}\n", "id used twice"),
    ("  - {id: a, claim: x, work: k, where: w, not_testable: y, colour: red}\n",
     "unknown field"),
    ("  - {id: a, claim: x, work: k, where: w, premise: b, not_testable: y}\n"
     "  - {id: b, claim: x, work: k, where: w, premise: a, not_testable: y}\n", "cycle"),
])
def test_bad_claims_files_name_the_file_and_the_claim(tmp_path: Path, body: str,
                                                      message: str) -> None:
    path = write(tmp_path, ARMS + body)
    with pytest.raises(ValueError, match=message) as err:
        cl.load_claims(path)
    assert str(path) in str(err.value)


def test_an_arm_selecting_two_runs_of_a_seed_is_refused(tmp_path: Path,
                                                        store: RunStore) -> None:
    path = write(tmp_path, ARMS.replace("CE: {label: chXX, where: {loss: ce}}",
                                        "CE: {label: chXX}") + """
  - id: a
    claim: x
    work: k
    where: w
    test: {a: CE, statistic: test_ece, direction: below}
""")
    with pytest.raises(ValueError, match="two runs of seed"):
        cl.evaluate_claims(path, store)


def test_every_book_claims_file_loads() -> None:
    from calnotes.book.claims import CLAIMS_DIR

    for path in sorted(CLAIMS_DIR.glob("*.yaml")):
        spec = cl.load_claims(path)
        assert spec["claims"], path


def test_forest_plot_draws_one_row_per_interval(tmp_path: Path, store: RunStore) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from calnotes.plots import forest_plot

    path = write(tmp_path, ARMS + """
  - id: focal-lowers-ece
    claim: Focal loss lowers the ECE.
    work: guo2017calibration
    where: Table 1
    test: {a: FL, b: CE, statistic: test_ece, scale: 100, unit: points, direction: below,
           paper: -3.0}
  - id: cifar
    claim: On CIFAR-100 the ECE is 10%.
    work: guo2017calibration
    where: Table 1
    not_testable: CIFAR-100 cannot be downloaded here.
""")
    table = cl.evaluate_claims(path, store)
    fig = forest_plot(table)
    assert len(fig.axes[0].get_yticklabels()) == 1  # the untestable claim has no interval
    std = forest_plot(table, standardized=True)
    xs = std.axes[0].collections[0].get_segments()[0][:, 0]
    assert xs[1] - xs[0] == pytest.approx(2.0)  # each interval is x ± 1
    with pytest.raises(ValueError, match="lacks the column"):
        forest_plot(table.drop(columns="verdict"))


def test_cite_text_reads_the_bibliography() -> None:
    from calnotes.book.claims import cite_text

    assert cite_text("guo2017calibration", "Table 1") == "Guo et al. (2017), Table 1"
    assert cite_text("wang2023metareg", "Figure 5") == "Wang & Golebiowski (2024), Figure 5"


def test_a_claim_whose_arm_has_no_run_yet_is_reported_inconclusive(tmp_path: Path,
                                                                    store: RunStore) -> None:
    path = write(tmp_path, ARMS.replace("CE1: {label: chXX, where: {loss: ce}, seeds: [0]}",
                                        "CE1: {label: chXX, where: {loss: ce}, seeds: [9]}")
                 + """
  - id: waits
    claim: x
    work: k
    where: w
    test: {a: CE1, statistic: test_ece, direction: below}
""")
    row = cl.evaluate_claims(path, store).iloc[0]
    assert row["verdict"] == st.INCONCLUSIVE and row["n"] == 0
    assert "no stored run of arm 'CE1'" in row["evidence"]

def test_the_claims_view_renders_claims_with_and_without_a_premise(
        tmp_path: Path, store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from calnotes.book import claims as bc

    path = write(tmp_path, ARMS + PREMISED + """
    test: {a: FL, b: CE, statistic: test_ece, scale: 100, unit: points, direction: below}
  - id: no-premise-after-one
    claim: Focal loss lowers the ECE (no premise).
    work: guo2017calibration
    where: Table 1
    test: {a: FL, b: CE, statistic: test_ece, scale: 100, unit: points, direction: below}
""")
    table = cl.evaluate_claims(path, store)
    monkeypatch.setattr(bc, "claims_table", lambda chapter: table.copy())
    page = bc._ClaimsView("01")._repr_html_()
    assert page.count("premise: ce-overconfident") == 1
    assert page.count('<tr id="claim-01-') == 3


@pytest.mark.parametrize("arm, message", [
    ("{label: chXX, options: 3}", "options must be a mapping"),
    ("{label: chXX, seeds: 0}", "seeds must be a non-empty list of ints"),
    ("{label: chXX, seeds: [true]}", "seeds must be a non-empty list of ints"),
])
def test_bad_arms_are_named(tmp_path: Path, arm: str, message: str) -> None:
    path = write(tmp_path, ARMS.replace("SMALL: {label: other, where: {loss: cross_entropy}}",
                                        f"SMALL: {arm}")
                 + "  - {id: a, claim: x, work: k, where: w, not_testable: y}\n")
    with pytest.raises(ValueError, match=message) as err:
        cl.load_claims(path)
    assert "arm 'SMALL'" in str(err.value)


def test_declaration_is_found_for_the_exact_id_only(tmp_path: Path, store: RunStore) -> None:
    import subprocess

    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    body = ARMS + """
  - id: focal-lowers-ece-10
    claim: x
    work: k
    where: w
    test: {a: FL, b: CE, statistic: test_ece, direction: below, null: 0}
"""  # `null:` unquoted: YAML reads the key as None, which the definition must survive
    path = write(tmp_path, body)
    git("add", "XX.yaml")
    git("commit", "-qm", "first")
    first = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, text=True,
                           capture_output=True, check=True).stdout.strip()
    path.write_text(body.replace("focal-lowers-ece-10", "focal-lowers-ece-100")
                    + body[len(ARMS):], encoding="utf-8")
    git("commit", "-qam", "second")
    runs = [store.load(default_config(loss="ce", seed=0))]
    for run in runs:
        run.provenance["git_commit"] = first
    # the -10 claim was declared in the first commit (an ancestor of the runs' commit)
    assert cl._declared(path, "focal-lowers-ece-10", runs) == "before its runs"
    # the -100 claim was declared in the second, after the runs' commit
    assert cl._declared(path, "focal-lowers-ece-100", runs) == "after its runs"


def test_a_test_edited_after_its_runs_is_dated_by_the_edit(tmp_path: Path,
                                                           store: RunStore) -> None:
    # Declared, runs stored at that commit, then the claim's test (or an arm it names)
    # edited: the claim now says it came after its runs; an unrelated edit changes nothing.
    import subprocess

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=tmp_path, check=True, text=True,
                              capture_output=True).stdout.strip()

    git("init", "-q")
    git("config", "user.email", "t@example.org")
    git("config", "user.name", "t")
    body = ARMS + """
  - id: focal-lowers-ece
    claim: x
    work: k
    where: w
    test: {a: FL, b: CE, statistic: test_ece, direction: below}
"""
    path = write(tmp_path, body)
    git("add", "XX.yaml")
    git("commit", "-qm", "declared")
    runs = [store.load(default_config(loss="ce", seed=0))]
    runs[0].provenance["git_commit"] = git("rev-parse", "HEAD")
    path.write_text(body.replace("claim: x", "claim: x, reworded"), encoding="utf-8")
    git("commit", "-qam", "wording only")
    cl._git.cache_clear()
    assert cl._declared(path, "focal-lowers-ece", runs) == "before its runs"
    path.write_text(path.read_text().replace("CE: {label: chXX, where: {loss: ce}}",
                                             "CE: {label: chXX, where: {loss: ce, seed: 0}}"),
                    encoding="utf-8")
    git("commit", "-qam", "an arm the claim names changed")
    cl._git.cache_clear()
    assert cl._declared(path, "focal-lowers-ece", runs) == "after its runs"
    path.write_text(path.read_text().replace("statistic: test_ece", "statistic: ece"),
                    encoding="utf-8")
    cl._git.cache_clear()
    assert cl._declared(path, "focal-lowers-ece", runs) == "not yet committed"


def test_an_arm_may_name_a_selection_rule(tmp_path: Path, store: RunStore,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    chosen = {"loss": "focal"}

    def rule(s: RunStore) -> dict:
        assert s is store  # the rule reads the store the evaluator reads
        if chosen is None:
            raise cl.RunNotFound("the rule's candidate of 4 epochs is not stored")
        return dict(chosen)

    monkeypatch.setitem(cl.RULES, "pick-loss", rule)
    path = write(tmp_path, ARMS.replace("claims:", "  RULED: {label: chXX, rule: pick-loss}\n"
                                                   "claims:") + """  - id: ruled
    claim: The ruled arm's stored ECE is above 4%.
    work: guo2017calibration
    where: Section 3
    test: {a: RULED, statistic: test_ece, scale: 100, unit: points, direction: above, null: 4}
""")
    row = cl.evaluate_claims(path, store).set_index("id").loc["ruled"]
    assert row["n"] == len(ECE["focal"])
    assert row["estimate"] == pytest.approx(100 * np.mean(ECE["focal"]))
    assert set(cl.arm_runs(path, "RULED", store)) == set(range(len(ECE["focal"])))
    chosen = None  # the rule cannot choose yet: the claim waits, it does not crash
    row = cl.evaluate_claims(path, store).set_index("id").loc["ruled"]
    assert row["verdict"] == st.INCONCLUSIVE and "cannot choose yet" in row["evidence"]
    monkeypatch.delitem(cl.RULES, "pick-loss")
    with pytest.raises(ValueError, match="unknown selection rule 'pick-loss'"):
        cl.evaluate_claims(path, store)
    bad = write(tmp_path, ARMS.replace("claims:", "  RULED: {label: chXX, rule: 3}\nclaims:")
                + PREMISED)
    with pytest.raises(ValueError, match="rule must name a selection rule"):
        cl.load_claims(bad)
