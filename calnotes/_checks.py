"""Input validation shared by every public function.

All user errors raise ``TypeError`` (wrong kind of object or dtype) or ``ValueError``
(wrong shape, range or content), and the message names the argument. Nothing here uses
``assert``: validation must survive ``python -O``.

Vocabulary: ``logits (N, C)``, ``probs (N, C)`` or ``(N,)`` (probability of the positive
class of a binary problem), ``labels (N,)`` integers in ``[0, C)``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

#: Rows of ``probs`` must sum to 1 within this absolute tolerance (float32, float64 and
#: float16 probabilities). Loose enough for float16 logits pushed through a float32
#: softmax, tight enough to catch unnormalized scores or logits passed by mistake.
PROB_SUM_ATOL = 1e-3


def prob_sum_atol(dtype: torch.dtype) -> float:
    """How far a row of ``probs`` stored in ``dtype`` may sum from 1.

    Rounding each ``p_c`` to ``dtype`` moves the row sum by at most ``u * sum_c p_c = u``
    (``u = eps / 2``, the unit roundoff), and a softmax computed in ``dtype`` errs by about
    as much again, so ``eps`` bounds both. That is below :data:`PROB_SUM_ATOL` except for
    bfloat16 (``eps = 2^-7``, about 0.0078), whose softmax rows may miss 1 by several 1e-3.
    """
    return max(PROB_SUM_ATOL, float(torch.finfo(dtype).eps))

ArrayLike = torch.Tensor | np.ndarray


def as_tensor(x: Any, name: str) -> tuple[torch.Tensor, bool]:
    """Return ``(tensor, came_from_numpy)``; numpy arrays are wrapped without a copy."""
    if isinstance(x, torch.Tensor):
        return x, False
    if isinstance(x, np.ndarray):
        if x.dtype == object:
            raise TypeError(f"{name} must be a numeric array, got dtype object")
        return torch.from_numpy(np.ascontiguousarray(x)), True
    raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def like_input(t: torch.Tensor, numpy_out: bool) -> ArrayLike:
    """Give back a result in the kind the caller passed in (numpy in, numpy out)."""
    return t.detach().cpu().numpy() if numpy_out else t


def model_device(model: torch.nn.Module) -> torch.device:
    """Where ``model`` lives: the device of its first parameter, else of its first buffer,
    else the CPU."""
    for param in model.parameters():
        return param.device
    for buffer in model.buffers():
        return buffer.device
    return torch.device("cpu")


def check_choice(value: Any, name: str, choices: Iterable[str]) -> str:
    choices = tuple(choices)
    if not isinstance(value, str) or value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")
    return value


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_positive_float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not np.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value}")
    return value


def check_nonnegative_float(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    value = float(value)
    if not np.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")
    return value


def _check_float(t: torch.Tensor, name: str) -> torch.Tensor:
    if not torch.is_floating_point(t):
        raise TypeError(f"{name} must have a floating-point dtype, got {t.dtype}")
    if t.numel() == 0:
        raise ValueError(f"{name} is empty")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or inf")
    return t


def check_logits(logits: Any, name: str = "logits") -> tuple[torch.Tensor, bool]:
    """Validate ``(N, C)`` float logits with C >= 2; returns ``(tensor, came_from_numpy)``."""
    t, from_numpy = as_tensor(logits, name)
    if t.ndim != 2:
        raise ValueError(f"{name} must have shape (N, C), got shape {tuple(t.shape)}")
    if t.shape[1] < 2:
        raise ValueError(f"{name} must have at least 2 columns (classes), got {t.shape[1]}")
    return _check_float(t, name), from_numpy


def check_probs(probs: Any, name: str = "probs") -> tuple[torch.Tensor, bool]:
    """Validate probabilities and return them as ``(N, C)`` float, plus ``came_from_numpy``.

    A 1-d input is read as the positive-class probability of a binary problem and becomes
    the two columns ``[1 - p, p]``. Entries must lie in [0, 1] and rows must sum to 1
    within :func:`prob_sum_atol` of their dtype.
    """
    t, from_numpy = as_tensor(probs, name)
    if t.ndim not in (1, 2):
        raise ValueError(f"{name} must have shape (N, C) or (N,), got shape {tuple(t.shape)}")
    if not torch.is_floating_point(t):
        raise TypeError(f"{name} must have a floating-point dtype, got {t.dtype}")
    if t.numel() == 0:
        raise ValueError(f"{name} is empty")
    # One pass for finiteness and range: NaN fails both comparisons, inf fails one.
    lo, hi = (float(v) for v in torch.aminmax(t.detach()))
    if not (np.isfinite(lo) and np.isfinite(hi)):
        raise ValueError(f"{name} contains NaN or inf")
    if lo < 0 or hi > 1:
        raise ValueError(f"{name} must lie in [0, 1]; got values in [{lo:.4g}, {hi:.4g}]")
    if t.ndim == 1:
        return torch.stack([1 - t, t], dim=1), from_numpy
    if t.shape[1] < 2:
        raise ValueError(f"{name} must have at least 2 columns (classes), got {t.shape[1]}")
    # float32 row sums err by ~1e-6 for C = 1000, far inside the tolerance.
    sums = t.sum(dim=1, dtype=torch.float64 if t.dtype == torch.float64 else torch.float32)
    worst = float((sums.detach() - 1).abs().max())
    atol = prob_sum_atol(t.dtype)
    if worst > atol:
        raise ValueError(
            f"rows of {name} must sum to 1 (tolerance {atol:.3g} for {t.dtype}); worst row is "
            f"off by {worst:.3g}. Did you pass logits? Apply softmax first."
        )
    return t, from_numpy


def check_labels(
    labels: Any, n: int, num_classes: int, name: str = "labels"
) -> torch.Tensor:
    """Validate ``(N,)`` integer labels in ``[0, num_classes)``; returns an int64 tensor."""
    t, _ = as_tensor(labels, name)
    if t.dtype == torch.bool or torch.is_floating_point(t) or torch.is_complex(t):
        raise TypeError(f"{name} must have an integer dtype, got {t.dtype}")
    if t.ndim != 1:
        raise ValueError(f"{name} must have shape (N,), got shape {tuple(t.shape)}")
    if t.shape[0] != n:
        raise ValueError(f"{name} has length {t.shape[0]} but the predictions have {n} rows")
    if n == 0:
        raise ValueError(f"{name} is empty")
    check_label_range(t, num_classes, name)
    return t.long()


def check_label_range(labels: torch.Tensor, num_classes: int, name: str = "labels") -> None:
    """``ValueError`` naming ``name`` unless every entry of integer ``labels`` is in
    ``[0, num_classes)``. Reads the values: one device synchronisation off the CPU."""
    if labels.numel() == 0:
        return
    lo, hi = (int(v) for v in torch.aminmax(labels.detach()))
    if lo < 0 or hi >= num_classes:
        raise ValueError(f"{name} must lie in [0, {num_classes}); got values in [{lo}, {hi}]")


def check_device(device: Any, name: str = "device") -> torch.device:
    """A CPU, CUDA or MPS ``torch.device`` that exists on this machine.

    ``TypeError`` unless ``device`` is a str or ``torch.device``; ``ValueError`` naming
    ``name`` for an unknown device string (``"tpu"``) or an accelerator that is absent.
    """
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except RuntimeError as err:
            raise ValueError(
                f"{name} must be 'cpu', 'cuda', 'cuda:N' or 'mps', got {device!r}"
            ) from err
    elif not isinstance(device, torch.device):
        raise TypeError(f"{name} must be a str or torch.device, got {type(device).__name__}")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{name} {str(device)!r} was requested but CUDA is not available")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(f"{name} {str(device)!r} does not exist: "
                             f"{torch.cuda.device_count()} CUDA device(s)")
    elif device.type == "mps":
        if not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
            raise ValueError(f"{name} 'mps' was requested but MPS is not available")
    elif device.type != "cpu":
        raise ValueError(f"{name} must be a CPU, CUDA or MPS device, got {str(device)!r}")
    return device
