"""CIFAR and SVHN files: verified before they are read, and read without running code.

Small files are written in the real formats (tests/fake_data.py): the official tar.gz
archives holding Python 2 pickles, and MATLAB files. Their SHA-256 is pinned by replacing the
entries of ``calnotes.data.SHA256``; tests that leave the published hashes in place show that
the checksum alone already stops a foreign file.
"""

from __future__ import annotations

import builtins
import hashlib
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from fake_data import (
    ARCHIVES,
    FOLDERS,
    cifar10_members,
    cifar100_members,
    cifar_rows,
    pin,
    py2_pickle,
    write_cifar,
    write_cifar_archive,
    write_svhn,
)

from calnotes import data
from calnotes.data import ChecksumError, DatasetUnavailableError, load_dataset, sources
from calnotes.data.__main__ import _status
from calnotes.data.formats import _unpickle

torch.set_num_threads(1)


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every download fails; returns the list of download attempts."""
    calls: list[str] = []

    def fail(*args: object, **kwargs: object) -> bytes:
        calls.append(str(args[0]) if args else "?")
        raise OSError("offline (test)")

    monkeypatch.setattr(sources, "_fetch_torchvision_file", fail)
    monkeypatch.setattr(sources, "_import_torchvision", fail)
    return calls


def _small_cifar10(seed: int = 0) -> tuple[dict[str, bytes], list[np.ndarray], np.ndarray]:
    train = [(cifar_rows(3, seed + i), [(3 * i + k) % 10 for k in range(3)]) for i in range(5)]
    test = (cifar_rows(4, seed + 99), [9, 0, 1, 2])
    return cifar10_members(train, test), [rows for rows, _ in train], test[0]


class _OpensMarker:
    """Unpickling this creates ``path`` (through ``open``), like any code a pickle may run."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (builtins.open, (str(self.path), "w"))


