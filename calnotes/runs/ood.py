"""A stored run on OOD image sets: its trained model and its logits on each set.

:func:`run_ood_logits` gives a stored run's logits on OOD images (stored inside the run's
folder, so the book needs no weights), :func:`trained_model` recovers the run's model from its
checkpoint (or trains it again). Scores and detection metrics are in :mod:`calnotes.ood`.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from calnotes import data, models, ood, training
from calnotes._checks import check_positive_float, check_positive_int, model_device
from calnotes.runs import experiment, store

__all__ = [
    "ODIN_LOGITS_FILE",
    "OOD_FOLDER",
    "OOD_LOGITS_FILE",
    "REPRODUCE_TOLERANCE",
    "run_odin_logits",
    "run_ood_logits",
    "reproduces",
    "run_test_images",
    "trained_model",
    "trained_state",
]


#: Folder, inside a stored run's folder, of the run's logits on OOD image sets: one entry
#: ``ood/<first 16 hex digits of the images' SHA-256>/`` per set of images.
OOD_FOLDER = "ood"
#: File of such an entry holding the float32 ``logits`` (compressed npz).
OOD_LOGITS_FILE = "ood_logits.npz"
#: File of an ODIN entry ``ood/<key>/``: the float32 ``logits`` f(x~) of the perturbed images;
#: the key is the SHA-256 of the images' digest, the temperature and the step.
ODIN_LOGITS_FILE = "odin_logits.npz"


def _images_digest(images: torch.Tensor) -> str:
    array = images.detach().cpu().contiguous().numpy()
    digest = hashlib.sha256(str(tuple(array.shape)).encode())
    digest.update(array.tobytes())
    return digest.hexdigest()


def _checkpoint_roots(run: Any, checkpoint_root: str | os.PathLike | None) -> list[Path]:
    if checkpoint_root is not None:
        return [Path(checkpoint_root)]
    # calnotes.runs.store.chapter_run keeps the checkpoints of a scratch (SMOKE) store in a
    # "checkpoints" folder next to the store root (the run's folder is <root>/<hash>)
    return [Path(run.path).parents[1] / "checkpoints", store.default_checkpoint_root()]


#: How close (relative and absolute) a model's test logits must be to a stored run's for the
#: model to count as that run's network: other batch sizes or kernels reorder float32 sums,
#: another training moves logits far more.
REPRODUCE_TOLERANCE = 2e-3


def reproduces(logits: torch.Tensor, run: Any) -> bool:
    """Whether ``logits`` are the stored run's test logits within
    :data:`REPRODUCE_TOLERANCE`."""
    return logits.shape == run.test_logits.shape and torch.allclose(
        logits, run.test_logits, rtol=REPRODUCE_TOLERANCE, atol=REPRODUCE_TOLERANCE)


def _reproduces(model: nn.Module, run: Any, test_loader: Any) -> bool:
    return reproduces(training.predict_logits(model, test_loader)[0], run)


def run_test_images(run: Any) -> torch.Tensor:
    """The test images of a stored run, uint8 ``(N, C, H, W)``, in the order of its stored
    ``test_logits``: the in-distribution set of its OOD tables (e.g. for ODIN)."""
    if not isinstance(run, store.StoredRun):
        raise TypeError(f"run must be a calnotes.runs.store.StoredRun, got {type(run).__name__}")
    images = experiment.load_splits(experiment.default_config(**run.config)).test.images
    if images.shape[0] != run.test_logits.shape[0]:
        raise RuntimeError(f"the test split of run {run.path.name} has {images.shape[0]} "
                           f"images, its stored logits {run.test_logits.shape[0]} rows")
    return images


def trained_model(
    run: Any,
    *,
    device: str | torch.device = "auto",
    checkpoint_root: str | os.PathLike | None = None,
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
    model, _, splits = trained_state(run, device=device, checkpoint_root=checkpoint_root,
                                     retrain=retrain)
    return model, splits


def trained_state(
    run: Any,
    *,
    device: str | torch.device = "auto",
    checkpoint_root: str | os.PathLike | None = None,
    retrain: bool = True,
    must_reproduce: bool = True,
) -> tuple[nn.Module, dict[str, Any], Any]:
    """:func:`trained_model` with the whole final checkpoint it came from:
    ``(model, state, splits)``; ``state`` also holds what the trainer kept beside the model
    (e.g. a meta run's ``"gamma_net"``), read with ``weights_only=True``.

    ``must_reproduce=False`` returns a retrained model even where it does not reproduce the
    stored test logits (a long run trained on another CPU diverges in its last bits): a
    network of the same config, not the stored one; the caller then reads its own logits."""
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

    def model_of(state: Mapping[str, Any]) -> nn.Module:
        model: nn.Module = models.build_model(
            cfg["model"], splits.num_classes, splits.in_channels, splits.image_size,
            **cfg["model_options"],
        )
        model.load_state_dict(state["model"])
        return model.to(dev).eval()

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
        model = model_of(state)
        if _reproduces(model, run, test_loader):
            return model, state, splits
        tried.append(f"{path} (another training: its test logits differ)")
    if not retrain:
        if not tried:
            raise FileNotFoundError(
                f"no checkpoint of run {digest} in {[str(r) for r in roots]}; pass "
                "retrain=True to train it again"
            )
        raise RuntimeError(f"no checkpoint reproduces stored run {digest}: {'; '.join(tried)}")
    with tempfile.TemporaryDirectory(prefix="calnotes-retrain-") as tmp:
        experiment.train_run(cfg, device=dev, checkpoint_dir=tmp, progress=False)
        state = training.load_checkpoint(Path(tmp) / "last.pt")
    model = model_of(state)
    if must_reproduce and not _reproduces(model, run, test_loader):
        raise RuntimeError(
            f"a retrained model does not reproduce the stored test logits of run {digest} "
            f"({run.path}), e.g. because training is not deterministic on {dev}; tried "
            f"{tried or 'no checkpoint'}. Delete the stored run to train it again."
        )
    return model, state, splits


def run_ood_logits(
    run: Any,
    images: Mapping[str, torch.Tensor],
    *,
    device: str | torch.device = "auto",
    checkpoint_root: str | os.PathLike | None = None,
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
    batch_size = check_positive_int(batch_size, "batch_size")
    digests = _check_images(images)

    def compute(model: nn.Module, splits: Any, x: torch.Tensor) -> torch.Tensor:
        loader = data.DeviceLoader(
            data.ImageData(x, torch.zeros(x.shape[0], dtype=torch.long)), batch_size,
            shuffle=False, mean=splits.mean, std=splits.std, device=model_device(model),
        )
        return training.predict_logits(model, loader)[0]

    meta = {name: {"images_sha256": d} for name, d in digests.items()}
    return _stored_logits(run, images, "ood_logits", OOD_LOGITS_FILE, digests, meta, compute,
                          device=device, checkpoint_root=checkpoint_root)


def _stored_logits(
    run: Any,
    images: Mapping[str, torch.Tensor],
    kind: str,
    fname: str,
    keys: Mapping[str, str],
    meta: Mapping[str, dict[str, Any]],
    compute: Callable[[nn.Module, Any, torch.Tensor], torch.Tensor],
    *,
    device: str | torch.device,
    checkpoint_root: str | os.PathLike | None,
) -> dict[str, torch.Tensor]:
    """Each set's logits from its entry ``ood/<keys[name][:16]>`` (of ``kind``, its manifest
    holding ``meta[name]``); sets not stored yet are computed by ``compute(model, splits,
    images)`` with the run's trained model, stored whole, and read back verified."""
    out: dict[str, np.ndarray] = {}
    for name in images:
        found = _read_logits_entry(run, keys[name], kind, fname, meta[name])
        if found is not None:
            out[name] = found
    missing = [name for name in images if name not in out]
    if missing:
        model, splits = trained_model(run, device=device, checkpoint_root=checkpoint_root)
        for name in missing:
            logits = compute(model, splits, images[name])
            store.write_entry(
                _ood_entry(run, keys[name]),
                {fname: store.npz_bytes({"logits": logits.numpy().astype(np.float32)})},
                {"kind": kind, **meta[name], "config_hash": run.path.name},
            )
            # read back verified (another writer may have published the entry first)
            found = _read_logits_entry(run, keys[name], kind, fname, meta[name])
            if found is None:
                raise RuntimeError(f"the {kind} of {name!r} were not stored in {run.path}")
            out[name] = found
    return {name: torch.from_numpy(out[name]) for name in images}


