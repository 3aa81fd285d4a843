"""Readers of the files on disk: IDX (MNIST, Fashion-MNIST), CIFAR pickles, SVHN .mat.

Each ``_load_<name>(root, download)`` returns the full ``(train, test)`` splits as
:class:`~calnotes.data.containers.ImageData`; the files come, SHA-256 verified, from
:mod:`calnotes.data.sources`. The CIFAR batches are python pickles: they are read straight
from the verified archive in memory, and parsed by an unpickler that builds only numpy arrays
and plain containers, so even a crafted batch cannot run code.
"""

from __future__ import annotations

import io
import math
import os
import pickle
import tarfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import torch

try:
    from numpy._core.multiarray import _reconstruct
except ImportError:  # numpy < 1.26 has no numpy._core
    from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]

from calnotes._checks import as_tensor
from calnotes._io import atomic_write as _atomic_write
from calnotes.data.containers import ImageData
from calnotes.data.sources import (
    _CIFAR_DIRS,
    _dataset_dir,
    _ensure_files,
    _ensure_idx,
    _maybe_gunzip,
)

__all__ = ["encode_idx", "parse_idx", "read_idx", "write_idx"]


# --------------------------------------------------------------------------------------
# IDX format
# --------------------------------------------------------------------------------------
# Magic: two zero bytes, a type code, the number of dimensions; then one big-endian uint32
# per dimension; then the values in C order, big-endian.
_IDX_CODES: dict[int, np.dtype[Any]] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_IDX_KINDS = {(dt.kind, dt.itemsize): code for code, dt in _IDX_CODES.items()}


def parse_idx(buf: bytes, name: str = "data") -> np.ndarray:
    """Decode IDX bytes (already decompressed) into a native-endian numpy array."""
    if not isinstance(buf, (bytes, bytearray, memoryview)):
        raise TypeError(f"{name} must be bytes, got {type(buf).__name__}")
    buf = bytes(buf)
    if len(buf) < 4 or buf[0] != 0 or buf[1] != 0:
        raise ValueError(f"{name} is not an IDX file (bad magic number {buf[:4]!r})")
    code, ndim = buf[2], buf[3]
    if code not in _IDX_CODES:
        raise ValueError(f"{name} has unknown IDX type code 0x{code:02x}")
    header = 4 + 4 * ndim
    if len(buf) < header:
        raise ValueError(f"{name} is truncated: header needs {header} bytes, got {len(buf)}")
    dims = tuple(int(d) for d in np.frombuffer(buf, dtype=">u4", count=ndim, offset=4))
    dtype = _IDX_CODES[code]
    expected = header + math.prod(dims) * dtype.itemsize
    if len(buf) != expected:
        raise ValueError(
            f"{name} has {len(buf)} bytes but its header (shape {dims}, {dtype}) implies "
            f"{expected}"
        )
    arr = np.frombuffer(buf, dtype=dtype, offset=header).reshape(dims)
    return arr.astype(dtype.newbyteorder("="), copy=True)


def read_idx(path: str | os.PathLike[str]) -> np.ndarray:
    """Read an IDX file (gzip-compressed or not) into a numpy array."""
    path = Path(path)
    return parse_idx(_maybe_gunzip(path.read_bytes()), name=str(path))


def encode_idx(array: np.ndarray | torch.Tensor) -> bytes:
    """Encode an array as IDX bytes (uint8, int8, int16, int32, float32 or float64)."""
    t, _ = as_tensor(array, "array")
    if getattr(array, "ndim", 1) == 0:
        raise ValueError("array must have 1 to 255 dimensions, got 0")
    arr = t.detach().cpu().numpy()
    code = _IDX_KINDS.get((arr.dtype.kind, arr.dtype.itemsize))
    if code is None or arr.dtype.kind not in "uif" or (arr.dtype.kind == "u" and code != 0x08):
        raise TypeError(
            f"array dtype {arr.dtype} has no IDX type; use uint8, int8, int16, int32, "
            "float32 or float64"
        )
    if not 1 <= arr.ndim <= 255:
        raise ValueError(f"array must have 1 to 255 dimensions, got {arr.ndim}")
    if any(d >= 2**32 for d in arr.shape):
        raise ValueError(f"array has a dimension too large for IDX: shape {arr.shape}")
    header = bytes([0, 0, code, arr.ndim]) + np.asarray(arr.shape, dtype=">u4").tobytes()
    return header + np.ascontiguousarray(arr, dtype=_IDX_CODES[code]).tobytes()


