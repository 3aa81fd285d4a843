"""Probabilities told from logits, for the report's input (:mod:`calnotes.report`).

Input that looks like probabilities (every entry in [0, 1], every row summing to 1 within
its own precision) is refused as logits; probabilities are turned into the logits
:math:`z_{ik} = \\ln p_{ik}` whose softmax they are. Importable from :mod:`calnotes.report`.
"""

from __future__ import annotations

import math

import torch

from ._checks import ArrayLike, as_tensor, check_logits, check_probs, like_input, prob_sum_atol

__all__ = ["check_not_probs", "logits_from_probs", "simplex_tolerance"]

#: Decimal steps ``10^-d`` that probabilities are commonly rounded to (d = 1..4).
_DECIMALS = (1, 2, 3, 4)


def _decimal_step(t: torch.Tensor) -> float:
    """The largest step ``q = 10^-d`` of which every entry ``x`` of ``t`` is a multiple
    ``r = q round(x / q)``, up to the relative rounding of ``t``'s dtype
    (``|x - r| <= 2 eps |r|``); 0 when none is."""
    x = t.detach().double()
    eps = 2 * float(torch.finfo(t.dtype).eps)
    for d in _DECIMALS:
        s = 10.0 ** d
        r = (x * s).round() / s
        if bool(((x - r).abs() <= eps * r.abs()).all()):
            return 1 / s
    return 0.0


def simplex_tolerance(values: torch.Tensor) -> float:
    r"""How far a row of ``values (N, C)`` may sum from 1 and still be a row of
    probabilities stored at the input's own precision: the dtype's rounding
    (``calnotes._checks.prob_sum_atol``, e.g. about 0.008 for bfloat16) plus
    :math:`C q / 2` when every entry is a multiple of a decimal step :math:`q = 10^{-d}`
    (probabilities rounded to ``d`` decimals, each off by at most :math:`q / 2`)."""
    return prob_sum_atol(values.dtype) + values.shape[1] * _decimal_step(values) / 2


def _on_simplex(z: torch.Tensor) -> bool:
    """Every entry in [0, 1] and every row summing to 1 within :func:`simplex_tolerance`."""
    z = z.detach()
    if not (bool((z >= 0).all()) and bool((z <= 1).all())):
        return False
    sums = z.double().sum(dim=1)
    return bool(((sums - 1).abs() <= simplex_tolerance(z)).all())


def check_not_probs(logits: ArrayLike, name: str = "logits") -> None:
    """Raise ``ValueError`` when ``logits`` are probabilities: every entry in [0, 1] and
    every row summing to 1 within the input's own precision (:func:`simplex_tolerance`:
    its dtype, bfloat16 included, and its rounding to 1-4 decimals). Real logits do that
    only by accident (their softmax is invariant to a shift, so nothing ties them to sum
    1)."""
    z, _ = check_logits(logits, name)
    if _on_simplex(z):
        raise ValueError(
            f"{name} look like probabilities, not logits: every row is non-negative and sums "
            f"to 1 (within {simplex_tolerance(z):.3g}, the precision of {z.dtype} values"
            f"{_rounded_text(z)}). The report would take their softmax again and misread the "
            f"model. Pass "
            f"probabilities with --probs (probs=True in Python): their log is then used as "
            f"the logits; or save the model's pre-softmax outputs as logits")


def _rounded_text(z: torch.Tensor) -> str:
    step = _decimal_step(z)
    return f" rounded to {round(-math.log10(step))} decimals" if step else ""


def logits_from_probs(probs: ArrayLike, name: str = "probs") -> ArrayLike:
    r"""Logits whose softmax is ``probs``: :math:`z_{ik} = \ln \max(\hat p_{ik},
    10^{-300})` in float64 with :math:`\hat p_{ik} = p_{ik} / \sum_c p_{ic}` (a
    probability of exactly 0 becomes :math:`-691`, finite); numpy in, numpy out.
    ``probs`` must be valid probabilities: rows non-negative, summing to 1 within their
    own precision (:func:`simplex_tolerance`: bfloat16, or rounded to a few decimals)."""
    t, from_numpy = as_tensor(probs, name)
    if (t.ndim == 2 and torch.is_floating_point(t) and t.numel() and t.shape[1] >= 2
            and _on_simplex(t)):
        t = t.double() / t.double().sum(dim=1, keepdim=True)
    p, _ = check_probs(t, name)  # its errors otherwise; a 1-d input becomes (N, 2)
    return like_input(p.double().clamp(min=1e-300).log(), from_numpy)
