r"""Meta-regularization (after Wang & Golebiowski, "Towards Unbiased Calibration using
Meta-Regularization"): a small gamma-Net chooses a per-sample focal-loss ``gamma`` and is
trained so that one step of focal-loss training improves a smooth calibration error on
held-out data.

gamma-Net (:class:`GammaNet`) reads the backbone's penultimate features ``x in R^d``,
detached from the backbone graph:

.. math::
    a = x A,\quad p = \mathrm{softmax}(a),\quad \tilde x = p A^\top,\quad
    \gamma = |\tilde x W| / \tau + \epsilon,

with ``A in R^{d x k}`` (``k`` heads), ``W in R^{d x 1}`` and the floor ``epsilon = 1e-6``.

One step of :class:`MetaTrainer` on a training batch ``(x, y)`` and a validation batch
``(x_v, y_v)``, with selected backbone parameters ``theta`` (the classifier head, or the
whole network) and gamma-Net parameters ``phi``:

1. ``gamma_i = g_phi(f(x_i))`` from detached features;
2. look-ahead (virtual) SGD step, kept differentiable in ``phi``:
   ``theta'(phi) = theta - alpha grad_theta (1/B) sum_i FL(z_i(theta), y_i; gamma_i)`` with
   ``FL = -(1 - p_y)^gamma log p_y``;
3. outer loss ``L_out(phi) = SECE(softmax(z_v(theta'(phi))), y_v)`` (or DECE) and one Adam
   step of ``phi`` on ``d L_out / d phi`` (second-order, through ``theta'``);
4. the real backbone step (SGD with momentum and weight decay) on the focal loss with the
   gammas recomputed by the updated gamma-Net, detached.

Without the look-ahead step (2) the validation SECE does not depend on gamma-Net at all:
the validation predictions are a function of the backbone parameters only, and ``gamma``
enters solely through the training loss. The look-ahead is what makes ``d L_out / d phi``
non-zero, which is why it is essential.

The paper publishes no code, so this module is our reading of it. The virtual step is plain
SGD (no momentum or weight decay, which do not depend on ``gamma``); its step size
``inner_lr`` defaults to the backbone's current (scheduled) learning rate. Batch-norm
running statistics are left untouched by the virtual and validation forwards (they run on
copies of the buffers); only the real step (4) updates them.
"""

from __future__ import annotations

import math
import os
import time
import warnings
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from calnotes._checks import (
    check_choice,
    check_nonnegative_float,
    check_positive_float,
    check_positive_int,
)
from calnotes.losses import _dece, focal_loss
from calnotes.metrics import sece
from calnotes.training import (
    CHECKPOINT_NAME,
    SCHEDULES,
    VAL_ECE_BINS,
    History,
    Trainer,
    _atomic_torch_save,
    _autocast,
    _check_fingerprint,
    _collect_logits,
    _iter_batches,
    _rng_state,
    _set_rng_state,
    _sha256,
    select_device,
)

__all__ = ["GammaNet", "MetaTrainer", "GAMMA_FLOOR"]

#: Added to every gamma so it is strictly positive even where ``x~ W = 0``.
GAMMA_FLOOR = 1e-6
OUTER_LOSSES = ("sece", "dece")
INNER_PARAMS = ("head", "all")
_CHECKPOINT_FORMAT = 1
MetaEpochCallback = Callable[[int, "MetaTrainer", dict], None]


