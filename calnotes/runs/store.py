"""Run store: each run lives in ``<root>/<experiment>/<config hash>/``.

A run directory holds ``config.json``, ``history.json``, ``metrics.json``,
``predictions.npz`` (float16 logits, integer labels) and ``provenance.json``, followed by
an empty ``DONE`` marker. Every file is written to a temporary file in the same folder and
moved into place with ``os.replace``, and ``DONE`` comes last, so a run interrupted while
saving is never mistaken for a complete one.

The config hash is ``sha256(canonical JSON)[:12]`` where canonical JSON has sorted keys and
no whitespace; the device is not part of a config.
"""

from __future__ import annotations

import builtins
import hashlib
import io
import json
import os
import platform
import re
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

import calnotes
from calnotes._io import atomic_write as _atomic_write
from calnotes.runs import experiment as experiments
from calnotes.runs.experiment import RunResult
from calnotes.training import History

__all__ = [
    "RunNotFound",
    "RunStore",
    "StoredRun",
    "chapter_run",
    "config_hash",
    "default_checkpoint_root",
    "default_results_root",
    "load_or_run",
]

FILES = ("config.json", "history.json", "metrics.json", "predictions.npz", "provenance.json")
DONE = "DONE"
_EXPERIMENT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_FLOAT16_MAX = float(np.finfo(np.float16).max)


class RunNotFound(KeyError):
    """No complete stored run for this experiment and config."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


def config_hash(config: Mapping[str, Any]) -> str:
    """First 12 hex digits of ``sha256`` of the canonical JSON of ``config``.

    Canonical JSON: sorted keys, separators ``","`` and ``":"``, no NaN. Key order therefore
    does not matter, and tuples hash like lists.
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    if "device" in config:
        raise ValueError("config must not contain 'device': the device is not part of a run")
    try:
        text = json.dumps(config, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except TypeError as err:
        raise TypeError(f"config must be JSON-able: {err}") from err
    except ValueError as err:
        raise ValueError(f"config must not contain NaN or inf: {err}") from err
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


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



def _json_bytes(obj: Any) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode("utf-8")


def _to_numpy(x: Any, name: str) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().cpu().numpy()
    if isinstance(x, np.ndarray):
        return x
    raise TypeError(f"{name} must be a torch.Tensor or numpy.ndarray, got {type(x).__name__}")


def _pack_logits(x: Any, name: str) -> np.ndarray:
    """float16 (half the size of float32), or float32 if a value would overflow float16."""
    arr = _to_numpy(x, name)
    if arr.ndim != 2 or not np.issubdtype(arr.dtype, np.floating):
        raise ValueError(f"{name} must be float (N, C) logits, got {arr.dtype} {arr.shape}")
    if arr.size and np.abs(arr).max() >= _FLOAT16_MAX:
        return arr.astype(np.float32)
    return arr.astype(np.float16)


def _pack_labels(y: Any, name: str) -> np.ndarray:
    arr = _to_numpy(y, name)
    if arr.ndim != 1 or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"{name} must be integer (N,) labels, got {arr.dtype} {arr.shape}")
    small = arr.size == 0 or (arr.min() >= 0 and arr.max() <= np.iinfo(np.int16).max)
    return arr.astype(np.int16 if small else np.int64)


@dataclass
class StoredRun:
    """A complete run loaded from the store (logits float32, labels int64, on CPU)."""

    experiment: str
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
        seconds = p.get("seconds")
        if seconds is None:
            took = "unknown time"
        elif seconds < 120:
            took = f"{seconds:.0f} s"
        elif seconds < 7200:
            took = f"{seconds / 60:.1f} min"
        else:
            took = f"{seconds / 3600:.1f} h"
        date = str(p.get("date_utc", "unknown date"))[:16].replace("T", " ")
        commit = p.get("git_commit")
        commit = commit[:8] if commit else "uncommitted"
        return (
            f"Trained on {p.get('device', 'unknown device')} on {date} UTC in {took} "
            f"(calnotes {p.get('calnotes_version', '?')}, commit {commit}, "
            f"torch {p.get('torch', '?')}, config {p.get('config_hash', '?')})."
        )


