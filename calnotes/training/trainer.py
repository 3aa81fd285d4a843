"""Training loop: :class:`Trainer` (progress bar, atomic checkpoints, exact resume),
:func:`predict_logits` and the per-epoch :class:`History`.

A *loader* is any iterable of ``(x, y)`` batches (``x`` float ``(B, ...)``, ``y`` int64
``(B,)``). If it has ``set_epoch(epoch)`` the trainer calls it with the 0-based epoch index
before each epoch, so shuffling and augmentation depend only on ``(seed, epoch)``; together
with the RNG states stored in each checkpoint this makes a resumed run end with exactly the
same parameters and history as an uninterrupted one (on CPU; cuDNN kernels may differ).

The default loss is cross-entropy, ``L = -(1/B) sum_i log softmax(z_i)[y_i]``.
"""

from __future__ import annotations

import io
import json
import math
import os
import random
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from calnotes._checks import (
    check_choice,
    check_device,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
    model_device,
)
from calnotes._io import atomic_write, sha256_bytes
from calnotes._threads import auto_threads, cpu_threads
from calnotes.losses import MixupLoss, check_batch, mixup_batch

__all__ = [
    "History",
    "MixupTrainer",
    "Trainer",
    "describe_device",
    "eval_mode",
    "load_checkpoint",
    "predict_logits",
    "seed_everything",
    "select_device",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
EpochCallback = Callable[[int, "Trainer", dict], None]

OPTIMIZERS = ("sgd", "adam")
SCHEDULES = ("cosine", "step", "none")
#: Number of equal-width bins of the validation ECE recorded each epoch.
VAL_ECE_BINS = 15
CHECKPOINT_NAME = "last.pt"
_CHECKPOINT_FORMAT = 1


# --------------------------------------------------------------------------- devices, seeds


def select_device(device: str | torch.device = "auto") -> torch.device:
    """Resolve ``device``: ``"auto"`` is CUDA when available, else CPU; anything else is
    checked by ``calnotes._checks.check_device`` (``ValueError`` for an unknown or
    absent device, ``TypeError`` for a value that is neither a string nor a device)."""
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return check_device(device)


def describe_device(device: str | torch.device) -> str:
    """Human-readable device name, e.g. ``"cpu"`` or ``"cuda:0 (NVIDIA H100 80GB HBM3)"``."""
    dev = select_device(device)
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)})"
    return str(dev)


def seed_everything(seed: int) -> None:
    """Seed Python's ``random``, NumPy's global RNG and torch (CPU and every CUDA device)."""
    seed = check_positive_int(seed, "seed", minimum=0)
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 (the global RNG is what legacy code uses)
    torch.manual_seed(seed)  # also seeds every CUDA device


# --------------------------------------------------------------------------- history


