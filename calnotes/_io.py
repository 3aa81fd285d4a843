"""SHA-256 digests, atomic file writes and an exclusive file lock.

:func:`sha256_bytes` and :func:`sha256_file`: hex SHA-256 of bytes or of a file's contents.
:func:`atomic_write`: a reader sees the old file or the new one, never a partial one.
:func:`file_lock`: an exclusive ``fcntl.flock`` on a lock file (Linux/POSIX); the kernel
releases it when its holder exits, also when the holder is killed.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

#: Bytes read at a time by :func:`sha256_file`.
_CHUNK = 1 << 20


def sha256_bytes(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    """Hex SHA-256 of the file at ``path``, read in chunks (never whole in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a folder's entries (names created, renamed or removed in it) to disk."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def scratch_dir(prefix: str) -> Path:
    """A fresh folder in the system's temporary directory (``<prefix>XXXXXXXX``), removed
    with everything in it when this Python process exits (not after ``kill -9``)."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def atomic_write(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to a temporary file next to ``path``, flush it to disk, then
    ``os.replace`` it into place (atomic on POSIX within one file system) and flush the
    parent folder, so that the rename itself survives a crash."""
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
    fsync_dir(path.parent)


@contextlib.contextmanager
def file_lock(path: str | os.PathLike, *, timeout: float, what: str) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing) inside the block.

    Waits up to ``timeout`` seconds (0: a single try) and then raises ``TimeoutError``
    naming the lock file and ``what`` the holder is doing. The lock file is left in place:
    removing it would let two processes lock two different files of the same name.
    """
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout < 0:
        raise ValueError(f"timeout must be a number of seconds >= 0, got {timeout!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as err:
                if err.errno not in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                    raise
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"gave up after {timeout:g} s waiting for the lock {path}: another "
                        f"process is {what}. Wait for it to finish and try again (a lock "
                        "is released as soon as its process exits, even if it was killed)."
                    ) from None
                time.sleep(0.05)
        try:
            yield
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
