"""Images and labels in memory: :class:`ImageData` and :class:`DatasetSplits`.

Images are kept as ``uint8 (N, C, H, W)`` tensors and labels as ``int64 (N,)``, on one
device; a :class:`DatasetSplits` adds what a model and a loader need to know (classes,
channels, size, the training mean and std).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from calnotes._checks import as_tensor, check_label_range, check_positive_int

__all__ = ["DatasetSplits", "ImageData"]


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
        g = torch.Generator().manual_seed(check_positive_int(seed, "seed", minimum=0))
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
