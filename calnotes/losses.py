"""Training losses that change calibration.

Every loss is an :class:`torch.nn.Module` with ``forward(logits (N, C), labels (N,))``
returning the batch mean as a scalar (mixup has its own signature, see
:class:`MixupLoss`). Hyper-parameters are validated in ``__init__``. ``forward`` checks
shapes and dtypes, and reads values (labels in ``[0, C)``, a per-sample ``gamma`` finite
and ``>= 0``) only where that is free, on the CPU: on an accelerator it would force a
device synchronisation at every step.

Notation: ``p = softmax(z)``, ``p_y`` the probability of the true class, ``r = max_c p_c``
the confidence, ``c = 1[argmax_c p_c == y]`` the correctness.

* :class:`FocalLoss` -- ``-(1 - p_y)^gamma log p_y`` with a fixed or per-sample ``gamma``.
* :class:`FLSD53` -- focal loss with ``gamma = 5`` if ``p_y < 0.2`` else ``3``.
* :class:`LabelSmoothingLoss` -- cross-entropy against ``(1 - s) onehot + s / C``.
* :func:`mixup_batch` and :class:`MixupLoss` -- mixup of inputs and targets.
* :class:`MMCELoss` -- CE plus the kernel calibration penalty MMCE.
* :class:`DECELoss` and :func:`dece` -- CE plus a differentiable ECE (two soft forms).
* :class:`SECELoss` -- the bin-free soft ECE of :func:`calnotes.metrics.sece` as a loss.
* :class:`LogitNormLoss` -- CE on logits normalised to norm ``1 / tau``.

:data:`LOSSES` maps names to factories and :func:`make_loss` builds one by name.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from scipy.special import betaincinv
from torch import nn

from calnotes._checks import (
    ArrayLike,
    as_tensor,
    check_choice,
    check_label_range,
    check_labels,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
    check_probs,
    like_input,
)

__all__ = [
    "LOSSES",
    "CrossEntropyLoss",
    "DECELoss",
    "DECE_FORMS",
    "FLSD53",
    "FocalLoss",
    "LabelSmoothingLoss",
    "LogitNormLoss",
    "MMCELoss",
    "MixupLoss",
    "RANKED_DECE",
    "SECELoss",
    "check_batch",
    "dece",
    "focal_loss",
    "make_loss",
    "mixup_batch",
]


# ---------------------------------------------------------------------------------------
# private helpers
# ---------------------------------------------------------------------------------------



def check_batch(logits: torch.Tensor, labels: torch.Tensor, name: str = "labels") -> None:
    """The checks of every ``forward`` (and of the trainers' steps): types, shapes and
    dtypes, and on the CPU, where it costs no device synchronisation, labels in ``[0, C)``."""
    if not isinstance(logits, torch.Tensor):
        raise TypeError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if not isinstance(labels, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(labels).__name__}")
    if logits.ndim != 2 or logits.shape[1] < 2:
        raise ValueError(f"logits must have shape (N, C) with C >= 2, got {tuple(logits.shape)}")
    if not torch.is_floating_point(logits):
        raise TypeError(f"logits must have a floating-point dtype, got {logits.dtype}")
    if labels.ndim != 1 or labels.shape[0] != logits.shape[0]:
        raise ValueError(
            f"{name} must have shape (N,) = ({logits.shape[0]},) to match logits, "
            f"got {tuple(labels.shape)}"
        )
    if labels.dtype == torch.bool or torch.is_floating_point(labels) or labels.is_complex():
        raise TypeError(f"{name} must have an integer dtype (class indices), got {labels.dtype}")
    if logits.shape[0] == 0:
        raise ValueError("logits is empty")
    if labels.device.type == "cpu":  # free here; torch would raise an IndexError instead
        check_label_range(labels, logits.shape[1], name)


def _true_class_log_prob(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``log p_y`` per sample, from ``log_softmax`` (exact and finite for any finite logits)."""
    return F.log_softmax(logits, dim=1).gather(1, labels.long().unsqueeze(1)).squeeze(1)


# ---------------------------------------------------------------------------------------
# focal losses
# ---------------------------------------------------------------------------------------


def focal_loss(
    logits: torch.Tensor, labels: torch.Tensor, gamma: float | torch.Tensor
) -> torch.Tensor:
    """Mean focal loss ``-(1 - p_y)^gamma log p_y``; ``gamma`` a number or an ``(N,)`` tensor.

    ``log p_y`` comes from ``log_softmax`` and ``1 - p_y = -expm1(log p_y)`` keeps full
    precision as ``p_y -> 1``. A sample with ``1 - p_y`` below the dtype's machine epsilon
    adds exactly 0 (its true term is below ``eps * eps^gamma``) and passes no gradient: there
    ``x^gamma``'s derivatives ``gamma x^(gamma-1)`` and ``x^(gamma-2)`` overflow for
    ``gamma < 1``, and a gamma-Net's hypergradient (a second derivative) would turn them into
    NaN. A scalar ``gamma == 0`` returns ``F.cross_entropy`` itself.
    """
    check_batch(logits, labels)
    if isinstance(gamma, torch.Tensor):
        if gamma.ndim == 0:
            gamma = gamma.to(logits.dtype)
        elif gamma.shape != (logits.shape[0],):
            raise ValueError(
                f"gamma must be a number or have shape (N,) = ({logits.shape[0]},), "
                f"got {tuple(gamma.shape)}"
            )
        if not torch.is_floating_point(gamma):
            gamma = gamma.to(logits.dtype)
        if gamma.device.type == "cpu" and gamma.numel():  # free here (module docstring)
            lo, hi = (float(v) for v in torch.aminmax(gamma.detach()))
            if not (lo >= 0.0 and math.isfinite(hi)):  # NaN fails both comparisons
                raise ValueError(f"gamma must be finite and >= 0, got values in [{lo}, {hi}]")
    else:
        gamma = check_nonnegative_float(gamma, "gamma")
        if gamma == 0.0:
            return F.cross_entropy(logits, labels)
    log_py = _true_class_log_prob(logits, labels)
    one_minus = -torch.expm1(log_py)
    saturated = one_minus < torch.finfo(log_py.dtype).eps
    weight = torch.where(saturated, 1.0, one_minus).pow(gamma)  # finite derivatives
    return -(torch.where(saturated, 0.0, weight) * log_py).mean()


class FocalLoss(nn.Module):
    r"""Focal loss (Lin et al. 2017): :math:`L = -(1 - p_y)^\gamma \log p_y`, averaged over
    the batch.

    ``gamma = 0`` is cross-entropy. ``forward(logits, labels, gamma=None)`` takes an optional
    override: a number or a per-sample ``(N,)`` tensor of non-negative ``gamma`` (as produced
    by a gamma network); a tensor ``gamma`` may carry gradients.
    """

    def __init__(self, gamma: float = 3.0) -> None:
        super().__init__()
        self.gamma = check_nonnegative_float(gamma, "gamma")

    def forward(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        gamma: float | torch.Tensor | None = None,
    ) -> torch.Tensor:
        return focal_loss(logits, labels, self.gamma if gamma is None else gamma)

    def extra_repr(self) -> str:
        return f"gamma={self.gamma}"


class FLSD53(nn.Module):
    """Sample-dependent focal loss FLSD-53 (Mukhoti et al. 2020).

    ``gamma_i = 5`` if ``p_{y_i} < 0.2`` else ``3``; the choice of ``gamma_i`` is made without
    gradient, then ``L = mean_i -(1 - p_{y_i})^{gamma_i} log p_{y_i}``.
    """

    threshold: float = 0.2
    gamma_low: float = 5.0
    gamma_high: float = 3.0

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        check_batch(logits, labels)
        with torch.no_grad():
            p_y = _true_class_log_prob(logits, labels).exp()
            gamma = torch.where(
                p_y < self.threshold,
                torch.full_like(p_y, self.gamma_low),
                torch.full_like(p_y, self.gamma_high),
            )
        return focal_loss(logits, labels, gamma)


# ---------------------------------------------------------------------------------------
# label smoothing and mixup
# ---------------------------------------------------------------------------------------


class LabelSmoothingLoss(nn.Module):
    r"""Cross-entropy against smoothed targets :math:`q = (1 - s)\, \mathrm{onehot}(y) + s / C`.

    ``L = (1 - s) (-log p_y) + s * mean_c (-log p_c)``; the same quantity as
    ``F.cross_entropy(logits, labels, label_smoothing=s)``. ``s`` must lie in ``[0, 1)``.
    """

    def __init__(self, smoothing: float = 0.1) -> None:
        super().__init__()
        smoothing = check_nonnegative_float(smoothing, "smoothing")
        if smoothing >= 1.0:
            raise ValueError(f"smoothing must lie in [0, 1), got {smoothing}")
        self.smoothing = smoothing

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        check_batch(logits, labels)
        log_p = F.log_softmax(logits, dim=1)
        nll = -log_p.gather(1, labels.long().unsqueeze(1)).squeeze(1)
        uniform = -log_p.mean(dim=1)
        return ((1.0 - self.smoothing) * nll + self.smoothing * uniform).mean()

    def extra_repr(self) -> str:
        return f"smoothing={self.smoothing}"


def mixup_batch(
    x: ArrayLike,
    y: ArrayLike,
    alpha: float,
    generator: torch.Generator | None = None,
) -> tuple[ArrayLike, ArrayLike, ArrayLike, float]:
    """Mixup (Zhang et al. 2018): ``x~ = lam x + (1 - lam) x[perm]`` with ``lam ~ Beta(a, a)``.

    Returns ``(x_mixed, y_a, y_b, lam)`` with ``y_a = y`` and ``y_b = y[perm]`` for a random
    permutation ``perm`` of the batch; train with :class:`MixupLoss`. ``lam`` is drawn by
    inverting the Beta CDF at a uniform drawn from ``generator``, so a seeded generator gives
    a reproducible batch. ``x`` must be floating point (normalise uint8 images first).
    """
    alpha = check_positive_float(alpha, "alpha")
    xt, x_numpy = as_tensor(x, "x")
    yt, y_numpy = as_tensor(y, "y")
    if not torch.is_floating_point(xt):
        raise TypeError(f"x must have a floating-point dtype, got {xt.dtype}")
    if xt.ndim < 1 or xt.shape[0] == 0:
        raise ValueError(f"x must have a non-empty batch dimension, got shape {tuple(xt.shape)}")
    if yt.ndim < 1 or yt.shape[0] != xt.shape[0]:
        raise ValueError(
            f"y must have the batch size of x ({xt.shape[0]}) as first dimension, "
            f"got shape {tuple(yt.shape)}"
        )
    gen_device = generator.device if generator is not None else torch.device("cpu")
    u = torch.rand((), generator=generator, device=gen_device, dtype=torch.float64).item()
    lam = float(betaincinv(alpha, alpha, u))
    perm = torch.randperm(xt.shape[0], generator=generator, device=gen_device)
    x_mixed = lam * xt + (1.0 - lam) * xt[perm.to(xt.device)]
    y_b = yt[perm.to(yt.device)]
    return like_input(x_mixed, x_numpy), like_input(yt, y_numpy), like_input(y_b, y_numpy), lam


class MixupLoss(nn.Module):
    r"""Mixup objective :math:`\lambda\, L(z, y_a) + (1 - \lambda)\, L(z, y_b)` for a base
    loss :math:`L`.

    ``base`` defaults to cross-entropy. The Trainer knows nothing about mixup: a batch
    transform applied to each training batch calls :func:`mixup_batch`, the model sees
    ``x_mixed`` and the loss is ``loss(logits, y_a, y_b, lam)``. Validation batches are
    not mixed.
    """

    def __init__(self, base: nn.Module | None = None) -> None:
        super().__init__()
        if base is not None and not callable(base):
            raise TypeError(f"base must be a loss module, got {type(base).__name__}")
        self.base = nn.CrossEntropyLoss() if base is None else base

    def forward(
        self, logits: torch.Tensor, y_a: torch.Tensor, y_b: torch.Tensor, lam: float
    ) -> torch.Tensor:
        check_batch(logits, y_a, "y_a")
        check_batch(logits, y_b, "y_b")
        lam = check_nonnegative_float(lam, "lam")
        if lam > 1.0:
            raise ValueError(f"lam must lie in [0, 1], got {lam}")
        if lam == 1.0:
            return self.base(logits, y_a)
        if lam == 0.0:
            return self.base(logits, y_b)
        return lam * self.base(logits, y_a) + (1.0 - lam) * self.base(logits, y_b)


# ---------------------------------------------------------------------------------------
# calibration penalties: MMCE, DECE, SECE
# ---------------------------------------------------------------------------------------


def _mmce(logits: torch.Tensor, labels: torch.Tensor, bandwidth: float) -> torch.Tensor:
    """Unweighted MMCE of one batch (see :class:`MMCELoss`)."""
    probs = F.softmax(logits, dim=1)
    conf, pred = probs.max(dim=1)
    correct = (pred == labels).to(conf.dtype)
    gap = correct - conf
    kernel = torch.exp(-(conf.unsqueeze(1) - conf.unsqueeze(0)).abs() / bandwidth)
    total = gap @ kernel @ gap
    # The kernel is positive definite so total >= 0 up to rounding; the clamp keeps sqrt's
    # gradient finite (and zero) when a batch is perfectly calibrated.
    total = total.clamp_min(torch.finfo(total.dtype).tiny)
    return total.sqrt() / logits.shape[0]


class MMCELoss(nn.Module):
    """Cross-entropy plus maximum mean calibration error (Kumar et al. 2018).

    With confidences ``r_i = max_c p_ic``, correctness ``c_i = 1[argmax p_i = y_i]`` and the
    Laplacian kernel ``k(r, r') = exp(-|r - r'| / bandwidth)``::

        MMCE = sqrt( sum_{i,j} (c_i - r_i)(c_j - r_j) k(r_i, r_j) ) / N
        L    = CE + weight * MMCE

    This is the unweighted MMCE of the paper (the weighted variant, which reweights correct
    and incorrect samples, is not implemented). ``c`` has no gradient; ``r`` does. Memory
    is ``O(N^2)`` per batch.
    """

    def __init__(self, weight: float = 2.0, bandwidth: float = 0.4) -> None:
        super().__init__()
        self.weight = check_nonnegative_float(weight, "weight")
        self.bandwidth = check_positive_float(bandwidth, "bandwidth")

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        check_batch(logits, labels)
        ce = F.cross_entropy(logits, labels)
        if self.weight == 0.0:
            return ce
        return ce + self.weight * _mmce(logits, labels, self.bandwidth)

    def extra_repr(self) -> str:
        return f"weight={self.weight}, bandwidth={self.bandwidth}"


#: Forms of the differentiable ECE; see :func:`dece`.
DECE_FORMS = ("sharpened", "ranked")
#: Bohdal et al.'s own hyper-parameters for ``form="ranked"`` (15 bins, soft-binning
#: temperature 0.01, ranking sharpness 100 = 1 / 0.01).
RANKED_DECE: dict[str, Any] = {"n_bins": 15, "temperature": 0.01, "accuracy_temperature": 0.01}


def _gaussian_bins(conf: torch.Tensor, n_bins: int, temperature: float) -> torch.Tensor:
    """``u_im = softmax_m(-(r_i - b_m)^2 / temperature)``, ``b_m = (m + 1/2) / n_bins``."""
    centers = (torch.arange(n_bins, device=conf.device, dtype=conf.dtype) + 0.5) / n_bins
    return F.softmax(-((conf.unsqueeze(1) - centers) ** 2) / temperature, dim=1)


def _linear_bins(conf: torch.Tensor, n_bins: int, temperature: float) -> torch.Tensor:
    """``u_im = softmax_m((m r_i - m (m - 1) / (2 n_bins)) / temperature)``, ``m = 1..M``.

    Neighbouring logits differ by ``(r_i - m / M) / temperature``, so bin ``m + 1`` wins
    over bin ``m`` exactly when ``r_i > m / M``: a soft version of the equal-width bins.
    """
    m = torch.arange(1, n_bins + 1, device=conf.device, dtype=conf.dtype)
    return F.softmax((conf.unsqueeze(1) * m - m * (m - 1) / (2 * n_bins)) / temperature, dim=1)


def _sharpened_correct(probs: torch.Tensor, labels: torch.Tensor, t: float) -> torch.Tensor:
    """``softmax(log p_i / t)_{y_i}``: the true class's share after sharpening."""
    log_p = torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))
    return F.softmax(log_p / t, dim=1).gather(1, labels.unsqueeze(1)).squeeze(1)


