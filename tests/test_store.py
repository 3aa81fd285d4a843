"""Tests of calnotes.runs.store (run store, load_or_run) and calnotes.runs.experiment (configs,
loss registry, train_run wiring)."""

from __future__ import annotations

import hashlib
import json
import math
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from calnotes.runs import experiment, store
from calnotes.runs.experiment import RunResult, default_config, make_loss, register_loss
from calnotes.runs.store import RunNotFound, RunStore, StoredRun, config_hash, load_or_run
from calnotes.training import History

torch.set_num_threads(min(2, torch.get_num_threads()))

PROVENANCE_KEYS = {
    "experiment", "config_hash", "calnotes_version", "git_commit", "python", "torch",
    "numpy", "platform", "device", "seconds", "date_utc",
}


def fake_result(config: dict | None = None, seed: int = 0, with_val: bool = True) -> RunResult:
    gen = torch.Generator().manual_seed(seed)
    history = History()
    for epoch in (1, 2):
        history.append({"epoch": epoch, "lr": 0.1 / epoch, "train_loss": 1.0 / epoch,
                        "val_ece": 0.05 * epoch, "seconds": 0.5})
    return RunResult(
        config=default_config(**(config or {})),
        history=history,
        val_logits=10 * torch.randn(30, 4, generator=gen) if with_val else None,
        val_labels=torch.randint(0, 4, (30,), generator=gen) if with_val else None,
        test_logits=10 * torch.randn(40, 4, generator=gen),
        test_labels=torch.randint(0, 4, (40,), generator=gen),
        metrics={"test_ece": 0.125, "test_error": 0.5, "val_ece": 0.25},
        seconds=123.4,
        device="cpu",
    )


# --------------------------------------------------------------------------- config_hash


def test_config_hash_is_stable_canonical_and_order_independent() -> None:
    config = {"b": [1, 2], "a": {"y": 0.5, "x": None}}
    canonical = '{"a":{"x":null,"y":0.5},"b":[1,2]}'
    assert config_hash(config) == hashlib.sha256(canonical.encode()).hexdigest()[:12]
    assert config_hash(config) == config_hash(dict(reversed(config.items())))
    assert config_hash({"a": {"x": None, "y": 0.5}, "b": (1, 2)}) == config_hash(config)
    assert len(config_hash(config)) == 12
    assert config_hash({"lr": 0.1}) != config_hash({"lr": 0.10000001})
    assert config_hash(default_config()) == config_hash(default_config(epochs=10))
    assert config_hash(default_config()) != config_hash(default_config(epochs=11))


def test_config_hash_pinned_value() -> None:
    # changing the canonical form would orphan every stored run: pin one value
    assert config_hash({"a": 1}) == hashlib.sha256(b'{"a":1}').hexdigest()[:12] == "015abd7f5cc5"


def test_config_hash_rejects_bad_configs() -> None:
    with pytest.raises(TypeError, match="config"):
        config_hash([("a", 1)])
    with pytest.raises(TypeError, match="JSON"):
        config_hash({"a": object()})
    with pytest.raises(ValueError, match="NaN"):
        config_hash({"lr": float("nan")})
    with pytest.raises(ValueError, match="device"):
        config_hash({"device": "cuda"})


# --------------------------------------------------------------------------- experiments


def test_default_config_defaults_and_overrides() -> None:
    config = default_config()
    assert config["dataset"] == "fashion_mnist" and config["model"] == "lenet5"
    assert config["lr"] == 0.05 and config["epochs"] == 10 and config["val_size"] == 5000
    assert config["model_options"] == {} and config["amp"] is False
    assert json.loads(json.dumps(config)) == config
    config["model_options"]["width"] = 2  # the defaults must not be shared
    assert default_config()["model_options"] == {}
    assert default_config(epochs=3, model="resnet20")["epochs"] == 3


def test_default_config_rejects_unknown_keys() -> None:
    with pytest.raises(ValueError, match=r"unknown config key.*'epoch'.*valid keys"):
        default_config(epoch=3)
    with pytest.raises(ValueError, match="device"):
        default_config(device="cuda")
    with pytest.raises(TypeError, match="model_options"):
        default_config(model_options=3)


