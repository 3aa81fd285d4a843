"""A training run described by a plain, JSON-able config dict.

``train_run(default_config(model="resnet20", epochs=30))`` loads the dataset, builds the
model and loss, trains with :class:`calnotes.training.Trainer` and returns the validation
and test logits with their metrics. The config holds everything that changes the numbers;
the device does not belong to it (it changes speed, not the experiment).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from calnotes import data, losses, models
from calnotes._checks import check_choice
from calnotes.losses import DECE_FORMS
from calnotes.training.meta import (
    INNER_PARAMS,
    INNER_REDUCTIONS,
    OUTER_LOSSES,
    GammaNet,
    MetaCalibrationTrainer,
    MetaTrainer,
)
from calnotes.training.trainer import (
    EpochCallback,
    History,
    MixupTrainer,
    Trainer,
    describe_device,
    predict_logits,
    seed_everything,
    select_device,
)

__all__ = [
    "CONFIG_TYPES",
    "DEFAULT_CONFIG",
    "META_OPTIONS",
    "OPTIONAL_CONFIG",
    "RunResult",
    "available_losses",
    "default_config",
    "load_splits",
    "make_loss",
    "make_trainer",
    "meta_validation_split",
    "register_loss",
    "train_run",
]

#: Every key a run config has, with its default.
DEFAULT_CONFIG: dict[str, Any] = {
    "dataset": "fashion_mnist",
    "model": "lenet5",
    "model_options": {},
    "loss": "ce",
    "loss_options": {},
    "optimizer": "sgd",
    "lr": 0.05,
    "momentum": 0.9,
    "weight_decay": 5e-4,
    "schedule": "cosine",
    "epochs": 10,
    "batch_size": 128,
    "augment": False,
    "val_size": 5000,
    "train_subset": None,
    "test_subset": None,
    "seed": 0,
    "amp": False,
}

#: Keys a config may have, absent unless set. A value of ``None`` means "absent" and is
#: dropped, so these keys never change the hash of a config that does not use them.
#:
#: ``positive_class``: an int ``k`` turns the run into the binary problem
#: ``y' = 1[y == k]`` (e.g. MNIST "9 vs not-9"), via :func:`calnotes.data.binary_target`
#: applied after the split and the subsets; logits then have 2 columns.
#:
#: ``meta``: a dict of meta-regularization options (keys of :data:`META_OPTIONS`, all
#: optional) trains with :class:`calnotes.training.meta.MetaTrainer`: a per-sample focal loss whose
#: gamma a gamma-Net learns (FLgamma-SECE, or FLgamma-DECE with ``{"outer": "dece"}``).
#: Such a run needs ``loss="focal"`` without options (gamma is learned, not set). With
#: ``{"learner": "l2"}`` it trains Meta-Calibration instead
#: (:class:`~calnotes.training.meta.MetaCalibrationTrainer`: cross-entropy with a
#: meta-learned L2 of the classifier head), which needs ``loss="ce"`` without options. Its
#: outer batches come from a meta-validation split carved from the training split (see
#: :func:`meta_validation_split`).
#:
#: ``milestones`` and ``lr_gamma`` (``schedule="step"`` only): the learning rate is
#: multiplied by ``lr_gamma`` (default 0.1) at each milestone, given as epochs (ints >= 1) or
#: fractions of the epochs (floats in (0, 1)); without them the step schedule decays at 1/2
#: and 3/4 of training. The LogitNorm code's ``[80, 140]`` of 200 epochs is ``[0.4, 0.7]``.
#:
#: ``flip``: with ``augment=True``, whether the random crop is joined by a horizontal flip;
#: absent, the dataset decides (flips for CIFAR, not for digits or Fashion-MNIST).
#:
#: ``grad_clip``: a positive float clips the gradient of each batch's (mean) loss to that
#: norm before the optimizer step (see :class:`calnotes.training.Trainer`).
#:
#: ``fast_path``: ``True`` trains the CPU forward in bfloat16 autocast with NHWC tensors,
#: ``False`` in float32 with the float32 layout policy (the path before the fast path
#: existed); absent (or ``"auto"``, dropped like ``None``), the trainer decides by the CPU
#: and the regime's equivalence pilot (:mod:`calnotes.training.fast_path`), and the run's
#: provenance records what it used. Stored logits and metrics are float32 either way.
OPTIONAL_CONFIG: dict[str, Any] = {
    "positive_class": None,
    "meta": None,
    "milestones": None,
    "lr_gamma": None,
    "flip": None,
    "grad_clip": None,
    "fast_path": None,
}

#: Options of a ``meta`` config and their defaults (see
#: :class:`~calnotes.training.meta.MetaTrainer`): the meta-learned ``learner``
#: (``"gamma-net"``, or ``"l2"`` for Meta-Calibration's L2 coefficients), the ``outer``
#: loss (``"sece"``, ``"sece+ce"``, ``"dece"``, ``"ce+0.5dece"``), gamma-Net ``heads`` and
#: ``gamma_tau``, its Adam ``meta_lr``, the look-ahead's ``inner_params``
#: (``"head"``/``"all"``),
#: ``inner_reduction`` (``"sum"``: one SGD step on the focal loss summed over the batch, as
#: Bohdal et al.'s code; ``"mean"``: on its batch mean, a step batch-size times smaller) and
#: ``inner_lr`` (``None``: the backbone's current learning rate), the SECE kernel's
#: ``sece_bandwidth``, the DECE's ``dece_form`` (``"ranked"``, Bohdal et al.'s, or
#: ``"sharpened"``, see :func:`calnotes.losses.dece`), and ``meta_val_size``: the images
#: of the meta-validation split that supplies the outer batches (``None``: as many as the
#: validation split holds, so ``val_size`` of a tenth of the training data gives the
#: paper's 8:1:1 split; ``0``: no such split, the outer batches come from the validation
#: split as they did before this option existed).
META_OPTIONS: dict[str, Any] = {
    "learner": "gamma-net",
    "outer": "sece",
    "heads": 8,
    "gamma_tau": 1.0,
    "meta_lr": 1e-3,
    "inner_params": "head",
    "inner_reduction": "sum",
    "inner_lr": None,
    "sece_bandwidth": 0.05,
    "dece_form": "ranked",
    "meta_val_size": None,
}

#: What a meta run learns: ``"gamma-net"`` (per-sample focal gamma, the paper's) or
#: ``"l2"`` (Meta-Calibration's L2 coefficients of the head) -- and the loss each needs.
META_LEARNERS = ("gamma-net", "l2")
_LEARNER_LOSS = {"gamma-net": "focal", "l2": "ce"}

#: Losses that need their own trainer rather than a ``loss(logits, labels)`` callable.
TRAINER_LOSSES = ("mixup",)
#: Default ``alpha`` of ``loss="mixup"`` (its only option).
MIXUP_ALPHA = 0.2

#: The type of every config value (``None``: the key may be ``None``). :func:`default_config`
#: converts each value to its type (an int weight decay becomes a float, a NumPy integer an
#: int) and refuses any other type, so one run has one config and so one hash.
CONFIG_TYPES: dict[str, tuple[Any, ...]] = {
    "dataset": (str,), "model": (str,), "model_options": (dict,), "loss": (str,),
    "loss_options": (dict,), "optimizer": (str,), "lr": (float,), "momentum": (float,),
    "weight_decay": (float,), "schedule": (str,), "epochs": (int,), "batch_size": (int,),
    "augment": (bool,), "val_size": (int, float, None), "train_subset": (int, None),
    "test_subset": (int, None), "seed": (int,), "amp": (bool,), "positive_class": (int,),
    "meta": (dict,), "milestones": (list,), "lr_gamma": (float,), "flip": (bool,),
    "grad_clip": (float,), "fast_path": (bool,),
}

#: The type of every option of a ``meta`` config, as :data:`CONFIG_TYPES`.
META_TYPES: dict[str, tuple[Any, ...]] = {
    "learner": (str,), "outer": (str,), "heads": (int,), "gamma_tau": (float,), "meta_lr": (float,),
    "inner_params": (str,), "inner_reduction": (str,), "inner_lr": (float, None),
    "sece_bandwidth": (float,), "dece_form": (str,), "meta_val_size": (int, None),
}

#: The values a ``meta`` option that names a choice may take.
META_CHOICES: dict[str, tuple[str, ...]] = {
    "learner": META_LEARNERS, "outer": OUTER_LOSSES, "inner_params": INNER_PARAMS,
    "inner_reduction": INNER_REDUCTIONS,
    "dece_form": DECE_FORMS,
}


def _type_names(types: tuple[Any, ...]) -> str:
    return " or ".join("None" if t is None else t.__name__ for t in types)


def _canonical(value: Any, types: tuple[Any, ...], name: str) -> Any:
    """``value`` as the first type of ``types`` it can be without loss, else ``TypeError``.

    bool stays bool (never an int); an int may become a float; a float never becomes an
    int; NumPy scalars become Python ones; a dict gets canonical JSON values.
    """
    if value is None:
        if None in types:
            return None
    elif isinstance(value, (bool, np.bool_)):
        if bool in types:
            return bool(value)
    elif isinstance(value, (int, np.integer)):
        if int in types:
            return int(value)
        if float in types:
            return float(value)
    elif isinstance(value, (float, np.floating)):
        if float in types:
            if not math.isfinite(value):
                raise ValueError(f"{name} must be finite, got {value}")
            return float(value)
    elif isinstance(value, str):
        if str in types:
            return value
    elif isinstance(value, Mapping):
        if dict in types:
            return _json_value(value, name)
    elif isinstance(value, (list, tuple)):
        if list in types:
            return _json_value(list(value), name)
    raise TypeError(f"{name} must be {_type_names(types)}, got {type(value).__name__} {value!r}")


def _json_value(value: Any, name: str) -> Any:
    """A free-form option value as plain JSON: dicts with str keys, lists, str, bool,
    int, finite float or None (tuples become lists, NumPy scalars Python ones)."""
    if isinstance(value, Mapping):
        out = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise TypeError(f"{name} must have str keys, got {key!r}")
            out[key] = _json_value(item, f"{name}[{key!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [_json_value(item, f"{name}[{i}]") for i, item in enumerate(value)]
    return _canonical(value, (bool, int, float, str, None), name)


def _loss_option_defaults(name: str) -> dict[str, Any]:
    """Default value of each option of the loss ``name`` ({} if unknown or opaque)."""
    if name == "mixup":
        return {"alpha": MIXUP_ALPHA}
    factory = _REGISTRY.get(name) or _library_losses().get(name)
    if factory is None:
        return {}
    try:
        params = inspect.signature(factory).parameters.values()
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params if p.default is not p.empty}


def _canonical_loss_options(loss: str, options: dict[str, Any]) -> dict[str, Any]:
    """An int given for a loss option whose default is a float becomes that float."""
    defaults = _loss_option_defaults(loss)
    return {
        k: float(v) if isinstance(defaults.get(k), float) and type(v) is int else v
        for k, v in options.items()
    }


def default_config(**overrides: Any) -> dict[str, Any]:
    """The full run config: :data:`DEFAULT_CONFIG` updated with ``overrides``.

    Keys of :data:`OPTIONAL_CONFIG` appear only when given a value other than ``None``.
    Values are made canonical by :data:`CONFIG_TYPES` (``weight_decay=0`` becomes ``0.0``;
    an int loss option whose default is a float becomes a float), so equal runs get equal
    configs. Raises ``ValueError`` for an unknown key (listing the valid ones), for
    ``device`` (not part of a config) and ``TypeError`` for a value of the wrong type.
    """
    valid = set(DEFAULT_CONFIG) | set(OPTIONAL_CONFIG)
    unknown = sorted(set(overrides) - valid)
    if unknown:
        hint = " (the device is an argument of train_run, not a config key)" if (
            "device" in unknown) else ""
        raise ValueError(
            f"unknown config key(s) {unknown}{hint}; valid keys are {sorted(valid)}"
        )
    config = copy.deepcopy(DEFAULT_CONFIG)
    config.update(copy.deepcopy(overrides))
    if isinstance(config.get("fast_path"), str) and config["fast_path"] == "auto":
        config["fast_path"] = None  # the default: the same run, the same hash
    for key in OPTIONAL_CONFIG:
        if config.get(key, None) is None:
            config.pop(key, None)
    for key, value in config.items():
        config[key] = _canonical(value, CONFIG_TYPES[key], f"config[{key!r}]")
    config["loss_options"] = _canonical_loss_options(config["loss"], config["loss_options"])
    if config.get("positive_class", 0) < 0:
        raise ValueError(f"config['positive_class'] must be >= 0, got {config['positive_class']}")
    if config.get("grad_clip", 1.0) <= 0:
        raise ValueError(f"config['grad_clip'] must be > 0, got {config['grad_clip']}")
    if "meta" in config:
        config["meta"] = _check_meta(config["meta"], config)
    _check_schedule_options(config)
    if "milestones" in config:  # a whole epoch given as a float is that epoch: one run, one hash
        config["milestones"] = [int(m) if isinstance(m, float) and m >= 1 and m == int(m)
                                else m for m in config["milestones"]]
    return config


def _check_schedule_options(config: Mapping[str, Any]) -> None:
    """``milestones`` and ``lr_gamma`` need the step schedule; ``flip`` needs augmentation;
    milestones are numbers (the trainer checks their range and order)."""
    step_only = [k for k in ("milestones", "lr_gamma") if k in config]
    if step_only and config["schedule"] != "step":
        raise ValueError(f"config {step_only} apply to schedule='step', got schedule="
                         f"{config['schedule']!r}")
    milestones = config.get("milestones")
    if milestones is not None and (not milestones or any(
            isinstance(m, bool) or not isinstance(m, (int, float)) for m in milestones)):
        raise TypeError(f"config['milestones'] must be a non-empty list of epochs or fractions, "
                        f"got {milestones!r}")
    if config.get("lr_gamma", 1.0) <= 0:
        raise ValueError(f"config['lr_gamma'] must be > 0, got {config['lr_gamma']}")
    if "flip" in config and not config["augment"]:
        raise ValueError("config['flip'] applies to augmentation: set augment=True")


def _check_meta(meta: Any, config: Mapping[str, Any]) -> dict[str, Any]:
    """``meta`` with every option of :data:`META_OPTIONS` filled in."""
    if not isinstance(meta, Mapping):
        raise TypeError(f"config['meta'] must be a dict, got {type(meta).__name__}")
    unknown = sorted(set(meta) - set(META_OPTIONS))
    if unknown:
        raise ValueError(
            f"config['meta'] has unknown option(s) {unknown}; valid ones are {sorted(META_OPTIONS)}"
        )
    out = {key: _canonical(value, META_TYPES[key], f"config['meta'][{key!r}]")
           for key, value in {**META_OPTIONS, **dict(meta)}.items()}
    for key, choices in META_CHOICES.items():
        check_choice(out[key], f"config['meta'][{key!r}]", choices)
    loss = _LEARNER_LOSS[out["learner"]]
    if config["loss"] != loss or config["loss_options"]:
        what = ("a per-sample focal gamma" if out["learner"] == "gamma-net"
                else "L2 coefficients for cross-entropy")
        raise ValueError(
            f"a meta run with learner {out['learner']!r} learns {what}: set loss={loss!r} and "
            f"no loss_options, got loss={config['loss']!r} with "
            f"loss_options={dict(config['loss_options'])}"
        )
    if out["learner"] == "l2" and out["inner_params"] != "head":
        raise ValueError("config['meta']['inner_params'] must be 'head' with learner 'l2' "
                         f"(its coefficients regularize the head), got {out['inner_params']!r}")
    if out["meta_val_size"] is not None and out["meta_val_size"] < 0:
        raise ValueError(
            f"config['meta']['meta_val_size'] must be >= 0 or None, got {out['meta_val_size']}")
    return out


def meta_validation_split(
    splits: data.DatasetSplits, size: int | None, seed: int
) -> tuple[data.DatasetSplits, data.ImageData]:
    """``(splits without the meta-validation images, the meta-validation images)``.

    ``size`` images (``None``: as many as ``splits.val`` holds) are drawn from
    ``splits.train`` by a permutation seeded with ``seed``; the rest stay the training split,
    in their order. The three splits are disjoint, as in Bohdal et al.'s code, which carves
    its meta-validation set from the training data too. ``ValueError`` unless
    ``0 < size < len(splits.train)``.
    """
    if not isinstance(splits, data.DatasetSplits):
        raise TypeError(f"splits must be a DatasetSplits, got {type(splits).__name__}")
    n = len(splits.train)
    size = len(splits.val) if size is None else size
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)):
        raise TypeError(f"size must be an int or None, got {type(size).__name__}")
    if not 0 < size < n:
        raise ValueError(f"size must lie in (0, {n}) for {n} training images, got {size}")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    train = splits.train.take(perm[size:].sort().values)
    meta = splits.train.take(perm[:size].sort().values)
    return dataclasses.replace(splits, train=train), meta


# --------------------------------------------------------------------------- loss registry

LossFactory = Callable[..., Callable[[torch.Tensor, torch.Tensor], torch.Tensor]]


def _cross_entropy(label_smoothing: float = 0.0) -> nn.Module:
    """``CE = -log softmax(z)[y]`` averaged over the batch (optionally label-smoothed, with
    ``label_smoothing`` in ``[0, 1)``); labels are checked like those of every loss."""
    from calnotes.losses import CrossEntropyLoss

    return CrossEntropyLoss(label_smoothing)


_REGISTRY: dict[str, LossFactory] = {"ce": _cross_entropy}


def _library_losses() -> Mapping[str, LossFactory]:
    """Losses that ``calnotes.losses`` defines."""
    return losses.LOSSES


def available_losses() -> list[str]:
    """Names a config's ``loss`` accepts: those of :func:`make_loss` and ``"mixup"``."""
    return sorted(set(_REGISTRY) | set(_library_losses()) | set(TRAINER_LOSSES))


