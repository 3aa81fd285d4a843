"""What the benchmark scripts share: device synchronization and the report of their rows."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import torch


def sync(device: torch.device) -> None:
    """Wait for queued CUDA work, so a timer measures it (a no-op elsewhere)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def report(rows: list[dict[str, Any]], args: Any, json_path: str | None = None,
           **extra: Any) -> dict[str, Any]:
    """Print each row on one line and return ``{"rows", "config", **extra}`` (also written
    to ``json_path`` when given); ``config`` is ``args`` without its ``json`` entry."""
    for row in rows:
        print(" | ".join(f"{k}: {v}" for k, v in row.items()))
    options: Mapping[str, Any] = vars(args)
    result = {"rows": rows, **extra, "config": {k: v for k, v in options.items() if k != "json"}}
    if json_path:
        with open(json_path, "w") as fh:
            json.dump(result, fh, indent=2, default=str)
    return result
