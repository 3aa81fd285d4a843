r"""Meta-regularization (after Wang & Golebiowski, "Towards Unbiased Calibration using
Meta-Regularization"): a small gamma-Net chooses a per-sample focal-loss ``gamma`` and is
trained so that one step of focal-loss training improves a smooth calibration error on
held-out (meta-validation) data.

gamma-Net (:class:`GammaNet`) reads the backbone's penultimate features ``x in R^d``,
detached from the backbone graph:

.. math::
    a = x A,\quad p = \mathrm{softmax}(a),\quad \tilde x = p A^\top,\quad
    \gamma = |\tilde x W| / \tau + \epsilon,

with ``A in R^{d x k}`` (``k`` heads), ``W in R^{d x 1}`` and the floor ``epsilon = 1e-6``.

One step of :class:`MetaTrainer` on a training batch ``(x, y)`` of ``B`` samples and a
meta-validation batch ``(x_v, y_v)``, with selected backbone parameters ``theta`` (the
classifier head, or the whole network) and gamma-Net parameters ``phi``:

1. ``gamma_i = g_phi(f(x_i))`` from detached features;
2. look-ahead (virtual) SGD step, kept differentiable in ``phi``:
   ``theta'(phi) = theta - alpha grad_theta sum_i FL(z_i(theta), y_i; gamma_i)`` with
   ``FL = -(1 - p_y)^gamma log p_y`` (``inner_reduction="sum"``, the default; with
   ``"mean"`` the sum is divided by ``B``, a step ``B`` times smaller);
3. outer loss ``L_out(phi)`` on ``softmax(z_v(theta'(phi)))`` (:data:`OUTER_LOSSES`) and
   one Adam step of ``phi`` on ``d L_out / d phi`` (second-order, through ``theta'``);
4. the real backbone step (SGD with momentum and weight decay) on the mean focal loss with
   the gammas recomputed by the updated gamma-Net, detached.

Without the look-ahead step (2) the outer loss does not depend on gamma-Net at all: the
meta-validation predictions are a function of the backbone parameters only, and ``gamma``
enters solely through the training loss. The look-ahead is what makes ``d L_out / d phi``
non-zero, which is why it is essential.

The paper publishes no code; it says it adapts Bohdal et al.'s public Meta-Calibration
code, and steps (1)-(3) follow that code: the virtual step is plain SGD (no momentum or
weight decay, which do not depend on ``gamma``) on the classifier head only, on the loss
*summed* over the batch, with the backbone's current (scheduled) learning rate as
``alpha`` (``inner_lr=None``); its meta-validation split is carved from the training data
and is disjoint from the validation split that early metrics and temperature scaling use.
Batch-norm running statistics are left untouched by the virtual and meta-validation
forwards (they run on copies of the buffers); only the real step (4) updates them.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call

from calnotes._checks import (
    check_choice,
    check_positive_float,
    check_positive_int,
)
from calnotes.losses import DECE_FORMS, RANKED_DECE, _dece, focal_loss
from calnotes.metrics import sece
from calnotes.training.fast_path import _autocast
from calnotes.training.history import History
from calnotes.training.prediction import _collect_logits, _iter_batches, eval_mode
from calnotes.training.trainer import VAL_ECE_BINS, Trainer

__all__ = ["GAMMA_FLOOR", "GammaNet", "LearnableL2", "MetaCalibrationTrainer", "MetaTrainer"]

#: Added to every gamma so it is strictly positive even where ``x~ W = 0``.
GAMMA_FLOOR = 1e-6
#: Outer (meta) losses on the meta-validation batch, ``p = softmax(z_v(theta'))``:
#: ``"sece"`` SECE(p, y) (the paper's), ``"sece+ce"`` SECE(p, y) + CE(z_v, y),
#: ``"dece"`` DECE(p, y) and ``"ce+0.5dece"`` CE(z_v, y) + DECE(p, y) / 2 (Bohdal et al.'s
#: code since 2023; before, DECE alone). CE is the batch mean of ``-log p_y``.
OUTER_LOSSES = ("sece", "sece+ce", "dece", "ce+0.5dece")
INNER_PARAMS = ("head", "all")
#: How the look-ahead's focal loss is reduced over the training batch (step (2)).
INNER_REDUCTIONS = ("sum", "mean")
#: Soft-binning and soft-accuracy temperatures of the ``"sharpened"`` DECE form (the
#: ``"ranked"`` form uses Bohdal et al.'s, :data:`calnotes.losses.RANKED_DECE`).
SHARPENED_DECE = {"n_bins": VAL_ECE_BINS, "temperature": 1e-4, "accuracy_temperature": 0.01}
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


class LearnableL2(nn.Module):
    r"""Meta-Calibration's learnable L2 regularizer (Bohdal et al.'s ``learnable_l2``): one
    coefficient :math:`\lambda_j` per parameter :math:`w_j` of the classifier ``head``, all 0
    at the start, and the penalty :math:`\sum_j \lambda_j w_j^2` added to the training loss
    *summed* over the batch. The coefficients are not clamped (as in their code), so a
    coefficient may turn negative.
    """

    def __init__(self, head: nn.Linear) -> None:
        super().__init__()
        if not isinstance(head, nn.Linear):
            raise TypeError(f"head must be an nn.Linear, got {type(head).__name__}")
        for name, param in head.named_parameters():
            self.register_parameter(name, nn.Parameter(torch.zeros_like(param.detach())))

    def penalty(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        r""":math:`\sum_j \lambda_j w_j^2` over the head's parameters ``params`` (by name)."""
        terms = [(coef * params[name].pow(2)).sum() for name, coef in self.named_parameters()]
        return torch.stack(terms).sum()


