"""Sphinx extension: the front page's verdicts, assembled from the chapters.

Each chapter shows its claims with ``calnotes.book.claims.show_claims``, which glues JSON
records (:data:`calnotes.book.claims.SUMMARY_COLUMNS`) under the key ``chNN_claims``. A page
lists the chapters::

    :::{claims-summary}
    01_measuring_calibration.md ch01_claims
    :::

one line per chapter: its file (relative to the page) and the glue key. After every
chapter has been executed and read, this extension puts in the page: a count of verdicts
per chapter, a forest plot of every claim with an interval (inline SVG, drawn by
``calnotes.plots.forest_plot`` from the same records), and per chapter a folded list of
its claims, one short row each (the claim, the verdict as a badge, our effect beside the
reported one, a link to the claim's row in the chapter). A missing chapter or key is a
build warning (an error under ``-W``), never a silently shorter summary.
"""

from __future__ import annotations

import html
import io
import json
from collections import Counter
from typing import Any

from docutils import nodes
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from calnotes.book.claims import CLAIMS_MIME, SUMMARY_COLUMNS
from calnotes.book.claims import verdict_badge as _badge
from calnotes.runs.claims import under_way_text
from calnotes.runs.verdicts import premise_note, question_verdict
from calnotes.stats import REPORTED_SIZE_FAILURES, VERDICTS

LOGGER = logging.getLogger(__name__)


class claims_summary(nodes.General, nodes.Element):  # noqa: N801 (docutils node naming)
    """Placeholder, replaced by the summary once every chapter has been read."""


class ClaimsSummary(SphinxDirective):
    has_content = True

    def run(self) -> list[nodes.Node]:
        entries = []
        for line in self.content:
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2:
                raise self.error(f"expected 'FILE GLUE_KEY', got {line!r}")
            path, key = parts
            _, filepath = self.env.relfn2path(path, self.env.docname)
            refdoc = self.env.path2doc(filepath)
            if refdoc is None:
                raise self.error(f"no document {path!r}")
            entries.append((refdoc, key))
        if not entries:
            raise self.error("list at least one chapter")
        self.env.claims_summary_docs = getattr(self.env, "claims_summary_docs", set())
        self.env.claims_summary_docs.add(self.env.docname)
        node = claims_summary()
        node["entries"] = entries
        self.set_source_info(node)
        return [node]


def _adjust(records: list[dict[str, Any]]) -> None:
    """Multiplicity over the whole book, from the glued p-values: each record's
    ``verdict`` and ``adjusted`` set in place (:func:`calnotes.runs.verdicts.adjust_verdicts`)."""
    import pandas as pd

    from calnotes.runs.verdicts import adjust_verdicts

    if not records:
        return
    table = pd.DataFrame({"key": [bool(r.get("key")) for r in records],
                          "phase": [r.get("phase") or "exploratory" for r in records],
                          "p": [float("nan") if r.get("p") is None else r["p"]
                                for r in records],
                          "verdict_raw": [_raw(r) for r in records]})
    out = adjust_verdicts(table)
    for r, (_, row) in zip(records, out.iterrows(), strict=True):
        r["verdict"] = row["verdict"]
        r["adjusted"] = None if not row["adjusted"] else {
            "method": row["adjusted"].split(",")[0].split(" (")[0],
            "family": row["adjusted"], "p": r.get("p"),
            "p_adjusted": float(row["p_adjusted"]), "verdict": row["verdict"]}


def _raw(r: dict[str, Any]) -> str:
    return r.get("verdict_raw") or r["verdict"]


