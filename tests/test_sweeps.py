"""calnotes.runs.sweeps: configs that differ in one key, the runner's caching, the tidy tables."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest
import torch
from fake_data import cifar100_members, write_cifar

from calnotes.runs import sweeps
from calnotes.runs.experiment import default_config
from calnotes.runs.store import config_hash
from calnotes.runs.sweeps import (
    Sweep,
    SweepRunner,
    describe_run,
    get_key,
    nll_overfitting,
    set_key,
    vary,
)
from calnotes.training import History

torch.set_num_threads(min(2, torch.get_num_threads()))


@dataclass
class FakeRun:
    """Looks like a StoredRun: config, history, metrics, provenance, test logits/labels."""

    config: dict[str, Any]
    history: History
    metrics: dict[str, float]
    test_logits: torch.Tensor
    test_labels: torch.Tensor
    provenance: dict[str, Any] = field(default_factory=dict)


def fake_run(config: dict[str, Any], seconds: float = 12.5) -> FakeRun:
    # Two test samples, 2 classes: confidences 0.8 (correct) and 0.6 (wrong).
    logits = torch.log(torch.tensor([[0.8, 0.2], [0.6, 0.4]]))
    labels = torch.tensor([0, 1])
    history = History([
        {"epoch": 1, "train_loss": 1.0, "train_acc": 0.5, "val_loss": 0.9, "val_acc": 0.6,
         "val_logit_norm": 1.5, "seconds": 1.0},
        {"epoch": 2, "train_loss": 0.25, "train_acc": 0.75, "val_loss": 1.1, "val_acc": 0.7,
         "val_logit_norm": 2.5, "seconds": 1.0},
    ])
    wd = float(config.get("weight_decay", 0.0))
    return FakeRun(
        config=default_config(**config), history=history,
        metrics={"test_error": 0.5, "test_ece": 0.2 + wd, "test_mce": 0.4, "test_nll": 0.7,
                 "test_brier": 0.3},
        test_logits=logits, test_labels=labels, provenance={"seconds": seconds},
    )


class Recorder:
    """A run_fn that records its calls and returns fake runs."""

    def __init__(self) -> None:
        self.calls: list[tuple[dict[str, Any], dict[str, Any]]] = []

    def __call__(self, config: dict[str, Any], **kwargs: Any) -> FakeRun:
        self.calls.append((config, kwargs))
        return fake_run(config)


# --------------------------------------------------------------------------- set_key / vary


def test_set_key_sets_plain_and_dotted_keys_without_mutating_the_input() -> None:
    base = default_config(model="resnet8", model_options={"width": 16})
    wide = set_key(base, "model_options.width", 32)
    assert wide["model_options"] == {"width": 32} and base["model_options"] == {"width": 16}
    assert set_key(base, "weight_decay", 0.01)["weight_decay"] == 0.01
    assert set_key({}, "model_options.batch_norm", False)["model_options"] == {
        "batch_norm": False}
    # the result is a full config: missing keys take their defaults
    assert set(set_key({}, "epochs", 3)) == set(default_config())
    value = [1, 2]
    out = set_key({}, "loss_options.milestones", value)
    value.append(3)
    assert out["loss_options"]["milestones"] == [1, 2]  # deep-copied


def test_set_key_rejects_bad_keys() -> None:
    with pytest.raises(ValueError, match="unknown config key 'depth'"):
        set_key({}, "depth", 20)
    with pytest.raises(ValueError, match="not a dict"):
        set_key({}, "epochs.inner", 1)
    with pytest.raises(ValueError, match="empty part"):
        set_key({}, "model_options..width", 1)
    with pytest.raises(TypeError, match="key"):
        set_key({}, 3, 1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="config"):
        set_key([("epochs", 1)], "epochs", 2)  # type: ignore[arg-type]


def test_get_key_reads_plain_and_dotted_keys() -> None:
    config = default_config(model_options={"width": 8})
    assert get_key(config, "model_options.width") == 8
    assert get_key(config, "model_options.depth", "none") == "none"
    assert get_key(config, "epochs") == config["epochs"]
    assert get_key(config, "epochs.x") is None


def test_vary_makes_one_config_per_value() -> None:
    configs = vary({"model": "resnet8"}, "weight_decay", [0.0, 1e-3])
    assert [c["weight_decay"] for c in configs] == [0.0, 1e-3]
    assert all(c["model"] == "resnet8" for c in configs)
    assert config_hash(configs[0]) != config_hash(configs[1])
    for bad in ([], "abc", None):
        with pytest.raises(ValueError, match="non-empty list"):
            vary({}, "epochs", bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- describe_run


def test_describe_run_computes_accuracy_confidence_and_finals() -> None:
    run = fake_run(default_config(model="resnet8", model_options={"width": 8, "batch_norm": True},
                                  weight_decay=1e-3))
    row = describe_run(run)
    assert row["model"] == "resnet8" and row["schedule"] == "cosine"
    assert row["model_options"] == "batch_norm=True, width=8"
    assert row["test_accuracy"] == pytest.approx(0.5)
    assert row["test_confidence"] == pytest.approx(0.7)  # (0.8 + 0.6) / 2
    assert row["overconfidence"] == pytest.approx(0.2)
    assert row["test_ece"] == pytest.approx(0.201)
    assert (row["train_loss"], row["train_acc"], row["val_logit_norm"]) == (0.25, 0.75, 2.5)
    assert row["seconds"] == 12.5
    assert row["config_hash"] == config_hash(run.config)


def test_describe_run_tolerates_missing_history_and_provenance() -> None:
    run = fake_run({})
    run.history = History([{"epoch": 1, "train_loss": 0.5}])
    run.provenance = {}
    run.metrics = {}
    row = describe_run(run)
    assert row["train_loss"] == 0.5
    assert math.isnan(row["val_logit_norm"]) and math.isnan(row["seconds"])
    assert math.isnan(row["test_ece"])
    assert row["model_options"] == ""


def test_describe_run_overconfidence_is_bounded_by_ece() -> None:
    # |avg confidence - accuracy| <= ECE for any binning (triangle inequality).
    from calnotes import metrics

    gen = torch.Generator().manual_seed(0)
    logits = 3 * torch.randn(500, 5, generator=gen)
    labels = torch.randint(0, 5, (500,), generator=gen)
    probs = torch.softmax(logits, dim=1)
    run = fake_run({})
    run.test_logits, run.test_labels = logits, labels
    row = describe_run(run)
    for n_bins in (1, 5, 15, 100):
        assert abs(row["overconfidence"]) <= float(metrics.ece(probs, labels, n_bins=n_bins)) + 1e-6
    # with a single bin the ECE *is* the gap
    assert abs(row["overconfidence"]) == pytest.approx(float(metrics.ece(probs, labels, n_bins=1)),
                                                       abs=1e-6)


# --------------------------------------------------------------------------- nll_overfitting


def test_nll_overfitting_finds_the_minimum_and_what_follows() -> None:
    history = History([
        {"epoch": 1, "val_loss": 0.9, "val_acc": 0.70, "val_logit_norm": 2.0},
        {"epoch": 2, "val_loss": 0.5, "val_acc": 0.80, "val_logit_norm": 4.0},
        {"epoch": 3, "val_loss": 0.5, "val_acc": 0.81, "val_logit_norm": 5.0},  # tie: first
        {"epoch": 4, "val_loss": 0.7, "val_acc": 0.85, "val_logit_norm": 8.0},
    ])
    out = nll_overfitting(history)
    assert (out["best_epoch"], out["epochs"]) == (2, 4)
    assert out["best_nll"] == 0.5 and out["final_nll"] == 0.7
    assert out["nll_rise"] == pytest.approx(0.2)
    assert out["best_error"] == pytest.approx(0.2) and out["final_error"] == pytest.approx(0.15)
    assert out["error_change"] == pytest.approx(-0.05)
    assert out["min_error"] == pytest.approx(0.15) and out["min_error_epoch"] == 4
    assert (out["best_norm"], out["final_norm"]) == (4.0, 8.0)


def test_nll_overfitting_without_norm_and_with_bad_histories() -> None:
    out = nll_overfitting(History([{"epoch": 1, "val_loss": 1.0, "val_acc": 0.5}]))
    assert out["nll_rise"] == 0.0 and out["best_epoch"] == out["epochs"] == 1
    assert math.isnan(out["best_norm"])
    with pytest.raises(ValueError, match="lacks the column"):
        nll_overfitting(History([{"epoch": 1, "train_loss": 1.0}]))
    with pytest.raises(ValueError, match="no epoch"):
        nll_overfitting(History([{"epoch": 1, "val_loss": None, "val_acc": None}]))


# --------------------------------------------------------------------------- SweepRunner


def test_runner_trains_each_distinct_config_once_and_passes_its_options() -> None:
    recorder = Recorder()
    runner = SweepRunner(label="exp", use_store=False, smoke=True, device="cpu",
                         run_fn=recorder)
    base = {"model": "resnet8", "model_options": {"width": 16}}
    widths = runner.sweep(base, "model_options.width", [8, 16])
    decays = runner.sweep(base, "weight_decay", [default_config()["weight_decay"], 0.1])
    assert len(recorder.calls) == 3  # the base config is shared by both sweeps
    assert widths.runs[1] is decays.runs[0]
    config, kwargs = recorder.calls[0]
    assert config == default_config(**widths.configs[0])
    assert kwargs == {"label": "exp", "use_store": False, "smoke": True, "device": "cpu"}
    assert runner.run(base) is widths.runs[1]
    assert len(recorder.calls) == 3
    assert runner.all_runs == [widths.runs[0], widths.runs[1], decays.runs[1]]  # first requested
    cost = runner.cost()
    assert len(cost) == 3 and (cost["seconds"] == 12.5).all()
    assert list(cost.columns[:2]) == ["config_hash", "model"]
    assert cost["seed"].tolist() == [default_config()["seed"]] * 3  # each run names its seed
    assert "3 runs" in repr(runner)


def test_sweep_table_and_histories_are_tidy() -> None:
    runner = SweepRunner("exp", run_fn=Recorder())
    sweep = runner.sweep({"model": "resnet8"}, "model", ["resnet8", "resnet14"], name="depth",
                         labels=[8, 14])
    assert isinstance(sweep, Sweep) and len(sweep) == 2
    table = sweep.table()
    assert list(table["depth"]) == [8, 14] and table.columns[0] == "depth"
    assert list(table["model"]) == ["resnet8", "resnet14"]
    assert {"test_error", "test_ece", "test_nll", "test_confidence", "overconfidence",
            "train_loss", "seconds", "config_hash"} <= set(table.columns)
    hist = sweep.histories()
    assert len(hist) == 4 and list(hist["depth"]) == [8, 8, 14, 14]
    np.testing.assert_allclose(hist["val_error"], [0.4, 0.3, 0.4, 0.3])
    assert sweep.run_for(14) is sweep.runs[1]
    with pytest.raises(KeyError, match="no run labelled 20"):
        sweep.run_for(20)
    # the default column name is the last part of the key, the labels the values
    table = runner.sweep({}, "model_options.width", [4, 8]).table()
    assert list(table["width"]) == [4, 8]
    table = runner.sweep({}, "weight_decay", [0.0, 0.5]).table()
    assert list(table["weight_decay"]) == [0.0, 0.5]
    assert list(table["test_ece"]) == pytest.approx([0.2, 0.7])
    assert list(table.columns).count("weight_decay") == 1


def test_runner_rejects_bad_arguments() -> None:
    with pytest.raises(TypeError, match="label"):
        SweepRunner("")
    with pytest.raises(TypeError, match="smoke must be a bool"):
        SweepRunner("exp", smoke=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="run_fn"):
        SweepRunner("exp", run_fn=3)  # type: ignore[arg-type]
    runner = SweepRunner("exp", run_fn=Recorder())
    with pytest.raises(ValueError, match="labels must be a list as long as values"):
        runner.sweep({}, "epochs", [1, 2], labels=[1])
    with pytest.raises(TypeError, match="config must be a dict"):
        runner.run([1])  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown config key"):
        runner.run({"depth": 3})


# --------------------------------------------------------------------------- real runs


def test_real_sweep_on_digits_trains_shared_configs_once(tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CALNOTES_RESULTS", str(tmp_path / "results"))
    runner = SweepRunner(label="test_sweeps", use_store=False, smoke=True, device="cpu")
    base = default_config(dataset="digits", model="resnet8",
                          model_options={"width": 4, "batch_norm": True}, epochs=2,
                          batch_size=64, val_size=200, train_subset=200, test_subset=100,
                          weight_decay=0.0)
    depth = runner.sweep(base, "model", ["resnet8", "resnet14"], name="depth", labels=[8, 14])
    bn = runner.sweep(base, "model_options.batch_norm", [True, False])
    assert bn.runs[0] is depth.runs[0] and len(runner.cost()) == 3
    table = pd.concat([depth.table(), bn.table()])
    assert table["test_error"].between(0, 1).all() and table["test_ece"].between(0, 1).all()
    assert (table["seconds"] > 0).all()
    hist = depth.histories()
    assert list(hist["epoch"]) == [1, 2, 1, 2]
    assert hist["val_loss"].notna().all()
    assert not (tmp_path / "results").exists()  # SMOKE never writes the results store


@pytest.mark.slow
def test_paper_scale_code_path_cifar100_resnet110(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """DATASET='cifar100', MODEL='resnet110' go through the same sweep code (tiny fake files
    in the real CIFAR-100 format)."""
    rng = np.random.default_rng(0)
    splits = [(rng.integers(0, 256, size=(n, 3072), dtype=np.uint8),
               [int(i) for i in rng.integers(0, 100, n)]) for n in (48, 16)]
    write_cifar(tmp_path / "data", "cifar100", cifar100_members(*splits), monkeypatch)
    monkeypatch.setenv("CALNOTES_DATA", str(tmp_path / "data"))
    runner = SweepRunner("test_sweeps", use_store=False, smoke=True, device="cpu")
    base = default_config(dataset="cifar100", model="resnet110",
                          model_options={"width": 16, "batch_norm": True}, epochs=2,
                          batch_size=16, val_size=8, augment=True, schedule="step")
    run = runner.run(base)
    assert run.test_logits.shape == (16, 100)
    assert describe_run(run)["model"] == "resnet110"


def test_module_exports() -> None:
    assert set(sweeps.__all__) == {"Sweep", "SweepRunner", "describe_run", "get_key",
                                   "nll_overfitting", "set_key", "vary"}