def test_make_loss_and_registry(monkeypatch) -> None:
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0]])
    labels = torch.tensor([0, 1])
    ce = make_loss("ce")
    assert float(ce(logits, labels)) == pytest.approx(
        float(nn.functional.cross_entropy(logits, labels)))
    smoothed = make_loss("ce", label_smoothing=0.2)
    assert float(smoothed(logits, labels)) > float(ce(logits, labels))
    with pytest.raises(ValueError, match="unknown loss"):
        make_loss("no_such_loss")
    with pytest.raises(ValueError, match="unknown option"):
        make_loss("ce", gamma=2.0)

    monkeypatch.setattr(experiment, "_REGISTRY", dict(experiment._REGISTRY))

    def double_ce(scale: float = 2.0):
        return lambda z, y: scale * nn.functional.cross_entropy(z, y)

    register_loss("double_ce", double_ce)
    assert "double_ce" in experiment.available_losses()
    assert float(make_loss("double_ce", scale=3.0)(logits, labels)) == pytest.approx(
        3 * float(ce(logits, labels)))
    with pytest.raises(ValueError, match="already registered"):
        register_loss("ce", double_ce)
    register_loss("ce", double_ce, overwrite=True)
    with pytest.raises(TypeError, match="factory"):
        register_loss("other", 3)


# --------------------------------------------------------------------------- RunStore


def test_save_load_round_trip(tmp_path: Path) -> None:
    runs = RunStore(tmp_path)
    result = fake_result({"epochs": 2})
    folder = runs.save("exp1", result)
    assert folder == tmp_path / "exp1" / config_hash(result.config)
    assert sorted(p.name for p in folder.iterdir()) == sorted([*store.FILES, store.DONE])
    assert runs.exists("exp1", result.config)
    assert not runs.exists("exp1", default_config())
    assert not runs.exists("exp2", result.config)

    with np.load(folder / "predictions.npz") as npz:
        assert npz["test_logits"].dtype == np.float16
        assert npz["test_labels"].dtype == np.int16

    run = runs.load("exp1", result.config)
    assert isinstance(run, StoredRun)
    assert run.config == result.config
    assert run.history == result.history
    assert run.metrics == result.metrics
    for name in ("val", "test"):
        logits, labels = getattr(run, f"{name}_logits"), getattr(run, f"{name}_labels")
        assert logits.dtype == torch.float32 and labels.dtype == torch.int64
        # float16 keeps 11 significant bits: relative error <= 2^-11
        torch.testing.assert_close(logits, getattr(result, f"{name}_logits"), rtol=1e-3,
                                   atol=1e-3)
        assert torch.equal(labels, getattr(result, f"{name}_labels"))
    assert runs.list("exp1") == [result.config]
    assert runs.list("never") == []


def test_save_accepts_numpy_and_missing_val(tmp_path: Path) -> None:
    result = fake_result(with_val=False)
    result.test_logits = result.test_logits.numpy()
    result.test_labels = result.test_labels.numpy()
    runs = RunStore(tmp_path)
    runs.save("exp", result)
    run = runs.load("exp", result.config)
    assert run.val_logits is None and run.val_labels is None
    assert run.test_logits.shape == (40, 4)


def test_huge_logits_are_kept_in_float32(tmp_path: Path) -> None:
    result = fake_result()
    result.test_logits[0, 0] = 1e6  # beyond float16's range
    runs = RunStore(tmp_path)
    runs.save("exp", result)
    assert runs.load("exp", result.config).test_logits[0, 0] == 1e6


def test_provenance(tmp_path: Path) -> None:
    runs = RunStore(tmp_path)
    result = fake_result()
    runs.save("exp", result)
    run = runs.load("exp", result.config)
    assert set(run.provenance) >= PROVENANCE_KEYS
    assert run.provenance["seconds"] == pytest.approx(123.4)
    assert run.provenance["device"] == "cpu"
    assert run.provenance["torch"] == torch.__version__
    assert run.provenance["date_utc"].endswith("+00:00")
    commit = run.provenance["git_commit"]
    assert commit is None or len(commit) >= 40
    text = run.provenance_text()
    assert "cpu" in text and "2.1 min" in text and "calnotes" in text
    assert "\n" not in text