def register_loss(name: str, factory: LossFactory, *, overwrite: bool = False) -> None:
    """Make ``make_loss(name, **options)`` call ``factory(**options)``.

    The factory returns a callable ``loss(logits, labels) -> scalar tensor``. Registering a
    name that exists raises ``ValueError`` unless ``overwrite=True``.
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"name must be a non-empty str, got {name!r}")
    if not callable(factory):
        raise TypeError(f"factory must be callable, got {type(factory).__name__}")
    if not overwrite and (name in _REGISTRY or name in _library_losses()):
        raise ValueError(f"loss {name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[name] = factory


def make_loss(name: str, **options: Any) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """Build the loss registered as ``name`` with hyperparameters ``options``.

    Names registered here take precedence over those of ``calnotes.losses``. Unknown names
    raise ``ValueError`` listing the valid ones.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__}")
    if name in _REGISTRY:
        factory = _REGISTRY[name]
        params = inspect.signature(factory).parameters.values()
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            accepted = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD,
                                                             p.KEYWORD_ONLY)]
            unknown = sorted(set(options) - set(accepted))
            if unknown:
                raise ValueError(
                    f"loss {name!r} got unknown option(s) {unknown}; it accepts {accepted}"
                )
        return factory(**options)
    library = _library_losses()
    if name in library:
        return losses.make_loss(name, **options)
    if name in TRAINER_LOSSES:
        raise ValueError(f"loss {name!r} changes the training step, not just the loss: "
                         "build its trainer with make_trainer (or use train_run)")
    raise ValueError(f"unknown loss {name!r}; available losses are {available_losses()}")