def write_idx(path: str | os.PathLike[str], array: np.ndarray | torch.Tensor) -> None:
    """Write ``array`` as an uncompressed IDX file, atomically (temp file + rename)."""
    _atomic_write(Path(path), encode_idx(array))


def _idx_data(images: bytes, labels: bytes, name: str) -> ImageData:
    x = parse_idx(images, f"{name} images")
    y = parse_idx(labels, f"{name} labels")
    if x.ndim != 3 or x.dtype != np.uint8:
        raise ValueError(f"{name} images must be uint8 (N, H, W), got {x.dtype} {x.shape}")
    if y.ndim != 1 or y.shape[0] != x.shape[0]:
        raise ValueError(f"{name} labels must have shape ({x.shape[0]},), got {y.shape}")
    return ImageData(torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y.astype(np.int64)))


def _load_idx_dataset(name: str, root: Path, download: bool) -> tuple[ImageData, ImageData]:
    files = _ensure_idx(name, root, download)
    train = _idx_data(files["train-images-idx3-ubyte"], files["train-labels-idx1-ubyte"], name)
    test = _idx_data(files["t10k-images-idx3-ubyte"], files["t10k-labels-idx1-ubyte"], name)
    return train, test


# --------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 (python pickles) and SVHN (MATLAB files)
# --------------------------------------------------------------------------------------
# What a CIFAR batch may name: numpy's array reconstruction, under its numpy 1 (``core``) and
# numpy 2 (``_core``) module names. Mapped to the objects themselves: nothing is imported by
# the names a file gives.
_PICKLE_GLOBALS: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class _ArrayUnpickler(pickle.Unpickler):
    """An unpickler whose only globals are numpy's array reconstruction: everything else
    (``os.system``, ``builtins.eval``, any class) is refused, so loading runs no code."""

    def __init__(self, buf: bytes, where: str) -> None:
        super().__init__(io.BytesIO(buf), encoding="bytes")
        self.where = where

    def find_class(self, module: str, name: str) -> Any:
        obj = _PICKLE_GLOBALS.get((module, name))
        if obj is None:
            raise pickle.UnpicklingError(
                f"{self.where}: refusing to load the global {module}.{name}; a CIFAR batch "
                "holds only numpy arrays, lists and strings (the file is corrupt or crafted)"
            )
        return obj


def _unpickle(buf: bytes, where: str) -> dict[str, Any]:
    """Parse a CIFAR python batch (a pickled dict with bytes keys) held in ``buf``; ``where``
    names its origin in errors. Only numpy arrays and plain containers are built."""
    try:
        obj = _ArrayUnpickler(buf, where).load()
    except Exception as exc:  # any failure to parse means: not a CIFAR batch
        msg = str(exc)
        if not msg.startswith(where):
            msg = f"{where} is not a readable CIFAR batch: {type(exc).__name__}: {msg}"
        raise ValueError(msg) from exc
    if not isinstance(obj, dict):
        raise ValueError(f"{where} does not hold a CIFAR batch dict")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


_Batch = tuple[str, dict[str, Any]]  # (where it came from, for errors; the parsed dict)


