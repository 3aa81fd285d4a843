"""Smooth (bin-free) calibration errors: SECE and the smooth ECE (smECE)."""

from __future__ import annotations

import math
from typing import Any

import torch

from calnotes._checks import (
    ArrayLike,
    check_choice,
    check_positive_float,
    check_positive_int,
)
from calnotes._threads import cpu_threads
from calnotes.metrics._common import _scalar, _top_label_checked

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
    return _scalar(_sece_of(conf, correct, h, method, chunk), dtype, from_numpy)


def _sece_of(conf: torch.Tensor, correct: torch.Tensor, h: float, method: str,
             chunk: int) -> torch.Tensor:
    """SECE of checked top-label ``conf, correct (N,)`` (``method`` as in :func:`sece`)."""
    if method != "exact":
        method = _sece_method(conf, h, explicit=method == "grid")
    if method == "exact":
        soft = _SoftAccuracy.apply(conf, correct.detach(), h, chunk)
        return (soft - conf).abs().mean()
    conf64 = conf.to(torch.float64)
    soft = _GridSoftAccuracy.apply(conf64, correct.detach().to(torch.float64), h)
    return (soft - conf64).abs().mean()


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




# --------------------------------------------------------------------------- smooth ECE

#: smECE's automatic bandwidth is searched in ``[SMECE_MIN_BANDWIDTH, 1]`` (relplot's floor).
SMECE_MIN_BANDWIDTH = 1e-3
#: The grid of :func:`smece` has at least this many intervals on [0, 1] and at least 64 per
#: bandwidth; on a grid of this size it runs on one intra-op thread (see
#: :func:`_smece_fixed_point`), on a finer one with torch's threads.
_SMECE_MIN_CELLS = 1 << 16
#: At most this many grid intervals (about 2 GB of float64 work arrays): the bandwidth's
#: floor is ``64 / SMECE_MAX_CELLS``, about 3.8e-6.
SMECE_MAX_CELLS = 1 << 24
#: The widest bandwidth :func:`smece` takes: at sigma = 100 the reflected kernel is flat on
#: [0, 1] (its first Fourier mode weighs exp(-(100 pi)^2 / 2), 0 in float64), so every wider
#: one gives the same value; a larger number is more likely a mistaken unit.
SMECE_MAX_BANDWIDTH = 100.0


def _check_smece_bandwidth(bandwidth: Any) -> float:
    """A positive bandwidth within the limits above."""
    bandwidth = check_positive_float(bandwidth, "bandwidth")
    floor = 64.0 / SMECE_MAX_CELLS
    if bandwidth < floor:
        cells = math.ceil(64.0 / bandwidth)
        raise ValueError(
            f"bandwidth {bandwidth:g} needs a grid of {cells:.3g} cells (about "
            f"{4 * 8 * cells / 1e9:.3g} GB); the limit is bandwidth >= {floor:.3g} "
            f"({SMECE_MAX_CELLS} cells)")
    if bandwidth > SMECE_MAX_BANDWIDTH:
        raise ValueError(
            f"bandwidth {bandwidth:g} is wider than needed: the kernel is already flat on "
            f"[0, 1] at {SMECE_MAX_BANDWIDTH:g}, so every wider one gives the same value; the "
            f"limit is bandwidth <= {SMECE_MAX_BANDWIDTH:g}")
    return bandwidth


def _smece_cells(bandwidth: float) -> int:
    """Intervals of the grid on [0, 1] for ``bandwidth``: a power of 2, ``>= 64 / sigma``."""
    need = max(_SMECE_MIN_CELLS, math.ceil(64.0 / bandwidth))
    return 1 << (need - 1).bit_length()


def _smece_mass(conf: torch.Tensor, resid: torch.Tensor, cells: int) -> torch.Tensor:
    """Residuals spread linearly onto the nodes ``j / cells`` and reflected evenly onto a
    circle of length 2 (``2 * cells`` nodes): the reflected kernel's images become the
    circle's wrap-around. An atom at 0 or 1 is its own mirror image, so it counts twice."""
    u = conf * cells
    j = u.floor().clamp(max=cells - 1)
    frac = u - j
    j = j.long()
    mass = torch.zeros(cells + 1, dtype=torch.float64)
    mass.index_add_(0, j, (1.0 - frac) * resid)
    mass.index_add_(0, j + 1, frac * resid)
    ring = torch.cat([mass, mass[1:-1].flip(0)])
    ring[0] *= 2.0
    ring[cells] *= 2.0
    return ring


def _smece_value(ring_fft: torch.Tensor, n: int, cells: int, bandwidth: float) -> float:
    r"""``int_0^1 |h_sigma(t)| dt`` from the spread residuals' FFT (trapezoid rule).

    The reflected kernel on the circle of length 2 is the Gaussian summed over its images
    ``2k``; its Fourier coefficients are :math:`\tfrac12 e^{-(\pi m \sigma)^2 / 2}`, so its
    DFT on the ``2 * cells`` nodes is ``cells * exp(-(pi m sigma)^2 / 2)`` (aliasing is below
    :math:`e^{-(64\pi)^2/2}` at the grid's spacing of at most ``sigma / 64``)."""
    m = torch.arange(cells + 1, dtype=torch.float64)
    kernel_fft = cells * torch.exp(-0.5 * (math.pi * bandwidth * m) ** 2)
    h = torch.fft.irfft(ring_fft * kernel_fft, n=2 * cells)[: cells + 1] / n
    a = h.abs()
    return float((a.sum() - 0.5 * (a[0] + a[-1])) / cells)


