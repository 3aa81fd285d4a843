"""Run store: each run lives in ``<root>/<config hash>/``, stored whole or not at all.

A run folder holds ``config.json``, ``history.json``, ``metrics.json``,
``predictions.npz`` (compressed; float32 logits, int64 labels), ``provenance.json`` and
``manifest.json``: ``{"format": 2, "kind": "run", "config_hash": ..., "files": {name:
sha256}}``. The key is the config hash alone; the chapter that first asked for a run is
only a ``label`` in its provenance, so a run used by several chapters is stored once.

Writing (:func:`write_entry`): under an exclusive lock ``<root>/.locks/<hash>.lock``, the
files go into a temporary sibling folder ``.tmp-<hash>-...``, the manifest last, and the
folder is published with one ``os.rename``. A reader sees no run or a whole one. If an
intact run is already there (another writer was first), the new copy is discarded, so
the store holds exactly one writer's run; an outdated or damaged one is replaced.
Temporary folders left by a killed writer are removed by the next writer of that run.

Reading (:func:`read_entry`): the manifest's format must be :data:`FORMAT`, every file must
match its SHA-256 and ``config.json`` must hash to the folder's name; otherwise
:class:`CorruptRun` (or :class:`OutdatedRun`) names the path and says what to do.

The config hash is ``sha256(canonical JSON)[:12]`` of the config completed and made
canonical by :func:`calnotes.runs.experiment.default_config`; canonical JSON has sorted keys
and no whitespace. The device is not part of a config.
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import platform
import re
import secrets
import shutil
import subprocess
import zipfile
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

import calnotes
from calnotes._checks import check_labels, check_logits
from calnotes._io import file_lock, fsync_dir, scratch_dir, sha256_bytes
from calnotes.runs import experiment as experiments
from calnotes.runs.experiment import RunResult
from calnotes.training import History
from calnotes.training.devices import cpu_features

__all__ = [
    "FORMAT",
    "CorruptRun",
    "OutdatedRun",
    "RunNotFound",
    "RunStore",
    "StoredRun",
    "chapter_run",
    "config_hash",
    "default_checkpoint_root",
    "default_results_root",
    "load_or_run",
    "read_arrays_entry",
    "read_entry",
    "wall_time_text",
    "write_entry",
]

#: Version of the stored format. 1: float16 logits, ``DONE`` marker, folders keyed by
#: experiment name. 2: float32 logits, ``manifest.json`` with SHA-256 checksums, folders
#: keyed by config hash alone, published by one rename.
FORMAT = 2
MANIFEST = "manifest.json"
FILES = ("config.json", "history.json", "metrics.json", "predictions.npz", "provenance.json")
#: Seconds a writer waits for another writer of the same run before giving up.
LOCK_TIMEOUT = 60.0
_HASH = re.compile(r"^[0-9a-f]{12}$")
_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_RECOMPUTE = "recompute it: `make results` (or load_or_run with compute=True) replaces it"


class RunNotFound(KeyError):
    """No stored run for this config."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class CorruptRun(ValueError):
    """A stored run (or OOD logits entry) whose files are damaged or do not match."""


class OutdatedRun(ValueError):
    """A run stored in an older format or layout: it must be recomputed."""


