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


# --- the chapter's tables and glued numbers


class _History:
    """A run's history as the chapter reads it: ``to_frame()`` and column access."""

    def __init__(self, frame):
        self.frame = frame

    def to_frame(self):
        return self.frame.copy()

    def __getitem__(self, key):
        return list(self.frame[key])


def _fake_run(logits, labels, seed=0, val_acc=(0.5, 0.6), val_loss=(0.9, 0.8),
              train_acc=(0.7, 0.9), norm=(2.0, 4.0), lr=(0.1, 0.1), **config):
    from types import SimpleNamespace

    import pandas as pd

    from calnotes import metrics
    from calnotes.runs.experiment import default_config

    logits, labels = torch.tensor(logits, dtype=torch.float64), torch.tensor(labels)
    probs = torch.softmax(logits, dim=1)
    epochs = len(val_acc)
    history = _History(pd.DataFrame({
        "epoch": list(range(1, epochs + 1)), "val_acc": list(val_acc),
        "val_loss": list(val_loss), "train_acc": list(train_acc), "train_loss": [0.1] * epochs,
        "val_logit_norm": list(norm), "lr": list(lr)}))
    cfg = default_config(dataset="digits", model="lenet5", seed=seed, epochs=epochs, **config)
    run_metrics = {"test_ece": float(metrics.ece(probs, labels, n_bins=15)),
                   "test_error": float((probs.argmax(1) != labels).double().mean()),
                   "test_nll": float(metrics.nll(probs, labels)), "test_mce": 0.0,
                   "test_brier": 0.0}
    return SimpleNamespace(test_logits=logits.float(), test_labels=labels, config=cfg,
                           history=history, metrics=run_metrics, provenance={"seconds": 1.0})


_L3 = float(np.log(3.0))  # logits (log 3, 0): class 0 at probability 0.75


def test_library_summary_hand_computed():
    run = _fake_run([[_L3, 0.0]] * 2, [0, 1])
    assert ch02.test_probs(run).dtype == torch.float64
    summary = ch02.library_summary(run)
    # the run stores float32 logits: log 3 rounded to float32 moves the NLL by ~1e-8
    assert summary["nll"] == pytest.approx((np.log(4 / 3) + np.log(4)) / 2, abs=1e-6)
    assert summary["accuracy"] == pytest.approx(0.5)
    assert summary["confidence"] == pytest.approx(0.75, abs=1e-6)
    assert summary["overconfidence"] == pytest.approx(0.25, abs=1e-6)


def test_pair_glue_hand_computed():
    # old: right on 1 of 2 at confidence 0.75; modern: right on both at 0.75
    old = _fake_run([[_L3, 0.0]] * 2, [0, 1], norm=(1.0, 6.0), train_subset=300)
    modern = _fake_run([[_L3, 0.0], [0.0, _L3]], [0, 1], norm=(1.0, 2.0), train_subset=300)
    out = ch02.pair_glue(old, modern, n_bins=15, n_boot=20, seed=0)
    assert out["ch02_old_test_accuracy"] == pytest.approx(50.0)
    assert out["ch02_modern_test_error"] == pytest.approx(0.0)
    assert out["ch02_old_test_ece"] == pytest.approx(25.0, abs=1e-4)  # |0.75 - 0.5|
    assert out["ch02_norm_ratio"] == pytest.approx(3.0)  # 6 / 2, the last epochs
    assert out["ch02_train_images"] == 300 and out["ch02_epochs"] == 2
    # the paired estimate is the difference on the full sample: ECE 25 - 25, error 0 - 50
    assert out["ch02_pair_error_ci"].startswith("-50.00 [")
    assert float(out["ch02_pair_ece_ci"].split(" [")[0]) == pytest.approx(0.0, abs=0.01)
    assert out["ch02_old_ece_ci"].startswith("[") and out["ch02_old_ece_ci"].endswith("]")


def test_pilot_table_reads_the_last_epoch():
    pilots = {0.0: _fake_run([[0.0, 1.0]], [1], val_acc=(0.5, 0.8), val_loss=(1.0, 0.4)),
              0.01: _fake_run([[0.0, 1.0]], [1], val_acc=(0.5, 0.9), val_loss=(1.0, 0.6))}
    table = ch02.pilot_table(pilots, "lenet5")
    assert table.index.name == "lenet5 weight decay"
    assert table.loc[0.0, "val_error (%)"] == pytest.approx(20.0)
    assert table.loc[0.01, "val_nll"] == pytest.approx(0.6)
    assert table.loc[0.0, "train_acc (%)"] == pytest.approx(90.0)
    assert float(table["val_error (%)"].idxmin()) == 0.01
    with pytest.raises(TypeError, match="pilots"):
        ch02.pilot_table([1, 2], "lenet5")


