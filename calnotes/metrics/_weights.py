r"""Sample weights of the metrics: validation, weighted quantile edges and weighted bins.

A weight :math:`w_i \ge 0` counts sample :math:`i` :math:`w_i` times: every sum over
samples becomes :math:`\sum_i w_i (\cdot)` and every count :math:`N` or :math:`|B_m|`
becomes :math:`W = \sum_i w_i` or :math:`W_m = \sum_{i \in B_m} w_i`. Weights of 1 give
the unweighted metric and integer weights the metric of the data with each row repeated
:math:`w_i` times (for equal-mass bins when the smallest positive weight is 1, see
:func:`weighted_quantile_edges`). Scaling every weight by a constant changes nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from calnotes._checks import as_tensor


def check_sample_weight(sample_weight: Any, n: int, device: torch.device,
                        name: str = "sample_weight") -> torch.Tensor:
    """Validate ``(N,)`` finite weights ``>= 0`` with a positive sum; float64 on ``device``."""
    w, _ = as_tensor(sample_weight, name)
    if w.dtype == torch.bool or torch.is_complex(w):
        raise TypeError(f"{name} must have a real numeric dtype, got {w.dtype}")
    if w.ndim != 1:
        raise ValueError(f"{name} must have shape (N,), got shape {tuple(w.shape)}")
    if w.shape[0] != n:
        raise ValueError(f"{name} has length {w.shape[0]} but the predictions have {n} rows")
    w = w.detach().to(device=device, dtype=torch.float64 if device.type != "mps"
                      else torch.float32)
    if not bool(torch.isfinite(w).all()):
        raise ValueError(f"{name} contains NaN or inf")
    if bool((w < 0).any()):
        raise ValueError(f"{name} must be >= 0; got a minimum of {float(w.min()):.4g}")
    if not float(w.sum()) > 0:
        raise ValueError(f"{name} must have a positive sum")
    return w


def weighted_quantile_edges(values: torch.Tensor, weights: torch.Tensor,
                            n_bins: int) -> torch.Tensor:
    r"""Weighted ``m / M`` quantiles of ``values (K, N)`` with ``weights (N,)`` -> ``(K, M+1)``.

    With the values sorted, :math:`C_j` the cumulative weight up to and including the
    :math:`j`-th, :math:`W = C_N` and :math:`s(t) = v_{(j)}` for the first :math:`j` with
    :math:`C_j > t`, the edge is :math:`s(\lfloor x\rfloor) + (s(\lfloor x\rfloor + 1) -
    s(\lfloor x\rfloor)) (x - \lfloor x\rfloor)` at :math:`x = (W - 1) m / M` (arguments of
    :math:`s` clamped to :math:`[0, W)`): the linear rule of the unweighted edges on the
    data with row :math:`i` repeated :math:`w_i` times. The weights are first divided by
    the smallest positive one, so the edges do not depend on their scale (weights summing
    to 1 would otherwise put every edge at the minimum); equal weights give the unweighted
    edges, and integer weights whose smallest positive one is 1 the repeated rows' edges.
    """
    acc = weights.dtype
    smallest = weights[weights > 0].min()
    if bool(torch.isfinite(weights.sum() / smallest)):
        weights = weights / smallest
    else:  # a ratio past the float range: the mean weight as the unit
        weights = weights * (weights.shape[0] / weights.sum())
    order = values.argsort(dim=-1, stable=True)
    s = values.gather(-1, order).to(acc)
    cum = weights[order].cumsum(dim=-1)  # (K, N)
    total = cum[..., -1:]
    q = torch.arange(n_bins + 1, dtype=acc, device=values.device) / n_bins
    pos = ((total - 1).clamp(min=0) * q)  # (K, M + 1)
    lo = pos.floor()
    frac = pos - lo
    hi = torch.minimum(lo + 1, (total - 1).clamp(min=0))

    def at(t: torch.Tensor) -> torch.Tensor:
        j = torch.searchsorted(cum.contiguous(), t.contiguous(), right=True)
        return s.gather(-1, j.clamp(max=s.shape[-1] - 1))

    a, b = at(lo), at(hi)
    return a + (b - a) * frac


def weighted_error(weights: torch.Tensor, sum_v: torch.Tensor, sum_t: torch.Tensor,
                   norm: str) -> torch.Tensor:
    r"""Row-wise binned error from per-bin weight sums ``W_m`` and weighted sums ``(K, M)``.

    ``l1``: :math:`\sum_m \frac{W_m}{W} |acc_m - conf_m|`, ``l2`` its root mean square
    analogue, ``max``: :math:`\max_{m: W_m > 0} |acc_m - conf_m|`, with
    :math:`acc_m = \sum_{i \in B_m} w_i r_i / W_m` and :math:`conf_m = \sum_{i \in B_m}
    w_i c_i / W_m`. Bins of zero weight are empty.
    """
    total = weights.sum(dim=1, keepdim=True)
    filled = weights > 0
    gap = torch.where(filled, (sum_t - sum_v) / torch.where(filled, weights, 1.0), 0.0)
    share = weights / total
    if norm == "l1":
        return (share * gap.abs()).sum(dim=1)
    if norm == "l2":
        return (share * gap.square()).sum(dim=1).sqrt()
    return gap.abs().amax(dim=1)


def weighted_sums(idx: torch.Tensor, values: torch.Tensor, targets: torch.Tensor,
                  weights: torch.Tensor, n_bins: int,
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-bin ``(W_m, sum w v, sum w t)`` of one row: ``idx, values, targets (N,)`` ->
    three ``(1, M)`` tensors in the weights' dtype (``values`` keeps its graph)."""
    acc = weights.dtype
    zeros = torch.zeros(n_bins, dtype=acc, device=values.device)
    w_m = zeros.index_add(0, idx, weights)
    sum_v = zeros.index_add(0, idx, values.to(acc) * weights)
    sum_t = zeros.index_add(0, idx, targets.to(acc) * weights)
    return w_m.unsqueeze(0), sum_v.unsqueeze(0), sum_t.unsqueeze(0)
