"""calnotes: measure and fix the calibration of neural networks.

Submodules load on first use, so ``import calnotes`` is cheap and
``calnotes.metrics.ece(...)`` works without importing the submodule yourself.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_SUBMODULES = (
    "calibrators", "chapters", "data", "evaluation", "experiments", "losses", "meta",
    "methods", "metrics", "models", "notebook", "ood", "plots", "report", "store", "sweeps",
    "synthetic", "training",
)
__all__ = ["__version__", *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module 'calnotes' has no attribute {name!r}")
