"""Device-resident batching: :class:`DeviceLoader` and :func:`make_loaders`.

The whole split is kept on one device as uint8; batches are normalized floats
``x = (u / 255 - mean) / std``, shuffled and augmented from a generator seeded by
``(seed, epoch)``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from calnotes._checks import check_device, check_positive_int
from calnotes.data.augment import Augment, _augment_pad
from calnotes.data.containers import DatasetSplits, ImageData

__all__ = ["DeviceLoader", "make_loaders"]


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
        self.seed = check_positive_int(seed, "seed", minimum=0)
        self.drop_last = drop_last
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shuffle order and augmentation the next pass uses."""
        self.epoch = check_positive_int(epoch, "epoch", minimum=0)

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


def make_loaders(
    splits: DatasetSplits,
    batch_size: int,
    device: str | torch.device = "cpu",
    augment: bool = False,
    seed: int = 0,
    eval_batch_size: int | None = None,
    flip: bool | None = None,
) -> tuple[DeviceLoader, DeviceLoader, DeviceLoader]:
    """``(train, val, test)`` loaders; only train shuffles and (optionally) augments.

    ``augment`` crops at random after padding; it also flips horizontally where the dataset
    allows it (``splits.allow_flip``: not for digits) unless ``flip`` says otherwise
    (``flip`` needs ``augment=True``).
    """
    if not isinstance(splits, DatasetSplits):
        raise TypeError(f"splits must be a DatasetSplits, got {type(splits).__name__}")
    if not isinstance(augment, bool):
        raise TypeError(f"augment must be a bool, got {type(augment).__name__}")
    if flip is not None and not isinstance(flip, bool):
        raise TypeError(f"flip must be a bool or None, got {type(flip).__name__}")
    if flip is not None and not augment:
        raise ValueError("flip applies to augmentation: set augment=True or leave flip=None")
    eval_bs = batch_size if eval_batch_size is None else eval_batch_size
    do_flip = splits.allow_flip if flip is None else flip
    aug = Augment(pad=_augment_pad(splits.image_size), flip=do_flip) if augment else None
    common: dict[str, Any] = {"mean": splits.mean, "std": splits.std, "device": device}
    train = DeviceLoader(splits.train, batch_size, shuffle=True, augment=aug, seed=seed, **common)
    val = DeviceLoader(splits.val, eval_bs, shuffle=False, **common)
    test = DeviceLoader(splits.test, eval_bs, shuffle=False, **common)
    return train, val, test
