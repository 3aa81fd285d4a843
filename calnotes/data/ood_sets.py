"""Out-of-distribution image sets shaped like an in-distribution dataset.

:func:`ood_images` picks a set by name: another dataset's test split, a set a package
registry ships (:mod:`calnotes.data.packaged`: animal silhouettes, letters drawn from fonts),
synthetic noise, or a folder of images, converted to the channels and size of the
in-distribution data (:func:`match_images`). Images are uint8 ``(N, C, H, W)`` on the CPU.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from calnotes._checks import as_tensor, check_positive_int
from calnotes.data.containers import DatasetSplits, ImageData
from calnotes.data.packaged import PACKAGED_SETS, load_packaged
from calnotes.data.sources import DATASETS, _normalize_name, data_root
from calnotes.data.splits import _load_raw

__all__ = [
    "IMAGE_SUFFIXES",
    "OOD_NOISE",
    "gaussian_noise_images",
    "load_image_folder",
    "match_images",
    "ood_images",
    "uniform_noise_images",
]


# --------------------------------------------------------------------------------------
# noise images and image folders
# --------------------------------------------------------------------------------------

#: File suffixes :func:`load_image_folder` reads (case-insensitive).
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg")


def _check_image_shape(shape: Any) -> tuple[int, int, int]:
    if not isinstance(shape, (tuple, list)) or len(shape) != 3:
        raise ValueError(f"shape must be (C, H, W), got {shape!r}")
    c, h, w = (check_positive_int(v, f"shape[{i}]") for i, v in enumerate(shape))
    return c, h, w


def gaussian_noise_images(n: int, shape: tuple[int, int, int], seed: int = 0) -> torch.Tensor:
    """``n`` Gaussian-noise images, uint8 ``(n, C, H, W)`` on the CPU.

    Pixels are ``clip(round(128 + 64 z), 0, 255)`` with ``z ~ N(0, 1)`` i.i.d., drawn in
    float64 by numpy's PCG64 generator seeded with ``seed``: the same images on every CPU
    (torch's vectorized normal sampler rounds differently on different instruction sets).
    """
    n = check_positive_int(n, "n")
    c, h, w = _check_image_shape(shape)
    rng = np.random.default_rng(check_positive_int(seed, "seed", minimum=0))
    z = rng.standard_normal((n, c, h, w))
    return torch.from_numpy(np.clip(np.rint(128.0 + 64.0 * z), 0, 255).astype(np.uint8))


def uniform_noise_images(n: int, shape: tuple[int, int, int], seed: int = 0) -> torch.Tensor:
    """``n`` uniform-noise images, uint8 ``(n, C, H, W)``: pixels i.i.d. uniform on {0..255}."""
    n = check_positive_int(n, "n")
    c, h, w = _check_image_shape(shape)
    gen = torch.Generator().manual_seed(check_positive_int(seed, "seed", minimum=0))
    return torch.randint(0, 256, (n, c, h, w), generator=gen, dtype=torch.uint8)


def load_image_folder(
    path: str | Path, size: int | tuple[int, int], channels: int = 3
) -> torch.Tensor:
    """Read every PNG/JPEG in ``path`` (sorted by name) into uint8 ``(N, channels, H, W)``.

    Images are converted to grayscale (``channels=1``) or RGB (``channels=3``) and resized to
    ``size`` (``int`` for square, or ``(H, W)``) with bilinear filtering. Raises
    ``FileNotFoundError`` if ``path`` is not a folder and ``ValueError`` if it holds no image.
    """
    from PIL import Image

    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"path is not a folder: {str(folder)!r}")
    if isinstance(size, (tuple, list)):
        if len(size) != 2:
            raise ValueError(f"size must be an int or (H, W), got {size!r}")
        height, width = (check_positive_int(v, "size") for v in size)
    else:
        height = width = check_positive_int(size, "size")
    channels = check_positive_int(channels, "channels")
    if channels not in (1, 3):
        raise ValueError(f"channels must be 1 or 3, got {channels}")
    files = sorted(
        p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES
    )
    if not files:
        raise ValueError(
            f"path {str(folder)!r} contains no image files with suffix {IMAGE_SUFFIXES}"
        )
    mode = "L" if channels == 1 else "RGB"
    images = []
    for file in files:
        with Image.open(file) as img:
            resized = img.convert(mode).resize((width, height), Image.Resampling.BILINEAR)
            arr = np.asarray(resized, dtype=np.uint8)
        images.append(arr[None] if channels == 1 else arr.transpose(2, 0, 1))
    return torch.from_numpy(np.stack(images))


# --------------------------------------------------------------------------------------
# sets matched to a dataset
# --------------------------------------------------------------------------------------
#: Synthetic OOD sets :func:`ood_images` draws (their laws are given above).
OOD_NOISE = ("gaussian", "uniform")
_FOLDER_PREFIX = "folder:"
_LUMA = (0.299, 0.587, 0.114)  # ITU-R BT.601 weights of R, G, B in grey


def match_images(images: torch.Tensor, channels: int, size: int) -> torch.Tensor:
    """Convert uint8 images ``(N, C, H, W)`` to ``channels`` (1 or 3) and ``size x size``.

    Grey to RGB repeats the channel; RGB to grey takes the BT.601 luma
    ``0.299 R + 0.587 G + 0.114 B``. A different size is reached by bilinear resampling
    (with antialiasing when shrinking). Values are rounded and clipped to 0..255; images
    that already match are returned unchanged.

    The arithmetic is float64, and values are rounded to 6 decimals before the rounding to
    integers (half to even): an exact tie such as 3.5, computed as 3.4999999999999996 by
    one CPU's kernels and 3.5 by another's, then rounds the same way everywhere, so the
    images, and the digests that key their stored logits, do not depend on the CPU.
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
    f = x.double()
    if x.shape[1] == 1 and channels == 3:
        f = f.expand(-1, 3, -1, -1)
    elif x.shape[1] == 3 and channels == 1:
        f = (f * torch.tensor(_LUMA, dtype=torch.float64).view(1, 3, 1, 1)).sum(
            dim=1, keepdim=True)
    if f.shape[2] != size or f.shape[3] != size:
        shrink = size < max(f.shape[2], f.shape[3])
        f = F.interpolate(f, size=(size, size), mode="bilinear", align_corners=False,
                          antialias=shrink)
    return f.round(decimals=6).round().clamp(0, 255).to(torch.uint8).contiguous()


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
    * a set of :data:`~calnotes.data.packaged.PACKAGED_SETS` (``"animals"``, ``"letters"``):
      all of its images (:func:`~calnotes.data.packaged.load_packaged`);
    * ``"gaussian"`` or ``"uniform"`` (:data:`OOD_NOISE`): noise images from
      :func:`gaussian_noise_images` / :func:`uniform_noise_images`;
    * ``"folder:<path>"`` or a path object: every PNG/JPEG in that folder
      (:func:`load_image_folder`).

    Images are converted to ``like``'s channels and size (:func:`match_images`). A source
    with more than ``n`` images gives ``n`` drawn without replacement (deterministic in
    ``seed``, original order kept); a smaller one gives all of its images. Returns uint8
    ``(N, C, H, W)`` on the CPU with ``N = min(n, available)``.
    """
    if not isinstance(like, DatasetSplits):
        raise TypeError(f"like must be a DatasetSplits, got {type(like).__name__}")
    n = check_positive_int(n, "n")
    seed = check_positive_int(seed, "seed", minimum=0)
    c, size = like.in_channels, like.image_size
    if isinstance(name, os.PathLike) or (
        isinstance(name, str) and name.startswith(_FOLDER_PREFIX)
    ):
        folder = Path(name[len(_FOLDER_PREFIX):] if isinstance(name, str) else name)
        images = load_image_folder(folder, size, channels=c)
        if len(images) > n:
            images = ImageData(images, torch.zeros(len(images), dtype=torch.long)).subset(
                n, seed).images
        return images
    if not isinstance(name, str):
        raise TypeError(f"name must be a str or a path, got {type(name).__name__}")
    if name in OOD_NOISE:
        draw = gaussian_noise_images if name == "gaussian" else uniform_noise_images
        return draw(n, (c, size, size), seed=seed)
    if name in PACKAGED_SETS:
        packaged = load_packaged(name, root, download)
        return match_images(packaged.subset(n, seed).images if len(packaged) > n
                            else packaged.images, c, size)
    try:
        dataset = _normalize_name(name)
    except ValueError:
        raise ValueError(
            f"name must be a dataset of {DATASETS}, a set of {PACKAGED_SETS}, one of "
            f"{OOD_NOISE} or 'folder:<path>', got {name!r}"
        ) from None
    if dataset == like.name:
        raise ValueError(f"name {name!r} is the in-distribution dataset itself, not OOD")
    base = data_root(root)
    _, test, _ = _load_raw(dataset, base, download)
    return match_images(test.subset(n, seed).images, c, size)