def config_hash(config: Mapping[str, Any]) -> str:
    """First 12 hex digits of ``sha256`` of the canonical JSON of the full config.

    The config is completed and made canonical by
    :func:`calnotes.runs.experiment.default_config` first (``weight_decay=0`` and ``0.0`` are one
    run; unknown keys and wrong types are errors). Canonical JSON: sorted keys, separators
    ``","`` and ``":"``, no NaN.
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    if "device" in config:
        raise ValueError("config must not contain 'device': the device is not part of a run")
    return _digest(experiments.default_config(**config))


def _digest(config: Mapping[str, Any]) -> str:
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=False)
    return sha256_bytes(text.encode("utf-8"))[:12]


def _repo_root() -> Path:
    return Path(calnotes.__file__).resolve().parent.parent


def default_results_root() -> Path:
    """``$CALNOTES_RESULTS`` if set, else ``results/`` at the repository root."""
    env = os.environ.get("CALNOTES_RESULTS")
    return Path(env).expanduser() if env else _repo_root() / "results"


def default_checkpoint_root() -> Path:
    """``$CALNOTES_CHECKPOINTS`` if set, else ``~/.cache/calnotes/checkpoints``."""
    env = os.environ.get("CALNOTES_CHECKPOINTS")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "calnotes" / "checkpoints"


def git_commit() -> str | None:
    """``git rev-parse HEAD`` of the repository holding calnotes, or ``None``."""
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=_repo_root(), capture_output=True, text=True,
            timeout=10, check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = out.stdout.strip()
    return commit if out.returncode == 0 and re.fullmatch(r"[0-9a-f]{40,64}", commit) else None


# --------------------------------------------------------------------------- entries


def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _write_file(path: Path, data: bytes) -> None:
    with open(path, "xb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())


def lock_path(folder: str | os.PathLike) -> Path:
    """The lock file of the entry ``folder``: ``<parent>/.locks/<name>.lock``."""
    folder = Path(folder)
    return folder.parent / ".locks" / f"{folder.name}.lock"


def write_entry(
    folder: str | os.PathLike,
    files: Mapping[str, bytes],
    meta: Mapping[str, Any],
    *,
    lock_timeout: float = LOCK_TIMEOUT,
) -> bool:
    """Publish ``files`` as the folder ``folder``, whole or not at all.

    Under the lock :func:`lock_path`: temporary folders of killed writers are removed; if
    ``folder`` already holds an intact entry nothing is written and ``False`` is returned
    (the first writer wins); otherwise the files and then ``manifest.json`` (``{"format":
    FORMAT, **meta, "files": {name: sha256}}``) are written and flushed to a temporary
    sibling folder, which one ``os.rename`` makes ``folder`` (replacing an outdated or
    damaged entry). Returns ``True`` when this call's files were published.
    """
    folder = Path(folder)
    parent = folder.parent
    if not files or any(not _LABEL.match(name) or name == MANIFEST for name in files):
        raise ValueError(f"files must be plain file names other than {MANIFEST}: {list(files)}")
    manifest = {"format": FORMAT, **meta,
                "files": {name: sha256_bytes(data) for name, data in sorted(files.items())}}
    parent.mkdir(parents=True, exist_ok=True)
    with file_lock(lock_path(folder), timeout=lock_timeout, what=f"saving {folder}"):
        for stale in [*parent.glob(f".tmp-{folder.name}-*"), *parent.glob(f".old-{folder.name}-*")]:
            shutil.rmtree(stale, ignore_errors=True)  # writers hold the lock: these are dead
        old = None
        if folder.exists():
            try:
                read_entry(folder, kind=meta.get("kind"))
                return False
            except (CorruptRun, OutdatedRun):
                old = parent / f".old-{folder.name}-{secrets.token_hex(4)}"
        tmp = parent / f".tmp-{folder.name}-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()
        try:
            for name, data in files.items():
                _write_file(tmp / name, data)
            _write_file(tmp / MANIFEST, _json_bytes(manifest))  # last: the entry is complete
            fsync_dir(tmp)
            if old is not None:
                os.rename(folder, old)
            try:
                os.rename(tmp, folder)
            except BaseException:
                if old is not None:
                    os.rename(old, folder)
                raise
            fsync_dir(parent)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    return True


def read_entry(
    folder: str | os.PathLike, *, kind: str | None = None, remedy: str = _RECOMPUTE
) -> tuple[dict[str, Any], dict[str, bytes]]:
    """``(manifest, {name: bytes})`` of an entry written by :func:`write_entry`, verified.

    Raises :class:`OutdatedRun` for an entry of an older format (format 1's ``DONE`` marker
    without a manifest, or an older ``format``), and :class:`CorruptRun` naming the path for
    a missing or unreadable manifest, a
    manifest of another ``kind``, or a file missing or not matching its recorded SHA-256
    (truncated or changed); the latter's messages end with ``remedy``.
    """
    folder = Path(folder)
    path = folder / MANIFEST
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        if (folder / "DONE").is_file():  # format 1 marked a complete run with DONE
            raise OutdatedRun(
                f"{folder} has no {MANIFEST} but the DONE marker of format 1: it was stored "
                f"by an older calnotes (float16 logits); {_RECOMPUTE}"
            ) from None
        raise CorruptRun(
            f"{folder} has no {MANIFEST}: it was deleted, or the folder was not written by "
            f"calnotes (every stored run has one, written last); {remedy}"
        ) from None
    manifest = parse_json(raw, path, remedy)
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CorruptRun(f"{path} is not a manifest (no 'files'); {remedy}")
    version = manifest.get("format")
    if isinstance(version, int) and not isinstance(version, bool) and version < FORMAT:
        raise OutdatedRun(f"{folder} is stored in format {version}, not {FORMAT}; {_RECOMPUTE}")
    if version != FORMAT:
        raise CorruptRun(f"{path} has format {version!r}; this calnotes reads format {FORMAT}. "
                         "Update calnotes or " + remedy)
    if kind is not None and manifest.get("kind") != kind:
        raise CorruptRun(f"{path} describes a {manifest.get('kind')!r}, not a {kind!r}; {remedy}")
    files = {}
    for name, digest in manifest["files"].items():
        file = folder / name
        if not isinstance(name, str) or not _LABEL.match(name) or name == MANIFEST:
            raise CorruptRun(f"{path} lists an invalid file name {name!r}; {remedy}")
        try:
            data = file.read_bytes()
        except FileNotFoundError:
            raise CorruptRun(f"{file} is missing; {remedy}") from None
        if sha256_bytes(data) != digest:
            raise CorruptRun(
                f"{file} does not match the SHA-256 recorded when it was saved (it is "
                f"truncated or was changed); {remedy}"
            )
        files[name] = data
    return manifest, files


def parse_json(data: bytes, path: Path, remedy: str = _RECOMPUTE) -> Any:
    """``json.loads`` whose errors name ``path`` (:class:`CorruptRun`)."""
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise CorruptRun(f"{path} is not valid JSON ({err}): it is truncated or damaged; "
                         f"{remedy}") from err


def npz_bytes(arrays: Mapping[str, np.ndarray]) -> bytes:
    """A compressed ``.npz`` holding ``arrays``, as bytes."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
    return buffer.getvalue()


