"""The focal gamma a stored gamma-Net run gives each of its test images.

A meta run (``config["meta"]["learner"] == "gamma-net"``) stores per epoch only the mean and
spread of gamma on the test images. :func:`run_test_gamma` recovers gamma-Net from the run's
final checkpoint (or trains the run again, deterministic on the CPU, and checks that it
reproduces the stored test logits; see :func:`calnotes.runs.ood.trained_state`), evaluates
:math:`\\gamma_i = \\text{gamma-Net}(f(x_i))` on every test image in eval mode, in the order of
the stored ``test_logits``, and stores the float32 values inside the run's folder (entry
``gamma/``: published whole, checksummed, read back verified), so later calls need no
weights.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from calnotes import data
from calnotes.runs import experiment, store
from calnotes.runs.ood import trained_state

__all__ = ["GAMMA_FILE", "GAMMA_FOLDER", "run_test_gamma"]

#: Entry, inside a stored run's folder, of its per-sample test gamma.
GAMMA_FOLDER = "gamma"
#: File of that entry: the float32 ``gamma`` ``(N,)`` (compressed npz).
GAMMA_FILE = "test_gamma.npz"
_KIND = "test_gamma"


def _check_gamma_run(run: Any) -> dict[str, Any]:
    if not isinstance(run, store.StoredRun):
        raise TypeError(f"run must be a calnotes.runs.store.StoredRun, got {type(run).__name__}")
    cfg = experiment.default_config(**run.config)
    if cfg.get("meta", {}).get("learner") != "gamma-net":
        raise ValueError(f"run {run.path.name} learns no per-sample gamma: its config has "
                         f"no meta learner 'gamma-net'")
    return cfg


def _read(run: Any) -> np.ndarray | None:
    folder = Path(run.path) / GAMMA_FOLDER
    if not folder.is_dir():
        return None
    remedy = f"delete the folder {folder}; the next call recomputes it"
    try:
        manifest, files = store.read_entry(folder, kind=_KIND, remedy=remedy)
    except store.OutdatedRun:
        return None  # recomputed, and replaced by write_entry
    if manifest.get("config_hash") != run.path.name or GAMMA_FILE not in files:
        raise store.CorruptRun(f"{folder / store.MANIFEST} does not describe this run's "
                               f"test gamma; {remedy}")
    gamma = store.parse_npz(files[GAMMA_FILE], folder / GAMMA_FILE, remedy).get("gamma")
    n = run.test_logits.shape[0]
    if gamma is None or gamma.dtype != np.float32 or gamma.shape != (n,):
        raise store.CorruptRun(f"{folder / GAMMA_FILE} holds no float32 gamma of shape ({n},);"
                               f" {remedy}")
    return gamma


def run_test_gamma(
    run: Any,
    *,
    device: str | torch.device = "auto",
    checkpoint_root: str | Path | None = None,
    retrain: bool = True,
) -> torch.Tensor:
    """gamma-Net's gamma ``(N,)`` (float32, CPU) on each test image of a stored gamma-Net
    run, in the order of its ``test_logits`` (see the module docstring). ``ValueError`` for a
    run without gamma-Net; ``checkpoint_root`` and ``retrain`` as for
    :func:`calnotes.runs.ood.trained_model`."""
    cfg = _check_gamma_run(run)
    found = _read(run)
    if found is None:
        model, state, splits = trained_state(run, device=device,
                                             checkpoint_root=checkpoint_root, retrain=retrain)
        if "gamma_net" not in state:
            raise RuntimeError(f"the checkpoint of run {run.path.name} holds no gamma-Net")
        trainer = experiment.make_trainer(cfg, model, device=device, progress=False)
        trainer.gamma_net.load_state_dict(state["gamma_net"])
        _, _, test_loader = data.make_loaders(splits, batch_size=1000,
                                              device=trainer.device)
        gamma = trainer.predict_gamma(test_loader).numpy().astype(np.float32)
        store.write_entry(Path(run.path) / GAMMA_FOLDER,
                          {GAMMA_FILE: store.npz_bytes({"gamma": gamma})},
                          {"kind": _KIND, "config_hash": run.path.name})
        found = _read(run)  # read back verified
        if found is None:
            raise RuntimeError(f"the test gamma of run {run.path.name} was not stored")
    return torch.from_numpy(found)
