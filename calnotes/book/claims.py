"""A chapter's claims in the book: its claims file evaluated on the stored runs
(:func:`claims_table`), shown as a table and glued for the front page (:func:`show_claims`),
and the verdicts its prose reads (:func:`verdict_of`); ``python -m calnotes claims``.

Multiplicity is book-wide (:func:`calnotes.runs.verdicts.adjust_verdicts`): a chapter's
table carries each claim's own verdict (``verdict``, what the prose reads) and, beside it,
the verdict adjusted over its family (``verdict_adjusted``, ``adjusted``), which needs
every chapter's evaluation: a chapter shows it once every chapter's evaluation is cached
for the present inputs (``python -m calnotes claims`` evaluates them all; the front page
adjusts the glued records itself). Each chapter's evaluation is cached in the store
(``<results>/.claims-cache/``), keyed by the hash of its inputs: the claims file, the
library's source (the code of every measure and study), the manifests of the runs stored
under the chapter's labels, and the claims file's last commit (for the dating); each entry
records those inputs, when and how fast it was computed, and on what machine
(:func:`evaluation_provenance`: the CPU, torch's kernels, the threads and the load, which
decide what a timed claim measures)."""

from __future__ import annotations

import datetime
import functools
import hashlib
import html
import json
import math
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from calnotes.book.chapters import BOOK_DIR, resolve_chapter
from calnotes.runs.claims import TABLE_COLUMNS, evaluate_claims, load_claims
from calnotes.runs.store import RunStore
from calnotes.runs.verdicts import adjust_verdicts, premise_note, question_of

__all__ = [
    "CLAIMS_DIR", "CLAIMS_MIME", "JSON_FIELDS", "SUMMARY_COLUMNS", "adjust_book",
    "book_claims_table", "cache_entry", "evaluation_provenance", "machine_text",
    "claims_path", "claims_table", "cite_text", "format_effect", "show_claims",
    "summary_records", "verdict_badge", "verdict_of",
]

CLAIMS_DIR = BOOK_DIR / "claims"
#: Mime type of the claims' JSON records in the glued bundle (read by the front page).
CLAIMS_MIME = "text/vnd.calnotes.claims+json"
#: Fields of each glued record.
SUMMARY_COLUMNS = ("chapter", "page", "id", "claim", "cite", "verdict", "effect", "paper",
                   "estimate", "low", "high", "paper_value", "null", "direction", "unit", "key",
                   "question", "verdict_raw", "adjusted", "premise", "design", "n_seeds",
                   "detectable", "declared", "phase", "twin", "sesoi", "planned_seeds", "p",
                   "under_way")
#: Fields of each claim in ``python -m calnotes claims --json``: ``verdict`` is the verdict
#: after multiplicity adjustment, ``verdict_raw`` the claim's own.
JSON_FIELDS = ("id", "question", "verdict", "verdict_raw", "adjusted", "premise", "estimate",
               "low", "high", "paper_value", "null", "direction", "design", "n_seeds",
               "detectable", "declared", "phase", "key", "twin", "sesoi", "planned_seeds",
               "under_way")
CACHE_DIR = ".claims-cache"
_ROOT = Path(__file__).resolve().parents[1]


