"""Chapter 4's tables, figures and glue: constructed cases with hand-computed values, and the
chapter's earlier inline computations as the reference."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from calnotes import metrics
from calnotes.book.evidence import ch04
from calnotes.book.evidence import ch04_detection as detect
from calnotes.book.evidence import ch04_results as results
from calnotes.runs.experiment import default_config
from calnotes.runs.store import config_hash
from calnotes.training.history import History

ROOT = Path(__file__).resolve().parents[1]
CE, LN = results.CE, results.ln_name(0.04)


def fake_run(norms=(), acc=(), train_acc=(), val=None, test=None, name="fake", **config):
    """A run with a history of ``val_logit_norm``, ``val_acc`` and ``train_acc`` by epoch."""
    records = [{"epoch": i + 1, "val_logit_norm": n,
                "val_acc": acc[i] if acc else 0.5, "train_acc": train_acc[i] if train_acc else 0.5}
               for i, n in enumerate(norms)]
    val_logits, val_labels = val if val is not None else (None, None)
    test_logits, test_labels = test if test is not None else (None, None)
    return SimpleNamespace(history=History(records), val_logits=val_logits, val_labels=val_labels,
                           test_logits=test_logits, test_labels=test_labels, path=Path(name),
                           config=config, provenance={"seconds": 90.0, "device": "cpu"})


# --- names and the recipe


def test_loss_names_and_score_rows():
    assert results.loss_names([0.04, 0.01]) == {CE: ("ce", None), LN: ("logitnorm", 0.04),
                                                "LogitNorm, tau=0.01": ("logitnorm", 0.01)}
    assert ("T=0.1", "energy") in detect.score_rows(0.1)
    assert detect.score_rows(0.1)[0] == ("raw", "msp")
    with pytest.raises(ValueError, match="tau"):
        results.ln_name(0)
    with pytest.raises(ValueError, match="taus"):
        results.loss_names([])


def _old_run_config(loss="ce", tau=None, seed=0, dataset="fashion_mnist", smoke=False):
    """The chapter's former inline ``run_config`` at its own parameters."""
    return default_config(
        dataset=dataset, model="resnet8", model_options={},
        lr=0.1, momentum=0.9, batch_size=128,
        weight_decay=0.0005, schedule="step", milestones=[0.4, 0.7], lr_gamma=0.1,
        epochs=3 if smoke else 30, augment=True,
        flip=True if dataset == "fashion_mnist" else None,
        train_subset=1000 if smoke else 20000, test_subset=500 if smoke else None,
        val_size=1000 if smoke else 5000,
        seed=seed, loss=loss, loss_options={"tau": tau} if loss == "logitnorm" else {})


@pytest.mark.parametrize("smoke", [False, True])
def test_recipe_config_is_the_former_inline_config(smoke):
    recipe = results.Recipe("fashion_mnist", "resnet8", 0.1, 0.0005, [0.4, 0.7], 30, 20000,
                            True, {}, smoke=smoke)
    for args in [("ce", None, 0), ("logitnorm", 0.04, 2), ("logitnorm", 0.01, 1)]:
        for dataset in ("fashion_mnist", "mnist"):
            got = recipe.config(*args, dataset=dataset)
            assert got == _old_run_config(*args, dataset=dataset, smoke=smoke)
    # the stored ResNet-8 LogitNorm run of seed 0 (its folder is its config's hash)
    assert config_hash(results.Recipe("fashion_mnist", "resnet8", 0.1, 0.0005, [0.4, 0.7], 30,
                                      20000, True).config("logitnorm", 0.04, 0)) == "b4b74733c68c"
    with pytest.raises(TypeError, match="recipe"):
        results.recipe_runs({"dataset": "mnist"}, {}, [0], use_store=True)