def _ranked_correct(probs: torch.Tensor, labels: torch.Tensor, t: float) -> torch.Tensor:
    """``relu(2 - rank_i)`` with the soft rank ``rank_i = 1/2 + sum_c sigmoid((p_ic - p_iy)
    / t)`` of the true class (1 when it leads every other class by far more than ``t``)."""
    p_true = probs.gather(1, labels.unsqueeze(1))
    rank = 0.5 + torch.sigmoid((probs - p_true) / t).sum(dim=1)
    return F.relu(2.0 - rank)


def _dece(
    probs: torch.Tensor,
    labels: torch.Tensor,
    n_bins: int,
    temperature: float,
    accuracy_temperature: float,
    form: str = "sharpened",
) -> torch.Tensor:
    conf = probs.max(dim=1).values
    if form == "ranked":
        membership = _linear_bins(conf, n_bins, temperature)
        soft_correct = _ranked_correct(probs, labels, accuracy_temperature)
    else:
        membership = _gaussian_bins(conf, n_bins, temperature)
        soft_correct = _sharpened_correct(probs, labels, accuracy_temperature)
    per_bin = membership.t() @ (soft_correct - conf)
    return per_bin.abs().sum() / probs.shape[0]


def dece(
    probs: ArrayLike,
    labels: ArrayLike,
    n_bins: int = 15,
    temperature: float = 1e-4,
    accuracy_temperature: float = 0.01,
    form: str = "sharpened",
) -> ArrayLike:
    """Differentiable ECE (after Bohdal et al. 2021, Meta-Calibration).

    Hard binning and hard correctness are replaced by smooth stand-ins ``u_im`` (the
    share of sample ``i`` in bin ``m``) and ``a_i``, and

    ``DECE = sum_m (n_m / N) |acc_m - conf_m| = (1/N) sum_m |sum_i u_im (a_i - r_i)|``,

    where ``r_i = max_c p_ic`` and ``n_m = sum_i u_im``. ``form`` picks the stand-ins:

    * ``"sharpened"`` (default): Gaussian bin membership ``u_im = softmax_m(-(r_i - b_m)^2
      / temperature)`` around the equal-width bin centres ``b_m = (m + 1/2) / n_bins``
      (``temperature`` is measured against the squared bin width ``1 / n_bins^2``), and
      the sharpened probability of the true class ``a_i = softmax(log p_i /
      accuracy_temperature)_{y_i}``.
    * ``"ranked"``: Bohdal et al.'s own construction. Soft binning with linear logits,
      ``u_im = softmax_m((m r_i - m (m - 1) / (2 n_bins)) / temperature)`` for ``m = 1..M``
      (bin ``m + 1`` beats bin ``m`` exactly when ``r_i > m / M``), and a soft accuracy
      from the differentiable rank of the true class, ``a_i = relu(2 - rank_i)`` with
      ``rank_i = 1/2 + sum_c sigmoid((p_ic - p_iy) / accuracy_temperature)``. Their
      hyper-parameters are :data:`RANKED_DECE` (``temperature=0.01``, sharpness ``1 /
      accuracy_temperature = 100``). Their code also adds ``1e-6`` to every ``u_im``
      before averaging per bin, which the form above (no division by ``n_m``) does not
      need; it moves DECE by less than ``(2M + 1) 10^-6``.

    Both tend to the binned ECE with ``n_bins`` equal-width bins as both temperatures go
    to 0. Returns a 0-d tensor (with gradient) for torch input, a 0-d numpy array for
    numpy input.
    """
    n_bins = check_positive_int(n_bins, "n_bins")
    temperature = check_positive_float(temperature, "temperature")
    accuracy_temperature = check_positive_float(accuracy_temperature, "accuracy_temperature")
    form = check_choice(form, "form", DECE_FORMS)
    p, numpy_out = check_probs(probs, "probs")
    y = _check_labels_for(labels, p)
    return like_input(_dece(p, y, n_bins, temperature, accuracy_temperature, form), numpy_out)


