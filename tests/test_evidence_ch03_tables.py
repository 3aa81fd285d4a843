"""Chapter 3's tables, glued numbers and figures (calnotes/book/evidence/ch03_tables.py,
ch03_figures.py)."""

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from calnotes.book.evidence import ch03_figures as figures
from calnotes.book.evidence import ch03_tables as tables
from calnotes.evaluation import LABELS, UNCALIBRATED, compare_calibrators

_L3 = float(np.log(3.0))  # logits (log 3, 0): class 0 at probability 0.75


def _run(logits, labels, val_logits=None, val_labels=None, **config):
    z = torch.tensor(logits, dtype=torch.float32)
    y = torch.tensor(labels)
    return SimpleNamespace(
        test_logits=z, test_labels=y, config=config,
        val_logits=z if val_logits is None else torch.tensor(val_logits, dtype=torch.float32),
        val_labels=y if val_labels is None else torch.tensor(val_labels))


def _synthetic(seed, n=400, k=3):
    """A run of K classes whose logits are overconfident (scaled up by 3)."""
    g = torch.Generator().manual_seed(seed)

    def split():
        y = torch.randint(0, k, (n,), generator=g)
        z = torch.randn(n, k, generator=g)
        z[torch.arange(n), y] += 1.0
        return (3 * z).float(), y

    (vz, vy), (tz, ty) = split(), split()
    return SimpleNamespace(val_logits=vz, val_labels=vy, test_logits=tz, test_labels=ty,
                           config={"model": "lenet5"})


def test_names_and_configs():
    assert tables.model_name("resnet18") == "ResNet-18"
    assert tables.model_name("lenet5") == "LeNet-5"
    assert tables.row_name("fashion_mnist", "resnet14") == "Fashion-MNIST, ResNet-14"
    assert tables.row_name("emnist", "wrn") == "emnist, wrn"
    with pytest.raises(TypeError, match="model"):
        tables.model_name(18)
    assert tables.subsets(0, False) == {"train_subset": None}
    assert tables.subsets(4000, True)["train_subset"] == 64
    ten = tables.binary_config("mnist", "lenet5", None, 3, 10, None, False)
    nine = tables.binary_config("mnist", "resnet18", 9, 3, 4, 4000, False)
    from calnotes.runs.experiment import default_config

    # the chapter's former inline configs
    assert ten == default_config(dataset="mnist", model="lenet5", weight_decay=0.0, lr=0.05,
                                 seed=3, epochs=10, train_subset=None)
    assert ten.get("positive_class") is None and nine["positive_class"] == 9
    assert (ten["epochs"], nine["epochs"], nine["train_subset"]) == (10, 4, 4000)
    assert tables.binary_config("mnist", "lenet5", 9, 0, 10, None, True)["epochs"] == 1
    deep = tables.deep_config("fashion_mnist", "resnet14", 0, 15, 10000, False, 0.0, False)
    assert (deep["model"], deep["epochs"], deep["train_subset"]) == ("resnet14", 15, 10000)


def test_ch01_config_is_chapter_1s_run():
    from calnotes.book.evidence.ch02_runs import ch01_config

    assert tables.ch01_config(2, False) == ch01_config(2)  # one stored run for both chapters
    assert tables.ch01_config(0, True)["epochs"] == 1


def test_show_scales_the_rates_to_percent():
    t = pd.DataFrame({"error": [0.1], "ece": [0.02], "mce": [0.5], "nll": [0.3],
                      "brier": [0.12345]}, index=["m"])
    out = tables.show(t)
    assert out.loc["m", "error (%)"] == 10.0 and out.loc["m", "ECE (%)"] == 2.0
    assert out.loc["m", "NLL"] == 0.3 and out.loc["m", "Brier"] == 0.123


