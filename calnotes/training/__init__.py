"""Training: :mod:`~.trainer` (``Trainer``, ``MixupTrainer``), :mod:`~.history`
(``History``), :mod:`~.prediction` (``predict_logits``), :mod:`~.checkpoint`,
:mod:`~.devices` (device choice, seeding, the CPU's instruction sets), :mod:`~.fast_path`
(the precision, layout and compile policy) and :mod:`~.meta` (gamma-Net and the bilevel
``MetaTrainer``)."""

from calnotes.training.checkpoint import load_checkpoint
from calnotes.training.devices import (
    bf16_capable,
    cpu_features,
    describe_device,
    seed_everything,
    select_device,
)
from calnotes.training.fast_path import FastPath, regime_key, resolve_fast_path
from calnotes.training.history import History
from calnotes.training.meta import GAMMA_FLOOR, GammaNet, MetaTrainer
from calnotes.training.prediction import eval_mode, predict_logits
from calnotes.training.trainer import MixupTrainer, Trainer

__all__ = [
    "GAMMA_FLOOR",
    "FastPath",
    "GammaNet",
    "History",
    "MetaTrainer",
    "MixupTrainer",
    "Trainer",
    "bf16_capable",
    "cpu_features",
    "describe_device",
    "eval_mode",
    "load_checkpoint",
    "predict_logits",
    "regime_key",
    "resolve_fast_path",
    "seed_everything",
    "select_device",
]
