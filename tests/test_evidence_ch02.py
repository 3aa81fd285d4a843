"""Chapter 2's measures and studies (calnotes/book/evidence/ch02.py)."""

import json

import numpy as np
import pytest
import torch

from calnotes.book.evidence import ch02
from calnotes.book.evidence.ch02_runs import SEEDS, WEIGHT_DECAY_GRID, ch01_config, sweep_config
from calnotes.runs.store import RunStore


def _stored(config):
    store = RunStore()
    if not store.exists(config):
        pytest.skip(f"run {config['model']} seed {config['seed']} is not stored in results/")
    return store.load(config)


def test_reference_epoch_is_a_third_of_training():
    assert [ch02.reference_epoch(e) for e in (1, 2, 20, 30)] == [1, 1, 7, 10]


def test_history_change_recomputed_from_the_stored_history_file():
    run = _stored(ch01_config(0))
    history = json.loads((run.path / "history.json").read_text())
    rows = history["records"]
    frame = __import__("pandas").DataFrame(rows)
    last, ref = int(frame["epoch"].max()), 10
    at = frame.set_index("epoch")
    assert ch02.history_change(run, column="val_loss") == pytest.approx(
        at.loc[last, "val_loss"] - at.loc[ref, "val_loss"], abs=1e-12)
    assert ch02.history_change(run, column="val_error") == pytest.approx(
        at.loc[ref, "val_acc"] - at.loc[last, "val_acc"], abs=1e-12)


def test_history_change_rejects_resampling_and_unknown_columns():
    run = _stored(ch01_config(0))
    with pytest.raises(ValueError, match="index"):
        ch02.history_change(run, index=np.arange(10))
    with pytest.raises(ValueError, match="column"):
        ch02.history_change(run, column="test_loss")


def test_tuned_choice_follows_the_declared_rule():
    for model in ("lenet5", "resnet8"):
        for wd in WEIGHT_DECAY_GRID:
            for s in SEEDS:
                _stored(sweep_config(model, s, wd))
    table = ch02.tuned_choice()
    assert table["chosen"].sum() == 2  # one weight decay per network
    for _, part in table.groupby("network"):
        # the lowest mean validation error; among equals, the smaller weight decay
        best = part[part["val_error"] == part["val_error"].min()]["weight_decay"].min()
        assert part.loc[part["chosen"], "weight_decay"].item() == best


def test_tuned_pair_rejects_an_unknown_statistic():
    with pytest.raises(ValueError, match="statistic"):
        ch02.tuned_pair(statistic="nll")


# --- the exercises' solutions


def _run(logits, labels):
    from types import SimpleNamespace

    return SimpleNamespace(test_logits=torch.tensor(logits), test_labels=torch.tensor(labels))


def test_run_statistics_hand_computed():
    # class 0 at confidence 0.75 (logits log 3, 0) on two samples, one right
    run = _run([[np.log(3.0), 0.0]] * 2, [0, 1])
    row = ch02.run_statistics({"a": run}).loc["a"]
    assert row["test ECE"] == pytest.approx(25.0) and row["test error"] == pytest.approx(50.0)
    table = ch02.run_statistics({("m", 0.0, 0): run, ("m", 0.1, 0): run})
    assert table.index.nlevels == 3


def test_seed_trends_counts_the_seeds_where_it_falls():
    import pandas as pd

    index = pd.MultiIndex.from_tuples([(m, wd, s) for m in ("a", "b") for wd in (0.0, 0.5)
                                       for s in (0, 1)])
    # a: 10 -> 7 (seed 0), 10 -> 11 (seed 1); b: 5 -> 4, 5 -> 3
    table = pd.DataFrame({"test ECE": [10.0, 10.0, 7.0, 11.0, 5.0, 5.0, 4.0, 3.0]},
                         index=index)
    trends = ch02.seed_trends(table)
    assert trends.loc["a", "mean change"] == pytest.approx(-1.0)
    assert trends.loc["a", "seeds where it falls"] == 1 and trends.loc["b", "largest"] == -1.0
    assert list(trends["seeds"]) == [2, 2]


def test_shrink_and_exercise_run_train_into_the_scratch_folder(tmp_path):
    from calnotes.runs.experiment import default_config

    tiny = default_config(dataset="digits", model="lenet5", epochs=1, train_subset=200,
                          val_size=300, batch_size=64)
    assert ch02.shrink(tiny, False) == dict(tiny)
    assert ch02.shrink(tiny, True)["train_subset"] == 200
    run = ch02.exercise_run(tiny, tmp_path, use_store=True, smoke=False, device="cpu")
    assert run.path.parent == tmp_path / "results"  # not stored in results/: trained here


def test_ece_by_epoch_records_every_epoch_and_the_test_ece():
    from calnotes.runs.experiment import default_config

    cfg = default_config(dataset="digits", model="lenet5", epochs=2, train_subset=200,
                         val_size=300, batch_size=64)
    curves = ch02.ece_by_epoch(cfg, device="cpu")
    assert list(curves.index) == [1, 2]
    assert ((curves["test ECE (%)"] >= 0) & (curves["test ECE (%)"] <= 100)).all()
    assert (curves["val. NLL"] > 0).all()
