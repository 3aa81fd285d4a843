"""The optional ``positive_class`` config key: hashes, validation, and a binary run."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from calnotes import data, experiments
from calnotes.experiments import DEFAULT_CONFIG, OPTIONAL_CONFIG, default_config
from calnotes.store import RunStore, config_hash, load_or_run

#: Chapter 1's stored run; its hash must not change when optional keys are added.
CH01_CONFIG = {"dataset": "fashion_mnist", "model": "lenet5", "epochs": 30,
               "weight_decay": 0.0, "lr": 0.05, "seed": 0}


pytestmark = pytest.mark.usefixtures("one_thread")


def test_optional_keys_are_absent_unless_set_so_old_hashes_stay() -> None:
    assert "positive_class" in OPTIONAL_CONFIG
    assert set(OPTIONAL_CONFIG).isdisjoint(DEFAULT_CONFIG)
    assert default_config() == DEFAULT_CONFIG
    assert default_config(positive_class=None) == default_config()
    # values computed before the optional key existed
    assert config_hash(default_config()) == "eaa53330a95f"
    assert config_hash(default_config(**CH01_CONFIG)) == "f0a7f9abac42"
    assert config_hash(default_config(**CH01_CONFIG, positive_class=None)) == "f0a7f9abac42"


def test_positive_class_is_kept_and_changes_the_hash() -> None:
    cfg = default_config(dataset="mnist", positive_class=9)
    assert cfg["positive_class"] == 9
    assert config_hash(cfg) != config_hash(default_config(dataset="mnist"))
    assert default_config(**cfg) == cfg  # a stored config reads back unchanged


@pytest.mark.parametrize(("value", "error"), [(True, TypeError), ("9", TypeError),
                                              (9.0, TypeError), (-1, ValueError)])
def test_positive_class_validation(value, error) -> None:
    with pytest.raises(error, match="positive_class"):
        default_config(positive_class=value)


def test_unknown_key_lists_optional_keys() -> None:
    with pytest.raises(ValueError, match="valid keys are .*positive_class"):
        default_config(positve_class=9)


def test_train_run_with_positive_class_is_binary(tmp_path: Path) -> None:
    config = {"dataset": "digits", "model": "lenet5", "epochs": 1, "batch_size": 64,
              "val_size": 300, "test_subset": 200, "positive_class": 9}
    result = experiments.train_run(config, device="cpu", progress=False)
    assert result.config["positive_class"] == 9
    assert result.test_logits.shape == (200, 2) and result.val_logits.shape == (300, 2)
    splits = data.load_dataset("digits", val_size=300, seed=0, test_subset=200)
    assert torch.equal(result.test_labels, (splits.test.labels == 9).long())
    assert torch.equal(result.val_labels, (splits.val.labels == 9).long())
    assert 0 < int(result.test_labels.sum()) < 200

    store = RunStore(tmp_path / "results")
    stored = load_or_run("exp", config, store=store, checkpoint_root=tmp_path / "ckpt",
                         device="cpu", progress=False)
    assert stored.config == default_config(**config)
    assert stored.path.name == config_hash(default_config(**config))
    assert stored.test_logits.shape == (200, 2)


def test_train_run_rejects_out_of_range_positive_class() -> None:
    config = {"dataset": "digits", "model": "lenet5", "epochs": 1, "val_size": 300,
              "positive_class": 10}
    with pytest.raises(ValueError, match="positive_class"):
        experiments.train_run(config, device="cpu", progress=False)