def _questions(rows: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault(r.get("question") or r["claim"], []).append(r)
    return groups


def _counts_table(chapters: list[tuple[str, str, str, list[dict[str, Any]]]]) -> str:
    """Counts by claim (the claim's own verdict, and after multiplicity adjustment where
    that differs: ``own (adjusted)``) and by question (a question whose claims disagree is
    ``mixed``); failures of the reported size counted apart."""
    every = [r for *_, rows in chapters for r in rows]
    used = [v for v in VERDICTS if any(v in (_raw(r), r["verdict"]) for r in every)]
    head = "".join(f"<th>{_badge(v)}</th>" for v in used)
    body = []
    for title, uri, _, rows in chapters:
        raw = Counter(_raw(r) for r in rows)
        adjusted = Counter(r["verdict"] for r in rows)
        cells = "".join(
            f"<td>{raw.get(v, 0) or ''}"
            + (f" ({adjusted.get(v, 0)})" if adjusted.get(v, 0) != raw.get(v, 0) else "")
            + "</td>" for v in used)
        questions = _questions(rows)
        by_q = Counter(question_verdict([_raw(r) for r in q]) for q in questions.values())
        qtext = ", ".join(f"{n} {v}" for v, n in by_q.most_common())
        size = sum(_raw(r) in REPORTED_SIZE_FAILURES for r in rows)
        body.append(f'<tr><td><a href="{html.escape(uri)}">{html.escape(title)}</a></td>'
                    f"<td>{len(rows)}</td>{cells}<td>{size or ''}</td>"
                    f"<td>{len(questions)}: {html.escape(qtext)}</td></tr>")
    return (f'<div class="claims-scroll"><table class="claims-counts table"><thead><tr>'
            f"<th>Chapter</th><th>claims</th>{head}<th>reported size fails</th>"
            f"<th>questions (their verdicts)</th></tr></thead><tbody>{''.join(body)}</tbody>"
            f"</table></div><p class=\"claims-counts-note\">Counts by claim: each claim's own "
            f"verdict, and in brackets the count after multiplicity adjustment where it "
            f"differs (Holm over the key claims of the book, Holm over confirmatory claims, "
            f"Benjamini-Hochberg at 5% over all tested claims). A question whose claims "
            f"disagree counts as mixed; a claim without a question is its own. Reported size "
            f"fails: the interval excludes the effect the work reports.</p>")


def _forest_svg(records: list[dict[str, Any]]) -> str:
    """Every claim with an interval on one standardized axis, as inline SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import pandas as pd

    from calnotes.plots import evidence_overview

    df = pd.DataFrame(records).dropna(subset=["low", "high"])
    if df.empty:
        return ""
    df = df.assign(paper=df["paper_value"].astype(float),
                   chapter=[f"Chapter {int(c)}" for c in df["chapter"]])
    fig = evidence_overview(df, by="chapter", width=7.2)
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    svg = buf.getvalue()
    svg = svg[svg.index("<svg"):]
    return (f'<figure class="claims-forest">{svg}<figcaption>Every claim with an interval, one '
            f"thin bar each, a panel per chapter. Each effect is oriented so that the side "
            f"the work claims is to the right and divided by the half-width of its 95% "
            f"interval: the bar is the interval (x ± 1), coloured by verdict; it lies right "
            f"of the dashed line exactly when the claim reproduces, left of it when it does "
            f"not. The chapters' own forest plots name each claim, in its units, beside the "
            f"effect the work reports.</figcaption></figure>")


def _claim_item(uri: str, chapter: str, r: dict[str, Any]) -> str:
    reported = f" · reported {html.escape(r['paper'])}" if r["paper"] else ""
    key = ' <span class="claim-key">key</span>' if r.get("key") else ""
    note = premise_note((r.get("premise") or {}).get("state", ""))
    note = f" {html.escape(note)}" if note else ""
    adjusted = r.get("adjusted") or {}
    beside = (f' · adjusted ({html.escape(adjusted["family"])}): {_badge(r["verdict"])}'
              if adjusted and r["verdict"] != _raw(r) else "")
    effect = r["effect"]
    if r.get("under_way"):  # a replication read only at its last planned seed
        effect = under_way_text(int(r["n_seeds"]), int(r["planned_seeds"]))
    return (f'<li class="claim-row">{_badge(_raw(r))}{note} '
            f'<a href="{html.escape(uri)}#claim-{chapter}-{r["id"]}">'
            f"{html.escape(r['claim'])}</a>{key}"
            f'<div class="claim-line">{html.escape(r["cite"])} · ours '
            f"{html.escape(effect)}{reported}{beside}</div></li>")


def _chapter_list(title: str, uri: str, chapter: str, rows: list[dict[str, Any]]) -> str:
    """One line per question, its claims' verdicts underneath."""
    items = []
    groups = _questions(rows)
    for question, members in groups.items():
        if len(members) == 1 and not members[0].get("question"):
            items.append(_claim_item(uri, chapter, members[0]))
            continue
        verdict = question_verdict([_raw(r) for r in members])
        inner = "".join(_claim_item(uri, chapter, r) for r in members)
        items.append(f'<li class="claim-question">{_badge(verdict)} '
                     f"<strong>{html.escape(question)}</strong> ({len(members)} claims)"
                     f"<ul>{inner}</ul></li>")
    return (f'<details class="claims-chapter"><summary>{html.escape(title)}: '
            f"{len(groups)} questions, {len(rows)} claims</summary><ul>{''.join(items)}</ul>"
            f"</details>")


class ReplaceClaimsSummary(SphinxPostTransform):
    """Build the summary from the chapters' glued records."""

    default_priority = 5

    def run(self, **kwargs: Any) -> None:
        from myst_nb.ext.glue.crossref import read_glue_cache

        for node in list(self.document.findall(claims_summary)):
            folder = self.env.mystnb_config.output_folder  # type: ignore[attr-defined]
            chapters = []
            for refdoc, key in node["entries"]:
                glued = read_glue_cache(folder, refdoc).get(key)
                text = (glued or {}).get("data", {}).get(CLAIMS_MIME)
                rows = json.loads(text) if isinstance(text, str) else None
                if not rows or not all(set(SUMMARY_COLUMNS) <= set(r) for r in rows):
                    LOGGER.warning(f"claims {key!r} of {refdoc!r} are missing or lack the "
                                   f"fields {SUMMARY_COLUMNS}", location=node)
                    continue
                title = self.env.titles[refdoc].astext() if refdoc in self.env.titles else refdoc
                uri = self.app.builder.get_relative_uri(self.env.docname, refdoc)
                chapters.append((title, uri, rows[0]["chapter"], rows))
            records = [r for *_, rows in chapters for r in rows]
            _adjust(records)
            parts = [_counts_table(chapters), _forest_svg(records)]
            parts += [_chapter_list(t, u, c, rows) for t, u, c, rows in chapters]
            node.replace_self(nodes.raw("", "\n".join(parts), format="html"))


def _outdated(app: Sphinx, env: BuildEnvironment, added: set[str], changed: set[str],
              removed: set[str]) -> list[str]:
    """Rewrite the summary whenever any chapter was read again."""
    if added or changed or removed:
        return sorted(getattr(env, "claims_summary_docs", set()) - removed)
    return []


def _purge(app: Sphinx, env: BuildEnvironment, docname: str) -> None:
    getattr(env, "claims_summary_docs", set()).discard(docname)


def setup(app: Sphinx) -> dict[str, Any]:
    app.add_node(claims_summary)
    app.add_directive("claims-summary", ClaimsSummary)
    app.add_post_transform(ReplaceClaimsSummary)
    app.connect("env-get-outdated", _outdated)
    app.connect("env-purge-doc", _purge)
    return {"version": "2", "parallel_read_safe": False, "parallel_write_safe": True}
