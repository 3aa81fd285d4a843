"""The trainers' precision, layout and compile policy (the CPU fast path).

Each of ``amp``, ``channels_last`` and ``compile`` is ``"auto"``, ``True`` or ``False``:

* ``amp=True``: the training forward runs under bfloat16 autocast (CPU or CUDA); the
  loss, the gradients' accumulation into the float32 parameters, the optimizer state,
  every validation and the logits a run stores stay float32. ``"auto"``: on the CPU,
  bfloat16 only where ``calnotes.training.devices.bf16_capable`` (AMX or AVX-512
  BF16, and torch dispatching AVX-512 kernels) *and* the run's regime
  (``regime_key``) is in :data:`PILOT_PASSED`, the regimes whose paired pilot showed
  test error, ECE and NLL (and a meta run's gamma) equivalent to float32 within declared
  margins; float32 everywhere else, and on CUDA (where a config's ``amp`` decides).
* ``channels_last=True``: NHWC weights and activations (oneDNN's native CPU layout).
  ``"auto"``: on with bfloat16 autocast on the CPU, else the float32 policy
  ``_nhwc_pays`` (LeNet-5 yes, batch-norm networks no).
* ``compile=True``: ``torch.compile`` of the model's forward, its inductor cache kept per
  architecture (:func:`compile_cache_dir`) so later runs of that architecture skip most
  of the compiling. ``"auto"``: only for regimes in :data:`COMPILE_PAYS` (empty: the
  benchmark ``benchmarks/bench_fast_path.py`` measures whether it pays).

``False`` for all three is the float32 NCHW path as it was before the fast path existed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from calnotes.training.devices import bf16_capable

__all__ = ["COMPILE_PAYS", "PILOT_PASSED", "SETTINGS", "FastPath", "check_setting",
           "compile_cache_dir", "regime_key", "resolve_fast_path"]

#: The values each of ``amp``, ``channels_last`` and ``compile`` may take.
SETTINGS = ("auto", True, False)

#: Regimes (``regime_key``) whose equivalence pilot passed on every measure: there
#: ``amp="auto"`` trains in bfloat16 on a bf16-capable CPU. Empty until a pilot passes
#: (the pilot and its verdict: the book's appendix on the fast path).
PILOT_PASSED: frozenset[str] = frozenset()

#: Regimes where ``compile="auto"`` compiles: empty, as the benchmark found the compile time
#: larger than what a chapter's runs of one regime would save (see ``bench_fast_path``).
COMPILE_PAYS: frozenset[str] = frozenset()

_USER_CACHE = "TORCHINDUCTOR_CACHE_DIR" in os.environ


def check_setting(value: Any, name: str) -> str | bool:
    """``value`` as one of ``SETTINGS`` (``None`` means ``"auto"``); ``TypeError`` for
    anything else, naming ``name``."""
    if value is None or (isinstance(value, str) and value == "auto"):
        return "auto"
    if isinstance(value, bool):
        return value
    raise TypeError(f"{name} must be 'auto', True or False, got {value!r}")


def regime_key(run_config: Mapping[str, Any] | None) -> str | None:
    """The regime a run config trains in, ``"<dataset>/<model>[<model_options>]/<kind>"``,
    where ``kind`` is the loss (``"ce"``, ``"focal"``, ``"mixup"``...) or, for a meta run,
    ``"meta-<learner>-<outer>"``; ``None`` without a config. Batch size, epochs and learning
    rate are not part of it: the pilot's verdict covers a network, data set and training
    objective."""
    if run_config is None:
        return None
    if not isinstance(run_config, Mapping):
        raise TypeError(f"run_config must be a dict, got {type(run_config).__name__}")
    options = run_config.get("model_options") or {}
    opts = json.dumps(options, sort_keys=True, separators=(",", ":")) if options else ""
    meta = run_config.get("meta")
    if isinstance(meta, Mapping):
        kind = f"meta-{meta.get('learner', 'gamma-net')}-{meta.get('outer', 'sece')}"
    else:
        kind = str(run_config.get("loss", "ce"))
    return f"{run_config.get('dataset')}/{run_config.get('model')}{opts}/{kind}"


def _nhwc_pays(model: nn.Module) -> bool:
    """Whether NHWC is the better float32 CPU layout: the model has 2-d convolutions and no
    batch norm. torch's NHWC batch norm on the CPU sums each channel's N H W terms one after
    the other in float32, so its error grows with N H W: one layer's outputs erred 50x more
    than the NCHW kernel's at 128 x 28 x 28 and 670x at 64 x 112 x 112 (torch 2.13)."""
    modules = list(model.modules())
    return any(isinstance(m, nn.Conv2d) for m in modules) and not any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) for m in modules
    )