def test_seed_runs_runs_every_config_at_every_seed_in_one_batch():
    class Runner:
        def __init__(self):
            self.batches = []

        def runs(self, configs):
            self.batches.append(configs)

        def run(self, config):
            return (config["model"], config["seed"])

    runner = Runner()
    out = ch02.seed_runs(runner, {"a": {"model": "x"}, "b": {"model": "y"}}, [3, 4])
    assert out == {"a": [("x", 3), ("x", 4)], "b": [("y", 3), ("y", 4)]}
    assert len(runner.batches) == 1 and len(runner.batches[0]) == 4
    with pytest.raises(ValueError, match="seeds"):
        ch02.seed_runs(runner, {"a": {}}, [])


def _fair():
    right, wrong = [_L3, 0.0], [0.0, _L3]
    old = [_fake_run([right, right], [0, 1], seed=s) for s in (0, 1)]  # error 50 each
    modern = [_fake_run([right, wrong], [0, 1], seed=0, val_loss=(0.5, 0.7)),  # error 0
              _fake_run([right, right], [0, 1], seed=1)]  # error 50
    return {"lenet5": old, "resnet20": modern}


def test_fair_rows_summary_and_glue_hand_computed():
    fair = _fair()
    rows = ch02.fair_rows(fair)
    assert list(rows["network"]) == ["lenet5", "lenet5", "resnet20", "resnet20"]
    assert list(rows["seed"]) == [0, 1, 0, 1]
    summary = ch02.fair_summary(rows)
    assert summary.loc["resnet20", ("test_error", "mean")] == pytest.approx(25.0)
    assert summary.loc["resnet20", ("test_error", "std")] == pytest.approx(
        round(float(np.std([0.0, 50.0], ddof=1)), 2))
    config = {"train_subset": 10000, "val_size": 1000, "epochs": 2}
    out = ch02.fair_glue(fair, config, 0.005, "lenet5", "resnet20")
    assert out["ch02_fair_images"] == "10,000" and out["ch02_fair_val"] == "1,000"
    assert out["ch02_fair_seeds"] == 2 and out["ch02_fair_wd"] == 0.005
    assert out["ch02_fair_nll_epoch"] == 1  # val NLL 0.5 then 0.7
    assert out["ch02_fair_nll_rise"] == pytest.approx(0.2)
    assert out["ch02_fair_old_test_error"] == pytest.approx(50.0)
    assert out["ch02_fair_modern_test_error_std"] == pytest.approx(np.std([0.0, 50.0], ddof=1))
    assert out["ch02_fair_error_ci"].startswith("-25.00 [")  # Welch: 25 - 50
    with pytest.raises(ValueError, match="fair"):
        ch02.fair_glue(fair, config, 0.005, "lenet5", "resnet8")


def test_tuned_glue_formats_the_chosen_weight_decays():
    import pandas as pd

    choice = pd.DataFrame({"network": ["lenet5", "lenet5", "resnet8"],
                           "weight_decay": [0.0, 0.0005, 0.005],
                           "chosen": [False, True, True]})
    assert ch02.tuned_glue(choice) == {"ch02_tuned_lenet_wd": "0.0005",
                                       "ch02_tuned_resnet_wd": "0.005"}


def test_tick_labels():
    assert [ch02.tick(v) for v in (True, np.bool_(False), 0.0, 0.0005, 0.002, 0.02, 16)] == [
        "on", "off", "0", "5e-4", "2e-3", "0.02", "16"]


def _sweeps():
    from calnotes.runs.sweeps import Sweep

    right, wrong = [_L3, 0.0], [0.0, _L3]

    def sweep(key, name, labels, logits):
        runs = [_fake_run(z, [0, 1]) for z in logits]
        return Sweep(key=key, name=name, labels=labels, configs=[{}] * len(runs), runs=runs)

    return {
        "depth": sweep("model", "depth", [8, 20], [[right, right], [right, wrong]]),
        "width": sweep("model_options.width", "width", [4, 16], [[right, wrong], [right, right]]),
        "batch_norm": sweep("model_options.batch_norm", "batch_norm", [True, False],
                            [[right, wrong], [right, right]]),
        "weight_decay": sweep("weight_decay", "weight_decay", [0.0, 0.005],
                              [[right, right], [right, wrong]]),
    }


def test_sweep_table_and_glue_hand_computed():
    sweeps = _sweeps()
    table = ch02.sweep_table(sweeps)
    assert list(table.loc["weight_decay"].index) == ["0", "5e-3"]
    assert table.loc[("depth", "20"), "test_error"] == pytest.approx(0.0)
    base = sweeps["depth"].runs[0]  # error 0.5 on N = 2 test images
    out = ch02.sweep_glue(sweeps, base, n_bins=15, n_boot=20, seed=0)
    assert out["ch02_depth_first"] == 8 and out["ch02_depth_last"] == 20
    assert out["ch02_depth_first_error"] == pytest.approx(50.0)
    assert out["ch02_depth_last_ece"] == pytest.approx(25.0, abs=1e-4)
    assert out["ch02_bn_off_test_error"] == pytest.approx(50.0)
    assert out["ch02_narrow_ece"] == pytest.approx(25.0, abs=1e-4)
    # weight decay: overconfidence 0.25 at 0, -0.25 at 5e-3 (both ECEs 25: ties to the first)
    assert out["ch02_wd_first_gap"] == pytest.approx(25.0, abs=1e-4)
    assert out["ch02_wd_best"] == "0" and out["ch02_wd_last"] == "5e-3"
    assert out["ch02_wd_min_error_wd"] == "5e-3"
    assert out["ch02_wd_error_spread"] == pytest.approx(50.0)
    assert out["ch02_error_se"] == pytest.approx(100 * np.sqrt(0.5 * 0.5 / 2))
    assert out["ch02_n_test"] == 2
    assert out["ch02_ci_depth_error"].startswith("-50.00 [")  # 0 - 50 on the full sample
    assert out["ch02_ci_wd_gap"].startswith("+50.00 [")  # 25 - (-25)
    with pytest.raises(ValueError, match="sweeps"):
        ch02.sweep_glue({"depth": sweeps["depth"]}, base)


