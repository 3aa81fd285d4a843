"""Binning calibrators on the positive-class probability: histogram binning and isotonic
regression (one-vs-all for more than two classes)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
import torch

from calnotes._checks import (
    ArrayLike,
    check_choice,
    check_positive_int,
)
from calnotes.calibrators.base import (
    Calibrator,
    _assign_bins,
    _check_scores,
    _check_targets,
    _cores,
    _edges,
    _field,
    _finish,
    _floats,
    _logistic_fit,
    _renormalize,
    _require_two_classes,
    _StateError,
    _unit,
)

# --------------------------------------------------------------------------- binning


class _BinaryCoreCalibrator(Calibrator):
    """Calibrators built on a binary map ``p -> q`` of the positive-class probability.

    ``C == 2``: one map on ``softmax(z)_1``. ``C > 2``: one-vs-all, K maps on
    ``softmax(z)_k`` vs ``1[y = k]``, renormalized (all-zero rows become uniform).
    ``fit_scores`` / ``predict_scores`` expose the binary core on scores in [0, 1].
    """

    cores_: list[Any]

    def _fit_core(self, s: np.ndarray, t: np.ndarray) -> Any:  # pragma: no cover
        raise NotImplementedError

    def _predict_core(self, core: Any, s: np.ndarray) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def _fit(self, z: torch.Tensor, y: torch.Tensor) -> None:
        p = torch.softmax(z, dim=1).cpu().numpy()
        y_np = y.cpu().numpy()
        if p.shape[1] == 2:
            self.cores_ = [self._fit_core(p[:, 1], (y_np == 1).astype(np.float64))]
        else:
            self.cores_ = [
                self._fit_core(p[:, k], (y_np == k).astype(np.float64)) for k in range(p.shape[1])
            ]

    def _predict(self, z: torch.Tensor) -> torch.Tensor:
        p = torch.softmax(z, dim=1).cpu().numpy()
        if p.shape[1] == 2:
            q1 = np.clip(self._predict_core(self.cores_[0], p[:, 1]), 0.0, 1.0)
            out = np.stack([1.0 - q1, q1], axis=1)
        else:
            q = np.stack(
                [self._predict_core(core, p[:, k]) for k, core in enumerate(self.cores_)], axis=1
            )
            out = _renormalize(np.clip(q, 0.0, 1.0))
        return torch.from_numpy(out).to(z.device)

    def fit_scores(self: _Bin, scores: ArrayLike, targets: ArrayLike) -> _Bin:
        """Fit the binary core on ``scores (N,)`` in [0, 1] and ``targets (N,)`` in {0, 1}."""
        s, _ = _check_scores(scores, "scores", unit=True)
        t = _check_targets(targets, s.shape[0], "targets")
        _require_two_classes(t, "targets")
        self.cores_ = [
            self._fit_core(
                s.detach().cpu().to(torch.float64).numpy(), t.cpu().numpy().astype(np.float64)
            )
        ]
        self.n_classes_ = 2
        return self

    def predict_scores(self, scores: ArrayLike) -> ArrayLike:
        """Calibrated positive-class probability ``(N,)`` for ``scores (N,)`` in [0, 1]."""
        self._check_fitted()
        if self.n_classes_ != 2:
            raise ValueError(
                f"predict_scores needs a binary fit; this {type(self).__name__} was fitted "
                f"one-vs-all on {self.n_classes_} classes"
            )
        s, from_numpy = _check_scores(scores, "scores", unit=True)
        q = np.clip(self._predict_core(self.cores_[0], s.detach().cpu().double().numpy()), 0, 1)
        return _finish(torch.from_numpy(q), s, from_numpy)


_Bin = TypeVar("_Bin", bound=_BinaryCoreCalibrator)


class HistogramBinning(_BinaryCoreCalibrator):
    r"""Histogram binning (Zadrozny & Elkan 2001): :math:`q = \theta_m`, the fraction of
    positives among the validation scores in the bin :math:`B_m` of :math:`p`.

    ``binning="uniform"``: ``n_bins`` equal-width bins ``(b_{m-1}, b_m]`` on [0, 1] (a
    score of exactly 0 goes to the first bin, 1.0 to the last). ``"quantile"``: inner
    edges at the validation scores' quantiles (equal-mass bins), outer edges 0 and 1.
    A bin that received no validation scores predicts its midpoint.
    ``cores_`` holds ``(edges, values)`` per binary problem.
    """

    def __init__(self, n_bins: int = 15, binning: str = "uniform") -> None:
        self.n_bins = check_positive_int(n_bins, "n_bins")
        self.binning = check_choice(binning, "binning", ("uniform", "quantile"))

    def _fit_core(self, s: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.binning == "uniform":
            edges = np.linspace(0.0, 1.0, self.n_bins + 1)
        else:
            edges = np.quantile(s, np.linspace(0.0, 1.0, self.n_bins + 1))
            edges[0], edges[-1] = 0.0, 1.0
            edges = np.maximum.accumulate(edges)
        idx = _assign_bins(edges, s)
        counts = np.bincount(idx, minlength=self.n_bins).astype(np.float64)
        positives = np.bincount(idx, weights=t, minlength=self.n_bins)
        mids = 0.5 * (edges[:-1] + edges[1:])
        values = np.divide(positives, counts, out=mids.copy(), where=counts > 0)
        return edges, values

    def _predict_core(self, core: tuple[np.ndarray, np.ndarray], s: np.ndarray) -> np.ndarray:
        edges, values = core
        return values[_assign_bins(edges, s)]

    def _state(self) -> dict[str, Any]:
        return {"cores": [{"edges": e.tolist(), "values": v.tolist()} for e, v in self.cores_]}

    def _set_state(self, state: Mapping[str, Any], n_classes: int) -> None:
        cores = []
        for i, core in enumerate(_cores(state, n_classes)):
            edges = _edges(_field(core, "edges", f"cores[{i}]"), f"cores[{i}].edges")
            values = _unit(_field(core, "values", f"cores[{i}]"), f"cores[{i}].values",
                           (len(edges) - 1,))
            cores.append((edges, values))
        self.cores_ = cores


class IsotonicCalibration(_BinaryCoreCalibrator):
    """Isotonic regression (Zadrozny & Elkan 2002): the best non-decreasing step map p -> q.

    Uses ``sklearn.isotonic.IsotonicRegression(out_of_bounds="clip", y_min=0, y_max=1)``
    (pool-adjacent-violators, linear interpolation between fitted points, constant outside).
    ``cores_`` holds the fitted sklearn objects.
    """

    def _fit_core(self, s: np.ndarray, t: np.ndarray) -> Any:
        from sklearn.isotonic import IsotonicRegression

        return IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0).fit(s, t)

    def _predict_core(self, core: Any, s: np.ndarray) -> np.ndarray:
        return np.asarray(core.predict(s), dtype=np.float64)

    def _state(self) -> dict[str, Any]:
        return {"cores": [{"x": c.X_thresholds_.tolist(), "y": c.y_thresholds_.tolist(),
                           "x_min": float(c.X_min_), "x_max": float(c.X_max_),
                           "increasing": bool(c.increasing_)} for c in self.cores_]}

    def _set_state(self, state: Mapping[str, Any], n_classes: int) -> None:
        from sklearn.isotonic import IsotonicRegression

        cores = []
        for i, core in enumerate(_cores(state, n_classes)):
            where = f"cores[{i}]"
            x = _floats(_field(core, "x", where), f"{where}.x", (-1,))
            y = _unit(_field(core, "y", where), f"{where}.y", (len(x),))
            if (np.diff(x) < 0).any():
                raise _StateError(f"{where}.x must be sorted")
            increasing = _field(core, "increasing", where)
            if not isinstance(increasing, bool):
                raise _StateError(f"{where}.increasing must be true or false")
            if ((np.diff(y) < 0) if increasing else (np.diff(y) > 0)).any():
                raise _StateError(f"{where}.y must be monotone (isotonic regression is): "
                                  f"{'non-decreasing' if increasing else 'non-increasing'}")
            reg = IsotonicRegression(out_of_bounds="clip", y_min=0.0, y_max=1.0)
            # The pickle protocol of sklearn's estimator: it rebuilds the interpolation
            # from the thresholds, so predictions are those of the fitted object.
            reg.__setstate__({**reg.__getstate__(), "X_thresholds_": x, "y_thresholds_": y,
                              "X_min_": float(_floats(_field(core, "x_min", where), "x_min", ())),
                              "X_max_": float(_floats(_field(core, "x_max", where), "x_max", ())),
                              "increasing_": increasing})
            cores.append(reg)
        self.cores_ = cores




def _mass_edges(v: np.ndarray, n_bins: int) -> np.ndarray:
    """Kumar et al.'s equal-mass bin edges: the sorted values cut into ``min(n_bins, N)``
    consecutive groups whose sizes differ by at most one, inner edges halfway between two
    groups, a last edge 1 (duplicates dropped). Bins are ``(e_{b-1}, e_b]``."""
    v = np.sort(v)
    m = min(n_bins, len(v))
    sizes = np.full(m, len(v) // m)
    sizes[: len(v) % m] += 1
    ends = np.cumsum(sizes)[:-1]
    return np.unique(np.append(0.5 * (v[ends - 1] + v[ends]), 1.0))


#: Probabilities are clipped to ``[eps, 1 - eps]`` before their log-odds are taken.
_SB_EPS = 1e-12


def _log_odds(s: np.ndarray) -> np.ndarray:
    s = np.clip(s, _SB_EPS, 1.0 - _SB_EPS)
    return np.log(s) - np.log1p(-s)


class ScalingBinning(_BinaryCoreCalibrator):
    r"""Scaling-binning calibrator of Kumar, Liang & Ma (NeurIPS 2019).

    Three steps on the positive-class probability :math:`p`: (1) fit Platt scaling on its
    log-odds, :math:`g(p) = \sigma(a \log\frac{p}{1-p} + c)`; (2) cut the fitted values
    :math:`g(p_i)` into ``n_bins`` equal-mass bins (sorted values in consecutive groups,
    edges halfway between groups, bins :math:`(e_{b-1}, e_b]`); (3) output, in each bin,
    the *mean of* :math:`g` over the samples that fell in it,
    :math:`q = \frac{1}{|B_b|}\sum_{i \in B_b} g(p_i)`. The output takes at most ``n_bins``
    values, so its calibration error can be measured without the bias of binning a
    continuous output, while averaging :math:`g` (rather than labels) keeps the variance of
    a scaling method. An empty bin (possible only with ties) outputs its midpoint.

    ``split=False`` (default) fits all three steps on the same data, as the reference code
    ``uncertainty-calibration`` does; ``split=True`` fits step 1 on a random half and steps
    2 and 3 on the other (``seed`` draws it), as in the paper's analysis. More than two
    classes are calibrated one-vs-all and renormalized (see :class:`HistogramBinning`);
    the reference's marginal calibrator leaves its rows unnormalized. ``cores_`` holds
    ``(platt (2,), edges, values)`` per binary problem.
    """

    cores_: list[tuple[np.ndarray, np.ndarray, np.ndarray]]

    def __init__(self, n_bins: int = 15, split: bool = False, seed: int = 0) -> None:
        self.n_bins = check_positive_int(n_bins, "n_bins")
        if not isinstance(split, bool):
            raise TypeError(f"split must be a bool, got {type(split).__name__}")
        self.split = split
        self.seed = check_positive_int(seed, "seed", minimum=0)

    def _fit_core(self, s: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, ...]:
        first = second = np.arange(len(s))
        if self.split:
            order = np.random.default_rng(self.seed).permutation(len(s))
            first, second = order[: len(s) // 2], order[len(s) // 2 :]
            if len(first) < 2 or len(np.unique(t[first])) < 2:
                raise ValueError("split=True needs both classes in the first half of the data "
                                 f"({len(s)} samples); use split=False or more data")
        platt = _logistic_fit(_log_odds(s[first])[:, None], t[first])
        g = self._scale(platt, s[second])
        edges = _mass_edges(g, self.n_bins)
        idx = np.minimum(np.searchsorted(edges, g, side="left"), len(edges) - 1)
        counts = np.bincount(idx, minlength=len(edges)).astype(np.float64)
        sums = np.bincount(idx, weights=g, minlength=len(edges))
        lower = np.concatenate([[0.0], edges[:-1]])
        values = np.divide(sums, counts, out=0.5 * (lower + edges), where=counts > 0)
        return platt, edges, values

    @staticmethod
    def _scale(platt: np.ndarray, s: np.ndarray) -> np.ndarray:
        return np.asarray(1.0 / (1.0 + np.exp(-(platt[0] * _log_odds(s) + platt[1]))))

    def _predict_core(self, core: tuple[np.ndarray, ...], s: np.ndarray) -> np.ndarray:
        platt, edges, values = core
        g = self._scale(platt, s)
        return values[np.minimum(np.searchsorted(edges, g, side="left"), len(edges) - 1)]

    def _state(self) -> dict[str, Any]:
        return {"cores": [{"platt": p.tolist(), "edges": e.tolist(), "values": v.tolist()}
                          for p, e, v in self.cores_]}

    def _set_state(self, state: Mapping[str, Any], n_classes: int) -> None:
        cores = []
        for i, core in enumerate(_cores(state, n_classes)):
            where = f"cores[{i}]"
            platt = _floats(_field(core, "platt", where), f"{where}.platt", (2,))
            edges = _floats(_field(core, "edges", where), f"{where}.edges", (-1,))
            if (np.diff(edges) <= 0).any() or edges[-1] != 1.0:
                raise _StateError(f"{where}.edges must increase and end at 1")
            values = _unit(_field(core, "values", where), f"{where}.values", (len(edges),))
            cores.append((platt, edges, values))
        self.cores_ = cores
