"""The calibrator base class (fit / predict_proba / transform, save and load as JSON)
and the validation and fitting helpers the calibrators share."""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import sklearn.exceptions
import torch
from sklearn.base import BaseEstimator
from sklearn.utils.metadata_routing import UNUSED

from calnotes._checks import (
    ArrayLike,
    _check_float,
    as_tensor,
    check_labels,
    check_logits,
    like_input,
)
from calnotes._io import atomic_write

_Cal = TypeVar("_Cal", bound="Calibrator")


class NotFittedError(sklearn.exceptions.NotFittedError):
    """A calibrator was used before ``fit`` (a ``ValueError``, and scikit-learn's
    ``NotFittedError``)."""


# --------------------------------------------------------------------------- helpers



def _check_scores(
    scores: Any, name: str = "scores", unit: bool = False
) -> tuple[torch.Tensor, bool]:
    """Validate a 1-d float score vector ``(N,)``; ``unit=True`` also requires [0, 1]."""
    t, from_numpy = as_tensor(scores, name)
    if t.ndim != 1:
        raise ValueError(f"{name} must have shape (N,), got shape {tuple(t.shape)}")
    _check_float(t, name)
    if unit and (bool((t < 0).any()) or bool((t > 1).any())):
        raise ValueError(
            f"{name} must lie in [0, 1] (probabilities of the positive class); "
            f"got values in [{float(t.min()):.4g}, {float(t.max()):.4g}]"
        )
    return t, from_numpy


def _check_targets(targets: Any, n: int, name: str = "targets") -> torch.Tensor:
    """Validate binary ``(N,)`` targets in {0, 1} (int, bool, or float holding 0/1)."""
    t, _ = as_tensor(targets, name)
    if t.ndim != 1:
        raise ValueError(f"{name} must have shape (N,), got shape {tuple(t.shape)}")
    if t.shape[0] != n:
        raise ValueError(f"{name} has length {t.shape[0]} but the scores have {n} entries")
    if torch.is_complex(t):
        raise TypeError(f"{name} must be integer, bool or float 0/1, got {t.dtype}")
    if t.dtype != torch.bool and not bool(((t == 0) | (t == 1)).all()):
        raise ValueError(f"{name} must contain only 0 and 1")
    return t.to(torch.int64)


def _require_two_classes(labels: torch.Tensor, name: str) -> None:
    present = torch.unique(labels)
    if present.numel() < 2:
        raise ValueError(
            f"{name} must contain at least 2 distinct classes to fit a calibrator; "
            f"got only class {int(present[0])}"
        )


def _work_device(t: torch.Tensor) -> torch.device:
    """Device for float64 work: the input's, except MPS (no float64 there) -> CPU."""
    return torch.device("cpu") if t.device.type == "mps" else t.device


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(device=_work_device(t), dtype=torch.float64)


def _out_dtype(t: torch.Tensor) -> torch.dtype:
    """float64, the precision of the work; float32 on MPS (no float64 there)."""
    return torch.float32 if t.device.type == "mps" else torch.float64


def _finish(result: torch.Tensor, like: torch.Tensor, numpy_out: bool) -> ArrayLike:
    """A float64 result on the caller's device (or as numpy), whatever the input's dtype."""
    out = result.detach().to(dtype=_out_dtype(like))
    return like_input(out if numpy_out else out.to(like.device), numpy_out)


def _lbfgs(
    params: Sequence[torch.Tensor],
    loss_fn: Callable[[], torch.Tensor],
    max_iter: int,
    backward: bool = True,
) -> None:
    """Minimize ``loss_fn`` over ``params`` with L-BFGS and a strong Wolfe line search.

    ``backward=False``: ``loss_fn`` sets the parameters' ``.grad`` itself.
    """
    opt = torch.optim.LBFGS(
        list(params),
        lr=1.0,
        max_iter=max_iter,
        max_eval=2 * max_iter,
        tolerance_grad=1e-9,
        tolerance_change=1e-12,
        history_size=20,
        line_search_fn="strong_wolfe",
    )

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = loss_fn()
        if backward:
            loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)


