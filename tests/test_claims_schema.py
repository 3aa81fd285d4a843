"""calnotes.runs.claims: the optional keys of a claim (question, phase, twin, sesoi,
planned_seeds), each type- and range-checked, and what belongs to a claim's dated
definition."""

from __future__ import annotations

from pathlib import Path

import pytest

from calnotes.runs import claims as cl
from tests.test_claims import ARMS, write

BASE = "  - {id: a, claim: x, work: k, where: w, not_testable: y"
TEST = "test: {a: CE, statistic: test_ece, direction: below}"


def test_optional_keys_load_with_their_defaults(tmp_path: Path) -> None:
    path = write(tmp_path, ARMS + f"""  - {{id: ex, claim: x, work: k, where: w, {TEST},
      question: "Does focal loss lower the ECE?", sesoi: 0.5}}
  - {{id: conf, claim: x, work: k, where: w, {TEST}, phase: confirmatory, twin: ex,
      sesoi: 1.5, planned_seeds: 10, question: "Does focal loss lower the ECE?"}}
""")
    claims = {c["id"]: c for c in cl.load_claims(path)["claims"]}
    assert claims["ex"]["phase"] == "exploratory"
    assert claims["ex"]["question"] == "Does focal loss lower the ECE?"
    assert claims["conf"]["phase"] == "confirmatory" and claims["conf"]["twin"] == "ex"
    assert claims["conf"]["sesoi"] == 1.5 and claims["conf"]["planned_seeds"] == 10


@pytest.mark.parametrize("extra, message", [
    (", question: ''", "question must be"),
    (", question: 3", "question must be"),
    (", phase: pilot", "phase must be"),
    (", key: yes-ish", "key must be"),
    (", sesoi: 0", "sesoi must be"),
    (", sesoi: -1.0", "sesoi must be"),
    (", sesoi: .inf", "sesoi must be"),
    (", sesoi: true", "sesoi must be"),
    (", sesoi: big", "sesoi must be"),
    (", planned_seeds: 0", "planned_seeds must be"),
    (", planned_seeds: 2.5", "planned_seeds must be"),
    (", planned_seeds: true", "planned_seeds must be"),
    (", phase: confirmatory, twin: nope", "twin names no other claim"),
    (", phase: confirmatory, twin: a", "twin names no other claim"),
    (", phase: confirmatory, twin: [b]", "twin must be a claim id"),
    (", twin: b", "twin links a confirmatory claim"),
])
def test_bad_optional_keys_name_the_file_and_the_claim(tmp_path: Path, extra: str,
                                                       message: str) -> None:
    path = write(tmp_path, ARMS + BASE + extra + "}\n"
                 + "  - {id: b, claim: x, work: k, where: w, not_testable: y}\n")
    with pytest.raises(ValueError, match=message) as err:
        cl.load_claims(path)
    assert str(path) in str(err.value) and "'a'" in str(err.value)


def test_a_twin_must_be_exploratory(tmp_path: Path) -> None:
    path = write(tmp_path, ARMS + BASE + ", phase: confirmatory, twin: b}\n"
                 + "  - {id: b, claim: x, work: k, where: w, not_testable: y, "
                   "phase: confirmatory}\n")
    with pytest.raises(ValueError, match="confirmatory -> confirmatory"):
        cl.load_claims(path)


def _claim(extra: str = "") -> str:
    return ARMS + f"  - {{id: c, claim: x, work: k, where: w, {TEST}{extra}}}\n"


@pytest.mark.parametrize("extra", [", key: true", ", premise: p", ", phase: confirmatory",
                                   ", sesoi: 2"])
def test_key_premise_phase_and_sesoi_are_part_of_the_dated_definition(extra: str) -> None:
    assert cl._definition(_claim(extra), "c") != cl._definition(_claim(), "c")


@pytest.mark.parametrize("extra", [", question: Why", ", planned_seeds: 5",
                                   ", phase: exploratory", ", key: false"])
def test_wording_and_defaults_leave_the_definition_alone(extra: str) -> None:
    # The question groups claims and planned_seeds plans runs: neither changes the test;
    # spelling out a default changes nothing either.
    assert cl._definition(_claim(extra), "c") == cl._definition(_claim(), "c")