def _widen(t: torch.Tensor) -> torch.Tensor:
    """Half-precision (autocast) outputs to float32; float32/float64 stay as they are."""
    return t.float() if t.dtype in (torch.float16, torch.bfloat16) else t


class _Features(nn.Module):
    """``forward = model.features`` so :func:`functional_call` can swap buffers in."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = cast(Callable[[torch.Tensor], torch.Tensor], self.model.features)
        return features(x)


class MetaTrainer(Trainer):
    """Train ``model`` with a focal loss whose per-sample gamma comes from ``gamma_net``.

    See the module docstring for the four parts of each step. ``model`` must have
    ``features(x) -> (B, d)`` and ``head`` (an ``nn.Linear``) with ``forward = head o
    features`` (as from :func:`calnotes.models.build_model`). The backbone uses SGD (``lr``,
    ``momentum``, ``weight_decay``) with ``schedule`` (``"cosine"``, ``"step"`` with
    ``milestones`` and factor ``lr_decay``, or ``"none"``; the real step's gradient clipped
    to norm ``grad_clip``, never the look-ahead's), gamma-Net Adam with ``meta_lr``.
    ``outer`` picks the loss on the meta-validation batch
    (:data:`~calnotes.training.meta.OUTER_LOSSES`; SECE is :func:`calnotes.metrics.sece`
    with ``sece_bandwidth``, DECE is :func:`calnotes.losses.dece` with 15 bins in
    ``dece_form`` ``"ranked"``, Bohdal et al.'s, or ``"sharpened"``). ``inner_params`` is
    ``"head"`` or ``"all"``: which parameters the look-ahead step moves; ``inner_reduction``
    is ``"sum"`` (the look-ahead steps on the focal loss summed over the batch, as Bohdal et
    al.'s code) or ``"mean"`` (on its batch mean: a step ``B`` times smaller); ``inner_lr``
    is its step size (``None``: the backbone's current learning rate).

    Per-epoch records: ``epoch``, ``lr``, ``train_loss`` (focal), ``train_acc``,
    ``val_loss`` (NLL), ``val_ece`` (15 bins), ``val_acc``, ``val_logit_norm``,
    ``outer_loss`` (mean over the epoch's steps, before each gamma-Net update),
    ``gamma_mean`` and ``gamma_std`` (population std) of gamma on the test samples (the
    validation samples without a test loader), and ``seconds``.

    The outer batches come from ``meta_loader`` (see :meth:`fit`), cycled: on exhaustion it
    is iterated again. Each pass of a separate ``meta_loader`` starts with
    ``set_epoch(pass)`` where the loader has it; every pass (of the validation loader too)
    runs inside a forked torch RNG seeded from ``(seed, pass)``, and the pass and position are
    checkpointed, so resuming is exact for any loader whose order depends only on these
    (fixed order, a :class:`~calnotes.data.DeviceLoader`, or a ``DataLoader`` with
    ``shuffle=True``). Checkpoints (``checkpoint_dir/last.pt``, atomic, every epoch) hold the
    model, gamma-Net, both optimizers, the scheduler, the history, RNG states and the
    cycling position. ``amp``, ``channels_last`` and ``compile`` are the
    :class:`~calnotes.training.Trainer`'s (:mod:`calnotes.training.fast_path`): bfloat16
    autocast covers the real step's forward, the look-ahead and the outer forward; gamma-Net,
    the losses, gamma statistics and validation stay float32.
    """

    def __init__(
        self,
        model: nn.Module,
        gamma_net: nn.Module,
        *,
        outer: str = "sece",
        inner_params: str = "head",
        inner_reduction: str = "sum",
        inner_lr: float | None = None,
        lr: float = 0.1,
        momentum: float = 0.9,
        weight_decay: float = 5e-4,
        meta_lr: float = 1e-3,
        schedule: str = "cosine",
        milestones: Sequence[float] | None = None,
        lr_decay: float = 0.1,
        epochs: int = 30,
        grad_clip: float | None = None,
        device: str | torch.device = "auto",
        amp: bool | str = "auto",
        channels_last: bool | str | None = "auto",
        compile: bool | str = "auto",
        checkpoint_dir: str | os.PathLike | None = None,
        progress: bool = True,
        seed: int = 0,
        sece_bandwidth: float = 0.05,
        dece_form: str = "ranked",
        epoch_callback: MetaEpochCallback | None = None,
        run_config: Mapping[str, Any] | None = None,
    ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not callable(getattr(model, "features", None)) or not isinstance(
            getattr(model, "head", None), nn.Linear
        ):
            raise ValueError("model must have features(x) and an nn.Linear head")
        if not isinstance(gamma_net, nn.Module):
            raise TypeError(f"gamma_net must be a torch.nn.Module, got {type(gamma_net).__name__}")
        self.outer = check_choice(outer, "outer", OUTER_LOSSES)
        self.inner_params = check_choice(inner_params, "inner_params", INNER_PARAMS)
        self.inner_reduction = check_choice(inner_reduction, "inner_reduction",
                                            INNER_REDUCTIONS)
        self.dece_form = check_choice(dece_form, "dece_form", DECE_FORMS)
        self.inner_lr = None if inner_lr is None else check_positive_float(inner_lr, "inner_lr")
        self.meta_lr = check_positive_float(meta_lr, "meta_lr")
        self.sece_bandwidth = check_positive_float(sece_bandwidth, "sece_bandwidth")
        super().__init__(
            model, optimizer="sgd", lr=lr, momentum=momentum, weight_decay=weight_decay,
            schedule=schedule, milestones=milestones, gamma=lr_decay, epochs=epochs,
            grad_clip=grad_clip,
            device=device, amp=amp, channels_last=channels_last, compile=compile,
            checkpoint_dir=checkpoint_dir, progress=progress,
            seed=seed, epoch_callback=epoch_callback,  # type: ignore[arg-type]
            run_config=run_config,
        )
        #: The meta-learned module (gamma-Net here; the L2 coefficients of
        #: :class:`MetaCalibrationTrainer`), trained by Adam on the hypergradient.
        self.learner: nn.Module = gamma_net.to(self.device)
        #: The model's classifier head and feature extractor (typed views of the model's).
        self.head: nn.Linear = cast(nn.Linear, self.model.head)
        self.features: Callable[[torch.Tensor], torch.Tensor] = cast(
            Callable[[torch.Tensor], torch.Tensor], self.model.features)
        self._features = _Features(self.model)
        meta_params = self._meta_params()
        if not meta_params:
            raise ValueError("gamma_net has no trainable parameters")
        self.meta_optimizer = torch.optim.Adam(meta_params, lr=self.meta_lr)
        #: Meta-loader cycling: completed passes and batches taken in the current one.
        self.meta_cycle = 0
        self.meta_position = 0
        self._meta_iter: Iterator | None = None
        self._meta_loader: Iterable | None = None
        self._meta_is_val = True
        self._val_loader: Iterable | None = None
        self._test_loader: Iterable | None = None
        self._val_gamma = torch.zeros(0)
        self._outer_sum = torch.zeros((), device=self.device, dtype=torch.float64)
        self._outer_steps = 0

    # ------------------------------------------------------------------ configuration

    def fingerprint(self) -> dict[str, Any]:
        """The configuration a checkpoint must match to be resumed (JSON-able)."""
        return {
            **super().fingerprint(),
            "trainer": "meta",
            "gamma_net": [[n, list(p.shape)] for n, p in self.learner.named_parameters()],
            "gamma_net_repr": repr(self.learner),
            "outer": self.outer,
            "inner_params": self.inner_params,
            "inner_reduction": self.inner_reduction,
            "inner_lr": self.inner_lr,
            "meta_lr": self.meta_lr,
            "sece_bandwidth": self.sece_bandwidth,
            "dece_form": self.dece_form,
        }

    def _extra_state(self) -> dict[str, Any]:
        return {
            "gamma_net": self.learner.state_dict(),
            "meta_optimizer": self.meta_optimizer.state_dict(),
            "meta_cycle": self.meta_cycle,
            "meta_position": self.meta_position,
        }

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.learner.load_state_dict(state["gamma_net"])
        self.meta_optimizer.load_state_dict(state["meta_optimizer"])
        self.meta_cycle = int(state["meta_cycle"])
        self.meta_position = int(state["meta_position"])
        self._meta_iter = None

    @property
    def gamma_net(self) -> nn.Module:
        """The meta-learned module (:attr:`learner`), by its name in this trainer."""
        return self.learner

    def _meta_params(self) -> list[torch.Tensor]:
        return [p for p in self.learner.parameters() if p.requires_grad]

    # ------------------------------------------------------------------ the learner's loss

    def inner_loss(self, logits: torch.Tensor, labels: torch.Tensor, features: torch.Tensor,
                   params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The training loss as the look-ahead differentiates it, in mean units (the batch
        mean ``FL(z_i, y_i; gamma_i)``, ``gamma = gamma_net(features)``), differentiable in the
        learner's parameters; ``params`` are the look-ahead's parameters (unused here)."""
        return focal_loss(logits, labels, self.learner(features))

    def real_loss(self, logits: torch.Tensor, labels: torch.Tensor,
                  features: torch.Tensor) -> torch.Tensor:
        """The real step's loss: :meth:`inner_loss` with the learner held fixed."""
        with torch.no_grad():
            gamma = self.learner(features)
        return focal_loss(logits, labels, gamma)

    def _learner_record(self, record: dict[str, Any]) -> None:
        """gamma's mean and (population) std on the test samples (see the class doc)."""
        if self._test_loader is not None:
            gamma = self.predict_gamma(self._test_loader)
        elif self._val_loader is not None:
            gamma = self._val_gamma
        else:
            gamma = self.predict_gamma(cast(Iterable, self._meta_loader))
        record["gamma_mean"] = float(gamma.mean())
        record["gamma_std"] = float(gamma.std(correction=0))

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
            return {n: p for n, p in self.head.named_parameters() if p.requires_grad}
        return {n: p for n, p in self.model.named_parameters() if p.requires_grad}

    def _virtual_logits(
        self, params: dict[str, torch.Tensor], x: torch.Tensor, feats: torch.Tensor | None
    ) -> torch.Tensor:
        """Logits with ``params`` substituted (head on ``feats``, or the whole model)."""
        with _autocast(self.device, self.amp):
            if self.inner_params == "head":
                out = functional_call(self.head, params, (feats,))
            else:
                out = functional_call(self.model, {**self._buffers(), **params}, (x,))
        return _widen(out)

    def outer_loss(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """The outer loss ``outer`` (:data:`~calnotes.training.meta.OUTER_LOSSES`) of
        meta-validation ``logits``."""
        probs = F.softmax(logits, dim=1)
        if self.outer in ("sece", "sece+ce"):
            loss = cast(torch.Tensor, sece(probs, labels, bandwidth=self.sece_bandwidth))
            return loss + F.cross_entropy(logits, labels) if self.outer == "sece+ce" else loss
        settings = RANKED_DECE if self.dece_form == "ranked" else SHARPENED_DECE
        loss = _dece(probs, labels, int(settings["n_bins"]), settings["temperature"],
                     settings["accuracy_temperature"], self.dece_form)
        return F.cross_entropy(logits, labels) + 0.5 * loss if self.outer == "ce+0.5dece" else loss

    def hypergradient(
        self, x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor,
        inner_lr: float, *, look_ahead: bool = True, features: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor | None]]:
        """Steps (1)-(3) without the update: ``(outer loss, d outer / d gamma-Net params)``.

        The virtual step is ``theta' = theta - inner_lr * s * grad mean_i FL_i`` with
        ``s = B`` (``inner_reduction="sum"``: the gradient of the summed loss) or ``s = 1``
        (``"mean"``). ``features`` are the detached penultimate features of ``x`` when the
        caller has them (the training step reuses those of its real forward); otherwise
        they are computed. ``look_ahead=False`` evaluates the outer loss at the current
        parameters (no virtual step); its gradient is then ``None`` (zero) for every
        gamma-Net parameter.
        """
        feats = self._detached_features(x) if features is None else features
        params = self._selected()
        if look_ahead:
            inner = self.inner_loss(self._virtual_logits(params, x, feats), y, feats, params)
            grads = torch.autograd.grad(inner, list(params.values()), create_graph=True,
                                        allow_unused=True)
            step = inner_lr * (x.shape[0] if self.inner_reduction == "sum" else 1)
            params = {n: p if g is None else p - step * g
                      for (n, p), g in zip(params.items(), grads, strict=True)}
        val_feats = self._detached_features(x_val) if self.inner_params == "head" else None
        outer = self.outer_loss(self._virtual_logits(params, x_val, val_feats), y_val)
        hyper = torch.autograd.grad(outer, self._meta_params(), allow_unused=True)
        return outer.detach(), list(hyper)

    def _next_meta_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        loader = cast(Iterable, self._meta_loader)
        name = "val_loader" if self._meta_is_val else "meta_loader"
        for _ in range(2):
            if self._meta_iter is None:
                if not self._meta_is_val and hasattr(loader, "set_epoch"):
                    loader.set_epoch(self.meta_cycle)
                with torch.random.fork_rng(devices=[]):
                    torch.manual_seed(self.seed * 1_000_003 + self.meta_cycle)
                    it = iter(_iter_batches(loader, name))
                    first = next(it, None)  # samplers draw their seed on the first batch
                    for _ in range(self.meta_position):
                        first = next(it, None)
                self._meta_iter = it
                batch = first
            else:
                batch = next(self._meta_iter, None)
            if batch is not None:
                self.meta_position += 1
                return batch
            if self.meta_position == 0:
                raise ValueError(f"{name} yielded no batches")
            self._meta_iter = None
            self.meta_cycle += 1
            self.meta_position = 0
        raise ValueError(f"{name} yielded no batches")  # pragma: no cover

    def train_step(
        self, x: torch.Tensor, y: torch.Tensor, x_val: torch.Tensor, y_val: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One meta step (1)-(4) on a training batch ``(x, y)`` and a meta-validation batch
        ``(x_val, y_val)``; returns ``(focal loss, logits, outer loss)``, detached.

        The backbone's forward on ``x`` runs once: its features, detached, feed gamma-Net
        and the look-ahead, and its graph carries the real step's backward. (In training
        mode batch norm normalizes with batch statistics, so these features equal those of
        a separate forward.)
        """
        lr_now = float(self.optimizer.param_groups[0]["lr"])
        inner_lr = lr_now if self.inner_lr is None else self.inner_lr
        with _autocast(self.device, self.amp):
            feats = self.features(x)
        detached = _widen(feats.detach())
        outer, hyper = self.hypergradient(x, y, x_val, y_val, inner_lr, features=detached)
        meta_params = self._meta_params()
        self.meta_optimizer.zero_grad(set_to_none=True)
        for p, g in zip(meta_params, hyper, strict=True):
            p.grad = torch.zeros_like(p) if g is None else g
        self.meta_optimizer.step()
        return (*self._focal_step(feats, detached, y), outer)

    def real_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Step (4) alone: SGD on ``FL(model(x), y; gamma_net(features).detach())``."""
        with _autocast(self.device, self.amp):
            feats = self.features(x)
        return self._focal_step(feats, _widen(feats.detach()), y)

    def _focal_step(
        self, feats: torch.Tensor, detached: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        with _autocast(self.device, self.amp):
            logits = _widen(self.head(feats))
        loss = self.real_loss(logits, y, detached)
        self._optimizer_step(loss)
        return loss.detach(), logits.detach()

    # ------------------------------------------------------------------ training

    @property
    def meta_loader(self) -> Iterable | None:
        """The loader the outer batches come from (the validation loader without a
        ``meta_loader``); ``None`` before :meth:`fit`."""
        return self._meta_loader

    def fit(  # type: ignore[override]
        self, train_loader: Iterable, val_loader: Iterable | None,
        test_loader: Iterable | None = None, meta_loader: Iterable | None = None,
    ) -> History:
        """Train until ``epochs`` epochs are done; return the
        :class:`~calnotes.training.History`.

        ``meta_loader`` supplies the outer (meta-validation) batches; without it they come
        from ``val_loader``, which otherwise only gives the per-epoch validation metrics
        (it may then be ``None``). gamma statistics come from ``test_loader``, else from
        ``val_loader``, else from ``meta_loader``. Resumes like
        :meth:`~calnotes.training.Trainer.fit`.
        """
        if meta_loader is None and val_loader is None:
            raise ValueError("val_loader is required without a meta_loader: one of them "
                             "supplies the outer (meta) batches")
        self._meta_is_val = meta_loader is None or meta_loader is val_loader
        self._meta_loader = val_loader if meta_loader is None else meta_loader
        self._meta_iter = None  # rebuilt at (meta_cycle, meta_position): the same batches
        self._val_loader, self._test_loader = val_loader, test_loader
        self.learner.train()
        return super().fit(train_loader, val_loader)

    def _train_step(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x_val, y_val = self._next_meta_batch()
        loss, logits, outer = self.train_step(x, y, self._input(x_val),
                                              y_val.to(self.device).long())
        self._outer_sum += outer.double()
        self._outer_steps += 1
        return loss, logits

    def _extend_record(self, record: dict[str, Any]) -> None:
        """``outer_loss`` (mean over the epoch's steps) and gamma's mean and std."""
        outer_sum, steps = float(self._outer_sum), self._outer_steps
        self._outer_sum.zero_()
        self._outer_steps = 0
        if not math.isfinite(outer_sum):
            raise FloatingPointError(
                f"the outer loss diverged in epoch {record['epoch']}; lower meta_lr"
            )
        record["outer_loss"] = outer_sum / max(steps, 1)
        self._learner_record(record)

    def validate(self, loader: Iterable) -> dict[str, float]:
        """:meth:`Trainer.validate`; without a test loader the same eval-mode forward also
        gives gamma on the validation samples (kept for the epoch's gamma statistics)."""
        if self._test_loader is not None:
            return super().validate(loader)
        with eval_mode(self.model):
            both, labels = _collect_logits(self._logits_and_gamma, loader, self.device,
                                           channels_last=self.channels_last,
                                           name="val_loader")
        self._val_gamma = both[:, -1]
        return self._validation_metrics(both[:, :-1], labels)

    def _logits_and_gamma(self, x: torch.Tensor) -> torch.Tensor:
        """``(B, C + 1)``: the logits, then gamma, from one forward of the backbone."""
        feats = self.features(x)
        return torch.cat([_widen(self.head(feats)),
                          self.learner(_widen(feats)).unsqueeze(1)], dim=1)

    def predict_gamma(self, loader: Iterable) -> torch.Tensor:
        """gamma-Net's gamma ``(N,)`` (float32, on the CPU) for every sample of ``loader``,
        from eval-mode features."""
        with eval_mode(self.model):
            both, _ = _collect_logits(self._logits_and_gamma, loader, self.device,
                                      channels_last=self.channels_last, name="loader")
        return both[:, -1].cpu()


class MetaCalibrationTrainer(MetaTrainer):
    r"""Meta-Calibration (Bohdal et al. 2021) in its first form, the meta-learning baseline
    "CE-DECE" of Wang & Golebiowski: cross-entropy with a learnable unit-wise L2
    regularizer of the classifier head (:class:`LearnableL2`), its coefficients
    meta-learned so that one look-ahead step lowers DECE on meta-validation data.

    In summed units (Bohdal et al.'s code) the training loss is
    :math:`\sum_i \mathrm{CE}_i + \sum_j \lambda_j w_j^2`; here, in mean units,

    .. math:: L(\theta, \lambda) = \frac1B \sum_i \mathrm{CE}(z_i, y_i)
              + \frac1B \sum_j \lambda_j w_j^2,

    so the look-ahead ``inner_reduction="sum"`` steps on exactly their loss and
    ``"mean"`` on ``1/B`` of it. The look-ahead, the outer loss (default ``"dece"``, as
    their code before 2023) and the Adam step of :math:`\lambda` are those of
    :class:`MetaTrainer`; the real step descends :math:`L` with the updated, fixed
    :math:`\lambda`. The look-ahead moves the head only (``inner_params="head"``). Per-epoch
    records: those of :class:`MetaTrainer` with ``l2_mean`` and ``l2_std`` (population) of
    the coefficients in place of gamma's statistics. Other arguments as
    :class:`MetaTrainer`.
    """

    def __init__(self, model: nn.Module, *, outer: str = "dece", inner_params: str = "head",
                 **options: Any) -> None:
        head = getattr(model, "head", None)
        if not isinstance(head, nn.Linear):
            raise ValueError("model must have features(x) and an nn.Linear head")
        check_choice(inner_params, "inner_params", ("head",))
        super().__init__(model, LearnableL2(head), outer=outer, inner_params=inner_params,
                         **options)

    @property
    def l2(self) -> LearnableL2:
        """The learnable L2 coefficients."""
        return cast(LearnableL2, self.learner)

    def fingerprint(self) -> dict[str, Any]:
        return {**super().fingerprint(), "trainer": "meta-calibration"}

    def inner_loss(self, logits: torch.Tensor, labels: torch.Tensor, features: torch.Tensor,
                   params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``CE + penalty(params) / B``, differentiable in the coefficients."""
        return F.cross_entropy(logits, labels) + self.l2.penalty(params) / labels.shape[0]

    def real_loss(self, logits: torch.Tensor, labels: torch.Tensor,
                  features: torch.Tensor) -> torch.Tensor:
        """``CE + penalty(head) / B`` with the coefficients held fixed."""
        fixed = {n: c.detach() for n, c in self.l2.named_parameters()}
        penalty = sum((fixed[n] * p.pow(2)).sum() for n, p in self.head.named_parameters())
        return F.cross_entropy(logits, labels) + penalty / labels.shape[0]

    def _learner_record(self, record: dict[str, Any]) -> None:
        coefs = torch.cat([c.detach().flatten() for c in self.l2.parameters()])
        record["l2_mean"] = float(coefs.mean())
        record["l2_std"] = float(coefs.std(correction=0))

    def validate(self, loader: Iterable) -> dict[str, float]:
        """:meth:`Trainer.validate` (there is no gamma to collect)."""
        return Trainer.validate(self, loader)
