"""Shifted test images (calnotes.data.shift): exact small cases, determinism, bad input."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from calnotes.data import shift
from calnotes.data.shift import CORRUPTIONS, SHIFT_LEVELS, rotate_images, shift_images


def _images(n: int = 4, size: int = 28, seed: int = 0) -> torch.Tensor:
    rng = np.random.default_rng(seed)
    return torch.from_numpy(rng.integers(0, 256, (n, 1, size, size), dtype=np.uint8))


def test_ovadia_levels():
    assert SHIFT_LEVELS["rotate"] == tuple(range(0, 181, 15))
    assert SHIFT_LEVELS["rotate"][-1] == 180 and len(SHIFT_LEVELS["rotate"]) == 13
    assert SHIFT_LEVELS["roll"] == tuple(range(0, 27, 2))


@pytest.mark.parametrize("name", shift.SHIFTS)
def test_level_zero_is_identity(name):
    x = _images()
    assert torch.equal(shift_images(x, name, 0), x)


@pytest.mark.parametrize("degrees", [90, 180, 270, -90])
def test_quarter_turns_are_exact_on_odd_images(degrees):
    # an odd side puts the centre on a pixel: a quarter turn maps pixels onto pixels
    x = _images(size=9)
    turns = (degrees // 90) % 4
    expected = torch.rot90(x, k=turns, dims=(2, 3))  # rot90 turns counter-clockwise
    assert torch.equal(rotate_images(x, degrees), expected)


def test_rotation_of_a_single_pixel_counter_clockwise():
    x = torch.zeros(1, 1, 5, 5, dtype=torch.uint8)
    x[0, 0, 2, 4] = 200  # right of the centre
    out = rotate_images(x, 90)
    assert out[0, 0, 0, 2] == 200  # a counter-clockwise quarter turn takes it to the top
    assert int(out.sum()) == 200


def test_rotation_bilinear_hand_computed():
    # 45 degrees: the centre keeps its value; the corner pixel reads outside (zero)
    x = torch.full((1, 1, 3, 3), 100, dtype=torch.uint8)
    out = rotate_images(x, 45)
    assert out[0, 0, 1, 1] == 100
    # corner (0, 0): source = c + R(d), d = (-1, -1) -> (1 - sqrt2, 1) -> i = -0.414, j = 1
    # bilinear between padded zero at i=-1 (weight 0.414) and 100 at i=0 (weight 0.586)
    expected = round(255 * (1 - (math.sqrt(2) - 1)) * 100 / 255)
    assert int(out[0, 0, 0, 0]) == expected  # exact in float64, rounded once


def test_roll_wraps_around():
    x = _images()
    out = shift_images(x, "roll", 3)
    assert torch.equal(out[..., 3:], x[..., :-3])
    assert torch.equal(out[..., :3], x[..., -3:])
    assert torch.equal(shift_images(x, "roll", 28), x)


def test_contrast_and_blur_hand_computed():
    x = torch.tensor([[[[0, 255]]]], dtype=torch.uint8)
    # contrast 1: mean 0.5, (x - 0.5) * 0.4 + 0.5 = 0.3, 0.7 -> 76.5, 178.5 -> 76 and 178
    assert shift_images(x, "contrast", 1).flatten().tolist() == [76, 178]
    one = torch.zeros(1, 1, 7, 7, dtype=torch.uint8)
    one[0, 0, 3, 3] = 255
    blurred = shift_images(one, "gaussian_blur", 3)
    assert int(blurred.argmax()) == 3 * 7 + 3
    assert torch.equal(blurred, blurred.transpose(2, 3))  # the kernel is symmetric
    k = shift._gaussian_kernel(1.0)
    assert abs(k.sum() - 1.0) < 1e-12 and len(k) == 7


@pytest.mark.parametrize("name", list(CORRUPTIONS))
def test_corruptions_grow_with_severity_and_are_seeded(name):
    x = _images(n=8)
    dist = [float((shift_images(x, name, s).double() - x.double()).abs().mean())
            for s in range(6)]
    assert dist[0] == 0.0
    assert dist[5] > dist[1]
    a, b = shift_images(x, name, 3, seed=1), shift_images(x, name, 3, seed=1)
    assert torch.equal(a, b)
    if name.endswith("noise"):
        assert not torch.equal(a, shift_images(x, name, 3, seed=2))


def test_bad_input_names_the_argument():
    x = _images()
    with pytest.raises(TypeError, match="images"):
        shift_images(x.float(), "rotate", 15)
    with pytest.raises(ValueError, match="shift"):
        shift_images(x, "sheer", 1)
    with pytest.raises(ValueError, match="level"):
        shift_images(x, "contrast", 6)
    with pytest.raises(TypeError, match="degrees"):
        shift_images(x, "rotate", float("nan"))
    with pytest.raises(ValueError, match="images"):
        shift_images(x[:, 0], "roll", 2)


_DIGEST = """
import hashlib, numpy as np, torch
from calnotes.data.shift import SHIFTS, shift_images
x = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (16, 1, 28, 28), dtype=np.uint8))
h = hashlib.sha256()
for name in SHIFTS:
    level = 75 if name == "rotate" else (6 if name == "roll" else 4)
    h.update(shift_images(x, name, level, seed=3).numpy().tobytes())
print(h.hexdigest())
"""


def test_same_bytes_on_another_cpu_kernel_family():
    here = subprocess.run([sys.executable, "-c", _DIGEST], capture_output=True, text=True,
                          check=True, env={**os.environ}).stdout
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    other = subprocess.run([sys.executable, "-c", _DIGEST], capture_output=True, text=True,
                           check=True, env=env).stdout
    assert here.strip() and here == other


@pytest.mark.parametrize("shape", [(2, 1, 0, 5), (2, 0, 5, 5), (2, 1, 5, 0), (2, 5, 5)])
def test_images_without_height_width_or_channel_are_refused(shape):
    images = np.zeros(shape, dtype=np.uint8)
    for name, level in (("rotate", 15), ("roll", 2), ("gaussian_noise", 1)):
        with pytest.raises(ValueError, match=r"images must be non-empty \(N, C, H, W\)"):
            shift_images(images, name, level)


def test_shifted_sets_names_levels_that_are_not_numbers():
    images = np.zeros((1, 1, 4, 4), dtype=np.uint8)
    with pytest.raises(TypeError, match=r"levels must hold numbers, got None in \[None\]"):
        shift.shifted_sets(images, "rotate", [None])
    with pytest.raises(TypeError, match="levels must hold numbers, got '15'"):
        shift.shifted_sets(images, "rotate", [0, "15"])
    assert list(shift.shifted_sets(images, "rotate", [0, 15.0])) == ["rotate:0", "rotate:15"]