class _SystemMarker:
    """Unpickling this runs a shell command that creates ``path``."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, (f"touch '{self.path}'",))


def _crafted_cifar10(marker: Path) -> dict[str, bytes]:
    """The members of a CIFAR-10 archive whose first batch runs code when unpickled."""
    members, _, _ = _small_cifar10()
    members["data_batch_1"] = py2_pickle({b"data": cifar_rows(3, 0), b"labels": [0, 1, 2],
                                          b"filenames": _OpensMarker(marker)}, unicode=True)
    return members


def _extract_loose(root: Path, name: str, members: dict[str, bytes]) -> Path:
    """What extracting the archive would leave next to it."""
    folder = root / FOLDERS[name]
    folder.mkdir(parents=True, exist_ok=True)
    for member, blob in members.items():
        (folder / member).write_bytes(blob)
    return folder


# --------------------------------------------------------------------------------------
# the files written here are the real formats
# --------------------------------------------------------------------------------------
def test_fake_batches_are_python2_pickles_like_the_published_ones() -> None:
    blob = py2_pickle({b"data": cifar_rows(2, 0), b"labels": [3, 4]})
    assert blob[:2] == b"\x80\x02"  # protocol 2
    assert b"cnumpy.core.multiarray\n_reconstruct\n" in blob  # written by numpy 1
    assert b"U\x04data" in blob and b"_codecs" not in blob  # keys are Python 2 byte strings
    # and the unrestricted unpickler reads them the way the CIFAR page says to
    d = pickle.loads(blob, encoding="bytes")
    assert set(d) == {b"data", b"labels"} and d[b"data"].dtype == np.uint8


# --------------------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------------------
def test_cifar10_is_read_from_the_verified_archive(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[str]
) -> None:
    members, train_rows, test_rows = _small_cifar10()
    write_cifar(tmp_path, "cifar10", members, monkeypatch)
    s = load_dataset("cifar10", root=tmp_path, val_size=0)
    assert offline == []
    assert (len(s.train), len(s.test)) == (15, 4)
    assert s.train.images.shape == (15, 3, 32, 32) and s.train.images.dtype == torch.uint8
    # batches in order 1..5; channel-major rows: pixel (c, h, w) is row[1024 c + 32 h + w]
    np.testing.assert_array_equal(s.train.images.reshape(15, -1).numpy(),
                                  np.concatenate(train_rows))
    assert s.test.images[2, 1, 3, 5].item() == test_rows[2, 1024 + 96 + 5]
    assert s.train.labels.tolist() == [k % 10 for k in range(15)]
    assert s.test.labels.tolist() == [9, 0, 1, 2] and s.test.labels.dtype == torch.int64
    assert (s.num_classes, s.in_channels, s.image_size, s.allow_flip) == (10, 3, 32, True)
    assert s.class_names[0] == "airplane"
    # nothing was extracted next to the archive
    assert sorted(p.name for p in tmp_path.iterdir()) == [ARCHIVES["cifar10"]]


def test_cifar100_uses_fine_labels_and_meta_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[str]
) -> None:
    train = cifar_rows(12, 1)
    test = cifar_rows(3, 2)
    names = [f"name{i}".encode() for i in range(100)]
    members = cifar100_members((train, [8 * i for i in range(12)]), (test, [99, 0, 42]), names)
    write_cifar(tmp_path, "cifar100", members, monkeypatch)
    s = load_dataset("cifar100", root=tmp_path, val_size=0)
    assert offline == []
    assert s.num_classes == 100 and s.class_names[42] == "name42"
    assert s.train.labels.tolist() == [8 * i for i in range(12)]
    assert s.test.labels.tolist() == [99, 0, 42]
    np.testing.assert_array_equal(s.test.images.reshape(3, -1).numpy(), test)


def test_svhn_mat_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                        offline: list[str]) -> None:
    rng = np.random.default_rng(0)
    train = rng.integers(0, 256, (12, 3, 32, 32), dtype=np.uint8)
    test = rng.integers(0, 256, (5, 3, 32, 32), dtype=np.uint8)
    write_svhn(tmp_path, {"train": (train, np.arange(12) % 10 + 1),
                          "test": (test, np.array([10, 1, 2, 3, 4]))}, monkeypatch)
    s = load_dataset("svhn", root=tmp_path, val_size=0)
    assert offline == []
    np.testing.assert_array_equal(s.test.images.numpy(), test)
    np.testing.assert_array_equal(s.train.images.numpy(), train)
    assert s.test.labels.tolist() == [0, 1, 2, 3, 4]  # SVHN's label 10 is the digit 0
    assert s.train.labels.tolist() == [(i % 10 + 1) % 10 for i in range(12)]


@pytest.mark.parametrize("bad", [0, 11, -1])
def test_svhn_labels_outside_1_to_10_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                 offline: list[str], bad: int) -> None:
    # a raw 0 is not a digit in SVHN's labels (the digit 0 is stored as 10)
    images = np.zeros((3, 3, 32, 32), dtype=np.uint8)
    write_svhn(tmp_path, {"train": (images, [1, 2, 10]), "test": (images, [10, bad, 5])},
               monkeypatch)
    path = tmp_path / "svhn" / "test_32x32.mat"
    with pytest.raises(ValueError, match=rf"{re.escape(str(path))}: labels must lie in 1\.\.10"):
        load_dataset("svhn", root=tmp_path, val_size=0)


def test_download_is_verified_before_it_is_stored(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    members, _, _ = _small_cifar10()
    good = write_cifar(tmp_path / "published", "cifar10", members, monkeypatch).read_bytes()
    served = {"blob": members["test_batch"]}  # first: something else entirely
    urls: list[str] = []

    def fake_download(url: str, fname: str, workdir: Path) -> bytes:
        urls.append(url)
        return served["blob"]

    monkeypatch.setattr(sources, "_fetch_torchvision_file", fake_download)
    root = tmp_path / "root"
    with pytest.raises(ChecksumError, match=r"cifar-10-python.tar.gz.*torchvision download"):
        load_dataset("cifar10", root=root)
    assert not (root / ARCHIVES["cifar10"]).exists()  # a wrong download is never stored
    served["blob"] = good
    s = load_dataset("cifar10", root=root, val_size=0)
    assert len(s.train) == 15
    assert (root / ARCHIVES["cifar10"]).read_bytes() == good
    assert urls == ["https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"] * 2


# --------------------------------------------------------------------------------------
# no code runs from data files
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("payload", [_OpensMarker, _SystemMarker])
def test_restricted_unpickler_builds_arrays_and_refuses_everything_else(
    tmp_path: Path, payload: type[_OpensMarker | _SystemMarker]
) -> None:
    rows = cifar_rows(2, 0)
    for blob in (py2_pickle({b"data": rows}), pickle.dumps({b"data": rows}, protocol=4)):
        np.testing.assert_array_equal(_unpickle(blob, "batch")["data"], rows)
    marker = tmp_path / "marker"
    evil = py2_pickle({b"data": rows, b"labels": payload(marker)}, unicode=True)
    assert pickle.loads(evil, encoding="bytes")[b"data"].shape == (2, 3072)  # plain pickle...
    assert marker.exists()  # ...runs the payload
    marker.unlink()
    with pytest.raises(ValueError, match=r"^/some/where/data_batch_1: refusing .*(open|system)"):
        _unpickle(evil, "/some/where/data_batch_1")
    assert not marker.exists()
    # a class is refused as well, even a harmless one
    with pytest.raises(ValueError, match="refusing to load the global collections.OrderedDict"):
        _unpickle(pickle.dumps(__import__("collections").OrderedDict(a=1), protocol=2), "x")
    with pytest.raises(ValueError, match="not a readable CIFAR batch"):
        _unpickle(py2_pickle({b"data": rows})[:-20], "x")


def _load_crafted(root: Path) -> BaseException | None:
    try:
        load_dataset("cifar10", root=root, val_size=0)
    except Exception as exc:
        return exc
    return None


def test_crafted_batch_is_refused_even_when_its_archive_hash_is_pinned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[str]
) -> None:
    marker = tmp_path / "marker"
    members = _crafted_cifar10(marker)
    archive = write_cifar(tmp_path / "root", "cifar10", members, monkeypatch)
    _extract_loose(tmp_path / "root", "cifar10", members)  # and extracted, as torchvision does
    err = _load_crafted(tmp_path / "root")
    assert not marker.exists(), "the crafted pickle ran code"
    assert isinstance(err, ValueError)
    assert f"{archive}:cifar-10-batches-py/data_batch_1: refusing" in str(err)
    assert "open" in str(err)


def test_crafted_archive_fails_the_published_checksum(
    tmp_path: Path, offline: list[str]
) -> None:
    marker = tmp_path / "marker"
    root = tmp_path / "root"
    members = _crafted_cifar10(marker)
    archive = write_cifar_archive(root, "cifar10", members)  # published hash left in place
    _extract_loose(root, "cifar10", members)
    err = _load_crafted(root)
    assert not marker.exists(), "the crafted pickle ran code"
    assert isinstance(err, ChecksumError)
    assert f"cache {archive}" in str(err) and data.SHA256["cifar10"][archive.name] in str(err)


def test_extracted_files_next_to_a_good_archive_are_never_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[str]
) -> None:
    marker = tmp_path / "marker"
    members, train_rows, _ = _small_cifar10()
    write_cifar(tmp_path / "root", "cifar10", members, monkeypatch)
    _extract_loose(tmp_path / "root", "cifar10", _crafted_cifar10(marker))
    s = load_dataset("cifar10", root=tmp_path / "root", val_size=0)
    assert not marker.exists(), "a loose extracted file was unpickled"
    np.testing.assert_array_equal(s.train.images[:3].reshape(3, -1).numpy(), train_rows[0])


# --------------------------------------------------------------------------------------
# checksums and missing archives
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
def test_archive_with_wrong_hash_names_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[str], name: str
) -> None:
    members = (_small_cifar10()[0] if name == "cifar10" else
               cifar100_members((cifar_rows(2, 0), [0, 1]), (cifar_rows(1, 1), [2])))
    archive = write_cifar(tmp_path, name, members, monkeypatch)
    monkeypatch.setitem(data.SHA256, name, {archive.name: hashlib.sha256(b"other").hexdigest()})
    with pytest.raises(ChecksumError, match="SHA-256 mismatch") as info:
        load_dataset(name, root=tmp_path)
    assert str(archive) in str(info.value)
    assert offline == []  # a corrupt file is reported, not silently replaced
    assert _status(name, tmp_path).startswith("CHECKSUM MISMATCH")
    pin(monkeypatch, name, archive)
    assert _status(name, tmp_path) == f"cached, verified, in {tmp_path}"


@pytest.mark.parametrize("name", ["cifar10", "cifar100"])
@pytest.mark.parametrize("download", [False, True])
def test_extracted_folder_without_archive_gives_a_clear_error(
    tmp_path: Path, offline: list[str], name: str, download: bool
) -> None:
    members = (_small_cifar10()[0] if name == "cifar10" else
               cifar100_members((cifar_rows(2, 0), [0, 1]), (cifar_rows(1, 1), [2])))
    folder = _extract_loose(tmp_path, name, members)
    with pytest.raises(DatasetUnavailableError) as info:
        load_dataset(name, root=tmp_path, download=download)
    msg = str(info.value)
    assert f"found the extracted folder {folder} but not the archive" in msg
    assert str(tmp_path / ARCHIVES[name]) in msg
    assert "do NOT extract it" in msg and "CALNOTES_DATA" in msg
    assert len(offline) == int(download)  # the archive is fetched only when allowed
    assert "the archive" in _status(name, tmp_path)


def test_svhn_with_wrong_hash_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: list[str]
) -> None:
    published = dict(data.SHA256["svhn"])
    images = np.zeros((2, 3, 32, 32), np.uint8)
    write_svhn(tmp_path, {"train": (images, [1, 2]), "test": (images, [3, 4])}, monkeypatch)
    assert len(load_dataset("svhn", root=tmp_path, val_size=0).test) == 2
    # a readable file with other content than the pinned one
    (test,) = write_svhn(tmp_path, {"test": (images, [5, 6])}, monkeypatch, pin_hash=False)
    with pytest.raises(ChecksumError, match="test_32x32.mat") as info:
        load_dataset("svhn", root=tmp_path)
    assert f"cache {test}" in str(info.value)
    assert offline == []
    # the published hashes reject the small files too
    monkeypatch.setitem(data.SHA256, "svhn", published)
    with pytest.raises(ChecksumError, match="train_32x32.mat"):
        load_dataset("svhn", root=tmp_path)


def test_every_downloaded_file_has_a_pinned_hash_and_url() -> None:
    for name in ("cifar10", "cifar100", "svhn"):
        assert set(sources._URLS[name]) == set(data.SHA256[name])
        for fname, digest in data.SHA256[name].items():
            assert len(digest) == 64 and set(digest) <= set("0123456789abcdef"), fname
            assert sources._URLS[name][fname].endswith("/" + fname)
