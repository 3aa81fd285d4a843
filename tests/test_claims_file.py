"""Claims files under hostile input: the safe YAML loader (size, depth, alias expansion,
duplicate keys, UTF-8), numbers that must be finite, and errors during evaluation, damaged
stored runs and unknown ``where`` keys, each naming the file, the claim or the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from calnotes.runs import claims as cl
from calnotes.runs import claims_file as cf
from calnotes.runs.store import RunStore
from tests.test_claims import ARMS, store, write  # noqa: F401  (the store fixture)


@pytest.fixture(autouse=True)
def _trained(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fake runs' logits are random (chance accuracy): here every run counts as trained
    (as in tests/test_claims.py)."""
    monkeypatch.setattr(cl, "did_not_train", lambda logits, labels: None)
    monkeypatch.setattr(cl, "_TRAINED", {})


CLAIM = """  - id: {cid}
    claim: Focal loss lowers the ECE.
    work: guo2017calibration
    where: Table 1
"""


def claim(cid: str, test: str) -> str:
    return CLAIM.format(cid=cid) + f"    test: {test}\n"


def bomb(levels: int = 9) -> str:
    """An alias bomb: each anchor lists the previous one nine times (9^levels strings)."""
    lines = ['    - &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for i in range(1, levels):
        lines.append(f"    - &l{i} [" + ",".join([f"*l{i - 1}"] * 9) + "]")
    return "\n".join(lines)


def test_an_alias_bomb_is_refused_naming_its_claim(tmp_path: Path) -> None:
    text = ARMS + CLAIM.format(cid="bomb") + "    not_testable:\n" + bomb() + "\n"
    assert len(text.encode()) < 2000  # a tiny file
    with pytest.raises(ValueError, match=r"XX\.yaml: claim 'bomb': expands to more than "
                                         r"200000 YAML nodes"):
        cl.load_claims(write(tmp_path, text))


def test_a_recursive_alias_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "chapter: &a [*a]\n")
    with pytest.raises(ValueError, match=r"XX\.yaml: section 'chapter': expands to more"):
        cl.load_claims(path)


def test_deep_nesting_is_refused_without_recursion_error(tmp_path: Path) -> None:
    path = write(tmp_path, ARMS + CLAIM.format(cid="deep") + "    not_testable: "
                 + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ValueError, match=r"XX\.yaml: claim 'deep': nests deeper than 32 "
                                         r"levels \(the limit\) \(line 14"):
        cl.load_claims(path)


def test_the_size_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(tmp_path, ARMS + claim("ok", "{a: CE, statistic: test_ece, "
                                              "direction: below}"))
    monkeypatch.setattr(cf, "MAX_BYTES", 100)
    with pytest.raises(ValueError, match=r"XX\.yaml: \d+ bytes, larger than the 100 bytes"):
        cl.load_claims(path)


def test_duplicate_keys_are_refused_naming_the_claim_and_the_arm(tmp_path: Path) -> None:
    twice = ARMS.replace("  CE1:", "  CE: {label: chXX, where: {loss: focal}}\n  CE1:")
    with pytest.raises(ValueError, match=r"XX\.yaml: arm 'CE': key 'CE' is given twice"):
        cl.load_claims(write(tmp_path, twice + claim(
            "x", "{a: CE, statistic: test_ece, direction: below}")))
    with pytest.raises(ValueError, match=r"XX\.yaml: claim 'x': key 'direction' is given "
                                         r"twice in one mapping \(first at line 14"):
        cl.load_claims(write(tmp_path, ARMS + claim(
            "x", "{a: CE, statistic: test_ece, direction: below, direction: above}")))


def test_a_file_that_is_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "XX.yaml"
    path.write_bytes((ARMS + CLAIM.format(cid="latin") + "    not_testable: café\n")
                     .encode("latin-1"))
    with pytest.raises(ValueError, match=r"XX\.yaml: not UTF-8 \(byte \d+, line 14"):
        cl.load_claims(path)


def test_python_tags_stay_refused(tmp_path: Path) -> None:
    path = write(tmp_path, ARMS + CLAIM.format(cid="tag")
                 + "    not_testable: !!python/object/apply:os.getcwd []\n")
    with pytest.raises(ValueError, match=r"XX\.yaml: not valid YAML"):
        cl.load_claims(path)


@pytest.mark.parametrize(("test", "message"), [
    ("{a: CE, statistic: test_ece, direction: above, null: .inf}",
     "null must be a finite number, got inf"),
    ("{a: CE, statistic: test_ece, direction: above, scale: .nan}",
     "scale must be a finite number, got nan"),
    ("{a: CE, statistic: test_ece, direction: above, paper: -.inf}",
     "paper must be a finite number, got -inf"),
    ("{a: CE, statistic: ece, direction: above, options: {bins: [.nan]}}",
     r"options: bins\[0\] is nan, not a finite number"),
    ("{a: CE, statistic: test_ece, direction: above, design: bootstrap, resamples: 1000000000000}",
     "resamples must be a whole number at most 100000"),
    ("{a: CE, statistic: test_ece, direction: above, design: bootstrap, resamples: 150.5}",
     "resamples must be a whole number"),
])
def test_numbers_that_are_not_numbers_name_the_file_and_claim(
        tmp_path: Path, test: str, message: str) -> None:
    with pytest.raises(ValueError, match=rf"XX\.yaml: claim 'num', test: {message}"):
        cl.load_claims(write(tmp_path, ARMS + claim("num", test)))


