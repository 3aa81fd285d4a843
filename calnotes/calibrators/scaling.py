"""Scaling calibrators: temperature, vector, matrix and Platt scaling."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from calnotes._checks import (
    ArrayLike,
    as_tensor,
    check_choice,
    check_labels,
    check_logits,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
)
from calnotes.calibrators.base import (
    Calibrator,
    _check_scores,
    _f64,
    _field,
    _finish,
    _floats,
    _lbfgs,
    _renormalize,
    _require_two_classes,
    _StateError,
)

#: Temperature scaling keeps ``log T`` inside this range. On perfectly separable data the
#: NLL keeps falling as T -> 0, and on labels unrelated to the logits it keeps falling as
#: T -> inf; the clamp keeps the fitted temperature finite in both cases.
LOG_T_RANGE = (math.log(1e-2), math.log(1e3))

# --------------------------------------------------------------------------- scaling


class _LogitCalibrator(Calibrator):
    """Calibrators that map logits to logits: ``predict_proba = softmax(transform(z))``."""

    def transform(self, logits: ArrayLike) -> ArrayLike:
        """Calibrated logits ``(N, C)``."""
        z, from_numpy = self._check_predict_logits(logits)
        return _finish(self._logits(_f64(z)), z, from_numpy)

    def _predict(self, z: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self._logits(z), dim=1)

    def _logits(self, z: torch.Tensor) -> torch.Tensor:  # pragma: no cover
        raise NotImplementedError


class TemperatureScaling(_LogitCalibrator):
    r"""Temperature scaling (Guo et al. 2017): :math:`q = \operatorname{softmax}(z / T)` with
    one :math:`T > 0`.

    ``selection="nll"`` minimizes the validation NLL
    :math:`\frac1N\sum_i [\log\sum_j e^{z_{ij}/T} - z_{i,y_i}/T]` over ``log T`` with
    L-BFGS (strong Wolfe line search) in float64. ``selection="ece"`` instead scans a log
    grid of T (57 points, then 41 around the best) for the lowest 15-bin validation ECE;
    among ties the temperature closest to 1 wins.

    ``log T`` is clamped to ``[log 1e-2, log 1e3]`` (:data:`LOG_T_RANGE`) so that the fit
    stays finite on separable data (NLL -> 0 as T -> 0) and on labels independent of the
    logits (NLL falls as T -> inf). Dividing by ``T > 0`` never changes the argmax.
    """

    temperature_: float

    def __init__(self, selection: str = "nll", max_iter: int = 100) -> None:
        self.selection = check_choice(selection, "selection", ("nll", "ece"))
        self.max_iter = check_positive_int(max_iter, "max_iter")

    @classmethod
    def with_temperature(cls, temperature: float, n_classes: int) -> TemperatureScaling:
        """A ready-to-use calibrator with a given ``temperature`` (no fitting)."""
        cal = cls()
        cal.temperature_ = check_positive_float(temperature, "temperature")
        cal.n_classes_ = check_positive_int(n_classes, "n_classes", minimum=2)
        return cal

    def _fit(self, z: torch.Tensor, y: torch.Tensor) -> None:
        if self.selection == "nll":
            self.temperature_ = self._fit_nll(z, y)
        else:
            self.temperature_ = self._fit_ece(z, y)

    def _fit_nll(self, z: torch.Tensor, y: torch.Tensor) -> float:
        lo, hi = LOG_T_RANGE
        log_t = torch.zeros((), dtype=torch.float64, device=z.device, requires_grad=True)
        picked = z.gather(1, y[:, None])[:, 0]

        def loss() -> torch.Tensor:
            # Closed-form gradient (cheaper than autograd): with u = 1/T and p = softmax(u z),
            # dNLL/du = mean_i(E_p[z_i] - z_{i,y_i}) and du/dlog T = -u; 0 outside the clamp.
            value = log_t.detach()
            u = torch.exp(-value.clamp(lo, hi))
            s = z * u
            top = s.amax(dim=1, keepdim=True)
            e = s.sub_(top).exp_()
            total = e.sum(dim=1)
            nll = (top[:, 0] + torch.log(total) - picked * u).mean()
            dnll_du = (torch.linalg.vecdot(e, z) / total - picked).mean()
            inside = (value >= lo) & (value <= hi)
            log_t.grad = torch.where(inside, -u * dnll_du, torch.zeros_like(u))
            return nll

        _lbfgs([log_t], loss, self.max_iter, backward=False)
        return float(math.exp(min(max(float(log_t.detach()), lo), hi)))

    def _fit_ece(self, z: torch.Tensor, y: torch.Tensor) -> float:
        from calnotes.metrics import ece  # local import: metrics is only needed for this option

        def score(log_ts: np.ndarray) -> np.ndarray:
            return np.array([float(ece(torch.softmax(z / math.exp(v), dim=1), y)) for v in log_ts])

        lo, hi = LOG_T_RANGE
        coarse = np.linspace(lo, hi, 57)  # T steps of about 22%
        errs = score(coarse)
        k = int(np.argmin(errs))
        fine = np.linspace(coarse[max(k - 1, 0)], coarse[min(k + 1, 56)], 41)
        grid = np.concatenate([coarse, fine])
        errs = np.concatenate([errs, score(fine)])
        ties = np.flatnonzero(errs <= errs.min() + 1e-12)
        return float(math.exp(grid[ties[np.argmin(np.abs(grid[ties]))]]))

    def _logits(self, z: torch.Tensor) -> torch.Tensor:
        return z / self.temperature_

    def _state(self) -> dict[str, Any]:
        return {"temperature": self.temperature_}

    def _set_state(self, state: Mapping[str, Any], n_classes: int) -> None:
        t = _floats(_field(state, "temperature"), "state.temperature", ())
        if t <= 0:
            raise _StateError(f"state.temperature must be > 0, got {float(t)}")
        self.temperature_ = float(t)


class VectorScaling(_LogitCalibrator):
    r"""Vector scaling: :math:`z \mapsto w \odot z + b` with per-class ``w, b`` (C each).

    Fitted by L-BFGS on the validation NLL in float64, starting from the identity
    (``w = 1, b = 0``). Fitted ``weight_`` and ``bias_`` are float64 numpy arrays.
    Unlike temperature scaling it can change the argmax.
    """

    weight_: np.ndarray
    bias_: np.ndarray

    def __init__(self, max_iter: int = 200) -> None:
        self.max_iter = check_positive_int(max_iter, "max_iter")

    def _fit(self, z: torch.Tensor, y: torch.Tensor) -> None:
        c = z.shape[1]
        w = torch.ones(c, dtype=torch.float64, device=z.device, requires_grad=True)
        b = torch.zeros(c, dtype=torch.float64, device=z.device, requires_grad=True)
        _lbfgs([w, b], lambda: F.cross_entropy(z * w + b, y), self.max_iter)
        self.weight_ = w.detach().cpu().numpy()
        self.bias_ = b.detach().cpu().numpy()

    def _logits(self, z: torch.Tensor) -> torch.Tensor:
        w = torch.as_tensor(self.weight_, device=z.device)
        return z * w + torch.as_tensor(self.bias_, device=z.device)

    def _state(self) -> dict[str, Any]:
        return {"weight": self.weight_.tolist(), "bias": self.bias_.tolist()}

    def _set_state(self, state: Mapping[str, Any], n_classes: int) -> None:
        self.weight_ = _floats(_field(state, "weight"), "state.weight", (n_classes,))
        self.bias_ = _floats(_field(state, "bias"), "state.bias", (n_classes,))


class MatrixScaling(_LogitCalibrator):
    r"""Matrix scaling: :math:`z \mapsto W z + b` with a full ``C x C`` matrix ``W``.

    Fitted by L-BFGS in float64 from the identity on
    :math:`\mathrm{NLL} + \lambda \frac{1}{C(C-1)}\sum_{i \ne j} W_{ij}^2
    + \mu \frac1C \sum_j b_j^2`, the off-diagonal-and-intercept (ODIR) regularizer of
    Kull et al. (2019), with ``lambda = reg`` and ``mu = bias_reg`` (default: ``reg``).
    ``reg=0`` is plain matrix scaling, which overfits easily when C is large.
    """

    weight_: np.ndarray
    bias_: np.ndarray

    def __init__(self, reg: float = 0.0, bias_reg: float | None = None, max_iter: int = 200):
        self.reg = check_nonnegative_float(reg, "reg")
        # stored as given (None: the same as reg), as scikit-learn's get_params expects
        self.bias_reg = None if bias_reg is None else check_nonnegative_float(bias_reg, "bias_reg")
        self.max_iter = check_positive_int(max_iter, "max_iter")

    def _features(self, z: torch.Tensor) -> torch.Tensor:
        """What ``W`` multiplies: the logits themselves."""
        return z

    def _fit(self, z: torch.Tensor, y: torch.Tensor) -> None:
        z = self._features(z)
        c = z.shape[1]
        eye = torch.eye(c, dtype=torch.float64, device=z.device)
        w = eye.clone().requires_grad_(True)
        b = torch.zeros(c, dtype=torch.float64, device=z.device, requires_grad=True)
        off = 1.0 - eye

        def loss() -> torch.Tensor:
            value = F.cross_entropy(z @ w.T + b, y)
            if self.reg > 0:
                value = value + self.reg * ((w * off) ** 2).sum() / (c * (c - 1))
            bias_reg = self.reg if self.bias_reg is None else self.bias_reg
            if bias_reg > 0:
                value = value + bias_reg * (b**2).mean()
            return value

        _lbfgs([w, b], loss, self.max_iter)
        self.weight_ = w.detach().cpu().numpy()
        self.bias_ = b.detach().cpu().numpy()

    def _logits(self, z: torch.Tensor) -> torch.Tensor:
        w = torch.as_tensor(self.weight_, device=z.device)
        return self._features(z) @ w.T + torch.as_tensor(self.bias_, device=z.device)

    def _state(self) -> dict[str, Any]:
        return {"weight": self.weight_.tolist(), "bias": self.bias_.tolist()}

    def _set_state(self, state: Mapping[str, Any], n_classes: int) -> None:
        c = n_classes
        self.weight_ = _floats(_field(state, "weight"), "state.weight", (c, c))
        self.bias_ = _floats(_field(state, "bias"), "state.bias", (c,))


class PlattScaling(Calibrator):
    r"""Platt scaling: :math:`P(y=1 \mid s) = \sigma(a s + b)` on a binary score ``s``.

    Input is either logits ``(N, 2)`` (score ``s = z_1 - z_0``) or a 1-d score ``(N,)``
    (the logit of the positive class). ``predict_proba`` returns ``(N, 2)`` in both cases
    and ``predict_positive`` the positive column ``(N,)``. For ``C > 2`` logits it is
    one-vs-all: class k gets ``sigma(a_k z_k + b_k)`` and the row is renormalized.

    ``a, b`` minimize the cross-entropy by L-BFGS in float64 from ``a = 1, b = 0``.
    With ``prior_correction=True`` the 0/1 targets are replaced by Platt's (1999)
    smoothed targets ``(N_+ + 1) / (N_+ + 2)`` and ``1 / (N_- + 2)``, as scikit-learn's
    ``CalibratedClassifierCV(method="sigmoid")`` does; this keeps ``a`` finite on
    separable data. ``a_`` and ``b_`` are float64 arrays of length 1 (binary) or C.
    ``transform`` gives ``[0, a s + b]`` for binary logits (so its softmax is
    ``predict_proba``), ``a s + b`` for 1-d scores, and log-probabilities for ``C > 2``.
    """

    a_: np.ndarray
    b_: np.ndarray

    def __init__(self, prior_correction: bool = False, max_iter: int = 200) -> None:
        if not isinstance(prior_correction, bool):
            raise TypeError(
                f"prior_correction must be a bool, got {type(prior_correction).__name__}"
            )
        self.prior_correction = prior_correction
        self.max_iter = check_positive_int(max_iter, "max_iter")

    # -- input handling: (N,) scores or (N, C) logits
    @staticmethod
    def _scores_or_logits(x: ArrayLike, name: str) -> tuple[torch.Tensor, bool, int]:
        t, _ = as_tensor(x, name)
        if t.ndim == 1:
            s, from_numpy = _check_scores(x, name)
            return s, from_numpy, 2
        z, from_numpy = check_logits(x, name)
        return z, from_numpy, int(z.shape[1])

    @staticmethod
    def _features(x: torch.Tensor) -> torch.Tensor:
        """Per-column scores ``(N, K)``: K = 1 for binary input, K = C for one-vs-all."""
        if x.ndim == 1:
            return x[:, None]
        if x.shape[1] == 2:
            return (x[:, 1] - x[:, 0])[:, None]
        return x

    def fit(self, logits: ArrayLike, labels: ArrayLike) -> PlattScaling:
        """Fit on ``logits (N, C)`` or binary scores ``(N,)`` and integer ``labels (N,)``."""
        x, _, c = self._scores_or_logits(logits, "logits")
        y = check_labels(labels, x.shape[0], c, "labels")
        _require_two_classes(y, "labels")
        s = self._features(_f64(x))
        y = y.to(s.device)
        k = s.shape[1]
        if k == 1:
            t = (y == 1).to(torch.float64)[:, None]
        else:
            t = F.one_hot(y, k).to(torch.float64)
        if self.prior_correction:
            n_pos = t.sum(dim=0)
            n_neg = t.shape[0] - n_pos
            t = torch.where(t > 0, (n_pos + 1) / (n_pos + 2), 1 / (n_neg + 2))
        a = torch.ones(k, dtype=torch.float64, device=s.device, requires_grad=True)
        b = torch.zeros(k, dtype=torch.float64, device=s.device, requires_grad=True)

        def loss() -> torch.Tensor:
            u = s * a + b
            return F.binary_cross_entropy_with_logits(u, t, reduction="sum") / s.shape[0]

        _lbfgs([a, b], loss, self.max_iter)
        self.a_ = a.detach().cpu().numpy()
        self.b_ = b.detach().cpu().numpy()
        self.n_classes_ = c
        return self

    def _check_input(self, x: ArrayLike, name: str) -> tuple[torch.Tensor, bool]:
        self._check_fitted()
        t, from_numpy, c = self._scores_or_logits(x, name)
        if c != self.n_classes_:
            kind = "binary scores" if t.ndim == 1 else f"logits with {c} columns"
            raise ValueError(
                f"{name} are {kind} but PlattScaling was fitted with {self.n_classes_} classes"
            )
        return t, from_numpy

    def _u(self, x: torch.Tensor) -> torch.Tensor:
        s = self._features(x)
        a = torch.as_tensor(self.a_, device=s.device)
        return s * a + torch.as_tensor(self.b_, device=s.device)

    def _proba(self, x: torch.Tensor) -> torch.Tensor:
        u = self._u(x)
        if u.shape[1] == 1:
            return torch.cat([torch.sigmoid(-u), torch.sigmoid(u)], dim=1)
        q = torch.sigmoid(u).cpu().numpy()
        return torch.from_numpy(_renormalize(q)).to(u.device)

    def predict_proba(self, logits: ArrayLike) -> ArrayLike:
        """Calibrated probabilities ``(N, C)`` (``(N, 2)`` for 1-d scores)."""
        x, from_numpy = self._check_input(logits, "logits")
        return _finish(self._proba(_f64(x)), x, from_numpy)

    def predict_positive(self, scores: ArrayLike) -> ArrayLike:
        """Probability of the positive class ``(N,)`` for binary scores or ``(N, 2)`` logits."""
        x, from_numpy = self._check_input(scores, "scores")
        if self.n_classes_ != 2:
            raise ValueError("predict_positive needs a binary fit; use predict_proba")
        return _finish(torch.sigmoid(self._u(_f64(x))[:, 0]), x, from_numpy)

    def transform(self, logits: ArrayLike) -> ArrayLike:
        """Calibrated logits: ``[0, a s + b]``, ``a s + b`` for 1-d scores, log-probs for C > 2."""
        x, from_numpy = self._check_input(logits, "logits")
        x64 = _f64(x)
        u = self._u(x64)
        if x.ndim == 1:
            out = u[:, 0]
        elif u.shape[1] == 1:
            out = torch.cat([torch.zeros_like(u), u], dim=1)
        else:
            out = torch.log(self._proba(x64))
        return _finish(out, x, from_numpy)

    def _state(self) -> dict[str, Any]:
        return {"a": self.a_.tolist(), "b": self.b_.tolist()}

    def _set_state(self, state: Mapping[str, Any], n_classes: int) -> None:
        k = 1 if n_classes == 2 else n_classes
        self.a_ = _floats(_field(state, "a"), "state.a", (k,))
        self.b_ = _floats(_field(state, "b"), "state.b", (k,))


