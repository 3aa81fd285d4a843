"""Chapter 5's tables, figures and glue: constructed cases with hand-computed values, and the
chapter's earlier inline computations as the reference."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from calnotes import metrics
from calnotes.book.evidence import ch05_gamma as gamma
from calnotes.book.evidence import ch05_results as results
from calnotes.runs.experiment import default_config
from calnotes.runs.methods import method_configs, summed_loss_recipe, temperature_scaled
from calnotes.training import History


def fake_run(val=None, test=None, history=(), seconds=60.0, threads=2, device="cpu"):
    val_logits, val_labels = val if val is not None else (None, None)
    test_logits, test_labels = test if test is not None else (None, None)
    return SimpleNamespace(val_logits=val_logits, val_labels=val_labels, test_logits=test_logits,
                           test_labels=test_labels, history=History(history), path=Path("f"),
                           provenance={"seconds": seconds, "cpu_threads": threads,
                                       "device": device})


def test_sizes_at_the_book_and_smoke_scale():
    args = (7, 3, 2, "resnet14", 21, 9000, 1000, 1000, [0.1, 0.05, 0.02])
    book = results.sizes(False, *args)
    assert book.seeds == [7, 8, 9] and book.baseline_seeds == [7, 8]
    assert book.scale == dict(model="resnet14", epochs=21, train_subset=9000,
                              val_size=1000, test_subset=None)
    assert (book.meta_val_size, book.n_boot) == (1000, 1000)
    smoke = results.sizes(True, *args)
    assert smoke.seeds == [7, 8] and smoke.lr_candidates == [0.1, 0.05]
    assert smoke.scale["model"] == "resnet8" and smoke.n_boot == 50
    with pytest.raises(TypeError, match="smoke"):
        results.sizes("yes", *args)


def test_runner_config_is_the_former_inline_config():
    scale = dict(model="resnet14", epochs=21, train_subset=9000, val_size=1000, test_subset=None)
    runner = results.Runner("fashion_mnist", scale, 1000, 0.0005, 2.0, 128, use_store=True,
                            smoke=False)

    def old(name, seed, lr):  # the chapter's former run_config at its own parameters
        base = default_config(dataset="fashion_mnist", **scale, seed=seed, momentum=0.9,
                              augment=False, schedule="step", milestones=[3 / 7, 5 / 7],
                              **summed_loss_recipe(lr, 0.0005, 2.0, 128))
        return method_configs(base, [name], meta={"meta_val_size": 1000,
                                                  "inner_reduction": "mean"})[name]
    for name in ("CE", "FLgamma-SECE", "CE-DECE", "Focal (gamma=2)", "MMCE"):
        assert runner.config(name, 1, 0.05) == old(name, 1, 0.05)
    assert runner.config("FLgamma-SECE", 0, 0.1)["lr"] == pytest.approx(0.1 * 128)


def _runs():
    g = torch.Generator().manual_seed(0)
    runs = {}
    for name in results.rows():
        if name == "CE+TS":
            continue
        runs[name] = {}
        for s in (0, 1):
            z = torch.randn(300, 3, generator=g) * (1 + s)
            y = torch.randint(0, 3, (300,), generator=g)
            runs[name][s] = fake_run(val=(z[:100], y[:100]), test=(z[100:], y[100:]))
    return runs


def test_method_probs_rows_and_ts():
    runs = _runs()
    probs, temperatures = results.method_probs(runs)
    assert list(probs) == results.rows() and results.rows()[:2] == ["CE", "CE+TS"]
    r = runs["CE"][1]
    p, t = temperature_scaled(r.val_logits, r.val_labels, r.test_logits)
    torch.testing.assert_close(probs["CE+TS"][1], p, rtol=0, atol=0)
    assert temperatures[1] == t
    torch.testing.assert_close(probs["MMCE"][0], torch.softmax(runs["MMCE"][0].test_logits, 1))


def _per_seed(values):
    """A (method, seed) table from {method: {seed: {column: value}}}."""
    return pd.DataFrame({(m, s): row for m, by_seed in values.items()
                         for s, row in by_seed.items()}).T.rename_axis(["method", "seed"])


def test_paired_uses_the_shared_seeds():
    table = _per_seed({"A": {0: {"ece": 3.0}, 1: {"ece": 5.0}, 2: {"ece": 4.0}},
                       "B": {0: {"ece": 1.0}, 1: {"ece": 2.0}, 3: {"ece": 9.0}}})
    iv = results.paired(table, "A", "B", "ece")  # seeds 0 and 1: differences 2 and 3
    half = 12.706204736174698 * math.sqrt(0.5) / math.sqrt(2)  # t_{0.975,1} * sd / sqrt(n)
    assert iv.estimate == pytest.approx(2.5)
    assert (iv.low, iv.high) == pytest.approx((2.5 - half, 2.5 + half))
    with pytest.raises(ValueError, match="b must"):
        results.paired(table, "A", "C", "ece")


def test_mce_table_and_ece_kinds_against_direct_calls():
    labels = torch.tensor([0, 0, 1, 1])
    p = torch.tensor([[0.9, 0.1], [0.6, 0.4], [0.7, 0.3], [0.2, 0.8]], dtype=torch.float64)
    table = results.mce_table({"m": {0: p}}, labels, seed=0, n_bins=5, n_boot=20)
    # bins (0.8, 1]: 2 images, accuracy 1/2 at confidence 0.85: gap 0.35; (0.6, 0.8]: one
    # image right at 0.7, gap 0.3; (0.4, 0.6]: one right at 0.6, gap 0.4, the largest
    assert table.loc["m", "images in its bin"] == 1
    assert table.loc["m", "MCE"] == pytest.approx(40.0)
    kinds = results.ece_kinds({"m": {0: p}}, labels, seed=0, n_bins=5)
    assert kinds.loc["m", "ECE"] == pytest.approx(100 * float(metrics.ece(p, labels, n_bins=5)))
    assert kinds.loc["m", "ACE, Nixon et al. (classwise)"] == pytest.approx(
        100 * float(metrics.ace(p, labels, n_bins=5)))


def test_ece_glue_focal_rule_and_versus():
    runs = _runs()
    probs, _ = results.method_probs(runs)
    from calnotes.runs.methods import per_seed_table

    labels = runs["CE"][0].test_labels
    per_seed = per_seed_table(probs, labels, n_bins=15)
    glued = results.ece_glue(per_seed, runs, 15)
    mean = per_seed.groupby(level=0).mean()
    assert glued["ch05_ece_sece"] == pytest.approx(mean.loc["FLgamma-SECE", "ece"])
    diff = per_seed.loc["FLgamma-SECE", "ece"] - per_seed.loc["CE", "ece"]
    assert glued["ch05_ece_diff"] == pytest.approx(diff.mean())
    assert glued["ch05_ece_cut"] == pytest.approx(
        100 * (1 - glued["ch05_ece_sece"] / glued["ch05_ece_ce"]))
    assert glued["ch05_best_method"] == mean["ece"].idxmin()
    val = {m: np.mean([float(metrics.ece(torch.softmax(r.val_logits, 1), r.val_labels,
                                         n_bins=15)) for r in runs[m].values()])
           for m in runs if m.startswith("Focal")}
    assert glued["ch05_best_focal"] == min(val, key=val.get)
    assert glued["ch05_best_focal_val_ece"] == pytest.approx(100 * min(val.values()))
    versus = results.versus_table(per_seed, ["FLgamma-SECE", "CE", "MMCE"])
    assert list(versus.index) == ["CE", "MMCE"]
    assert versus.loc["CE", "ECE"] == format(results.paired(per_seed, "FLgamma-SECE", "CE",
                                                            "ece"), ".2f")
    with pytest.raises(ValueError, match="focal"):
        results.focal_rule({"CE": runs["CE"]})


def test_paper_table_and_mce_glue_match_the_quoted_gains():
    paper = results.paper_table()
    assert paper.loc[("CIFAR-10", "CE+TS"), "ece"] == 3.083
    per_seed = _per_seed({"FLgamma-SECE": {0: {"mce": 10.0, "mce_em": 5.0}, 1: {"mce": 12.0,
                                                                                "mce_em": 6.0}},
                          "CE-DECE": {0: {"mce": 11.0, "mce_em": 5.5}, 1: {"mce": 15.0,
                                                                           "mce_em": 6.0}}})
    glued = results.mce_glue(per_seed)
    # the paper's summary quotes 18.62, 15.09 and 9.41 MCE points
    for key, quoted in (("c10", 18.62), ("c100", 15.09), ("tiny", 9.41)):
        assert glued[f"ch05_paper_mce_gain_{key}"] == pytest.approx(quoted, abs=0.006)
    assert glued["ch05_paper_mce_rel_c10"] == pytest.approx(100 * 18.621 / 41.346)
    assert glued["ch05_mce_diff"] == pytest.approx(-2.0)  # differences -1 and -3
    assert glued["ch05_mce_sece"] == 11.0 and glued["ch05_mce_dece"] == 13.0


def test_bias_and_bins_glue():
    iv = SimpleNamespace
    bias = {(name, n): iv(estimate=float(i + n), low=0.0, high=1.0)
            for i, name in enumerate(results.BIAS_ESTIMATORS) for n in (128, 1000)}
    glued = results.bias_glue(bias, 128, 1000, 200)
    assert glued["ch05_bias_sece_test"] == 1002.0 and glued["ch05_bias_dece_batch"] == 129.0
    assert glued["ch05_bias_sece_over_ece_test"] == pytest.approx(1002 / 1000)
    curves = pd.DataFrame({"ece": [1.0, 3.0, 2.0, 5.0, 4.0, 1.0], "mce": 0.0},
                          index=pd.MultiIndex.from_product(
                              [["FLgamma-SECE", "CE", "MMCE"], [10, 1000]],
                              names=["method", "n_bins"]))
    glued = results.bins_glue(curves, [10, 1000], 3)
    assert (glued["ch05_hi_ece_sece"], glued["ch05_hi_ece_best"], glued["ch05_hi_ece_rank"]) == (
        3.0, "MMCE", 2)


def test_bins_curves_average_the_seeds():
    labels = torch.tensor([0, 1, 1, 0])
    p = {"m": {0: torch.tensor([[0.9, 0.1], [0.4, 0.6], [0.3, 0.7], [0.2, 0.8]]),
               1: torch.tensor([[0.6, 0.4], [0.4, 0.6], [0.3, 0.7], [0.7, 0.3]])}}
    frame, curves = results.bins_curves(p, labels, [2, 5])
    assert len(frame) == 4
    ece = [100 * float(metrics.ece(p["m"][s], labels, n_bins=5)) for s in (0, 1)]
    assert curves.loc[("m", 5), "ece"] == pytest.approx(np.mean(ece))


def test_gamma_glue_by_hand():
    def hist(std):
        return pd.DataFrame({"epoch": [1, 2, 3, 4, 5, 6, 7], "gamma_std": std,
                             "gamma_mean": [1.0] * 6 + [float(len(std))], "train_acc": 0.5})
    gh = {("FLgamma-SECE", 0): hist([0, 1, 2, 3, 4, 5, 6]),
          ("FLgamma-SECE", 1): hist([0, 1, 2, 2, 2, 2, 4]),
          ("FLgamma-DECE", 0): hist([1] * 7), ("FLgamma-DECE", 1): hist([1] * 6 + [2])}
    assert gamma.milestone_epochs(7) == [3, 5]
    glued = gamma.late_gamma_glue(gh, [0, 1], 7)
    # the late phase: after epoch 7 minus after epoch 3 -> 6 - 2 = 4 and 4 - 2 = 2
    assert glued["ch05_late_start"] == 3 and glued["ch05_late_sece"] == pytest.approx(3.0)
    assert glued["ch05_late_dece"] == pytest.approx(0.5)
    assert glued["ch05_gamma_mean_last_sece"] == 7.0
    by_epoch = gamma.gamma_by_epoch(gh, [0, 1])
    assert by_epoch.loc[4, ("FLgamma-SECE", "gamma_std")] == 2.5
    phases = pd.DataFrame({"change per epoch": [0.4, -0.2, 0.01, -0.03]},
                          index=pd.MultiIndex.from_product([[1, 2], [0, 1]],
                                                           names=["phase", "seed"]))
    steps = pd.DataFrame({("ours", "meta steps"): [10, 20, 30],
                          ("reference (CIFAR-10)", "meta steps"): [100, 200, 300]})
    glued = gamma.pace_glue(phases, steps)
    assert glued == pytest.approx({"ch05_pace_first": 0.3, "ch05_pace_last": 0.02,
                                   "ch05_steps_ours_late": 50, "ch05_steps_ref_late": 500})


def test_gamma_sensitivity_is_the_closed_form():
    p_y = torch.tensor([0.5, 0.9, 0.99], dtype=torch.float64)
    g = 1.5
    # FL(m) = -(1 - p)^g log p with p = sigmoid(m), dp/dm = p (1 - p):
    # dFL/dm = (1 - p)^g [g p log p - (1 - p)], and its derivative in g
    q = 1 - p_y
    closed = (q ** g * torch.log(q) * (g * p_y * torch.log(p_y) - q) + q ** g * p_y
              * torch.log(p_y)).abs()
    torch.testing.assert_close(gamma.gamma_sensitivity(g, p_y), closed, rtol=1e-10, atol=0)
    with pytest.raises(TypeError, match="p_y"):
        gamma.gamma_sensitivity(g, [0.5])


def test_claims_cost_and_pilot_glue():
    claims = pd.DataFrame({"id": ["a", "b", "c"], "key": [True, True, False],
                           "detectable": [5.0, 1.0, 9.0], "paper": [-2.0, 3.0, 1.0],
                           "verdict": ["inconclusive", "inconclusive", "reproduces"]})
    from calnotes import stats

    claims.loc[1, "verdict"] = stats.INCONCLUSIVE
    glued, under = results.claims_glue(claims, {"a": "x"}, {0: fake_run(seconds=120),
                                                            1: fake_run(seconds=240)})
    assert list(under["id"]) == ["a"] and glued["ch05_underpowered"] == "a"
    assert glued["ch05_powered_open"] == "b" and glued["ch05_v_a"] == "x"
    assert glued["ch05_meta_minutes"] == pytest.approx(3.0)
    cost = results.cost_glue([fake_run(seconds=3600, threads=2), fake_run(seconds=1800,
                                                                         threads=None)])
    assert cost == {"ch05_n_runs": 2, "ch05_stored_hours": 1.5, "ch05_stored_device": "cpu",
                    "ch05_core_hours": 2.5, "ch05_machine_hours": 1.25}
    pilot = pd.DataFrame({"val_acc": [0.9, 0.8], "mean_conf": [0.95, 0.9], "val_ece": [0.05, 0.1],
                          "ece_low": [0.04, 0.08], "ece_high": [0.06, 0.12],
                          "eligible": [True, False]}, index=[0.1, 0.05])
    glued = results.pilot_glue(pilot, 0.1, fake_run(history=[{"seconds": 2.0}, {"seconds": 4.0}]),
                               0.02, 128)
    assert glued["ch05_lr_mean"] == pytest.approx(12.8) and glued["ch05_epoch_seconds"] == 3.0
    assert glued["ch05_pilot_ece"] == pytest.approx(5.0) and glued["ch05_pilot_eligible"] == 1
    assert results.pilot_view(pilot).loc[0.05, "ece_high"] == 12.0


def test_figures_and_cost_table_draw():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    assert len(gamma.meta_loop_figure().axes) == 1
    h = pd.DataFrame({"epoch": [1, 2, 3], "gamma_mean": [1.0, 2.0, 2.5],
                      "gamma_std": [0.1, 0.2, 0.3], "train_acc": [0.5, 0.7, 0.9]})
    gh = {(m, s): h for m in ("FLgamma-SECE", "FLgamma-DECE") for s in (0, 1)}
    assert len(gamma.gamma_figure(gh, 0, 3).axes) == 2
    assert len(gamma.sensitivity_figure(gh, [0, 1]).axes) == 2
    plt.close("all")
    cost = results.outer_cost_table(16, rounds=1, calls=1, classes=(10,))
    assert list(cost.columns) == ["reference DECE / SECE", "library DECE / SECE"]
    assert np.isfinite(cost.to_numpy()).all() and (cost.to_numpy() > 0).all()