def _plain(value: Any) -> Any:
    """Turn tensors and NumPy scalars into plain Python numbers (JSON-able)."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise ValueError(
                f"history values must be scalars, got a tensor of shape {tuple(value.shape)}"
            )
        return value.item()
    if isinstance(value, np.generic):
        return value.item()
    return value


class History:
    """Per-epoch training records, one dict per epoch.

    Standard keys: ``epoch`` (1-based), ``lr``, ``train_loss``, ``train_acc``, ``val_loss``
    (NLL), ``val_ece`` (15 bins), ``val_acc``, ``val_logit_norm`` (mean ``||z||_2``) and
    ``seconds`` (wall time); an ``epoch_callback`` may add more. ``history["val_ece"]``
    is the column as a list (``None`` where an epoch lacks the key).
    """

    #: Keys that measure wall time and so differ between otherwise identical runs.
    TIME_KEYS: tuple[str, ...] = ("seconds",)

    def __init__(self, records: Iterable[Mapping[str, Any]] | None = None) -> None:
        self.records: list[dict[str, Any]] = []
        for record in records or ():
            self.append(record)

    def append(self, record: Mapping[str, Any]) -> None:
        """Add one epoch's record (a mapping of str keys to scalars)."""
        if not isinstance(record, Mapping):
            raise TypeError(f"record must be a mapping, got {type(record).__name__}")
        clean: dict[str, Any] = {}
        for key, value in record.items():
            if not isinstance(key, str):
                raise TypeError(f"record keys must be str, got {key!r}")
            clean[key] = _plain(value)
        self.records.append(clean)

    @property
    def columns(self) -> list[str]:
        """All keys, in order of first appearance."""
        seen: dict[str, None] = {}
        for record in self.records:
            seen.update(dict.fromkeys(record))
        return list(seen)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.records)

    def __getitem__(self, key: str) -> list[Any]:
        if not isinstance(key, str):
            raise TypeError(f"History columns are indexed by str, got {type(key).__name__}")
        if key not in self.columns:
            raise KeyError(f"no column {key!r} in history; columns are {self.columns}")
        return [record.get(key) for record in self.records]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, History) and self.records == other.records

    def __repr__(self) -> str:
        return f"History({len(self)} epochs, columns={self.columns})"

    def without_timing(self) -> list[dict[str, Any]]:
        """Records without the wall-time keys: equal for runs that trained identically."""
        return [{k: v for k, v in r.items() if k not in self.TIME_KEYS} for r in self.records]

    def to_frame(self):  # -> pandas.DataFrame
        """The records as a ``pandas.DataFrame`` (one row per epoch)."""
        import pandas as pd

        return pd.DataFrame.from_records(self.records, columns=self.columns or None)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able form; :meth:`from_dict` inverts it."""
        return {"records": [dict(r) for r in self.records]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> History:
        """The history that :meth:`to_dict` wrote."""
        if not isinstance(data, Mapping) or "records" not in data:
            raise ValueError("data must be a mapping with a 'records' list (from History.to_dict)")
        return cls(data["records"])


# --------------------------------------------------------------------------- prediction


def _iter_batches(loader: Iterable, name: str) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for batch in loader:
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise ValueError(f"{name} must yield (x, y) pairs, got {type(batch).__name__}")
        x, y = batch
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise TypeError(f"{name} must yield torch tensors (x, y)")
        yield x, y


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode inside the block; its previous train/eval mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def _batch_input(x: torch.Tensor, device: torch.device, channels_last: bool) -> torch.Tensor:
    """A batch of inputs on ``device``, NHWC (``channels_last``) when the model is."""
    x = x.to(device, non_blocking=True)
    if channels_last and x.ndim == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def _collect_logits(
    forward: Callable[[torch.Tensor], torch.Tensor],
    loader: Iterable,
    device: torch.device,
    *,
    amp: bool = False,
    channels_last: bool = False,
    name: str = "loader",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated float32 logits and int64 labels, left on ``device``."""
    chunks, labels = [], []
    with torch.no_grad():
        for x, y in _iter_batches(loader, name):
            x = _batch_input(x, device, channels_last)
            with _autocast(device, amp):
                out = forward(x)
            chunks.append(out.float())
            labels.append(y.to(device, non_blocking=True).long())
    if not chunks:
        raise ValueError(f"{name} yielded no batches")
    return torch.cat(chunks), torch.cat(labels)