def _cifar_archive(name: str, root: Path, download: bool, members: tuple[str, ...]
                   ) -> dict[str, _Batch]:
    """The batches ``members`` (names inside the archive's folder) of the verified archive of
    ``name``, parsed in memory; nothing is extracted to disk."""
    fname, blob = next(iter(_ensure_files(name, root, download).items()))
    path = _dataset_dir(name, root) / fname
    wanted = {f"{_CIFAR_DIRS[name]}/{m}": m for m in members}
    out: dict[str, _Batch] = {}
    try:
        # One pass through the gzip stream, in archive order (no seeking back).
        with tarfile.open(fileobj=io.BytesIO(blob), mode="r|gz") as tar:
            for member in tar:
                if member.name not in wanted:
                    continue
                fh = tar.extractfile(member) if member.isfile() else None
                if fh is None:
                    raise ValueError(f"{path}: {member.name} is not a regular file")
                where = f"{path}:{member.name}"
                out[wanted[member.name]] = (where, _unpickle(fh.read(), where))
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"{path} is not a readable tar.gz archive: {exc}") from exc
    missing = [m for m in wanted if wanted[m] not in out]
    if missing:
        raise ValueError(f"{path} lacks {', '.join(missing)}")
    return out


def _cifar_data(batches: list[_Batch], label_key: str) -> ImageData:
    xs, ys = [], []
    for where, d in batches:
        if "data" not in d or label_key not in d:
            raise ValueError(f"{where} lacks the keys 'data' and {label_key!r}")
        x = np.asarray(d["data"])
        y = np.asarray(d[label_key], dtype=np.int64).reshape(-1)
        if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3 * 32 * 32:
            raise ValueError(f"{where}: 'data' must be uint8 (N, 3072), got {x.dtype} {x.shape}")
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"{where}: {y.shape[0]} labels for {x.shape[0]} images")
        xs.append(x.reshape(-1, 3, 32, 32))
        ys.append(y)
    return ImageData(torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)))


_CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))


def _load_cifar10(root: Path, download: bool) -> tuple[ImageData, ImageData]:
    b = _cifar_archive("cifar10", root, download, (*_CIFAR10_TRAIN, "test_batch"))
    train = _cifar_data([b[m] for m in _CIFAR10_TRAIN], "labels")
    return train, _cifar_data([b["test_batch"]], "labels")


def _load_cifar100(root: Path, download: bool
                   ) -> tuple[ImageData, ImageData, tuple[str, ...]]:
    """Train and test splits (fine labels) and the 100 fine class names."""
    b = _cifar_archive("cifar100", root, download, ("train", "test", "meta"))
    where, meta = b["meta"]
    names = meta.get("fine_label_names")
    if not isinstance(names, list) or len(names) != 100:
        raise ValueError(f"{where} must hold a list of 100 'fine_label_names'")
    return (
        _cifar_data([b["train"]], "fine_labels"),
        _cifar_data([b["test"]], "fine_labels"),
        tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names),
    )


def _read_svhn(buf: bytes, path: Path) -> ImageData:
    """An SVHN MATLAB file held (verified) in ``buf``; ``path`` is named in errors."""
    from scipy.io import loadmat

    mat = loadmat(io.BytesIO(buf))
    if "X" not in mat or "y" not in mat:
        raise ValueError(f"{path} lacks the variables 'X' and 'y'")
    x, y = np.asarray(mat["X"]), np.asarray(mat["y"]).reshape(-1).astype(np.int64)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        raise ValueError(f"{path}: 'X' must be uint8 (32, 32, 3, N), got {x.dtype} {x.shape}")
    if y.shape[0] != x.shape[3]:
        raise ValueError(f"{path}: {y.shape[0]} labels for {x.shape[3]} images")
    if y.size and (y.min() < 1 or y.max() > 10):
        raise ValueError(f"{path}: labels must lie in 1..10, got {y.min()}..{y.max()}")
    y[y == 10] = 0  # SVHN stores the digit 0 as label 10
    images = np.ascontiguousarray(x.transpose(3, 2, 0, 1))  # (H, W, C, N) -> (N, C, H, W)
    return ImageData(torch.from_numpy(images), torch.from_numpy(y))


def _load_svhn(root: Path, download: bool) -> tuple[ImageData, ImageData]:
    files = _ensure_files("svhn", root, download)
    folder = _dataset_dir("svhn", root)
    train, test = "train_32x32.mat", "test_32x32.mat"
    return _read_svhn(files[train], folder / train), _read_svhn(files[test], folder / test)