def _check_labels_for(labels: Any, probs: torch.Tensor) -> torch.Tensor:
    """Label checks for the functional API, with the labels moved to the probs' device."""
    return check_labels(labels, probs.shape[0], probs.shape[1]).to(probs.device)


class DECELoss(nn.Module):
    r"""Cross-entropy plus differentiable ECE:
    :math:`L = \mathrm{CE} + w \cdot \mathrm{DECE}(\operatorname{softmax}(z), y)`.

    See :func:`dece` for the soft binning (``temperature``), the soft correctness
    (``accuracy_temperature``) and the two ``form``\ s (``"ranked"`` is Bohdal et al.'s,
    with their temperatures in :data:`RANKED_DECE`).
    """

    def __init__(
        self,
        n_bins: int = 15,
        temperature: float = 1e-4,
        weight: float = 1.0,
        accuracy_temperature: float = 0.01,
        form: str = "sharpened",
    ) -> None:
        super().__init__()
        self.n_bins = check_positive_int(n_bins, "n_bins")
        self.temperature = check_positive_float(temperature, "temperature")
        self.weight = check_nonnegative_float(weight, "weight")
        self.accuracy_temperature = check_positive_float(
            accuracy_temperature, "accuracy_temperature"
        )
        self.form = check_choice(form, "form", DECE_FORMS)

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        check_batch(logits, labels)
        ce = F.cross_entropy(logits, labels)
        if self.weight == 0.0:
            return ce
        penalty = _dece(
            F.softmax(logits, dim=1),
            labels.long(),
            self.n_bins,
            self.temperature,
            self.accuracy_temperature,
            self.form,
        )
        return ce + self.weight * penalty

    def extra_repr(self) -> str:
        text = (
            f"n_bins={self.n_bins}, temperature={self.temperature}, weight={self.weight}, "
            f"accuracy_temperature={self.accuracy_temperature}"
        )
        return text if self.form == "sharpened" else f"{text}, form={self.form!r}"


