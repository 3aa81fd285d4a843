"""A stored run on OOD image sets: its trained model and its logits on each set.

:func:`run_ood_logits` gives a stored run's logits on OOD images (cached next to the run,
so the book needs no weights), :func:`trained_model` recovers the run's model from its
checkpoint (or trains it again). Scores and detection metrics are in :mod:`calnotes.ood`.
"""

from __future__ import annotations

import hashlib
import io
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from calnotes import data, models, training
from calnotes._checks import check_positive_int
from calnotes._io import atomic_write
from calnotes.runs import experiment, store

__all__ = ["OOD_LOGITS_FILE", "run_ood_logits", "trained_model"]


#: File, inside a stored run's folder, that caches the run's logits on OOD image sets.
OOD_LOGITS_FILE = "ood_logits.npz"


def _images_digest(images: torch.Tensor) -> str:
    array = images.detach().cpu().contiguous().numpy()
    digest = hashlib.sha256(str(tuple(array.shape)).encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


def _run_stamp(run: Any) -> str:
    """Identifies one training of a stored run: a retrained run gets a new stamp."""
    p = run.provenance
    return f"{p.get('config_hash')}@{p.get('date_utc')}"


def _checkpoint_roots(run: Any, checkpoint_root: str | Path | None) -> list[Path]:
    if checkpoint_root is not None:
        return [Path(checkpoint_root)]
    # calnotes.runs.store.chapter_run keeps the checkpoints of a scratch (SMOKE) store in a
    # "checkpoints" folder next to the store root: look there first
    return [Path(run.path).parents[2] / "checkpoints", store.default_checkpoint_root()]


def _reproduces(model: nn.Module, run: Any, test_loader: Any) -> bool:
    logits, _ = training.predict_logits(model, test_loader)
    return logits.shape == run.test_logits.shape and torch.allclose(
        logits, run.test_logits, rtol=2e-3, atol=2e-3
    )


def trained_model(
    run: Any,
    *,
    device: str | torch.device = "auto",
    checkpoint_root: str | Path | None = None,
    retrain: bool = True,
) -> tuple[nn.Module, Any]:
    """The trained model of a stored run and its dataset splits: ``(model, splits)``.

    The store keeps logits, not weights. The weights come from the run's final training
    checkpoint ``<root>/<config hash>/last.pt``, looked for in ``checkpoint_root`` (default:
    the ``checkpoints`` folder next to the store root, then
    :func:`calnotes.runs.store.default_checkpoint_root`). A checkpoint is used only if its model
    reproduces the stored test logits (to float16 storage precision): one left by another
    training of the same config is skipped. Without a usable checkpoint, ``retrain=True``
    trains the run again in a temporary folder (deterministic on the CPU) and checks the
    result the same way; ``RuntimeError`` if that fails too, ``FileNotFoundError`` if
    ``retrain=False`` and no checkpoint exists. The model is returned in eval mode on
    ``device``.
    """
    if not isinstance(run, store.StoredRun):
        raise TypeError(f"run must be a calnotes.runs.store.StoredRun, got {type(run).__name__}")
    if not isinstance(retrain, bool):
        raise TypeError(f"retrain must be a bool, got {type(retrain).__name__}")
    cfg = experiment.default_config(**run.config)
    digest = store.config_hash(cfg)
    dev = training.select_device(device)
    splits = data.load_dataset(
        cfg["dataset"], val_size=cfg["val_size"], seed=cfg["seed"],
        train_subset=cfg["train_subset"], test_subset=cfg["test_subset"],
    )
    if cfg.get("positive_class") is not None:  # a binary run, as train_run builds it
        splits = data.binary_target(splits, cfg["positive_class"])
    _, _, test_loader = data.make_loaders(splits, batch_size=1000, device=dev)
    roots = _checkpoint_roots(run, checkpoint_root)
    tried = []
    for path in (r / digest / "last.pt" for r in roots):
        if not path.is_file():
            continue
        state = torch.load(path, map_location="cpu", weights_only=True)
        if int(state.get("epoch", -1)) != cfg["epochs"]:
            tried.append(f"{path} (unfinished)")
            continue
        model: nn.Module = models.build_model(
            cfg["model"], splits.num_classes, splits.in_channels, splits.image_size,
            **cfg["model_options"],
        )
        model.load_state_dict(state["model"])
        model = model.to(dev).eval()
        if _reproduces(model, run, test_loader):
            return model, splits
        tried.append(f"{path} (another training: its test logits differ)")
    if not retrain:
        if not tried:
            raise FileNotFoundError(
                f"no checkpoint of run {digest} in {[str(r) for r in roots]}; pass "
                "retrain=True to train it again"
            )
        raise RuntimeError(f"no checkpoint reproduces stored run {digest}: {'; '.join(tried)}")
    with tempfile.TemporaryDirectory(prefix="calnotes-retrain-") as tmp:
        result = experiment.train_run(cfg, device=dev, checkpoint_dir=tmp, progress=False)
    if result.model is None:  # train_run always returns the model; keep mypy informed
        raise RuntimeError("train_run returned no model")
    model = result.model.to(dev).eval()
    if not _reproduces(model, run, test_loader):
        raise RuntimeError(
            f"a retrained model does not reproduce the stored test logits of run {digest} "
            f"({run.path}), e.g. because training is not deterministic on {dev}; tried "
            f"{tried or 'no checkpoint'}. Delete the stored run to train it again."
        )
    return model, splits


def run_ood_logits(
    run: Any,
    images: Mapping[str, torch.Tensor],
    *,
    device: str | torch.device = "auto",
    checkpoint_root: str | Path | None = None,
    batch_size: int = 1000,
) -> dict[str, torch.Tensor]:
    """Logits of a stored run's model on each OOD image set, cached in the run's folder.

    ``images`` maps a set's name to uint8 images ``(N, C, H, W)`` shaped like the run's
    dataset (see :func:`calnotes.data.ood_images`); they are normalized with the run's
    training mean and std, as the in-distribution images were. The logits are kept in
    :data:`OOD_LOGITS_FILE` next to the run (float16, like the store's), keyed by the
    set's name and the SHA-256 of its images, and valid only for this training of the run
    (a retrained run recomputes them). Sets not in the cache need the trained model
    (:func:`trained_model`). Returns ``{name: float32 logits (N, C)}`` on the CPU.
    """
    if not isinstance(run, store.StoredRun):
        raise TypeError(f"run must be a calnotes.runs.store.StoredRun, got {type(run).__name__}")
    if not isinstance(images, Mapping) or not images:
        raise ValueError("images must be a non-empty mapping name -> uint8 images")
    batch_size = check_positive_int(batch_size, "batch_size")
    digests = {}
    for name, x in images.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"image set names must be non-empty str, got {name!r}")
        if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.ndim != 4:
            raise ValueError(f"images[{name!r}] must be a uint8 tensor (N, C, H, W)")
        if x.shape[0] == 0:
            raise ValueError(f"images[{name!r}] is empty")
        digests[name] = _images_digest(x)

    path = Path(run.path) / OOD_LOGITS_FILE
    stamp = _run_stamp(run)
    cache: dict[str, tuple[str, np.ndarray]] = {}
    if path.is_file():
        with np.load(path) as npz:
            if str(npz["stamp"]) == stamp:
                for i, name in enumerate(npz["names"].tolist()):
                    cache[name] = (str(npz[f"sha256_{i}"]), npz[f"logits_{i}"])
    missing = [k for k in images if k not in cache or cache[k][0] != digests[k]]
    if missing:
        model, splits = trained_model(run, device=device, checkpoint_root=checkpoint_root)
        dev = next(iter(model.parameters())).device
        for name in missing:
            x = images[name]
            loader = data.DeviceLoader(
                data.ImageData(x, torch.zeros(x.shape[0], dtype=torch.long)), batch_size,
                shuffle=False, mean=splits.mean, std=splits.std, device=dev,
            )
            logits, _ = training.predict_logits(model, loader)
            cache[name] = (digests[name], _pack_logits(logits.numpy()))
        _save_cache(path, stamp, cache)
    return {k: torch.from_numpy(cache[k][1].astype(np.float32)) for k in images}


def _pack_logits(arr: np.ndarray) -> np.ndarray:
    """float16, or float32 where a value would overflow float16."""
    if arr.size and np.abs(arr).max() >= float(np.finfo(np.float16).max):
        return arr.astype(np.float32)
    return arr.astype(np.float16)


def _save_cache(path: Path, stamp: str, cache: Mapping[str, tuple[str, np.ndarray]]) -> None:
    """Write the cache atomically (never half-written)."""
    names = sorted(cache)
    arrays: dict[str, np.ndarray] = {"stamp": np.array(stamp), "names": np.array(names)}
    for i, name in enumerate(names):
        arrays[f"sha256_{i}"] = np.array(cache[name][0])
        arrays[f"logits_{i}"] = cache[name][1]
    buffer = io.BytesIO()
    np.savez_compressed(buffer, **arrays)  # type: ignore[arg-type]
    atomic_write(path, buffer.getvalue())
