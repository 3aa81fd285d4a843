"""Tests of calnotes.runs.store (run store, load_or_run) and calnotes.runs.experiment
(configs, loss registry, train_run wiring). Tests with real processes:
test_store_processes.py."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from calnotes import metrics
from calnotes._io import atomic_write, file_lock, sha256_bytes, sha256_file
from calnotes.runs import experiment, store
from calnotes.runs.experiment import RunResult, default_config, make_loss, register_loss
from calnotes.runs.store import (
    CorruptRun,
    OutdatedRun,
    RunNotFound,
    RunStore,
    StoredRun,
    config_hash,
    load_or_run,
)
from calnotes.training import History

torch.set_num_threads(min(2, torch.get_num_threads()))

PROVENANCE_KEYS = {
    "label", "config_hash", "calnotes_version", "git_commit", "python", "torch",
    "numpy", "platform", "device", "seconds", "date_utc",
}


def fake_result(config: dict | None = None, seed: int = 0, with_val: bool = True,
                ece: float = 0.125) -> RunResult:
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
        metrics={"test_ece": ece, "test_error": 0.5, "val_ece": 0.25},
        seconds=123.4,
        device="cpu",
        threads=2,
    )


# --------------------------------------------------------------------------- config_hash


def test_config_hash_is_stable_canonical_and_order_independent() -> None:
    config = default_config(model_options={"width": 8, "batch_norm": True}, epochs=3)
    canonical = json.dumps(config, sort_keys=True, separators=(",", ":"))
    assert config_hash(config) == hashlib.sha256(canonical.encode()).hexdigest()[:12]
    assert config_hash(config) == config_hash(dict(reversed(config.items())))
    assert len(config_hash(config)) == 12
    assert config_hash({"lr": 0.1}) != config_hash({"lr": 0.10000001})
    # missing keys take their defaults: a partial config and the full one are one run
    assert config_hash({}) == config_hash(default_config()) == config_hash({"epochs": 10})
    assert config_hash(default_config()) != config_hash(default_config(epochs=11))


def test_config_hash_pinned_value() -> None:
    # changing the canonical form would orphan every stored run: pin one value
    assert config_hash(default_config()) == "eaa53330a95f"
    # and the hash of a stored run's config, one that is not all defaults
    stored = {
        "amp": False, "augment": False, "batch_size": 64, "dataset": "fashion_mnist",
        "epochs": 20, "loss": "ce", "loss_options": {}, "lr": 0.05, "model": "resnet14",
        "model_options": {"batch_norm": True, "width": 16}, "momentum": 0.9,
        "optimizer": "sgd", "schedule": "cosine", "seed": 0, "test_subset": None,
        "train_subset": 2000, "val_size": 1000, "weight_decay": 0.0,
    }
    assert config_hash(stored) == "1c77a195d7ac"


def test_config_hash_is_one_identity_per_run() -> None:
    # an int where the schema says float is the same run (was: another hash, a retrain)
    assert config_hash({"weight_decay": 0}) == config_hash({"weight_decay": 0.0})
    assert config_hash({"lr": 1}) == config_hash({"lr": 1.0})
    assert config_hash({"epochs": np.int64(3)}) == config_hash({"epochs": 3})
    assert config_hash({"loss": "logitnorm", "loss_options": {"tau": 1}}) == config_hash(
        {"loss": "logitnorm", "loss_options": {"tau": 1.0}})


def test_config_hash_rejects_bad_configs() -> None:
    with pytest.raises(TypeError, match="config"):
        config_hash([("a", 1)])
    with pytest.raises(ValueError, match="unknown config key"):
        config_hash({"a": 1})  # was hashed as if it were a run
    with pytest.raises(TypeError, match=r"config\['epochs'\] must be int"):
        config_hash({"epochs": 3.0})
    with pytest.raises(TypeError, match="model_options"):
        config_hash({"model_options": {"a": object()}})
    with pytest.raises(ValueError, match="finite"):
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
    # the registered factory's float default makes an int option a float
    assert default_config(loss="double_ce", loss_options={"scale": 3})["loss_options"] == {
        "scale": 3.0}
    with pytest.raises(ValueError, match="already registered"):
        register_loss("ce", double_ce)
    register_loss("ce", double_ce, overwrite=True)
    with pytest.raises(TypeError, match="factory"):
        register_loss("other", 3)


# --------------------------------------------------------------------------- RunStore


def test_save_load_round_trip(tmp_path: Path) -> None:
    runs = RunStore(tmp_path)
    result = fake_result({"epochs": 2})
    folder = runs.save(result, label="exp1")
    assert folder == tmp_path / config_hash(result.config)  # keyed by the config alone
    assert sorted(p.name for p in folder.iterdir()) == sorted([*store.FILES, store.MANIFEST])
    assert runs.exists(result.config)
    assert not runs.exists(default_config())

    manifest = json.loads((folder / store.MANIFEST).read_text())
    assert manifest["format"] == store.FORMAT == 2 and manifest["kind"] == "run"
    assert manifest["config_hash"] == folder.name
    assert manifest["files"] == {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest() for name in store.FILES}
    with np.load(folder / "predictions.npz") as npz:
        assert npz["test_logits"].dtype == np.float32
        assert npz["test_labels"].dtype == np.int64

    run = runs.load(result.config)
    assert isinstance(run, StoredRun)
    assert run.label == "exp1" and run.provenance["label"] == "exp1"
    assert run.config == result.config
    assert run.history == result.history
    assert run.metrics == result.metrics
    for name in ("val", "test"):
        logits, labels = getattr(run, f"{name}_logits"), getattr(run, f"{name}_labels")
        assert logits.dtype == torch.float32 and labels.dtype == torch.int64
        # float32 in, float32 stored: the very numbers (float16 rounded them)
        assert torch.equal(logits, getattr(result, f"{name}_logits"))
        assert torch.equal(labels, getattr(result, f"{name}_labels"))
    assert runs.list() == [result.config]
    assert RunStore(tmp_path / "never").list() == []


def test_float32_storage_keeps_published_numbers(tmp_path: Path) -> None:
    # Logits whose float16 rounding moves the ECE: what the store gives back must give
    # the metrics of the logits the model produced (same function, same inputs: equal).
    gen = torch.Generator().manual_seed(3)
    result = fake_result()
    result.test_logits = 3 * torch.randn(2000, 10, generator=gen) + 0.01
    result.test_labels = torch.randint(0, 10, (2000,), generator=gen)
    runs = RunStore(tmp_path)
    runs.save(result)
    run = runs.load(result.config)
    expected = metrics.ece(torch.softmax(result.test_logits, 1), result.test_labels)
    stored = metrics.ece(torch.softmax(run.test_logits, 1), run.test_labels)
    assert stored == expected
    rounded = metrics.ece(torch.softmax(result.test_logits.half().float(), 1),
                          result.test_labels)
    assert rounded != expected  # the test would catch float16 storage


def test_save_accepts_numpy_and_missing_val(tmp_path: Path) -> None:
    result = fake_result(with_val=False)
    result.test_logits = result.test_logits.numpy()
    result.test_labels = result.test_labels.numpy()
    runs = RunStore(tmp_path)
    runs.save(result)
    run = runs.load(result.config)
    assert run.val_logits is None and run.val_labels is None
    assert run.test_logits.shape == (40, 4) and run.label is None


def test_provenance(tmp_path: Path) -> None:
    runs = RunStore(tmp_path)
    result = fake_result()
    runs.save(result, label="ch01_measuring")
    run = runs.load(result.config)
    assert set(run.provenance) >= PROVENANCE_KEYS
    assert run.provenance["seconds"] == pytest.approx(123.4)
    assert run.provenance["device"] == "cpu"
    assert run.provenance["torch"] == torch.__version__
    assert run.provenance["date_utc"].endswith("+00:00")
    commit = run.provenance["git_commit"]
    assert commit is None or len(commit) >= 40
    text = run.provenance_text()
    assert "cpu (2 threads)" in text and "2.1 min" in text and "calnotes" in text
    assert "\n" not in text
    assert run.provenance["cpu_threads"] == 2


@pytest.mark.parametrize(("field", "value", "message"), [
    ("test_logits", torch.full((40, 4), float("nan")), "test_logits contains NaN or inf"),
    ("test_labels", torch.full((40,), 7), r"test_labels must lie in \[0, 4\)"),
    ("val_labels", torch.zeros(29, dtype=torch.long), "val_labels has length 29"),
    ("val_logits", torch.zeros(30, 4, dtype=torch.long), "val_logits must have a floating"),
])
def test_save_refuses_predictions_no_metric_could_read(tmp_path: Path, field, value,
                                                       message) -> None:
    result = fake_result()
    setattr(result, field, value)
    with pytest.raises((ValueError, TypeError), match=message):
        RunStore(tmp_path).save(result)
    assert not any(tmp_path.iterdir())


def test_failed_write_leaves_no_partial_run(tmp_path: Path, monkeypatch) -> None:
    runs = RunStore(tmp_path)
    result = fake_result()
    real_write = store._write_file

    def write_then_fail(path: Path, data: bytes) -> None:
        if path.name == "predictions.npz":  # fail in the middle of the run
            raise OSError("disk full")
        real_write(path, data)

    monkeypatch.setattr(store, "_write_file", write_then_fail)
    with pytest.raises(OSError, match="disk full"):
        runs.save(result)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".locks"]  # no run, no temp
    assert not runs.exists(result.config)
    with pytest.raises(RunNotFound):
        runs.load(result.config)
    assert runs.list() == [] and runs.summary().empty
    monkeypatch.setattr(store, "_write_file", real_write)
    runs.save(result)
    assert runs.load(result.config).metrics == result.metrics


def test_sha256_helpers_match_hashlib(tmp_path: Path, monkeypatch) -> None:
    import calnotes._io as io_module

    data = bytes(range(256)) * 41  # 10,496 bytes: several chunks of the size set below
    path = tmp_path / "blob"
    path.write_bytes(data)
    expected = hashlib.sha256(data).hexdigest()
    assert sha256_bytes(data) == expected
    assert sha256_file(path) == expected
    monkeypatch.setattr(io_module, "_CHUNK", 1000)  # the last chunk is a partial one
    assert sha256_file(str(path)) == expected
    (tmp_path / "empty").write_bytes(b"")
    assert sha256_file(tmp_path / "empty") == hashlib.sha256(b"").hexdigest()


def test_atomic_write_flushes_the_parent_folder_after_the_rename(tmp_path: Path,
                                                                  monkeypatch) -> None:
    import calnotes._io as io_module

    target = tmp_path / "sub" / "metrics.json"
    synced = []

    def spy(path):
        synced.append((Path(path), target.read_bytes()))  # the new file is in place

    monkeypatch.setattr(io_module, "fsync_dir", spy)
    atomic_write(target, b"new")
    assert synced == [(tmp_path / "sub", b"new")]


def test_atomic_write_keeps_old_file_on_failure(tmp_path: Path, monkeypatch) -> None:
    import calnotes._io as io_module

    target = tmp_path / "metrics.json"
    atomic_write(target, b"old")

    def broken_replace(src, dst):
        raise OSError("interrupted")

    monkeypatch.setattr(io_module.os, "replace", broken_replace)
    with pytest.raises(OSError, match="interrupted"):
        atomic_write(target, b"new content")
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["metrics.json"]


def test_a_stored_run_is_kept_and_a_second_writer_discarded(tmp_path: Path) -> None:
    runs = RunStore(tmp_path)
    first, second = fake_result(seed=1, ece=0.1), fake_result(seed=2, ece=0.2)
    runs.save(first, label="a")
    runs.save(second, label="b")  # same config: the stored run stays whole
    run = runs.load(first.config)
    assert run.metrics["test_ece"] == 0.1 and run.label == "a"
    assert torch.equal(run.test_logits, first.test_logits)
    assert [p.name for p in tmp_path.iterdir() if not p.name.startswith(".locks")] == [
        run.path.name]


def test_a_damaged_run_is_replaced_by_the_next_save(tmp_path: Path) -> None:
    runs = RunStore(tmp_path)
    first, second = fake_result(seed=1, ece=0.1), fake_result(seed=2, ece=0.2)
    folder = runs.save(first)
    (folder / "metrics.json").write_text("{}")
    with pytest.raises(CorruptRun):
        runs.load(first.config)
    runs.save(second)
    run = runs.load(first.config)
    assert run.metrics["test_ece"] == 0.2
    assert torch.equal(run.test_logits, second.test_logits)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".locks", folder.name]


def test_save_times_out_with_a_clear_message_while_another_writer_holds_the_lock(
        tmp_path: Path) -> None:
    runs = RunStore(tmp_path)
    result = fake_result()
    lock = store.lock_path(runs.path(result.config))
    with file_lock(lock, timeout=0, what="testing"):  # flock: a second open file conflicts
        with pytest.raises(TimeoutError, match=rf"{lock}.*another process is saving"):
            runs.save(result, lock_timeout=0.2)
    assert not runs.exists(result.config)
    runs.save(result)  # released
    assert runs.exists(result.config)


def test_store_rejects_bad_arguments(tmp_path: Path) -> None:
    runs = RunStore(tmp_path)
    for bad in ("", "../up", "a/b", 3):
        with pytest.raises(ValueError, match="label"):
            runs.save(fake_result(), label=bad)
    with pytest.raises(TypeError, match="result"):
        runs.save({"config": {}})
    with pytest.raises(TypeError, match="root"):
        RunStore(3)
    with pytest.raises(ValueError, match="unknown config key"):
        runs.path({"epoch": 3})


def test_run_not_found_is_a_key_error_with_a_readable_message(tmp_path: Path) -> None:
    with pytest.raises(KeyError) as info:
        RunStore(tmp_path).load(default_config())
    assert str(info.value).startswith("no stored run")


# --------------------------------------------------------------------------- what is read back


def _rewrite(folder: Path, name: str, data: bytes, *, update_manifest: bool) -> None:
    (folder / name).write_bytes(data)
    if update_manifest:  # as if the file had been saved like this
        manifest = json.loads((folder / store.MANIFEST).read_text())
        manifest["files"][name] = hashlib.sha256(data).hexdigest()
        (folder / store.MANIFEST).write_text(json.dumps(manifest))


def test_a_config_that_does_not_hash_to_its_folder_is_refused(tmp_path: Path) -> None:
    runs = RunStore(tmp_path)
    result = fake_result()
    folder = runs.save(result)
    other = json.dumps(default_config(epochs=99)).encode()
    _rewrite(folder, "config.json", other, update_manifest=True)
    with pytest.raises(CorruptRun, match=rf"{folder / 'config.json'} hashes to .*not to its"):
        runs.load(result.config)


def test_arrays_that_do_not_match_their_checksum_are_refused(tmp_path: Path) -> None:
    runs = RunStore(tmp_path)
    result = fake_result()
    folder = runs.save(result)
    other = store.npz_bytes({"test_logits": np.zeros((40, 4), np.float32),
                             "test_labels": np.zeros(40, np.int64)})
    _rewrite(folder, "predictions.npz", other, update_manifest=False)  # a valid npz
    with pytest.raises(CorruptRun, match=rf"{folder / 'predictions.npz'} does not match the "
                                         "SHA-256"):
        runs.load(result.config)


@pytest.mark.parametrize(("name", "update_manifest"), [
    *((name, False) for name in (*store.FILES, store.MANIFEST)),
    *((name, True) for name in store.FILES),
])
def test_a_truncated_file_gives_an_error_naming_it(tmp_path: Path, name: str,
                                                   update_manifest: bool) -> None:
    # update_manifest: the checksum matches the truncated bytes, so the parser must
    # name the file itself (was: a bare BadZipFile, JSONDecodeError or EOFError)
    runs = RunStore(tmp_path)
    result = fake_result()
    folder = runs.save(result)
    data = (folder / name).read_bytes()
    _rewrite(folder, name, data[: len(data) // 2], update_manifest=update_manifest)
    with pytest.raises(CorruptRun, match=str(folder / name)) as info:
        runs.load(result.config)
    assert "make results" in str(info.value) and "delete" in str(info.value)
    assert isinstance(info.value, ValueError)
    with pytest.raises(CorruptRun, match="make results"):  # load_or_run says what to do
        load_or_run(result.config, store=runs, compute=False)


def test_parsers_name_the_file() -> None:
    path = Path("/somewhere/predictions.npz")
    data = store.npz_bytes({"a": np.arange(1000.0)})
    for cut in (0, 10, len(data) // 2, len(data) - 5):
        with pytest.raises(CorruptRun, match="/somewhere/predictions.npz"):
            store.parse_npz(data[:cut], path)
    with pytest.raises(CorruptRun, match="history.json is not valid JSON"):
        store.parse_json(b'{"records": [', Path("history.json"))


def test_outdated_runs_are_refused_and_recomputed_by_make_results(
        tmp_path: Path, monkeypatch) -> None:
    runs = RunStore(tmp_path / "results")
    result = fake_result()
    digest = config_hash(result.config)
    old = tmp_path / "results" / "ch01_measuring" / digest  # format 1: experiment/hash/
    old.mkdir(parents=True)
    for name in (*store.FILES, "DONE"):
        (old / name).write_bytes(b"")
    with pytest.raises(OutdatedRun, match=rf"older layout, at {old} .*make results"):
        runs.load(result.config)
    with pytest.raises(OutdatedRun, match="make results"):
        load_or_run(result.config, store=runs, compute=False)

    folder = runs.save(result)  # a format-1 manifest at the right place
    manifest = json.loads((folder / store.MANIFEST).read_text())
    (folder / store.MANIFEST).write_text(json.dumps({**manifest, "format": 1}))
    with pytest.raises(OutdatedRun, match=r"format 1, not 2.*make results"):
        runs.load(result.config)

    monkeypatch.setattr(experiment, "train_run",
                        lambda config, **kwargs: fake_result(config, seed=5, ece=0.5))
    run = load_or_run(result.config, store=runs, checkpoint_root=tmp_path / "ckpt")
    assert run.metrics["test_ece"] == 0.5  # recomputed and replaced
    assert runs.load(result.config).metrics["test_ece"] == 0.5


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
    first = load_or_run({"epochs": 2}, label="ch03", store=runs, checkpoint_root=ckpt,
                        progress=False, device="cpu")
    second = load_or_run(default_config(epochs=2), label="ch05", store=runs,
                         checkpoint_root=ckpt)
    assert len(counted_train_run) == 1  # one store: chapters share a run, stored once
    call = counted_train_run[0]
    digest = config_hash(default_config(epochs=2))
    assert call["config"] == default_config(epochs=2)
    assert Path(call["checkpoint_dir"]) == ckpt / digest
    assert call["device"] == "cpu" and call["progress"] is False
    assert first.path == second.path == tmp_path / "results" / digest
    assert first.label == second.label == "ch03"
    assert torch.equal(first.test_logits, second.test_logits)
    assert first.history == second.history
    assert runs.summary()[["run", "label"]].values.tolist() == [[digest, "ch03"]]


def test_load_or_run_finds_a_run_whatever_the_spelling(tmp_path: Path,
                                                       counted_train_run) -> None:
    runs = RunStore(tmp_path)
    runs.save(fake_result({"weight_decay": 0.0, "epochs": 2}))
    # `-p WEIGHT_DECAY 0` reaches the config as an int: the same run (was: retrained)
    run = load_or_run({"weight_decay": 0, "epochs": np.int64(2)}, store=runs, compute=False)
    assert run.config["weight_decay"] == 0.0 and counted_train_run == []


def test_load_or_run_without_compute_explains(tmp_path: Path, counted_train_run) -> None:
    with pytest.raises(RunNotFound, match="make results"):
        load_or_run({}, store=RunStore(tmp_path), compute=False)
    assert counted_train_run == []


def test_load_or_run_uses_environment_locations(tmp_path: Path, monkeypatch,
                                                counted_train_run) -> None:
    monkeypatch.setenv("CALNOTES_RESULTS", str(tmp_path / "env_results"))
    monkeypatch.setenv("CALNOTES_CHECKPOINTS", str(tmp_path / "env_ckpt"))
    run = load_or_run({"seed": 1}, progress=False)
    digest = config_hash(default_config(seed=1))
    assert run.path == tmp_path / "env_results" / digest
    assert Path(counted_train_run[0]["checkpoint_dir"]) == tmp_path / "env_ckpt" / digest
    assert RunStore().root == tmp_path / "env_results"


def test_load_or_run_waits_for_another_trainer_of_the_run(tmp_path: Path,
                                                          counted_train_run) -> None:
    digest = config_hash(default_config())
    with file_lock(tmp_path / "ckpt" / f"{digest}.lock", timeout=0, what="testing"):
        with pytest.raises(TimeoutError, match=rf"training run {digest}"):
            load_or_run({}, store=RunStore(tmp_path / "r"), checkpoint_root=tmp_path / "ckpt",
                        lock_timeout=0.2)
    assert counted_train_run == []


def test_load_or_run_rejects_bad_config(tmp_path: Path, counted_train_run) -> None:
    with pytest.raises(ValueError, match="valid keys"):
        load_or_run({"epoch": 3}, store=RunStore(tmp_path))
    with pytest.raises(TypeError, match="store"):
        load_or_run({}, store=str(tmp_path))
    with pytest.raises(ValueError, match="label"):
        load_or_run({}, label="a/b", store=RunStore(tmp_path))


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
    stored = load_or_run(config, store=runs, checkpoint_root=tmp_path / "ckpts",
                         device="cpu", progress=False)
    assert stored.metrics == pytest.approx(result.metrics)
    assert stored.provenance["device"] == "cpu"


@pytest.mark.parametrize("change", [{"train_subset": 120}, {"batch_size": 16},
                                    {"augment": True}, {"val_size": 30}])
def test_a_checkpoint_is_resumed_only_by_its_own_config(tmp_path: Path, monkeypatch,
                                                        change: dict) -> None:
    # Was: a checkpoint of a run differing only in data settings was silently resumed,
    # returning the old model and history.
    monkeypatch.setattr(experiment, "data", _fake_data_module())
    monkeypatch.setattr(experiment, "models", _fake_models_module())
    config = {"dataset": "blobs", "model": "mlp", "epochs": 2, "batch_size": 32,
              "val_size": 45, "lr": 0.1}
    ckpt = str(tmp_path / "ckpt")
    experiment.train_run(config, device="cpu", progress=False, checkpoint_dir=ckpt)
    (key, value), = change.items()
    with pytest.raises(ValueError, match=rf"different configuration.*run_config\.{key}: "
                                         rf"checkpoint .* vs now {value!r}"):
        experiment.train_run({**config, **change}, device="cpu", progress=False,
                              checkpoint_dir=ckpt)
    again = experiment.train_run(config, device="cpu", progress=False, checkpoint_dir=ckpt)
    assert len(again.history) == 2  # its own config still resumes (here: is finished)


def test_a_truncated_checkpoint_names_the_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(experiment, "data", _fake_data_module())
    monkeypatch.setattr(experiment, "models", _fake_models_module())
    config = {"dataset": "blobs", "model": "mlp", "epochs": 2, "batch_size": 32,
              "val_size": 45}
    root = tmp_path / "ckpt"
    path = root / config_hash(config) / "last.pt"
    path.parent.mkdir(parents=True)
    experiment.train_run({**config, "epochs": 1}, device="cpu", progress=False,
                          checkpoint_dir=str(tmp_path / "one"))
    data = (tmp_path / "one" / "last.pt").read_bytes()
    for cut in (0, 100, len(data) // 2):
        path.write_bytes(data[:cut])
        with pytest.raises(ValueError, match=rf"checkpoint {path} cannot be read.*Delete it"):
            load_or_run(config, store=RunStore(tmp_path / "r"), checkpoint_root=root,
                        device="cpu", progress=False)


def test_a_deleted_manifest_is_reported_as_such_not_as_an_older_format(tmp_path: Path) -> None:
    runs = RunStore(tmp_path / "results")
    result = fake_result()
    folder = runs.save(result)
    (folder / store.MANIFEST).unlink()
    with pytest.raises(CorruptRun, match=r"has no manifest\.json: it was deleted") as info:
        runs.load(result.config)
    assert "older calnotes" not in str(info.value) and str(folder) in str(info.value)
    # format 1's DONE marker in the folder: that one is an older calnotes
    (folder / "DONE").write_bytes(b"")
    with pytest.raises(OutdatedRun, match="DONE marker of format 1"):
        store.read_entry(folder)


def test_a_scratch_folder_is_removed_when_its_process_exits(tmp_path):
    script = ("import sys; from calnotes._io import scratch_dir; d = scratch_dir('calnotes-t-'); "
              "(d / 'sub').mkdir(); (d / 'sub' / 'f').write_text('x'); print(d); "
              "sys.stdout.flush(); assert d.is_dir()")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    folder = Path(done.stdout.strip())
    assert folder.parent == tmp_path and folder.name.startswith("calnotes-t-")
    assert not folder.exists()


def test_smoke_chapter_runs_leave_no_scratch_store_behind(tmp_path):
    script = ("from calnotes.runs.executor import chapter_runs; "
              "from calnotes.runs.experiment import default_config; "
              "cfg = default_config(dataset='fashion_mnist', model='lenet5', epochs=1, "
              "train_subset=64, val_size=64, test_subset=64, batch_size=32); "
              "run, = chapter_runs([cfg], use_store=True, smoke=True, device='cpu'); "
              "print(run.test_logits.shape[0])")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "64"
    assert not list(tmp_path.glob("calnotes-runs-*"))