@pytest.mark.parametrize(("arm", "message"), [
    ("{label: [[chXX]]}", r"label must be a label or a non-empty list of labels"),
    ("{label: 3}", r"label must be a label"),
    ("{label: chXX, where: {lr: .nan}}", r"lr is nan, not a finite number"),
])
def test_bad_labels_and_where_values_name_the_arm(tmp_path: Path, arm: str,
                                                   message: str) -> None:
    text = ARMS.replace("claims:\n", f"  BAD: {arm}\nclaims:\n") + claim(
        "x", "{a: BAD, statistic: test_ece, direction: below}")
    with pytest.raises(ValueError, match=rf"XX\.yaml: arm 'BAD': {message}"):
        cl.load_claims(write(tmp_path, text))


def test_a_nested_list_as_text_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, ARMS + CLAIM.format(cid="nest") + "    not_testable: [[a]]\n")
    with pytest.raises(ValueError, match=r"XX\.yaml: claim 'nest': not_testable must be a "
                                         r"non-empty string, got list"):
        cl.load_claims(path)


@pytest.mark.parametrize(("test", "message"), [
    ("{a: CE, statistic: no_such_measure, direction: below}", "unknown measure"),
    ("{a: CE, statistic: ece, direction: below, options: {temperature: hot}}",
     "temperature must be None or 'val'"),
    ("{a: CE, statistic: ece, direction: below, options: {no_option: 1}}", "no_option"),
    ("{a: CE, statistic: ece, direction: below, options: {bins: -3}}", "n_bins"),
])
def test_errors_while_evaluating_name_the_file_and_claim(
        tmp_path: Path, store: RunStore, test: str, message: str) -> None:  # noqa: F811
    path = write(tmp_path, ARMS + claim("ok", "{a: CE, statistic: test_ece, direction: above}")
                 + claim("evaluated", test))
    with pytest.raises((ValueError, TypeError), match=rf"XX\.yaml: claim 'evaluated': .*"
                                                      rf"{message}"):
        cl.evaluate_claims(path, store)


def test_a_premise_failing_to_evaluate_is_named_itself(tmp_path: Path,
                                                       store: RunStore) -> None:  # noqa: F811
    text = ARMS + CLAIM.format(cid="later") + (
        "    premise: broken\n    test: {a: CE, statistic: test_ece, direction: above}\n"
    ) + claim("broken", "{a: CE, statistic: no_such_measure, direction: above}")
    with pytest.raises(ValueError, match=r"XX\.yaml: claim 'broken': unknown measure"):
        cl.evaluate_claims(write(tmp_path, text), store)


def test_a_damaged_provenance_names_the_run(tmp_path: Path, store: RunStore) -> None:  # noqa: F811
    path = write(tmp_path, ARMS + claim("c", "{a: CE, statistic: test_ece, direction: above}"))
    assert cl.evaluate_claims(path, store).iloc[0]["n"] == 4
    folder = next(f for f in store._folders()
                  if json.loads((f / "config.json").read_text())["loss"] == "ce")
    (folder / "provenance.json").write_text('{"label": "chXX", ', encoding="utf-8")
    with pytest.raises(ValueError, match=rf"XX\.yaml: claim 'c': stored run {folder.name}: "
                                         rf".*provenance\.json cannot be read"):
        cl.evaluate_claims(path, store)


def test_an_unknown_where_key_is_an_error_not_a_wait(tmp_path: Path,
                                                    store: RunStore) -> None:  # noqa: F811
    text = ARMS.replace("claims:\n", "  TYPO: {label: chXX, where: {los: ce}}\nclaims:\n")
    path = write(tmp_path, text + claim("c", "{a: TYPO, statistic: test_ece, "
                                             "direction: above}"))
    with pytest.raises(ValueError, match=r"XX\.yaml: claim 'c': arm 'TYPO': where names "
                                         r"'los', which no stored config of label\(s\) chXX"):
        cl.evaluate_claims(path, store)


def test_fewer_seeds_than_declared_are_said_in_the_row(tmp_path: Path,
                                                       store: RunStore) -> None:  # noqa: F811
    text = ARMS.replace("claims:\n", "  CE6: {label: chXX, where: {loss: ce}, "
                                     "seeds: [0, 1, 2, 3, 4, 5]}\nclaims:\n")
    row = cl.evaluate_claims(write(tmp_path, text + claim(
        "c", "{a: CE6, statistic: test_ece, direction: above}")), store).iloc[0]
    assert row["n"] == 4
    assert "Arm 'CE6' declares 6 seeds; 2 not stored (seed(s) 4, 5): answered by 4 of 6." \
        in row["evidence"]
    full = cl.evaluate_claims(write(tmp_path, ARMS + claim(
        "c", "{a: CE, statistic: test_ece, direction: above}")), store).iloc[0]
    assert "declares" not in full["evidence"]


def test_nonfinite_finds_nested_values() -> None:
    assert cf.nonfinite({"a": [1, {"b": float("inf")}]}) == "a[1].b is inf, not a finite number"
    assert cf.nonfinite({"a": [1, 2.5, "x", None]}) is None
    assert cf.nonfinite(float("nan"), "scale") == "scale is nan, not a finite number"
