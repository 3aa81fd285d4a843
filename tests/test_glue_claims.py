"""The chapters' claims tables: shown with an HTML face for the page and glued with JSON
records that the front page assembles."""

import json
import math

import pandas as pd
import pytest

from calnotes.book import claims as book_claims
from calnotes.runs.claims import TABLE_COLUMNS


def _table() -> pd.DataFrame:
    row = {c: "" for c in TABLE_COLUMNS}
    row.update(id="ts-lowers-ece", claim="TS lowers the <ECE>", original="«оригинал»",
               work="guo2017calibration", where="Table 1", key=True, design="paired t over seeds",
               n=3, estimate=-2.0, low=-3.0, high=-1.0, detectable=1.2, paper=-2.5, null=0.0,
               direction="below", unit="points", verdict="reproduces",
               declared="before its runs", evidence="paired t over seeds, n = 3 seeds: ...")
    untestable = {**{c: "" for c in TABLE_COLUMNS}, "id": "cifar", "claim": "CIFAR",
                  "work": "guo2017calibration", "where": "Table 1", "key": False, "n": 0,
                  "estimate": math.nan, "low": math.nan, "high": math.nan,
                  "detectable": math.nan, "paper": math.nan, "null": math.nan,
                  "verdict": "not testable at this scale", "evidence": "no CIFAR here"}
    return pd.DataFrame([row, untestable], columns=list(TABLE_COLUMNS))


def test_the_claims_view_escapes_html_and_glues_records(monkeypatch):
    monkeypatch.setattr(book_claims, "claims_table", lambda chapter, store=None: _table())
    view = book_claims._ClaimsView("03")
    bundle = view._repr_mimebundle_()
    html = bundle["text/html"]
    assert "TS lowers the &lt;ECE&gt;" in html and "<ECE>" not in html
    assert 'id="claim-03-ts-lowers-ece"' in html
    assert "verdict-reproduces" in html and "verdict-not-testable-at-this-scale" in html
    assert "Guo et al. (2017), Table 1" in html
    records = json.loads(bundle[book_claims.CLAIMS_MIME])
    assert [r["id"] for r in records] == ["ts-lowers-ece", "cifar"]
    assert set(records[0]) == set(book_claims.SUMMARY_COLUMNS)
    assert records[0]["effect"] == "-2.00 [-3.00, -1.00] points"
    assert records[1]["effect"] == "n/a" and records[1]["low"] is None


def test_verdict_of_names_an_unknown_claim(monkeypatch):
    monkeypatch.setattr(book_claims, "claims_table", lambda chapter, store=None: _table())
    assert book_claims.verdict_of("03", "ts-lowers-ece") == "reproduces"
    with pytest.raises(ValueError, match="no claim 'nope'"):
        book_claims.verdict_of("03", "nope")


def test_the_front_page_extension_reads_the_notebook_format(monkeypatch):
    # the extension that assembles the front page runs inside Sphinx; it must read the very
    # fields and mime type that show_claims glues, not copies of them, and draw them
    import importlib
    import sys

    pytest.importorskip("sphinx")
    from calnotes.book import chapters
    from calnotes.book import claims as book_claims

    monkeypatch.syspath_prepend(str(chapters.BOOK_DIR / "_ext"))
    monkeypatch.delitem(sys.modules, "claims_summary", raising=False)
    ext = importlib.import_module("claims_summary")
    assert ext.SUMMARY_COLUMNS is book_claims.SUMMARY_COLUMNS
    assert ext.CLAIMS_MIME is book_claims.CLAIMS_MIME
    record = {"chapter": "05", "page": "05_meta", "id": "flsece-vs-ce", "claim": "FL < CE",
              "cite": "Wang & Golebiowski (2024), Table 1", "verdict": "inconclusive",
              "effect": "-0.86 [-2.24, +0.51] points", "paper": "-1.92", "estimate": -0.86,
              "low": -2.24, "high": 0.51, "paper_value": -1.92, "null": 0.0,
              "direction": "below", "unit": "points", "key": True,
              "question": "Does FLγ-SECE lower the ECE?", "verdict_raw": "reproduces",
              "adjusted": {"method": "Holm", "family": "Holm, key exploratory claims of the "
                           "book", "p": 0.01, "p_adjusted": 0.2, "verdict": "inconclusive"},
              "premise": {"id": None, "state": ""}, "design": "paired t over seeds",
              "n_seeds": 3, "detectable": 2.1, "declared": "before its runs",
              "phase": "exploratory", "twin": None, "sesoi": None, "planned_seeds": None,
              "p": 0.01, "under_way": False}
    assert set(record) == set(book_claims.SUMMARY_COLUMNS)
    listing = ext._chapter_list("Meta", "05_meta.html", "05", [record])
    assert 'href="05_meta.html#claim-05-flsece-vs-ce"' in listing
    assert "verdict-inconclusive" in listing
    assert "ours -0.86 [-2.24, +0.51] points" in listing
    # a replication still training shows its seeds, not an effect
    waiting = {**record, "id": "c-flsece-vs-ce", "phase": "confirmatory", "effect": "",
               "n_seeds": 4, "planned_seeds": 8, "under_way": True}
    assert ("ours under way, 4 of its 8 fresh seeds stored; nothing is read before the last"
            in ext._chapter_list("Meta", "05_meta.html", "05", [waiting]))
    assert ext._forest_svg([record]).startswith('<figure class="claims-forest"><svg')


def test_the_front_page_adjusts_over_the_book_and_groups_by_question(monkeypatch):
    import importlib
    import sys

    pytest.importorskip("sphinx")
    from calnotes.book import chapters

    monkeypatch.syspath_prepend(str(chapters.BOOK_DIR / "_ext"))
    monkeypatch.delitem(sys.modules, "claims_summary", raising=False)
    ext = importlib.import_module("claims_summary")
    base = {"chapter": "05", "cite": "c", "effect": "e", "paper": "", "premise": {"id": None,
            "state": ""}, "phase": "exploratory", "adjusted": None}
    rows = [  # two key claims: Holm over 2 gives 0.06 and 0.06 to the second and first
        {**base, "id": "a", "claim": "A", "question": "Q", "key": True, "p": 0.03,
         "verdict": "reproduces", "verdict_raw": "reproduces"},
        {**base, "id": "b", "claim": "B", "question": "Q", "key": True, "p": 0.04,
         "verdict": "reproduces", "verdict_raw": "reproduces"},
        {**base, "id": "c", "claim": "C", "question": "", "key": False, "p": 0.5,
         "verdict": "reported size ruled out", "verdict_raw": "reported size ruled out",
         "premise": {"id": "a", "state": "fails here"}},
    ]
    ext._adjust(rows)
    assert [r["verdict"] for r in rows] == ["inconclusive", "inconclusive",
                                            "reported size ruled out"]
    assert rows[0]["adjusted"]["method"] == "Holm"
    table = ext._counts_table([("Meta", "05.html", "05", rows)])
    assert "<td>2 (0)</td>" in table  # reproduces: 2 own verdicts, none after Holm
    assert "2: 1 reproduces, 1 reported size ruled out" in table  # Q and C
    listing = ext._chapter_list("Meta", "05.html", "05", rows)
    assert listing.count('class="claim-question"') == 1 and "(premise fails here)" in listing
    assert "2 questions, 3 claims" in listing