def test_lenet_arms_and_seed_counts():
    runs = {("official", "ce", 0): "a", ("official", "logitnorm", 0): "b",
            ("official", "ce", 1): "c", ("regime", "ce", 0): "d", ("mnist", "logitnorm", 3): "e"}
    arms = results.lenet_arms({"taus": {"official": 0.04}, "runs": runs})
    assert arms["official"] == {(CE, 0): "a", (LN, 0): "b", (CE, 1): "c"}
    assert arms["regime"] == {(CE, 0): "d"} and arms["mnist"] == {(LN, 3): "e"}
    counts = results.seed_count_glue(arms, LN)
    assert counts == {"ch04_l5_seeds_ce": 2, "ch04_l5_seeds_ln": 1, "ch04_reg_seeds_ce": 1,
                      "ch04_reg_seeds_ln": 0, "ch04_m5_seeds_ce": 0, "ch04_m5_seeds_ln": 1}
    runs = [object() for _ in range(6)]
    lenet = {"lr_pilot": {("ce", 0.1): runs[0]}, "regime_pilots": [runs[1], runs[2]],
             "tau_pilots": {"official": {0.01: runs[3], 0.04: runs[4]}},
             "runs": {("official", "ce", 0): runs[5]}}
    assert results.lenet_runs(lenet) == runs


# --- glue of the set-up and the pilots


def test_bound_glue_is_the_hand_formula():
    glued = results.bound_glue([0.04, 0.01])
    assert glued["ch04_bound_tau"] == pytest.approx(math.log(1 + 9 * math.exp(-2 / 0.04)))
    assert glued["ch04_bound_tau2"] == pytest.approx(math.log(1 + 9 * math.exp(-200)))
    assert glued["ch04_bound_1"] == pytest.approx(math.log(1 + 9 * math.exp(-2)))
    assert (glued["ch04_tau"], glued["ch04_tau2"], glued["ch04_inv_tau"]) == (0.04, 0.01, 25.0)
    with pytest.raises(ValueError, match="taus"):
        results.bound_glue([])


def test_parameter_glue_counts_the_built_networks():
    from calnotes import models

    net = models.build_model("resnet8", num_classes=10, in_channels=1, image_size=28)
    glued = results.parameter_glue()
    assert glued["ch04_resnet_params"] == sum(p.numel() for p in net.parameters())
    assert glued["ch04_wrn_params"] > 2 * glued["ch04_resnet_params"]


def test_lr_table_and_pilot_glue():
    pilot = {("ce", 0.1): fake_run([2.0, 3.0], [0.5, 0.8]),
             ("ce", 0.05): fake_run([2.0, 2.5], [0.5, 0.7]),
             ("logitnorm", 0.1): fake_run([9.0, 40.0], [0.1, 0.1]),
             ("logitnorm", 0.05): fake_run([2.0, 5.0], [0.5, 0.75])}
    lenet = {"lr_pilot": pilot, "lrs": {"ce": 0.1, "logitnorm": 0.05},
             "regime": {"train_subset": 5000, "epochs": 60}, "taus": {"official": 0.04}}
    table = results.lr_table(lenet)
    assert table.loc[0.05, ("ce", "val. accuracy")] == 0.7
    assert table.loc[0.1, ("logitnorm", "val. logit norm")] == 40.0
    assert results.pilot_glue(lenet) == {
        "ch04_lr_ce": 0.1, "ch04_lr_ln": 0.05, "ch04_pilot_worst_norm": 40.0,
        "ch04_regime_n": 5000, "ch04_regime_epochs": 60, "ch04_tau_official": 0.04}


# --- the logit norm while training


def test_norm_glue_hand_computed():
    main = {(CE, 0): fake_run([2.0, 4.0, 3.0], train_acc=[0.5, 0.6, 0.9], acc=[0.5, 0.6, 0.8]),
            (CE, 1): fake_run([2.0, 6.0, 5.0], train_acc=[0.5, 0.6, 0.7], acc=[0.5, 0.6, 0.9]),
            (LN, 0): fake_run([8.0, 4.0, 2.0]), (LN, 1): fake_run([6.0, 4.0, 2.0])}
    small = {(CE, 0): fake_run([1.0, 2.0]), (CE, 4): fake_run([1.0, 1.5])}
    glued = results.norm_glue(main, small, CE, LN, [0.4, 0.7])
    assert glued["ch04_epochs"] == 3 and glued["ch04_milestone"] == 1  # round(1.2)
    assert glued["ch04_ce_norm_first"] == 2.0 and glued["ch04_ce_norm_last"] == 4.0
    assert glued["ch04_ce_norm_peak"] == 5.0  # (4 + 6) / 2
    assert glued["ch04_ln_norm_first"] == 7.0 and glued["ch04_ln_norm_last"] == 2.0
    assert glued["ch04_ce_norm_growth"] == pytest.approx(100 * (0.5 + 1.5) / 2)
    assert glued["ch04_small_ce_norm_growth"] == pytest.approx(100 * (1.0 + 0.5) / 2)
    assert glued["ch04_small_ce_norm_last"] == 1.75
    assert glued["ch04_ce_train_acc"] == pytest.approx(80.0)
    assert glued["ch04_ce_val_acc"] == pytest.approx(85.0)
    with pytest.raises(ValueError, match="name"):
        results.norm_curve(main, "focal")


