"""What a table of evaluated claims says: a premise's note beside a claim's own verdict,
the declared rule for a method that did not train, multiplicity-adjusted verdicts over the
book's families, and counts by question.

Multiplicity (:func:`adjust_verdicts`), over the claims of the whole book with a p-value
(:func:`calnotes.stats.p_value` against the claim's ``null``, from its design):

- **Holm** over the *key exploratory* claims: one family for the book (family-wise 5%);
- **Holm** over the *confirmatory* claims: a family of its own;
- **Benjamini-Hochberg** at ``q = 5%`` over *all* tested claims (the false discovery rate):
  the adjustment shown for claims in neither Holm family.

Each claim keeps its own verdict (``verdict_raw``); ``verdict`` is the verdict read again at
the adjusted p-value (:func:`calnotes.stats.adjusted_verdict`), ``adjusted`` names the
method and the family.

The rule for a method that did not train (:func:`did_not_train`), declared before it is
applied: a run whose test logits hold a non-finite value, or whose test accuracy lies within
:data:`CHANCE_MARGIN` of chance (``1 / classes``), did not train; a claim that reads one is
``not testable: the method did not train here``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd
import torch

from calnotes import stats as st

__all__ = [
    "CHANCE_MARGIN", "FAMILY_BH", "FAMILY_CONFIRMATORY", "FAMILY_KEY", "adjust_verdicts",
    "counts", "did_not_train", "premise_note", "premise_state", "question_of",
    "question_verdict",
]

#: A run whose test accuracy lies within this of chance (``1 / classes``) did not train.
CHANCE_MARGIN = 0.05
FAMILY_KEY = "Holm, key exploratory claims of the book"
FAMILY_CONFIRMATORY = "Holm, confirmatory claims of the book"
FAMILY_BH = "Benjamini-Hochberg (q = 5%), all tested claims of the book"
#: Verdicts whose direction reproduces: a premise with one of them holds.
_HOLDS = (st.REPRODUCES, st.LARGER, st.SIZE_RULED_OUT_DIRECTION)


def did_not_train(logits: Any, labels: Any) -> str | None:
    """Why a run with these test ``logits`` (N x K) and ``labels`` did not train, or None
    where it did: non-finite logits, or accuracy within :data:`CHANCE_MARGIN` of ``1/K``."""
    logits, labels = torch.as_tensor(logits), torch.as_tensor(labels)
    if logits.ndim != 2 or labels.ndim != 1 or logits.shape[0] != labels.shape[0]:
        raise ValueError(f"logits must be N x K and labels N, got {tuple(logits.shape)} and "
                         f"{tuple(labels.shape)}")
    if not bool(torch.isfinite(logits).all()):
        return "its test logits hold non-finite values"
    k = int(logits.shape[1])
    accuracy = float((logits.argmax(dim=1) == labels).double().mean())
    if accuracy <= 1 / k + CHANCE_MARGIN:
        return (f"its test accuracy {100 * accuracy:.1f}% lies within "
                f"{100 * CHANCE_MARGIN:.0f} points of chance ({100 / k:.1f}%)")
    return None


def premise_state(premise_verdict: str | None) -> str:
    """The state of a premise from its own verdict: ``holds``, ``fails here``,
    ``inconclusive`` or ``not testable`` (``""`` without a premise)."""
    if not premise_verdict:
        return ""
    if premise_verdict in _HOLDS:
        return "holds"
    if premise_verdict == st.FAILS:
        return "fails here"
    if premise_verdict in (st.INCONCLUSIVE, st.SIZE_RULED_OUT):
        return "inconclusive"
    return "not testable"


def premise_note(state: str) -> str:
    """What a premise adds beside the claim's verdict (``""`` where it holds or is
    absent)."""
    return {"fails here": f"({st.PREMISE_FAILS})",
            "inconclusive": f"({st.PREMISE_INCONCLUSIVE})",
            "not testable": "(premise not testable)"}.get(state, "")


def adjust_verdicts(table: pd.DataFrame, alpha: float = 0.05, q: float = 0.05) -> pd.DataFrame:
    """``table`` (the book's claims: columns ``key``, ``phase``, ``p``, ``verdict_raw``) with
    ``p_adjusted``, ``adjusted`` (method and family) and ``verdict`` (read again at the
    adjusted p-value) filled in; see the module docstring."""
    for col in ("key", "phase", "p", "verdict_raw"):
        if col not in table.columns:
            raise ValueError(f"table needs a column {col!r}")
    if not (0 < alpha < 1 and 0 < q < 1):
        raise ValueError(f"alpha and q must lie in (0, 1), got {alpha} and {q}")
    out = table.copy()
    p = out["p"].astype(float).to_numpy()
    tested = ~np.isnan(p)
    key = out["key"].astype(bool).to_numpy() & (out["phase"] == "exploratory").to_numpy()
    confirmatory = (out["phase"] == "confirmatory").to_numpy()
    adjusted = np.full(len(out), np.nan)
    family = np.array([""] * len(out), dtype=object)
    bh = st.benjamini_hochberg(np.where(tested, p, np.nan))
    level = np.full(len(out), alpha)
    for mask, name in ((tested, FAMILY_BH), (tested & key, FAMILY_KEY),
                       (tested & confirmatory, FAMILY_CONFIRMATORY)):
        if name == FAMILY_BH:
            adjusted[mask], level[mask] = bh[mask], q
        elif mask.any():
            adjusted[mask] = st.holm(p[mask])
            level[mask] = alpha
        family[mask] = name
    out["p_adjusted"] = adjusted
    out["adjusted"] = family
    out["verdict"] = [st.adjusted_verdict(v, a, lv) if f else v for v, a, lv, f in
                      zip(out["verdict_raw"], adjusted, level, family, strict=True)]
    return out


def question_of(row: Any) -> str:
    """A claim's question: its ``question``, else the claim itself (its own question)."""
    question = row.get("question") if hasattr(row, "get") else None
    if isinstance(question, str) and question.strip():
        return question.strip()
    return str(row["claim"])


def question_verdict(verdicts: list[str]) -> str:
    """A question's verdict: the one verdict its claims share, else ``mixed``."""
    distinct = list(dict.fromkeys(verdicts))
    return distinct[0] if len(distinct) == 1 else "mixed"


def counts(table: pd.DataFrame, column: str = "verdict") -> dict[str, Counter[str]]:
    """Verdict counts ``{"claims": ..., "questions": ...}`` of ``table`` (``column``: the
    adjusted ``verdict`` or the raw ``verdict_raw``); a question counts once, with
    :func:`question_verdict`."""
    if column not in table.columns:
        raise ValueError(f"table has no column {column!r}")
    by_question: dict[str, list[str]] = {}
    for _, row in table.iterrows():
        by_question.setdefault(question_of(row), []).append(str(row[column]))
    return {"claims": Counter(str(v) for v in table[column]),
            "questions": Counter(question_verdict(v) for v in by_question.values())}
