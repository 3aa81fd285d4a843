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

Return types. Scalar metrics return a 0-d tensor on the input's device (in the input's
floating dtype, at least float32) for torch input, so that they can be used in a graph,
and a Python ``float`` for numpy input. Sums over samples are accumulated in float64
(float32 on MPS, which has no float64).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F

from calnotes._checks import (
    ArrayLike,
    check_choice,
    check_labels,
    check_logits,
    check_positive_float,
    check_positive_int,
    check_probs,
    like_input,
)

__all__ = [
    "ReliabilityBins",
    "ace",
    "brier",
    "calibration_report",
    "classwise_ece",
    "confidences_and_correct",
    "ece",
    "error",
    "mce",
    "nll",
    "probs_from_logits",
    "reliability_bins",
    "sece",
]

BINNINGS = ("uniform", "quantile")
NORMS = ("l1", "l2", "max")
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
    conf, pred = p.max(dim=1)
    return conf, (pred == y).to(p.dtype)


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


def _bin_index(values: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Bin of each value under the ``(b_{m-1}, b_m]`` convention.

    ``edges`` is ``(M + 1,)`` (shared) or ``(K, M + 1)`` (one row of edges per row of
    ``values (K, N)``). Values at or below ``b_1`` go to bin 0, values above ``b_{M-1}``
    to bin ``M - 1``.
    """
    inner = edges[..., 1:-1].to(values.dtype).contiguous()
    if inner.ndim == 1:
        return torch.bucketize(values, inner, right=False)
    return torch.searchsorted(inner, values.contiguous(), right=False)


def _binned_sums(
    values: torch.Tensor, targets: torch.Tensor, edges: torch.Tensor, n_bins: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-bin ``(counts, sum of values, sum of targets)`` for ``values, targets (K, N)``.

    Returns three ``(K, M)`` tensors; the sums are in the accumulator dtype and keep the
    autograd graph of ``values``.
    """
    k, n = values.shape
    idx = _bin_index(values, edges)
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
    p, y, from_numpy = _prepare(probs, labels)
    conf, correct = _top_label(p, y)
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
    p, y, from_numpy = _prepare(probs, labels)
    with torch.no_grad():
        conf, correct = _top_label(p, y)
        values, targets = conf.unsqueeze(0), correct.unsqueeze(0)
        edges = _edges_for(values, n_bins, binning).reshape(-1)
        counts, sum_v, sum_t = (x[0] for x in _binned_sums(values, targets, edges, n_bins))
        denom = torch.where(counts > 0, counts.to(sum_v.dtype), torch.nan)
        accuracy = (sum_t / denom).to(p.dtype)
        confidence = (sum_v / denom).to(p.dtype)
    return ReliabilityBins(
        edges=like_input(edges.to(p.dtype), from_numpy),
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
    p, y, from_numpy = _prepare(probs, labels)
    conf, correct = _top_label(p, y)
    values, targets = conf.unsqueeze(0), correct.unsqueeze(0)
    with torch.no_grad():
        edges = _edges_for(values, n_bins, binning)
    value = _calibration_error(*_binned_sums(values, targets, edges, n_bins), norm)[0]
    return _scalar(value, p.dtype, from_numpy)


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
        if edges.ndim == 1:
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


def sece(
    probs: ArrayLike, labels: ArrayLike, bandwidth: float = 0.05, chunk_size: int = 1024
) -> torch.Tensor | float:
    r"""Smooth (bin-free) top-label ECE with a Gaussian kernel.

    .. math::
        K_{ij} = \exp\!\Big(-\frac{(c_i - c_j)^2}{2h^2}\Big),\quad
        a_i = \frac{\sum_j K_{ij} r_j}{\sum_j K_{ij}},\quad
        SECE = \frac1N \sum_i |a_i - c_i|.

    The weights are row-normalized and include :math:`j = i` (so :math:`\sum_j K_{ij}
    \ge 1`). Differentiable with respect to ``probs`` (torch input with
    ``requires_grad``): the gradient flows through :math:`c_i` and through the kernel
    weights; :math:`r_j` is a constant. Time is O(N^2); the kernel is evaluated in
    ``chunk_size x chunk_size`` tiles (only those on or above the diagonal, as K is
    symmetric), so memory is O(chunk_size^2) in the forward and the backward pass and
    N x N is never materialized. Kernel values are floored at :math:`e^{-80}` to avoid slow
    subnormal arithmetic; this changes each :math:`\sum_j K_{ij} \ge 1` by less than
    :math:`N \cdot 2 \cdot 10^{-35}`.
    """
    h = check_positive_float(bandwidth, "bandwidth")
    chunk = check_positive_int(chunk_size, "chunk_size")
    p, y, from_numpy = _prepare(probs, labels)
    conf, correct = _top_label(p, y)
    soft = _SoftAccuracy.apply(conf, correct.detach(), h, chunk)
    return _scalar((soft - conf).abs().mean(), p.dtype, from_numpy)


def nll(probs: ArrayLike, labels: ArrayLike, eps: float = 1e-12) -> torch.Tensor | float:
    r"""Mean negative log-likelihood :math:`-\frac1N \sum_i \log \max(p_{i y_i}, \epsilon)`.

    The probability of the true class is clamped from below at ``eps`` so that a confident
    mistake with :math:`p_{iy_i} = 0` (float32 softmax underflow) costs
    :math:`-\log \epsilon` (27.6 for the default) instead of infinity.
    """
    eps = check_positive_float(eps, "eps")
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
    p, y, from_numpy = _prepare(probs, labels)
    _, correct = _top_label(p, y)
    value = 1.0 - correct.to(_acc_dtype(p.device)).mean()
    return _scalar(value, p.dtype, from_numpy)


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
    the binned metrics, ``bandwidth`` by SECE (whose cost is O(N^2): drop it from
    ``metrics`` for very large N).
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
