"""Devices, seeds and the CPU's instruction sets: :func:`select_device`,
:func:`describe_device`, :func:`seed_everything` and :func:`cpu_features` (what a run's
provenance records about the CPU that computed it)."""

from __future__ import annotations

import functools
import platform
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from calnotes._checks import check_device, check_positive_int

__all__ = ["bf16_capable", "cpu_features", "describe_device", "seed_everything",
           "select_device"]

#: The CPU flags (``/proc/cpuinfo``) of bfloat16 matrix instructions: AMX tiles and
#: AVX-512 BF16 dot products.
BF16_FLAGS = ("amx_bf16", "avx512_bf16")


def select_device(device: str | torch.device = "auto") -> torch.device:
    """Resolve ``device``: ``"auto"`` is CUDA when available, else CPU; anything else is
    checked by ``calnotes._checks.check_device`` (``ValueError`` for an unknown or
    absent device, ``TypeError`` for a value that is neither a string nor a device)."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return check_device(device)


def describe_device(device: str | torch.device) -> str:
    """Human-readable device name, e.g. ``"cpu"`` or ``"cuda:0 (NVIDIA H100 80GB HBM3)"``."""
    dev = select_device(device)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(dev)


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global RNG and torch (CPU and every CUDA device)."""
    seed = check_positive_int(seed, "seed", minimum=0)
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 (the global RNG is what legacy code uses)
    torch.manual_seed(seed)  # also seeds every CUDA device


def _cpuinfo(path: Path) -> tuple[str | None, set[str]]:
    """The model name and the flags of the first processor in a ``/proc/cpuinfo`` text."""
    model: str | None = None
    flags: set[str] = set()
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None, set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and model is None:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model, flags


@functools.lru_cache(maxsize=4)
def cpu_features(cpuinfo: str | Path = "/proc/cpuinfo") -> dict[str, Any]:
    """What the CPU offers torch: ``cpu_model`` (``/proc/cpuinfo``'s model name, else
    ``platform.processor()``), ``torch_cpu_capability`` (the kernels torch dispatches to,
    e.g. ``"AVX512"``; ``ATEN_CPU_CAPABILITY`` lowers it), and ``amx_bf16`` and
    ``avx512_bf16`` (whether the CPU flags list them; ``False`` where no cpuinfo exists)."""
    model, flags = _cpuinfo(Path(cpuinfo))
    return {
        "cpu_model": model or platform.processor() or None,
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        **{flag: flag in flags for flag in BF16_FLAGS},
    }


def bf16_capable(features: dict[str, Any] | None = None) -> bool:
    """Whether the CPU computes bfloat16 matrix products in hardware (AMX or AVX-512 BF16)
    and torch may use them: a capability lowered below AVX-512 (e.g.
    ``ATEN_CPU_CAPABILITY=default``) counts as without."""
    f = cpu_features() if features is None else features
    capability = str(f.get("torch_cpu_capability") or "").upper()
    return any(f.get(flag) for flag in BF16_FLAGS) and capability.startswith("AVX512")
