r"""Split conformal prediction sets for classification.

Given calibration scores :math:`s_1, \dots, s_n` of the true labels and a miscoverage
level :math:`\alpha`, the threshold is the :math:`k`-th smallest score with
:math:`k = \lceil (n + 1)(1 - \alpha) \rceil` (infinite when :math:`k > n`), and the set of
a new input is :math:`C(x) = \{y : s(x, y) \le \hat q\}`. If the calibration pairs and the
test pair are exchangeable, :math:`P(Y \in C(X)) \ge 1 - \alpha`, and, when the scores have
no ties, :math:`\le 1 - \alpha + 1/(n + 1)` (Vovk et al. 2005; Angelopoulos & Bates 2023).

Class-conditional (Mondrian) calibration computes one threshold per class from the
calibration samples of that class, :math:`C(x) = \{y : s(x, y) \le \hat q_y\}`, and
guarantees :math:`P(Y \in C(X) \mid Y = y) \ge 1 - \alpha` for every class.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from calnotes._checks import check_labels, check_positive_int, like_input
from calnotes.conformal.scores import SCORES, _probs_2d, class_scores, true_label_rank

__all__ = ["SplitConformal", "check_alpha", "conformal_quantile", "prediction_sets",
           "raps_k_reg"]


def check_alpha(alpha: Any, name: str = "alpha") -> float:
    """``alpha`` as a float in the open interval (0, 1)."""
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(alpha).__name__}")
    if not 0 < float(alpha) < 1:
        raise ValueError(f"{name} must lie in (0, 1), got {alpha}")
    return float(alpha)


def conformal_quantile(scores: Any, alpha: float) -> float:
    """The :math:`\\lceil (n + 1)(1 - \\alpha) \\rceil`-th smallest of ``scores`` (1-D),
    ``inf`` when that exceeds ``n``."""
    from calnotes._checks import as_tensor

    s, _ = as_tensor(scores, "scores")
    alpha = check_alpha(alpha)
    if not torch.is_floating_point(s) and s.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"scores must be numeric, got {s.dtype}")
    if s.ndim != 1 or s.numel() == 0:
        raise ValueError(f"scores must be a non-empty 1-D array, got shape {tuple(s.shape)}")
    if torch.is_floating_point(s) and torch.isnan(s).any():
        raise ValueError("scores contains NaN")
    n = s.numel()
    k = math.ceil((n + 1) * (1 - alpha) - 1e-12)  # guard against (n+1)(1-a) = 90.00000001
    if k > n:
        return math.inf
    return float(torch.sort(s.double()).values[k - 1])


def raps_k_reg(probs: Any, labels: Any, alpha: float) -> int:
    """RAPS's :math:`k_{reg}` chosen on tuning data (Angelopoulos et al. 2021, Section 2.3):
    the conformal quantile of the true labels' ranks, so that a set of the top
    :math:`k_{reg}` classes would cover at level :math:`1 - \\alpha`."""
    ranks = true_label_rank(probs, labels)
    ranks = torch.as_tensor(ranks)
    q = conformal_quantile(ranks.double(), alpha)
    p, _ = _probs_2d(probs)
    return int(p.shape[1]) if math.isinf(q) else int(q)


class SplitConformal:
    """Split conformal classifier: ``fit`` on calibration probabilities and labels,
    ``predict_sets`` gives boolean ``(N, C)`` sets.

    ``score``: one of ``calnotes.conformal.SCORES``; ``mondrian``: one
    threshold per class; ``randomized`` APS/RAPS draw ``u`` from a generator seeded with
    ``seed`` (calibration and prediction draw separately). ``k_reg=None`` for RAPS is
    :func:`raps_k_reg` on the calibration data.
    """

    def __init__(self, alpha: float = 0.1, score: str = "aps", *, randomized: bool = False,
                 mondrian: bool = False, k_reg: int | None = None, lam: float = 0.01,
                 seed: int = 0) -> None:
        self.alpha = check_alpha(alpha)
        if score not in SCORES:
            raise ValueError(f"score must be one of {SCORES}, got {score!r}")
        for name, flag in (("randomized", randomized), ("mondrian", mondrian)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name} must be a bool, got {type(flag).__name__}")
        self.score, self.randomized, self.mondrian = score, randomized, mondrian
        self.k_reg = None if k_reg is None else check_positive_int(k_reg, "k_reg", minimum=0)
        self.lam = lam
        self.seed = check_positive_int(seed, "seed", minimum=0)
        self._generator = torch.Generator().manual_seed(self.seed)
        self.threshold_: torch.Tensor | None = None
        self.k_reg_: int = 0

    def _scores(self, probs: Any) -> torch.Tensor:
        s = class_scores(torch.as_tensor(probs), self.score, randomized=self.randomized,
                         k_reg=self.k_reg_, lam=self.lam, generator=self._generator)
        return torch.as_tensor(s)

    def fit(self, probs: Any, labels: Any) -> SplitConformal:
        """Compute the threshold (one per class when ``mondrian``) from calibration data."""
        p, _ = _probs_2d(probs)
        y = check_labels(labels, p.shape[0], p.shape[1]).to(p.device)
        self.k_reg_ = (raps_k_reg(p, y, self.alpha) if self.k_reg is None
                       and self.score == "raps" else int(self.k_reg or 0))
        s = self._scores(p).gather(1, y[:, None]).squeeze(1)
        if not self.mondrian:
            self.threshold_ = torch.tensor(conformal_quantile(s, self.alpha),
                                           dtype=torch.float64)
            return self
        thresholds = []
        for c in range(p.shape[1]):
            mine = s[y == c]
            # a class with no calibration sample: no finite threshold is valid
            thresholds.append(conformal_quantile(mine, self.alpha) if mine.numel()
                              else math.inf)
        self.threshold_ = torch.tensor(thresholds, dtype=torch.float64)
        return self

    def predict_sets(self, probs: Any) -> Any:
        """Boolean sets ``(N, C)``: ``True`` where the class is in the input's set."""
        if self.threshold_ is None:
            raise ValueError("call fit before predict_sets")
        p, numpy_out = _probs_2d(probs)
        s = self._scores(p)
        if self.mondrian and s.shape[1] != self.threshold_.numel():
            raise ValueError(f"probs has {s.shape[1]} classes, the calibration had "
                             f"{self.threshold_.numel()}")
        sets = s <= self.threshold_.to(s.device)
        return like_input(sets, numpy_out)


def prediction_sets(cal_probs: Any, cal_labels: Any, test_probs: Any, alpha: float = 0.1,
                    score: str = "aps", **options: Any) -> Any:
    """``SplitConformal(alpha, score, **options).fit(cal_probs, cal_labels)
    .predict_sets(test_probs)`` in one call."""
    return SplitConformal(alpha, score, **options).fit(cal_probs, cal_labels).predict_sets(
        test_probs)