def _ood_entry(run: Any, key: str) -> Path:
    return Path(run.path) / OOD_FOLDER / key[:16]


def _read_logits_entry(run: Any, key: str, kind: str, fname: str,
                       expected: dict[str, Any]) -> np.ndarray | None:
    """The float32 logits of the entry ``ood/<key[:16]>`` of kind ``kind`` whose manifest
    holds ``expected`` (``None`` if not stored or stored in an older format);
    :class:`calnotes.runs.store.CorruptRun` if damaged."""
    folder = _ood_entry(run, key)
    found = store.read_arrays_entry(folder, kind=kind, file=fname, expected=expected,
                                    what="these images' logits")
    if found is None:
        return None
    arrays = found[1]
    remedy = f"delete the folder {folder}; the next call recomputes it"
    logits = arrays.get("logits")
    if logits is None or logits.ndim != 2 or logits.dtype != np.float32:
        raise store.CorruptRun(f"{folder / fname} holds no float32 (N, C) logits; {remedy}")
    return logits


class _PixelInput(nn.Module):
    """``model((u - mean) / std)`` for images ``u`` in [0, 1]: ODIN's step is taken in pixel
    units, as in the ODIN paper (and the LogitNorm code, which divides it by the std)."""

    def __init__(self, model: nn.Module, mean: tuple[float, ...], std: tuple[float, ...],
                 device: torch.device) -> None:
        super().__init__()
        self.model = model
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1)
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        return self.model((u - self.mean) / self.std)


