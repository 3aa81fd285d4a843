r"""Synthetic binary predictions whose true calibration error is known.

A model predicts the positive class with confidence ``c ~ Beta(a, b)`` folded into
[0.5, 1], and is right with probability ``f(c)``, where ``f`` is a *calibration curve*.
The true top-label calibration error is then

.. math::
    \mathrm{TCE} = \mathbb{E}_c\, |f(c) - c| = \int |f(c) - c|\, p(c)\, dc,

computed here by adaptive quadrature, so estimators (binned ECE, ACE, SECE) can be
compared against the truth as the number of bins and the sample size vary.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy import integrate, stats

from ._checks import check_choice, check_positive_float, check_positive_int

#: Calibration curves ``f(c)``: the accuracy of predictions made with confidence ``c``.
CURVES: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "calibrated": lambda c: c,
    # Overconfident: accuracy lags confidence, like a network trained long on NLL.
    "overconfident": lambda c: 0.5 + 0.5 * ((c - 0.5) / 0.5) ** 2,
    # Underconfident: accuracy runs ahead of confidence (e.g. strong label smoothing).
    "underconfident": lambda c: 0.5 + 0.5 * np.sqrt((c - 0.5) / 0.5),
}


@dataclass(frozen=True)
class SyntheticModel:
    """Confidence density ``0.5 + 0.5 * Beta(a, b)`` and calibration curve ``curve``."""

    curve: str = "overconfident"
    a: float = 4.0
    b: float = 1.5

    def __post_init__(self) -> None:
        check_choice(self.curve, "curve", CURVES)
        check_positive_float(self.a, "a")
        check_positive_float(self.b, "b")

    def _density(self, c: float) -> float:
        return 2.0 * stats.beta.pdf(2.0 * c - 1.0, self.a, self.b)

    def true_calibration_error(self) -> float:
        """``E|f(c) - c|`` by quadrature over the confidence density."""
        f = CURVES[self.curve]
        value, _ = integrate.quad(
            lambda c: abs(float(f(np.asarray(c))) - c) * self._density(c), 0.5, 1.0, limit=200
        )
        return float(value)

    def sample(self, n: int, seed: Any = 0) -> tuple[np.ndarray, np.ndarray]:
        """Draw ``n`` predictions: ``probs (n, 2)`` (class 1 predicted) and ``labels (n,)``.

        ``labels`` is 1 where the prediction is right, so the top-label confidence is ``c``.
        ``seed`` is anything ``numpy.random.default_rng`` accepts.
        """
        n = check_positive_int(n, "n")
        rng = np.random.default_rng(seed)
        conf = 0.5 + 0.5 * rng.beta(self.a, self.b, size=n)
        correct = rng.random(n) < CURVES[self.curve](conf)
        probs = np.stack([1.0 - conf, conf], axis=1)
        return probs, correct.astype(np.int64)


Estimator = Callable[[np.ndarray, np.ndarray], Any]


def estimator_study(
    model: SyntheticModel,
    sizes: Iterable[int],
    estimators: Mapping[str, Estimator],
    repeats: int = 20,
    seed: int = 0,
) -> pd.DataFrame:
    """Estimate the calibration error of ``model`` from ``repeats`` samples of each size.

    Returns one row per (n, repeat, estimator) with the estimate, the true calibration
    error and their difference ``error = estimate - truth``. Draws are seeded by
    ``(seed, n, repeat)``, so every estimator sees the same samples.
    """
    repeats = check_positive_int(repeats, "repeats")
    if not estimators:
        raise ValueError("estimators must name at least one estimator")
    truth = model.true_calibration_error()
    rows = []
    for n in sizes:
        for r in range(repeats):
            probs, labels = model.sample(n, seed=np.random.SeedSequence([seed, n, r]))
            for name, estimate in estimators.items():
                rows.append({"n": n, "repeat": r, "estimator": name,
                             "estimate": float(estimate(probs, labels))})
    frame = pd.DataFrame(rows)
    frame["truth"] = truth
    frame["error"] = frame["estimate"] - truth
    return frame
