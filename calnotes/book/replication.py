"""The confirmatory round beside its exploratory twins: one row per confirmatory claim.

A confirmatory claim replicates its twin on fresh seeds declared before its runs (see
``book/claims/confirmatory_plan.csv`` and :mod:`calnotes.runs.confirm`). Each verdict is
read on the side the work claims:

- *supported*: ``reproduces``, ``reproduces, larger than reported``, ``direction
  reproduces; reported size ruled out`` (the interval lies on the claimed side);
- *contradicted*: ``does not reproduce`` (it lies wholly on the other side);
- *open*: anything else (the interval contains the null).

and the pair is *replicated* (supported twice), *confirmed a failure* (contradicted twice),
*newly decided* (open, then decided), *not replicated* (decided, then open), *reversed*
(decided both times, on opposite sides) or *both open*. A confirmatory claim with fewer
stored seeds than planned is *under way*: its verdict is not read.

The winner's curse, measured: among twins supported in the exploratory round, the ratio
``confirmatory estimate / exploratory estimate`` (below 1: the effect shrank).
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats as _st

from calnotes import stats as st
from calnotes.runs.claims import under_way_text

__all__ = ["AGREEMENTS", "HELD_UP", "PLAN_PATH", "agreement", "confirmatory_glue",
           "confirmatory_sentence", "held_up", "held_up_html", "read_plan", "replication_table",
           "round_cost", "side", "winners_curse"]

#: Largest number of seeds :func:`replication_table`'s ``seeds_needed`` counts up to.
MAX_SEEDS_NEEDED = 2000

PLAN_PATH = Path(__file__).resolve().parents[2] / "book" / "claims" / "confirmatory_plan.csv"
SUPPORTED = (st.REPRODUCES, st.LARGER, st.SIZE_RULED_OUT_DIRECTION)
AGREEMENTS = ("replicated", "confirmed a failure", "newly decided", "not replicated",
              "reversed", "both open", "under way")


def side(verdict: str) -> str:
    """``supported``, ``contradicted`` or ``open``: which side of the null a verdict's
    interval lies on (notes after the verdict, such as a premise's, are ignored)."""
    if not isinstance(verdict, str):
        raise TypeError(f"verdict must be a string, got {type(verdict).__name__}")
    base = verdict.split(" (")[0].strip()
    if base in SUPPORTED:
        return "supported"
    if base == st.FAILS:
        return "contradicted"
    return "open"


def agreement(exploratory: str, confirmatory: str) -> str:
    """The pair's category (module docstring) from the two verdicts."""
    a, b = side(exploratory), side(confirmatory)
    if a == b:
        return {"supported": "replicated", "contradicted": "confirmed a failure",
                "open": "both open"}[a]
    if a == "open":
        return "newly decided"
    if b == "open":
        return "not replicated"
    return "reversed"


def read_plan(path: str | Path = PLAN_PATH) -> pd.DataFrame:
    """The declared plan: one row per confirmatory claim (``claim``, ``twin``, ``sesoi``,
    ``sd``, ``alpha``, ``needed``, ``planned``, ``power_planned``, ``why``, ...)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no confirmatory plan at {path}")
    plan = pd.read_csv(path)
    missing = {"claim", "twin", "sesoi", "alpha", "planned", "power_planned"} - set(plan)
    if missing:
        raise ValueError(f"{path}: the plan lacks the column(s) {sorted(missing)}")
    return plan


def _achieved_sd(row: Mapping[str, Any]) -> float:
    """The SD of the paired differences read back from a finished claim's t interval
    (``se = half / t_{0.975, n-1}``, ``sd = se √n``); NaN without an interval."""
    n = int(row["n"]) if not pd.isna(row["n"]) else 0
    if n < 2 or not all(math.isfinite(float(row[k])) for k in ("low", "high")):
        return math.nan
    half = (float(row["high"]) - float(row["low"])) / 2
    se = half / float(_st.t.ppf(0.975, n - 1))
    return se * math.sqrt(n) if se > 0 else math.nan


def _power_achieved(row: Mapping[str, Any], sesoi: float, alpha: float) -> float:
    """Post hoc power at the SESOI of the achieved t design, at the round's SD
    (:func:`_achieved_sd`)."""
    sd = _achieved_sd(row)
    return st.power_t(sesoi, sd, int(row["n"]), alpha) if math.isfinite(sd) else math.nan


def _seeds_needed(row: Mapping[str, Any], sesoi: float, alpha: float) -> float:
    """Seeds a fresh round would need for 80% power at the SESOI if its spread were this
    round's (:func:`_achieved_sd`); NaN without an interval, ``inf`` beyond
    :data:`MAX_SEEDS_NEEDED`."""
    sd = _achieved_sd(row)
    if not math.isfinite(sd):
        return math.nan
    size = st.seeds_for_power(sesoi, sd, alpha, 0.8, max_n=MAX_SEEDS_NEEDED)
    return float(size.n) if size.reached else math.inf


def replication_table(book: pd.DataFrame, plan: pd.DataFrame) -> pd.DataFrame:
    """One row per planned confirmatory claim: the declaration's SESOI, planned and achieved
    seeds, the planned and the achieved power at the SESOI, the seeds a new round would need
    for 80% power at this round's spread (``seeds_needed``), both rounds' estimates,
    intervals and verdicts (their multiplicity-adjusted verdicts where ``book`` has
    ``verdict_adjusted``), their agreement and the ratio of the estimates. ``book``:
    :func:`calnotes.book.claims.book_claims_table`."""
    need = {"id", "estimate", "low", "high", "n", "verdict", "under_way"}
    if not isinstance(book, pd.DataFrame) or need - set(book):
        raise ValueError(f"book must be the book's claims table with columns {sorted(need)}")
    by_id = book.set_index("id")
    rows = []
    for p in plan.to_dict("records"):
        cid, twin = str(p["claim"]), str(p["twin"])
        if cid not in by_id.index or twin not in by_id.index:
            raise ValueError(f"the plan's claim {cid!r} or its twin {twin!r} is not in the "
                             f"claims files")
        c, t = by_id.loc[cid], by_id.loc[twin]
        verdict_of = (lambda r: str(r.get("verdict_adjusted", r["verdict"])))  # noqa: E731
        achieved = 0 if pd.isna(c["n"]) else int(c["n"])
        planned = int(p["planned"])
        done = not bool(c["under_way"])  # the evaluator's reading of the declaration
        conf_verdict = verdict_of(c) if done else f"under way ({achieved} of {planned})"
        ratio = (float(c["estimate"]) / float(t["estimate"])
                 if done and float(t["estimate"]) != 0 else math.nan)
        rows.append({
            "chapter": c.get("chapter", ""), "claim": cid, "twin": twin,
            "work": c.get("work", ""), "sesoi": float(p["sesoi"]), "planned": planned,
            "achieved": achieved, "power_planned": float(p["power_planned"]),
            "power_achieved": (_power_achieved(c, float(p["sesoi"]), float(p["alpha"]))
                               if done else math.nan),
            "seeds_needed": (_seeds_needed(c, float(p["sesoi"]), float(p["alpha"]))
                             if done else math.nan),
            "exploratory": float(t["estimate"]), "exploratory_low": float(t["low"]),
            "exploratory_high": float(t["high"]), "exploratory_verdict": verdict_of(t),
            "confirmatory": float(c["estimate"]) if done else math.nan,
            "confirmatory_low": float(c["low"]) if done else math.nan,
            "confirmatory_high": float(c["high"]) if done else math.nan,
            "confirmatory_verdict": conf_verdict, "declared": c.get("declared", ""),
            "agreement": agreement(verdict_of(t), conf_verdict) if done else "under way",
            "ratio": ratio,
        })
    return pd.DataFrame(rows)


def winners_curse(table: pd.DataFrame) -> dict[str, float]:
    """Among finished pairs whose twin was supported: how many, the median ratio of the
    confirmatory to the exploratory estimate, and the share that shrank (ratio < 1)."""
    done = table[(table["agreement"] != "under way")
                 & (table["exploratory_verdict"].map(side) == "supported")]
    ratios = done["ratio"].to_numpy(dtype=np.float64)
    ratios = ratios[np.isfinite(ratios)]
    if ratios.size == 0:
        return {"pairs": 0, "median_ratio": math.nan, "shrank": math.nan}
    return {"pairs": int(ratios.size), "median_ratio": float(np.median(ratios)),
            "shrank": float(np.mean(ratios < 1))}


#: Plain words for where the fresh seeds left a claim, in the order :func:`held_up_html`
#: lists them: its verdict's :func:`side`, with a reported size ruled out told apart.
HELD_UP = {"holds": "Holds on fresh seeds",
           "direction": "Holds in direction, but the reported size is ruled out",
           "contradicted": "Does not hold",
           "size": "The reported size is ruled out, the direction undecided",
           "open": "Undecided on fresh seeds", "under way": "Still training"}


def _held_up_kind(agreement_: str, verdict: str) -> str:
    """The key of :data:`HELD_UP` for a confirmatory claim's agreement and verdict."""
    if agreement_ == "under way":
        return "under way"
    base, where = verdict.split(" (")[0].strip(), side(verdict)
    if base in (st.SIZE_RULED_OUT_DIRECTION, st.SIZE_RULED_OUT):
        return "direction" if where == "supported" else "size"
    return "holds" if where == "supported" else where


def _work_order(work: str) -> tuple[str, str]:
    """Works by year of publication, then by name (``cite_text``'s ``Name (Year)``)."""
    from calnotes.book.claims import cite_text

    name = cite_text(work, "").rstrip(", ")
    year = name.rsplit("(", 1)[-1].rstrip(")") if name.endswith(")") else ""
    return year, name


def held_up(table: pd.DataFrame) -> dict[str, dict[str, list[str]]]:
    """Per work (by year), the confirmatory claims by where the fresh seeds left them:
    ``{work: {heading of HELD_UP: [claim id, ...]}}``, headings in :data:`HELD_UP`'s order."""
    out: dict[str, dict[str, list[str]]] = {}
    for row in table.to_dict("records"):
        kind = _held_up_kind(str(row["agreement"]), str(row["confirmatory_verdict"]))
        out.setdefault(str(row["work"]), {h: [] for h in HELD_UP.values()})[
            HELD_UP[kind]].append(str(row["claim"]))
    return {work: {h: ids for h, ids in out[work].items() if ids}
            for work in sorted(out, key=_work_order)}


def held_up_html(table: pd.DataFrame, book: pd.DataFrame) -> str:
    """:func:`held_up` as HTML for a page: per work, each claim's confirmatory verdict as a
    badge, its wording linked to its row in its chapter, its effect on the fresh seeds and
    the first round's verdict with the pair's agreement. ``book``: the book's claims table
    (for the wording and the effect), ``table``: :func:`replication_table` of it."""
    from calnotes.book.chapters import resolve_chapter
    from calnotes.book.claims import format_effect, verdict_badge

    if not {"id", "claim", "unit"} <= set(book):
        raise ValueError("book must be the book's claims table (columns id, claim, unit)")
    by_id, rows = book.set_index("id"), table.set_index("claim")
    works = []
    for work, groups in held_up(table).items():
        parts = []
        for heading, ids in groups.items():
            items = []
            for cid in ids:
                c, r = by_id.loc[cid], rows.loc[cid]
                page = resolve_chapter(str(r["chapter"])).with_suffix(".html").name
                first = f"first round: {r['exploratory_verdict']}"
                if r["agreement"] == "under way":  # no verdict, no effect read yet
                    badge, line = "", f"{r['achieved']} of {r['planned']} seeds stored; {first}"
                else:
                    badge = verdict_badge(str(r["confirmatory_verdict"])) + " "
                    line = f"{format_effect(c)}; {first} ({r['agreement']})"
                items.append(
                    f'<li>{badge}<a href="{page}#claim-{r["chapter"]}-{cid}">'
                    f'{html.escape(c["claim"])}</a><div class="claim-line">{html.escape(line)}'
                    f"</div></li>")
            parts.append(f"<p>{html.escape(heading)} ({len(ids)}):</p><ul>{''.join(items)}</ul>")
        name = _work_order(work)[1]
        count = sum(map(len, groups.values()))
        works.append(f'<div class="held-up-work"><p><strong>{html.escape(name)}</strong>: '
                     f"{count} claim{'s' if count != 1 else ''} on fresh seeds</p>"
                     f"{''.join(parts)}</div>")
    return f'<div class="held-up">{"".join(works)}</div>'


def confirmatory_sentence(book: pd.DataFrame, claim_id: str) -> str:
    """A confirmatory claim's result in words, for a chapter's prose, from the book's claims
    table: ``"-1.55 [-2.43, -0.66] points over 10 fresh seeds; verdict after Holm over the
    round: reproduces"``, or before its last planned seed
    :func:`calnotes.runs.claims.under_way_text`."""
    from calnotes.book.claims import format_effect

    need = {"id", "phase", "n", "verdict", "under_way", "planned_seeds"}
    if not isinstance(book, pd.DataFrame) or not need <= set(book):
        raise ValueError(f"book must be the book's claims table (columns {sorted(need)})")
    rows = book.loc[book["id"] == claim_id]
    if rows.empty or rows.iloc[0]["phase"] != "confirmatory":
        raise ValueError(f"claim_id {claim_id!r} is no confirmatory claim of the book")
    r = rows.iloc[0]
    achieved = 0 if pd.isna(r["n"]) else int(r["n"])
    if r["under_way"]:
        return under_way_text(achieved, int(r["planned_seeds"]))
    verdict = str(r.get("verdict_adjusted", r["verdict"]))
    return (f"{format_effect(r)} over {achieved} fresh seeds; verdict after Holm over the "
            f"round: {verdict}")


def confirmatory_glue(chapter: str, book: pd.DataFrame, plan: pd.DataFrame) -> dict[str, str]:
    """``{"chNN_confirm_<twin>": confirmatory_sentence(...)}`` for each confirmatory claim
    of ``chapter`` (``"05"``) in ``plan`` (:func:`read_plan`): the words a chapter's prose
    quotes beside the exploratory verdict of the claim's twin."""
    if not isinstance(chapter, str) or not chapter.isdigit():
        raise ValueError(f"chapter must be a chapter number such as '05', got {chapter!r}")
    ours = plan[plan["chapter"].astype(str).str.zfill(2) == chapter.zfill(2)]
    return {f"ch{chapter.zfill(2)}_confirm_{row.twin}": confirmatory_sentence(book, row.claim)
            for row in ours.itertuples()}


def round_cost(specs: Mapping[str, Mapping[str, Any]], store: Any = None) -> pd.DataFrame:
    """Training cost of the round's stored runs, from their provenance: per chapter, the
    number of distinct runs in its confirmatory arms (``c-`` arms) and their seconds, and the
    devices they ran on. ``specs``: ``{chapter: loaded claims file}``."""
    from calnotes.runs.claims import arm_runs

    rows = []
    for ch, spec in specs.items():
        runs: dict[str, Any] = {}
        for name in spec["arms"]:
            if name.startswith("c-"):
                for run in arm_runs(spec, name, store).values():
                    runs[str(run.path)] = run
        if runs:
            seconds = [float(r.provenance.get("seconds", math.nan)) for r in runs.values()]
            devices = sorted({str(r.provenance.get("device", "?")) for r in runs.values()})
            rows.append({"chapter": ch, "runs": len(runs), "seconds": float(np.nansum(seconds)),
                         "devices": ", ".join(devices)})
    return pd.DataFrame(rows, columns=["chapter", "runs", "seconds", "devices"])
