r"""Calibration metrics: ECE, MCE, ACE, classwise ECE, SECE, NLL, Brier, error.

Vocabulary: ``probs (N, C)`` (or ``(N,)``, the positive-class probability of a binary
problem, read as the two columns ``[1 - p, p]``) and integer ``labels (N,)``. The
*top-label* view uses the confidence :math:`c_i = \max_k p_{ik}` and the indicator
:math:`r_i = 1[\arg\max_k p_{ik} = y_i]` (ties go to the first maximal class).

Binning convention. Bins are half-open on the left, :math:`B_m = (b_{m-1}, b_m]`; a
confidence of exactly ``b_0`` (0 for equal-width bins) goes to the first bin and one of
exactly 1.0 to the last, so no sample is ever dropped. A value exactly on an interior edge
goes to the lower bin. Edges are compared in the dtype the computation runs in (float32 for
float32 or half input, float64 for float64 input).

* ``binning="uniform"``: :math:`b_m = m / M`.
* ``binning="quantile"``: :math:`b_m` is the :math:`m/M` quantile of the binned values
  (linear interpolation between order statistics, the "linear" rule of
  :func:`numpy.quantile`), so ``b_0`` is the smallest value and ``b_M`` the largest and the
  bins hold about :math:`N/M` samples each (exactly when :math:`M` divides :math:`N` and
  there are no ties). Tied values are never split: all samples equal to an edge go to the
  lower bin, so with many ties (for example saturated confidences of 1.0) some bins hold
  more than :math:`N/M` samples and others are empty. Empty bins carry no weight.

Intervals. :func:`bootstrap_interval` resamples the test samples to give any of these
metrics, or the paired difference of two predictions' metrics, a percentile interval;
:func:`seed_interval` gives a mean over training seeds, or a difference of two such means,
a t interval.

Return types. Scalar metrics return a 0-d tensor on the input's device (in the input's
floating dtype, at least float32) for torch input, so that they can be used in a graph,
and a Python ``float`` for numpy input. Sums over samples are accumulated in float64
(float32 on MPS, which has no float64).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from calnotes._checks import (
    ArrayLike,
    as_tensor,
    check_choice,
    check_labels,
    check_logits,
    check_positive_float,
    check_positive_int,
    check_probs,
    like_input,
    prob_sum_atol,
)

__all__ = [
    "BootstrapInterval",
    "SeedInterval",
    "ReliabilityBins",
    "ace",
    "bootstrap_interval",
    "brier",
    "calibration_report",
    "classwise_ece",
    "confidences_and_correct",
    "ece",
    "error",
    "mce",
    "nll",
    "one_vs_rest_errors",
    "probs_from_logits",
    "reliability_bins",
    "sece",
    "seed_interval",
]

BINNINGS = ("uniform", "quantile")
NORMS = ("l1", "l2", "max")
#: The metrics of :func:`calibration_report`, in its column order.
REPORT_METRICS = ("error", "nll", "brier", "ece", "mce", "ace", "classwise_ece", "sece")

#: Classwise metrics bin the (N, C) matrix in blocks of about this many entries (bounded
#: memory for 1,000,000 x 1000 inputs).
_CLASS_CHUNK_ELEMENTS = 1 << 22


# --------------------------------------------------------------------------- helpers


def _work_dtype(dtype: torch.dtype) -> torch.dtype:
    """float16/bfloat16 are computed in float32; float32 and float64 are kept."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


def _acc_dtype(device: torch.device) -> torch.dtype:
    """Accumulator for sums over samples (MPS has no float64)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _prepare(probs: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """Validate ``probs`` and ``labels``; returns ``(P (N, C), y (N,) int64, from_numpy)``."""
    p, from_numpy = check_probs(probs, "probs")
    y = check_labels(labels, p.shape[0], p.shape[1], "labels").to(p.device)
    return p.to(_work_dtype(p.dtype)), y, from_numpy


def _scalar(value: torch.Tensor, dtype: torch.dtype, from_numpy: bool) -> torch.Tensor | float:
    """A Python float for numpy callers, else a 0-d tensor in ``dtype`` on the same device."""
    if from_numpy:
        return float(value.detach().cpu().item())
    return value.to(dtype)


def _top_label(p: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``max`` with its index: the gradient of ``c_i`` goes to the first maximal entry."""
    conf, pred = p.max(dim=1)
    return conf, (pred == y).to(p.dtype)


#: The fused pass of :func:`_top_label_checked` reads ``probs`` in row blocks of about this
#: many bytes per thread, so that its second to fourth pass over a block hit the cache.
_BLOCK_BYTES = 1 << 20


def _top_label_checked(probs: Any, labels: Any) -> tuple[torch.Tensor, torch.Tensor,
                                                          torch.dtype, bool]:
    """Validate ``probs`` and ``labels`` and return ``(conf, correct, dtype, from_numpy)``.

    The same values and errors as ``_prepare`` followed by ``_top_label``. Float32/float64
    ``(N, C)`` input that needs no gradient takes :func:`_fused_top_label` (one read of
    memory); other input (1-d, half precision, ``requires_grad``) the generic path.
    """
    t, from_numpy = as_tensor(probs, "probs")
    fusable = (
        t.ndim == 2 and t.shape[0] > 0 and t.shape[1] >= 2 and t.is_contiguous()
        and t.dtype in (torch.float32, torch.float64) and t.device.type == "cpu"
        and not (t.requires_grad and torch.is_grad_enabled())
    )
    if not fusable:
        p, y, from_numpy = _prepare(t, labels)
        conf, correct = _top_label(p, y)
        return conf, correct, p.dtype, from_numpy
    conf, correct = _fused_top_label(t.detach(), labels)
    return conf, correct, t.dtype, from_numpy