def smece(
    probs: ArrayLike, labels: ArrayLike, bandwidth: float | None = None
) -> torch.Tensor | float:
    r"""Smooth ECE of Błasiok & Nakkiran (ICLR 2024) on the top-label confidence.

    With residuals :math:`r_i = c_i - \mathbf 1[\hat y_i = y_i]` and the Gaussian kernel
    reflected at 0 and 1,
    :math:`K_\sigma(t, c) = \sum_{k \in \mathbb Z} \varphi_\sigma(t - c - 2k) +
    \varphi_\sigma(t + c - 2k)` (which integrates to 1 over [0, 1] for every ``c``),

    .. math:: \mathrm{smECE}_\sigma = \int_0^1 \Big| \frac1N \sum_i r_i\, K_\sigma(t, c_i)
              \Big|\, dt ,

    the mean absolute residual after smoothing (the kernel-smoothed residual
    :math:`\hat r_\sigma(t)` weighted by the kernel density :math:`\hat\delta_\sigma(t)`).
    Without ``bandwidth`` the paper's choice is used: the fixed point :math:`\sigma^*` with
    :math:`\sigma^* = \mathrm{smECE}_{\sigma^*}` (:func:`smece_bandwidth`), so the smoothing
    is never coarser than the error it reports.

    Computed in float64 on the CPU (the result goes back to the input's device): the
    residuals are spread linearly onto a uniform grid of spacing
    :math:`\Delta \le \sigma/64` (at least :math:`2^{16}` cells), the reflection becomes a
    circular convolution of length 2 evaluated by FFT, and the integral a trapezoid sum.
    Linear spreading and the trapezoid rule each err by at most about
    :math:`0.25\, \overline{|r|}\, (\Delta/\sigma)^2`, below :math:`10^{-4}` in all.

    Convention: relplot (``relplot.smECE``) integrates on 200 points after rounding the
    samples to a grid of about :math:`\max(1000, 10/\sigma)` nodes, and bisects the
    bandwidth ten times on [0, 1] (a resolution of :math:`2^{-10}`); this function integrates
    finely and solves the fixed point to :math:`10^{-6}`. For ``(N,)`` binary input the
    top-label confidence :math:`\max(p, 1-p)` is used, as everywhere in this module, while
    relplot's ``smECE(p, y)`` reads ``p`` as the positive-class probability.

    ``bandwidth`` must lie in ``[64 / SMECE_MAX_CELLS, SMECE_MAX_BANDWIDTH]`` (about
    ``[3.8e-6, 100]``): a narrower one needs a grid beyond memory, a wider one changes nothing.
    """
    conf, correct, dtype, from_numpy = _top_label_checked(probs, labels)
    if bandwidth is not None:
        bandwidth = _check_smece_bandwidth(bandwidth)
    c = conf.detach().to("cpu", torch.float64)
    r = c - correct.detach().to("cpu", torch.float64)
    if bandwidth is None:
        bandwidth = _smece_fixed_point(c, r)
    cells = _smece_cells(bandwidth)
    with cpu_threads(1 if cells <= _SMECE_MIN_CELLS else None):
        ring = torch.fft.rfft(_smece_mass(c, r, cells))
        value = _smece_value(ring, c.shape[0], cells, bandwidth)
    out = torch.tensor(value, dtype=torch.float64)
    return _scalar(out.to(conf.device) if not from_numpy else out, dtype, from_numpy)


@cpu_threads(1)
def _smece_fixed_point(c: torch.Tensor, r: torch.Tensor) -> float:
    """Root of ``smECE_sigma - sigma`` on ``[SMECE_MIN_BANDWIDTH, 1]`` by Brent's method to
    1e-6 (smECE_sigma does not increase with sigma, so the gap changes sign once).

    One intra-op thread: a dozen FFTs of 2^17 points gain nothing from more, and on a
    machine whose cores are busy each parallel operator waits for a descheduled thread
    (:mod:`calnotes._threads`): 15x slower with 2 threads on 2 busy cores."""
    from scipy.optimize import brentq

    cells = _smece_cells(SMECE_MIN_BANDWIDTH)
    ring = torch.fft.rfft(_smece_mass(c, r, cells))
    n = c.shape[0]

    def gap(s: float) -> float:
        return _smece_value(ring, n, cells, s) - s

    lo, hi = SMECE_MIN_BANDWIDTH, 1.0
    if gap(hi) >= 0:
        return hi
    if gap(lo) <= 0:
        return lo
    return float(brentq(gap, lo, hi, xtol=1e-6, rtol=1e-12))


def smece_bandwidth(probs: ArrayLike, labels: ArrayLike) -> float:
    r"""The bandwidth :func:`smece` uses by default: the fixed point
    :math:`\sigma^* = \mathrm{smECE}_{\sigma^*}`, found by Brent's method on
    ``[SMECE_MIN_BANDWIDTH, 1]`` to :math:`10^{-6}` (1 if :math:`\mathrm{smECE}_1 \ge 1`,
    the floor if the error is smaller than the floor)."""
    conf, correct, _, _ = _top_label_checked(probs, labels)
    c = conf.detach().to("cpu", torch.float64)
    return _smece_fixed_point(c, c - correct.detach().to("cpu", torch.float64))