def test_scaling_table_hand_computed():
    logits = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 0.0]])
    run = fake_run(test=(logits, torch.tensor([0, 1, 1])))
    table = results.scaling_table(run, scales=(0.5, 2.0))
    assert list(table["accuracy"]) == pytest.approx([2 / 3, 2 / 3])
    for s in (0.5, 2.0):
        p = 1 / (1 + math.exp(-s))  # the top class's softmax of two logits s apart
        assert table.loc[s, "mean confidence"] == pytest.approx(p, rel=1e-12)
        assert table.loc[s, "NLL"] == pytest.approx(-(2 * math.log(p) + math.log(1 - p)) / 3)
    with pytest.raises(TypeError, match="logits"):
        results.scaled_probs(np.zeros((2, 2)))


# --- detection


def _table(values):
    """A detection table of rows (temperature, score, ood_set) from {row: (fpr, auroc)}."""
    index = pd.MultiIndex.from_tuples(list(values), names=["temperature", "score", "ood_set"])
    return pd.DataFrame([{"fpr@95tpr": f, "auroc": a, "aupr_in": a} for f, a in values.values()],
                        index=index)


ROWS = [("raw", "msp"), ("raw", "energy"), ("TS", "msp")]
AVG = "average (images)"


def _dets():
    """Cross-entropy and LogitNorm over three seeds, on the OOD average only."""
    fpr = {CE: {("raw", "msp"): [0.5, 0.6, 0.7], ("raw", "energy"): [0.2, 0.3, 0.4],
                ("TS", "msp"): [0.5, 0.5, 0.5]},
           LN: {("raw", "msp"): [0.3, 0.4, 0.5], ("raw", "energy"): [0.5, 0.6, 0.7],
                ("TS", "msp"): [0.5, 0.6, 0.4]}}
    for name, shift in ((CE, 0.0), (LN, 0.1)):
        fpr[name][("raw", "odin")] = [0.4 + shift] * 3
    return {(name, s): _table({(*row, AVG): (v[s], 1 - v[s]) for row, v in fpr[name].items()})
            for name in (CE, LN) for s in range(3)}


def test_per_seed_mean_std_and_tables():
    dets = _dets()
    assert list(detect.per_seed(dets, LN, "raw", "energy", AVG)) == [0.5, 0.6, 0.7]
    with pytest.raises(ValueError, match="name"):
        detect.per_seed(dets, "focal", "raw", "msp", AVG)
    table = detect.mean_std(dets, (CE, LN), [AVG])
    assert table.loc[("raw", "msp", AVG), CE] == "60.0 ± 10.0"  # sample std, ddof 1
    assert table.loc[("TS", "msp", AVG), LN] == "50.0 ± 10.0"
    average = detect.average_table(dets, (CE, LN), AVG, [("TS", "msp"), ("raw", "msp")],
                                   {"FPR95": "fpr@95tpr", "AUROC": "auroc"})
    assert list(average.index) == [("FPR95", "TS", "msp"), ("FPR95", "raw", "msp"),
                                   ("AUROC", "TS", "msp"), ("AUROC", "raw", "msp")]
    assert average.loc[("AUROC", "raw", "msp"), LN] == "60.0 ± 10.0"