class SECELoss(nn.Module):
    r"""Soft (kernel) ECE as a loss: :math:`L = w \cdot \mathrm{SECE}(\operatorname{softmax}(z), y)`
    (plus CE if ``with_ce``).

    SECE is :func:`calnotes.metrics.sece`: Gaussian-kernel soft accuracy
    ``a_i = sum_j K(r_i, r_j) c_j / sum_j K(r_i, r_j)`` on the confidences and
    ``SECE = mean_i |a_i - r_i|``; it is differentiable in the logits. ``method`` is that
    of :func:`~calnotes.metrics.sece`; the default ``"exact"`` sums over all pairs of the
    batch whatever its size.
    """

    def __init__(self, bandwidth: float = 0.05, weight: float = 1.0, with_ce: bool = False,
                 method: str = "exact"):
        super().__init__()
        from calnotes.metrics import SECE_METHODS

        self.method = check_choice(method, "method", SECE_METHODS)
        self.bandwidth = check_positive_float(bandwidth, "bandwidth")
        self.weight = check_nonnegative_float(weight, "weight")
        if not isinstance(with_ce, bool):
            raise TypeError(f"with_ce must be a bool, got {type(with_ce).__name__}")
        self.with_ce = with_ce

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        from calnotes.metrics import sece

        check_batch(logits, labels)
        smooth = sece(F.softmax(logits, dim=1), labels, bandwidth=self.bandwidth,
                      method=self.method)
        loss = self.weight * cast(torch.Tensor, smooth)
        if self.with_ce:
            loss = loss + F.cross_entropy(logits, labels)
        return loss

    def extra_repr(self) -> str:
        text = f"bandwidth={self.bandwidth}, weight={self.weight}, with_ce={self.with_ce}"
        return text if self.method == "exact" else f"{text}, method={self.method!r}"


