"""Small helpers the chapters share: set-up, where runs are stored, provenance lines."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import torch


def setup_chapter(seed: int = 0, device: str = "auto", style: bool = True) -> torch.device:
    """Seed every generator, pick the device and set the book's plot style.

    The style is set here, by the chapter, never when ``calnotes`` is imported.
    """
    from .training import seed_everything, select_device

    seed_everything(seed)
    if style:
        import matplotlib.pyplot as plt
        import seaborn as sns

        sns.set_theme(style="whitegrid", context="notebook", font_scale=0.9)
        plt.rcParams["figure.dpi"] = 110
    return select_device(device)


def chapter_run(
    experiment: str, config: dict[str, Any], *, use_store: bool, smoke: bool,
    device: str | torch.device = "auto", progress: bool = False,
) -> Any:
    """Load a chapter's run from ``results/``, or compute it (and store it there).

    SMOKE runs and ``USE_STORE=False`` use a fresh temporary store and checkpoint folder,
    so they always recompute and never touch the stored results. The per-batch progress
    bar is off by default: in an executed notebook every update would become output.
    """
    from .store import RunStore, load_or_run

    if use_store and not smoke:
        return load_or_run(experiment, config, device=device, progress=progress)
    scratch = Path(tempfile.mkdtemp(prefix="calnotes-runs-"))
    return load_or_run(experiment, config, store=RunStore(scratch / "results"),
                       checkpoint_root=scratch / "checkpoints", device=device,
                       progress=progress)


#: Columns of a chapter's table of the papers' claims, and the verdicts it may give.
CLAIM_COLUMNS = ("claim", "source", "evidence", "verdict")
#: Mime type of the claims' JSON text in the glued bundle (a string: notebook outputs
#: allow JSON objects only under JSON mime types, which glue's record prefix hides).
CLAIMS_MIME = "text/vnd.calnotes.claims+json"
VERDICTS = ("reproduces", "partly", "does not reproduce", "cannot test here")


class _GluedTable:
    """A table glued with two faces: HTML for the page, JSON records for other pages
    (the front page assembles the chapters' claims tables from the JSON)."""

    def __init__(self, rows: list[dict[str, str]], columns: tuple[str, ...]) -> None:
        self.rows, self.columns = rows, columns

    def _repr_html_(self) -> str:
        import html

        head = "".join(f"<th>{html.escape(c)}</th>" for c in self.columns)
        body = "".join(
            "<tr>" + "".join(
                f'<td><span class="verdict verdict-{row[c].replace(" ", "-")}">'
                f"{html.escape(row[c])}</span></td>" if c == "verdict"
                else f"<td>{html.escape(row[c])}</td>" for c in self.columns) + "</tr>"
            for row in self.rows)
        widths = "".join(f'<col style="width: {w}%">' for w in (32, 16, 40, 12))
        return (f'<table class="claims-summary table"><colgroup>{widths}</colgroup>'
                f"<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")

    def __repr__(self) -> str:
        return "\n".join(" | ".join(row[c] for c in self.columns) for row in self.rows)

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, str]:
        import json

        return {"text/plain": repr(self), "text/html": self._repr_html_(),
                CLAIMS_MIME: json.dumps({"columns": list(self.columns), "rows": self.rows})}


def glue_claims(name: str, rows: list[dict[str, str]]) -> None:
    """Show a chapter's table of the papers' claims and glue it for the front page: one
    dict per claim with the keys :data:`CLAIM_COLUMNS` (text) and a verdict from
    :data:`VERDICTS`, computed from the chapter's results, never typed."""
    if not isinstance(rows, list) or not rows:
        raise ValueError("rows must be a non-empty list of dicts")
    clean = []
    for i, row in enumerate(rows):
        if not isinstance(row, dict) or set(row) != set(CLAIM_COLUMNS):
            raise ValueError(f"rows[{i}] must have exactly the keys {CLAIM_COLUMNS}")
        if not all(isinstance(row[c], str) and row[c] for c in CLAIM_COLUMNS):
            raise TypeError(f"rows[{i}]: every entry must be a non-empty str")
        if row["verdict"] not in VERDICTS:
            raise ValueError(f"rows[{i}]: verdict must be one of {VERDICTS}, "
                             f"got {row['verdict']!r}")
        clean.append({c: row[c] for c in CLAIM_COLUMNS})
    from IPython.display import HTML, display
    from myst_nb import glue as myst_glue

    table = _GluedTable(clean, CLAIM_COLUMNS)
    display(HTML(table._repr_html_()))
    myst_glue(name, table, display=False)


def glue(name: str, value: Any) -> None:
    """``myst_nb.glue`` for numbers in prose: numpy and 0-d torch scalars become plain
    Python numbers first, so ``{glue:text}`name:.2f``` can format them."""
    from myst_nb import glue as myst_glue

    if isinstance(value, torch.Tensor):
        value = value.item()
    elif hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()
    myst_glue(name, value, display=False)
