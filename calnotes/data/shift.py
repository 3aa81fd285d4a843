"""Shifted test images: rotations, translations and corruptions at graded intensities.

:func:`shift_images` applies one shift to uint8 images ``(N, C, H, W)`` and returns uint8
images of the same shape, on the CPU:

* ``"rotate"``, ``level`` in degrees (counter-clockwise about the image centre), the
  rotated MNIST of Ovadia et al. (2019) at 15-degree steps: pixel ``(i, j)`` of the result
  is the original image read at ``R(-level) ((i, j) - c) + c``, ``c = ((H-1)/2, (W-1)/2)``,
  by bilinear interpolation with zeros outside the image;
* ``"roll"``, ``level`` in pixels: the image rolled to the right with wrap-around
  (``x'[:, j] = x[:, (j - level) mod W]``), Ovadia et al.'s translated MNIST;
* corruptions of ImageNet-C (Hendrycks & Dietterich 2019), the family MNIST-C (Mu & Gilmer
  2019) adapts to 28-pixel digits, at severity ``level`` in 1..5 (:data:`CORRUPTIONS`):
  ``gaussian_noise`` ``x + N(0, s^2)``, ``shot_noise`` ``Poisson(x s) / s``,
  ``impulse_noise`` (salt and pepper on a share ``s`` of the pixels), ``contrast``
  ``(x - mean(x)) s + mean(x)``, and ``gaussian_blur`` (a Gaussian kernel of std ``s``
  pixels), on pixels ``x`` in [0, 1].

Level 0 of every shift is the identity. Everything is computed in float64 NumPy with
elementwise operations in a fixed order and random draws from NumPy's PCG64 generator
seeded by ``(seed, shift, level)``, then rounded to uint8: the same bytes on every CPU and
with any torch kernel family (torch's vectorized samplers and resamplers are not).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from calnotes._checks import check_positive_int

__all__ = [
    "CORRUPTIONS",
    "SHIFTS",
    "SHIFT_LEVELS",
    "roll_images",
    "rotate_images",
    "shift_images",
    "shifted_sets",
]

#: Severity parameters ``s`` of each corruption at severities 1..5. Noise and contrast take
#: ImageNet-C's values (pixels in [0, 1]); the blur's standard deviations (ImageNet-C's are
#: for 224-pixel images) are scaled to 28-pixel digits.
CORRUPTIONS: dict[str, tuple[float, ...]] = {
    "gaussian_noise": (0.08, 0.12, 0.18, 0.26, 0.38),
    "shot_noise": (60.0, 25.0, 12.0, 5.0, 3.0),
    "impulse_noise": (0.03, 0.06, 0.09, 0.17, 0.27),
    "contrast": (0.4, 0.3, 0.2, 0.1, 0.05),
    "gaussian_blur": (0.5, 0.75, 1.0, 1.25, 1.5),
}

#: Every shift :func:`shift_images` knows.
SHIFTS = ("rotate", "roll", *CORRUPTIONS)

#: Ovadia et al.'s levels: rotations of 0 to 180 degrees in 15-degree steps and rolls of 0
#: to 26 pixels in 2-pixel steps; corruptions at severities 0 (none) to 5.
SHIFT_LEVELS: dict[str, tuple[int, ...]] = {
    "rotate": tuple(range(0, 181, 15)),
    "roll": tuple(range(0, 27, 2)),
    **{name: tuple(range(6)) for name in CORRUPTIONS},
}


def _check_images(images: Any, name: str = "images") -> np.ndarray:
    if not isinstance(images, (torch.Tensor, np.ndarray)):
        raise TypeError(f"{name} must be a uint8 torch tensor or numpy array (N, C, H, W), "
                        f"got {type(images).__name__}")
    array = images.detach().cpu().numpy() if isinstance(images, torch.Tensor) else images
    if array.dtype != np.uint8:
        raise TypeError(f"{name} must have dtype uint8, got {array.dtype}")
    if array.ndim != 4 or 0 in array.shape:
        raise ValueError(f"{name} must be non-empty (N, C, H, W) with N, C, H, W >= 1, got "
                         f"shape {array.shape}")
    return array


def _to_uint8(x: np.ndarray) -> torch.Tensor:
    """float64 pixels in [0, 1] -> uint8 ``round(255 x)`` (halves to even), clipped."""
    return torch.from_numpy(np.clip(np.rint(x * 255.0), 0, 255).astype(np.uint8))


def rotate_images(images: Any, degrees: float) -> torch.Tensor:
    """``images`` rotated by ``degrees`` counter-clockwise about their centre (bilinear,
    zeros outside), uint8 ``(N, C, H, W)``. ``degrees = 0`` returns the images unchanged."""
    x = _check_images(images)
    if isinstance(degrees, bool) or not isinstance(degrees, (int, float)) or not math.isfinite(
            degrees):
        raise TypeError(f"degrees must be a finite number, got {degrees!r}")
    if degrees % 360 == 0:
        return torch.from_numpy(x.copy())
    n, c, h, w = x.shape
    theta = math.radians(degrees)
    cos, sin = math.cos(theta), math.sin(theta)  # scalars: no vectorized libm involved
    ci, cj = (h - 1) / 2.0, (w - 1) / 2.0
    i, j = np.meshgrid(np.arange(h, dtype=np.float64), np.arange(w, dtype=np.float64),
                       indexing="ij")
    # inverse map: rows grow downwards, so a counter-clockwise turn on screen is R(-theta)
    di, dj = i - ci, j - cj
    src_i = ci + cos * di + sin * dj
    src_j = cj - sin * di + cos * dj
    i0, j0 = np.floor(src_i), np.floor(src_j)
    fi, fj = src_i - i0, src_j - j0
    i0, j0 = i0.astype(np.int64), j0.astype(np.int64)
    padded = np.zeros((n, c, h + 2, w + 2), dtype=np.float64)  # one ring of zeros
    padded[:, :, 1:-1, 1:-1] = x / 255.0

    def tap(ii: np.ndarray, jj: np.ndarray) -> np.ndarray:
        inside = (ii >= -1) & (ii <= h) & (jj >= -1) & (jj <= w)
        return np.where(inside, padded[:, :, np.clip(ii + 1, 0, h + 1),
                                       np.clip(jj + 1, 0, w + 1)], 0.0)

    out = ((1 - fi) * (1 - fj)) * tap(i0, j0) + ((1 - fi) * fj) * tap(i0, j0 + 1)
    out = out + (fi * (1 - fj)) * tap(i0 + 1, j0) + (fi * fj) * tap(i0 + 1, j0 + 1)
    return _to_uint8(out)


def roll_images(images: Any, pixels: int) -> torch.Tensor:
    """``images`` rolled ``pixels`` to the right with wrap-around, uint8 ``(N, C, H, W)``."""
    x = _check_images(images)
    if isinstance(pixels, bool) or not isinstance(pixels, (int, np.integer)):
        raise TypeError(f"pixels must be an int, got {pixels!r}")
    return torch.from_numpy(np.roll(x, int(pixels), axis=3).copy())


def _gaussian_kernel(sigma: float) -> np.ndarray:
    radius = max(1, int(math.ceil(3 * sigma)))
    taps = np.array([math.exp(-(k * k) / (2 * sigma * sigma)) for k in range(-radius, radius + 1)])
    return taps / taps.sum()


def _blur(x: np.ndarray, sigma: float) -> np.ndarray:
    """Separable Gaussian blur with zeros outside, taps summed in a fixed order."""
    kernel = _gaussian_kernel(sigma)
    r = len(kernel) // 2
    for axis in (2, 3):
        pad = [(0, 0)] * 4
        pad[axis] = (r, r)
        p = np.pad(x, pad)
        size = x.shape[axis]
        out = np.zeros_like(x)
        for k, weight in enumerate(kernel):
            out = out + weight * np.take(p, np.arange(k, k + size), axis=axis)
        x = out
    return x


def _corrupt(x: np.ndarray, name: str, s: float, rng: np.random.Generator) -> np.ndarray:
    if name == "gaussian_noise":
        return np.clip(x + s * rng.standard_normal(x.shape), 0, 1)
    if name == "shot_noise":
        return np.clip(rng.poisson(x * s) / s, 0, 1)
    if name == "impulse_noise":
        u = rng.random(x.shape)
        return np.where(u < s / 2, 0.0, np.where(u < s, 1.0, x))
    if name == "contrast":
        mean = x.mean(axis=(1, 2, 3), keepdims=True)
        return np.clip((x - mean) * s + mean, 0, 1)
    if name == "gaussian_blur":
        return np.clip(_blur(x, s), 0, 1)
    raise ValueError(f"unknown corruption {name!r}")  # pragma: no cover - checked by caller


def shift_images(images: Any, shift: str, level: int | float, seed: int = 0) -> torch.Tensor:
    """``images`` under ``shift`` (one of ``SHIFTS``) at ``level``: degrees for
    ``"rotate"``, pixels for ``"roll"``, severity 0..5 for a corruption (0: unchanged).
    Random corruptions draw from PCG64 seeded with ``(seed, shift, level)``. Returns uint8
    ``(N, C, H, W)`` on the CPU."""
    x = _check_images(images)
    if shift not in SHIFTS:
        raise ValueError(f"shift must be one of {list(SHIFTS)}, got {shift!r}")
    seed = check_positive_int(seed, "seed", minimum=0)
    if shift == "rotate":
        return rotate_images(x, level)
    if shift == "roll":
        return roll_images(x, level)  # type: ignore[arg-type]
    if isinstance(level, bool) or not isinstance(level, (int, np.integer)) or not 0 <= level <= 5:
        raise ValueError(f"level of {shift!r} must be a severity 0..5, got {level!r}")
    if level == 0:
        return torch.from_numpy(x.copy())
    rng = np.random.default_rng([seed, SHIFTS.index(shift), int(level)])
    return _to_uint8(_corrupt(x / 255.0, shift, CORRUPTIONS[shift][int(level) - 1], rng))


def shifted_sets(images: Any, shift: str, levels: Sequence[int | float],
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """``{"<shift>:<level>": shift_images(images, shift, level, seed)}`` for each level."""
    if isinstance(levels, (str, bytes)) or not isinstance(levels, Sequence) or not levels:
        raise ValueError(f"levels must be a non-empty sequence, got {levels!r}")
    for level in levels:
        if isinstance(level, bool) or not isinstance(level, (int, float, np.integer,
                                                             np.floating)):
            raise TypeError(f"levels must hold numbers, got {level!r} in {list(levels)!r}")
    return {f"{shift}:{level:g}": shift_images(images, shift, level, seed) for level in levels}
