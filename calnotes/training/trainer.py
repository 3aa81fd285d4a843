"""Training loop: :class:`Trainer` (progress bar, atomic checkpoints, exact resume) and
:class:`MixupTrainer`. The per-epoch :class:`~.history.History`, checkpoints
(:mod:`~.checkpoint`), prediction (:mod:`~.prediction`), devices (:mod:`~.devices`) and
the precision/layout/compile policy (:mod:`~.fast_path`) live beside it and are
re-exported here.

A *loader* is any iterable of ``(x, y)`` batches (``x`` float ``(B, ...)``, ``y`` int64
``(B,)``). If it has ``set_epoch(epoch)`` the trainer calls it with the 0-based epoch index
before each epoch, so shuffling and augmentation depend only on ``(seed, epoch)``; together
with the RNG states stored in each checkpoint this makes a resumed run end with exactly the
same parameters and history as an uninterrupted one (on CPU; cuDNN kernels may differ).

The default loss is cross-entropy, ``L = -(1/B) sum_i log softmax(z_i)[y_i]``.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from calnotes._checks import (
    check_choice,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
)
from calnotes._threads import auto_threads, cpu_threads
from calnotes.losses import MixupLoss, check_batch, mixup_batch
from calnotes.training.checkpoint import (
    _CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    _atomic_torch_save,
    _check_fingerprint,
    _fingerprint_digest,
    _json_copy,
    _loss_name,
    _rng_state,
    _set_rng_state,
    load_checkpoint,
)
from calnotes.training.devices import describe_device, seed_everything, select_device
from calnotes.training.fast_path import (
    FastPath,
    _autocast,
    _nhwc_pays,
    compile_model,
    regime_key,
    resolve_fast_path,
)
from calnotes.training.history import History
from calnotes.training.prediction import (
    _batch_input,
    _collect_logits,
    _is_channels_last,
    _iter_batches,
    eval_mode,
    predict_logits,
)

__all__ = [
    "CHECKPOINT_NAME",
    "FastPath",
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

# Re-exported helpers the meta trainer and older imports use.
_REEXPORTED = (_CHECKPOINT_FORMAT, _autocast, _nhwc_pays, _is_channels_last, _iter_batches)

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
EpochCallback = Callable[[int, "Trainer", dict], None]

OPTIMIZERS = ("sgd", "adam")
SCHEDULES = ("cosine", "step", "none")
#: Number of equal-width bins of the validation ECE recorded each epoch.
VAL_ECE_BINS = 15


def _check_threads(threads: Any) -> int | str | None:
    if threads is None or threads == "auto":
        return threads
    if isinstance(threads, bool) or not isinstance(threads, (int, np.integer)):
        raise TypeError(f"threads must be 'auto', None or an int, got {threads!r}")
    return check_positive_int(threads, "threads")


# --------------------------------------------------------------------------- trainer



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

    * ``amp``, ``channels_last``, ``compile``: each ``"auto"`` (default), ``True`` or
      ``False``; the rules are :mod:`calnotes.training.fast_path`'s (bfloat16 autocast
      and NHWC where the CPU has bf16 instructions and the regime passed its equivalence
      pilot; float32 elsewhere; ``None`` for ``channels_last`` means ``"auto"``). What was
      chosen is :attr:`fast_path`. Validation always runs in float32. ``False`` for all
      three is the float32 NCHW path exactly as before the fast path (on a CPU without
      bf16 instructions bfloat16 autocast made a ResNet-20 step about 2x slower).
    * ``threads``: intra-op CPU threads during :meth:`fit`. ``"auto"`` (default, CPU
      only) asks ``calnotes._threads.auto_threads`` once per run and keeps the answer
      in the checkpoint, so a resumed run uses the same number; an int sets it; ``None``
      keeps torch's setting. The previous setting is restored when ``fit`` returns.
    * ``compile``: ``torch.compile`` of the forward, its inductor cache kept per
      architecture; ``"auto"`` leaves it off unless the benchmark found it pays.

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
        amp: bool | str = "auto",
        channels_last: bool | str | None = "auto",
        threads: int | str | None = "auto",
        compile: bool | str = "auto",
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
        for flag, value in [("nesterov", nesterov), ("progress", progress)]:
            if not isinstance(value, bool):
                raise TypeError(f"{flag} must be a bool, got {type(value).__name__}")
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

        for name, setting in [("amp", amp), ("channels_last", channels_last)]:
            if setting is True and self.device.type not in ("cpu", "cuda"):
                warnings.warn(f"{name}=True is ignored on device {self.device}", UserWarning,
                              stacklevel=2)
        #: The run config this trainer trains (JSON), part of the checkpoint fingerprint.
        self.run_config = _json_copy(run_config, "run_config")
        #: Precision, layout and compile setting in use, and the regime they were chosen for.
        self.fast_path: FastPath = resolve_fast_path(
            amp, channels_last, compile, device=self.device, model=model,
            regime=regime_key(self.run_config))
        self.amp = self.fast_path.amp
        self.channels_last = self.fast_path.channels_last
        #: Intra-op threads of the last (or current) fit; None before the first.
        self.threads_used: int | None = None
        self.progress = progress
        self.epoch_callback = epoch_callback
        self.loss_fn: LossFn = loss_fn if loss_fn is not None else nn.CrossEntropyLoss()
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)

        self.model = model.to(self.device)
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
        self._forward: Callable[[torch.Tensor], torch.Tensor] = self.model
        if self.fast_path.compile:
            architecture = (self.run_config or {}).get("model") or type(model).__qualname__
            self._forward = compile_model(self.model, str(architecture))
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
            logits, labels = _collect_logits(self._forward, loader, self.device,
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