def test_failed_write_leaves_no_partial_file(tmp_path: Path, monkeypatch) -> None:
    runs = RunStore(tmp_path)
    result = fake_result()
    real_write = store._atomic_write

    def write_then_fail(path: Path, data: bytes) -> None:
        if path.name == "predictions.npz":  # fail in the middle of writing this file
            def broken_fsync(fd):
                raise OSError("disk full")
            monkeypatch.setattr(store.os, "fsync", broken_fsync)
        real_write(path, data)

    monkeypatch.setattr(store, "_atomic_write", write_then_fail)
    with pytest.raises(OSError, match="disk full"):
        runs.save("exp", result)
    folder = runs.path("exp", result.config)
    names = {p.name for p in folder.iterdir()}
    assert names == {"config.json", "history.json", "metrics.json"}  # no temp, no npz
    assert not runs.exists("exp", result.config)
    with pytest.raises(RunNotFound):
        runs.load("exp", result.config)
    assert runs.list("exp") == []


def test_atomic_write_keeps_old_file_on_failure(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "metrics.json"
    store._atomic_write(target, b"old")

    def broken_replace(src, dst):
        raise OSError("interrupted")

    monkeypatch.setattr(store.os, "replace", broken_replace)
    with pytest.raises(OSError, match="interrupted"):
        store._atomic_write(target, b"new content")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_store_rejects_bad_arguments(tmp_path: Path) -> None:
    runs = RunStore(tmp_path)
    for bad in ("", "../up", "a/b", 3):
        with pytest.raises(ValueError, match="experiment"):
            runs.path(bad, {})
    with pytest.raises(TypeError, match="result"):
        runs.save("exp", {"config": {}})
    with pytest.raises(TypeError, match="root"):
        RunStore(3)


def test_run_not_found_is_a_key_error_with_a_readable_message(tmp_path: Path) -> None:
    with pytest.raises(KeyError) as info:
        RunStore(tmp_path).load("exp", default_config())
    assert str(info.value).startswith("no complete run")


# --------------------------------------------------------------------------- load_or_run


@pytest.fixture
def counted_train_run(monkeypatch):
    calls: list[dict] = []

    def train_run(config, device="auto", checkpoint_dir=None, progress=True):
        calls.append({"config": config, "device": device, "checkpoint_dir": checkpoint_dir,
                      "progress": progress})
        return fake_result(config)

    monkeypatch.setattr(experiment, "train_run", train_run)
    return calls


def test_load_or_run_computes_once_then_loads(tmp_path: Path, counted_train_run) -> None:
    runs = RunStore(tmp_path / "results")
    ckpt = tmp_path / "ckpt"
    first = load_or_run("exp", {"epochs": 2}, store=runs, checkpoint_root=ckpt, progress=False,
                        device="cpu")
    second = load_or_run("exp", default_config(epochs=2), store=runs, checkpoint_root=ckpt)
    assert len(counted_train_run) == 1
    call = counted_train_run[0]
    digest = config_hash(default_config(epochs=2))
    assert call["config"] == default_config(epochs=2)
    assert Path(call["checkpoint_dir"]) == ckpt / digest
    assert call["device"] == "cpu" and call["progress"] is False
    assert first.path == second.path == tmp_path / "results" / "exp" / digest
    assert torch.equal(first.test_logits, second.test_logits)
    assert first.history == second.history


def test_load_or_run_without_compute_explains(tmp_path: Path, counted_train_run) -> None:
    with pytest.raises(RunNotFound, match="make results"):
        load_or_run("exp", {}, store=RunStore(tmp_path), compute=False)
    assert counted_train_run == []


def test_load_or_run_uses_environment_locations(tmp_path: Path, monkeypatch,
                                                counted_train_run) -> None:
    monkeypatch.setenv("CALNOTES_RESULTS", str(tmp_path / "env_results"))
    monkeypatch.setenv("CALNOTES_CHECKPOINTS", str(tmp_path / "env_ckpt"))
    run = load_or_run("exp", {"seed": 1}, progress=False)
    digest = config_hash(default_config(seed=1))
    assert run.path == tmp_path / "env_results" / "exp" / digest
    assert Path(counted_train_run[0]["checkpoint_dir"]) == tmp_path / "env_ckpt" / digest
    assert RunStore().root == tmp_path / "env_results"


def test_load_or_run_rejects_bad_config(tmp_path: Path, counted_train_run) -> None:
    with pytest.raises(ValueError, match="valid keys"):
        load_or_run("exp", {"epoch": 3}, store=RunStore(tmp_path))
    with pytest.raises(TypeError, match="store"):
        load_or_run("exp", {}, store=str(tmp_path))


# --------------------------------------------------------------------------- train_run


@dataclass
class _Images:
    images: torch.Tensor
    labels: torch.Tensor


class _Loader:
    def __init__(self, x, y, batch_size, device, shuffle, seed):
        self.x, self.y = x.to(device), y.to(device)
        self.batch_size, self.shuffle, self.seed, self.epoch = batch_size, shuffle, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return math.ceil(len(self.y) / self.batch_size)

    def __iter__(self):
        n = len(self.y)
        gen = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
        order = torch.randperm(n, generator=gen) if self.shuffle else torch.arange(n)
        for i in range(0, n, self.batch_size):
            idx = order[i : i + self.batch_size].to(self.x.device)
            yield self.x[idx].float() / 255, self.y[idx]


def _fake_data_module() -> types.ModuleType:
    """Stand-in with calnotes.data's interface: three Gaussian blob classes as 1x4x4 images."""

    def load_dataset(name, root=None, val_size=None, seed=0, train_subset=None,
                     test_subset=None):
        gen = torch.Generator().manual_seed(seed)
        centers = torch.rand(3, 1, 4, 4, generator=gen) * 200 + 25

        def part(n):
            y = torch.arange(n) % 3
            x = (centers[y] + 15 * torch.randn(n, 1, 4, 4, generator=gen)).clamp(0, 255)
            return _Images(x.to(torch.uint8), y)

        return types.SimpleNamespace(
            name=name, train=part(150), val=part(val_size), test=part(60), num_classes=3,
            in_channels=1, image_size=4, mean=(0.5,), std=(0.25,), class_names=["a", "b", "c"],
            allow_flip=False,
        )

    def make_loaders(splits, batch_size, device, augment, seed):
        return tuple(
            _Loader(part.images, part.labels, batch_size, device, shuffle, seed)
            for part, shuffle in ((splits.train, True), (splits.val, False),
                                  (splits.test, False))
        )

    return types.SimpleNamespace(load_dataset=load_dataset, make_loaders=make_loaders)


def _fake_models_module() -> types.ModuleType:
    def build_model(name, num_classes, in_channels, image_size, **options):
        width = options.get("width", 16)
        return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * image_size**2, width),
                             nn.ReLU(), nn.Linear(width, num_classes))

    return types.SimpleNamespace(build_model=build_model)


