"""Train / validation / test splits of a dataset: :func:`load_dataset`, :func:`binary_target`.

The validation set is carved from the official training set by a seeded permutation; the
per-channel mean and std are computed on the full training split.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from calnotes._checks import check_positive_int
from calnotes.data.containers import DatasetSplits, ImageData
from calnotes.data.formats import (
    _load_cifar10,
    _load_cifar100,
    _load_idx_dataset,
    _load_svhn,
)
from calnotes.data.sources import (
    _CIFAR10_NAMES,
    _DIGIT_NAMES,
    _FASHION_NAMES,
    _INFO,
    IDX_DATASETS,
    _load_digits,
    _normalize_name,
    data_root,
)

__all__ = ["binary_target", "load_dataset"]


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


def _load_raw(
    name: str, base: Path, download: bool
) -> tuple[ImageData, ImageData, tuple[str, ...]]:
    """The full train and test splits of dataset ``name`` as stored on disk, and its class
    names."""
    if name in IDX_DATASETS:
        names = _FASHION_NAMES if name == "fashion_mnist" else _DIGIT_NAMES
        return (*_load_idx_dataset(name, base, download), names)
    if name == "cifar10":
        return (*_load_cifar10(base, download), _CIFAR10_NAMES)
    if name == "cifar100":
        return _load_cifar100(base, download)
    if name == "svhn":
        return (*_load_svhn(base, download), _DIGIT_NAMES)
    return (*_load_digits(), _DIGIT_NAMES)


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
    ``download=False`` only files already in the data root are used. Every file is SHA-256
    verified before it is read; a download into an unwritable data root raises
    :class:`~calnotes.data.DataRootError` before anything is fetched.
    """
    name = _normalize_name(name)
    seed = check_positive_int(seed, "seed", minimum=0)
    if not isinstance(download, bool):
        raise TypeError(f"download must be a bool, got {type(download).__name__}")
    for arg, value in (("train_subset", train_subset), ("val_subset", val_subset),
                       ("test_subset", test_subset)):
        if value is not None:
            check_positive_int(value, arg)
    base = data_root(root)
    info = _INFO[name]
    train_full, test, names = _load_raw(name, base, download)

    n_val = _resolve_val_size(val_size, info.default_val, len(train_full))
    train, val = _split(train_full, n_val, seed)
    mean, std = _channel_stats(train.images)
    if train_subset is not None:
        train = train.subset(train_subset, seed)
    if val_subset is not None and len(val) > 0:
        val = val.subset(val_subset, seed)
    if test_subset is not None:
        test = test.subset(test_subset, seed)
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