def _renormalize(q: np.ndarray) -> np.ndarray:
    """One-vs-all outputs ``(N, K)`` -> rows summing to 1; all-zero rows -> uniform."""
    total = q.sum(axis=1, keepdims=True)
    zero = total[:, 0] <= 0
    out = np.divide(q, total, out=np.zeros_like(q), where=total > 0)
    out[zero] = 1.0 / q.shape[1]
    return out


def _assign_bins(edges: np.ndarray, s: np.ndarray) -> np.ndarray:
    """Bin index of each score for bins ``(e_{b-1}, e_b]``; a score of 0 goes to bin 0."""
    return np.searchsorted(edges[1:-1], s, side="left")


#: Tag and version written into every saved calibrator (see :meth:`Calibrator.save`).
SAVE_FORMAT = "calnotes.calibrator"
SAVE_VERSION = 1


class _StateError(ValueError):
    """A saved calibrator's content is invalid (the caller adds where it came from)."""


def _floats(value: Any, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """A finite float64 array from saved JSON ``value``; ``shape`` entries of -1 are free."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise _StateError(f"{name} must be an array of numbers") from None
    if shape is not None and (arr.ndim != len(shape) or any(
            want not in (-1, got) for want, got in zip(shape, arr.shape, strict=True))):
        raise _StateError(f"{name} must have shape {shape}, got {arr.shape}")
    if arr.size == 0 or not np.isfinite(arr).all():
        raise _StateError(f"{name} must be non-empty and finite")
    return arr


def _field(state: Mapping[str, Any], key: str, where: str = "state") -> Any:
    if not isinstance(state, Mapping) or key not in state:
        raise _StateError(f"{where} has no field {key!r}")
    return state[key]


def _cores(state: Mapping[str, Any], n_classes: int) -> list[Any]:
    """The saved per-problem cores: 1 for a binary fit, ``n_classes`` one-vs-all."""
    cores = _field(state, "cores")
    want = 1 if n_classes == 2 else n_classes
    if not isinstance(cores, list) or len(cores) != want:
        raise _StateError(f"state.cores must be a list of {want} entries for {n_classes} classes")
    return cores


def _unit(value: Any, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
    """``_floats`` that must lie in [0, 1] (saved probabilities: bin values, thetas)."""
    arr = _floats(value, name, shape)
    if arr.min() < 0.0 or arr.max() > 1.0:
        raise _StateError(f"{name} must lie in [0, 1] (probabilities), got values in "
                          f"[{arr.min():.4g}, {arr.max():.4g}]")
    return arr


def _edges(value: Any, name: str) -> np.ndarray:
    edges = _floats(value, name, (-1,))
    if len(edges) < 2 or edges[0] != 0.0 or edges[-1] != 1.0 or (np.diff(edges) < 0).any():
        raise _StateError(f"{name} must be non-decreasing bin edges from 0 to 1")
    return edges


# --------------------------------------------------------------------------- base


#: Public calibrator classes by class name: what :meth:`Calibrator.from_dict` may rebuild.
_SAVED_CLASSES: dict[str, type[Calibrator]] = {}


class Calibrator(BaseEstimator):
    """Common base: fitted-state and class-count checks shared by every calibrator.

    Subclasses set ``n_classes_`` in ``fit`` and implement ``_fit`` / ``_predict``.
    scikit-learn conventions (``BaseEstimator``): ``get_params``, ``set_params`` (which
    validates through the constructor), ``clone``, ``classes_`` and ``predict`` after
    ``fit``, so a calibrator can be the last step of a ``Pipeline`` whose earlier steps
    output logits.
    """

    n_classes_: int
    # logits and labels are the data of fit/predict (X and y), not routed metadata
    __metadata_request__fit = {"logits": UNUSED, "labels": UNUSED}
    __metadata_request__predict_proba = {"logits": UNUSED}
    __metadata_request__predict = {"logits": UNUSED}
    __metadata_request__transform = {"logits": UNUSED}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if not cls.__name__.startswith("_"):
            _SAVED_CLASSES[cls.__name__] = cls

    def fit(self: _Cal, logits: ArrayLike, labels: ArrayLike) -> _Cal:
        """Fit on validation ``logits (N, C)`` and integer ``labels (N,)``; returns self."""
        z, _ = check_logits(logits, "logits")
        y = check_labels(labels, z.shape[0], z.shape[1], "labels")
        _require_two_classes(y, "labels")
        self._fit(_f64(z), y.to(_work_device(z)))
        self.n_classes_ = int(z.shape[1])
        return self

    def predict_proba(self, logits: ArrayLike) -> ArrayLike:
        """Calibrated probabilities ``(N, C)`` for ``logits (N, C)``."""
        z, from_numpy = self._check_predict_logits(logits)
        return _finish(self._predict(_f64(z)), z, from_numpy)

    def transform(self, logits: ArrayLike) -> ArrayLike:
        """Calibrated logits ``(N, C)``; only for methods that define them."""
        raise NotImplementedError(
            f"{type(self).__name__} has no calibrated logits; use predict_proba"
        )

    def predict(self, logits: ArrayLike) -> ArrayLike:
        """The class of highest calibrated probability, ``(N,)`` int64 (ties: the first)."""
        probs = self.predict_proba(logits)
        if isinstance(probs, torch.Tensor):
            return probs.argmax(dim=1)
        return np.asarray(probs).argmax(axis=1)

    @property
    def classes_(self) -> np.ndarray:
        """The classes ``0 .. C-1`` of the fitted logits' columns."""
        self._check_fitted()
        return np.arange(self.n_classes_)

    # -- scikit-learn conventions
    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "n_classes_")

    def __sklearn_clone__(self: _Cal) -> _Cal:
        """An unfitted copy with the same parameters (the constructor validates, and may
        normalise, them: a list of bins becomes a tuple)."""
        return type(self)(**copy.deepcopy(self.get_params(deep=False)))

    def set_params(self: _Cal, **params: Any) -> _Cal:
        """Set constructor parameters; they are validated as the constructor does, and an
        unknown name or a bad value raises before anything changes."""
        current = self.get_params(deep=False)
        unknown = sorted(set(params) - set(current))
        if unknown:
            raise ValueError(f"unknown parameter(s) {unknown} for {type(self).__name__}; "
                             f"valid: {sorted(current)}")
        fresh = type(self)(**{**current, **params})
        for name in current:
            setattr(self, name, getattr(fresh, name))
        return self

    # -- helpers for subclasses
    def _check_fitted(self) -> None:
        if not hasattr(self, "n_classes_"):
            raise NotFittedError(
                f"{type(self).__name__} is not fitted yet; call fit(logits, labels) first"
            )

    def _check_predict_logits(self, logits: ArrayLike) -> tuple[torch.Tensor, bool]:
        self._check_fitted()
        z, from_numpy = check_logits(logits, "logits")
        if z.shape[1] != self.n_classes_:
            raise ValueError(
                f"logits has {z.shape[1]} columns but {type(self).__name__} was fitted "
                f"with {self.n_classes_} classes"
            )
        return z, from_numpy

    def _fit(self, z: torch.Tensor, y: torch.Tensor) -> None:  # pragma: no cover
        raise NotImplementedError

    def _predict(self, z: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        params = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.endswith("_"))
        return f"{type(self).__name__}({params})"

    # -- saving and loading (JSON: no pickle, nothing executed on load)
    def to_dict(self) -> dict[str, Any]:
        """The fitted calibrator as JSON-ready data: class, constructor arguments, state."""
        self._check_fitted()
        params = {k: list(v) if isinstance(v, tuple) else v
                  for k, v in vars(self).items() if not k.endswith("_")}
        return {"format": SAVE_FORMAT, "version": SAVE_VERSION, "class": type(self).__name__,
                "params": params, "state": {"n_classes": self.n_classes_, **self._state()}}

    def save(self, path: str | os.PathLike) -> Path:
        """Write the fitted calibrator to ``path`` as JSON (atomically); returns the path.

        Floats are written with Python's shortest round-trip repr, so :meth:`load` gives
        back exactly the fitted numbers.
        """
        path = Path(path)
        atomic_write(path, (json.dumps(self.to_dict(), indent=1) + "\n").encode("utf-8"))
        return path

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], source: str = "data") -> Calibrator:
        """Rebuild a calibrator from :meth:`to_dict` output; ``source`` names it in errors.

        Called on a subclass (``TemperatureScaling.from_dict``), the data must describe
        that class.
        """
        try:
            if not isinstance(data, Mapping) or data.get("format") != SAVE_FORMAT:
                raise _StateError(f"this is not a saved calibrator (no format {SAVE_FORMAT!r})")
            if data.get("version") != SAVE_VERSION:
                raise _StateError(f"unsupported version {data.get('version')!r}; this "
                                  f"calnotes reads version {SAVE_VERSION}")
            name = data.get("class")
            by_name = _SAVED_CLASSES
            if name not in by_name:
                raise _StateError(f"unknown calibrator class {name!r}; known: {sorted(by_name)}")
            klass = by_name[name]
            if not issubclass(klass, cls):
                raise _StateError(f"it holds a {name}, not a {cls.__name__}")
            params = _field(data, "params", "the file")
            if not isinstance(params, Mapping):
                raise _StateError("params must be a mapping")
            try:
                cal = klass(**params)
            except (TypeError, ValueError) as err:
                raise _StateError(f"bad params for {name}: {err}") from None
            state = _field(data, "state", "the file")
            n_classes = _field(state, "n_classes")
            if isinstance(n_classes, bool) or not isinstance(n_classes, int) or n_classes < 2:
                raise _StateError(f"state.n_classes must be an int >= 2, got {n_classes!r}")
            cal._set_state(state, n_classes)
            cal.n_classes_ = n_classes
        except _StateError as err:
            raise ValueError(f"{source}: {err}") from None
        return cal

    @classmethod
    def load(cls, path: str | os.PathLike) -> Calibrator:
        """Read a calibrator written by :meth:`save`; errors name the path."""
        path = Path(path)
        if not path.is_file():
            raise ValueError(f"{path}: no such file")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ValueError(f"{path}: not a JSON file ({err})") from None
        except RecursionError:  # a saved calibrator nests about 4 levels
            raise ValueError(f"{path}: JSON nested too deeply to be a saved calibrator") from None
        return cls.from_dict(data, source=str(path))

    def _state(self) -> dict[str, Any]:  # pragma: no cover
        raise NotImplementedError

    def _set_state(self, state: Mapping[str, Any], n_classes: int) -> None:  # pragma: no cover
        raise NotImplementedError