def test_paired_gain_is_the_t_interval_of_the_differences():
    dets = _dets()
    iv = detect.paired_gain(dets, LN, CE, "raw", "msp", AVG)
    # differences 20, 20, 20 points: estimate 20, no spread
    assert iv.estimate == pytest.approx(20.0) and iv.high - iv.low == pytest.approx(0, abs=1e-9)
    iv = detect.paired_gain(dets, LN, CE, "TS", "msp", AVG)  # differences 0, -10, 10
    half = 4.302652729749464 * 10 / math.sqrt(3)  # t_{0.975, 2} * sd / sqrt(n)
    assert (iv.low, iv.high) == pytest.approx((-half, half))
    assert detect.interval_reading(SimpleNamespace(low=1, high=2)) == (
        "LogitNorm lower beyond the seed spread")
    assert detect.interval_reading(SimpleNamespace(low=-2, high=-1), "a", "b") == (
        "b beyond the seed spread")
    assert detect.interval_reading(iv) == "within the seed spread"
    with pytest.raises(TypeError, match="interval"):
        detect.interval_reading(3.0)


def test_detection_glue_matches_the_former_inline_glue():
    dets = _dets()
    glued = detect.detection_glue(dets, (CE, LN), CE, LN, LN, ROWS, AVG)
    assert glued["ch04_n_seeds"] == 3
    assert glued["ch04_ce_fpr"] == pytest.approx(60.0) and glued["ch04_ln_fpr"] == 40.0
    assert glued["ch04_fpr_gain"] == pytest.approx(20.0)
    assert glued["ch04_fpr_gain_ci"].data == "[20.0, 20.0]"
    assert glued["ch04_fpr_gain_reading"].data == "LogitNorm lower beyond the seed spread"
    # energy: LogitNorm higher by 30 points on every seed; TS msp: within the spread
    assert glued["ch04_gain_raw_energy"] == pytest.approx(-30.0)
    assert glued["ch04_other_beyond"].data == "energy"
    assert glued["ch04_other_within"].data == "msp after TS"
    assert glued["ch04_best_fpr"] == pytest.approx(30.0)  # cross-entropy, raw energy
    assert glued["ch04_best_what"].data == "cross-entropy with the energy score"
    assert (glued["ch04_ce_odin_fpr"], glued["ch04_ln_odin_fpr"]) == pytest.approx((40.0, 50.0))
    assert glued["ch04_ln_energy_fpr"] == pytest.approx(60.0)
    assert not detect.ce_lower_with_other_scores(dets, CE, LN, ROWS, AVG)  # TS msp: a tie
    assert detect.ce_lower_with_other_scores(dets, CE, LN, ROWS[:2], AVG)


def test_noise_and_second_glue():
    noise = "average (noise)"
    rows = {("raw", "msp"): (0.9, 0.1), ("T=0.1", "energy"): (0.2, 0.8)}

    def dets(name, shift):
        return {(n, s): _table({(*row, noise if r == 0 else AVG): (v[0] + shift * (n == name), 0)
                                for row, v in rows.items() for r in (0, 1)})
                for n in (CE, name) for s in range(2)}
    glued = detect.noise_glue(dets(LN, -0.1), dets("LogitNorm, tau=0.02", 0.3), None, CE, LN,
                              0.1, noise, regime_ln="LogitNorm, tau=0.02")
    assert glued["ch04_noise_ce_fpr"] == pytest.approx(90.0)
    assert glued["ch04_noise_ln_fpr"] == pytest.approx(80.0)
    assert glued["ch04_noise_reg_ln_energy"] == pytest.approx(50.0)
    assert glued["ch04_noise_ln_energy"] == pytest.approx(10.0)
    assert "ch04_noise_second_ce_msp" not in glued
    second = detect.second_glue(dets(LN, 0.05), CE, LN, AVG)
    assert second["ch04_second_ln_fpr"] == pytest.approx(95.0)


