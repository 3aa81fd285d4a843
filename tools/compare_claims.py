"""Before/after table of the book's verdict counts, by claim and by question, raw and
adjusted, from two outputs of ``python -m calnotes claims --json``.

    python -m calnotes claims --json > after.json      # (and the same at an older commit)
    python tools/compare_claims.py before.json after.json

An output without ``verdict_raw`` (older evaluators) has one verdict per claim, counted as
both raw and adjusted. Questions are read from the newer file (by chapter and id), so that
both sides group claims the same way; a claim without a question is its own. Prints the
counts as Markdown tables, then every claim whose verdict changed, with why (read from the
two records: a premise no longer replacing the claim's verdict, an interval now read
against the reported size, a method that did not train, the multiplicity adjustment, a
test restated, an estimate changed by new runs or by resampling seeds).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from calnotes import stats as st
from calnotes.runs.verdicts import question_verdict


def _load(path: str) -> dict[tuple[str, str], dict[str, Any]]:
    records = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(records, list):
        raise ValueError(f"{path}: expected a JSON list of claims")
    return {(str(r["chapter"]), str(r["id"])): r for r in records}


def _raw(r: dict[str, Any]) -> str:
    return str(r.get("verdict_raw") or r["verdict"])


def _counts(records: dict[tuple[str, str], dict[str, Any]],
            questions: dict[tuple[str, str], str]) -> dict[str, Counter[str]]:
    out: dict[str, Counter[str]] = {}
    for kind, get in (("raw", _raw), ("adjusted", lambda r: str(r["verdict"]))):
        out[f"claims, {kind}"] = Counter(get(r) for r in records.values())
        groups: dict[tuple[str, str], list[str]] = {}
        for k, r in records.items():
            groups.setdefault((k[0], questions.get(k, r["claim"])), []).append(get(r))
        out[f"questions, {kind}"] = Counter(question_verdict(v) for v in groups.values())
    return out


def _close(x: Any, y: Any) -> bool:
    if x is None or y is None:
        return x is None and y is None
    return abs(float(x) - float(y)) <= 1e-6 * max(1.0, abs(float(x)), abs(float(y)))


def why_changed(b: dict[str, Any] | None, a: dict[str, Any] | None) -> str:
    """Why a claim's verdict differs between record ``b`` (before) and ``a`` (after)."""
    if b is None:
        return ("declared since (confirmatory round)" if a and a.get("phase") == "confirmatory"
                else "declared since")
    if a is None:
        return "withdrawn or restated under another id"
    reasons = []
    raw = _raw(a)
    if b["verdict"] == st.PREMISE_FAILS:
        reasons.append("its premise no longer replaces its own verdict"
                       + (f" (premise {a['premise']['state']})" if isinstance(
                           a.get("premise"), dict) and a["premise"].get("state") else ""))
    if raw == st.NOT_TRAINED:
        reasons.append("a method it compares did not train")
    if raw in (st.SIZE_RULED_OUT, st.SIZE_RULED_OUT_DIRECTION):
        reasons.append("its interval excludes the reported size")
    if any(not _close(b.get(k), a.get(k)) for k in ("paper_value", "null")) or \
            b.get("direction") != a.get("direction"):
        reasons.append(f"test restated (reported {b.get('paper_value')} -> "
                       f"{a.get('paper_value')}, null {b.get('null')} -> {a.get('null')}, "
                       f"{b.get('direction')} -> {a.get('direction')})")
    if not (_close(b.get("estimate"), a.get("estimate")) and _close(b.get("low"), a.get("low"))
            and _close(b.get("high"), a.get("high"))):
        reasons.append(f"interval {b.get('effect')} -> {a.get('effect')} ({a.get('design')}, "
                       f"{a.get('n_seeds')} seeds)")
    if a["verdict"] != raw:
        family = (a.get("adjusted") or {}).get("family", "")
        reasons.append(f"adjusted for multiplicity ({family})")
    return "; ".join(reasons) or "verdict rule (same interval, same test)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    args = parser.parse_args(argv)
    before, after = _load(args.before), _load(args.after)
    questions = {k: str(r.get("question") or r["claim"]) for k, r in after.items()}
    cb, ca = _counts(before, questions), _counts(after, questions)
    for table in cb:
        verdicts = sorted(set(cb[table]) | set(ca[table]))
        print(f"\n### {table}\n\n| verdict | before | after |\n|---|---:|---:|")
        for v in verdicts:
            print(f"| {v} | {cb[table].get(v, 0)} | {ca[table].get(v, 0)} |")
        print(f"| total | {sum(cb[table].values())} | {sum(ca[table].values())} |")
    print("\n### changed verdicts (raw; adjusted in brackets where it differs)\n")
    print("| chapter | claim | before | after | why |\n|---|---|---|---|---|")
    for k in sorted(set(before) | set(after)):
        b, a = before.get(k), after.get(k)
        vb = "(absent)" if b is None else _raw(b)
        va = "(absent)" if a is None else _raw(a) + (
            f" [{a['verdict']}]" if a["verdict"] != _raw(a) else "")
        if vb != va:
            print(f"| {k[0]} | {k[1]} | {vb} | {va} | {why_changed(b, a)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
