"""calnotes.book.claims: a chapter's evaluation cached in the store by its inputs' hash,
the JSON fields of ``python -m calnotes claims --json``, and tools/compare_claims.py."""

from __future__ import annotations

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from calnotes.book import claims as book_claims
from calnotes.runs import claims as cl
from calnotes.runs.claims import TABLE_COLUMNS
from calnotes.runs.store import RunStore
from tests.test_claims import ARMS, make_store, write

BODY = ARMS + """  - id: c
    claim: x
    work: k
    where: w
    question: Does focal loss lower the ECE?
    test: {a: FL, b: CE, statistic: test_ece, direction: below}
"""


@pytest.fixture()
def store(tmp_path: Path) -> RunStore:
    return make_store(tmp_path)


@pytest.fixture()
def chapter(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setattr(cl, "did_not_train", lambda logits, labels: None)
    monkeypatch.setattr(cl, "_TRAINED", {})
    path = write(tmp_path, BODY)
    monkeypatch.setattr(book_claims, "claims_path", lambda ch: path)
    return path


def test_a_chapter_is_cached_by_its_inputs(chapter: Path, store: RunStore,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    def compute(ch: str, root: str) -> pd.DataFrame:
        return book_claims._evaluation.__wrapped__(ch, root)[0]

    first = compute("XX", str(store.root))
    files = list((store.root / book_claims.CACHE_DIR).glob("XX-*.json"))
    assert len(files) == 1
    entry = json.loads(files[0].read_text())
    assert set(entry["provenance"]["inputs"]) == {"chapter", "claims_file", "claims_commit",
                                                  "code", "runs", "runs_hash"}
    # the runs of the labels its arms read: 8 of chXX, 3 of "other"
    assert entry["provenance"]["inputs"]["runs"] == 11

    def refuse(*args, **kwargs):
        raise AssertionError("evaluated again although its inputs did not change")

    monkeypatch.setattr(book_claims, "evaluate_claims", refuse)
    cached = compute("XX", str(store.root))
    # every number read back exactly (repr round-trips a float)
    pd.testing.assert_frame_equal(cached, first, check_dtype=False, check_exact=True)
    # another claims file: another key, evaluated again
    chapter.write_text(BODY.replace("claim: x", "claim: y"), encoding="utf-8")
    with pytest.raises(AssertionError, match="evaluated again"):
        compute("XX", str(store.root))


def test_an_evaluation_records_its_machine_and_reads_it_back(
        chapter: Path, store: RunStore, monkeypatch: pytest.MonkeyPatch) -> None:
    from calnotes.training import devices

    cpu = {"cpu_model": "Test CPU 9000", "torch_cpu_capability": "AVX2",
           "amx_bf16": False, "avx512_bf16": False}
    monkeypatch.setattr(devices, "cpu_features", lambda: cpu)
    monkeypatch.setattr(book_claims.os, "getloadavg", lambda: (1.234, 0.5, 0.25))
    _, fresh = book_claims._evaluation.__wrapped__("XX", str(store.root))
    assert fresh["machine"] == {**cpu, "threads": torch.get_num_threads(),
                                "load_1min": 1.23}
    (file,) = (store.root / book_claims.CACHE_DIR).glob("XX-*.json")
    assert json.loads(file.read_text())["provenance"] == fresh
    # read back from the entry, not measured again
    monkeypatch.setattr(devices, "cpu_features", lambda: {**cpu, "cpu_model": "Other"})
    _, cached = book_claims._evaluation.__wrapped__("XX", str(store.root))
    assert cached == fresh
    # an entry written before machines were recorded reads as an empty machine
    entry = json.loads(file.read_text())
    del entry["provenance"]["machine"]
    file.write_text(json.dumps(entry))
    assert book_claims._evaluation.__wrapped__("XX", str(store.root))[1]["machine"] == {}
    # an entry whose recorded inputs are not the key's is evaluated again, not trusted
    entry["provenance"]["inputs"]["runs"] = -1
    file.write_text(json.dumps(entry))
    _, again = book_claims._evaluation.__wrapped__("XX", str(store.root))
    assert again["inputs"]["runs"] == 11 and again["machine"]["cpu_model"] == "Other"


def test_machine_text_names_the_cpu_its_kernels_and_load() -> None:
    machine = {"cpu_model": "AMD EPYC", "torch_cpu_capability": "AVX2", "load_1min": 0.049}
    assert book_claims.machine_text(machine) == "AMD EPYC (AVX2 kernels, load 0.05)"
    assert book_claims.machine_text({"cpu_model": "X", "load_1min": None}) == "X"
    assert book_claims.machine_text({}) == "an unrecorded machine"
    with pytest.raises(TypeError, match="machine"):
        book_claims.machine_text("AMD EPYC")  # type: ignore[arg-type]


def test_a_new_run_changes_the_key(chapter: Path, store: RunStore) -> None:
    from tests.test_store import fake_result

    before = book_claims._inputs("XX", store)
    store.save(fake_result({"loss": "ce", "seed": 9}, seed=9), label="chXX")
    after = book_claims._inputs("XX", store)
    assert after["runs"] == before["runs"] + 1 and after["runs_hash"] != before["runs_hash"]


def test_json_records_carry_the_fields(chapter: Path, store: RunStore,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    table = book_claims._evaluation.__wrapped__("XX", str(store.root))[0]
    table.insert(0, "chapter", "XX")
    from calnotes.runs.verdicts import adjust_verdicts

    book = adjust_verdicts(table)
    book["verdict_adjusted"], book["verdict"] = book["verdict"], book["verdict_raw"]
    monkeypatch.setattr(book_claims, "claims_table",
                        lambda ch, store=None: book.drop(columns="chapter"))
    monkeypatch.setattr(book_claims, "resolve_chapter", lambda ch: Path("04_x.md"))
    (record,) = book_claims.summary_records("04")
    assert set(book_claims.JSON_FIELDS) <= set(record)
    assert record["question"] == "Does focal loss lower the ECE?"
    assert record["adjusted"]["method"] == "Benjamini-Hochberg"
    assert record["phase"] == "exploratory" and record["n_seeds"] == 4
    assert record["premise"] == {"id": None, "state": ""}
    assert math.isfinite(record["detectable"])


def _records(verdicts: dict[str, tuple[str, str]], raw: bool) -> list[dict]:
    out = []
    for cid, (v, q) in verdicts.items():
        r = {"chapter": "01", "id": cid, "claim": cid, "verdict": v, "question": q}
        if raw:
            r["verdict_raw"] = v
        out.append(r)
    return out


def test_compare_claims_counts_by_claim_and_question(tmp_path: Path) -> None:
    before = tmp_path / "before.json"
    after = tmp_path / "after.json"
    before.write_text(json.dumps(_records({"a": ("reproduces", ""), "b": ("reproduces", ""),
                                           "c": ("inconclusive", "")}, raw=False)))
    recs = _records({"a": ("reproduces", "Q"), "b": ("does not reproduce", "Q"),
                     "c": ("reported size ruled out", "")}, raw=True)
    recs[0]["verdict"] = "inconclusive"  # adjusted
    after.write_text(json.dumps(recs))
    tool = Path(__file__).resolve().parents[1] / "tools" / "compare_claims.py"
    out = subprocess.run([sys.executable, str(tool), str(before), str(after)],
                         capture_output=True, text=True, check=True,
                         cwd=tool.parents[1]).stdout
    assert "| reproduces | 2 | 1 |" in out  # claims, raw
    assert "| mixed | 0 | 1 |" in out  # questions: Q's two claims now disagree
    assert "| 01 | b | reproduces | does not reproduce | verdict rule" in out
    assert ("| 01 | a | reproduces | reproduces [inconclusive] | adjusted for multiplicity"
            in out)
    assert "| 01 | c | inconclusive | reported size ruled out | its interval excludes" in out
    assert set(TABLE_COLUMNS) >= {"verdict_raw", "p", "p_adjusted", "adjusted"}


def test_compare_claims_says_why_a_premise_or_a_new_declaration_changed_it() -> None:
    spec = importlib.util.spec_from_file_location(
        "compare_claims", Path(__file__).resolve().parents[1] / "tools" / "compare_claims.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    before = {"verdict": "premise fails here", "estimate": 1.0, "low": 0.5, "high": 1.5}
    after = {**before, "verdict": "does not reproduce", "verdict_raw": "does not reproduce",
             "premise": {"id": "p", "state": "inconclusive"}}
    assert tool.why_changed(before, after) == ("its premise no longer replaces its own "
                                               "verdict (premise inconclusive)")
    moved = {**after, "estimate": 2.0, "effect": "+2.0", "design": "seeds", "n_seeds": 3}
    assert "interval" in tool.why_changed(before, moved)
    assert tool.why_changed(None, {"phase": "confirmatory"}).endswith("(confirmatory round)")
    assert tool.why_changed(before, None).startswith("withdrawn")


def test_adjust_book_keeps_each_claims_own_verdict_beside_the_adjusted() -> None:
    def table(rows):
        out = pd.DataFrame([{c: "" for c in TABLE_COLUMNS} | r for r in rows],
                           columns=list(TABLE_COLUMNS))
        return out.assign(key=out["key"].astype(bool))

    base = {"phase": "exploratory", "claim": "x", "question": ""}
    book = book_claims.adjust_book({
        "01": table([{**base, "id": "a", "key": True, "p": 0.03, "verdict": "reproduces",
                      "verdict_raw": "reproduces"}]),
        "02": table([{**base, "id": "b", "key": True, "p": 0.04, "verdict": "reproduces",
                      "verdict_raw": "reproduces"}]),
    }).set_index("id")
    # Holm over the book's two key claims: 2(.03) = .06 and max(.06, .04): both above 5%
    assert list(book["chapter"]) == ["01", "02"]
    assert (book["verdict"] == "reproduces").all()
    assert (book["verdict_adjusted"] == "inconclusive").all()
    assert book.loc["a", "p_adjusted"] == pytest.approx(0.06)


def _claims_cache_tool():
    spec = importlib.util.spec_from_file_location(
        "claims_cache", Path(__file__).resolve().parents[1] / "tools" / "claims_cache.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    return tool


def test_claims_cache_tool_lists_deletes_stale_entries_and_keeps_them_on_failure(
        chapter: Path, store: RunStore, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    tool = _claims_cache_tool()
    monkeypatch.setattr(book_claims, "_chapters", lambda: ["XX"])
    root = str(store.root)
    folder = store.root / book_claims.CACHE_DIR
    folder.mkdir(parents=True, exist_ok=True)
    stale = folder / "XX-0000000000000000.json"
    stale.write_text("{}", encoding="utf-8")
    # no fresh entry and one stale file: --check fails and names both
    assert tool.main(["--check", "--root", root]) == 1
    assert "chapters without a fresh entry: XX" in capsys.readouterr().out
    # an evaluation that fails writes nothing, and the stale entry is kept
    monkeypatch.setattr(tool, "_evaluate", lambda ch, r: (ch, 3, "boom"))
    assert tool.main(["--root", root]) == 1
    assert stale.is_file()
    assert "chapter XX: evaluation failed (exit 3)" in capsys.readouterr().err
    # once the chapter's entry is written, the stale one goes and --check passes
    book_claims._evaluation.__wrapped__("XX", root)
    assert tool.main(["--root", root]) == 0
    assert not stale.is_file()
    assert [p.name for p in folder.glob("*.json")] == [tool.fresh_names(store)["XX"]]
    assert tool.main(["--check", "--root", root]) == 0