def claims_path(chapter: str) -> Path:
    """``book/claims/NN.yaml`` of a chapter named as :func:`resolve_chapter` accepts."""
    return CLAIMS_DIR / f"{resolve_chapter(chapter).stem[:2]}.yaml"


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@functools.cache
def _code_version() -> str:
    """Hash of the library's Python source (measures, studies, evaluator, statistics)."""
    h = hashlib.sha256()
    for path in sorted(_ROOT.rglob("*.py")):
        h.update(str(path.relative_to(_ROOT)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def _inputs(chapter: str, store: RunStore) -> dict[str, Any]:
    """What a chapter's evaluation depends on, hashed."""
    path = claims_path(chapter)
    spec = load_claims(path)
    labels = {lab for arm in spec["arms"].values()
              for lab in (arm["label"] if isinstance(arm["label"], list) else [arm["label"]])}
    runs = hashlib.sha256()
    count = 0
    for folder in store._folders():
        try:
            label = json.loads((folder / "provenance.json").read_text("utf-8")).get("label")
        except (OSError, ValueError, AttributeError):
            label = None
        if label in labels:
            runs.update(folder.name.encode() + _sha((folder / "manifest.json").read_bytes())
                        .encode())
            count += 1
    try:
        commit = subprocess.run(["git", "log", "-1", "--format=%H", "--", path.name],
                                cwd=path.parent, capture_output=True, text=True,
                                timeout=60).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return {"chapter": chapter, "claims_file": _sha(path.read_bytes()),
            "claims_commit": commit, "code": _code_version(), "runs": count,
            "runs_hash": runs.hexdigest()}


def cache_entry(chapter: str, store: RunStore) -> tuple[Path, dict[str, Any]]:
    """The cache file a chapter's evaluation is stored in for its present inputs
    (``<results>/.claims-cache/NN-<16 hex digits of the inputs' hash>.json``), and those
    inputs."""
    inputs = _inputs(chapter, store)
    key = _sha(json.dumps(inputs, sort_keys=True).encode())[:16]
    return store.root / CACHE_DIR / f"{chapter}-{key}.json", inputs


def _table(chapter: str, root: str | None) -> pd.DataFrame:
    return _evaluation(chapter, root)[0]


@functools.cache
def _evaluation(chapter: str, root: str | None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """A chapter's claims table and the provenance of its evaluation: read from the cache
    entry of its present inputs, else evaluated and written there (atomically)."""
    import calnotes.book.evidence  # noqa: F401  (registers the chapters' measures)

    store = RunStore(root)
    cache, inputs = cache_entry(chapter, store)
    if cache.is_file():
        try:
            entry = json.loads(cache.read_text(encoding="utf-8"))
            provenance = dict(entry["provenance"])
            if provenance.get("inputs") == inputs:
                provenance.setdefault("machine", {})
                return (_typed(pd.DataFrame(entry["rows"], columns=list(TABLE_COLUMNS))),
                        provenance)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # unreadable or not this chapter's: computed again and rewritten
    machine = _machine()
    start = time.perf_counter()
    table = evaluate_claims(load_claims(claims_path(chapter)), store)
    provenance = {"inputs": inputs, "key": cache.stem.split("-")[-1],
                  "seconds": round(time.perf_counter() - start, 1),
                  "created": datetime.datetime.now(datetime.timezone.utc)
                  .isoformat(timespec="seconds"),
                  "machine": machine}
    entry = {"provenance": provenance,
             "rows": [{k: _plain(v) for k, v in row.items()}
                      for row in table.to_dict(orient="records")]}
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        tmp = cache.with_name(f".tmp-{os.getpid()}-{cache.name}")
        tmp.write_text(json.dumps(entry, indent=1, allow_nan=False), encoding="utf-8")
        os.replace(tmp, cache)
    except OSError:
        pass  # a read-only store: the table is still returned
    return table, provenance


def _machine() -> dict[str, Any]:
    """Where an evaluation runs: the CPU (:func:`calnotes.training.devices.cpu_features`),
    torch's threads and the one-minute load average when it starts (``None`` where the
    system keeps none)."""
    import torch

    from calnotes.training.devices import cpu_features

    try:
        load: float | None = round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        load = None
    return {**cpu_features(), "threads": torch.get_num_threads(), "load_1min": load}


def evaluation_provenance(chapter: str, store: RunStore | None = None) -> dict[str, Any]:
    """The provenance of the evaluation a chapter's claims table reads (evaluated and cached
    first if it is not yet): its ``inputs``, ``created``, ``seconds`` and ``machine`` (the
    CPU's ``cpu_model`` and ``torch_cpu_capability``, ``threads``, ``load_1min``; empty
    in an entry written before machines were recorded)."""
    root = None if store is None else str(store.root)
    return dict(_evaluation(resolve_chapter(chapter).stem[:2], root)[1])


def machine_text(machine: dict[str, Any]) -> str:
    """An evaluation's machine (:func:`evaluation_provenance`'s ``machine``) in words:
    ``"AMD EPYC (AVX2 kernels, load 0.05)"``; ``"an unrecorded machine"`` where it is
    empty."""
    if not isinstance(machine, dict):
        raise TypeError(f"machine must be a dict, got {type(machine).__name__}")
    if not machine.get("cpu_model"):
        return "an unrecorded machine"
    details = [f"{machine['torch_cpu_capability']} kernels"
               if machine.get("torch_cpu_capability") else None,
               f"load {machine['load_1min']:.2f}"
               if isinstance(machine.get("load_1min"), (int, float)) else None]
    inner = ", ".join(d for d in details if d)
    return f"{machine['cpu_model']} ({inner})" if inner else str(machine["cpu_model"])


def _plain(x: Any) -> Any:
    """A table cell as JSON holds it exactly: Python numbers (repr round-trips a float),
    NaN as null."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    if isinstance(x, (int, np.integer)):
        return int(x)
    if isinstance(x, (float, np.floating)):
        return None if math.isnan(x) else float(x)
    return x


_NUMERIC = ("n", "estimate", "low", "high", "detectable", "paper", "null", "sesoi", "p",
            "p_adjusted", "margin", "n_seeds", "planned_seeds")
_BOOLEAN = ("key", "under_way")


def _typed(table: pd.DataFrame) -> pd.DataFrame:
    """A cached table's columns as evaluate_claims types them (JSON's null -> NaN)."""
    for col in _NUMERIC:
        table[col] = pd.to_numeric(table[col], errors="coerce").astype(float)
    for col in ("n", "n_seeds", "planned_seeds"):
        table[col] = table[col].fillna(0).astype(int)
    for col in _BOOLEAN:
        table[col] = table[col].fillna(False).astype(bool)
    for col in set(TABLE_COLUMNS) - set(_NUMERIC) - set(_BOOLEAN):
        table[col] = table[col].where(table[col].notna(), "")
    return table


def _chapters() -> list[str]:
    from calnotes.book.chapters import chapter_paths

    return [p.stem[:2] for p in chapter_paths() if claims_path(p.stem[:2]).is_file()]


def _cached(chapter: str, root: str | None) -> bool:
    """Whether the chapter's evaluation is cached for its present inputs."""
    return cache_entry(chapter, RunStore(root))[0].is_file()


def adjust_book(tables: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The chapters' tables (``{chapter: table}``) in one, with ``chapter``, each claim's
    own ``verdict`` and the book-wide ``verdict_adjusted`` beside it."""
    parts = []
    for ch, t in tables.items():
        t = t.copy()
        t.insert(0, "chapter", ch)
        parts.append(t)
    book = adjust_verdicts(pd.concat(parts, ignore_index=True))
    book["verdict_adjusted"] = book["verdict"]
    book["verdict"] = book["verdict_raw"]
    return book


@functools.cache
def _book(root: str | None) -> pd.DataFrame:
    return adjust_book({ch: _table(ch, root) for ch in _chapters()})


def book_claims_table(store: RunStore | None = None) -> pd.DataFrame:
    """Every chapter's claims in one table, with ``chapter``, each claim's own ``verdict``
    and, beside it, ``verdict_adjusted``, ``p_adjusted`` and ``adjusted`` (the method and
    family of :func:`calnotes.runs.verdicts.adjust_verdicts`)."""
    root = None if store is None else str(store.root)
    return _book(root).copy()


def claims_table(chapter: str, store: RunStore | None = None) -> pd.DataFrame:
    """Every claim of ``chapter`` with its evidence and its own verdict (see
    :func:`calnotes.runs.claims.evaluate_claims`), and the book-wide adjusted verdict
    beside it (:func:`book_claims_table`); evaluated once per process and cached in the
    store."""
    root = None if store is None else str(store.root)
    return _chapter_table(resolve_chapter(chapter).stem[:2], root).copy()


@functools.cache
def _chapter_table(ch: str, root: str | None) -> pd.DataFrame:
    chapters = _chapters()
    if ch in chapters and all(_cached(c, root) for c in chapters if c != ch):
        book = _book(root)
        return book[book["chapter"] == ch].drop(columns="chapter").reset_index(drop=True)
    table = _table(ch, root).copy()  # the other chapters not evaluated yet: no adjustment
    table["verdict_adjusted"] = table["verdict"]
    return table


def verdict_of(chapter: str, claim_id: str) -> str:
    """The claim's own verdict (before multiplicity adjustment), for the prose and its
    checks."""
    table = claims_table(chapter)
    hit = table.loc[table["id"] == claim_id, "verdict"]
    if hit.empty:
        raise ValueError(f"chapter {chapter} declares no claim {claim_id!r}")
    return str(hit.iloc[0])


@functools.cache
def _bibliography() -> dict[str, tuple[str, str]]:
    """``key -> (authors' short form, year)`` from book/references.bib."""
    text = (BOOK_DIR / "references.bib").read_text(encoding="utf-8")
    out = {}
    for match in re.finditer(r"@\w+\{([^,]+),(.*?)\n\}", text, re.S):
        key, body = match.group(1).strip(), match.group(2)
        author = re.search(r"author\s*=\s*\{(.*?)\},?\s*\n", body, re.S)
        year = re.search(r"year\s*=\s*\{?(\d{4})", body)
        names = [a.strip() for a in author.group(1).split(" and ")] if author else []
        surnames = [n.split(",")[0].strip("{} ") if "," in n else n.split()[-1].strip("{}")
                    for n in names]
        short = (surnames[0] if len(surnames) == 1 else " & ".join(surnames) if
                 len(surnames) == 2 else f"{surnames[0]} et al.") if surnames else key
        out[key] = (short, year.group(1) if year else "")
    return out


def cite_text(work: str, where: str) -> str:
    """``Guo et al. (2017), Table 1`` for a bibliography key and a place in the work."""
    short, year = _bibliography().get(work, (work, ""))
    return f"{short} ({year}), {where}" if year else f"{short}, {where}"


def format_effect(row: Any) -> str:
    """``-0.86 [-2.24, +0.51] points`` (``n/a`` without an interval)."""
    if isinstance(row, dict):
        row = pd.Series(row)
    if math.isnan(row["estimate"]):
        return "n/a"
    scale = max(abs(row["low"]), abs(row["high"])) if not math.isnan(row["low"]) else 1.0
    digits = 3 if scale < 1 else 2 if scale < 100 else 0
    unit = f" {row['unit']}" if row["unit"] else ""
    if math.isnan(row["low"]):
        return f"{row['estimate']:+.{digits}f}{unit} (one seed, no interval)"
    return (f"{row['estimate']:+.{digits}f} [{row['low']:+.{digits}f}, "
            f"{row['high']:+.{digits}f}]{unit}")


def verdict_badge(verdict: str) -> str:
    """The verdict as an HTML badge (``<span class="verdict verdict-<slug>">``), coloured by
    the book's CSS."""
    slug = re.sub(r"[^a-z]+", "-", verdict.lower()).strip("-")
    return f'<span class="verdict verdict-{slug}">{html.escape(verdict)}</span>'


def _verdict_cell(r: Any) -> str:
    """The claim's own verdict, its premise's note, and the adjusted verdict beside it."""
    cell = verdict_badge(r["verdict"])
    note = premise_note(r.get("premise_state") or "")
    if note:
        cell += f'<div class="claim-premise-note">{html.escape(note)}</div>'
    family = r.get("adjusted")
    if isinstance(family, str) and family:
        adjusted = r.get("verdict_adjusted") or r["verdict"]
        cell += (f'<div class="claim-adjusted">adjusted ({html.escape(family)}): '
                 f"{verdict_badge(adjusted)}</div>")
    return cell


def summary_records(chapter: str) -> list[dict[str, Any]]:
    """One short record per claim (:data:`SUMMARY_COLUMNS`) for the front page."""
    page = resolve_chapter(chapter).stem
    records = []
    for _, row in claims_table(chapter).iterrows():
        paper = "" if math.isnan(row["paper"]) else f"{row['paper']:+g}"
        records.append({
            "chapter": page[:2], "page": page, "id": row["id"], "claim": row["claim"],
            "cite": cite_text(row["work"], row["where"]), "verdict": row["verdict"],
            "effect": format_effect(row), "paper": paper,
            "estimate": _num(row["estimate"]), "low": _num(row["low"]),
            "high": _num(row["high"]), "paper_value": _num(row["paper"]),
            "null": _num(row["null"]), "direction": row["direction"], "unit": row["unit"],
            "key": bool(row["key"]), "question": question_of(row),
            "verdict_raw": row["verdict"],
            "adjusted": _adjusted(row),
            "premise": {"id": row["premise"] or None, "state": row.get("premise_state") or ""},
            "design": row["design"], "n_seeds": int(row.get("n_seeds") or 0),
            "detectable": _num(row["detectable"]), "declared": row["declared"],
            "phase": row.get("phase") or "exploratory",
            "twin": row.get("twin") or None, "sesoi": _num(row.get("sesoi")),
            "planned_seeds": int(row.get("planned_seeds") or 0) or None,
            "p": _num(row.get("p")), "under_way": bool(row.get("under_way", False)),
        })
        records[-1]["verdict"] = row.get("verdict_adjusted") or row["verdict"]
    return records


def _adjusted(row: Any) -> dict[str, Any] | None:
    """The adjustment of a claim's verdict: method and family, adjusted p-value."""
    family = row.get("adjusted")
    if not isinstance(family, str) or not family:
        return None
    return {"method": family.split(",")[0].split(" (")[0], "family": family,
            "p": _num(row.get("p")), "p_adjusted": _num(row.get("p_adjusted")),
            "verdict": row.get("verdict_adjusted") or row["verdict"]}


def _num(x: Any) -> float | None:
    if x is None or isinstance(x, str):
        return None
    return None if math.isnan(float(x)) else float(x)


class _ClaimsView:
    """The chapter's claims table: HTML on the page, JSON records for the front page."""

    def __init__(self, chapter: str) -> None:
        self.chapter = resolve_chapter(chapter).stem[:2]
        self.table = claims_table(chapter)

    def _repr_html_(self) -> str:
        rows = []
        groups: dict[str, list[Any]] = {}
        for _, r in self.table.iterrows():
            groups.setdefault(question_of(r), []).append(r)
        for question, members in groups.items():
            if len(members) > 1 or (isinstance(members[0].get("question"), str)
                                    and members[0].get("question")):
                tally = ", ".join(f"{n} {v}" for v, n in pd.Series(
                    [m["verdict"] for m in members]).value_counts().items())
                rows.append(f'<tr class="claim-question"><td colspan="5"><strong>'
                            f'{html.escape(question)}</strong> ({len(members)} claim'
                            f'{"s" if len(members) > 1 else ""}: {html.escape(tally)})'
                            f"</td></tr>")
            rows.extend(self._row(r) for r in members)
        head = "".join(f"<th>{h}</th>" for h in
                       ("Claim", "Work", "Our effect [95% interval]", "Reported", "Verdict"))
        widths = "".join(f'<col style="width: {w}%">' for w in (33, 15, 34, 7, 11))
        return (f'<table class="claims-table table"><colgroup>{widths}</colgroup>'
                f"<thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>")

    def _row(self, r: Any) -> str:
        """One claim's row of the table."""
        claim = f"<strong>{html.escape(r['claim'])}</strong>"
        if isinstance(r["original"], str) and r["original"].strip():
            claim += (f'<div class="claim-original" lang="und">'
                      f'{html.escape(r["original"].strip())}</div>')
        if isinstance(r["premise"], str) and r["premise"]:  # pandas reads None as NaN
            claim += f'<div class="claim-premise">premise: {html.escape(r["premise"])}</div>'
        ours = html.escape(format_effect(r))
        details = html.escape(r["evidence"])
        declared = r["declared"]
        if declared:
            details += (f" {html.escape(declared.capitalize())}." if
                        declared.startswith("declared") else
                        f" Declared {html.escape(declared)}.")
        paper = "" if math.isnan(r["paper"]) else f"{r['paper']:+g}"
        return (
            f'<tr id="claim-{self.chapter}-{r["id"]}"><td>{claim}</td>'
            f"<td>{html.escape(cite_text(r['work'], r['where']))}</td>"
            f'<td><span class="claim-effect">{ours}</span>'
            f'<div class="claim-evidence">{details}</div></td>'
            f"<td>{html.escape(paper)}</td><td>{_verdict_cell(r)}</td></tr>")

    def __repr__(self) -> str:
        return "\n".join(f"{r['id']}: {r['verdict']} ({format_effect(r)})"
                         for _, r in self.table.iterrows())

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        return {"text/plain": repr(self), "text/html": self._repr_html_(),
                CLAIMS_MIME: json.dumps(summary_records(self.chapter))}


def show_claims(chapter: str, glue_name: str | None = None) -> pd.DataFrame:
    """Display the chapter's claims table and glue it (default name ``chNN_claims``) for the
    front page; returns the table."""
    from IPython.display import HTML, display
    from myst_nb import glue as myst_glue

    view = _ClaimsView(chapter)
    display(HTML(view._repr_html_()))
    myst_glue(glue_name or f"ch{view.chapter}_claims", view, display=False)
    return view.table


def main(argv: list[str] | None = None) -> int:
    """``python -m calnotes claims [CHAPTER] [--json]``."""
    import argparse

    from calnotes.book.chapters import chapter_paths

    parser = argparse.ArgumentParser(prog="python -m calnotes claims",
                                     description="the verdict table of the book's claims, "
                                                 "evaluated on the stored runs")
    parser.add_argument("chapter", nargs="?", help="a chapter (number, file or slug); "
                                                   "default: every chapter with a claims file")
    parser.add_argument("--json", action="store_true", help="JSON records instead of a table")
    args = parser.parse_args(argv)
    chapters = ([args.chapter] if args.chapter else
                [p.stem[:2] for p in chapter_paths() if claims_path(p.stem[:2]).is_file()])
    if not args.chapter:
        book_claims_table()  # every chapter evaluated (or read from the cache) first
    records = [rec for ch in chapters for rec in summary_records(ch)]
    if args.json:
        print(json.dumps(records, indent=1, ensure_ascii=False))
        return 0
    last = None
    for rec in records:
        if (rec["chapter"], rec["question"]) != last:
            last = (rec["chapter"], rec["question"])
            print(f"{rec['chapter']}  {rec['question']}")
        adjusted = (f"  [adjusted: {rec['verdict']}, {rec['adjusted']['family']}]"
                    if rec["adjusted"] and rec["verdict"] != rec["verdict_raw"] else "")
        note = premise_note(rec["premise"]["state"])
        print(f"      {rec['id']:<34} {rec['verdict_raw']:<34} {rec['effect']}"
              + (f"  (reported {rec['paper']})" if rec["paper"] else "")
              + (f"  {note}" if note else "") + adjusted)
    return 0
