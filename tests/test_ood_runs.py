"""A stored run on OOD sets: run_ood_logits (cached), trained_model, score_report."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from calnotes import data
from calnotes.ood import auroc, energy, fpr_at_tpr, msp, ood_report, score_report
from calnotes.runs import ood as ood_runs
from calnotes.runs import store
from calnotes.runs.experiment import default_config
from calnotes.runs.ood import OOD_FOLDER, OOD_LOGITS_FILE, run_ood_logits, trained_model
from calnotes.runs.store import RunStore, load_or_run
from calnotes.training import predict_logits

torch.set_num_threads(1)

# A tiny real run: LeNet-5 on scikit-learn's 8x8 digits, one epoch, on the CPU.
CONFIG = default_config(dataset="digits", model="lenet5", epochs=1, lr=0.05, seed=0,
                        train_subset=200, test_subset=100, batch_size=64, val_size=300)


@pytest.fixture
def stored(tmp_path: Path):
    runs = RunStore(tmp_path / "results")
    run = load_or_run(CONFIG, store=runs, checkpoint_root=tmp_path / "ckpt",
                      device="cpu", progress=False)
    splits = data.load_dataset("digits", seed=0, val_size=300, train_subset=200,
                                test_subset=100)
    sets = {"gaussian": data.ood_images("gaussian", splits, n=30, seed=1),
            "uniform": data.ood_images("uniform", splits, n=20, seed=2)}
    return run, sets, tmp_path / "ckpt", splits


def _expected(model: torch.nn.Module, splits: data.DatasetSplits, x: torch.Tensor):
    loader = data.DeviceLoader(data.ImageData(x, torch.zeros(len(x), dtype=torch.long)), 7,
                               shuffle=False, mean=splits.mean, std=splits.std)
    return predict_logits(model, loader)[0]


def test_run_ood_logits_are_the_models_logits_and_are_cached(stored, monkeypatch) -> None:
    run, sets, ckpt, splits = stored
    out = run_ood_logits(run, sets, device="cpu", checkpoint_root=ckpt)
    assert list(out) == ["gaussian", "uniform"]
    assert out["gaussian"].shape == (30, 10) and out["gaussian"].dtype == torch.float32
    model, _ = trained_model(run, device="cpu", checkpoint_root=ckpt)
    for name, x in sets.items():
        # float32 storage; _expected uses batches of 7, not 1000: float32 sums are
        # reordered, so equal to float32 rounding of logits of size ~10
        torch.testing.assert_close(out[name], _expected(model, splits, x), rtol=1e-5, atol=1e-5)
        entry = run.path / OOD_FOLDER / _sha(x)[:16]
        manifest = json.loads((entry / store.MANIFEST).read_text())
        assert manifest["format"] == store.FORMAT and manifest["kind"] == "ood_logits"
        assert manifest["images_sha256"] == _sha(x)
        with np.load(entry / OOD_LOGITS_FILE) as npz:
            assert npz["logits"].dtype == np.float32

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the cache should have been used")

    monkeypatch.setattr(ood_runs, "trained_model", no_model)
    again = run_ood_logits(run, {"uniform": sets["uniform"]}, device="cpu", checkpoint_root=ckpt)
    assert torch.equal(again["uniform"], out["uniform"])
    # entries are keyed by the images, not by the set's name
    renamed = run_ood_logits(run, {"noise": sets["gaussian"]}, checkpoint_root=ckpt)
    assert torch.equal(renamed["noise"], out["gaussian"])
    with pytest.raises(AssertionError, match="cache"):  # other images: not stored
        run_ood_logits(run, {"uniform": sets["uniform"][:10]}, checkpoint_root=ckpt)


def _sha(images: torch.Tensor) -> str:
    return ood_runs._images_digest(images)


def test_stored_sets_are_kept_and_go_with_their_training(stored, monkeypatch) -> None:
    run, sets, ckpt, _ = stored
    run_ood_logits(run, {"gaussian": sets["gaussian"]}, device="cpu", checkpoint_root=ckpt)
    run_ood_logits(run, {"uniform": sets["uniform"]}, device="cpu", checkpoint_root=ckpt)
    assert sorted(p.name for p in (run.path / OOD_FOLDER).iterdir()
                  if not p.name.startswith(".")) == sorted(_sha(x)[:16] for x in sets.values())
    calls = []
    real = ood_runs.trained_model

    def counting(*args: object, **kwargs: object):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(ood_runs, "trained_model", counting)
    run_ood_logits(run, sets, device="cpu", checkpoint_root=ckpt)
    assert calls == []
    # a recomputed run is a new folder: the OOD logits of the old training are gone
    runs = RunStore(run.path.parent)
    shutil.rmtree(run.path)
    shutil.rmtree(ckpt)
    again = load_or_run(CONFIG, store=runs, checkpoint_root=ckpt, device="cpu", progress=False)
    run_ood_logits(again, sets, device="cpu", checkpoint_root=ckpt)
    assert calls == [1]


def test_a_damaged_ood_entry_is_refused_naming_the_file(stored) -> None:
    run, sets, ckpt, _ = stored
    x = sets["uniform"]
    first = run_ood_logits(run, {"u": x}, device="cpu", checkpoint_root=ckpt)["u"]
    entry = run.path / OOD_FOLDER / _sha(x)[:16]
    path = entry / OOD_LOGITS_FILE
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(store.CorruptRun, match=rf"{path} does not match the SHA-256.*delete"):
        run_ood_logits(run, {"u": x}, device="cpu", checkpoint_root=ckpt)
    manifest = json.loads((entry / store.MANIFEST).read_text())  # checksum of the cut file
    manifest["files"][OOD_LOGITS_FILE] = hashlib.sha256(data[: len(data) // 2]).hexdigest()
    (entry / store.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(store.CorruptRun, match=rf"{path} is not a readable \.npz"):
        run_ood_logits(run, {"u": x}, device="cpu", checkpoint_root=ckpt)
    # an entry of an older format is recomputed and replaced
    (entry / store.MANIFEST).write_text(json.dumps({**manifest, "format": 1}))
    again = run_ood_logits(run, {"u": x}, device="cpu", checkpoint_root=ckpt)["u"]
    assert torch.equal(again, first)  # same model, same batches: same bits
    assert json.loads((entry / store.MANIFEST).read_text())["format"] == store.FORMAT


def test_trained_model_retrains_without_a_checkpoint(stored, tmp_path: Path) -> None:
    run, sets, ckpt, splits = stored
    model, _ = trained_model(run, device="cpu", checkpoint_root=ckpt)
    empty = tmp_path / "elsewhere"
    with pytest.raises(FileNotFoundError, match="no checkpoint of run"):
        trained_model(run, device="cpu", checkpoint_root=empty, retrain=False)
    again, _ = trained_model(run, device="cpu", checkpoint_root=empty)  # CPU: same weights
    x = sets["gaussian"]
    torch.testing.assert_close(_expected(again, splits, x), _expected(model, splits, x))
    assert not empty.exists()  # retrained in a temporary folder


def test_trained_model_finds_the_scratch_store_checkpoints(tmp_path: Path) -> None:
    # calnotes.runs.store.chapter_run keeps a scratch store in <tmp>/results and its
    # checkpoints in <tmp>/checkpoints
    run = load_or_run(CONFIG, store=RunStore(tmp_path / "results"),
                      checkpoint_root=tmp_path / "checkpoints", device="cpu", progress=False)
    model, _ = trained_model(run, device="cpu", retrain=False)
    assert isinstance(model, torch.nn.Module) and not model.training


def test_trained_model_skips_a_checkpoint_of_another_training(stored) -> None:
    run, sets, ckpt, splits = stored
    path = ckpt / run.provenance["config_hash"] / "last.pt"
    good, _ = trained_model(run, device="cpu", checkpoint_root=ckpt)
    state = torch.load(path, weights_only=True)
    state["model"]["head.bias"] = state["model"]["head.bias"] + 1.0
    torch.save(state, path)
    with pytest.raises(RuntimeError, match="another training"):
        trained_model(run, device="cpu", checkpoint_root=ckpt, retrain=False)
    model, _ = trained_model(run, device="cpu", checkpoint_root=ckpt)  # retrains instead
    x = sets["uniform"]
    torch.testing.assert_close(_expected(model, splits, x), _expected(good, splits, x))
    state["epoch"] = 0  # an unfinished training is never used
    torch.save(state, path)
    with pytest.raises(RuntimeError, match="unfinished"):
        trained_model(run, device="cpu", checkpoint_root=ckpt, retrain=False)
    state["epoch"] = CONFIG["epochs"]  # nor one written for another config
    state["fingerprint"]["run_config"]["batch_size"] = 32
    torch.save(state, path)
    with pytest.raises(RuntimeError, match="another config"):
        trained_model(run, device="cpu", checkpoint_root=ckpt, retrain=False)
    path.write_bytes(path.read_bytes()[:100])  # a damaged one is named
    with pytest.raises(ValueError, match=rf"checkpoint {path} cannot be read"):
        trained_model(run, device="cpu", checkpoint_root=ckpt, retrain=False)


def test_binary_runs_get_two_logits(tmp_path: Path) -> None:
    config = default_config(**(CONFIG | {"positive_class": 9}))
    run = load_or_run(config, store=RunStore(tmp_path / "results"),
                      checkpoint_root=tmp_path / "ckpt", device="cpu", progress=False)
    splits = data.load_dataset("digits", seed=0, val_size=300, train_subset=200,
                               test_subset=100)
    out = run_ood_logits(run, {"u": data.ood_images("uniform", splits, n=5)}, device="cpu",
                         checkpoint_root=tmp_path / "ckpt")
    assert out["u"].shape == (5, 2)


def test_run_ood_logits_rejects_bad_input(stored) -> None:
    run, sets, ckpt, _ = stored
    with pytest.raises(TypeError, match="StoredRun"):
        run_ood_logits(object(), sets)
    with pytest.raises(ValueError, match="non-empty mapping"):
        run_ood_logits(run, {})
    with pytest.raises(ValueError, match="uint8"):
        run_ood_logits(run, {"x": sets["gaussian"].float()})
    with pytest.raises(ValueError, match="empty"):
        run_ood_logits(run, {"x": sets["gaussian"][:0]})
    with pytest.raises(TypeError, match="names"):
        run_ood_logits(run, {3: sets["gaussian"]})
    with pytest.raises(TypeError, match="StoredRun"):
        trained_model(json.loads("{}"))


def test_score_report_is_ood_report_of_the_score() -> None:
    rng = np.random.default_rng(0)
    z_in = torch.from_numpy(rng.normal(size=(50, 4)) * 3).float()
    z_out = {"a": torch.from_numpy(rng.normal(size=(40, 4))).float(),
             "b": torch.from_numpy(rng.normal(size=(30, 4)) * 2).float()}
    for name, fn in (("msp", msp), ("energy", energy)):
        table = score_report(z_in, z_out, name)
        expected = ood_report(fn(z_in.double()), {k: fn(v.double()) for k, v in z_out.items()})
        assert np.allclose(table.to_numpy(), expected.to_numpy())
        assert list(table.index) == ["a", "b", "average"]
        assert table.loc["a", "auroc"] == pytest.approx(
            auroc(fn(z_in.double()), fn(z_out["a"].double())))
    # float64 scores: a logit gap of 20 saturates float32's MSP to exactly 1, not float64's
    z_in = torch.tensor([[20.0, 0.0], [21.0, 0.0], [22.0, 0.0], [23.0, 0.0]])
    z_out = {"o": torch.tensor([[20.5, 0.0], [19.0, 0.0]])}
    assert torch.all(msp(z_in) == 1.0)
    table = score_report(z_in, z_out, "msp", tpr=0.75)
    assert table.loc["o", "fpr@75tpr"] == pytest.approx(
        fpr_at_tpr(msp(z_in.double()), msp(z_out["o"].double()), 0.75))
    assert table.loc["o", "fpr@75tpr"] == 0.0


def test_score_report_rejects_bad_input() -> None:
    z = torch.zeros((3, 2))
    with pytest.raises(ValueError, match="score must be one of"):
        score_report(z, {"o": z}, "odin")
    with pytest.raises(TypeError, match="mapping"):
        score_report(z, [z])
    with pytest.raises(TypeError, match="floating-point"):
        score_report(z.long(), {"o": z})


# ---------------------------------------------------------------------------------------
# ODIN on a stored run, and the run's own test images
# ---------------------------------------------------------------------------------------
def _odin_by_hand(model: torch.nn.Module, splits: data.DatasetSplits, images: torch.Tensor,
                  temperature: float, epsilon: float) -> torch.Tensor:
    """ODIN's step in pixel units, written out: u in [0, 1], normalized inside."""
    mean = torch.tensor(splits.mean).view(1, -1, 1, 1)
    std = torch.tensor(splits.std).view(1, -1, 1, 1)
    u = (images.float() / 255.0).requires_grad_(True)
    z = model((u - mean) / std)
    loss = -torch.log_softmax(z / temperature, dim=1).amax(dim=1).sum()
    (g,) = torch.autograd.grad(loss, u)
    with torch.no_grad():
        return model((u - epsilon * g.sign() - mean) / std)


