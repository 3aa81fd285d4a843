"""Shared helpers of the metrics: validation, top-label confidences, bins and the
binned calibration error (the binning convention is in the package docstring)."""

from __future__ import annotations

import math
from typing import Any

import torch

from calnotes._checks import (
    ArrayLike,
    as_tensor,
    check_choice,
    check_labels,
    check_logits,
    check_positive_int,
    check_probs,
    like_input,
    prob_sum_atol,
)

BINNINGS = ("uniform", "quantile")
NORMS = ("l1", "l2", "max")

#: Most resamples a bootstrap (or a resampled test) draws, and most values ``n_boot * N`` it
#: draws at once (resampled int64 indices or float64 draws: 2 GB).
MAX_BOOT = 1_000_000
MAX_BOOT_DRAWS = 250_000_000


def _check_draws(n_boot: int, n: int, what: str = "indices") -> None:
    """Refuse ``n_boot`` resamples of ``n`` values each (``what``) beyond the limits above."""
    if n_boot > MAX_BOOT:
        raise ValueError(f"n_boot must be at most {MAX_BOOT} (the limit), got {n_boot}")
    if n_boot * n > MAX_BOOT_DRAWS:
        raise ValueError(
            f"n_boot={n_boot} resamples of N={n} samples draw {n_boot * n:.3g} {what} "
            f"(about {8 * n_boot * n / 1e9:.3g} GB); the limit is n_boot * N <= "
            f"{MAX_BOOT_DRAWS:.3g}: use fewer resamples")


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


def _check_bins(n_bins: Any, binning: Any) -> tuple[Any, str]:
    """Validated ``(n_bins, binning)``; ``n_bins`` is a positive int or ``"auto"`` (resolved
    by :func:`resolve_n_bins` once the number of samples is known)."""
    if not (isinstance(n_bins, str) and n_bins == AUTO_BINS):
        n_bins = check_positive_int(n_bins, "n_bins")
        if n_bins > MAX_BINS:  # per-bin sums of every class: memory grows with n_bins
            raise ValueError(f"n_bins must be at most {MAX_BINS} (the limit: its per-bin "
                             f"arrays would not fit in memory), got {n_bins}")
    return n_bins, check_choice(binning, "binning", BINNINGS)


#: Most bins a binned metric takes (1000 is the most the book uses).
MAX_BINS = 1_000_000


#: ``n_bins="auto"``: the bin rule of :func:`resolve_n_bins`.
AUTO_BINS = "auto"


def resolve_n_bins(n_bins: int | str, n: int) -> int:
    r"""The number of bins for ``n`` samples: ``n_bins`` itself, or for ``"auto"``
    :math:`M = \lceil n^{1/3} \rceil` (at least 1).

    The cube root is the rate at which a binned estimate balances its two errors: with
    :math:`M` equal-mass bins the within-bin smoothing bias of a Lipschitz calibration
    curve falls like :math:`1/M` and the label noise of each bin's accuracy like
    :math:`\sqrt{M/n}`, so the squared error :math:`M^{-2} + M/n` is smallest at
    :math:`M \propto n^{1/3}` (the histogram rule of Freedman & Diaconis 1981, shown for the
    binned ECE by Futami & Fujisawa 2024). It assumes bins of equal mass: pair it with
    ``binning="quantile"`` (equal-width bins of a network's confidences are mostly empty).
    """
    if isinstance(n_bins, str) and n_bins == AUTO_BINS:
        return max(1, math.ceil(round(n ** (1 / 3), 9)))
    return check_positive_int(n_bins, "n_bins")


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

