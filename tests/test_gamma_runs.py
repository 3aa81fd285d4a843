"""run_test_gamma: a stored gamma-Net run's per-sample test gamma, recovered and cached."""

from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest
import torch

from calnotes.runs import gamma as gamma_runs
from calnotes.runs import store
from calnotes.runs.experiment import default_config
from calnotes.runs.gamma import GAMMA_FILE, GAMMA_FOLDER, run_test_gamma
from calnotes.runs.store import RunStore, load_or_run

torch.set_num_threads(1)

# A tiny real meta run: LeNet-5 with gamma-Net on scikit-learn's 8x8 digits, two epochs.
CONFIG = default_config(dataset="digits", model="lenet5", epochs=2, lr=0.05, seed=0,
                        train_subset=400, test_subset=100, batch_size=64, val_size=300,
                        loss="focal", meta={"meta_val_size": 100})


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    root = tmp_path_factory.mktemp("gamma")
    run = load_or_run(CONFIG, store=RunStore(root / "results"), checkpoint_root=root / "ckpt",
                      device="cpu", progress=False)
    return run, root / "ckpt"


def test_test_gamma_is_gamma_nets_on_each_test_image_and_is_cached(stored, monkeypatch):
    run, ckpt = stored
    out = run_test_gamma(run, device="cpu", checkpoint_root=ckpt)
    gamma = out.gamma
    assert gamma.shape == (run.test_logits.shape[0],) and gamma.dtype == torch.float32
    assert bool((gamma > 0).all())  # gamma-Net's output is a positive gamma
    # the run's own checkpoint: its network is the stored one (float32 sums reordered)
    assert out.reproduces and out.max_logit_diff < 1e-4
    torch.testing.assert_close(out.logits, run.test_logits, rtol=1e-5, atol=1e-5)
    # the trainer recorded gamma's mean and std on the same test images after the last epoch
    # (one forward in batches of 64 there, of 1000 here: float32 sums reordered)
    mean, std = run.history["gamma_mean"][-1], run.history["gamma_std"][-1]
    assert float(gamma.double().mean()) == pytest.approx(mean, abs=1e-5)
    assert float(gamma.double().std(unbiased=False)) == pytest.approx(std, abs=1e-5)
    assert (run.path / GAMMA_FOLDER / GAMMA_FILE).is_file()

    def no_weights(*args, **kwargs):
        raise AssertionError("a stored gamma needs no weights")

    monkeypatch.setattr(gamma_runs, "trained_state", no_weights)
    again = run_test_gamma(run, device="cpu", checkpoint_root=ckpt)
    assert torch.equal(again.gamma, gamma) and torch.equal(again.logits, out.logits)


def test_test_gamma_retrains_without_a_checkpoint(stored, tmp_path):
    run, ckpt = stored
    cached = run_test_gamma(run, device="cpu", checkpoint_root=ckpt)
    folder = tmp_path / "results" / run.path.name
    shutil.copytree(run.path, folder)
    shutil.rmtree(folder / GAMMA_FOLDER)
    copy = dataclasses.replace(run, path=folder)
    again = run_test_gamma(copy, device="cpu", checkpoint_root=tmp_path / "none")
    torch.testing.assert_close(again.gamma, cached.gamma, rtol=1e-5, atol=1e-5)
    assert again.reproduces


def test_a_retrained_network_that_diverged_is_kept_and_said_so(stored, tmp_path):
    run, ckpt = stored
    folder = tmp_path / "results" / run.path.name
    shutil.copytree(run.path, folder)
    shutil.rmtree(folder / GAMMA_FOLDER, ignore_errors=True)
    # as if another CPU had stored the run: its stored logits differ from any retraining
    moved = dataclasses.replace(run, path=folder, test_logits=run.test_logits + 0.5)
    out = run_test_gamma(moved, device="cpu", checkpoint_root=tmp_path / "none")
    assert not out.reproduces and out.max_logit_diff == pytest.approx(0.5, abs=1e-4)
    torch.testing.assert_close(out.logits, run.test_logits, rtol=1e-5, atol=1e-5)


def test_damaged_gamma_is_reported_with_its_path(stored, tmp_path):
    run, ckpt = stored
    run_test_gamma(run, device="cpu", checkpoint_root=ckpt)
    folder = tmp_path / "results" / run.path.name
    shutil.copytree(run.path, folder)
    (folder / GAMMA_FOLDER / GAMMA_FILE).write_bytes(b"not an npz")
    copy = dataclasses.replace(run, path=folder)
    with pytest.raises(store.CorruptRun, match=GAMMA_FOLDER):
        run_test_gamma(copy, device="cpu", checkpoint_root=ckpt)


def test_a_run_without_gamma_net_is_refused(tmp_path):
    plain = load_or_run({k: v for k, v in CONFIG.items() if k not in ("meta", "loss")},
                        store=RunStore(tmp_path / "results"), checkpoint_root=tmp_path / "c",
                        device="cpu", progress=False)
    with pytest.raises(ValueError, match="gamma-net"):
        run_test_gamma(plain, device="cpu")
    with pytest.raises(TypeError, match="StoredRun"):
        run_test_gamma(np.zeros(3))


@pytest.mark.parametrize(("edit", "shown"), [
    (lambda m: m.pop("max_logit_diff"), "None"),
    (lambda m: m.update(max_logit_diff="big"), "'big'"),
    (lambda m: m.update(max_logit_diff=float("nan")), "nan"),
])
def test_a_manifest_without_a_numeric_max_logit_diff_names_the_entry(stored, tmp_path, edit,
                                                                      shown):
    import json
    import re

    run, ckpt = stored
    run_test_gamma(run, device="cpu", checkpoint_root=ckpt)
    folder = tmp_path / "results" / run.path.name
    shutil.copytree(run.path, folder)
    path = folder / GAMMA_FOLDER / store.MANIFEST
    manifest = json.loads(path.read_text())
    edit(manifest)
    path.write_text(json.dumps(manifest))
    copy = dataclasses.replace(run, path=folder)
    with pytest.raises(store.CorruptRun, match=rf"{re.escape(str(folder / GAMMA_FOLDER))}: "
                                               rf"its manifest's max_logit_diff must be a "
                                               rf"finite number >= 0, got {shown}"):
        run_test_gamma(copy, device="cpu", checkpoint_root=ckpt)