class GammaNet(nn.Module):
    r"""Per-sample focal ``gamma`` from penultimate features (attention over ``heads`` keys).

    ``a = x A``, ``p = softmax(a)``, ``x~ = p A^T``, ``gamma = |x~ W| / tau + 1e-6``.
    ``x~`` is a convex combination of the columns of ``A``, so for any finite input
    ``gamma <= max_m |A_m . W| / tau + 1e-6``: bounded, finite and strictly positive.
    Input ``(N, in_features)`` float, output ``(N,)``. ``A ~ N(0, 1/d)`` and ``W ~ N(0, 1)``
    at initialization, so initial gammas are of order 1.
    """

    def __init__(self, in_features: int, heads: int = 8, tau: float = 1.0) -> None:
        super().__init__()
        self.in_features = check_positive_int(in_features, "in_features")
        self.heads = check_positive_int(heads, "heads")
        self.tau = check_positive_float(tau, "tau")
        self.A = nn.Parameter(torch.randn(self.in_features, self.heads) / math.sqrt(in_features))
        self.W = nn.Parameter(torch.randn(self.in_features, 1))

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        if not isinstance(features, torch.Tensor):
            raise TypeError(f"features must be a torch.Tensor, got {type(features).__name__}")
        if features.ndim != 2 or features.shape[1] != self.in_features:
            raise ValueError(
                f"features must have shape (N, {self.in_features}), got {tuple(features.shape)}"
            )
        if not torch.is_floating_point(features):
            raise TypeError(f"features must have a floating-point dtype, got {features.dtype}")
        a = features.to(self.A.dtype) @ self.A
        p = torch.softmax(a, dim=1)
        mixed = p @ self.A.t()
        return (mixed @ self.W).squeeze(1).abs() / self.tau + GAMMA_FLOOR

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, heads={self.heads}, tau={self.tau}"


def _widen(t: torch.Tensor) -> torch.Tensor:
    """Half-precision (autocast) outputs to float32; float32/float64 stay as they are."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


class _Features(nn.Module):
    """``forward = model.features`` so :func:`functional_call` can swap buffers in."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model.features(x)


