"""Proper scores and accuracy: NLL, Brier, error; the one-vs-rest error table."""

from __future__ import annotations

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from calnotes._checks import (
    ArrayLike,
    check_positive_float,
)
from calnotes.metrics._common import _acc_dtype, _prepare, _scalar, _top_label_checked
from calnotes.metrics._weights import check_sample_weight


def _mean(values: torch.Tensor, sample_weight: ArrayLike | None) -> torch.Tensor:
    """The mean of per-sample ``values (N,)``, weighted by ``sample_weight`` when given."""
    if sample_weight is None:
        return values.mean()
    w = check_sample_weight(sample_weight, values.shape[0], values.device).to(values.dtype)
    return (values * w).sum() / w.sum()


def nll(probs: ArrayLike, labels: ArrayLike, eps: float = 1e-12,
        sample_weight: ArrayLike | None = None) -> torch.Tensor | float:
    r"""Mean negative log-likelihood :math:`-\frac1N \sum_i \log \max(p_{i y_i}, \epsilon)`.

    The probability of the true class is clamped from below at ``eps`` so that a confident
    mistake with :math:`p_{iy_i} = 0` (float32 softmax underflow) costs
    :math:`-\log \epsilon` (27.6 for the default) instead of infinity. ``eps`` must lie
    in ``(0, 0.5)``: the clamp guards against underflow only; a large ``eps`` would change
    the NLL of ordinary predictions, and one above 1 would make it negative.

    ``sample_weight (N,)``: :math:`-\sum_i w_i \log \max(p_{iy_i}, \epsilon) / \sum_i w_i`.
    """
    eps = check_positive_float(eps, "eps")
    if eps >= 0.5:
        raise ValueError(f"eps must lie in (0, 0.5), got {eps}")
    p, y, from_numpy = _prepare(probs, labels)
    p_true = p.gather(1, y.unsqueeze(1)).squeeze(1)
    losses = -p_true.clamp(min=eps).to(_acc_dtype(p.device)).log()
    return _scalar(_mean(losses, sample_weight), p.dtype, from_numpy)


def brier(probs: ArrayLike, labels: ArrayLike,
          sample_weight: ArrayLike | None = None) -> torch.Tensor | float:
    r"""Multiclass Brier score :math:`\frac1N \sum_i \sum_k (p_{ik} - 1[y_i = k])^2`.

    For ``(N,)`` binary input both columns ``[1 - p, p]`` count, so the value is twice the
    one-column binary Brier score :math:`\frac1N\sum_i (p_i - y_i)^2`.

    ``sample_weight (N,)``: :math:`\sum_i w_i \sum_k (p_{ik} - 1[y_i = k])^2 / \sum_i w_i`.
    """
    p, y, from_numpy = _prepare(probs, labels)
    onehot = F.one_hot(y, p.shape[1]).to(p.dtype)
    scores = (p - onehot).to(_acc_dtype(p.device)).square().sum(dim=1)
    return _scalar(_mean(scores, sample_weight), p.dtype, from_numpy)


def error(probs: ArrayLike, labels: ArrayLike) -> torch.Tensor | float:
    r"""Top-1 error rate :math:`1 - \frac1N \sum_i \mathbf 1[\arg\max_k p_{ik} = y_i]` (ties:
    first maximal class)."""
    _, correct, dtype, from_numpy = _top_label_checked(probs, labels)
    value = 1.0 - correct.to(_acc_dtype(correct.device)).mean()
    return _scalar(value, dtype, from_numpy)


def one_vs_rest_errors(probs: ArrayLike, labels: ArrayLike) -> pd.DataFrame:
    r"""The errors of a ``C``-class prediction :math:`\hat y_i = \arg\max_k p_{ik}` read as
    ``C`` one-vs-rest problems "is it ``k``?".

    One row per class ``k``: ``positives`` :math:`\#\{y_i = k\}`, ``missed``
    :math:`\#\{y_i = k, \hat y_i \ne k\}`, ``false_alarms``
    :math:`\#\{y_i \ne k, \hat y_i = k\}`, their sum ``errors`` (the errors of "``k`` vs
    not-``k``"), and ``confused_with``, the class that takes part most often in those
    errors (the prediction of a missed ``k`` or the label of a false alarm; ties to the
    smaller class; -1 without errors). Every misclassified sample counts in two rows.
    """
    p, y, _ = _prepare(probs, labels)
    n_classes = p.shape[1]
    pred = p.argmax(dim=1).cpu().numpy()
    true = y.cpu().numpy()
    # pairs[a, b]: samples of label a predicted as b
    pairs = np.bincount(true * n_classes + pred, minlength=n_classes * n_classes).reshape(
        n_classes, n_classes)
    np.fill_diagonal(pairs, 0)
    between = pairs + pairs.T  # errors that involve both a and b, in either direction
    missed, false_alarms = pairs.sum(axis=1), pairs.sum(axis=0)
    return pd.DataFrame({
        "positives": np.bincount(true, minlength=n_classes),
        "missed": missed,
        "false_alarms": false_alarms,
        "errors": missed + false_alarms,
        "confused_with": np.where(between.sum(axis=1) > 0, between.argmax(axis=1), -1),
    }, index=pd.RangeIndex(n_classes, name="class"))