def test_hardest_share_and_why_nine_glue_hand_computed():
    # 3 classes; every error involves class 2: a 2 taken for 0 twice, a 1 taken for 2 once
    labels = [0, 1, 2, 2, 2, 1]
    pred = [0, 1, 0, 0, 2, 2]
    logits = np.eye(3)[pred] * 5.0
    run = _run(logits, labels)
    share = tables.hardest_share(run, n_boot=50, seed=0)
    assert share.sum() == pytest.approx(1.0)
    # "2 vs not-2" errs on samples 2, 3, 5; "0 vs not-0" on 2, 3; "1 vs not-1" on 5: the
    # same resamples counted one by one, the most errors winning (ties to the smaller class)
    rng = np.random.default_rng(0)
    errs = {0: [2, 3], 1: [5], 2: [2, 3, 5]}
    expected = np.zeros(3)
    for _ in range(50):
        w = np.bincount(rng.integers(0, 6, 6), minlength=6)
        counts = [sum(w[i] for i in errs[k]) for k in range(3)]
        expected[counts.index(max(counts))] += 1 / 50
    assert share == pytest.approx(expected)
    assert share[2] > 0.5
    with pytest.raises(ValueError, match="n_boot"):
        tables.hardest_share(run, n_boot=0, seed=0)
    ovr = tables.one_vs_rest({"a": run, "b": run}, n_boot=50, seed=0)
    assert int(ovr["a"].loc[2, "errors"]) == 3
    table = tables.ovr_table(ovr)
    assert list(table.columns.get_level_values(0).unique()) == ["test images", "a", "b"]
    out = tables.why_nine_glue(ovr, 2, "a", "b")
    assert out["ch03_nine_errors"] == 3 and out["ch03_nine_rank"] == 1
    assert out["ch03_nine_partner"] == 0  # both of its misses went to class 0
    assert out["ch03_lenet_hardest_share"] == pytest.approx(100 * share[2])


def test_confidence_table_and_binary_glue_hand_computed():
    right, wrong = [_L3, 0.0], [0.0, _L3]
    runs = {("A", 0): _run([right, right], [0, 1]),   # accuracy 50, confidence 75
            ("B", 0): _run([right, wrong], [0, 1]),   # accuracy 100, confidence 75
            ("B", 1): _run([right, right], [0, 1])}
    t = tables.confidence_table(runs)
    assert t.index.names == ["model", "seed"]
    assert t.loc[("A", 0), "accuracy (%)"] == pytest.approx(50.0)
    assert t.loc[("A", 0), "confidence (%)"] == pytest.approx(75.0, abs=1e-4)
    assert t.loc[("B", 0), "gap (points)"] == pytest.approx(-25.0, abs=1e-4)
    out = tables.binary_glue(t, {"A": [0], "B": [0, 1]}, {"A": "lenet", "B": "deep"})
    assert out["ch03_gap_lenet"] == "+25.00" and out["ch03_seeds_lenet_early"] == "1 seed"
    assert out["ch03_gap_deep"] == "-25.00 to +25.00" and out["ch03_seeds_deep"] == 2
    assert out["ch03_seeds_deep_early"] == "2 seeds"


def _claims(inside_lecture, inside_book):
    """A claims table of the lecture's 12 rows: the first ``inside_*`` rows of each
    evaluation have the lecture's number inside their interval."""
    rows, counts = [], {"lecture": 0, "book": 0}
    for conv, n_inside in (("lecture", inside_lecture), ("book", inside_book)):
        for net in ("lenet", "r18"):
            for rid in tables.LECTURE_ROWS:
                inside = counts[conv] < n_inside
                counts[conv] += 1
                rows.append({"id": f"{net}-{rid}-{conv}", "estimate": -20.0, "low": -30.0,
                             "high": 10.0 if inside else -25.0, "paper": -23.0 if not inside
                             else 5.0, "design": "paired t over seeds"})
    rows.append({"id": "odd", "design": "something else"})
    return pd.DataFrame(rows)


