"""Batch augmentation on the device: random crop after zero padding, optional flip."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from calnotes._checks import check_positive_int

__all__ = ["Augment"]


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


def _augment_pad(image_size: int) -> int:
    """4 px for 32 px images, 2 px for 28 px (and smaller) images, 1 px below 16 px."""
    if image_size >= 32:
        return 4
    return 2 if image_size >= 16 else 1
