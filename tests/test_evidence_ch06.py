"""Chapter 6's exercise helpers (calnotes/book/evidence/ch06.py), on tiny real runs
(LeNet-5 on 8x8 digits, one epoch, CPU)."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from calnotes.book.evidence import ch06
from calnotes.runs import shift as S
from calnotes.runs.experiment import default_config

torch.set_num_threads(1)

BASE = default_config(dataset="digits", model="lenet5", epochs=1, lr=0.05, seed=0,
                      train_subset=200, batch_size=64, val_size=300)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("ch06")
    return root, ch06.exercise_runs(BASE, 0, ["CE", "CE+TS", "Ensemble"], 2, root, "cpu")


def test_exercise_runs_train_into_the_scratch_folder(runs):
    root, by = runs
    assert set(by) == {"CE", "CE+TS", "Ensemble"} and all(set(v) == {0} for v in by.values())
    assert by["CE"][0].path.parent == root / "results"
    assert S.ensemble_of(by["CE"][0], 2).runs[1].path.parent == root / "results"


def test_level_table_is_the_mean_over_seeds_per_level_and_method():
    long = pd.DataFrame({"method": ["B", "A", "B", "A"], "seed": [0, 0, 1, 1],
                         "level": [0, 0, 0, 0], "ece": [1.0, 2.0, 3.0, 6.0]})
    table = ch06.level_table(long)
    assert list(table.columns) == ["B", "A"]  # the table's order, not sorted
    assert table.loc[0, "B"] == 2.0 and table.loc[0, "A"] == 4.0


def test_shifted_temperature_table(runs):
    _, by = runs
    run = by["CE"][0]
    table = ch06.shifted_temperature_table(run, "rotate", 15, [0, 30], n_images=50,
                                           device="cpu")
    assert table.loc["temperature", "CE"] == 1.0
    assert table.loc["temperature", "TS, upright val."] == pytest.approx(S.temperature_of(run))
    raw = S.level_metrics(run.test_logits[:50], run.test_labels[:50])["ece"]
    assert table.loc[0, "CE"] == pytest.approx(raw)
    # the rotated fit is the NLL temperature of the model's logits on rotated val. images
    t = table.loc["temperature", "TS, val. at 15"]
    assert t > 0 and t != pytest.approx(table.loc["temperature", "TS, upright val."])
    scaled = S.level_metrics(run.test_logits[:50].double() / t, run.test_labels[:50])["ece"]
    assert table.loc[0, "TS, val. at 15"] == pytest.approx(scaled)


def test_ensemble_growth_starts_at_the_single_network(runs):
    _, by = runs
    run = by["CE"][0]
    table = ch06.ensemble_growth(run, [1, 2], "rotate", 45, n_images=40, device="cpu")
    single = S.run_shift_logits(run, "rotate", [45], n_images=40, device="cpu")[45]
    expected = S.level_metrics(single, run.test_labels[:40])
    assert table.loc[1, "ece"] == pytest.approx(expected["ece"])
    assert table.loc[1, "accuracy"] == pytest.approx(expected["accuracy"])
    pair = S.ensemble_of(run, 2).shift_logits("rotate", [45], n_images=40, device="cpu")[45]
    assert table.loc[2, "ece"] == pytest.approx(
        S.level_metrics(pair, run.test_labels[:40])["ece"])