# --------------------------------------------------------------------------- runs


@dataclass
class RunResult:
    """What one run produced. Logits are float32 ``(N, C)``, labels int64 ``(N,)``, on CPU.

    ``metrics`` holds ``test_<name>`` and ``val_<name>`` for every column of
    ``calnotes.metrics.calibration_report``; ``seconds`` is the wall time of training (all
    sessions, if the run was resumed) plus final evaluation; ``device`` names the device
    and ``threads`` the intra-op CPU threads training used (None off the CPU).
    ``model`` is the trained model (not stored by the run store). ``fast_path`` is the
    trainer's precision, layout and compile setting
    (``FastPath.as_provenance``).
    """

    config: dict[str, Any]
    history: History
    val_logits: torch.Tensor | None
    val_labels: torch.Tensor | None
    test_logits: torch.Tensor
    test_labels: torch.Tensor
    metrics: dict[str, float]
    seconds: float
    device: str
    threads: int | None = None
    model: nn.Module | None = field(default=None, repr=False)
    fast_path: dict[str, Any] | None = None


def _report(probs: torch.Tensor, labels: torch.Tensor, prefix: str) -> dict[str, float]:
    from calnotes import metrics

    frame = metrics.calibration_report(probs, labels)
    row = frame.iloc[0].to_dict()
    out: dict[str, float] = {}
    for key, value in row.items():
        try:
            out[f"{prefix}_{key}"] = float(value)
        except (TypeError, ValueError):
            continue  # non-numeric columns (e.g. a label) are not metrics
    return out


