"""calnotes.runs.confirm: a claim's per-seed values as the evaluator computes them, the
power-chosen seeds of a confirmatory replication, shared arms, and the runs to train."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from calnotes import stats as st
from calnotes.runs import claims as cl
from calnotes.runs import confirm
from calnotes.runs.store import RunStore, config_hash
from tests.test_store import fake_result

ECE = {"ce": [0.060, 0.080, 0.050, 0.070], "focal": [0.050, 0.069, 0.041, 0.060]}

CLAIMS = """chapter: XX
arms:
  CE: {label: chXX, where: {loss: ce}}
  Focal: {label: chXX, where: {loss: focal}}
claims:
  - id: focal-lowers-ece
    claim: Focal loss lowers the ECE.
    work: guo2017calibration
    where: Table 1
    test: {a: Focal, b: CE, statistic: test_ece, scale: 100, unit: points, direction: below}
  - id: ce-above
    claim: CE's ECE is above 4%.
    work: guo2017calibration
    where: Section 3
    test: {a: CE, statistic: test_ece, scale: 100, unit: points, direction: above, null: 4}
"""


@pytest.fixture(autouse=True)
def _trained(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake runs' logits are random: every run counts as trained here."""
    if hasattr(cl, "did_not_train"):
        monkeypatch.setattr(cl, "did_not_train", lambda logits, labels: None)


@pytest.fixture()
def spec_store(tmp_path: Path) -> tuple[dict, RunStore]:
    store = RunStore(tmp_path / "results")
    for loss, values in ECE.items():
        for seed, value in enumerate(values):
            result = fake_result({"loss": loss, "seed": seed}, seed=seed, ece=value)
            store.save(result, label="chXX")
    path = tmp_path / "XX.yaml"
    path.write_text(CLAIMS, encoding="utf-8")
    return cl.load_claims(path), store


def test_claim_seed_values_are_the_paired_differences_in_shown_units(spec_store) -> None:
    spec, store = spec_store
    values = confirm.claim_seed_values(spec, "focal-lowers-ece", store)
    pairs = zip(ECE["focal"], ECE["ce"], strict=True)
    expected = {s: 100 * (f - c) for s, (f, c) in enumerate(pairs)}
    assert sorted(values) == [0, 1, 2, 3]
    for s, v in expected.items():
        assert values[s] == pytest.approx(v, abs=1e-9)
    # one arm: the values themselves
    one = confirm.claim_seed_values(spec, "ce-above", store)
    assert [one[s] for s in range(4)] == pytest.approx([100 * x for x in ECE["ce"]])
    # only the seeds asked for (a seed just trained), never one without its runs
    assert confirm.claim_seed_values(spec, "focal-lowers-ece", store, [2, 9]) == \
        pytest.approx({2: expected[2]})


def test_arm_seed_cost_reads_provenance(spec_store) -> None:
    spec, store = spec_store
    assert confirm.arm_seed_cost(spec, "CE", store) == pytest.approx(123.4)


def test_plan_claim_takes_the_smallest_powered_n_within_floor_and_cap() -> None:
    values = [-1.0, -0.9, -1.2, -0.8, -1.1]
    sd = float(np.std(values, ddof=1))
    alpha = 0.05 / 20
    plan = confirm.plan_claim(values, 0.5, alpha, cap=100)
    assert plan.needed == st.seeds_for_power(0.5, sd, alpha).n
    assert st.power_t(0.5, sd, plan.needed, alpha) >= 0.8
    assert st.power_t(0.5, sd, plan.needed - 1, alpha) < 0.8
    assert plan.planned == max(plan.needed, 4)
    capped = confirm.plan_claim(values, 0.05, alpha, cap=6)
    assert capped.planned == 6 and capped.needed > 6
    assert capped.power_planned == pytest.approx(st.power_t(0.05, sd, 6, alpha))
    assert capped.power_planned < 0.8


@pytest.mark.parametrize("bad", [dict(sesoi=0.0), dict(sesoi=math.nan), dict(cap=1),
                                 dict(values=[1.0]), dict(values=[2.0, 2.0])])