def predict_logits(
    model: nn.Module, loader: Iterable, device: str | torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of ``model`` on every batch of ``loader``.

    Runs in eval mode without gradients and restores the model's previous mode. ``device``
    (default: where the model's parameters are) is where batches are moved. Only loaders
    are accepted; wrap raw images in a loader (see ``calnotes.data.make_loaders``).

    Returns ``(logits float32 (N, C), labels int64 (N,))``, both on the CPU.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    dev = model_device(model) if device is None else select_device(device)
    with eval_mode(model):
        logits, labels = _collect_logits(model, loader, dev,
                                         channels_last=_is_channels_last(model))
    if logits.ndim != 2:
        raise ValueError(f"model must output (B, C) logits, got shape {tuple(logits.shape[1:])}")
    return logits.cpu(), labels.cpu()


def _nhwc_pays(model: nn.Module) -> bool:
    """Whether NHWC is the better CPU layout: the model has 2-d convolutions and no batch
    norm. torch's NHWC batch norm on the CPU sums each channel's N H W terms one after the
    other in float32, so its error grows with N H W: one layer's outputs erred 50x more
    than the NCHW kernel's at 128 x 28 x 28 and 670x at 64 x 112 x 112 (torch 2.13)."""
    modules = list(model.modules())
    return any(isinstance(m, nn.Conv2d) for m in modules) and not any(
        isinstance(m, nn.modules.batchnorm._BatchNorm) for m in modules
    )


def _is_channels_last(model: nn.Module) -> bool:
    """Whether the model's 4-d weights (its 2-d convolutions) are stored NHWC."""
    weights = [p for p in model.parameters() if p.ndim == 4]
    return all(p.is_contiguous(memory_format=torch.channels_last) for p in weights) and any(
        not p.is_contiguous() for p in weights  # one input channel: both layouts agree
    )


def _check_threads(threads: Any) -> int | str | None:
    if threads is None or threads == "auto":
        return threads
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads must be 'auto', None or an int, got {threads!r}")
    return check_positive_int(threads, "threads")


def _autocast(device: torch.device, enabled: bool):
    if not enabled:
        return nullcontext()
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16)


# --------------------------------------------------------------------------- trainer



def _atomic_torch_save(obj: Any, path: Path) -> None:
    """``torch.save`` into memory, then an atomic write to ``path``."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    atomic_write(path, buffer.getvalue())


def _rng_state() -> dict[str, Any]:
    name, keys, pos, has_gauss, gauss = np.random.get_state()  # noqa: NPY002
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": [name, torch.from_numpy(np.asarray(keys, dtype=np.int64)), pos, has_gauss, gauss],
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: Mapping[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state(  # noqa: NPY002
        (name, keys.numpy().astype(np.uint32), pos, has_gauss, gauss)
    )
    random.setstate(state["python"])
    cuda = state.get("cuda")
    if cuda is not None and torch.cuda.is_available() and len(cuda) == torch.cuda.device_count():
        torch.cuda.set_rng_state_all(cuda)


def _loss_name(loss_fn: Any) -> str:
    """Identify a loss for the checkpoint fingerprint (function/class name, module repr)."""
    target = getattr(loss_fn, "func", loss_fn)  # unwrap functools.partial
    kind = target if hasattr(target, "__qualname__") else type(target)
    name = f"{getattr(kind, '__module__', '?')}.{kind.__qualname__}"
    if isinstance(loss_fn, nn.Module):
        name += f" {loss_fn!r}"
    return name


class Trainer:
    """Mini-batch training with validation, progress bar and resumable checkpoints.

    Each epoch: ``loader.set_epoch(e)`` (0-based), one pass of ``loss_fn(model(x), y)``
    with the chosen optimizer, validation (NLL, ECE with 15 bins, accuracy of
    ``softmax(z)``), ``epoch_callback(epoch, trainer, record)`` (1-based ``epoch``; it may
    add keys to ``record``), a scheduler step, and, with ``checkpoint_dir``, an atomic
    checkpoint ``checkpoint_dir/last.pt``. ``fit`` resumes from that checkpoint when it
    exists and refuses one written with a different configuration.

    Schedules: ``"cosine"`` is ``lr_e = lr (1 + cos(pi e / E)) / 2`` for epoch ``e`` of
    ``E``; ``"step"`` multiplies by ``gamma`` at each milestone (epochs, or fractions of
    ``epochs`` in (0, 1); default ``(0.5, 0.75)``); ``"none"`` keeps ``lr``.
    ``grad_clip``: rescale the gradient of the batch's loss to norm ``grad_clip`` when it
    is longer (``torch.nn.utils.clip_grad_norm_`` over all parameters, before the
    optimizer adds weight decay and momentum); ``None`` (default) leaves it alone.
    Speed options:

    * ``amp`` (bfloat16 autocast): CUDA only, ignored with a warning elsewhere (on a CPU
      without bf16 instructions it made a ResNet-20 step about 2x slower).
    * ``channels_last``: NHWC weights and activations, the layout oneDNN's CPU
      convolutions compute in. ``None`` (default): on for CPU models with 2-d
      convolutions and no batch norm (LeNet-5; results agree with NCHW up to float32
      rounding), off otherwise and on CUDA. ``True`` forces it, also for batch-norm
      models, where torch's NHWC batch norm sums less accurately (see ``_nhwc_pays``).
    * ``threads``: intra-op CPU threads during :meth:`fit`. ``"auto"`` (default, CPU
      only) asks ``calnotes._threads.auto_threads`` once per run and keeps the answer
      in the checkpoint, so a resumed run uses the same number; an int sets it; ``None``
      keeps torch's setting. The previous setting is restored when ``fit`` returns.
    * ``compile``: ``torch.compile``, off by default (on a 2-core CPU a ResNet-20 step ran
      1.35x faster after 31 s of compiling, paid again in every run: more than the
      steps of a chapter's runs save).

    ``run_config`` (e.g. a :func:`calnotes.runs.experiment.default_config`) describes the
    whole run, data included: a checkpoint is resumed only by a trainer of the same
    ``run_config``.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn | None = None,
        *,
        optimizer: str = "sgd",
        lr: float = 0.1,
        momentum: float = 0.9,
        nesterov: bool = False,
        weight_decay: float = 5e-4,
        schedule: str = "cosine",
        milestones: Sequence[float] | None = None,
        gamma: float = 0.1,
        epochs: int = 30,
        grad_clip: float | None = None,
        device: str | torch.device = "auto",
        amp: bool = False,
        channels_last: bool | None = None,
        threads: int | str | None = "auto",
        compile: bool = False,
        checkpoint_dir: str | os.PathLike | None = None,
        progress: bool = True,
        seed: int = 0,
        epoch_callback: EpochCallback | None = None,
        run_config: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError(
                f"loss_fn must be callable(logits, labels), got {type(loss_fn).__name__}"
            )
        if epoch_callback is not None and not callable(epoch_callback):
            raise TypeError("epoch_callback must be callable(epoch, trainer, record)")
        for flag, value in [("nesterov", nesterov), ("amp", amp), ("compile", compile),
                            ("progress", progress)]:
            if not isinstance(value, bool):
                raise TypeError(f"{flag} must be a bool, got {type(value).__name__}")
        if channels_last is not None and not isinstance(channels_last, bool):
            raise TypeError(
                f"channels_last must be a bool or None, got {type(channels_last).__name__}"
            )
        self.threads = _check_threads(threads)
        self.optimizer_name = check_choice(optimizer, "optimizer", OPTIMIZERS)
        self.schedule = check_choice(schedule, "schedule", SCHEDULES)
        self.lr = check_positive_float(lr, "lr")
        self.momentum = check_nonnegative_float(momentum, "momentum")
        if self.momentum >= 1:
            raise ValueError(f"momentum must be < 1, got {self.momentum}")
        if nesterov and (self.optimizer_name != "sgd" or self.momentum == 0):
            raise ValueError("nesterov=True needs optimizer='sgd' with momentum > 0")
        self.nesterov = nesterov
        self.weight_decay = check_nonnegative_float(weight_decay, "weight_decay")
        self.gamma = check_positive_float(gamma, "gamma")
        self.epochs = check_positive_int(epochs, "epochs")
        self.grad_clip = None if grad_clip is None else check_positive_float(grad_clip,
                                                                             "grad_clip")
        self.seed = check_positive_int(seed, "seed", minimum=0)
        self.milestones = self._resolve_milestones(milestones)
        self.device = select_device(device)

        on_cuda = self.device.type == "cuda"
        if amp and not on_cuda:
            warnings.warn(f"amp=True is ignored on device {self.device}", UserWarning,
                          stacklevel=2)
        if channels_last and self.device.type not in ("cpu", "cuda"):
            warnings.warn(f"channels_last=True is ignored on device {self.device}",
                          UserWarning, stacklevel=2)
        self.amp = amp and on_cuda
        if channels_last is None:
            channels_last = self.device.type == "cpu" and _nhwc_pays(model)
        self.channels_last = channels_last and self.device.type in ("cpu", "cuda")
        #: Intra-op threads of the last (or current) fit; None before the first.
        self.threads_used: int | None = None
        self.progress = progress
        self.epoch_callback = epoch_callback
        self.loss_fn: LossFn = loss_fn if loss_fn is not None else nn.CrossEntropyLoss()
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)
        #: The whole run config this trainer trains (JSON), part of the checkpoint fingerprint.
        self.run_config = _json_copy(run_config, "run_config")

        self.model = model.to(self.device)
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self._forward: Callable[[torch.Tensor], torch.Tensor] = self.model
        if compile:
            if hasattr(torch, "compile"):
                self._forward = torch.compile(self.model)
            else:
                warnings.warn("compile=True is ignored: torch.compile is unavailable", UserWarning,
                              stacklevel=2)
        self.optimizer = self._make_optimizer()
        self.scheduler = self._make_scheduler()
        self.history = History()
        #: Number of completed epochs.
        self.epoch = 0

    # ------------------------------------------------------------------ construction

    def _resolve_milestones(self, milestones: Sequence[float] | None) -> tuple[int, ...]:
        if self.schedule != "step":
            if milestones is not None:
                raise ValueError("milestones only apply to schedule='step'")
            return ()
        defaulted = milestones is None
        if milestones is None:
            milestones = (0.5, 0.75)
        if isinstance(milestones, (str, bytes)) or not isinstance(milestones, Sequence):
            raise TypeError("milestones must be a sequence of epochs or fractions of epochs")
        resolved = []
        for m in milestones:
            if isinstance(m, bool) or not isinstance(m, (int, float, np.integer, np.floating)):
                raise TypeError(f"milestones must hold numbers, got {m!r}")
            if isinstance(m, (float, np.floating)) and 0 < m < 1:
                epoch = max(1, round(float(m) * self.epochs))
            elif float(m) == int(m) and 1 <= m <= self.epochs:
                epoch = int(m)
            else:
                raise ValueError(
                    f"milestones must be fractions in (0, 1) or epochs in [1, {self.epochs}], "
                    f"got {m!r}"
                )
            resolved.append(epoch)
        if defaulted:  # with very few epochs the default fractions may round together
            resolved = sorted(set(resolved))
        if any(b <= a for a, b in zip(resolved, resolved[1:], strict=False)):
            raise ValueError(f"milestones must be strictly increasing, got {list(milestones)}")
        return tuple(resolved)

    def _make_optimizer(self) -> torch.optim.Optimizer:
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("model has no trainable parameters")
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(params, lr=self.lr, momentum=self.momentum,
                                   nesterov=self.nesterov, weight_decay=self.weight_decay)
        return torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay)

    def _make_scheduler(self) -> torch.optim.lr_scheduler.LRScheduler | None:
        if self.schedule == "cosine":
            return torch.optim.lr_scheduler.CosineAnnealingLR(self.optimizer, T_max=self.epochs)
        if self.schedule == "step":
            return torch.optim.lr_scheduler.MultiStepLR(
                self.optimizer, milestones=list(self.milestones), gamma=self.gamma
            )
        return None

    def fingerprint(self) -> dict[str, Any]:
        """The configuration a checkpoint must match to be resumed (JSON-able)."""
        clip = {} if self.grad_clip is None else {"grad_clip": self.grad_clip}
        return {
            **clip,  # absent unless set: checkpoints written before it existed still resume
            "model": type(self.model).__qualname__,
            "parameters": [[n, list(p.shape)] for n, p in self.model.named_parameters()],
            "loss_fn": _loss_name(self.loss_fn),
            "optimizer": self.optimizer_name,
            "lr": self.lr,
            "momentum": self.momentum,
            "nesterov": self.nesterov,
            "weight_decay": self.weight_decay,
            "schedule": self.schedule,
            "milestones": list(self.milestones),
            "gamma": self.gamma,
            "epochs": self.epochs,
            "amp": self.amp,
            "seed": self.seed,
            "run_config": self.run_config,
        }

    # ------------------------------------------------------------------ checkpoints

    @property
    def checkpoint_path(self) -> Path | None:
        return None if self.checkpoint_dir is None else self.checkpoint_dir / CHECKPOINT_NAME

    def save_checkpoint(self) -> Path:
        """Write ``checkpoint_dir/last.pt`` atomically (temporary file + ``os.replace``)."""
        path = self.checkpoint_path
        if path is None:
            raise ValueError("checkpoint_dir was not given")
        path.parent.mkdir(parents=True, exist_ok=True)
        fingerprint = self.fingerprint()
        state = {
            "format": _CHECKPOINT_FORMAT,
            "fingerprint": fingerprint,
            "fingerprint_sha256": _fingerprint_digest(fingerprint),
            "epoch": self.epoch,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "history": self.history.to_dict(),
            "rng": _rng_state(),
            "threads": self.threads_used,
            **self._extra_state(),
        }
        _atomic_torch_save(state, path)
        return path

    def _load_checkpoint(self, path: Path) -> None:
        state = load_checkpoint(path)
        _check_fingerprint(state, self.fingerprint(), path)
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.history = History.from_dict(state["history"])
        self.epoch = int(state["epoch"])
        if self.threads == "auto" and state.get("threads") is not None:
            self.threads_used = int(state["threads"])
        self._load_extra_state(state)
        _set_rng_state(state["rng"])

    # ------------------------------------------------------------------ hooks for subclasses

    def _train_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step on a batch; returns ``(loss, logits)``, detached."""
        with _autocast(self.device, self.amp):
            logits = self._forward(x)
        logits = logits.float()
        check_batch(logits, y)  # a clear error for labels any loss_fn would choke on
        loss = self.loss_fn(logits, y)
        self._optimizer_step(loss)
        return loss.detach(), logits.detach()

    def _optimizer_step(self, loss: torch.Tensor) -> None:
        """Backward of ``loss``, the gradient clipped to norm ``grad_clip``, one step."""
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.grad_clip is not None:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.grad_clip)
        self.optimizer.step()

    def _input(self, x: torch.Tensor) -> torch.Tensor:
        """A batch of inputs on the device, NHWC when the model is."""
        return _batch_input(x, self.device, self.channels_last)

    def _extend_record(self, record: dict[str, Any]) -> None:
        """Add fields to an epoch's record after validation (none here)."""

    def _extra_state(self) -> dict[str, Any]:
        """More state for the checkpoint (none here)."""
        return {}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`_extra_state` saved."""

    # ------------------------------------------------------------------ training

    def fit(self, train_loader: Iterable, val_loader: Iterable | None = None) -> History:
        """Train until ``epochs`` epochs are done and return the :class:`History`.

        With ``checkpoint_dir`` and an existing ``last.pt`` the run resumes from it (model,
        optimizer, scheduler, history and RNG states). A fresh run first seeds torch's
        global RNG with ``seed`` (dropout and other in-model randomness).
        """
        from tqdm.auto import tqdm

        path = self.checkpoint_path
        if path is not None and path.exists():
            self._load_checkpoint(path)
        elif self.epoch == 0:
            torch.manual_seed(self.seed)
        if self.epoch >= self.epochs:
            return self.history
        with cpu_threads(self._threads_for_fit()) as threads:
            self.threads_used = threads
            return self._fit_epochs(train_loader, val_loader, tqdm)

    def _threads_for_fit(self) -> int | None:
        """Threads for this fit: an int as given; ``"auto"`` on the CPU: those a resumed
        checkpoint recorded, else ``auto_threads()``."""
        if self.threads == "auto":
            if self.device.type != "cpu":
                return None
            return self.threads_used or auto_threads()
        return cast(int | None, self.threads)

    def _fit_epochs(self, train_loader: Iterable, val_loader: Iterable | None,
                    tqdm: Any) -> History:
        try:
            n_batches: int | None = len(train_loader)  # type: ignore[arg-type]
        except TypeError:
            n_batches = None

        bar = tqdm(total=self.epochs, initial=self.epoch, desc="epochs", unit="epoch",
                   disable=not self.progress, dynamic_ncols=True)
        try:
            while self.epoch < self.epochs:
                record = self._run_epoch(train_loader, val_loader, n_batches, tqdm)
                bar.update(1)
                bar.set_postfix({k: f"{v:.4g}" for k, v in record.items()
                                 if k in ("train_loss", "val_loss", "val_acc", "val_ece")})
        finally:
            bar.close()
        return self.history

    def _run_epoch(self, train_loader, val_loader, n_batches, tqdm) -> dict[str, Any]:
        index = self.epoch  # 0-based
        start = time.perf_counter()
        if hasattr(train_loader, "set_epoch"):
            train_loader.set_epoch(index)
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.model.train()
        loss_sum = torch.zeros((), device=self.device, dtype=torch.float64)
        correct = torch.zeros((), device=self.device, dtype=torch.int64)
        seen = 0
        batches = tqdm(_iter_batches(train_loader, "train_loader"), total=n_batches, leave=False,
                       desc=f"epoch {index + 1}/{self.epochs}", disable=not self.progress,
                       dynamic_ncols=True)
        for x, y in batches:
            x = self._input(x)
            y = y.to(self.device, non_blocking=True)
            loss, logits = self._train_step(x, y)
            n = y.shape[0]
            loss_sum += loss.double() * n
            correct += (logits.argmax(dim=1) == y).sum()
            seen += n
        if seen == 0:
            raise ValueError("train_loader yielded no batches")
        train_loss, n_correct = torch.stack([loss_sum, correct.double()]).tolist()  # one sync
        if not math.isfinite(train_loss):
            raise FloatingPointError(
                f"training diverged: train loss is {train_loss} in epoch {index + 1}; "
                "lower lr or check the loss"
            )
        record: dict[str, Any] = {
            "epoch": index + 1,
            "lr": lr,
            "train_loss": train_loss / seen,
            "train_acc": n_correct / seen,
        }
        if val_loader is not None:
            record.update(self.validate(val_loader))
        self._extend_record(record)
        record["seconds"] = time.perf_counter() - start
        if self.epoch_callback is not None:
            self.epoch_callback(index + 1, self, record)
            record["seconds"] = time.perf_counter() - start
        self.history.append(record)
        if self.scheduler is not None:
            self.scheduler.step()
        self.epoch = index + 1
        if self.checkpoint_dir is not None:
            self.save_checkpoint()
        return record

    def validate(self, loader: Iterable) -> dict[str, float]:
        """``val_loss`` (NLL), ``val_ece`` (15 bins), ``val_acc`` and ``val_logit_norm``.

        Computed on ``softmax(z)`` of the whole loader in eval mode; the train/eval mode of
        the model is restored afterwards.
        """
        with eval_mode(self.model):
            logits, labels = _collect_logits(self._forward, loader, self.device, amp=self.amp,
                                             channels_last=self.channels_last, name="val_loader")
        return self._validation_metrics(logits, labels)

    def _validation_metrics(self, logits: torch.Tensor, labels: torch.Tensor) -> dict[str, float]:
        from calnotes import metrics

        probs = torch.softmax(logits, dim=1)
        values = torch.stack([
            torch.as_tensor(metrics.nll(probs, labels), dtype=torch.float64, device=self.device),
            torch.as_tensor(metrics.ece(probs, labels, n_bins=VAL_ECE_BINS), dtype=torch.float64,
                            device=self.device),
            1 - torch.as_tensor(metrics.error(probs, labels), dtype=torch.float64,
                                device=self.device),
            logits.double().norm(dim=1).mean(),
        ]).tolist()
        return dict(zip(("val_loss", "val_ece", "val_acc", "val_logit_norm"), values, strict=True))




def load_checkpoint(path: str | os.PathLike) -> dict[str, Any]:
    """The state saved in a calnotes checkpoint (``torch.load`` with ``weights_only=True``).

    A truncated or damaged file raises ``ValueError`` naming it, never a bare
    ``EOFError``, ``RuntimeError`` or ``UnpicklingError``.
    """
    path = Path(path)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise
    except Exception as err:  # torch raises RuntimeError, EOFError, UnpicklingError, ...
        raise ValueError(
            f"checkpoint {path} cannot be read ({type(err).__name__}: {err}); it is truncated "
            "or damaged. Delete it to train this run from the start."
        ) from err
    if not isinstance(state, dict) or state.get("format") != _CHECKPOINT_FORMAT:
        found = state.get("format") if isinstance(state, dict) else type(state).__name__
        raise ValueError(f"{path} is not a calnotes checkpoint (format {found})")
    missing = sorted({"fingerprint", "fingerprint_sha256", "epoch", "model"} - set(state))
    if missing:
        raise ValueError(f"checkpoint {path} lacks {missing}; it is damaged. Delete it.")
    return state


def _json_copy(value: Mapping[str, Any] | None, name: str) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be a dict, got {type(value).__name__}")
    try:
        return json.loads(json.dumps(value, sort_keys=True, allow_nan=False))
    except (TypeError, ValueError) as err:
        raise TypeError(f"{name} must be JSON-able: {err}") from err


def _check_fingerprint(state: Mapping[str, Any], mine: dict[str, Any], path: Path) -> None:
    """Refuse to resume a checkpoint written with another configuration, naming the fields
    (the keys of ``run_config`` one by one)."""
    if state["fingerprint_sha256"] == _fingerprint_digest(mine):
        return
    theirs = dict(state["fingerprint"])
    mine = dict(mine)
    for fp in (theirs, mine):
        config = fp.pop("run_config", None)
        for key, value in (config or {}).items():
            fp[f"run_config.{key}"] = value
    diff = [
        f"{k}: checkpoint {theirs.get(k)!r} vs now {mine.get(k)!r}"
        for k in sorted(set(mine) | set(theirs))
        if mine.get(k) != theirs.get(k)
    ]
    raise ValueError(
        f"checkpoint {path} was written with a different configuration "
        f"({'; '.join(diff)}). Delete it or use another checkpoint_dir."
    )

def _fingerprint_digest(fingerprint: Any) -> str:
    """SHA-256 of the fingerprint's JSON (sorted keys, compact separators)."""
    return sha256_bytes(json.dumps(fingerprint, sort_keys=True, separators=(",", ":")).encode())