# ---------------------------------------------------------------------------------------
# LogitNorm
# ---------------------------------------------------------------------------------------


def _accurate_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per-sample ``log(1 + sum_{c != y} exp(z_c - z_y))`` without cancellation.

    ``logsumexp(z) - z_y`` rounds a confident sample's loss to exactly 0; with
    ``d_c = z_c - z_y`` and ``M = max(0, max_{c != y} d_c)`` this computes
    ``M + log1p(expm1(-M) + sum_{c != y} exp(d_c - M))``, accurate in both regimes.
    """
    z_y = logits.gather(1, labels.unsqueeze(1))
    is_true = F.one_hot(labels, logits.shape[1]).bool()
    diff = (logits - z_y).masked_fill(is_true, float("-inf"))
    top = diff.amax(dim=1).clamp_min(0.0)
    rest = torch.exp(diff - top.unsqueeze(1)).sum(dim=1)
    return top + torch.log1p(torch.expm1(-top) + rest)


class LogitNormLoss(nn.Module):
    r"""LogitNorm loss (Wei et al. 2022):
    :math:`L = \mathrm{CE}\big(z / (\tau (\lVert z \rVert_2 + \epsilon)),\, y\big)`.

    The normalised logits have norm below ``1 / tau``, so the loss cannot be pushed to 0 by
    growing the logit norm. The norm uses a guarded square root so that zero logits give
    finite gradients, and the cross-entropy is evaluated without cancellation so that tiny
    losses are not rounded to 0 (the value agrees with ``F.cross_entropy`` to rounding).
    """

    def __init__(self, tau: float = 0.04, eps: float = 1e-7) -> None:
        super().__init__()
        self.tau = check_positive_float(tau, "tau")
        self.eps = check_positive_float(eps, "eps")

    def normalize(self, logits: torch.Tensor) -> torch.Tensor:
        """``z / (tau * (||z||_2 + eps))`` row-wise, with a finite gradient at ``z = 0``."""
        sq = (logits * logits).sum(dim=1, keepdim=True)
        positive = sq > 0
        norm = torch.where(positive, torch.where(positive, sq, torch.ones_like(sq)).sqrt(), 0.0)
        return logits / (self.tau * (norm + self.eps))

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        check_batch(logits, labels)
        return _accurate_cross_entropy(self.normalize(logits), labels.long()).mean()

    @staticmethod
    def lower_bound(tau: float, num_classes: int) -> float:
        """The paper's bound ``log(1 + (k - 1) exp(-2 / tau))`` on the LogitNorm loss.

        Each normalised logit lies in ``[-1/tau, 1/tau]``, so ``z_c - z_y >= -2/tau`` and
        ``CE >= log(1 + (k - 1) e^{-2/tau})`` for ``k = num_classes``. (The norm constraint
        gives the tighter ``log(1 + (k - 1) exp(-sqrt(k / (k - 1)) / tau))``.)
        """
        tau = check_positive_float(tau, "tau")
        k = check_positive_int(num_classes, "num_classes", minimum=2)
        return math.log1p((k - 1) * math.exp(-2.0 / tau))

    def extra_repr(self) -> str:
        return f"tau={self.tau}, eps={self.eps}"


# ---------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------


class CrossEntropyLoss(nn.CrossEntropyLoss):
    """``torch.nn.CrossEntropyLoss`` with the labels checked like every loss here.

    ``L = (1 - s) (-log p_y) + s * mean_c (-log p_c)`` for ``label_smoothing = s`` in
    ``[0, 1)`` (``s = 0``: plain cross-entropy ``-log p_y``), averaged over the batch.
    """

    def __init__(self, label_smoothing: float = 0.0) -> None:
        label_smoothing = check_nonnegative_float(label_smoothing, "label_smoothing")
        if label_smoothing >= 1.0:
            raise ValueError(f"label_smoothing must lie in [0, 1), got {label_smoothing}")
        super().__init__(label_smoothing=label_smoothing)

    def forward(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        check_batch(logits, labels)
        return super().forward(logits, labels)


def _cross_entropy() -> nn.Module:
    """Plain cross-entropy ``-log p_y`` (mean over the batch)."""
    return CrossEntropyLoss()


#: Loss name -> factory; every factory's keyword arguments are the loss's hyper-parameters.
LOSSES: dict[str, Callable[..., nn.Module]] = {
    "ce": _cross_entropy,
    "focal": FocalLoss,
    "flsd53": FLSD53,
    "label_smoothing": LabelSmoothingLoss,
    "mmce": MMCELoss,
    "dece": DECELoss,
    "sece": SECELoss,
    "logitnorm": LogitNormLoss,
}


def make_loss(name: str, **options: Any) -> nn.Module:
    """Build the loss registered as ``name`` in :data:`LOSSES` with keyword ``options``.

    Raises ``ValueError`` for an unknown name (listing the valid ones) and for an option
    the loss does not take (listing the ones it does), as every unknown option in calnotes.
    """
    if not isinstance(name, str) or name not in LOSSES:
        raise ValueError(f"name must be one of {sorted(LOSSES)}, got {name!r}")
    factory = LOSSES[name]
    accepted = [
        p.name
        for p in inspect.signature(factory).parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]
    unknown = sorted(set(options) - set(accepted))
    if unknown:
        raise ValueError(
            f"loss {name!r} got unknown option(s) {unknown}; it accepts {accepted or 'none'}"
        )
    return factory(**options)