def test_ch01_glue_hand_computed():
    import pandas as pd

    curve = pd.DataFrame({"epoch": [1, 2, 3], "val_loss": [0.5, 0.3, 0.4],
                          "val_acc": [0.8, 0.9, 0.95]})
    out = ch02.ch01_glue(curve, 1)
    assert out["ch02_ch01_last"] == 3 and out["ch02_ch01_min_epoch"] == 2
    assert out["ch02_ch01_ref_nll"] == 0.5 and out["ch02_ch01_last_nll"] == 0.4
    assert out["ch02_ch01_ref_err"] == pytest.approx(20.0)
    assert out["ch02_ch01_last_err"] == pytest.approx(5.0)
    with pytest.raises(ValueError, match="reference"):
        ch02.ch01_glue(curve, 7)


def test_overfitting_glue_hand_computed():
    import pandas as pd

    def row(change):
        return {"best_epoch": 3, "epochs": 5, "best_nll": 0.2, "final_nll": 0.3,
                "best_error": 0.1, "min_error": 0.05, "min_error_epoch": 4, "best_norm": 1.0,
                "final_norm": 2.0, "error_change": change}

    table = pd.DataFrame({"lenet5": row(0.01), "resnet8": row(-0.03), "step": row(-0.02)}).T
    out = ch02.overfitting_glue(table, "step", "lenet5")
    assert out["ch02_step_best_error"] == pytest.approx(10.0)
    assert out["ch02_step_min_error_epoch"] == 4 and out["ch02_old_best_epoch"] == 3
    assert out["ch02_old_final_norm"] == 2.0
    assert out["ch02_max_error_change"] == pytest.approx(3.0)
    assert out["ch02_largest_fall_run"] == "resnet8"
    assert out["ch02_largest_fall"] == pytest.approx(3.0)
    with pytest.raises(ValueError, match="overfitting"):
        ch02.overfitting_glue(table, "cosine", "lenet5")


def test_figures_draw_their_panels_and_refuse_bad_input():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from calnotes.book.evidence import ch02_figures

    sweeps = _sweeps()
    fig = ch02_figures.sweep_figure(sweeps, n_boot=10)
    assert [ax.get_xlabel() for ax in fig.axes[:4]] == [
        "depth (layers)", "filters in the first stage", "batch normalization", "weight decay"]
    assert [t.get_text() for t in fig.axes[3].get_xticklabels()] == ["0", "5e-3"]
    runs = {"a": sweeps["depth"].runs[0], "b": sweeps["depth"].runs[1]}
    fig2 = ch02_figures.confidence_and_reliability(runs)
    assert fig2.axes[0].get_title() == "a" and fig2.axes[1].get_title() == "b"
    run = _fake_run([[_L3, 0.0]], [0], val_acc=(0.5, 0.6, 0.7), val_loss=(0.9, 0.8, 0.85),
                    train_acc=(0.5, 0.6, 0.7), norm=(1.0, 2.0, 3.0), lr=(0.1, 0.01, 0.01))
    fig3 = ch02_figures.overfitting_curves(run, {"r": run}, "r, step schedule")
    assert fig3.axes[0].get_title().startswith("r, step schedule: epochs 1-3")
    fig4 = ch02_figures.nll_curve(run.history.to_frame(), 1, "t")
    assert fig4.axes[0].get_title() == "t"
    plt.close("all")
    with pytest.raises(ValueError, match="sweeps"):
        ch02_figures.sweep_figure({"depth": sweeps["depth"]})
    with pytest.raises(ValueError, match="runs"):
        ch02_figures.confidence_and_reliability({"a": run})


def test_runs_script_trains_every_claim_run_one_at_a_time(monkeypatch):
    from calnotes.book.evidence import ch02_runs
    from calnotes.runs import executor

    calls = []
    monkeypatch.setattr(executor, "compute_runs",
                        lambda configs, **kw: calls.append((configs, kw)) or 0)
    ch02_runs.main()
    assert [(c[1]["label"], c[0][0]) for c in calls] == ch02_runs.claim_runs()
    assert all(len(c[0]) == 1 and c[1]["workers"] == 1 and c[1]["device"] == "cpu"
               for c in calls)
