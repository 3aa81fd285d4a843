"""Runs: a training run as a config (:mod:`~.experiment`), the run store and
``load_or_run`` (:mod:`~.store`), families of runs (:mod:`~.sweeps`), the training methods
of the meta-regularization paper (:mod:`~.methods`) and stored runs on OOD sets
(:mod:`~.ood`)."""

from calnotes.runs.experiment import (
    DEFAULT_CONFIG,
    META_OPTIONS,
    OPTIONAL_CONFIG,
    RunResult,
    available_losses,
    default_config,
    load_splits,
    make_loss,
    make_trainer,
    register_loss,
    train_run,
)
from calnotes.runs.methods import (
    METHODS,
    TABLE_COLUMNS,
    ece_vs_bins,
    method_configs,
    methods_table,
    temperature_scaled,
)
from calnotes.runs.ood import OOD_FOLDER, OOD_LOGITS_FILE, run_ood_logits, trained_model
from calnotes.runs.store import (
    CorruptRun,
    OutdatedRun,
    RunNotFound,
    RunStore,
    StoredRun,
    chapter_run,
    config_hash,
    default_checkpoint_root,
    default_results_root,
    load_or_run,
)
from calnotes.runs.sweeps import (
    Sweep,
    SweepRunner,
    describe_run,
    get_key,
    nll_overfitting,
    set_key,
    vary,
)

__all__ = [
    "CorruptRun",
    "DEFAULT_CONFIG",
    "META_OPTIONS",
    "METHODS",
    "OOD_FOLDER",
    "OOD_LOGITS_FILE",
    "OPTIONAL_CONFIG",
    "OutdatedRun",
    "RunNotFound",
    "RunResult",
    "RunStore",
    "StoredRun",
    "Sweep",
    "SweepRunner",
    "TABLE_COLUMNS",
    "available_losses",
    "chapter_run",
    "config_hash",
    "default_checkpoint_root",
    "default_config",
    "default_results_root",
    "describe_run",
    "ece_vs_bins",
    "get_key",
    "load_or_run",
    "load_splits",
    "make_loss",
    "make_trainer",
    "method_configs",
    "methods_table",
    "nll_overfitting",
    "register_loss",
    "run_ood_logits",
    "set_key",
    "temperature_scaled",
    "train_run",
    "trained_model",
    "vary",
]