def _check_images(images: Any) -> dict[str, str]:
    """Validate ``name -> uint8 (N, C, H, W)`` and return each set's digest."""
    if not isinstance(images, Mapping) or not images:
        raise ValueError("images must be a non-empty mapping name -> uint8 images")
    digests = {}
    for name, x in images.items():
        if not isinstance(name, str) or not name:
            raise TypeError(f"image set names must be non-empty str, got {name!r}")
        if not isinstance(x, torch.Tensor) or x.dtype != torch.uint8 or x.ndim != 4:
            raise ValueError(f"images[{name!r}] must be a uint8 tensor (N, C, H, W)")
        if x.shape[0] == 0:
            raise ValueError(f"images[{name!r}] is empty")
        digests[name] = _images_digest(x)
    return digests


def run_odin_logits(
    run: Any,
    images: Mapping[str, torch.Tensor],
    *,
    temperature: float = 1000.0,
    epsilon: float = 0.0014,
    device: str | torch.device = "auto",
    checkpoint_root: str | os.PathLike | None = None,
    batch_size: int = 500,
) -> dict[str, torch.Tensor]:
    """Logits ``f(x~)`` of ODIN's perturbed images (:func:`calnotes.ood.odin_logits`) for each
    set of ``images``, stored inside the run's folder like :func:`run_ood_logits`.

    The step ``epsilon`` is in pixel units (images scaled to [0, 1], before the run's
    normalization), as in the ODIN paper: ``x~ = x - epsilon sign(-grad_x log S_max(f(x) /
    T))``. The ODIN score is ``calnotes.ood.msp(logits / temperature)``. ODIN after
    temperature scaling with a fitted ``T_ts`` is ODIN at ``temperature * T_ts`` (the model
    ``f / T_ts`` at ``temperature`` is the model ``f`` at ``temperature * T_ts``). Include the
    in-distribution images (:func:`run_test_images`) to score both sides. Returns
    ``{name: float32 logits (N, C)}`` on the CPU.
    """
    if not isinstance(run, store.StoredRun):
        raise TypeError(f"run must be a calnotes.runs.store.StoredRun, got {type(run).__name__}")
    temperature = check_positive_float(temperature, "temperature")
    epsilon = ood._check_epsilon(epsilon)
    batch_size = check_positive_int(batch_size, "batch_size")
    digests = _check_images(images)
    keys = {name: hashlib.sha256(f"odin|{d}|{temperature!r}|{epsilon!r}".encode()).hexdigest()
            for name, d in digests.items()}
    meta = {name: {"images_sha256": digests[name], "temperature": temperature,
                   "epsilon": epsilon} for name in images}

    def compute(model: nn.Module, splits: Any, x: torch.Tensor) -> torch.Tensor:
        dev = model_device(model)
        pixel_model = _PixelInput(model, splits.mean, splits.std, dev).eval()
        batches = (x[i:i + batch_size].to(dev).float() / 255.0
                   for i in range(0, x.shape[0], batch_size))
        return ood.odin_logits(pixel_model, batches, temperature, epsilon, dev)

    return _stored_logits(run, images, "odin_logits", ODIN_LOGITS_FILE, keys, meta, compute,
                          device=device, checkpoint_root=checkpoint_root)
