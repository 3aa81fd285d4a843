"""Beta calibration (Kull, Silva Filho & Flach 2017) of the positive-class probability."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from calnotes.calibrators.base import _cores, _field, _floats, _logistic_fit, _StateError
from calnotes.calibrators.binning import _BinaryCoreCalibrator

#: Scores are clipped to ``[eps, 1 - eps]`` (float64's machine epsilon, as betacal does)
#: before their logarithms are taken.
_BETA_EPS = float(np.finfo(np.float64).eps)


def _beta_features(s: np.ndarray) -> np.ndarray:
    s = np.clip(s, _BETA_EPS, 1.0 - _BETA_EPS)
    return np.stack([np.log(s), -np.log1p(-s)], axis=1)


class BetaCalibration(_BinaryCoreCalibrator):
    r"""Beta calibration, the three-parameter ("abm") model of Kull et al. (AISTATS 2017):

    .. math:: q = \sigma\big(a \ln p - b \ln(1 - p) + c\big), \qquad a, b \ge 0,

    the calibration map that is exact when the scores of each class follow a beta
    distribution. It contains the identity (:math:`a = b = 1, c = 0`) and Platt scaling on
    the log-odds (:math:`a = b`), and unlike the logistic map it can bend into an inverse
    sigmoid. Fitted by logistic regression of the targets on :math:`(\ln p, -\ln(1-p))`
    (Newton's method, float64); if a fitted :math:`a` (or :math:`b`) is negative, the map is
    refitted without that term, as betacal does, and if the remaining slope of the refit is
    negative too, without it (a constant map), so the map never decreases.

    For two classes it maps :math:`p = \operatorname{softmax}(z)_1`; for more it is applied
    one-vs-all and renormalized (see :class:`HistogramBinning`). ``fit_scores`` /
    ``predict_scores`` act on probabilities in [0, 1] directly. ``cores_`` holds
    ``(a, b, c)`` per binary problem. Probabilities are clipped to
    :math:`[\epsilon, 1 - \epsilon]` with float64's machine epsilon before the logarithms,
    as in betacal.
    """

    cores_: list[np.ndarray]

    def _fit_core(self, s: np.ndarray, t: np.ndarray) -> np.ndarray:
        x = _beta_features(s)
        keep = [0, 1]
        while True:  # drop the first negative slope and refit, until none is negative
            fit = _logistic_fit(x[:, keep], t)
            negative = [j for j, v in zip(keep, fit[:-1], strict=True) if v < 0]
            if not negative:
                break
            keep.remove(negative[0])
        w = np.zeros(3)
        w[keep], w[2] = fit[:-1], fit[-1]
        return w

    def _predict_core(self, core: np.ndarray, s: np.ndarray) -> np.ndarray:
        u = _beta_features(s) @ core[:2] + core[2]
        return np.asarray(1.0 / (1.0 + np.exp(-u)), dtype=np.float64)

    def _state(self) -> dict[str, Any]:
        return {"cores": [{"a": float(w[0]), "b": float(w[1]), "c": float(w[2])}
                          for w in self.cores_]}

    def _set_state(self, state: Mapping[str, Any], n_classes: int) -> None:
        cores = []
        for i, core in enumerate(_cores(state, n_classes)):
            where = f"cores[{i}]"
            w = np.array([float(_floats(_field(core, k, where), f"{where}.{k}", ()))
                          for k in ("a", "b", "c")])
            if w[0] < 0 or w[1] < 0:  # the fit keeps a, b >= 0: a non-decreasing map
                raise _StateError(f"{where}.a and .b must be >= 0 (beta calibration's map is "
                                  f"non-decreasing), got a={w[0]:g}, b={w[1]:g}")
            cores.append(w)
        self.cores_ = cores
