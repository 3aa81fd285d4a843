r"""Conformity scores of split conformal classification: the score :math:`s(x, y)` of every
class label, larger meaning "less like the training data".

With :math:`p = p(\cdot \mid x)`, :math:`\pi` the classes sorted by decreasing probability
(ties in class order) and :math:`r(y)` the rank of :math:`y` (1 for the top class):

* LAC (least ambiguous set-valued classifier, thresholded softmax):
  :math:`s(x, y) = 1 - p_y`.
* APS (adaptive prediction sets, Romano et al. 2020): the mass of the classes ranked
  above :math:`y` plus :math:`y`'s own, :math:`s(x, y) = \sum_{j: r(j) < r(y)} p_j + u\,p_y`
  with :math:`u \sim U(0, 1)` (randomized) or :math:`u = 1`.
* RAPS (regularized APS, Angelopoulos et al. 2021): APS plus
  :math:`\lambda\,(r(y) - k_{reg})^+`, a penalty on labels ranked below :math:`k_{reg}`.

A randomized score draws one :math:`u` per sample (shared by its classes), so that the
set :math:`\{y : s(x, y) \le \hat q\}` is one randomized set per input.
"""

from __future__ import annotations

from typing import Any

import torch

from calnotes._checks import (
    as_tensor,
    check_choice,
    check_labels,
    check_nonnegative_float,
    check_positive_int,
    check_probs,
    like_input,
)

__all__ = ["SCORES", "class_scores", "label_scores", "true_label_rank"]

#: The conformity scores :func:`class_scores` computes.
SCORES = ("lac", "aps", "raps")


def _probs_2d(probs: Any, name: str = "probs") -> tuple[torch.Tensor, bool]:
    p, numpy_out = check_probs(probs, name)
    if p.ndim != 2:
        raise ValueError(f"{name} must have shape (N, C) for conformal sets, got "
                         f"{tuple(p.shape)}")
    if p.shape[1] < 2:
        raise ValueError(f"{name} must have at least 2 classes, got {p.shape[1]}")
    return p.double(), numpy_out


def _uniforms(n: int, randomized: bool, generator: torch.Generator | None,
              device: torch.device) -> torch.Tensor:
    if not isinstance(randomized, bool):
        raise TypeError(f"randomized must be a bool, got {type(randomized).__name__}")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    if not randomized:
        return torch.ones(n, dtype=torch.float64, device=device)
    return torch.rand(n, dtype=torch.float64, generator=generator).to(device)


def class_scores(probs: Any, score: str = "aps", *, randomized: bool = False,
                 k_reg: int = 1, lam: float = 0.0,
                 generator: torch.Generator | None = None) -> Any:
    """The conformity score of every class, shape ``(N, C)`` float64.

    ``score`` is one of ``SCORES``; ``k_reg`` and ``lam`` are RAPS's penalty (ignored
    by LAC and APS); ``randomized`` draws APS/RAPS's ``u`` from ``generator``.
    """
    p, numpy_out = _probs_2d(probs)
    check_choice(score, "score", SCORES)
    n = p.shape[0]
    u = _uniforms(n, randomized, generator, p.device)
    if score == "lac":
        return like_input(1.0 - p, numpy_out)
    order = torch.argsort(-p, dim=1, stable=True)
    sorted_p = torch.gather(p, 1, order)
    above = torch.cumsum(sorted_p, dim=1) - sorted_p       # mass ranked strictly above
    s_sorted = above + u[:, None] * sorted_p
    if score == "raps":
        k_reg = check_positive_int(k_reg, "k_reg", minimum=0)
        lam = check_nonnegative_float(lam, "lam")
        ranks = torch.arange(1, p.shape[1] + 1, dtype=torch.float64, device=p.device)
        s_sorted = s_sorted + lam * (ranks - k_reg).clamp(min=0)[None, :]
    out = torch.empty_like(s_sorted).scatter_(1, order, s_sorted)
    return like_input(out, numpy_out)


def label_scores(scores: Any, labels: Any) -> Any:
    """The score of each sample's own label, ``scores[i, labels[i]]``, shape ``(N,)``."""
    s, numpy_out = _scores_2d(scores)
    y = _labels_for(labels, s)
    return like_input(s.gather(1, y[:, None]).squeeze(1), numpy_out)


def true_label_rank(probs: Any, labels: Any) -> Any:
    """The rank (1 = most probable; ties in class order) of each sample's label."""
    p, numpy_out = _probs_2d(probs)
    y = _labels_for(labels, p)
    order = torch.argsort(-p, dim=1, stable=True)
    rank = (order == y[:, None]).to(torch.int64).argmax(dim=1) + 1
    return like_input(rank, numpy_out)


def _scores_2d(scores: Any, name: str = "scores") -> tuple[torch.Tensor, bool]:
    s, numpy_out = as_tensor(scores, name)
    if not torch.is_floating_point(s):
        raise TypeError(f"{name} must be floating point, got {s.dtype}")
    if s.ndim != 2 or s.shape[0] == 0:
        raise ValueError(f"{name} must have shape (N, C) with N > 0, got {tuple(s.shape)}")
    if torch.isnan(s).any():
        raise ValueError(f"{name} contains NaN")
    return s, numpy_out


def _labels_for(labels: Any, like: torch.Tensor) -> torch.Tensor:
    return check_labels(labels, like.shape[0], like.shape[1]).to(like.device)