def test_mean_norms_and_ratio(monkeypatch):
    ood_logits = {"a": torch.tensor([[3.0, 4.0]]), "b": torch.tensor([[0.0, 2.0]])}
    monkeypatch.setattr(detect, "run_ood_logits", lambda run, sets, device: ood_logits)
    runs = {(CE, 0): fake_run(test=(torch.tensor([[6.0, 8.0]]), None)),
            (CE, 1): fake_run(test=(torch.tensor([[0.0, 20.0]]), None))}
    norms = detect.mean_norms(runs, {"a": None, "b": None}, [CE], [0, 1])
    assert list(norms[CE]) == pytest.approx([15.0, 5.0, 2.0])
    ratio = detect.norm_ratio_glue(pd.DataFrame({CE: norms[CE], LN: norms[CE] * 2}), ["a", "b"],
                                   CE, LN)
    assert ratio == pytest.approx({"ch04_ce_norm_ratio": (5 / 15 + 2 / 15) / 2,
                                   "ch04_ln_norm_ratio": (5 / 15 + 2 / 15) / 2})


@pytest.mark.skipif(not (ROOT / "results" / "b4b74733c68c").is_dir(), reason="stored run absent")
def test_detection_table_agrees_with_the_claims_measure():
    from calnotes.runs.store import RunStore

    folder = ROOT / "results" / "b4b74733c68c"  # ResNet-8, LogitNorm, seed 0
    run = RunStore(ROOT / "results").load(json.loads((folder / "config.json").read_text()))
    sets = results.ood_set_images("fashion_mnist", ["mnist", "animals", "letters"], (),
                                  ch04.POOL, ch04.N_DRAW)
    table = detect.detection_table(run, sets, {"avg": list(sets)}, energy_t=0.1,
                                   odin_t=ch04.ODIN_T, odin_eps=ch04.ODIN_EPS,
                                   n_draw=ch04.N_DRAW, n_draws=ch04.N_DRAWS)
    # the same images, draws and threshold rule as the measure the claims read
    for (t, score), kwargs in {("raw", "msp"): {}, ("T=0.1", "energy"): {"temperature": 0.1},
                               ("raw", "odin"): {}}.items():
        expected = ch04.ood_measure(run, score=score, **kwargs)
        assert table.loc[(t, score, "avg"), "fpr@95tpr"] == pytest.approx(expected, abs=1e-12)


# --- calibration


def _calib_runs():
    g = torch.Generator().manual_seed(0)
    runs = {}
    for name, scale in ((CE, 3.0), (LN, 0.5)):
        for s in range(3):
            z = torch.randn(400, 4, generator=g) * scale
            y = torch.multinomial(torch.softmax(z.double(), 1), 1, generator=g).squeeze(1)
            runs[(name, s)] = fake_run(val=(z[:200], y[:200]), test=(z[200:], y[200:]))
    return runs


def test_calibration_table_and_glue_recompute_each_number():
    runs = _calib_runs()
    calib = results.calibration_table({"ResNet-8": (runs, (CE, LN))}, n_bins=15)
    assert len(calib) == 2 * 2 * 3  # loss x output x seed
    r = runs[(LN, 1)]
    raw = torch.softmax(r.test_logits.double(), 1)
    row = calib.loc[("ResNet-8", LN, "raw", 1)]
    assert row["ece"] == pytest.approx(float(metrics.ece(raw, r.test_labels, n_bins=15)))
    assert row["confidence"] == pytest.approx(float(raw.max(1).values.mean()))
    norms = pd.DataFrame({CE: [9.0], LN: [1.5]}, index=["ID (test)"])
    glued = results.calibration_glue(calib, norms, CE, LN, LN)
    error = {n: [float(metrics.error(torch.softmax(runs[(n, s)].test_logits.double(), 1),
                                     runs[(n, s)].test_labels)) for s in range(3)]
             for n in (CE, LN)}
    assert glued["ch04_ln_acc"] == pytest.approx(100 * (1 - np.mean(error[LN])))
    drop = metrics.seed_interval(100 * np.array(error[LN]) - 100 * np.array(error[CE]))
    assert glued["ch04_acc_drop_ci"].data == f"{drop:.2f}"
    assert glued["ch04_ln_test_norm"] == 1.5
    assert glued["ch04_ln_conf_gap"] == pytest.approx(glued["ch04_ln_acc"] - glued["ch04_ln_conf"])
    view = results.calibration_view(calib)
    assert "T" not in view.columns.get_level_values(0)
    assert view.loc[("ResNet-8", LN, "raw"), ("ece", "mean")] == pytest.approx(
        100 * calib.xs((LN, "raw"), level=("loss", "output"))["ece"].mean())
    with pytest.raises(ValueError, match="networks"):
        results.calibration_table({})