# --------------------------------------------------------------------------- mixup


class MixupTrainer(Trainer):
    """:class:`Trainer` that trains on mixup batches (Zhang et al. 2018).

    Each training batch becomes ``x~ = lam x + (1 - lam) x[perm]`` with
    ``lam ~ Beta(alpha, alpha)`` (:func:`calnotes.losses.mixup_batch`) and the loss is
    ``lam * base(z, y) + (1 - lam) * base(z, y[perm])`` (:class:`calnotes.losses.MixupLoss`,
    ``base = loss_fn``, cross-entropy by default). Validation is on clean batches.
    ``lam`` and ``perm`` come from a CPU generator seeded with ``seed`` whose state is
    checkpointed, so a resumed run draws the same batches. ``train_acc`` counts agreement
    with ``y`` (the first of the two labels).
    """

    def __init__(self, model: nn.Module, loss_fn: LossFn | None = None, *, alpha: float = 0.2,
                 **options: Any) -> None:
        self.alpha = check_positive_float(alpha, "alpha")
        super().__init__(model, loss_fn, **options)
        self.mixup_loss = MixupLoss(self.loss_fn)  # type: ignore[arg-type]
        self.generator = torch.Generator().manual_seed(self.seed)

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "trainer": "mixup", "alpha": self.alpha}

    def _train_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_mixed, y_a, y_b, lam = mixup_batch(x.float(), y, self.alpha, self.generator)
        with _autocast(self.device, self.amp):
            logits = self._forward(cast(torch.Tensor, x_mixed))
        logits = logits.float()
        check_batch(logits, y)  # y_b is a permutation of y
        loss = self.mixup_loss(logits, y_a, y_b, lam)
        self._optimizer_step(loss)
        return loss.detach(), logits.detach()

    def _extra_state(self) -> dict[str, Any]:
        return {"mixup_generator": self.generator.get_state()}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.generator.set_state(state["mixup_generator"])