def parse_npz(data: bytes, path: Path, remedy: str = _RECOMPUTE) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` (no pickles), with errors that name ``path``."""
    try:
        with np.load(io.BytesIO(data), allow_pickle=False) as npz:
            return {k: npz[k] for k in npz.files}
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError, ValueError, KeyError) as err:
        raise CorruptRun(f"{path} is not a readable .npz ({type(err).__name__}: {err}): it is "
                         f"truncated or damaged; {remedy}") from err


def read_arrays_entry(folder: str | os.PathLike, *, kind: str, file: str,
                      expected: Mapping[str, Any], what: str
                      ) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """``(manifest, arrays)`` of the entry ``folder`` of ``kind`` whose manifest holds
    ``expected`` and whose ``file`` is an ``.npz`` (no pickles); ``None`` where it is not
    stored or stored in an older format (the caller recomputes and rewrites it). A damaged
    entry, or one describing something else (``what``, for the message), raises
    :class:`CorruptRun` naming it and the remedy: delete the folder."""
    folder = Path(folder)
    if not folder.is_dir():
        return None
    remedy = f"delete the folder {folder}; the next call recomputes it"
    try:
        manifest, files = read_entry(folder, kind=kind, remedy=remedy)
    except OutdatedRun:
        return None
    if any(manifest.get(k) != v for k, v in expected.items()) or file not in files:
        raise CorruptRun(f"{folder / MANIFEST} does not describe {what}; {remedy}")
    return manifest, parse_npz(files[file], folder / file, remedy)


# --------------------------------------------------------------------------- runs


def _pack_predictions(logits: Any, labels: Any, prefix: str) -> dict[str, np.ndarray]:
    """float32 ``(N, C)`` logits (what the model computed, so stored numbers are the
    published ones) and int64 labels in ``[0, C)``, checked like any metric's input."""
    z, _ = check_logits(logits, f"{prefix}_logits")
    y = check_labels(labels, z.shape[0], z.shape[1], f"{prefix}_labels")
    return {f"{prefix}_logits": z.detach().cpu().float().numpy(),
            f"{prefix}_labels": y.cpu().numpy()}


def wall_time_text(seconds: float | None) -> str:
    """A wall time as a reader reads it: ``"42 s"`` below 2 minutes, ``"3.5 min"`` below
    2 hours, else ``"2.4 h"``; ``"unknown time"`` for ``None``."""
    if seconds is None:
        return "unknown time"
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


@dataclass
class StoredRun:
    """A run loaded from the store (logits float32, labels int64, on CPU).

    ``label`` names who first stored the run (e.g. a chapter); it is not part of its key.
    """

    label: str | None
    config: dict[str, Any]
    history: History
    metrics: dict[str, float]
    provenance: dict[str, Any]
    val_logits: torch.Tensor | None
    val_labels: torch.Tensor | None
    test_logits: torch.Tensor
    test_labels: torch.Tensor
    path: Path = field(repr=False)

    def provenance_text(self) -> str:
        """One line: device, date, wall time, commit and calnotes version."""
        p = self.provenance
        took = wall_time_text(p.get("seconds"))
        date = str(p.get("date_utc", "unknown date"))[:16].replace("T", " ")
        commit = p.get("git_commit")
        commit = commit[:8] if commit else "uncommitted"
        threads = p.get("cpu_threads")
        device = p.get("device", "unknown device")
        if threads:
            device = f"{device} ({threads} thread{'s' if threads > 1 else ''})"
        return (
            f"Trained on {device} on {date} UTC in {took} "
            f"(calnotes {p.get('calnotes_version', '?')}, commit {commit}, "
            f"torch {p.get('torch', '?')}, config {p.get('config_hash', '?')})."
        )


def _check_label(label: Any) -> str | None:
    if label is not None and (not isinstance(label, str) or not _LABEL.match(label)):
        raise ValueError(
            f"label must be None or a name of letters, digits, '_', '-' or '.', got {label!r}"
        )
    return label


class RunStore:
    """Runs stored under ``root`` (default :func:`default_results_root`), one folder per
    config hash."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a path, got {type(root).__name__}")
        self.root = default_results_root() if root is None else Path(root)

    def __repr__(self) -> str:
        return f"RunStore({str(self.root)!r})"

    def path(self, config: Mapping[str, Any]) -> Path:
        """``root/<config_hash(config)>/``."""
        return self.root / config_hash(config)

    def exists(self, config: Mapping[str, Any]) -> bool:
        """Whether a run of ``config`` is stored (published runs are always complete)."""
        return (self.path(config) / MANIFEST).is_file()

    def _folders(self) -> builtins.list[Path]:
        if not self.root.is_dir():
            return []
        return sorted(p for p in self.root.iterdir()
                      if _HASH.match(p.name) and (p / MANIFEST).is_file())

    def list(self) -> builtins.list[dict[str, Any]]:
        """Configs of every stored run, ordered by hash."""
        return [self._load_folder(folder).config for folder in self._folders()]

    def summary(self) -> pd.DataFrame:
        """One row per stored run: what it is, its test metrics, its cost."""
        rows = []
        for folder in self._folders():
            run = self._load_folder(folder)
            config, metrics, provenance = run.config, run.metrics, run.provenance
            rows.append({
                "run": folder.name, "label": run.label,
                "dataset": config.get("dataset"), "model": config.get("model"),
                "loss": config.get("loss"), "epochs": config.get("epochs"),
                "test_error": metrics.get("test_error"), "test_ece": metrics.get("test_ece"),
                "device": provenance.get("device"), "seconds": provenance.get("seconds"),
            })
        return pd.DataFrame(rows)

    def save(
        self, result: RunResult, *, label: str | None = None, lock_timeout: float = LOCK_TIMEOUT
    ) -> Path:
        """Store ``result`` whole (see :func:`write_entry`) and return its folder.

        ``label`` (e.g. the chapter) is recorded in the provenance. If an intact run of
        this config is already stored, it is kept and ``result`` is discarded.
        """
        if not isinstance(result, RunResult):
            raise TypeError(f"result must be a RunResult, got {type(result).__name__}")
        label = _check_label(label)
        config = experiments.default_config(**result.config)
        digest = _digest(config)
        arrays = _pack_predictions(result.test_logits, result.test_labels, "test")
        if result.val_logits is not None:
            arrays.update(_pack_predictions(result.val_logits, result.val_labels, "val"))
        provenance = {
            "label": label,
            "config_hash": digest,
            "calnotes_version": calnotes.__version__,
            "git_commit": git_commit(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "platform": platform.platform(),
            "device": result.device,
            "seconds": float(result.seconds),
            "cpu_threads": result.threads,
            "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "cpu": cpu_features(),
        }
        if result.fast_path is not None:
            provenance["fast_path"] = dict(result.fast_path)
        files = {
            "config.json": _json_bytes(config),
            "history.json": _json_bytes(result.history.to_dict()),
            "metrics.json": _json_bytes(dict(result.metrics)),
            "predictions.npz": npz_bytes(arrays),
            "provenance.json": _json_bytes(provenance),
        }
        folder = self.root / digest
        write_entry(folder, files, {"kind": "run", "config_hash": digest},
                    lock_timeout=lock_timeout)
        return folder

    def load(self, config: Mapping[str, Any]) -> StoredRun:
        """The stored run of ``config``, verified against its manifest.

        Raises :class:`RunNotFound` if none is stored, :class:`OutdatedRun` for a run of an
        older format or layout, :class:`CorruptRun` (naming the file) for a damaged one.
        """
        digest = config_hash(config)
        folder = self.root / digest
        if not folder.exists():
            old = sorted(p for p in self.root.glob(f"*/{digest}")
                         if not p.parent.name.startswith("."))
            if old:
                raise OutdatedRun(
                    f"run {digest} is stored only in the older layout, at {old[0]} "
                    f"(format 1, float16 logits); {_RECOMPUTE}"
                )
            raise RunNotFound(f"no stored run with config hash {digest} in {self.root}")
        return self._load_folder(folder)

    def _load_folder(self, folder: Path) -> StoredRun:
        remedy = f"delete the folder {folder} and recompute the run (`make results`)"
        manifest, files = read_entry(folder, kind="run", remedy=remedy)
        missing = sorted(set(FILES) - set(files))
        if missing:
            raise CorruptRun(f"{folder / MANIFEST} lists no {missing}; {remedy}")
        config = parse_json(files["config.json"], folder / "config.json", remedy)
        try:
            stored_hash = config_hash(config)
        except (TypeError, ValueError) as err:
            raise CorruptRun(f"{folder / 'config.json'} is not a valid config ({err}); "
                             f"{remedy}") from err
        if stored_hash != folder.name or manifest.get("config_hash") != folder.name:
            raise CorruptRun(
                f"{folder / 'config.json'} hashes to {stored_hash}, not to its folder "
                f"{folder.name}; {remedy}"
            )
        arrays = parse_npz(files["predictions.npz"], folder / "predictions.npz", remedy)
        if "test_logits" not in arrays or "test_labels" not in arrays:
            raise CorruptRun(f"{folder / 'predictions.npz'} lacks the test arrays; {remedy}")
        provenance = parse_json(files["provenance.json"], folder / "provenance.json", remedy)
        try:
            history = History.from_dict(
                parse_json(files["history.json"], folder / "history.json", remedy))
        except (TypeError, ValueError) as err:
            if isinstance(err, CorruptRun):
                raise
            raise CorruptRun(f"{folder / 'history.json'} is not a history ({err}); "
                             f"{remedy}") from err

        def tensor(key: str) -> torch.Tensor | None:
            return torch.from_numpy(arrays[key]) if key in arrays else None

        return StoredRun(
            label=provenance.get("label"),
            config=experiments.default_config(**config),
            history=history,
            metrics=parse_json(files["metrics.json"], folder / "metrics.json", remedy),
            provenance=provenance,
            val_logits=tensor("val_logits"),
            val_labels=tensor("val_labels"),
            test_logits=torch.from_numpy(arrays["test_logits"]),
            test_labels=torch.from_numpy(arrays["test_labels"]),
            path=folder,
        )


def load_or_run(
    config: Mapping[str, Any],
    *,
    label: str | None = None,
    store: RunStore | None = None,
    compute: bool = True,
    device: str | torch.device = "auto",
    checkpoint_root: str | os.PathLike | None = None,
    progress: bool = True,
    lock_timeout: float = LOCK_TIMEOUT,
) -> StoredRun:
    """Load the stored run of ``config`` (missing keys take their defaults), or train it.

    When the run is not stored (or stored in an older format) and ``compute`` is true, it
    is trained by :func:`calnotes.runs.experiment.train_run` with checkpoints in
    ``checkpoint_root/<config hash>`` (so a killed run resumes), saved with ``label`` in
    its provenance, and loaded back. One process trains a config at a time: a second one
    waits ``lock_timeout`` seconds on ``checkpoint_root/<config hash>.lock``, then raises
    ``TimeoutError``. With ``compute=False`` a missing run raises :class:`RunNotFound`
    and an outdated one :class:`OutdatedRun`; a damaged run raises :class:`CorruptRun`
    either way (delete it to recompute it).
    """
    if not isinstance(compute, bool):
        raise TypeError(f"compute must be a bool, got {type(compute).__name__}")
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    store = RunStore() if store is None else store
    if not isinstance(store, RunStore):
        raise TypeError(f"store must be a RunStore, got {type(store).__name__}")
    label = _check_label(label)
    cfg = experiments.default_config(**config)
    digest = config_hash(cfg)
    try:
        return store.load(cfg)
    except RunNotFound:
        if not compute:
            raise RunNotFound(
                f"no stored run with config hash {digest} in {store.root}. Run `make results` "
                "to compute the stored runs, or pass compute=True (USE_STORE=False in a "
                "chapter) to train it now."
            ) from None
    except OutdatedRun:
        if not compute:
            raise
    root = default_checkpoint_root() if checkpoint_root is None else Path(checkpoint_root)
    checkpoints = root / digest
    with file_lock(root / f"{digest}.lock", timeout=lock_timeout,
                   what=f"training run {digest} (checkpoints in {checkpoints}); the run will "
                        "be in the store when it is done"):
        with contextlib.suppress(RunNotFound, OutdatedRun):
            return store.load(cfg)  # trained by another process while we waited
        result = experiments.train_run(
            cfg, device=device, checkpoint_dir=str(checkpoints), progress=progress
        )
        store.save(result, label=label, lock_timeout=lock_timeout)
    return store.load(cfg)


def chapter_run(
    config: dict[str, Any], *, label: str | None = None, use_store: bool, smoke: bool,
    device: str | torch.device = "auto", progress: bool = False,
) -> StoredRun:
    """Load a run from ``results/`` (keyed by its config alone), or compute and store it.

    ``label`` (the chapter) is recorded in the provenance of a run this call stores.
    SMOKE runs and ``USE_STORE=False`` use a fresh temporary store and checkpoint folder,
    so they always recompute and never touch the stored results. The per-batch progress
    bar is off by default: in an executed notebook every update would become output.
    """
    if use_store and not smoke:
        return load_or_run(config, label=label, device=device, progress=progress)
    scratch = scratch_dir("calnotes-runs-")
    return load_or_run(config, label=label, store=RunStore(scratch / "results"),
                       checkpoint_root=scratch / "checkpoints", device=device,
                       progress=progress)
