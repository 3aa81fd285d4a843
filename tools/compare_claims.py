"""Before/after table of the book's verdict counts, by claim and by question, raw and
adjusted, from two outputs of ``python -m calnotes claims --json``.

    python -m calnotes claims --json > after.json      # (and the same at an older commit)
    python tools/compare_claims.py before.json after.json

An output without ``verdict_raw`` (older evaluators) has one verdict per claim, counted as
both raw and adjusted. Questions are read from the newer file (by chapter and id), so that
both sides group claims the same way; a claim without a question is its own. Prints the
counts as Markdown tables, then every claim whose verdict changed.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

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
    print("| chapter | claim | before | after |\n|---|---|---|---|")
    for k in sorted(set(before) | set(after)):
        b, a = before.get(k), after.get(k)
        vb = "(absent)" if b is None else _raw(b)
        va = "(absent)" if a is None else _raw(a) + (
            f" [{a['verdict']}]" if a["verdict"] != _raw(a) else "")
        if vb != va:
            print(f"| {k[0]} | {k[1]} | {vb} | {va} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