def test_plan_claim_refuses_bad_input(bad: dict) -> None:
    args = dict(values=[1.0, 2.0, 3.0], sesoi=1.0, alpha=0.01, cap=10) | bad
    with pytest.raises(ValueError, match="sesoi|cap|values"):
        confirm.plan_claim(**args)


def test_shared_arms_get_the_largest_need_and_claims_their_common_seeds() -> None:
    needs = {"x": 10, "y": 8, "z": 5, "study": 120}
    arms_of = {"x": ["CE", "SECE"], "y": ["SECE", "Focal"], "z": ["CE"]}
    claims, arms = confirm.shared_seeds(needs, arms_of)
    assert arms == {"CE": 10, "SECE": 10, "Focal": 8}
    assert claims == {"x": 10, "y": 8, "z": 10, "study": 120}
    assert all(claims[c] >= needs[c] for c in needs)


def test_confirmatory_configs_change_only_the_seed(spec_store) -> None:
    spec, store = spec_store
    runs = confirm.confirmatory_configs(spec, "focal-lowers-ece", [1000, 1001], store)
    assert len(runs) == 4 and {label for label, _ in runs} == {"chXX"}
    template = cl.arm_runs(spec, "Focal", store)[0].config
    focal = [c for _, c in runs if c["loss"] == "focal"]
    assert [c["seed"] for c in focal] == [1000, 1001]
    assert {k: v for k, v in focal[0].items() if k != "seed"} == \
        {k: v for k, v in template.items() if k != "seed"}
    assert len({config_hash(c) for _, c in runs}) == 4


def test_a_claim_without_seed_spread_is_refused(spec_store) -> None:
    spec, store = spec_store
    with pytest.raises(ValueError, match="no claim"):
        confirm.claim_seed_values(spec, "nothing-here", store)


def _confirmatory_file(tmp_path: Path, planned: int) -> Path:
    path = tmp_path / "XC.yaml"
    path.write_text(CLAIMS.replace("arms:\n", "arms:\n  c-CE: {label: chXX, where: {loss: ce}, "
                                   "seeds: [0, 1, 2, 3]}\n  c-Focal: {label: chXX, where: "
                                   "{loss: focal}, seeds: [0, 1, 2, 3]}\n") + f"""
  - id: c-focal-lowers-ece
    phase: confirmatory
    twin: focal-lowers-ece
    sesoi: 0.5
    planned_seeds: {planned}
    claim: Focal loss lowers the ECE.
    work: guo2017calibration
    where: Table 1
    test: {{a: c-Focal, b: c-CE, statistic: test_ece, scale: 100, unit: points,
           direction: below}}
""", encoding="utf-8")
    return path


def test_a_confirmatory_claim_short_of_its_planned_seeds_reads_no_verdict(
        spec_store, tmp_path: Path) -> None:
    _, store = spec_store
    short = cl.evaluate_claims(_confirmatory_file(tmp_path, 6), store).set_index("id")
    row = short.loc["c-focal-lowers-ece"]
    assert math.isnan(row["estimate"]) and math.isnan(row["p"])
    assert row["verdict"] == st.INCONCLUSIVE and row["n"] == 4
    assert "4 of the 6 planned seeds" in row["evidence"]
    assert row["under_way"] and not short.loc["focal-lowers-ece", "under_way"]
    assert row["quantity"] == "test_ece"  # the measure's name: no metric option
    # the same claim at its planned seeds is read as its twin is
    full = cl.evaluate_claims(_confirmatory_file(tmp_path, 4), store).set_index("id")
    assert full.loc["c-focal-lowers-ece", "estimate"] == pytest.approx(
        full.loc["focal-lowers-ece", "estimate"])
    assert full.loc["c-focal-lowers-ece", "verdict"] == full.loc["focal-lowers-ece", "verdict"]
    assert not full.loc["c-focal-lowers-ece", "under_way"]


