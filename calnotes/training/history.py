"""Per-epoch training records: :class:`History`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["History"]


def _plain(value: Any) -> Any:
    """Turn tensors and NumPy scalars into plain Python numbers (JSON-able)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"history values must be scalars, got a tensor of shape {tuple(value.shape)}"
            )
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    return value


class History:
    """Per-epoch training records, one dict per epoch.

    Standard keys: ``epoch`` (1-based), ``lr``, ``train_loss``, ``train_acc``, ``val_loss``
    (NLL), ``val_ece`` (15 bins), ``val_acc``, ``val_logit_norm`` (mean ``||z||_2``) and
    ``seconds`` (wall time); an ``epoch_callback`` may add more. ``history["val_ece"]``
    is the column as a list (``None`` where an epoch lacks the key).
    """

    #: Keys that measure wall time and so differ between otherwise identical runs.
    TIME_KEYS: tuple[str, ...] = ("seconds",)

    def __init__(self, records: Iterable[Mapping[str, Any]] | None = None) -> None:
        self.records: list[dict[str, Any]] = []
        for record in records or ():
            self.append(record)

    def append(self, record: Mapping[str, Any]) -> None:
        """Add one epoch's record (a mapping of str keys to scalars)."""
        if not isinstance(record, Mapping):
            raise TypeError(f"record must be a mapping, got {type(record).__name__}")
        clean: dict[str, Any] = {}
        for key, value in record.items():
            if not isinstance(key, str):
                raise TypeError(f"record keys must be str, got {key!r}")
            clean[key] = _plain(value)
        self.records.append(clean)

    @property
    def columns(self) -> list[str]:
        """All keys, in order of first appearance."""
        seen: dict[str, None] = {}
        for record in self.records:
            seen.update(dict.fromkeys(record))
        return list(seen)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records)

    def __getitem__(self, key: str) -> list[Any]:
        if not isinstance(key, str):
            raise TypeError(f"History columns are indexed by str, got {type(key).__name__}")
        if key not in self.columns:
            raise KeyError(f"no column {key!r} in history; columns are {self.columns}")
        return [record.get(key) for record in self.records]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, History) and self.records == other.records

    def __repr__(self) -> str:
        return f"History({len(self)} epochs, columns={self.columns})"

    def without_timing(self) -> list[dict[str, Any]]:
        """Records without the wall-time keys: equal for runs that trained identically."""
        return [{k: v for k, v in r.items() if k not in self.TIME_KEYS} for r in self.records]

    def to_frame(self):  # -> pandas.DataFrame
        """The records as a ``pandas.DataFrame`` (one row per epoch)."""
        import pandas as pd

        return pd.DataFrame.from_records(self.records, columns=self.columns or None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form; :meth:`from_dict` inverts it."""
        return {"records": [dict(r) for r in self.records]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> History:
        """The history that :meth:`to_dict` wrote."""
        if not isinstance(data, Mapping) or "records" not in data:
            raise ValueError("data must be a mapping with a 'records' list (from History.to_dict)")
        return cls(data["records"])
