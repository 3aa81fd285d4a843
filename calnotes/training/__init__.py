"""Training: :mod:`~.trainer` (``Trainer``, ``MixupTrainer``, ``History``,
``predict_logits``, seeding and device choice) and :mod:`~.meta` (gamma-Net and the bilevel
``MetaTrainer``)."""

from calnotes.training.meta import GAMMA_FLOOR, GammaNet, MetaTrainer
from calnotes.training.trainer import (
    History,
    MixupTrainer,
    Trainer,
    describe_device,
    eval_mode,
    load_checkpoint,
    predict_logits,
    seed_everything,
    select_device,
)

__all__ = [
    "GAMMA_FLOOR",
    "GammaNet",
    "History",
    "MetaTrainer",
    "MixupTrainer",
    "Trainer",
    "describe_device",
    "eval_mode",
    "load_checkpoint",
    "predict_logits",
    "seed_everything",
    "select_device",
]