class MetaTrainer:
    """Train ``model`` with a focal loss whose per-sample gamma comes from ``gamma_net``.

    See the module docstring for the four parts of each step. ``model`` must have
    ``features(x) -> (B, d)`` and ``head`` (an ``nn.Linear``) with ``forward = head o
    features`` (as from :func:`calnotes.models.build_model`). The backbone uses SGD
    (``lr``, ``momentum``, ``weight_decay``) with ``schedule`` (``"cosine"``, ``"step"``
    with ``milestones`` and factor ``lr_decay``, or ``"none"``), gamma-Net Adam with
    ``meta_lr``. ``outer`` picks the validation loss: ``"sece"`` (Gaussian-kernel SECE with
    ``sece_bandwidth``) or ``"dece"`` (15-bin differentiable ECE). ``inner_params`` is
    ``"head"`` or ``"all"``: which parameters the look-ahead step moves.

    Per-epoch records: ``epoch``, ``lr``, ``train_loss`` (focal), ``train_acc``,
    ``val_loss`` (NLL), ``val_ece`` (15 bins), ``val_acc``, ``val_logit_norm``,
    ``outer_loss`` (mean over the epoch's steps, before each gamma-Net update),
    ``gamma_mean`` and ``gamma_std`` (population std) of gamma on the test samples (the
    validation samples without a test loader), and ``seconds``.

    ``val_loader`` is cycled for the outer batches: on exhaustion it is iterated again. Each
    pass over it starts inside a forked torch RNG seeded from ``(seed, pass)``, and the pass
    and position are checkpointed, so resuming is exact for any loader whose order depends
    only on that RNG (fixed order, or a ``DataLoader`` with ``shuffle=True``).
    Checkpoints (``checkpoint_dir/last.pt``, atomic, every epoch) hold the model, gamma-Net,
    both optimizers, the scheduler, the history, RNG states and the cycling position.
    """

    def __init__(
        self,
        model: nn.Module,
        gamma_net: GammaNet,
        *,
        outer: str = "sece",
        inner_params: str = "head",
        inner_lr: float | None = None,
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        meta_lr: float = 1e-3,
        schedule: str = "cosine",
        milestones: Sequence[float] | None = None,
        lr_decay: float = 0.1,
        epochs: int = 30,
        device: str | torch.device = "auto",
        amp: bool = False,
        checkpoint_dir: str | os.PathLike | None = None,
        progress: bool = True,
        seed: int = 0,
        sece_bandwidth: float = 0.05,
        epoch_callback: MetaEpochCallback | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not callable(getattr(model, "features", None)) or not isinstance(
            getattr(model, "head", None), nn.Linear
        ):
            raise ValueError("model must have features(x) and an nn.Linear head")
        if not isinstance(gamma_net, nn.Module):
            raise TypeError(f"gamma_net must be a torch.nn.Module, got {type(gamma_net).__name__}")
        if epoch_callback is not None and not callable(epoch_callback):
            raise TypeError("epoch_callback must be callable(epoch, trainer, record)")
        for flag, value in [("amp", amp), ("progress", progress)]:
            if not isinstance(value, bool):
                raise TypeError(f"{flag} must be a bool, got {type(value).__name__}")
        self.outer = check_choice(outer, "outer", OUTER_LOSSES)
        self.inner_params = check_choice(inner_params, "inner_params", INNER_PARAMS)
        self.inner_lr = None if inner_lr is None else check_positive_float(inner_lr, "inner_lr")
        self.lr = check_positive_float(lr, "lr")
        self.momentum = check_nonnegative_float(momentum, "momentum")
        if self.momentum >= 1:
            raise ValueError(f"momentum must be < 1, got {self.momentum}")
        self.weight_decay = check_nonnegative_float(weight_decay, "weight_decay")
        self.meta_lr = check_positive_float(meta_lr, "meta_lr")
        self.schedule = check_choice(schedule, "schedule", SCHEDULES)
        self.lr_decay = check_positive_float(lr_decay, "lr_decay")
        self.gamma = self.lr_decay  # the step-schedule factor, as Trainer._make_scheduler reads it
        self.epochs = check_positive_int(epochs, "epochs")
        self.seed = check_positive_int(seed, "seed", minimum=0)
        self.sece_bandwidth = check_positive_float(sece_bandwidth, "sece_bandwidth")
        # Same milestone rules as Trainer (it reads only .schedule and .epochs).
        self.milestones = Trainer._resolve_milestones(self, milestones)  # type: ignore[arg-type]
        self.device = select_device(device)
        if amp and self.device.type != "cuda":
            warnings.warn(f"amp=True is ignored on device {self.device}", UserWarning, stacklevel=2)
        self.amp = amp and self.device.type == "cuda"
        self.progress = progress
        self.epoch_callback = epoch_callback
        self.checkpoint_dir = None if checkpoint_dir is None else Path(checkpoint_dir)

        self.model = model.to(self.device)
        self.gamma_net = gamma_net.to(self.device)
        self._features = _Features(self.model)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("model has no trainable parameters")
        meta_params = [p for p in self.gamma_net.parameters() if p.requires_grad]
        if not meta_params:
            raise ValueError("gamma_net has no trainable parameters")
        self.optimizer = torch.optim.SGD(params, lr=self.lr, momentum=self.momentum,
                                         weight_decay=self.weight_decay)
        self.meta_optimizer = torch.optim.Adam(meta_params, lr=self.meta_lr)
        self.scheduler = Trainer._make_scheduler(self)  # type: ignore[arg-type]
        self.history = History()
        #: Number of completed epochs.
        self.epoch = 0
        #: Validation-loader cycling: completed passes and batches taken in the current one.
        self.val_cycle = 0
        self.val_position = 0
        self._val_iter: Iterator | None = None

    # ------------------------------------------------------------------ configuration

    def fingerprint(self) -> dict[str, Any]:
        """The configuration a checkpoint must match to be resumed (JSON-able)."""
        return {
            "model": type(self.model).__qualname__,
            "parameters": [[n, list(p.shape)] for n, p in self.model.named_parameters()],
            "gamma_net": [[n, list(p.shape)] for n, p in self.gamma_net.named_parameters()],
            "gamma_net_repr": repr(self.gamma_net),
            "outer": self.outer,
            "inner_params": self.inner_params,
            "inner_lr": self.inner_lr,
            "lr": self.lr,
            "momentum": self.momentum,
            "weight_decay": self.weight_decay,
            "meta_lr": self.meta_lr,
            "schedule": self.schedule,
            "milestones": list(self.milestones),
            "lr_decay": self.lr_decay,
            "epochs": self.epochs,
            "amp": self.amp,
            "seed": self.seed,
            "sece_bandwidth": self.sece_bandwidth,
        }

    @property
    def checkpoint_path(self) -> Path | None:
        return None if self.checkpoint_dir is None else self.checkpoint_dir / CHECKPOINT_NAME

    def save_checkpoint(self) -> Path:
        """Write ``checkpoint_dir/last.pt`` atomically."""
        path = self.checkpoint_path
        if path is None:
            raise ValueError("checkpoint_dir was not given")
        fingerprint = self.fingerprint()
        state = {
            "format": _CHECKPOINT_FORMAT,
            "kind": "meta",
            "fingerprint": fingerprint,
            "fingerprint_sha256": _sha256(fingerprint),
            "epoch": self.epoch,
            "model": self.model.state_dict(),
            "gamma_net": self.gamma_net.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "meta_optimizer": self.meta_optimizer.state_dict(),
            "scheduler": None if self.scheduler is None else self.scheduler.state_dict(),
            "history": self.history.to_dict(),
            "rng": _rng_state(),
            "val_cycle": self.val_cycle,
            "val_position": self.val_position,
        }
        _atomic_torch_save(state, path)
        return path

    def _load_checkpoint(self, path: Path) -> None:
        state = torch.load(path, map_location="cpu", weights_only=True)
        if state.get("format") != _CHECKPOINT_FORMAT or state.get("kind") != "meta":
            raise ValueError(f"{path} is not a calnotes meta-regularization checkpoint")
        _check_fingerprint(state, self.fingerprint(), path)
        self.model.load_state_dict(state["model"])
        self.gamma_net.load_state_dict(state["gamma_net"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.meta_optimizer.load_state_dict(state["meta_optimizer"])
        if self.scheduler is not None:
            self.scheduler.load_state_dict(state["scheduler"])
        self.history = History.from_dict(state["history"])
        self.epoch = int(state["epoch"])
        self.val_cycle = int(state["val_cycle"])
        self.val_position = int(state["val_position"])
        self._val_iter = None
        _set_rng_state(state["rng"])

    # ------------------------------------------------------------------ pieces of a step

    def _buffers(self) -> dict[str, torch.Tensor]:
        """Copies of the model's buffers: forwards that must not touch running stats."""
        return {n: b.clone() for n, b in self.model.named_buffers()}

    def _detached_features(self, x: torch.Tensor) -> torch.Tensor:
        bufs = {f"model.{n}": b for n, b in self._buffers().items()}
        with torch.no_grad(), _autocast(self.device, self.amp):
            return _widen(functional_call(self._features, bufs, (x,)))

    def _selected(self) -> dict[str, torch.Tensor]:
        if self.inner_params == "head":
            return {n: p for n, p in self.model.head.named_parameters() if p.requires_grad}
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def _virtual_logits(
        self, params: dict[str, torch.Tensor], x: torch.Tensor, feats: torch.Tensor | None
    ) -> torch.Tensor:
        """Logits with ``params`` substituted (head on ``feats``, or the whole model)."""
        with _autocast(self.device, self.amp):
            if self.inner_params == "head":
                out = functional_call(self.model.head, params, (feats,))
            else:
                out = functional_call(self.model, {**self._buffers(), **params}, (x,))
        return _widen(out)

    def _outer_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        probs = F.softmax(logits, dim=1)
        if self.outer == "sece":
            return sece(probs, labels, bandwidth=self.sece_bandwidth)
        return _dece(probs, labels, VAL_ECE_BINS, 1e-4, 0.01)

    def hypergradient(
        self, x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor,
        inner_lr: float, *, look_ahead: bool = True,
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """Steps (1)-(3) without the update: ``(outer loss, d outer / d gamma-Net params)``.

        ``look_ahead=False`` evaluates the outer loss at the current parameters (no virtual
        step); its gradient is then ``None`` (zero) for every gamma-Net parameter.
        """
        feats = self._detached_features(x)
        gamma = self.gamma_net(feats)
        params = self._selected()
        if look_ahead:
            inner = focal_loss(self._virtual_logits(params, x, feats), y, gamma)
            grads = torch.autograd.grad(inner, list(params.values()), create_graph=True,
                                        allow_unused=True)
            params = {n: p if g is None else p - inner_lr * g
                      for (n, p), g in zip(params.items(), grads, strict=True)}
        val_feats = self._detached_features(x_val) if self.inner_params == "head" else None
        outer = self._outer_loss(self._virtual_logits(params, x_val, val_feats), y_val)
        meta_params = [p for p in self.gamma_net.parameters() if p.requires_grad]
        hyper = torch.autograd.grad(outer, meta_params, allow_unused=True)
        return outer.detach(), list(hyper)

    def _next_val_batch(self, val_loader: Iterable) -> tuple[torch.Tensor, torch.Tensor]:
        for _ in range(2):
            if self._val_iter is None:
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(self.seed * 1_000_003 + self.val_cycle)
                    it = iter(_iter_batches(val_loader, "val_loader"))
                    first = next(it, None)  # samplers draw their seed on the first batch
                    for _ in range(self.val_position):
                        first = next(it, None)
                self._val_iter = it
                batch = first
            else:
                batch = next(self._val_iter, None)
            if batch is not None:
                self.val_position += 1
                return batch
            if self.val_position == 0:
                raise ValueError("val_loader yielded no batches")
            self._val_iter = None
            self.val_cycle += 1
            self.val_position = 0
        raise ValueError("val_loader yielded no batches")  # pragma: no cover

    def train_step(
        self, x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One meta step (1)-(4); returns ``(focal loss, logits, outer loss)``, detached."""
        lr_now = float(self.optimizer.param_groups[0]["lr"])
        inner_lr = lr_now if self.inner_lr is None else self.inner_lr
        outer, hyper = self.hypergradient(x, y, x_val, y_val, inner_lr)
        meta_params = [p for p in self.gamma_net.parameters() if p.requires_grad]
        self.meta_optimizer.zero_grad(set_to_none=True)
        for p, g in zip(meta_params, hyper, strict=True):
            p.grad = torch.zeros_like(p) if g is None else g
        self.meta_optimizer.step()
        return (*self.real_step(x, y), outer)

    def real_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step (4): SGD on ``FL(model(x), y; gamma_net(features).detach())``."""
        with _autocast(self.device, self.amp):
            feats = self.model.features(x)
            logits = _widen(self.model.head(feats))
        with torch.no_grad():
            gamma = self.gamma_net(_widen(feats.detach()))
        loss = focal_loss(logits, y, gamma)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.detach(), logits.detach()

    # ------------------------------------------------------------------ training

    def fit(
        self, train_loader: Iterable, val_loader: Iterable, test_loader: Iterable | None = None
    ) -> History:
        """Train until ``epochs`` epochs are done and return the :class:`History`.

        Resumes from ``checkpoint_dir/last.pt`` when it exists (refusing a checkpoint of a
        different configuration); a fresh run first seeds torch's global RNG with ``seed``.
        """
        from tqdm.auto import tqdm

        if val_loader is None:
            raise ValueError("val_loader is required: it supplies the outer (meta) batches")
        path = self.checkpoint_path
        if path is not None and path.exists():
            self._load_checkpoint(path)
        elif self.epoch == 0:
            torch.manual_seed(self.seed)
        if self.epoch >= self.epochs:
            return self.history
        try:
            n_batches: int | None = len(train_loader)  # type: ignore[arg-type]
        except TypeError:
            n_batches = None
        bar = tqdm(total=self.epochs, initial=self.epoch, desc="meta epochs", unit="epoch",
                   disable=not self.progress, dynamic_ncols=True)
        try:
            while self.epoch < self.epochs:
                record = self._run_epoch(train_loader, val_loader, test_loader, n_batches, tqdm)
                bar.update(1)
                bar.set_postfix({k: f"{v:.4g}" for k, v in record.items()
                                 if k in ("train_loss", "val_acc", "val_ece", "gamma_mean")})
        finally:
            bar.close()
        return self.history

    def _run_epoch(self, train_loader, val_loader, test_loader, n_batches, tqdm) -> dict:
        index = self.epoch
        start = time.perf_counter()
        if hasattr(train_loader, "set_epoch"):
            train_loader.set_epoch(index)
        lr = float(self.optimizer.param_groups[0]["lr"])
        self.model.train()
        self.gamma_net.train()
        sums = torch.zeros(3, device=self.device, dtype=torch.float64)  # loss, correct, outer
        seen = steps = 0
        batches = tqdm(_iter_batches(train_loader, "train_loader"), total=n_batches, leave=False,
                       desc=f"epoch {index + 1}/{self.epochs}", disable=not self.progress,
                       dynamic_ncols=True)
        for x, y in batches:
            xv, yv = self._next_val_batch(val_loader)
            x, y = x.to(self.device), y.to(self.device).long()
            xv, yv = xv.to(self.device), yv.to(self.device).long()
            loss, logits, outer = self.train_step(x, y, xv, yv)
            n = y.shape[0]
            sums += torch.stack([loss.double() * n, (logits.argmax(1) == y).sum().double(),
                                 outer.double()])
            seen += n
            steps += 1
        if seen == 0:
            raise ValueError("train_loader yielded no batches")
        train_loss, n_correct, outer_sum = sums.tolist()
        if not math.isfinite(train_loss) or not math.isfinite(outer_sum):
            raise FloatingPointError(
                f"training diverged in epoch {index + 1} (train loss {train_loss}, outer "
                f"loss sum {outer_sum}); lower lr or meta_lr"
            )
        record: dict[str, Any] = {
            "epoch": index + 1,
            "lr": lr,
            "train_loss": train_loss / seen,
            "train_acc": n_correct / seen,
        }
        record.update(self.validate(val_loader))
        record["outer_loss"] = outer_sum / steps
        gamma = self.predict_gamma(val_loader if test_loader is None else test_loader)
        record["gamma_mean"] = float(gamma.mean())
        record["gamma_std"] = float(gamma.std(correction=0))
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
        """``val_loss`` (NLL), ``val_ece`` (15 bins), ``val_acc``, ``val_logit_norm``."""
        from calnotes import metrics

        was_training = self.model.training
        self.model.eval()
        try:
            logits, labels = _collect_logits(self.model, loader, self.device, amp=self.amp,
                                             name="val_loader")
        finally:
            self.model.train(was_training)
        probs = torch.softmax(logits, dim=1)
        return {
            "val_loss": float(metrics.nll(probs, labels)),
            "val_ece": float(metrics.ece(probs, labels, n_bins=VAL_ECE_BINS)),
            "val_acc": 1.0 - float(metrics.error(probs, labels)),
            "val_logit_norm": float(logits.double().norm(dim=1).mean()),
        }

    def predict_gamma(self, loader: Iterable) -> torch.Tensor:
        """gamma-Net's gamma ``(N,)`` (float32, on the CPU) for every sample of ``loader``,
        from eval-mode features."""
        was_training = self.model.training
        self.model.eval()
        try:
            gammas, _ = _collect_logits(
                lambda x: self.gamma_net(_widen(self.model.features(x))).unsqueeze(1),
                loader, self.device, amp=self.amp, name="loader",
            )
        finally:
            self.model.train(was_training)
        return gammas.squeeze(1).cpu()