def test_run_test_images_are_the_runs_test_split(stored) -> None:
    run, _, _, splits = stored
    assert torch.equal(ood_runs.run_test_images(run), splits.test.images)
    with pytest.raises(TypeError, match="StoredRun"):
        ood_runs.run_test_images(object())


def test_run_odin_logits_are_odins_step_in_pixel_units_and_are_stored(stored,
                                                                     monkeypatch) -> None:
    run, sets, ckpt, splits = stored
    images = {"test": ood_runs.run_test_images(run), "gaussian": sets["gaussian"]}
    out = ood_runs.run_odin_logits(run, images, temperature=100.0, epsilon=0.01,
                                   device="cpu", checkpoint_root=ckpt)
    model, _ = trained_model(run, device="cpu", checkpoint_root=ckpt)
    for name, x in images.items():
        # batches of 500 against one batch: float32 sums reordered, logits of size ~10
        torch.testing.assert_close(out[name], _odin_by_hand(model, splits, x, 100.0, 0.01),
                                   rtol=1e-5, atol=1e-5)
    # a step of 0 leaves the plain logits
    plain = ood_runs.run_odin_logits(run, {"g": sets["gaussian"]}, temperature=100.0,
                                     epsilon=0.0, device="cpu", checkpoint_root=ckpt)["g"]
    torch.testing.assert_close(plain, run_ood_logits(run, {"g": sets["gaussian"]},
                                                     checkpoint_root=ckpt)["g"])
    entries = [p for p in (run.path / OOD_FOLDER).iterdir() if not p.name.startswith(".")]
    kinds = sorted(json.loads((p / store.MANIFEST).read_text())["kind"] for p in entries)
    assert kinds == ["odin_logits"] * 3 + ["ood_logits"]

    def no_model(*args: object, **kwargs: object) -> None:
        raise AssertionError("the stored entry should have been used")

    monkeypatch.setattr(ood_runs, "trained_model", no_model)
    again = ood_runs.run_odin_logits(run, {"x": sets["gaussian"]}, temperature=100.0,
                                     epsilon=0.01, checkpoint_root=ckpt)
    assert torch.equal(again["x"], out["gaussian"])
    with pytest.raises(AssertionError, match="stored entry"):  # another temperature
        ood_runs.run_odin_logits(run, {"x": sets["gaussian"]}, temperature=10.0,
                                 epsilon=0.01, checkpoint_root=ckpt)