def _logistic_fit(x: np.ndarray, t: np.ndarray, max_iter: int = 100) -> np.ndarray:
    r"""Unpenalized logistic regression by Newton's method (float64): the weights ``w``
    ``(d + 1,)`` minimizing :math:`\frac1N\sum_i \log(1 + e^{-s_i u_i})`,
    :math:`u_i = w_{:d} \cdot x_i + w_d`, :math:`s_i = 2t_i - 1`, with step halving. A ridge
    of :math:`10^{-10} \lVert w\rVert^2` keeps the steps finite on separable data (where the
    unpenalized weights are infinite); it moves fitted probabilities by far less than
    :math:`10^{-6}` otherwise."""
    ridge = 1e-10
    xa = np.hstack([x, np.ones((x.shape[0], 1))])
    w = np.zeros(xa.shape[1])

    def loss(v: np.ndarray) -> float:
        u = xa @ v
        return float(np.mean(np.logaddexp(0.0, u) - t * u) + ridge * v @ v)

    current = loss(w)
    for _ in range(max_iter):
        q = 1.0 / (1.0 + np.exp(-(xa @ w)))
        grad = xa.T @ (q - t) / len(t) + 2 * ridge * w
        if np.abs(grad).max() < 1e-12:
            break
        hess = (xa.T * (q * (1 - q))) @ xa / len(t) + 2 * ridge * np.eye(len(w))
        step = np.linalg.solve(hess, grad)
        scale = 1.0
        while scale > 1e-10:
            trial = loss(w - scale * step)
            if trial <= current:
                break
            scale *= 0.5
        else:
            break
        w, previous, current = w - scale * step, current, trial
        if previous - current < 1e-16:
            break
    return w