def test_under_way_text_counts_seeds_and_refuses_what_is_no_count() -> None:
    assert cl.under_way_text(4, 8) == ("under way, 4 of its 8 fresh seeds stored; nothing "
                                       "is read before the last")
    for bad in (-1, 2.0, True, "4"):
        with pytest.raises(ValueError, match="stored must be a count of seeds"):
            cl.under_way_text(bad, 8)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="planned"):
        cl.under_way_text(1, None)  # type: ignore[arg-type]


def test_runner_names_an_unknown_claim_before_training_anything():
    """tools/confirm_runs.py checks ``--claims`` against the chapters' confirmatory claims
    first, so a typo stops it before any run is trained or committed."""
    import subprocess
    import sys

    tool = Path(__file__).resolve().parents[1] / "tools" / "confirm_runs.py"
    done = subprocess.run([sys.executable, str(tool), "--chapters", "04", "--claims",
                           "c-ln-msp-fpr95-r8", "c-no-such-claim", "--no-commit"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "--claims: no confirmatory claim ['c-no-such-claim']" in done.stderr
    assert "done" not in done.stdout


def test_runner_commit_lets_the_other_process_win_a_race_for_the_same_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two runners that read the same run (one trained it, the other waited for its lock)
    both commit it; the one that finds it already committed returns instead of failing."""
    import importlib.util
    import subprocess

    tool = Path(__file__).resolve().parents[1] / "tools" / "confirm_runs.py"
    spec = importlib.util.spec_from_file_location("confirm_runs_tool", tool)
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)

    def git(*args: str) -> str:
        return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", *args],
                              cwd=tmp_path, capture_output=True, text=True,
                              check=True).stdout

    git("init", "-q")
    run = tmp_path / "results" / "abc"
    run.mkdir(parents=True)
    (run / "manifest.json").write_text("{}")
    git("add", "results")
    git("commit", "-q", "-m", "the other runner's commit")
    (tmp_path / "unrelated").write_text("untracked")  # git then words "nothing" otherwise
    monkeypatch.setattr(runner, "REPO", tmp_path)
    seen = iter([True])  # the status check before the other process committed
    real = runner._uncommitted
    monkeypatch.setattr(runner, "_uncommitted", lambda paths: next(seen, None) or real(paths))
    runner._commit([run], "this runner's commit")
    assert git("log", "--format=%s").splitlines() == ["the other runner's commit"]
    # a failure that is not such a race still raises
    monkeypatch.setattr(runner, "_uncommitted", lambda paths: True)
    with pytest.raises(RuntimeError, match="git failed"):
        runner._commit([tmp_path / "no-such-folder"], "x")


def _labels(arm: dict) -> set[str]:
    return set(arm["label"] if isinstance(arm["label"], list) else [arm["label"]])


def _may_share_runs(a: dict, b: dict) -> bool:
    """Whether two arms' filters can match the same run: a common label, and no key of
    ``where`` that both set to different values."""
    wa, wb = a.get("where") or {}, b.get("where") or {}
    return bool(_labels(a) & _labels(b)) and all(wa[k] == wb[k] for k in wa.keys() & wb.keys())


def test_no_exploratory_arm_of_the_book_reads_a_confirmatory_seed() -> None:
    """An arm without a seed list reads every stored seed of its configuration, so once the
    confirmatory runs are stored an exploratory arm of the same configuration would pool
    them: every arm that could match a confirmatory arm's runs lists seeds disjoint from
    its seeds."""
    from calnotes.book.claims import CLAIMS_DIR

    checked = 0
    for path in sorted(CLAIMS_DIR.glob("*.yaml")):
        spec = cl.load_claims(path)
        arms = spec["arms"]
        confirmatory = {arm_name for c in spec["claims"] if c.get("phase") == "confirmatory"
                        for arm_name in (c["test"].get("a"), c["test"].get("b")) if arm_name}
        for name, arm in arms.items():
            if name in confirmatory:
                continue
            for other in confirmatory:
                if not _may_share_runs(arm, arms[other]):
                    continue
                checked += 1
                assert arm.get("seeds") is not None, (path.name, name, other)
                assert not set(arm["seeds"]) & set(arms[other]["seeds"]), (path.name, name)
    assert checked > 0
