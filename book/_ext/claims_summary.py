"""Sphinx extension: one table of the papers' claims, assembled from the chapters.

Each chapter glues its claims table with ``calnotes.book.notebook.glue_claims`` (columns claim,
source, evidence, verdict; the verdicts are computed there). A page lists the chapters::

    :::{claims-summary}
    01_measuring_calibration.md ch01_claims ch01-claims
    :::

one line per chapter: its file (relative to the page), the glue key and the label of the
chapter's claims section. After every chapter has been executed and read, this extension
reads the glued JSON text of each table and puts one table in the page, with a link from every
claim to the chapter's evidence. A missing chapter, key or column is a build warning (an
error under ``-W``), never a silently shorter table.
"""

from __future__ import annotations

import json
from typing import Any

from docutils import nodes
from sphinx import addnodes
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.transforms.post_transforms import SphinxPostTransform
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective

from calnotes.book.notebook import CLAIM_COLUMNS, CLAIMS_MIME

LOGGER = logging.getLogger(__name__)
HEADERS = ("Claim", "Source", "Our evidence", "Verdict", "Chapter")
WIDTHS = (26, 13, 30, 14, 17)  # percent of the table


class claims_summary(nodes.General, nodes.Element):  # noqa: N801 (docutils node naming)
    """Placeholder, replaced by the table once every chapter has been read."""


class ClaimsSummary(SphinxDirective):
    has_content = True

    def run(self) -> list[nodes.Node]:
        entries = []
        for line in self.content:
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 3:
                raise self.error(f"expected 'FILE GLUE_KEY LABEL', got {line!r}")
            path, key, label = parts
            _, filepath = self.env.relfn2path(path, self.env.docname)
            refdoc = self.env.path2doc(filepath)
            if refdoc is None:
                raise self.error(f"no document {path!r}")
            entries.append((refdoc, key, label))
        if not entries:
            raise self.error("list at least one chapter")
        self.env.claims_summary_docs = getattr(self.env, "claims_summary_docs", set())
        self.env.claims_summary_docs.add(self.env.docname)
        node = claims_summary()
        node["entries"] = entries
        self.set_source_info(node)
        return [node]


def _paragraph(text: str) -> nodes.paragraph:
    return nodes.paragraph(text, text)


def _row(cells: list[nodes.Node]) -> nodes.row:
    row = nodes.row()
    for cell in cells:
        entry = nodes.entry()
        entry += cell
        row += entry
    return row


class ReplaceClaimsSummary(SphinxPostTransform):
    """Build the table from the chapters' glued JSON (before references are resolved)."""

    default_priority = 5

    def run(self, **kwargs: Any) -> None:
        from myst_nb.ext.glue.crossref import read_glue_cache

        for node in list(self.document.findall(claims_summary)):
            folder = self.env.mystnb_config.output_folder  # type: ignore[attr-defined]
            body = nodes.tbody()
            for refdoc, key, label in node["entries"]:
                glued = read_glue_cache(folder, refdoc).get(key)
                text = (glued or {}).get("data", {}).get(CLAIMS_MIME)
                data = json.loads(text) if isinstance(text, str) else {}
                if not data or tuple(data.get("columns", ())) != CLAIM_COLUMNS:
                    LOGGER.warning(f"claims table {key!r} of {refdoc!r} is missing or has "
                                   f"other columns than {CLAIM_COLUMNS}", location=node)
                    continue
                title = self.env.titles[refdoc].astext() if refdoc in self.env.titles else refdoc
                for record in data["rows"]:
                    link = addnodes.pending_xref(
                        "", nodes.inline(title, title), refdomain="std", reftype="ref",
                        reftarget=label, refexplicit=True, refwarn=True,
                        refdoc=self.env.docname)
                    verdict = record["verdict"]
                    body += _row([
                        _paragraph(record["claim"]), _paragraph(record["source"]),
                        _paragraph(record["evidence"]),
                        nodes.inline(verdict, verdict, classes=[
                            "verdict", "verdict-" + verdict.replace(" ", "-")]),
                        nodes.paragraph("", "", link),
                    ])
            group = nodes.tgroup(cols=len(HEADERS))
            for width in WIDTHS:
                group += nodes.colspec(colwidth=width)
            head = nodes.thead()
            head += _row([_paragraph(h) for h in HEADERS])
            group += head
            group += body
            table = nodes.table(classes=["claims-summary", "colwidths-given"])
            table += group
            node.replace_self(table)


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
    return {"version": "1", "parallel_read_safe": False, "parallel_write_safe": True}