def test_odin_after_temperature_scaling_is_odin_at_the_product(stored) -> None:
    run, sets, ckpt, splits = stored
    x, t_ts = sets["gaussian"], 1.7
    model, _ = trained_model(run, device="cpu", checkpoint_root=ckpt)

    class Scaled(torch.nn.Module):
        def forward(self, inp: torch.Tensor) -> torch.Tensor:
            return model(inp) / t_ts

    by_hand = msp(_odin_by_hand(Scaled(), splits, x, 100.0, 0.01).double() / 100.0)
    stored_ = ood_runs.run_odin_logits(run, {"g": x}, temperature=100.0 * t_ts, epsilon=0.01,
                                       device="cpu", checkpoint_root=ckpt)["g"]
    # f / t_ts / 100 and f / (100 t_ts) round differently, which can flip the sign of a
    # gradient entry within rounding of 0 and move a pixel by 2 epsilon: a far smaller
    # change in the score than 1e-4
    torch.testing.assert_close(msp(stored_.double() / (100.0 * t_ts)), by_hand,
                               rtol=0, atol=1e-4)


def test_run_odin_logits_rejects_bad_input(stored) -> None:
    run, sets, ckpt, _ = stored
    with pytest.raises(TypeError, match="StoredRun"):
        ood_runs.run_odin_logits(object(), sets)
    with pytest.raises(ValueError, match="temperature"):
        ood_runs.run_odin_logits(run, sets, temperature=0.0)
    with pytest.raises(ValueError, match="epsilon"):
        ood_runs.run_odin_logits(run, sets, epsilon=-0.1)
    with pytest.raises(ValueError, match="uint8"):
        ood_runs.run_odin_logits(run, {"x": sets["gaussian"].float()})