def load_splits(config: Mapping[str, Any]) -> data.DatasetSplits:
    """The train / val / test splits of the run ``config`` describes: its dataset, split
    by ``val_size`` and ``seed`` and cut to ``train_subset`` / ``test_subset``; with a
    ``positive_class``, relabelled as that class against the rest; for a ``meta`` run, the
    training split without its meta-validation images (:func:`meta_validation_split`)."""
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    return _run_splits(default_config(**config))[0]


def _run_splits(cfg: Mapping[str, Any]) -> tuple[data.DatasetSplits, data.ImageData | None]:
    """The splits ``train_run`` trains the (complete) config ``cfg`` on, and the meta run's
    meta-validation images (``None`` when its outer batches come from the validation split,
    or for a run that is not a meta run)."""
    splits = data.load_dataset(
        cfg["dataset"], val_size=cfg["val_size"], seed=cfg["seed"],
        train_subset=cfg["train_subset"], test_subset=cfg["test_subset"],
    )
    if cfg.get("positive_class") is not None:
        splits = data.binary_target(splits, cfg["positive_class"])
    if "meta" not in cfg:
        return splits, None
    size = cfg["meta"]["meta_val_size"]
    if size == 0 or (size is None and len(splits.val) == 0):
        return splits, None
    return meta_validation_split(splits, size, cfg["seed"])


