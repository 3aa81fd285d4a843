"""Readers of the files on disk: IDX (MNIST, Fashion-MNIST), CIFAR pickles, SVHN .mat.

Each ``_load_<name>(root, download)`` returns the full ``(train, test)`` splits as
:class:`~calnotes.data.containers.ImageData`; the files come from
:mod:`calnotes.data.sources`.
"""

from __future__ import annotations

import math
import os
import pickle
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from calnotes._checks import as_tensor
from calnotes._io import atomic_write as _atomic_write
from calnotes.data.containers import ImageData
from calnotes.data.sources import _CIFAR100_DIR, _ensure_idx, _ensure_tv_files, _maybe_gunzip

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
def _unpickle(path: Path) -> dict[str, Any]:
    """Load a CIFAR python batch (a pickled dict with bytes keys); only for trusted files."""
    with open(path, "rb") as fh:
        obj = pickle.load(fh, encoding="bytes")
    if not isinstance(obj, dict):
        raise ValueError(f"{path} does not hold a CIFAR batch dict")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def _cifar_batches(paths: Sequence[Path], label_key: str) -> ImageData:
    xs, ys = [], []
    for p in paths:
        d = _unpickle(p)
        if "data" not in d or label_key not in d:
            raise ValueError(f"{p} lacks the keys 'data' and {label_key!r}")
        x = np.asarray(d["data"])
        y = np.asarray(d[label_key], dtype=np.int64).reshape(-1)
        if x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != 3 * 32 * 32:
            raise ValueError(f"{p}: 'data' must be uint8 (N, 3072), got {x.dtype} {x.shape}")
        if y.shape[0] != x.shape[0]:
            raise ValueError(f"{p}: {y.shape[0]} labels for {x.shape[0]} images")
        xs.append(x.reshape(-1, 3, 32, 32))
        ys.append(y)
    return ImageData(torch.from_numpy(np.concatenate(xs)), torch.from_numpy(np.concatenate(ys)))


def _load_cifar10(root: Path, download: bool) -> tuple[ImageData, ImageData]:
    folder = _ensure_tv_files("cifar10", root, download)
    train = _cifar_batches([folder / f"data_batch_{i}" for i in range(1, 6)], "labels")
    return train, _cifar_batches([folder / "test_batch"], "labels")


def _load_cifar100(root: Path, download: bool) -> tuple[ImageData, ImageData]:
    folder = _ensure_tv_files("cifar100", root, download)
    return (
        _cifar_batches([folder / "train"], "fine_labels"),
        _cifar_batches([folder / "test"], "fine_labels"),
    )


def _cifar100_names(root: Path) -> tuple[str, ...]:
    meta = root / _CIFAR100_DIR / "meta"
    if meta.is_file():
        names = _unpickle(meta).get("fine_label_names")
        if names is not None and len(names) == 100:
            return tuple(n.decode() if isinstance(n, bytes) else str(n) for n in names)
    return tuple(f"class_{i}" for i in range(100))


def _read_svhn(path: Path) -> ImageData:
    from scipy.io import loadmat

    mat = loadmat(path)
    x, y = np.asarray(mat["X"]), np.asarray(mat["y"]).reshape(-1).astype(np.int64)
    if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3):
        raise ValueError(f"{path}: 'X' must be uint8 (32, 32, 3, N), got {x.dtype} {x.shape}")
    if y.shape[0] != x.shape[3]:
        raise ValueError(f"{path}: {y.shape[0]} labels for {x.shape[3]} images")
    y[y == 10] = 0  # SVHN stores the digit 0 as label 10
    if y.size and (y.min() < 0 or y.max() > 9):
        raise ValueError(f"{path}: labels must lie in 1..10, got {y.min()}..{y.max()}")
    images = np.ascontiguousarray(x.transpose(3, 2, 0, 1))  # (H, W, C, N) -> (N, C, H, W)
    return ImageData(torch.from_numpy(images), torch.from_numpy(y))


def _load_svhn(root: Path, download: bool) -> tuple[ImageData, ImageData]:
    folder = _ensure_tv_files("svhn", root, download)
    return _read_svhn(folder / "train_32x32.mat"), _read_svhn(folder / "test_32x32.mat")
