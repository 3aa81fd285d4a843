"""Atomic file writes: a reader sees the old file or the new one, never a partial one."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary file next to ``path``, flush it to disk, then
    ``os.replace`` it into place (atomic on POSIX within one file system)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
