"""The focal gamma a stored gamma-Net run gives each of its test images.

A meta run (``config["meta"]["learner"] == "gamma-net"``) stores per epoch only the mean and
spread of gamma on the test images. :func:`run_test_gamma` recovers gamma-Net from the run's
final checkpoint, or trains the run again (see :func:`calnotes.runs.ood.trained_state`),
evaluates :math:`\\gamma_i = \\text{gamma-Net}(f(x_i))` on every test image in eval mode, in
the order of the stored ``test_logits``, and stores the float32 values inside the run's
folder (entry ``gamma/``: published whole, checksummed, read back verified), so later calls
need no weights. With them it stores the test logits of the network gamma-Net was read
from: a run retrained on another CPU than the one that stored it can diverge in its last
bits over many epochs, and then gamma belongs to the retrained network, whose own logits
(not the stored ones) say which images it misclassifies. The entry's manifest records
whether that network reproduced the stored logits (:func:`calnotes.runs.ood.reproduces`)
and the largest difference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch

from calnotes import data, training
from calnotes.runs import experiment, store
from calnotes.runs.ood import reproduces, trained_state

__all__ = ["GAMMA_FILE", "GAMMA_FOLDER", "TestGamma", "run_test_gamma"]

#: Entry, inside a stored run's folder, of its per-sample test gamma.
GAMMA_FOLDER = "gamma"
#: File of that entry: float32 ``gamma`` ``(N,)`` and ``logits`` ``(N, C)`` (compressed npz).
GAMMA_FILE = "test_gamma.npz"
_KIND = "test_gamma"


@dataclass(frozen=True)
class TestGamma:
    """gamma-Net's ``gamma`` ``(N,)`` on a run's test images and the ``logits`` ``(N, C)`` of
    the network it was read from (float32, CPU, in the order of the stored test set);
    ``reproduces``: whether those logits are the stored ones
    (:func:`calnotes.runs.ood.reproduces`), and
    ``max_logit_diff`` the largest absolute difference."""

    gamma: torch.Tensor
    logits: torch.Tensor
    reproduces: bool
    max_logit_diff: float


def _check_gamma_run(run: Any) -> dict[str, Any]:
    if not isinstance(run, store.StoredRun):
        raise TypeError(f"run must be a calnotes.runs.store.StoredRun, got {type(run).__name__}")
    cfg = experiment.default_config(**run.config)
    if cfg.get("meta", {}).get("learner") != "gamma-net":
        raise ValueError(f"run {run.path.name} learns no per-sample gamma: its config has "
                         f"no meta learner 'gamma-net'")
    return cfg


def _read(run: Any) -> TestGamma | None:
    folder = Path(run.path) / GAMMA_FOLDER
    found = store.read_arrays_entry(folder, kind=_KIND, file=GAMMA_FILE,
                                    expected={"config_hash": run.path.name},
                                    what="this run's test gamma")
    if found is None:
        return None
    manifest, arrays = found
    remedy = f"delete the folder {folder}; the next call recomputes it"
    gamma, logits = arrays.get("gamma"), arrays.get("logits")
    shape = tuple(run.test_logits.shape)
    if (gamma is None or logits is None or gamma.dtype != np.float32
            or logits.dtype != np.float32 or gamma.shape != shape[:1] or logits.shape != shape
            or not isinstance(manifest.get("reproduces"), bool)):
        raise store.CorruptRun(f"{folder / GAMMA_FILE} holds no float32 gamma {shape[:1]} and "
                               f"logits {shape} with their manifest; {remedy}")
    diff = manifest.get("max_logit_diff")
    if (isinstance(diff, bool) or not isinstance(diff, (int, float)) or not math.isfinite(diff)
            or diff < 0):
        raise store.CorruptRun(f"{folder}: its manifest's max_logit_diff must be a finite "
                               f"number >= 0, got {diff!r}; {remedy}")
    return TestGamma(torch.from_numpy(gamma), torch.from_numpy(logits),
                     manifest["reproduces"], float(diff))


def run_test_gamma(
    run: Any,
    *,
    device: str | torch.device = "auto",
    checkpoint_root: str | Path | None = None,
    retrain: bool = True,
) -> TestGamma:
    """gamma-Net's gamma on each test image of a stored gamma-Net run, with the logits of
    the network it was read from (see the module docstring). ``ValueError`` for a run
    without gamma-Net; ``checkpoint_root`` and ``retrain`` as for
    :func:`calnotes.runs.ood.trained_model`, except that a retrained network is kept even
    where it does not reproduce the stored logits (the result says so)."""
    cfg = _check_gamma_run(run)
    found = _read(run)
    if found is None:
        model, state, splits = trained_state(run, device=device, checkpoint_root=checkpoint_root,
                                             retrain=retrain, must_reproduce=False)
        if "gamma_net" not in state:
            raise RuntimeError(f"the checkpoint of run {run.path.name} holds no gamma-Net")
        # a gamma-Net run (checked above): make_trainer gives a MetaTrainer
        trainer = cast(training.MetaTrainer,
                       experiment.make_trainer(cfg, model, device=device, progress=False))
        trainer.gamma_net.load_state_dict(state["gamma_net"])
        _, _, test_loader = data.make_loaders(splits, batch_size=1000, device=trainer.device)
        gamma = trainer.predict_gamma(test_loader).numpy().astype(np.float32)
        logits = training.predict_logits(model, test_loader)[0].float()
        diff = float((logits - run.test_logits).abs().max())
        store.write_entry(Path(run.path) / GAMMA_FOLDER,
                          {GAMMA_FILE: store.npz_bytes({"gamma": gamma,
                                                        "logits": logits.numpy()})},
                          {"kind": _KIND, "config_hash": run.path.name,
                           "reproduces": reproduces(logits, run), "max_logit_diff": diff})
        found = _read(run)  # read back verified
        if found is None:
            raise RuntimeError(f"the test gamma of run {run.path.name} was not stored")
    return found