def test_lecture_table_and_glue_hand_computed():
    claims = _claims(4, 2)
    t = tables.lecture_table(claims, "ResNet-18")
    assert t.shape == (6, 3)
    assert t.loc[("LeNet-5", "isotonic, ECE"), "book's evaluation (%)"] == "-20 [-30, +10]"
    out = tables.lecture_glue(claims)
    assert (out["ch03_inside_lecture"], out["ch03_inside_book"]) == (4, 2)
    assert out["ch03_better_convention"] == "the lecture's own loop"
    assert out["ch03_lenet_design"] == "a paired Student-t interval over the seeds"
    assert tables.lecture_glue(_claims(3, 3))["ch03_better_convention"] == (
        "neither convention more than the other")
    none = tables.lecture_glue(None)
    assert none["ch03_inside_book"] == 0 and none["ch03_deep_design"] == tables.NOT_EVALUATED
    assert isinstance(tables.lecture_table(None, "x"), str)
    assert tables.design_of(claims, "odd") == "something else"


def test_verdict_counts_hand_computed():
    reproduces = {"ts-vs-hist-fm-lenet-mass", "ts-vs-hist-fm-r14-mass", "lenet-platt-ece-fall-book",
                  "r18-platt-ece-fall-lecture", "lenet-platt-ece-lecture"}

    def verdict(chapter, cid):
        assert chapter == "03"
        return "reproduces" if cid in reproduces else "does not reproduce"

    claims = pd.DataFrame({"id": ["x"]})
    assert tables.count_reproduced(claims, ["ts-vs-hist-fm-lenet-mass", "y"], verdict) == "1 of 2"
    assert tables.count_reproduced(None, ["y"], verdict) == tables.NOT_EVALUATED
    ranking = pd.concat({e: pd.DataFrame({LABELS["histogram"]: [1.0, 3.0]}, index=["r1", "r2"])
                         for e in tables.ESTIMATORS}, names=["estimator", "row"])
    out = tables.ranking_glue(ranking, claims, verdict)
    assert out["ch03_ts_hist_mass"] == "2 of 3" and out["ch03_ts_hist_width"] == "0 of 3"
    assert out["ch03_hist_isotonic"] == "0 of 6"
    assert out["ch03_hist_mass_min"] == 1.0 and out["ch03_hist_width_max"] == 3.0
    platt = tables.platt_glue(claims, verdict)
    assert platt["ch03_platt_lenet-rise-lecture"] == "reproduces"
    assert platt["ch03_platt_reading"] == "the reduction"  # 2 falls against 1 rise
    assert platt["ch03_v_r18-vs-lenet-bin-ece"] == "does not reproduce"
    assert tables.platt_glue(None, verdict)["ch03_platt_reading"] == tables.NOT_EVALUATED


def test_multiclass_tables_agree_with_the_comparisons():
    runs = {"r1": _synthetic(0), "r2": _synthetic(1)}
    multi = {n: tables.compare(r, tables.MULTI_COMPARED) for n, r in runs.items()}
    out = tables.table1_glue(multi, "r2")
    tab = multi["r2"].table
    assert out["ch03_deep_ece"] == pytest.approx(100 * tab.loc[UNCALIBRATED, "ece"])
    temps = [c.calibrators["temperature"].temperature_ for c in multi.values()]
    assert out["ch03_T_min"] == min(temps) and out["ch03_deep_T"] == temps[1]
    assert min(temps) > 1  # the logits were scaled up: temperature scaling softens them
    rank = tables.ranking(multi, runs)
    assert rank.loc[("ECE, 15 equal-width bins", "r1"), LABELS["temperature"]] == pytest.approx(
        100 * multi["r1"].table.loc["temperature", "ece"])
    diag = tables.diagnosis(multi, runs, n_boot=20, seed=0)
    ece = multi["r1"].table["ece"].drop(UNCALIBRATED)
    assert diag.loc["r1", "best method"] == LABELS[ece.idxmin()]
    assert diag.loc["r1", "TS minus best (pts)"] == pytest.approx(
        100 * (ece["temperature"] - min(ece.min(), multi["r1"].table.loc[UNCALIBRATED, "ece"])))
    r = runs["r2"]
    wrong = int((r.val_logits.argmax(1) != r.val_labels).sum())
    assert diag.loc["r2", "validation errors"] == wrong
    glued = tables.diagnosis_glue(diag, multi, {"deep": "r2", "lenet": "r1", "mnist": "r1"})
    assert glued["ch03_val_err_deep"] == diag.loc["r2", "validation errors"]
    assert glued["ch03_mnist_matrix_ece"] == pytest.approx(
        100 * multi["r1"].table.loc["matrix", "ece"])
    ts, ts_glue = tables.mnist_ts_table(multi, runs, n_boot=20, seed=0)
    probs = torch.softmax(runs["r1"].test_logits.double(), dim=1)
    assert ts_glue["ch03_mnist_lenet_conf"] == pytest.approx(
        100 * float(probs.max(1).values.mean()), abs=1e-6)
    assert ts.loc["r2", "T"] == f"{temps[1]:.2f}"