def test_train_run_wires_data_model_trainer_and_metrics(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(experiment, "data", _fake_data_module())
    monkeypatch.setattr(experiment, "models", _fake_models_module())
    config = {"dataset": "blobs", "model": "mlp", "model_options": {"width": 8}, "epochs": 3,
              "batch_size": 32, "val_size": 45, "lr": 0.1}
    result = experiment.train_run(config, device="cpu", progress=False,
                                   checkpoint_dir=str(tmp_path / "ckpt"))
    assert result.config == default_config(**config)
    assert len(result.history) == 3 and result.history["val_acc"][-1] > 0.6
    assert result.val_logits.shape == (45, 3) and result.test_logits.shape == (60, 3)
    assert result.test_labels.dtype == torch.int64
    assert {"test_ece", "test_nll", "test_error", "val_ece", "val_nll"} <= set(result.metrics)
    assert all(isinstance(v, float) for v in result.metrics.values())
    assert result.device == "cpu" and result.seconds > 0
    assert (tmp_path / "ckpt" / "last.pt").is_file()

    again = experiment.train_run(config, device="cpu", progress=False)  # same seed, no resume
    assert again.history.without_timing() == result.history.without_timing()
    assert torch.equal(again.test_logits, result.test_logits)

    runs = RunStore(tmp_path / "results")
    stored = load_or_run("exp", config, store=runs, checkpoint_root=tmp_path / "ckpts",
                         device="cpu", progress=False)
    assert stored.metrics == pytest.approx(result.metrics)
    assert stored.provenance["device"] == "cpu"