# --- claims, costs and exercises


def test_claims_glue_counts_the_datings():
    claims = pd.DataFrame({
        "id": ["a-b", "ln-msp-auroc-mnist-r8", "ln-msp-auroc-mnist-l5", "c"],
        "declared": ["before its runs", "after its runs", "after some of its runs",
                     "before its runs"],
        "n": [3, 2, 5, 0]})
    glued = results.claims_glue(claims, {"a-b": "reproduces"}, lambda row: f"n={row['n']}")
    assert glued["ch04_v_a_b"] == "reproduces" and glued["ch04_e_a_b"].data == "n=3"
    assert (glued["ch04_n_dated"], glued["ch04_n_before"], glued["ch04_n_after_some"],
            glued["ch04_n_after"]) == (3, 1, 1, 1)  # "c" has no stored run
    assert (glued["ch04_n_mnist_r8"], glued["ch04_n_mnist_l5"]) == (2, 5)
    from calnotes import stats

    assert glued["ch04_word_inconclusive"] == stats.INCONCLUSIVE


def test_costs_table_one_row_per_run():
    run = fake_run(name="abc", dataset="mnist", model="lenet5", loss="logitnorm",
                   loss_options={"tau": 0.04}, lr=0.01, seed=3, epochs=30)
    row = results.costs_table([run]).iloc[0]
    assert (row["run"], row["tau"], row["minutes"], row["threads"]) == ("abc", 0.04, 1.5, None)


def test_exercise_glue_reads_its_tables():
    normalised = pd.DataFrame(
        {"FPR95 (%)": [10.0, 20.0, 30.0, 50.0, 5.0, 15.0]},
        index=pd.MultiIndex.from_product([["raw MSP", "MSP of f/(tau ||f||)", "max cosine"],
                                          ["a", "b"]], names=["score", "OOD set"]))
    assert results.exercise_glue("normalised", normalised) == {
        "ch04_ex1_raw": 15.0, "ch04_ex1_norm": 40.0, "ch04_ex1_cos": 10.0}
    factors = pd.concat({n: pd.DataFrame({"FPR95 (%)": [np.nan, 10.0, 30.0],
                                          "mean factor": [5.0, 1.0, 2.0 + k]},
                                         index=["ID (test)", "a", "b"])
                         for k, n in enumerate((CE, LN))})
    glued = results.exercise_glue("gradnorm", factors, {CE: "ce", LN: "ln"}, ["a", "b"])
    assert glued == {"ch04_ex2_ce_id": 5.0, "ch04_ex2_ce_ood": 1.5, "ch04_ex2_ce_fpr": 20.0,
                     "ch04_ex2_ln_id": 5.0, "ch04_ex2_ln_ood": 2.0, "ch04_ex2_ln_fpr": 20.0}
    with pytest.raises(ValueError, match="which"):
        results.exercise_glue("gradNorm", factors)
    with pytest.raises(ValueError, match="keys"):
        results.exercise_glue("optimal_t", factors)


def test_figures_draw_one_panel_per_group():
    import matplotlib

    matplotlib.use("Agg")
    main = {(CE, s): fake_run([2.0, 3.0], [0.5, 0.6]) for s in range(2)}
    assert len(results.training_figure(main, [CE]).axes) == 2
    fig = results.lenet_norm_figure({"official": main, "none": {}}, [CE, LN])
    assert len(fig.axes) == 2 and len(fig.axes[1].lines) == 0
    import matplotlib.pyplot as plt

    plt.close("all")


def test_ood_count_glue():
    glued = results.ood_count_glue({"digits": torch.zeros(7, 1, 28, 28)})
    assert glued["ch04_n_digits"] == 7 and glued["ch04_n_faces"] > 0
    assert results.ood_count_glue({})["ch04_n_digits"] == 0