@dataclass(frozen=True)
class FastPath:
    """What a trainer computes with: bfloat16 autocast (``amp``), NHWC (``channels_last``)
    and ``torch.compile``, with the ``regime`` they were chosen for and the ``requested``
    settings."""

    amp: bool
    channels_last: bool
    compile: bool
    regime: str | None = None
    requested: tuple[str | bool, str | bool, str | bool] = ("auto", "auto", "auto")

    @property
    def precision(self) -> str:
        return "bfloat16-autocast" if self.amp else "float32"

    @property
    def layout(self) -> str:
        return "channels_last" if self.channels_last else "contiguous"

    def as_provenance(self) -> dict[str, Any]:
        """JSON-able record for a run's provenance."""
        amp, layout, comp = self.requested
        return {"precision": self.precision, "layout": self.layout, "compile": self.compile,
                "regime": self.regime,
                "requested": {"amp": amp, "channels_last": layout, "compile": comp}}


def resolve_fast_path(
    amp: Any, channels_last: Any, compile: Any, *, device: torch.device, model: nn.Module,
    regime: str | None = None, capable: bool | None = None,
) -> FastPath:
    """The :class:`FastPath` the settings give on ``device`` for ``model`` in ``regime``
    (rules: the module docstring). ``capable`` overrides the CPU check (tests)."""
    amp_s = check_setting(amp, "amp")
    layout_s = check_setting(channels_last, "channels_last")
    compile_s = check_setting(compile, "compile")
    on_cpu = device.type == "cpu"
    if amp_s == "auto":
        can = bf16_capable() if capable is None else capable
        use_amp = on_cpu and can and regime is not None and regime in PILOT_PASSED
    else:
        use_amp = bool(amp_s) and device.type in ("cpu", "cuda")
    if layout_s == "auto":
        use_nhwc = on_cpu and (use_amp or _nhwc_pays(model))
    else:
        use_nhwc = bool(layout_s) and device.type in ("cpu", "cuda")
    if compile_s == "auto":
        use_compile = regime is not None and regime in COMPILE_PAYS
    else:
        use_compile = bool(compile_s)
    return FastPath(use_amp, use_nhwc, use_compile, regime, (amp_s, layout_s, compile_s))


def compile_cache_dir(architecture: str, root: str | os.PathLike | None = None) -> Path:
    """Inductor's on-disk cache for one architecture: ``root/<architecture>`` (default root:
    ``$CALNOTES_COMPILE_CACHE``, else ``~/.cache/calnotes/inductor``)."""
    if not isinstance(architecture, str) or not architecture:
        raise ValueError(f"architecture must be a non-empty str, got {architecture!r}")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in architecture)
    base = root or os.environ.get("CALNOTES_COMPILE_CACHE") or (
        Path.home() / ".cache" / "calnotes" / "inductor")
    return Path(base) / safe


def compile_model(model: nn.Module, architecture: str) -> Any:
    """``torch.compile(model)`` with inductor's caches under :func:`compile_cache_dir`
    (unless ``TORCHINDUCTOR_CACHE_DIR`` was set before calnotes was imported)."""
    if not _USER_CACHE:
        path = compile_cache_dir(architecture)
        path.mkdir(parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    return torch.compile(model)


def _autocast(device: torch.device, enabled: bool):
    """bfloat16 autocast on ``device`` when ``enabled``, else nothing."""
    if not enabled:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)