def train_run(
    config: Mapping[str, Any],
    device: str | torch.device = "auto",
    checkpoint_dir: str | None = None,
    progress: bool = True,
    epoch_callback: EpochCallback | None = None,
) -> RunResult:
    """Train and evaluate the run ``config`` describes (missing keys take their defaults).

    A ``meta`` run first carves its meta-validation split from the training split
    (:func:`meta_validation_split`, seeded with the run's seed); its outer batches of
    ``batch_size`` images come from it, reshuffled on every pass and never augmented.

    With ``checkpoint_dir`` an interrupted run resumes where it stopped. ``epoch_callback``
    is passed to the :class:`~calnotes.training.Trainer` (it may add history columns).
    """
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict, got {type(config).__name__}")
    cfg = default_config(**config)
    dev = select_device(device)
    seed_everything(cfg["seed"])

    splits, meta_data = _run_splits(cfg)
    meta_loader = None if meta_data is None else data.DeviceLoader(
        meta_data, cfg["batch_size"], shuffle=True, mean=splits.mean, std=splits.std,
        device=dev, seed=cfg["seed"])
    flip = {"flip": cfg["flip"]} if "flip" in cfg else {}
    train_loader, val_loader, test_loader = data.make_loaders(
        splits, batch_size=cfg["batch_size"], device=dev, augment=cfg["augment"],
        seed=cfg["seed"], **flip,
    )
    torch.manual_seed(cfg["seed"])  # model init independent of what data loading drew
    model = models.build_model(
        cfg["model"], splits.num_classes, splits.in_channels, splits.image_size,
        **cfg["model_options"],
    )
    trainer = make_trainer(
        cfg, model, device=dev, checkpoint_dir=checkpoint_dir, progress=progress,
        epoch_callback=epoch_callback,
    )
    has_val = val_loader is not None and _nonempty(val_loader)
    if isinstance(trainer, MetaTrainer):
        if meta_loader is None and not has_val:
            raise ValueError("a meta run needs meta-validation data: set "
                             "config['meta']['meta_val_size'] > 0 or config['val_size'] > 0")
        history = trainer.fit(train_loader, val_loader if has_val else None, test_loader,
                              meta_loader=meta_loader)
    else:
        history = trainer.fit(train_loader, val_loader if has_val else None)

    start = time.perf_counter()
    val_logits, val_labels = predict_logits(model, val_loader) if has_val else (None, None)
    test_logits, test_labels = predict_logits(model, test_loader)
    metrics = _report(torch.softmax(test_logits, dim=1), test_labels, "test")
    if val_logits is not None and val_labels is not None:
        metrics.update(_report(torch.softmax(val_logits, dim=1), val_labels, "val"))
    seconds = sum(s or 0.0 for s in history["seconds"]) + time.perf_counter() - start
    return RunResult(
        config=cfg, history=history, val_logits=val_logits, val_labels=val_labels,
        test_logits=test_logits, test_labels=test_labels, metrics=metrics, seconds=seconds,
        device=describe_device(dev), threads=trainer.threads_used, model=model,
        fast_path=trainer.fast_path.as_provenance(),
    )


