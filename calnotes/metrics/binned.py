"""Binned calibration errors: ECE (uniform or equal-mass bins; L1, L2, max), MCE, ACE,
classwise ECE and reliability bins."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch

from calnotes._checks import (
    ArrayLike,
    check_choice,
    like_input,
)
from calnotes.metrics._common import (
    NORMS,
    _acc_dtype,
    _bin_index,
    _binned_sums,
    _calibration_error,
    _check_bins,
    _edges_for,
    _prepare,
    _quantile_edges,
    _scalar,
    _top_label_checked,
    _uniform_edges,
    resolve_n_bins,
)
from calnotes.metrics._weights import (
    check_sample_weight,
    weighted_error,
    weighted_quantile_edges,
    weighted_sums,
)

#: Classwise metrics bin the (N, C) matrix in blocks of about this many entries (bounded
#: memory for 1,000,000 x 1000 inputs).
_CLASS_CHUNK_ELEMENTS = 1 << 22



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
        n_bins = resolve_n_bins(n_bins, conf.shape[0])
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
    sample_weight: ArrayLike | None = None,
) -> torch.Tensor | float:
    r"""Top-label expected calibration error (Guo et al. 2017).

    With :math:`B_m` the bins of the confidences, :math:`acc_m, conf_m` their mean
    ``correct`` and mean confidence:

    * ``l1``: :math:`\sum_m \frac{|B_m|}{N} |acc_m - conf_m|`
    * ``l2``: :math:`\sqrt{\sum_m \frac{|B_m|}{N} (acc_m - conf_m)^2}`
    * ``max``: :math:`\max_{m: |B_m| > 0} |acc_m - conf_m|` (the MCE)

    ``binning="quantile"`` gives the top-label equal-mass ECE.

    ``sample_weight (N,)``: weights :math:`w_i \ge 0`; :math:`|B_m|/N` becomes
    :math:`W_m / W` (:math:`W_m = \sum_{i \in B_m} w_i`, :math:`W = \sum_i w_i`),
    :math:`acc_m = \sum_{i \in B_m} w_i r_i / W_m`, :math:`conf_m = \sum_{i \in B_m}
    w_i c_i / W_m`, bins of zero weight are empty and equal-mass edges are the weighted
    quantiles (integer weights give the ECE of the data with rows repeated).
    """
    n_bins, binning = _check_bins(n_bins, binning)
    norm = check_choice(norm, "norm", NORMS)
    conf, correct, dtype, from_numpy = _top_label_checked(probs, labels)
    n_bins = resolve_n_bins(n_bins, conf.shape[0])
    if sample_weight is not None:
        w = check_sample_weight(sample_weight, conf.shape[0], conf.device)
        with torch.no_grad():
            if binning == "uniform":
                edges = _uniform_edges(n_bins, conf.dtype, conf.device)
            else:
                edges = weighted_quantile_edges(conf.unsqueeze(0), w, n_bins)[0]
        idx = _bin_index(conf, edges, binning == "uniform")
        sums = weighted_sums(idx, conf, correct, w, n_bins)
        return _scalar(weighted_error(*sums, norm)[0], dtype, from_numpy)
    values, targets = conf.unsqueeze(0), correct.unsqueeze(0)
    with torch.no_grad():
        edges = _edges_for(values, n_bins, binning)
    sums = _binned_sums(values, targets, edges, n_bins, binning == "uniform")
    return _scalar(_calibration_error(*sums, norm)[0], dtype, from_numpy)


def mce(
    probs: ArrayLike, labels: ArrayLike, n_bins: int = 15, binning: str = "uniform",
    sample_weight: ArrayLike | None = None,
) -> torch.Tensor | float:
    r"""Maximum calibration error :math:`\max_{m: |B_m| > 0} |acc_m - conf_m|` (with
    ``sample_weight``: weighted bin means, the maximum over bins of positive weight)."""
    return ece(probs, labels, n_bins=n_bins, binning=binning, norm="max",
               sample_weight=sample_weight)


def _classwise(
    probs: ArrayLike, labels: ArrayLike, n_bins: int, binning: str,
    sample_weight: ArrayLike | None = None,
) -> torch.Tensor | float:
    """Mean over classes of the binned l1 error of ``p_{:,k}`` against ``1[y = k]``.

    Rows are processed in contiguous blocks of about ``_CLASS_CHUNK_ELEMENTS`` entries;
    each entry ``p_ik`` adds to cell ``(k, bin)``, and only the true class of each row adds
    to the target sums (no one-hot matrix).
    """
    n_bins, binning = _check_bins(n_bins, binning)
    p, y, from_numpy = _prepare(probs, labels)
    n, c = p.shape
    n_bins = resolve_n_bins(n_bins, n)
    acc = _acc_dtype(p.device)
    w = None if sample_weight is None else check_sample_weight(sample_weight, n, p.device)
    with torch.no_grad():
        if binning == "uniform":
            edges = _uniform_edges(n_bins, p.dtype, p.device)
        else:  # per-class quantiles, a few classes at a time (sorting copies the columns)
            step = max(1, _CLASS_CHUNK_ELEMENTS // n)
            edges = torch.cat(
                [_quantile_edges(p[:, k0 : k0 + step].T, n_bins) if w is None
                 else weighted_quantile_edges(p[:, k0 : k0 + step].T, w, n_bins)
                 for k0 in range(0, c, step)]
            )
    if w is not None:
        return _weighted_classwise(p, y, w, edges, n_bins, from_numpy)
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


def _weighted_classwise(p: torch.Tensor, y: torch.Tensor, w: torch.Tensor, edges: torch.Tensor,
                        n_bins: int, from_numpy: bool) -> torch.Tensor | float:
    """:func:`_classwise` with weights, from :func:`_weighted_classwise_sums`."""
    c = p.shape[1]
    w_m, sum_v, sum_t = _weighted_classwise_sums(p, y, w, edges, n_bins)
    per_class = weighted_error(w_m.view(c, n_bins), sum_v.view(c, n_bins),
                               sum_t.view(c, n_bins), "l1")
    return _scalar(per_class.mean(), p.dtype, from_numpy)


def _weighted_classwise_sums(p: torch.Tensor, y: torch.Tensor, w: torch.Tensor,
                             edges: torch.Tensor, n_bins: int,
                             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per cell ``(k, bin)`` (flat, ``(C M,)``, in ``w``'s dtype) the sums of ``w_i``,
    ``w_i p_ik`` and ``w_i 1[y_i = k]``; ``edges`` shared ``(M+1,)`` or per class."""
    n, c = p.shape
    offsets = n_bins * torch.arange(c, device=p.device)
    shape = (c * n_bins,)
    w_m = torch.zeros(shape, dtype=w.dtype, device=p.device)
    sum_v, sum_t = torch.zeros_like(w_m), torch.zeros_like(w_m)
    rows = max(1, _CLASS_CHUNK_ELEMENTS // c)
    for r0 in range(0, n, rows):
        block, y_block, w_block = p[r0 : r0 + rows], y[r0 : r0 + rows], w[r0 : r0 + rows]
        idx = _bin_index(block, edges) if edges.ndim == 1 else _bin_index(block.T, edges).T
        flat = idx + offsets
        w_rows = w_block.unsqueeze(1).expand_as(block)
        w_m = w_m.index_add(0, flat.reshape(-1), w_rows.reshape(-1))
        sum_v = sum_v.index_add(0, flat.reshape(-1), (block.to(w.dtype) * w_rows).reshape(-1))
        hit = flat.gather(1, y_block.unsqueeze(1)).squeeze(1)
        sum_t = sum_t.index_add(0, hit, w_block)
    return w_m, sum_v, sum_t


def classwise_ece(
    probs: ArrayLike, labels: ArrayLike, n_bins: int = 15, binning: str = "uniform",
    sample_weight: ArrayLike | None = None,
) -> torch.Tensor | float:
    r"""Classwise ECE (Kull et al. 2019): :math:`\frac1C \sum_k \sum_m
    \frac{|B_{mk}|}{N} |\bar y_{mk} - \bar p_{mk}|`.

    For each class :math:`k` the one-vs-rest probabilities :math:`p_{ik}` of *all* samples
    are binned (equal-width by default), and each bin compares the mean of
    :math:`1[y_i = k]` with the mean of :math:`p_{ik}`. ``binning="quantile"`` gives
    :func:`ace`.

    ``sample_weight (N,)``: :math:`\frac1C \sum_k \sum_m \frac{W_{mk}}{W}
    |\bar y_{mk} - \bar p_{mk}|` with :math:`W_{mk} = \sum_{i \in B_{mk}} w_i`,
    :math:`W = \sum_i w_i` and weighted bin means (see :func:`ece`).
    """
    return _classwise(probs, labels, n_bins, binning, sample_weight)


def ace(probs: ArrayLike, labels: ArrayLike, n_bins: int = 15,
        sample_weight: ArrayLike | None = None) -> torch.Tensor | float:
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
    mean over non-empty equal-width bins.) ``sample_weight`` as in :func:`classwise_ece`,
    with weighted quantile ranges.
    """
    return _classwise(probs, labels, n_bins, "quantile", sample_weight)


#: Kernel exponents are floored here: K >= e^-80 (about 1.8e-35). This keeps float32


# --------------------------------------------------------------------------- debiased L2

DEBIAS_MODES = ("top-label", "marginal")


def _mass_split_edges(values: torch.Tensor, n_bins: int) -> torch.Tensor:
    """Right edges of Kumar et al.'s equal-mass bins: the sorted values cut into
    ``min(n_bins, N)`` consecutive groups whose sizes differ by at most one (the larger
    groups first), an edge halfway between two neighbouring groups, the last edge 1."""
    v = values.sort().values
    n = v.shape[0]
    m = min(n_bins, n)
    sizes = torch.full((m,), n // m, dtype=torch.long)
    sizes[: n % m] += 1
    ends = sizes.cumsum(0)[:-1]  # index of the first value of groups 1..m-1
    inner = 0.5 * (v[ends - 1] + v[ends])
    return torch.cat([inner, torch.ones(1, dtype=v.dtype)]).unique()


def _debiased_square(values: torch.Tensor, targets: torch.Tensor, n_bins: int) -> torch.Tensor:
    """The bias-corrected squared L2 calibration error of one score (float64, CPU)."""
    edges = _mass_split_edges(values, n_bins)
    bins = torch.searchsorted(edges, values, side="left").clamp(max=edges.shape[0] - 1)
    m = edges.shape[0]
    count = torch.zeros(m, dtype=torch.float64).index_add_(0, bins, torch.ones_like(values))
    sum_v = torch.zeros(m, dtype=torch.float64).index_add_(0, bins, values)
    sum_y = torch.zeros(m, dtype=torch.float64).index_add_(0, bins, targets)
    ok = count >= 2
    n_b = count[ok]
    mean_v, mean_y = sum_v[ok] / n_b, sum_y[ok] / n_b
    term = (mean_v - mean_y) ** 2 - mean_y * (1 - mean_y) / (n_b - 1)
    return (n_b * term).sum() / values.shape[0]


def debiased_l2_ce(
    probs: ArrayLike, labels: ArrayLike, n_bins: int = 15, mode: str = "top-label"
) -> torch.Tensor | float:
    r"""Debiased L2 calibration error of Kumar, Liang & Ma (NeurIPS 2019).

    The squared plug-in error :math:`\sum_b \frac{n_b}{N}(\bar v_b - \bar y_b)^2` over-counts
    the noise of the labels: for a perfectly calibrated bin
    :math:`E[(\bar v_b - \bar y_b)^2] \approx \mu_b(1-\mu_b)/n_b`. The debiased estimator
    subtracts the unbiased estimate of that variance in each bin,

    .. math:: \widehat{CE}^2 = \sum_b \frac{n_b}{N}\Big[(\bar v_b - \bar y_b)^2 -
              \frac{\bar y_b (1 - \bar y_b)}{n_b - 1}\Big],
              \qquad \widehat{CE} = \sqrt{\max(\widehat{CE}^2, 0)},

    where bins with fewer than two samples contribute 0. ``mode="top-label"`` uses
    :math:`v_i = c_i` (top-label confidence) and :math:`y_i = r_i` (correct);
    ``mode="marginal"`` computes :math:`\widehat{CE}_k` for each class on
    :math:`v_i = p_{ik}`, :math:`y_i = \mathbf 1[y_i = k]` and returns
    :math:`\sqrt{\frac1C \sum_k \widehat{CE}_k^2}`.

    Bins hold equal masses as in the paper's code: the sorted values are cut into
    ``n_bins`` consecutive groups of sizes differing by at most one, each edge lies halfway
    between two groups, and bins are :math:`(b_{m-1}, b_m]` as everywhere in this module
    (ties at an edge go to the lower bin). Computed in float64.

    Convention: ``uncertainty-calibration``'s ``get_calibration_error(probs, labels, p=2,
    debias=True)`` gives the same number when its inputs are continuous; when every column
    of ``probs`` holds fewer than ``N/4`` distinct values (the output of a binning
    calibrator; it reads the columns even in top-label mode) it switches to one bin per
    distinct value, which this function does not. ``n_bins`` equal to the number of
    distinct values does *not* reproduce that (equal-count groups cut through runs of tied
    values, and ties then go to the lower bin, as for values {0.1 x4, 0.5 x20, 0.9 x4} with
    ``n_bins=3``); ``n_bins`` at least N does, since every distinct value then gets a bin
    of its own (a test pins both).
    """
    n_bins = _check_bins(n_bins, "uniform")[0]
    mode = check_choice(mode, "mode", DEBIAS_MODES)
    if mode == "top-label":
        conf, correct, dtype, from_numpy = _top_label_checked(probs, labels)
        v = conf.detach().to("cpu", torch.float64)
        n_bins = resolve_n_bins(n_bins, v.shape[0])
        value = _debiased_square(v, correct.detach().to("cpu", torch.float64), n_bins)
        device = conf.device
    else:
        p, y, from_numpy = _prepare(probs, labels)
        dtype, device = p.dtype, p.device
        p64, y = p.detach().to("cpu", torch.float64), y.cpu()
        n_bins = resolve_n_bins(n_bins, p64.shape[0])
        squares = [
            _debiased_square(p64[:, k].contiguous(), (y == k).to(torch.float64), n_bins)
            .clamp(min=0) for k in range(p64.shape[1])
        ]
        value = torch.stack(squares).mean()
    value = value.clamp(min=0).sqrt()
    return _scalar(value if from_numpy else value.to(device), dtype, from_numpy)