class RunStore:
    """Runs stored under ``root`` (default :func:`default_results_root`)."""

    def __init__(self, root: str | os.PathLike | None = None) -> None:
        if root is not None and not isinstance(root, (str, os.PathLike)):
            raise TypeError(f"root must be a path, got {type(root).__name__}")
        self.root = default_results_root() if root is None else Path(root)

    def __repr__(self) -> str:
        return f"RunStore({str(self.root)!r})"

    @staticmethod
    def _check_experiment(experiment: Any) -> str:
        if not isinstance(experiment, str) or not _EXPERIMENT_NAME.match(experiment):
            raise ValueError(
                "experiment must be a folder name of letters, digits, '_', '-' or '.', "
                f"got {experiment!r}"
            )
        return experiment

    def path(self, experiment: str, config: Mapping[str, Any]) -> Path:
        """``root/<experiment>/<config_hash(config)>/``."""
        return self.root / self._check_experiment(experiment) / config_hash(config)

    def exists(self, experiment: str, config: Mapping[str, Any]) -> bool:
        """Whether a complete run (with its ``DONE`` marker) is stored."""
        return (self.path(experiment, config) / DONE).is_file()

    def list(self, experiment: str) -> builtins.list[dict[str, Any]]:
        """Configs of the complete runs of ``experiment``, ordered by hash."""
        folder = self.root / self._check_experiment(experiment)
        if not folder.is_dir():
            return []
        return [
            json.loads((run / "config.json").read_text(encoding="utf-8"))
            for run in sorted(folder.iterdir())
            if (run / DONE).is_file()
        ]

    def summary(self) -> pd.DataFrame:
        """One row per complete run in the store: what it is, its test metrics, its cost."""
        rows = []
        for done in sorted(self.root.glob(f"*/*/{DONE}")):
            folder = done.parent
            config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
            metrics = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
            provenance = json.loads((folder / "provenance.json").read_text(encoding="utf-8"))
            rows.append({
                "experiment": folder.parent.name, "run": folder.name,
                "dataset": config.get("dataset"), "model": config.get("model"),
                "loss": config.get("loss"), "epochs": config.get("epochs"),
                "test_error": metrics.get("test_error"), "test_ece": metrics.get("test_ece"),
                "device": provenance.get("device"), "seconds": provenance.get("seconds"),
            })
        return pd.DataFrame(rows)

    def save(self, experiment: str, result: RunResult) -> Path:
        """Write ``result`` atomically file by file, ``DONE`` last; returns the run folder."""
        if not isinstance(result, RunResult):
            raise TypeError(f"result must be a RunResult, got {type(result).__name__}")
        digest = config_hash(result.config)
        folder = self.path(experiment, result.config)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / DONE).unlink(missing_ok=True)  # incomplete until everything is rewritten

        arrays = {
            "test_logits": _pack_logits(result.test_logits, "test_logits"),
            "test_labels": _pack_labels(result.test_labels, "test_labels"),
        }
        if result.val_logits is not None:
            arrays["val_logits"] = _pack_logits(result.val_logits, "val_logits")
            arrays["val_labels"] = _pack_labels(result.val_labels, "val_labels")
        buffer = io.BytesIO()
        np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
        provenance = {
            "experiment": experiment,
            "config_hash": digest,
            "calnotes_version": calnotes.__version__,
            "git_commit": git_commit(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "platform": platform.platform(),
            "device": result.device,
            "seconds": float(result.seconds),
            "date_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        }
        _atomic_write(folder / "config.json", _json_bytes(result.config))
        _atomic_write(folder / "history.json", _json_bytes(result.history.to_dict()))
        _atomic_write(folder / "metrics.json", _json_bytes(dict(result.metrics)))
        _atomic_write(folder / "predictions.npz", buffer.getvalue())
        _atomic_write(folder / "provenance.json", _json_bytes(provenance))
        _atomic_write(folder / DONE, b"")
        return folder

    def load(self, experiment: str, config: Mapping[str, Any]) -> StoredRun:
        """The stored run, or :class:`RunNotFound` if it is missing or incomplete."""
        folder = self.path(experiment, config)
        if not (folder / DONE).is_file():
            raise RunNotFound(
                f"no complete run of experiment {experiment!r} with config hash "
                f"{config_hash(config)} in {self.root}"
            )

        def read(name: str) -> Any:
            return json.loads((folder / name).read_text(encoding="utf-8"))

        with np.load(folder / "predictions.npz") as npz:
            arrays = {k: npz[k] for k in npz.files}

        def logits(key: str) -> torch.Tensor:
            return torch.from_numpy(arrays[key].astype(np.float32))

        def labels(key: str) -> torch.Tensor:
            return torch.from_numpy(arrays[key].astype(np.int64))

        has_val = "val_logits" in arrays

        return StoredRun(
            experiment=experiment,
            config=read("config.json"),
            history=History.from_dict(read("history.json")),
            metrics=read("metrics.json"),
            provenance=read("provenance.json"),
            val_logits=logits("val_logits") if has_val else None,
            val_labels=labels("val_labels") if has_val else None,
            test_logits=logits("test_logits"),
            test_labels=labels("test_labels"),
            path=folder,
        )


def load_or_run(
    experiment: str,
    config: Mapping[str, Any],
    *,
    store: RunStore | None = None,
    compute: bool = True,
    device: str | torch.device = "auto",
    checkpoint_root: str | os.PathLike | None = None,
    progress: bool = True,
) -> StoredRun:
    """Load the stored run of ``config`` (missing keys take their defaults), or train it.

    When the run is not stored and ``compute`` is true, it is trained by
    :func:`calnotes.runs.experiment.train_run` with checkpoints in
    ``checkpoint_root/<config hash>`` (so a killed run resumes), saved, and loaded back.
    With ``compute=False`` a missing run raises :class:`RunNotFound`.
    """
    if not isinstance(compute, bool):
        raise TypeError(f"compute must be a bool, got {type(compute).__name__}")
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    store = RunStore() if store is None else store
    if not isinstance(store, RunStore):
        raise TypeError(f"store must be a RunStore, got {type(store).__name__}")
    cfg = experiments.default_config(**config)
    if store.exists(experiment, cfg):
        return store.load(experiment, cfg)
    if not compute:
        raise RunNotFound(
            f"no stored run of experiment {experiment!r} with config hash {config_hash(cfg)} "
            f"in {store.root}. Run `make results` to compute the stored runs, or pass "
            "compute=True (USE_STORE=False in a chapter) to train it now."
        )
    root = default_checkpoint_root() if checkpoint_root is None else Path(checkpoint_root)
    result = experiments.train_run(
        cfg, device=device, checkpoint_dir=str(root / config_hash(cfg)), progress=progress
    )
    store.save(experiment, result)
    return store.load(experiment, result.config)


def chapter_run(
    experiment: str, config: dict[str, Any], *, use_store: bool, smoke: bool,
    device: str | torch.device = "auto", progress: bool = False,
) -> StoredRun:
    """Load a chapter's run from ``results/``, or compute it (and store it there).

    SMOKE runs and ``USE_STORE=False`` use a fresh temporary store and checkpoint folder,
    so they always recompute and never touch the stored results. The per-batch progress
    bar is off by default: in an executed notebook every update would become output.
    """
    if use_store and not smoke:
        return load_or_run(experiment, config, device=device, progress=progress)
    scratch = Path(tempfile.mkdtemp(prefix="calnotes-runs-"))
    return load_or_run(experiment, config, store=RunStore(scratch / "results"),
                       checkpoint_root=scratch / "checkpoints", device=device,
                       progress=progress)
