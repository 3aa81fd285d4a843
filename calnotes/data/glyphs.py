"""Font glyphs drawn as MNIST-like images, without a font renderer.

A glyph's outline (TrueType or CFF, read with fontTools) is flattened into polygons, each
Bezier segment into :data:`CURVE_STEPS` chords. The polygons are scaled so that the larger
side of their bounding box is ``box`` pixels (aspect ratio kept), filled with the non-zero
winding rule on a ``supersample x supersample`` grid of points per pixel, and the pixel's
grey level is the share of its points inside, ``round(255 * share)``. As for MNIST, the box
is then placed in a ``size x size`` field so that its centre of mass lands at the field's
centre (an integer shift, kept inside the field). Glyphs are white on black.

Everything is float64 arithmetic on the font's own coordinates, so the images depend only on
the font file, not on the FreeType build of an imaging library.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

import numpy as np

from calnotes._checks import check_positive_int

__all__ = ["CURVE_STEPS", "fill_polygons", "glyph_polygons", "place_by_mass", "render_glyphs"]

#: Chords per Bezier segment when an outline is flattened.
CURVE_STEPS = 8


def _pen_class() -> type:
    from fontTools.pens.basePen import BasePen

    class _PolygonPen(BasePen):
        """Collects closed polygons (float64 ``(K, 2)``); components are decomposed."""

        def __init__(self, glyph_set: object) -> None:
            super().__init__(glyph_set)
            self.polygons: list[np.ndarray] = []
            self._points: list[tuple[float, float]] = []

        def _moveTo(self, p: tuple[float, float]) -> None:
            self._flush()
            self._points = [p]

        def _lineTo(self, p: tuple[float, float]) -> None:
            self._points.append(p)

        def _curveToOne(self, p1: tuple[float, float], p2: tuple[float, float],
                        p3: tuple[float, float]) -> None:
            p0 = np.asarray(self._points[-1], dtype=np.float64)
            t = (np.arange(1, CURVE_STEPS + 1) / CURVE_STEPS)[:, None]
            s = 1.0 - t
            pts = (s**3 * p0 + 3 * s * s * t * np.asarray(p1) + 3 * s * t * t * np.asarray(p2)
                   + t**3 * np.asarray(p3))
            self._points.extend(map(tuple, pts))

        def _qCurveToOne(self, p1: tuple[float, float], p2: tuple[float, float]) -> None:
            p0 = np.asarray(self._points[-1], dtype=np.float64)
            t = (np.arange(1, CURVE_STEPS + 1) / CURVE_STEPS)[:, None]
            s = 1.0 - t
            pts = s * s * p0 + 2 * s * t * np.asarray(p1) + t * t * np.asarray(p2)
            self._points.extend(map(tuple, pts))

        def _closePath(self) -> None:
            self._flush()

        def _endPath(self) -> None:
            self._flush()

        def _flush(self) -> None:
            if len(self._points) > 2:
                self.polygons.append(np.asarray(self._points, dtype=np.float64))
            self._points = []

    return _PolygonPen


def glyph_polygons(font: bytes, chars: str, where: str = "font") -> list[list[np.ndarray]]:
    """The flattened outline of each character of ``chars`` in the font file ``font`` (bytes
    of a TrueType or OpenType file): per character, a list of float64 polygons ``(K, 2)`` in
    font units (y up). ``ValueError`` naming ``where`` if the font cannot be read or lacks a
    character or has an empty outline for it."""
    from fontTools.ttLib import TTFont, TTLibError

    if not isinstance(font, (bytes, bytearray)):
        raise TypeError(f"font must be bytes, got {type(font).__name__}")
    pen_class = _pen_class()
    try:
        face = TTFont(io.BytesIO(bytes(font)), lazy=True)
        cmap = face.getBestCmap() or {}
        glyph_set = face.getGlyphSet()
    except (TTLibError, KeyError, ValueError, AssertionError) as exc:
        raise ValueError(f"{where} is not a readable TrueType/OpenType font: {exc}") from exc
    out = []
    for ch in chars:
        name = cmap.get(ord(ch))
        if name is None:
            raise ValueError(f"{where} has no glyph for {ch!r}")
        pen = pen_class(glyph_set)
        glyph_set[name].draw(pen)
        if not pen.polygons:
            raise ValueError(f"{where}: the glyph for {ch!r} has an empty outline")
        out.append(pen.polygons)
    return out


def fill_polygons(polygons: Sequence[np.ndarray], box: int = 20,
                  supersample: int = 8) -> np.ndarray:
    """Coverage ``(h, w)`` in [0, 1] of ``polygons`` (y up) scaled so that the larger side of
    their bounding box is ``box`` pixels; non-zero winding rule, ``supersample**2`` points
    per pixel at ``((i + 1/2) / s, (j + 1/2) / s)``."""
    box = check_positive_int(box, "box")
    ss = check_positive_int(supersample, "supersample")
    if not polygons:
        raise ValueError("polygons is empty")
    pts = np.concatenate(polygons)
    (x0, y0), (x1, y1) = pts.min(axis=0), pts.max(axis=0)
    extent = max(x1 - x0, y1 - y0)
    if not extent > 0:
        raise ValueError("polygons have an empty bounding box")
    scale = box / extent
    w = max(1, math.ceil((x1 - x0) * scale - 1e-9))
    h = max(1, math.ceil((y1 - y0) * scale - 1e-9))
    edges = []
    for p in polygons:
        q = np.vstack([p, p[:1]])
        x, y = (q[:, 0] - x0) * scale, (y1 - q[:, 1]) * scale  # pixel units, y down
        edges.append(np.stack([x[:-1], y[:-1], x[1:], y[1:]], axis=1))
    e = np.concatenate(edges)
    e = e[e[:, 1] != e[:, 3]]  # horizontal edges cross no scanline
    ys = (np.arange(h * ss) + 0.5) / ss
    xs = (np.arange(w * ss) + 0.5) / ss
    ya, yb = e[:, 1], e[:, 3]
    lo, hi = np.minimum(ya, yb), np.maximum(ya, yb)
    rows, idx = np.nonzero((lo[None] <= ys[:, None]) & (ys[:, None] < hi[None]))
    t = (ys[rows] - ya[idx]) / (yb[idx] - ya[idx])
    xc = e[idx, 0] + t * (e[idx, 2] - e[idx, 0])
    direction = np.where(yb[idx] > ya[idx], 1, -1)
    order = np.lexsort((xc, rows))
    rows, xc, direction = rows[order], xc[order], direction[order]
    # winding(row r, x) = sum of the directions of row r's crossings left of x
    stride = w + 4.0
    keys = rows * stride + np.clip(xc, -1.0, w + 1.0)
    cums = np.concatenate([[0], np.cumsum(direction)])
    sample_rows = np.repeat(np.arange(h * ss), w * ss)
    sample_keys = sample_rows * stride + np.tile(xs, h * ss)
    before = np.searchsorted(keys, sample_keys, side="left")
    row_start = np.searchsorted(rows, sample_rows, side="left")
    inside = (cums[before] - cums[row_start]) != 0
    return inside.reshape(h, ss, w, ss).mean(axis=(1, 3))


def place_by_mass(coverage: np.ndarray, size: int = 28) -> np.ndarray:
    """``coverage (h, w)`` in a ``size x size`` uint8 field (``round(255 c)``), shifted by
    whole pixels so that its centre of mass is nearest the field's centre, kept inside."""
    size = check_positive_int(size, "size")
    c = np.asarray(coverage, dtype=np.float64)
    if c.ndim != 2 or c.shape[0] > size or c.shape[1] > size:
        raise ValueError(f"coverage must be 2-d and fit in {size}x{size}, got {c.shape}")
    total = c.sum()
    if not total > 0:
        raise ValueError("coverage is empty")
    h, w = c.shape
    cy = float((c.sum(axis=1) * (np.arange(h) + 0.5)).sum() / total)
    cx = float((c.sum(axis=0) * (np.arange(w) + 0.5)).sum() / total)
    oy = min(max(math.floor(size / 2 - cy + 0.5), 0), size - h)
    ox = min(max(math.floor(size / 2 - cx + 0.5), 0), size - w)
    out = np.zeros((size, size), dtype=np.float64)
    out[oy:oy + h, ox:ox + w] = c
    return np.floor(out * 255.0 + 0.5).astype(np.uint8)


def render_glyphs(font: bytes, chars: str, size: int = 28, box: int = 20,
                  supersample: int = 8, where: str = "font") -> np.ndarray:
    """uint8 ``(len(chars), size, size)``: each character of ``chars`` in the font file
    ``font``, filled into a ``box``-pixel box and centred by mass (see the module)."""
    size = check_positive_int(size, "size")
    box = check_positive_int(box, "box")
    if box > size:
        raise ValueError(f"box ({box}) must not exceed size ({size})")
    return np.stack([place_by_mass(fill_polygons(p, box, supersample), size)
                     for p in glyph_polygons(font, chars, where)])