def make_trainer(
    config: Mapping[str, Any],
    model: nn.Module,
    *,
    device: str | torch.device = "auto",
    checkpoint_dir: str | None = None,
    progress: bool = True,
    epoch_callback: EpochCallback | None = None,
) -> Trainer:
    """The trainer a config asks for: :class:`~calnotes.training.meta.MetaTrainer` with a ``meta``
    key, :class:`~calnotes.training.MixupTrainer` for ``loss="mixup"`` (option ``alpha``),
    otherwise :class:`~calnotes.training.Trainer` with :func:`make_loss`."""
    cfg = default_config(**config)
    dev = select_device(device)
    options: dict[str, Any] = dict(
        lr=cfg["lr"], momentum=cfg["momentum"], weight_decay=cfg["weight_decay"],
        schedule=cfg["schedule"], epochs=cfg["epochs"], grad_clip=cfg.get("grad_clip"),
        device=dev,
        **_precision_options(cfg, dev), checkpoint_dir=checkpoint_dir,
        progress=progress, seed=cfg["seed"], epoch_callback=epoch_callback, run_config=cfg,
    )
    if "milestones" in cfg:
        options["milestones"] = cfg["milestones"]
    if "meta" in cfg:
        if cfg["optimizer"] != "sgd":
            raise ValueError(f"a meta run trains the backbone with sgd, got {cfg['optimizer']!r}")
        meta = cfg["meta"]
        if "lr_gamma" in cfg:
            options["lr_decay"] = cfg["lr_gamma"]
        common = dict(outer=meta["outer"], inner_params=meta["inner_params"],
                      inner_reduction=meta["inner_reduction"], inner_lr=meta["inner_lr"],
                      meta_lr=meta["meta_lr"], sece_bandwidth=meta["sece_bandwidth"],
                      dece_form=meta["dece_form"], **options)
        if meta["learner"] == "l2":
            return MetaCalibrationTrainer(model, **common)
        in_features = cast(nn.Linear, model.head).in_features
        gamma_net = GammaNet(in_features, heads=meta["heads"], tau=meta["gamma_tau"])
        return MetaTrainer(model, gamma_net, **common)
    if "lr_gamma" in cfg:
        options["gamma"] = cfg["lr_gamma"]
    options["optimizer"] = cfg["optimizer"]
    if cfg["loss"] == "mixup":
        loss_options = dict(cfg["loss_options"])
        alpha = loss_options.pop("alpha", MIXUP_ALPHA)
        if loss_options:
            raise ValueError(f"loss 'mixup' got unknown option(s) {sorted(loss_options)}; "
                             "it accepts ['alpha']")
        return MixupTrainer(model, alpha=alpha, **options)
    return Trainer(model, make_loss(cfg["loss"], **cfg["loss_options"]), **options)


def _precision_options(cfg: Mapping[str, Any], dev: torch.device) -> dict[str, Any]:
    """The trainer's ``amp`` and ``channels_last``: a config's ``amp`` on CUDA, its
    ``fast_path`` where set, otherwise the trainer's automatic choice."""
    if cfg["amp"] and dev.type == "cuda":
        return {"amp": True}
    if "fast_path" in cfg:
        return {"amp": cfg["fast_path"], "channels_last": True if cfg["fast_path"] else "auto"}
    return {"amp": "auto"}


def _nonempty(loader: Any) -> bool:
    try:
        return len(loader) > 0
    except TypeError:
        return True
