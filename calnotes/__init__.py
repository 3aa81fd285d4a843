"""calnotes: measure and fix the calibration of neural networks.

Submodules load on first use, so ``import calnotes`` is cheap and
``calnotes.metrics.ece(...)`` works without importing the submodule yourself.

The package is layered; a module imports only from layers below its own:

1. toolkit: ``metrics``, ``calibrators``, ``losses``, ``ood``, ``plots``, ``synthetic``,
   ``evaluation`` (on the helpers ``_checks`` and ``_io``);
2. ``data`` (package) and ``models``;
3. ``training`` (package);
4. ``runs`` (package: experiment configs, the run store, sweeps, methods, OOD runs);
5. ``book`` (package: the chapter runner and the chapters' helpers).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_SUBMODULES = (
    "book", "calibrators", "data", "evaluation", "losses", "metrics", "models", "ood", "plots",
    "report", "runs", "synthetic", "training",
)
__all__ = ["__version__", *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'calnotes' has no attribute {name!r}")