def test_guo_table1_and_vector_by_class():
    guo = tables.guo_table1()
    assert guo.shape == (4, 7)
    assert guo.loc["CIFAR-100, ResNet-110", LABELS["matrix"]] == 25.49
    assert guo.columns[0] == LABELS[UNCALIBRATED]
    comparison = SimpleNamespace(calibrators={
        "vector": SimpleNamespace(weight_=np.arange(10.0)),
        "temperature": SimpleNamespace(temperature_=2.0)})
    wt = tables.vector_by_class(comparison, "digits")
    assert list(wt.loc["w_k T"]) == [2.0 * k for k in range(10)]


def test_rule_table_without_the_store_and_setting_glue():
    val_error, chosen = tables.rule_table(0, available=False)
    assert val_error.empty and chosen is None
    runs = {"L": SimpleNamespace(config={"epochs": 10, "train_subset": None}),
            "R": SimpleNamespace(config={"epochs": 4, "train_subset": 4000})}
    out = tables.setting_glue(runs, {"epochs": 2}, "L", "R")
    assert out == {"ch03_deep_name": "R", "ch03_lenet_epochs": 10, "ch03_deep_binary_epochs": 4,
                   "ch03_mnist_deep_epochs": 2, "ch03_deep_binary_subset": "4,000"}


def test_figures_draw_their_panels_and_refuse_bad_input():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from calnotes.runs.experiment import default_config, load_splits

    runs = {"r1": _synthetic(0, k=2), "r2": _synthetic(1, k=2), "r3": _synthetic(2, k=2)}
    binary = {n: compare_calibrators(r.val_logits, r.val_labels, r.test_logits, r.test_labels,
                                     methods=["isotonic", "platt", "temperature"])
              for n, r in runs.items()}
    three = {"r1": "A", "r2": "B", "r3": "C"}
    fig = figures.temperature_diagrams(binary, runs, three, by_column=True, bootstrap=0)
    assert fig.axes[1].get_title() == f"B\n{LABELS[UNCALIBRATED]}"  # columns: the runs
    binary.pop("r3")
    fig = figures.binary_diagrams(binary, runs, 1)
    assert fig.axes[1].get_title() == "r1: is it a 1?"
    fig = figures.calibrated_diagrams(binary, runs)
    assert fig.axes[1].get_title() == f"r1: {LABELS['platt']}"
    with pytest.raises(ValueError, match="methods"):
        figures.calibrated_diagrams(binary, runs, ("isotonic",))
    fig = figures.temperature_diagrams(binary, runs, {"r1": "A", "r2": "B"}, by_column=False,
                                       bootstrap=0)
    assert fig.axes[1].get_title() == f"A\n{LABELS['temperature']}"  # rows: the runs
    config = default_config(dataset="digits", model="lenet5", val_size=300, test_subset=64)
    labels = torch.as_tensor(load_splits(config).test.labels).long()
    logits = torch.nn.functional.one_hot((labels + 1) % 10, 10).float()  # all wrong
    run = SimpleNamespace(config=config, test_labels=labels, test_logits=logits)
    fig = figures.positive_class_errors(run, 3, n=4)
    first = int(torch.nonzero((labels == 3) | ((labels + 1) % 10 == 3)).flatten()[0])
    assert fig.axes[0].get_title() == f"{int(labels[first])} as {(int(labels[first]) + 1) % 10}"
    with pytest.raises(ValueError, match="run"):
        figures.positive_class_errors(SimpleNamespace(config=config, test_labels=labels.flip(0),
                                                      test_logits=logits), 3)
    plt.close("all")
