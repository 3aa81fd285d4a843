"""A stored run on OOD image sets: its trained model and its logits on each set.

:func:`run_ood_logits` gives a stored run's logits on OOD images (stored inside the run's
folder, so the book needs no weights), :func:`trained_model` recovers the run's model from its
checkpoint (or trains it again). Scores and detection metrics are in :mod:`calnotes.ood`.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from calnotes import data, models, training
from calnotes._checks import check_positive_int, model_device
from calnotes.runs import experiment, store

__all__ = ["OOD_FOLDER", "OOD_LOGITS_FILE", "run_ood_logits", "trained_model"]


#: Folder, inside a stored run's folder, of the run's logits on OOD image sets: one entry
#: ``ood/<first 16 hex digits of the images' SHA-256>/`` per set of images.
OOD_FOLDER = "ood"
#: File of such an entry holding the float32 ``logits`` (compressed npz).
OOD_LOGITS_FILE = "ood_logits.npz"


def _images_digest(images: torch.Tensor) -> str:
    array = images.detach().cpu().contiguous().numpy()
    digest = hashlib.sha256(str(tuple(array.shape)).encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


def _checkpoint_roots(run: Any, checkpoint_root: str | Path | None) -> list[Path]:
    if checkpoint_root is not None:
        return [Path(checkpoint_root)]
    # calnotes.runs.store.chapter_run keeps the checkpoints of a scratch (SMOKE) store in a
    # "checkpoints" folder next to the store root (the run's folder is <root>/<hash>)
    return [Path(run.path).parents[1] / "checkpoints", store.default_checkpoint_root()]


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
    :func:`calnotes.runs.store.default_checkpoint_root`). A checkpoint is used only if it
    was written for the run's whole config and its model reproduces the stored test logits
    (within 2e-3: other batch sizes or kernels reorder float32 sums, while another training
    moves logits far more): one left by another training of the same config is skipped.
    Without a usable checkpoint, ``retrain=True`` trains the run again in a temporary
    folder (deterministic on the CPU) and checks the result the same way; ``RuntimeError``
    if that fails too, ``FileNotFoundError`` if ``retrain=False`` and no checkpoint exists.
    A damaged checkpoint raises ``ValueError`` naming it. The model is returned in eval
    mode on ``device``.
    """
    if not isinstance(run, store.StoredRun):
        raise TypeError(f"run must be a calnotes.runs.store.StoredRun, got {type(run).__name__}")
    if not isinstance(retrain, bool):
        raise TypeError(f"retrain must be a bool, got {type(retrain).__name__}")
    cfg = experiment.default_config(**run.config)
    digest = store.config_hash(cfg)
    dev = training.select_device(device)
    splits = experiment.load_splits(cfg)  # the splits train_run trained the run on
    _, _, test_loader = data.make_loaders(splits, batch_size=1000, device=dev)
    roots = _checkpoint_roots(run, checkpoint_root)
    tried = []
    for path in (r / digest / "last.pt" for r in roots):
        if not path.is_file():
            continue
        state = training.load_checkpoint(path)  # a damaged file: ValueError naming it
        if state["fingerprint"].get("run_config") != cfg:
            tried.append(f"{path} (written for another config)")
            continue
        if int(state["epoch"]) != cfg["epochs"]:
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
    """Logits of a stored run's model on each OOD image set, stored inside the run's folder.

    ``images`` maps a set's name to uint8 images ``(N, C, H, W)`` shaped like the run's
    dataset (see :func:`calnotes.data.ood_images`); they are normalized with the run's
    training mean and std, as the in-distribution images were. The float32 logits of each
    set are an entry ``<run>/ood/<images SHA-256 [:16]>/`` of the run store
    (:func:`calnotes.runs.store.write_entry`: published whole, checksummed, versioned), so
    they go with the run's folder when the run is recomputed. Sets not stored yet need the
    trained model (:func:`trained_model`). A damaged entry raises
    :class:`calnotes.runs.store.CorruptRun` naming it. Returns
    ``{name: float32 logits (N, C)}`` on the CPU.
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

    out: dict[str, np.ndarray] = {}
    for name in images:
        found = _read_ood_logits(run, digests[name])
        if found is not None:
            out[name] = found
    missing = [name for name in images if name not in out]
    if missing:
        model, splits = trained_model(run, device=device, checkpoint_root=checkpoint_root)
        dev = model_device(model)
        for name in missing:
            x = images[name]
            loader = data.DeviceLoader(
                data.ImageData(x, torch.zeros(x.shape[0], dtype=torch.long)), batch_size,
                shuffle=False, mean=splits.mean, std=splits.std, device=dev,
            )
            logits, _ = training.predict_logits(model, loader)
            store.write_entry(
                _ood_entry(run, digests[name]),
                {OOD_LOGITS_FILE: store.npz_bytes({"logits": logits.numpy().astype(np.float32)})},
                {"kind": "ood_logits", "images_sha256": digests[name],
                 "config_hash": run.path.name},
            )
            found = _read_ood_logits(run, digests[name])  # another writer may have won
            if found is None:
                raise RuntimeError(f"the OOD logits of {name!r} were not stored in {run.path}")
            out[name] = found
    return {name: torch.from_numpy(out[name]) for name in images}


def _ood_entry(run: Any, images_sha256: str) -> Path:
    return Path(run.path) / OOD_FOLDER / images_sha256[:16]


def _read_ood_logits(run: Any, images_sha256: str) -> np.ndarray | None:
    """The stored float32 logits of the images with this digest (``None`` if not stored
    or stored in an older format); :class:`calnotes.runs.store.CorruptRun` if damaged."""
    folder = _ood_entry(run, images_sha256)
    if not folder.is_dir():
        return None
    remedy = f"delete the folder {folder}; the next call recomputes it"
    try:
        manifest, files = store.read_entry(folder, kind="ood_logits", remedy=remedy)
    except store.OutdatedRun:
        return None  # recomputed, and replaced by write_entry
    if manifest.get("images_sha256") != images_sha256 or OOD_LOGITS_FILE not in files:
        raise store.CorruptRun(f"{folder / store.MANIFEST} does not describe these images' "
                               f"logits; {remedy}")
    arrays = store.parse_npz(files[OOD_LOGITS_FILE], folder / OOD_LOGITS_FILE, remedy)
    logits = arrays.get("logits")
    if logits is None or logits.ndim != 2 or logits.dtype != np.float32:
        raise store.CorruptRun(f"{folder / OOD_LOGITS_FILE} holds no float32 (N, C) logits; "
                               f"{remedy}")
    return logits
