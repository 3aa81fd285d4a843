"""Split conformal sets of the report's test logits, calibrated on its validation logits
(``python -m calnotes report --alpha A``); re-exported by :mod:`calnotes.report`."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from ._checks import ArrayLike, check_logits
from .report_probs import logits_from_probs

__all__ = ["conformal_report", "save_conformal_sets"]


def conformal_report(val_logits: ArrayLike, val_labels: ArrayLike, test_logits: ArrayLike,
                     test_labels: ArrayLike, alpha: float = 0.1,
                     scores: Sequence[str] = ("lac", "aps", "raps"), *, probs: bool = False,
                     level: float = 0.95) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """Split conformal sets of the test samples, calibrated on the validation samples
    (:mod:`calnotes.conformal`; APS and RAPS randomized, seed 0): a table with one row per
    score (test coverage, mean set size, share of empty sets, and the ``level`` band that
    the guarantee gives the coverage) and the boolean sets ``(N_test, C)`` by score."""
    from . import conformal as cf

    if not isinstance(probs, bool):
        raise TypeError(f"probs must be a bool, got {type(probs).__name__}")
    alpha = cf.check_alpha(alpha)
    zv, _ = check_logits(logits_from_probs(val_logits, "val_logits") if probs
                         else val_logits, "val_logits")
    zt, _ = check_logits(logits_from_probs(test_logits, "test_logits") if probs
                         else test_logits, "test_logits")
    pv, pt = torch.softmax(zv.double(), 1), torch.softmax(zt.double(), 1)
    yt = torch.as_tensor(np.asarray(test_labels) if not isinstance(test_labels, torch.Tensor)
                         else test_labels)
    lo, hi = cf.coverage_band(int(pv.shape[0]), int(pt.shape[0]), alpha, level=level)
    rows, sets_by_score = [], {}
    for score in scores:
        model = cf.SplitConformal(alpha, score, randomized=score != "lac")
        sets = model.fit(pv, torch.as_tensor(np.asarray(val_labels) if not isinstance(
            val_labels, torch.Tensor) else val_labels)).predict_sets(pt)
        sets_by_score[score] = sets.cpu().numpy()
        rows.append({"score": score.upper(), "coverage": cf.coverage(sets, yt),
                     "size": cf.set_size(sets),
                     "empty": float((sets.sum(dim=1) == 0).double().mean()),
                     "band_low": lo, "band_high": hi})
    return pd.DataFrame(rows).set_index("score"), sets_by_score


def save_conformal_sets(sets: dict[str, np.ndarray], out_dir: str | os.PathLike) -> Path:
    """Write :func:`conformal_report`'s sets as ``out_dir/conformal_sets.npz`` (one boolean
    array ``(N_test, C)`` per score); returns the path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "conformal_sets.npz"
    np.savez_compressed(path, **sets)  # type: ignore[arg-type]  # numpy's stub: allow_pickle
    return path
