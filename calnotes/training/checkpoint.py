"""Checkpoints of a :class:`~calnotes.training.Trainer`: atomic writes, RNG states, the
configuration fingerprint a resumed run must match, and :func:`load_checkpoint` (``torch.load``
with ``weights_only=True`` only)."""

from __future__ import annotations

import io
import json
import os
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from calnotes._io import atomic_write, sha256_bytes

__all__ = ["CHECKPOINT_NAME", "load_checkpoint"]

CHECKPOINT_NAME = "last.pt"
_CHECKPOINT_FORMAT = 1


def _atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` into memory, then an atomic write to ``path``."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write(path, buffer.getvalue())


def _rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, gauss = np.random.get_state()  # noqa: NPY002
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, gauss],
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state(  # noqa: NPY002
        (name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss)
    )
    random.setstate(state["python"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def _loss_name(loss_fn: Any) -> str:
    """Identify a loss for the checkpoint fingerprint (function/class name, module repr)."""
    target = getattr(loss_fn, "func", loss_fn)  # unwrap functools.partial
    kind = target if hasattr(target, "__qualname__") else type(target)
    name = f"{getattr(kind, '__module__', '?')}.{kind.__qualname__}"
    if isinstance(loss_fn, nn.Module):
        name += f" {loss_fn!r}"
    return name


def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The state saved in a calnotes checkpoint (``torch.load`` with ``weights_only=True``).

    A truncated or damaged file raises ``ValueError`` naming it, never a bare
    ``EOFError``, ``RuntimeError`` or ``UnpicklingError``.
    """
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        raise ValueError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {err}); it is truncated "
            "or damaged. Delete it to train this run from the start."
        ) from err
    if not isinstance(state, dict) or state.get("format") != _CHECKPOINT_FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{path} is not a calnotes checkpoint (format {found})")
    missing = sorted({"fingerprint", "fingerprint_sha256", "epoch", "model"} - set(state))
    if missing:
        raise ValueError(f"checkpoint {path} lacks {missing}; it is damaged. Delete it.")
    return state


def _json_copy(value: Mapping[str, Any] | None, name: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict, got {type(value).__name__}")
    try:
        return json.loads(json.dumps(value, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be JSON-able: {err}") from err


def _check_fingerprint(state: Mapping[str, Any], mine: dict[str, Any], path: Path) -> None:
    """Refuse to resume a checkpoint written with another configuration, naming the fields
    (the keys of ``run_config`` one by one)."""
    if state["fingerprint_sha256"] == _fingerprint_digest(mine):
        return
    theirs = dict(state["fingerprint"])
    mine = dict(mine)
    for fp in (theirs, mine):
        config = fp.pop("run_config", None)
        for key, value in (config or {}).items():
            fp[f"run_config.{key}"] = value
    diff = [
        f"{k}: checkpoint {theirs.get(k)!r} vs now {mine.get(k)!r}"
        for k in sorted(set(mine) | set(theirs))
        if mine.get(k) != theirs.get(k)
    ]
    raise ValueError(
        f"checkpoint {path} was written with a different configuration "
        f"({'; '.join(diff)}). Delete it or use another checkpoint_dir."
    )

def _fingerprint_digest(fingerprint: Any) -> str:
    """SHA-256 of the fingerprint's JSON (sorted keys, compact separators)."""
    return sha256_bytes(json.dumps(fingerprint, sort_keys=True, separators=(",", ":")).encode())