def _fused_top_label(p: torch.Tensor, labels: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`check_probs`, :func:`check_labels` and :func:`_top_label` in one read of ``p``.

    ``p`` is read in row blocks; each block is scanned for its row maxima, its minimum, its
    row sums and the entries of the labels while it is in cache. Maxima and minimum are
    taken on the bit patterns as integers: for floats >= +0 their order is that of the
    values, and NaN, inf, values above 1 and anything with the sign bit (negatives, -0.0)
    show up as a maximum above ``1.0`` or a minimum below 0, after which
    :func:`check_probs` names the error (or passes, for -0.0). ``correct_i`` is
    ``p_{i y_i} == c_i`` except in rows whose maximum may be tied (``c_i`` at most about
    1/2: two maximal entries must fit in the row's sum), where ``max(dim=1)`` decides, so
    ties go to the first maximal class as in :func:`_top_label`.
    """
    n, c = p.shape
    atol = prob_sum_atol(p.dtype)
    y, label_error = None, None
    try:
        y = check_labels(labels, n, c, "labels").to(p.device)
    except (TypeError, ValueError) as err:  # reported after the errors of probs
        label_error = err
    int_dtype = torch.int32 if p.dtype == torch.float32 else torch.int64
    conf_bits = torch.empty(n, dtype=int_dtype, device=p.device)
    sums = torch.empty(n, dtype=p.dtype, device=p.device)
    p_true = torch.empty(n, 1, dtype=p.dtype, device=p.device)
    rows = n
    if p.device.type == "cpu":
        rows = max(1, _BLOCK_BYTES * torch.get_num_threads() // (c * p.element_size()))
    blocks = list(zip(p.split(rows), p.view(int_dtype).split(rows), conf_bits.split(rows),
                      sums.split(rows), p_true.split(rows), strict=True))
    mins = torch.empty(len(blocks), dtype=int_dtype, device=p.device)
    y_blocks = [None] * len(blocks) if y is None else y.unsqueeze(1).split(rows)
    for (block, bits, conf_k, sums_k, true_k), min_k, y_k in zip(
            blocks, mins.unbind(), y_blocks, strict=True):
        torch.amin(bits, out=min_k)  # the cheapest pass reads the block from memory
        torch.amax(bits, dim=1, out=conf_k)
        torch.sum(block, dim=1, out=sums_k)
        if y_k is not None:
            torch.gather(block, 1, y_k, out=true_k)
    one = torch.ones((), dtype=p.dtype).view(int_dtype)
    lo_sum, hi_sum = torch.aminmax(sums)
    flags = torch.stack([mins.amin() < 0, conf_bits.amax() > one,
                         torch.maximum(hi_sum - 1, 1 - lo_sum) > atol]).tolist()
    if any(flags):
        check_probs(p, "probs")  # raises the error that the generic path raises
    if label_error is not None or y is None:
        raise label_error or RuntimeError("labels were not checked")
    conf = conf_bits.view(p.dtype)
    correct = p_true.squeeze(1) == conf
    # A tie needs two entries equal to c_i, so an exact row sum >= 2 c_i. The float row
    # sums are at most 1 + atol and within a factor 1 + C eps of the exact ones.
    bound = 0.5 * (1 + atol) * (1 + 2 * c * torch.finfo(p.dtype).eps)
    rows_tied = (correct & (conf <= bound)).nonzero().squeeze(1)
    if rows_tied.numel() > 0:
        correct[rows_tied] = p[rows_tied].max(dim=1).indices == y[rows_tied]
    return conf, correct.to(p.dtype)


def _uniform_edges(n_bins: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """``b_m = m / M`` (each edge is the correctly rounded quotient, ``b_M = 1`` exactly)."""
    m = torch.arange(n_bins + 1, dtype=torch.float64, device=device)
    return (m / n_bins).to(dtype)


def _quantile_edges(values: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Row-wise ``m / M`` quantiles of ``values (K, N)`` -> ``(K, M + 1)`` in float64.

    Linear interpolation between order statistics at position ``(N - 1) m / M``.
    """
    n = values.shape[-1]
    s = values.contiguous().sort(dim=-1).values.to(_acc_dtype(values.device))
    q = torch.arange(n_bins + 1, dtype=s.dtype, device=s.device) / n_bins
    pos = (n - 1) * q
    lo = pos.floor().long().clamp(max=n - 1)
    hi = (lo + 1).clamp(max=n - 1)
    t = pos - lo.to(pos.dtype)
    a, b = s[..., lo], s[..., hi]
    return a + (b - a) * t


def _bin_index(values: torch.Tensor, edges: torch.Tensor, uniform: bool = False) -> torch.Tensor:
    """Bin of each value under the ``(b_{m-1}, b_m]`` convention.

    ``edges`` is ``(M + 1,)`` (shared) or ``(K, M + 1)`` (one row of edges per row of
    ``values (K, N)``). Values at or below ``b_1`` go to bin 0, values above ``b_{M-1}``
    to bin ``M - 1``. ``uniform=True`` says that ``edges`` are :func:`_uniform_edges`;
    the bins then come from :func:`_uniform_bin_index` (the same indices, faster).
    """
    if (uniform and edges.ndim == 1 and edges.shape[0] - 1 <= _MAX_ARITHMETIC_BINS
            and values.device.type != "mps"):  # (it needs float64, which MPS lacks)
        return _uniform_bin_index(values, edges)
    inner = edges[..., 1:-1].to(values.dtype).contiguous()
    if inner.ndim == 1:
        return torch.bucketize(values, inner, right=False)
    return torch.searchsorted(inner, values.contiguous(), right=False)


#: Above this many bins :func:`_bin_index` searches the edges (``v * M`` in float32 could
#: then be off by more than one bin).
_MAX_ARITHMETIC_BINS = 1 << 20


def _uniform_bin_index(values: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """:func:`_bin_index` for the edges ``b_m = fl(m / M)``, without a binary search.

    ``k = ceil(v M) - 1`` (clamped to ``[0, M - 1]``) is the bin of ``v`` under exact
    edges ``m / M``; the edges rounded to the dtype of ``v`` (which
    :func:`torch.bucketize` compares with) move it by at most one. For float32 ``v`` the
    product ``v M`` is exact in float64 and an edge rounds monotonically, so only
    ``v <= b_k`` (an edge rounded up onto or above ``v``) can move it, down by one; for
    float64 ``v`` the product rounds, so ``v > b_{k+1}`` is checked too.
    """
    n_bins = edges.shape[0] - 1
    ext = edges.to(values.dtype).clone()
    ext[0], ext[-1] = -math.inf, math.inf  # the outer bins are open-ended
    values = values.detach()
    idx = (values.to(torch.float64) * n_bins).ceil_().clamp_(1, n_bins).long().sub_(1)
    idx.sub_((values <= ext.take(idx)).long())
    if values.dtype != torch.float32:
        idx.add_((values > ext.take(idx + 1)).long())
    return idx


def _binned_sums(
    values: torch.Tensor, targets: torch.Tensor, edges: torch.Tensor, n_bins: int,
    uniform: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-bin ``(counts, sum of values, sum of targets)`` for ``values, targets (K, N)``.

    Returns three ``(K, M)`` tensors; the sums are in the accumulator dtype and keep the
    autograd graph of ``values``. ``uniform`` as in :func:`_bin_index`.
    """
    k, n = values.shape
    idx = _bin_index(values, edges, uniform)
    if k == 1:
        flat = idx.reshape(-1)
    else:
        flat = (idx + n_bins * torch.arange(k, device=values.device).unsqueeze(1)).reshape(-1)
    counts = torch.bincount(flat, minlength=k * n_bins).reshape(k, n_bins)
    acc = _acc_dtype(values.device)
    zeros = torch.zeros(k * n_bins, dtype=acc, device=values.device)
    sum_v = zeros.index_add(0, flat, values.reshape(-1).to(acc)).reshape(k, n_bins)
    sum_t = zeros.index_add(0, flat, targets.reshape(-1).to(acc)).reshape(k, n_bins)
    return counts, sum_v, sum_t


def _edges_for(values: torch.Tensor, n_bins: int, binning: str) -> torch.Tensor:
    if binning == "uniform":
        return _uniform_edges(n_bins, values.dtype, values.device)
    return _quantile_edges(values, n_bins)


def _calibration_error(
    counts: torch.Tensor, sum_v: torch.Tensor, sum_t: torch.Tensor, norm: str
) -> torch.Tensor:
    """Row-wise binned calibration error from per-bin sums; ``(K, M)`` -> ``(K,)``."""
    n = counts.sum(dim=1, keepdim=True).to(sum_v.dtype)
    w = counts.to(sum_v.dtype) / n
    gap = (sum_t - sum_v) / counts.clamp(min=1).to(sum_v.dtype)  # 0 in empty bins
    if norm == "l1":
        return (w * gap.abs()).sum(dim=1)
    if norm == "l2":
        return (w * gap.square()).sum(dim=1).sqrt()
    return gap.abs().masked_fill(counts == 0, 0).amax(dim=1)


def _check_bins(n_bins: Any, binning: Any) -> tuple[int, str]:
    return check_positive_int(n_bins, "n_bins"), check_choice(binning, "binning", BINNINGS)


# --------------------------------------------------------------------------- public API


def probs_from_logits(logits: ArrayLike) -> ArrayLike:
    """Softmax of validated ``logits (N, C)``: ``p_ik = exp(z_ik) / sum_j exp(z_ij)``.

    Computed in float64 for float64 input and in float32 otherwise; numpy in, numpy out.
    """
    z, from_numpy = check_logits(logits, "logits")
    dtype = torch.float64 if z.dtype == torch.float64 else torch.float32
    return like_input(torch.softmax(z.to(dtype), dim=1), from_numpy)


def confidences_and_correct(probs: ArrayLike, labels: ArrayLike) -> tuple[ArrayLike, ArrayLike]:
    """Top-label ``confidences c_i = max_k p_ik`` and ``correct r_i = 1[argmax_k p_ik = y_i]``.

    ``correct`` is a float tensor (0.0 / 1.0) in the dtype of the confidences.
    """
    conf, correct, _, from_numpy = _top_label_checked(probs, labels)
    return like_input(conf, from_numpy), like_input(correct, from_numpy)


@dataclass
class ReliabilityBins:
    """Per-bin statistics of the top-label confidence.

    ``edges (M + 1,)``, ``counts (M,)`` (int64), ``accuracy (M,)`` = mean of ``correct`` and
    ``confidence (M,)`` = mean confidence in each bin (NaN for empty bins). Arrays are numpy
    arrays for numpy input and tensors on the input's device otherwise.
    """

    edges: ArrayLike
    counts: ArrayLike
    accuracy: ArrayLike
    confidence: ArrayLike
    n_bins: int
    binning: str = "uniform"

    def to_frame(self) -> pd.DataFrame:
        """One row per bin: lower, upper, count, accuracy, confidence, gap (= acc - conf)."""

        def arr(x: ArrayLike) -> np.ndarray:
            return x.detach().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)

        edges, acc, conf = arr(self.edges), arr(self.accuracy), arr(self.confidence)
        frame = pd.DataFrame(
            {
                "lower": edges[:-1],
                "upper": edges[1:],
                "count": arr(self.counts),
                "accuracy": acc,
                "confidence": conf,
                "gap": acc - conf,
            }
        )
        frame.index.name = "bin"
        return frame


def reliability_bins(
    probs: ArrayLike, labels: ArrayLike, n_bins: int = 15, binning: str = "uniform"
) -> ReliabilityBins:
    """Bin the top-label confidences and report count, accuracy and mean confidence per bin.

    See the module docstring for the ``(b_{m-1}, b_m]`` convention and quantile ties.
    Vectorized (``torch.bucketize`` + ``bincount``/``index_add``), no loop over bins or
    samples.
    """
    n_bins, binning = _check_bins(n_bins, binning)
    with torch.no_grad():
        conf, correct, dtype, from_numpy = _top_label_checked(probs, labels)
        values, targets = conf.unsqueeze(0), correct.unsqueeze(0)
        edges = _edges_for(values, n_bins, binning).reshape(-1)
        counts, sum_v, sum_t = (
            x[0] for x in _binned_sums(values, targets, edges, n_bins, binning == "uniform")
        )
        denom = torch.where(counts > 0, counts.to(sum_v.dtype), torch.nan)
        accuracy = (sum_t / denom).to(dtype)
        confidence = (sum_v / denom).to(dtype)
    return ReliabilityBins(
        edges=like_input(edges.to(dtype), from_numpy),
        counts=like_input(counts, from_numpy),
        accuracy=like_input(accuracy, from_numpy),
        confidence=like_input(confidence, from_numpy),
        n_bins=n_bins,
        binning=binning,
    )


def ece(
    probs: ArrayLike,
    labels: ArrayLike,
    n_bins: int = 15,
    binning: str = "uniform",
    norm: str = "l1",
) -> torch.Tensor | float:
    r"""Top-label expected calibration error (Guo et al. 2017).

    With :math:`B_m` the bins of the confidences, :math:`acc_m, conf_m` their mean
    ``correct`` and mean confidence:

    * ``l1``: :math:`\sum_m \frac{|B_m|}{N} |acc_m - conf_m|`
    * ``l2``: :math:`\sqrt{\sum_m \frac{|B_m|}{N} (acc_m - conf_m)^2}`
    * ``max``: :math:`\max_{m: |B_m| > 0} |acc_m - conf_m|` (the MCE)

    ``binning="quantile"`` gives the top-label equal-mass ECE.
    """
    n_bins, binning = _check_bins(n_bins, binning)
    norm = check_choice(norm, "norm", NORMS)
    conf, correct, dtype, from_numpy = _top_label_checked(probs, labels)
    values, targets = conf.unsqueeze(0), correct.unsqueeze(0)
    with torch.no_grad():
        edges = _edges_for(values, n_bins, binning)
    sums = _binned_sums(values, targets, edges, n_bins, binning == "uniform")
    return _scalar(_calibration_error(*sums, norm)[0], dtype, from_numpy)


def mce(
    probs: ArrayLike, labels: ArrayLike, n_bins: int = 15, binning: str = "uniform"
) -> torch.Tensor | float:
    r"""Maximum calibration error :math:`\max_{m: |B_m| > 0} |acc_m - conf_m|`."""
    return ece(probs, labels, n_bins=n_bins, binning=binning, norm="max")


def _classwise(
    probs: ArrayLike, labels: ArrayLike, n_bins: int, binning: str
) -> torch.Tensor | float:
    """Mean over classes of the binned l1 error of ``p_{:,k}`` against ``1[y = k]``.

    Rows are processed in contiguous blocks of about ``_CLASS_CHUNK_ELEMENTS`` entries;
    each entry ``p_ik`` adds to cell ``(k, bin)``, and only the true class of each row adds
    to the target sums (no one-hot matrix).
    """
    n_bins, binning = _check_bins(n_bins, binning)
    p, y, from_numpy = _prepare(probs, labels)
    n, c = p.shape
    acc = _acc_dtype(p.device)
    with torch.no_grad():
        if binning == "uniform":
            edges = _uniform_edges(n_bins, p.dtype, p.device)
        else:  # per-class quantiles, a few classes at a time (sorting copies the columns)
            step = max(1, _CLASS_CHUNK_ELEMENTS // n)
            edges = torch.cat(
                [_quantile_edges(p[:, k0 : k0 + step].T, n_bins) for k0 in range(0, c, step)]
            )
    offsets = n_bins * torch.arange(c, device=p.device)
    counts = torch.zeros(c * n_bins, dtype=torch.long, device=p.device)
    sum_v = torch.zeros(c * n_bins, dtype=acc, device=p.device)
    sum_t = torch.zeros(c * n_bins, dtype=acc, device=p.device)
    rows = max(1, _CLASS_CHUNK_ELEMENTS // c)
    for r0 in range(0, n, rows):
        block, y_block = p[r0 : r0 + rows], y[r0 : r0 + rows]
        if edges.ndim == 1:  # (a binary search: faster than _uniform_bin_index here)
            idx = _bin_index(block, edges)
        else:
            idx = _bin_index(block.T, edges).T
        flat = idx + offsets  # (B, C): cell of p_ik is k * M + bin
        counts += torch.bincount(flat.reshape(-1), minlength=c * n_bins)
        sum_v = sum_v.index_add(0, flat.reshape(-1), block.reshape(-1).to(acc))
        hit = flat.gather(1, y_block.unsqueeze(1)).squeeze(1)
        sum_t = sum_t.index_add(0, hit, torch.ones_like(hit, dtype=acc))
    shape = (c, n_bins)
    per_class = _calibration_error(counts.view(shape), sum_v.view(shape), sum_t.view(shape), "l1")
    return _scalar(per_class.mean(), p.dtype, from_numpy)


def classwise_ece(
    probs: ArrayLike, labels: ArrayLike, n_bins: int = 15, binning: str = "uniform"
) -> torch.Tensor | float:
    r"""Classwise ECE (Kull et al. 2019): :math:`\frac1C \sum_k \sum_m
    \frac{|B_{mk}|}{N} |\bar y_{mk} - \bar p_{mk}|`.

    For each class :math:`k` the one-vs-rest probabilities :math:`p_{ik}` of *all* samples
    are binned (equal-width by default), and each bin compares the mean of
    :math:`1[y_i = k]` with the mean of :math:`p_{ik}`. ``binning="quantile"`` gives
    :func:`ace`.
    """
    return _classwise(probs, labels, n_bins, binning)


def ace(probs: ArrayLike, labels: ArrayLike, n_bins: int = 15) -> torch.Tensor | float:
    r"""Adaptive calibration error (Nixon et al. 2019), classwise with equal-mass ranges.

    For each class :math:`k` the probabilities :math:`p_{ik}` of all samples are split into
    :math:`R` = ``n_bins`` ranges at their quantiles; each range compares the fraction of
    samples with label :math:`k` with the mean :math:`p_{ik}`:

    .. math:: ACE = \frac1K \sum_k \sum_r \frac{|B_{rk}|}{N} |acc(r, k) - conf(r, k)|.

    When every range holds :math:`N/R` samples this is Nixon et al.'s
    :math:`\frac{1}{KR}\sum_k\sum_r |acc(r,k) - conf(r,k)|`; weighting by the share of
    samples keeps it well defined when ties make ranges unequal (ties are never split, see
    the module docstring). For the *top-label* equal-mass ECE use
    ``ece(binning="quantile")``. (netcal's ``ACE`` is a different quantity: the unweighted
    mean over non-empty equal-width bins.)
    """
    return _classwise(probs, labels, n_bins, "quantile")


#: Kernel exponents are floored here: K >= e^-80 (about 1.8e-35). This keeps float32
#: arithmetic out of the very slow subnormal range and changes each row sum
#: sum_j K_ij >= 1 by less than N * 1.8e-35, far below float64 resolution.
_LOG_KERNEL_FLOOR = -80.0


def _kernel_tiles(n: int, chunk: int) -> list[tuple[slice, slice]]:
    """Upper-triangular square tiles ``(rows, cols)`` covering an ``n x n`` symmetric matrix."""
    starts = range(0, n, chunk)
    return [
        (slice(i0, i0 + chunk), slice(j0, j0 + chunk)) for i0 in starts for j0 in starts if j0 >= i0
    ]


class _SoftAccuracy(torch.autograd.Function):
    """Kernel-smoothed accuracy ``a_i = sum_j K_ij r_j / sum_j K_ij`` with an exact, tiled
    backward pass. Only tiles on or above the diagonal are evaluated (K is symmetric and
    the backward's W is antisymmetric); memory is O(chunk^2) in both directions."""

    @staticmethod
    def forward(
        ctx: Any, conf: torch.Tensor, correct: torch.Tensor, bandwidth: float, chunk: int
    ) -> torch.Tensor:
        u = conf * (1.0 / (bandwidth * 2.0**0.5))  # K_ij = exp(-(u_i - u_j)^2)
        rhs = torch.stack([torch.ones_like(correct), correct], dim=1)  # (N, 2)
        sums = torch.zeros_like(rhs)
        for rows, cols in _kernel_tiles(conf.shape[0], chunk):
            k = torch.sub(u[rows].unsqueeze(1), u[cols]).square_().neg_()
            k.clamp_(min=_LOG_KERNEL_FLOOR).exp_()
            sums[rows] += k @ rhs[cols]
            if rows != cols:
                sums[cols] += k.T @ rhs[rows]
        total, hits = sums.unbind(dim=1)
        soft = hits / total  # total >= 1 because K_ii = 1
        ctx.save_for_backward(conf, correct, soft, total)
        ctx.bandwidth, ctx.chunk = bandwidth, chunk
        return soft

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_soft: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # With W_mj = K_mj (c_m - c_j) / h^2 (antisymmetric) and g = grad / S, the chain
        # rule through a_i = T_i / S_i, T_i = sum_j K_ij r_j, S_i = sum_j K_ij gives
        # dL/dc_m = -r_m (W g)_m + (W (g a))_m - g_m (W r)_m + g_m a_m (W 1)_m.
        conf, correct, soft, total = ctx.saved_tensors
        h, chunk = ctx.bandwidth, ctx.chunk
        u = conf * (1.0 / (h * 2.0**0.5))
        w_scale = 2.0**0.5 / h  # (c_i - c_j) / h^2 = (u_i - u_j) * sqrt(2) / h
        g = grad_soft / total
        rhs = torch.stack([g, g * soft, correct, torch.ones_like(conf)], dim=1)  # (N, 4)
        prods = torch.zeros_like(rhs)
        for rows, cols in _kernel_tiles(conf.shape[0], chunk):
            d = torch.sub(u[rows].unsqueeze(1), u[cols])
            w = d.square().neg_().clamp_(min=_LOG_KERNEL_FLOOR).exp_().mul_(d).mul_(w_scale)
            prods[rows] += w @ rhs[cols]
            if rows != cols:
                prods[cols] -= w.T @ rhs[rows]
        wg, wga, wr, w1 = prods.unbind(dim=1)
        grad_conf = -correct * wg + wga - g * wr + g * soft * w1
        return grad_conf, None, None, None


# --------------------------------------------------------------------------- SECE on a grid
#
# For large N the kernel sums S_i = sum_j K(c_i - c_j) and T_i = sum_j K(c_i - c_j) r_j are
# computed on a uniform grid of spacing delta: each sample spreads its mass onto the P grid
# nodes around it with the weights of the P-point Lagrange interpolant, the grid masses are
# convolved with K sampled on the grid (one FFT), and the result is interpolated back with
# the same weights. This replaces K(x - y) by
#     K~(x, y) = sum_a sum_b w_a(x) K(g_a - g_b) w_b(y),
# and the Lagrange remainder bounds |K~ - K| <= eta = C_P (delta / h)^P with
#     C_P = (1 + L_P) (P - 1)!! pi_P / P!,
# where (P - 1)!! = max_t |d^P/dt^P exp(-t^2 / 2)|, pi_P = max_{t in [0, 1]} |prod_o (t - o)|
# over the stencil offsets o and L_P = max_t sum_o |w_o(t)| is the stencil's Lebesgue
# constant (one interpolation in y, then one in x whose weights amplify the first error by
# at most L_P). For P = 8: pi_8 = 43.07, L_8 = 1.488, C_8 = 0.2791.

#: Points of the Lagrange stencil (even); offsets -(P/2 - 1), ..., P/2 around a cell.
_GRID_POINTS = 8
#: C_P above for P = 8, rounded up.
_GRID_ERROR_CONSTANT = 0.2791
#: ``method="auto"`` computes SECE exactly up to this many samples and on the grid above
#: (forward and backward took 2.6 ms exact and 1.4 ms on the grid at 512 samples, 11.6 and
#: 2.1 ms at 1024, on one CPU thread).
SECE_EXACT_MAX_N = 512
#: The grid spacing is chosen so that ``|SECE_grid - SECE_exact| <= SECE_GRID_TOL``.
SECE_GRID_TOL = 1e-7
#: ``method="auto"`` falls back to the exact sums when the grid would need more nodes
#: (only for bandwidths far below the spread of the confidences divided by 10^5).
_GRID_MAX_NODES = 1 << 22
SECE_METHODS = ("auto", "exact", "grid")


def _lagrange_coefficients() -> torch.Tensor:
    """``A (P, P)`` with ``w_o(f) = sum_k A[o, k] f^k``: the Lagrange basis of the stencil
    offsets, from exact rational arithmetic (rounded once to float64)."""
    from fractions import Fraction

    p = _GRID_POINTS
    offsets = [o - (p // 2 - 1) for o in range(p)]
    rows = []
    for o in offsets:
        poly = [Fraction(1)]  # coefficients of prod_{m != o} (f - m) / (o - m), low first
        for m in offsets:
            if m == o:
                continue
            shifted = [Fraction(0)] + poly  # f * poly
            poly = [a - m * b for a, b in zip(shifted, poly + [Fraction(0)], strict=True)]
            poly = [a / (o - m) for a in poly]
        rows.append([float(a) for a in poly])
    return torch.tensor(rows, dtype=torch.float64)


_LAGRANGE = _lagrange_coefficients()


def _lagrange_weights(f: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Stencil weights ``w (N, P)`` at fractional positions ``f (N,)`` in [0, 1] and their
    derivatives ``dw/df``."""
    p = _GRID_POINTS
    a = _LAGRANGE.to(f.device)
    columns = [torch.ones_like(f), f]
    for _ in range(p - 2):
        columns.append(columns[-1] * f)
    powers = torch.stack(columns, dim=1)  # (N, P): f^0 .. f^(P-1)
    w = powers @ a.T
    da = a[:, 1:] * torch.arange(1, p, dtype=f.dtype, device=f.device)
    dw = powers[:, : p - 1] @ da.T
    return w, dw


def _grid_spacing(n: int, bandwidth: float) -> float:
    """delta with 2 N eta / (1 - N eta) <= SECE_GRID_TOL, eta = C_P (delta / h)^P."""
    eta = SECE_GRID_TOL / (2.0 * n * (1.0 + SECE_GRID_TOL))
    return bandwidth * (eta / _GRID_ERROR_CONSTANT) ** (1.0 / _GRID_POINTS)


def _grid_nodes(conf: torch.Tensor, bandwidth: float) -> tuple[float, float, int]:
    """``(lo, delta, cells)``: the grid starts at ``min c`` and has ``cells`` cells."""
    delta = _grid_spacing(conf.shape[0], bandwidth)
    lo, hi = (float(v) for v in torch.aminmax(conf.detach()))
    return lo, delta, max(1, math.ceil((hi - lo) / delta))


class _GridConvolution:
    """Linear convolution of grid vectors with ``K(k delta)``, ``|k| < G``, by real FFT."""

    def __init__(self, nodes: int, delta: float, bandwidth: float, device: torch.device):
        self.nodes = nodes
        self.length = 1 << (2 * nodes - 1).bit_length()  # >= 2G - 1: no wrap-around
        k = torch.arange(nodes, dtype=torch.float64, device=device) * (delta / bandwidth)
        kernel = torch.zeros(self.length, dtype=torch.float64, device=device)
        kernel[:nodes] = torch.exp(-0.5 * k.square())
        kernel[self.length - nodes + 1 :] = kernel[1:nodes].flip(0)
        self.spectrum = torch.fft.rfft(kernel)

    def __call__(self, masses: torch.Tensor) -> torch.Tensor:
        """``masses (R, G)`` -> ``(R, G)``."""
        spectrum = torch.fft.rfft(masses, n=self.length, dim=1) * self.spectrum
        return torch.fft.irfft(spectrum, n=self.length, dim=1)[:, : self.nodes]


def _spread(index: torch.Tensor, weights: torch.Tensor, values: torch.Tensor | None,
            nodes: int) -> torch.Tensor:
    """Grid masses ``sum_i w_{i,o} v_i`` (``v_i = 1`` for ``None``) at the nodes
    ``index (N, P)`` -> ``(nodes,)``."""
    out = torch.zeros(nodes, dtype=weights.dtype, device=weights.device)
    mass = weights if values is None else weights * values.unsqueeze(1)
    return out.index_add_(0, index.reshape(-1), mass.reshape(-1))


class _GridSoftAccuracy(torch.autograd.Function):
    """``a_i = T_i / S_i`` with the grid sums above, in float64; O(N P + G log G) time and
    O(N P + G) memory. The backward pass differentiates the same approximation exactly:
    with ``W`` the (sparse) stencil weights, ``W'`` their derivatives divided by delta,
    ``alpha = g / S`` and ``beta = -g a / S``,
    ``dL/dc_m = W'_m . (alpha_m K t + beta_m K s + r_m K W^T alpha + K W^T beta)``."""

    @staticmethod
    def forward(ctx: Any, conf: torch.Tensor, correct: torch.Tensor,
                bandwidth: float) -> torch.Tensor:
        lo, delta, cells = _grid_nodes(conf, bandwidth)
        nodes = cells + _GRID_POINTS
        t = (conf - lo) / delta
        cell = t.floor().clamp_(0, cells - 1)
        w, dw = _lagrange_weights(t - cell)
        index = cell.long().unsqueeze(1) + torch.arange(_GRID_POINTS, device=conf.device)
        convolve = _GridConvolution(nodes, delta, bandwidth, conf.device)
        ks, kt = convolve(torch.stack([_spread(index, w, None, nodes),
                                       _spread(index, w, correct, nodes)]))
        ks_i, kt_i = ks.take(index), kt.take(index)  # (N, P)
        total = (w * ks_i).sum(dim=1)
        soft = (w * kt_i).sum(dim=1) / total
        ctx.save_for_backward(correct, index, w, dw, ks_i, kt_i, total, soft)
        ctx.convolve, ctx.delta, ctx.nodes = convolve, delta, nodes
        return soft

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx: Any, grad_soft: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        correct, index, w, dw, ks_i, kt_i, total, soft = ctx.saved_tensors
        alpha = grad_soft / total
        beta = -alpha * soft
        k_alpha, k_beta = ctx.convolve(torch.stack([_spread(index, w, alpha, ctx.nodes),
                                                    _spread(index, w, beta, ctx.nodes)]))
        inner = (alpha.unsqueeze(1) * kt_i + beta.unsqueeze(1) * ks_i
                 + correct.unsqueeze(1) * k_alpha.take(index) + k_beta.take(index))
        return (dw * inner).sum(dim=1) / ctx.delta, None, None


def sece(
    probs: ArrayLike,
    labels: ArrayLike,
    bandwidth: float = 0.05,
    chunk_size: int = 1024,
    method: str = "auto",
) -> torch.Tensor | float:
    r"""Smooth (bin-free) top-label ECE with a Gaussian kernel.

    .. math::
        K_{ij} = \exp\!\Big(-\frac{(c_i - c_j)^2}{2h^2}\Big),\quad
        a_i = \frac{\sum_j K_{ij} r_j}{\sum_j K_{ij}},\quad
        SECE = \frac1N \sum_i |a_i - c_i|.

    The weights are row-normalized and include :math:`j = i` (so :math:`\sum_j K_{ij}
    \ge 1`). Differentiable with respect to ``probs`` (torch input with
    ``requires_grad``): the gradient flows through :math:`c_i` and through the kernel
    weights; :math:`r_j` is a constant.

    ``method``:

    * ``"exact"``: the sums over all pairs, O(N^2) time. The kernel is evaluated in
      ``chunk_size x chunk_size`` tiles (only those on or above the diagonal, as K is
      symmetric), so memory is O(chunk_size^2) and N x N is never materialized. Kernel
      values are floored at :math:`e^{-80}` to avoid slow subnormal arithmetic (this
      changes each :math:`\sum_j K_{ij} \ge 1` by less than :math:`N \cdot 2 \cdot
      10^{-35}`). Computed in the dtype of ``probs``.
    * ``"grid"``: the sums on a uniform grid of spacing :math:`\delta`, in float64, in
      O(N P + G log G) time for G grid nodes: every sample spreads onto the P = 8 nodes
      around it with Lagrange interpolation weights, the grid is convolved with K by FFT
      and interpolated back. Each kernel value is then off by at most
      :math:`\eta = C_8 (\delta/h)^8` with :math:`C_8 = 0.2791` (Lagrange remainder),
      so :math:`|\Delta S_i|, |\Delta T_i| \le N\eta` and, as :math:`S_i \ge 1`,
      :math:`|SECE_{grid} - SECE_{exact}| \le 2N\eta / (1 - N\eta)`. :math:`\delta`
      is chosen to make this bound :data:`SECE_GRID_TOL` (``1e-7``): about 550 nodes for
      h = 0.05 and N = 10^5 (spread over [0, 1]). The gradient is the exact gradient of this
      approximation (its error is of order :math:`(\delta/h)^7`). Note that the exact
      path on float32 input rounds its kernel sums in float32, usually by more than the
      grid's bound.
    * ``"auto"`` (default): exact up to :data:`SECE_EXACT_MAX_N` (512) samples, where it
      is as fast, the grid above; exact again if the grid would need more than
      ``2**22`` nodes (a bandwidth below about ``1e-6`` times the spread of the
      confidences). :class:`calnotes.losses.SECELoss` uses ``"exact"``.
    """
    h = check_positive_float(bandwidth, "bandwidth")
    chunk = check_positive_int(chunk_size, "chunk_size")
    method = check_choice(method, "method", SECE_METHODS)
    conf, correct, dtype, from_numpy = _top_label_checked(probs, labels)
    if method != "exact":
        method = _sece_method(conf, h, explicit=method == "grid")
    if method == "exact":
        soft = _SoftAccuracy.apply(conf, correct.detach(), h, chunk)
        value = (soft - conf).abs().mean()
    else:
        conf64 = conf.to(torch.float64)
        soft = _GridSoftAccuracy.apply(conf64, correct.detach().to(torch.float64), h)
        value = (soft - conf64).abs().mean()
    return _scalar(value, dtype, from_numpy)


def _sece_method(conf: torch.Tensor, bandwidth: float, explicit: bool) -> str:
    """``"exact"`` or ``"grid"`` for ``method="auto"``; checks that ``"grid"`` can run."""
    if conf.device.type == "mps":  # no float64 on MPS
        if explicit:
            raise ValueError("method='grid' needs float64, which MPS lacks; use 'exact'")
        return "exact"
    if not explicit and conf.shape[0] <= SECE_EXACT_MAX_N:
        return "exact"
    _, _, cells = _grid_nodes(conf, bandwidth)
    if cells + _GRID_POINTS > _GRID_MAX_NODES:
        if explicit:
            raise ValueError(
                f"bandwidth {bandwidth:g} is too small for method='grid' at this spread of "
                f"confidences ({cells + _GRID_POINTS} grid nodes); use method='exact'"
            )
        return "exact"
    return "grid"


def nll(probs: ArrayLike, labels: ArrayLike, eps: float = 1e-12) -> torch.Tensor | float:
    r"""Mean negative log-likelihood :math:`-\frac1N \sum_i \log \max(p_{i y_i}, \epsilon)`.

    The probability of the true class is clamped from below at ``eps`` so that a confident
    mistake with :math:`p_{iy_i} = 0` (float32 softmax underflow) costs
    :math:`-\log \epsilon` (27.6 for the default) instead of infinity. ``eps`` must lie
    in ``(0, 0.5)``: the clamp guards against underflow only; a large ``eps`` would change
    the NLL of ordinary predictions, and one above 1 would make it negative.
    """
    eps = check_positive_float(eps, "eps")
    if eps >= 0.5:
        raise ValueError(f"eps must lie in (0, 0.5), got {eps}")
    p, y, from_numpy = _prepare(probs, labels)
    p_true = p.gather(1, y.unsqueeze(1)).squeeze(1)
    value = -p_true.clamp(min=eps).to(_acc_dtype(p.device)).log().mean()
    return _scalar(value, p.dtype, from_numpy)


def brier(probs: ArrayLike, labels: ArrayLike) -> torch.Tensor | float:
    r"""Multiclass Brier score :math:`\frac1N \sum_i \sum_k (p_{ik} - 1[y_i = k])^2`.

    For ``(N,)`` binary input both columns ``[1 - p, p]`` count, so the value is twice the
    one-column binary Brier score :math:`\frac1N\sum_i (p_i - y_i)^2`.
    """
    p, y, from_numpy = _prepare(probs, labels)
    onehot = F.one_hot(y, p.shape[1]).to(p.dtype)
    value = (p - onehot).to(_acc_dtype(p.device)).square().sum(dim=1).mean()
    return _scalar(value, p.dtype, from_numpy)


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


def calibration_report(
    probs: ArrayLike | Mapping[str, ArrayLike],
    labels: ArrayLike,
    n_bins: int = 15,
    bandwidth: float = 0.05,
    metrics: Sequence[str] | None = None,
) -> pd.DataFrame:
    """Table of metrics: one row per model, columns ``metrics`` (default all of
    error, nll, brier, ece, mce, ace, classwise_ece, sece), values plain floats.

    ``probs`` is one array (a single row named ``"model"``) or a mapping
    ``{name: probs}`` sharing ``labels`` (one row per name, in order). ``n_bins`` is used by
    the binned metrics, ``bandwidth`` by SECE (exact up to ``SECE_EXACT_MAX_N`` samples,
    on a grid with an error below ``SECE_GRID_TOL`` above; see :func:`sece`).
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    bandwidth = check_positive_float(bandwidth, "bandwidth")
    if metrics is None:
        metrics = REPORT_METRICS
    elif isinstance(metrics, str) or not isinstance(metrics, Sequence) or len(metrics) == 0:
        raise ValueError(f"metrics must be a non-empty sequence of names from {REPORT_METRICS}")
    names = [check_choice(m, "metrics", REPORT_METRICS) for m in metrics]

    if isinstance(probs, Mapping):
        if len(probs) == 0:
            raise ValueError("probs is an empty mapping; give at least one model")
        models = dict(probs)
        for key in models:
            if not isinstance(key, str):
                raise TypeError(f"probs keys must be model names (str), got {type(key).__name__}")
    else:
        models = {"model": probs}

    compute = {
        "error": lambda p: error(p, labels),
        "nll": lambda p: nll(p, labels),
        "brier": lambda p: brier(p, labels),
        "ece": lambda p: ece(p, labels, n_bins=n_bins),
        "mce": lambda p: mce(p, labels, n_bins=n_bins),
        "ace": lambda p: ace(p, labels, n_bins=n_bins),
        "classwise_ece": lambda p: classwise_ece(p, labels, n_bins=n_bins),
        "sece": lambda p: sece(p, labels, bandwidth=bandwidth),
    }
    rows = []
    for name, model_probs in models.items():
        p, _ = check_probs(model_probs, f"probs[{name!r}]" if name != "model" else "probs")
        with torch.no_grad():
            rows.append({m: float(compute[m](p.detach())) for m in names})
    frame = pd.DataFrame(rows, index=pd.Index(list(models), name="model"), columns=names)
    return frame


# --------------------------------------------------------------------------- bootstrap


class _Interval:
    """What an interval ``estimate [low, high]`` says and how it prints (for dataclasses
    with those fields)."""

    estimate: float
    low: float
    high: float

    def contains(self, value: float) -> bool:
        """``low <= value <= high``."""
        return self.low <= value <= self.high

    def __format__(self, spec: str) -> str:
        return f"{self.estimate:{spec}} [{self.low:{spec}}, {self.high:{spec}}]"


@dataclass(frozen=True)
class BootstrapInterval(_Interval):
    """A statistic of the test samples and its percentile bootstrap interval.

    ``estimate`` is the statistic on all N samples; ``low`` and ``high`` are the
    ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the statistic over ``n_boot``
    resamples of the N samples. ``format(iv, ".2f")`` (or an f-string) writes
    ``"1.23 [0.98, 1.50]"``; :meth:`scaled` multiplies all three (e.g. by 100 for percent).
    """

    estimate: float
    low: float
    high: float
    level: float
    n_boot: int

    def scaled(self, factor: float) -> BootstrapInterval:
        """The same interval with ``estimate``, ``low`` and ``high`` times ``factor`` > 0."""
        factor = check_positive_float(factor, "factor")
        return BootstrapInterval(self.estimate * factor, self.low * factor,
                                 self.high * factor, self.level, self.n_boot)


@dataclass(frozen=True)
class SeedInterval(_Interval):
    """A mean over training seeds (or a difference of two such means) and its t interval.

    ``format(iv, ".2f")`` writes ``"1.23 [0.98, 1.50]"``; :meth:`excludes` says whether the
    interval lies wholly on one side of a value (e.g. 0 for a difference: the two means
    differ beyond the seed spread).
    """

    estimate: float
    low: float
    high: float
    level: float
    dof: float

    def excludes(self, value: float) -> bool:
        """``value`` lies outside ``[low, high]``."""
        return not self.contains(value)


def _seed_values(x: Any, name: str) -> np.ndarray:
    values = np.asarray(x, dtype=np.float64).ravel()
    if values.size < 2 or not np.isfinite(values).all():
        raise ValueError(f"{name} must hold at least 2 finite values (one per seed), got "
                         f"{values.size}")
    return values


def seed_interval(a: Any, b: Any = None, level: float = 0.95) -> SeedInterval:
    r"""Student-t interval of the mean of per-seed values ``a``, or (with ``b``) Welch's
    interval of the difference of means :math:`\bar a - \bar b`.

    With :math:`s^2` the sample variances (``ddof=1``) and :math:`n` the seed counts, the
    standard error of the difference is :math:`\sqrt{s_a^2/n_a + s_b^2/n_b}` and its
    degrees of freedom Welch-Satterthwaite's; the interval is the estimate :math:`\pm\,
    t_{(1+\text{level})/2,\,\nu}` standard errors. With three seeds per arm :math:`t`
    is about 2.8 to 4.3, so only a difference several seed spreads wide excludes 0.
    Training seeds, not test samples, are the unit here (compare :func:`bootstrap_interval`).
    """
    from scipy.stats import t as student_t

    level = check_positive_float(level, "level")
    if level >= 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    va = _seed_values(a, "a")
    if b is None:
        estimate, var, dof = va.mean(), va.var(ddof=1) / va.size, va.size - 1.0
    else:
        vb = _seed_values(b, "b")
        qa, qb = va.var(ddof=1) / va.size, vb.var(ddof=1) / vb.size
        estimate, var = va.mean() - vb.mean(), qa + qb
        dof = (var**2 / (qa**2 / (va.size - 1) + qb**2 / (vb.size - 1))
               if var > 0 else va.size + vb.size - 2.0)
    half = float(student_t.ppf((1 + level) / 2, dof)) * math.sqrt(var)
    return SeedInterval(float(estimate), float(estimate - half), float(estimate + half),
                        level, float(dof))


def _metric_function(metric: Any, n_bins: int) -> Any:
    """A callable ``(probs, labels) -> number`` for a name of :data:`REPORT_METRICS`."""
    if callable(metric):
        return metric
    name = check_choice(metric, "metric", REPORT_METRICS)
    n_bins = check_positive_int(n_bins, "n_bins")
    binned = {"ece": ece, "mce": mce, "ace": ace, "classwise_ece": classwise_ece}
    if name in binned:
        return lambda p, y: binned[name](p, y, n_bins=n_bins)
    return {"error": error, "nll": nll, "brier": brier, "sece": sece}[name]


#: Metrics that :func:`bootstrap_interval` computes from resampled per-bin sums.
_TOP_LABEL_BOOTSTRAP = ("ece", "mce", "error")
#: Resamples per block of the per-bin sums (a block holds ``block x N`` counts).
_BOOT_BLOCK = 64


def _resampled_top_label(metric: str, probs: Any, labels: Any, n_bins: int,
                         draws: np.ndarray) -> np.ndarray:
    """``metric`` ("ece", "mce" or "error") on each resample, from per-bin sums.

    ``draws (B, N)`` holds the resampled indices. A resample is a count ``w_i`` of each
    sample, so its per-bin sums are ``sum_i w_i [bin_i = m] (1, c_i, r_i)``: one product of
    the ``(B, N)`` counts with the samples' bin indicators, instead of B metric calls. The
    bins are those of :func:`ece` (the same index function on the same confidences, in
    their own dtype); the sums are float64.
    """
    conf, correct, _, _ = _top_label_checked(probs, labels)
    edges = _uniform_edges(n_bins, conf.dtype, conf.device)
    bins = _bin_index(conf.detach()[None], edges, uniform=True)[0].cpu()
    conf, correct = conf.detach().cpu().double(), correct.detach().cpu().double()
    n = conf.shape[0]
    out = []
    if metric != "error":
        onehot = F.one_hot(bins, n_bins).double()
        columns = torch.cat([onehot, onehot * conf[:, None], onehot * correct[:, None]], dim=1)
    for b0 in range(0, draws.shape[0], _BOOT_BLOCK):
        block = draws[b0 : b0 + _BOOT_BLOCK]
        rows = np.arange(block.shape[0])[:, None]
        weights = torch.from_numpy(
            np.bincount((block + n * rows).ravel(), minlength=block.size).reshape(block.shape)
        ).double()
        if metric == "error":
            out.append(1.0 - (weights @ correct) / n)
            continue
        counts, sum_v, sum_t = (weights @ columns).split(n_bins, dim=1)
        out.append(_calibration_error(counts, sum_v, sum_t, "l1" if metric == "ece" else "max"))
    return torch.cat(out).numpy()


def bootstrap_interval(
    metric: str | Any,
    probs: ArrayLike,
    labels: ArrayLike,
    baseline: ArrayLike | None = None,
    *,
    relative: bool = False,
    n_bins: int = 15,
    n_boot: int = 1000,
    level: float = 0.95,
    seed: int = 0,
) -> BootstrapInterval:
    r"""Percentile bootstrap interval of a metric, or of a difference of two predictions'
    metrics on the same samples.

    ``metric`` is a name of :data:`REPORT_METRICS` (the binned ones use ``n_bins``
    equal-width bins) or a callable ``f(probs, labels) -> number``, which gets resampled
    rows of the arrays it was given (numpy arrays stay numpy). The statistic is

    * :math:`f(P)` without ``baseline``;
    * :math:`f(P) - f(Q)` with ``baseline`` :math:`Q` (predictions of another method for the
      same samples, e.g. the uncalibrated model), paired: each resample draws the same
      samples for both, so noise common to both cancels;
    * :math:`(f(P) - f(Q)) / f(Q)` with ``relative=True`` (-0.2 is 20% lower).

    Each of ``n_boot`` resamples draws N of the N samples with replacement
    (``numpy.random.default_rng(seed)``: the same seed gives the same resamples, whatever
    the metric), and the interval is the central ``level`` range of the statistic over the
    resamples (linear interpolation between order statistics). ``"ece"``, ``"mce"`` and
    ``"error"`` are computed for all resamples at once from per-bin sums (equal to a call
    of the metric per resample up to float64 summation order); other metrics are called
    once per resample. The interval measures the noise of a finite test set only: the
    model and any calibrator stay fixed, so it says nothing about another training seed
    or validation split.
    """
    f = _metric_function(metric, n_bins)
    if not isinstance(relative, bool):
        raise TypeError(f"relative must be a bool, got {type(relative).__name__}")
    if relative and baseline is None:
        raise ValueError("relative=True needs a baseline to compare with")
    n_boot = check_positive_int(n_boot, "n_boot", minimum=2)
    level = check_positive_float(level, "level")
    if level >= 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    seed = check_positive_int(seed, "seed", minimum=0)
    p, _ = check_probs(probs, "probs")
    check_labels(labels, p.shape[0], p.shape[1], "labels")
    models = [probs]
    if baseline is not None:
        q, _ = check_probs(baseline, "baseline")
        if q.shape != p.shape:
            raise ValueError(f"baseline has shape {tuple(q.shape)} but probs has "
                             f"{tuple(p.shape)}; both must hold the same samples")
        models.append(baseline)

    def rows(x: Any, index: np.ndarray) -> Any:
        """The resampled rows of ``x``, in the kind (and on the device) it came in."""
        if isinstance(x, torch.Tensor):
            return x[torch.from_numpy(index).to(x.device)]
        return x[index]

    n = p.shape[0]
    rng = np.random.default_rng(seed)
    draws = np.stack([rng.integers(0, n, n) for _ in range(n_boot)])
    with torch.no_grad():
        estimates = np.array([float(f(m, labels)) for m in models])
        if isinstance(metric, str) and metric in _TOP_LABEL_BOOTSTRAP:
            values = np.stack([_resampled_top_label(metric, m, labels, n_bins, draws)
                               for m in models], axis=1)
        else:
            values = np.array([[float(f(rows(m, i), rows(labels, i))) for m in models]
                               for i in draws])

    def statistic(v: np.ndarray) -> np.ndarray:
        """Rows of per-model values -> the statistic of each row."""
        if baseline is None:
            return v[..., 0]
        if relative and (v[..., 1] == 0).any():
            raise ValueError("the baseline's metric is 0 on the samples or on a resample: "
                             "a relative change is undefined there")
        diff = v[..., 0] - v[..., 1]
        return diff / v[..., 1] if relative else diff

    low, high = np.quantile(statistic(values), [(1 - level) / 2, (1 + level) / 2])
    return BootstrapInterval(float(statistic(estimates)), float(low), float(high), level,
                             n_boot)
