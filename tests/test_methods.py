"""calnotes.runs.methods: the training-method table, its configs and bin sweeps."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from calnotes import metrics
from calnotes.calibrators import TemperatureScaling
from calnotes.runs.experiment import default_config
from calnotes.runs.methods import (
    METHODS,
    TABLE_COLUMNS,
    choose_lr,
    ece_vs_bins,
    mean_std,
    method_configs,
    methods_table,
    per_seed_table,
    summed_loss_recipe,
    temperature_scaled,
)


def predictions(n: int = 400, k: int = 4, scale: float = 3.0, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(n, k, generator=gen)
    labels = torch.randint(0, k, (n,), generator=gen)
    return logits, labels


def test_method_configs_share_everything_but_the_loss() -> None:
    base = default_config(model="resnet8", epochs=3, loss="focal", loss_options={"gamma": 1.0})
    configs = method_configs(base)
    assert list(configs) == list(METHODS)
    for name, cfg in configs.items():
        assert cfg == default_config(**cfg)
        assert {k: v for k, v in cfg.items() if k not in ("loss", "loss_options", "meta")} == {
            k: v for k, v in base.items() if k not in ("loss", "loss_options")}
        assert cfg["loss"] == METHODS[name]["loss"]
    assert configs["CE"]["loss_options"] == {} and "meta" not in configs["CE"]
    assert configs["FLgamma-SECE"]["meta"]["outer"] == "sece"
    assert configs["FLgamma-DECE"]["meta"]["outer"] == "dece"
    assert list(method_configs(base, ["MMCE", "CE"])) == ["MMCE", "CE"]
    # CE-DECE is Meta-Calibration: cross-entropy with learned L2 coefficients, DECE outer
    assert configs["CE-DECE"]["loss"] == "ce"
    assert (configs["CE-DECE"]["meta"]["learner"], configs["CE-DECE"]["meta"]["outer"]) == (
        "l2", "dece")
    assert [n for n in METHODS if n.startswith("Focal")] == [
        f"Focal (gamma={g})" for g in ("0.5", "1", "2", "3")]


def test_method_configs_pass_meta_options_to_meta_methods_only() -> None:
    base = default_config(model="resnet8", epochs=3)
    configs = method_configs(base, meta={"meta_val_size": 100, "inner_reduction": "mean",
                                         "outer": "sece+ce"})
    for name in ("CE-DECE", "FLgamma-DECE", "FLgamma-SECE"):
        meta = configs[name]["meta"]
        assert (meta["meta_val_size"], meta["inner_reduction"]) == (100, "mean")
    assert configs["FLgamma-DECE"]["meta"]["outer"] == "dece"  # the method's own option wins
    assert all("meta" not in configs[n] for n in ("CE", "MMCE", "Focal (gamma=2)"))
    with pytest.raises(TypeError, match="meta"):
        method_configs(base, meta="sece")


def test_summed_loss_recipe_takes_the_summed_losss_steps() -> None:
    recipe = summed_loss_recipe(0.1, 5e-4, 2.0, batch_size=8)
    assert recipe == {"batch_size": 8, "lr": 0.8, "weight_decay": 6.25e-5, "grad_clip": 0.25}
    # two SGD steps with momentum on a summed loss and on its mean with the recipe agree
    gen = torch.Generator().manual_seed(0)
    x, y = torch.randn(8, 3, generator=gen), torch.randn(8, generator=gen)
    params = []
    for reduction, (lr, wd, clip) in {"sum": (0.1, 5e-4, 2.0),
                                      "mean": (recipe["lr"], recipe["weight_decay"],
                                               recipe["grad_clip"])}.items():
        w = torch.zeros(3, dtype=torch.float64, requires_grad=True)
        opt = torch.optim.SGD([w], lr=lr, momentum=0.9, weight_decay=wd)
        for _ in range(2):
            loss = ((x.double() @ w - y.double()) ** 2)
            loss = loss.sum() if reduction == "sum" else loss.mean()
            opt.zero_grad()
            loss.backward()
            assert torch.nn.utils.clip_grad_norm_([w], clip) > clip  # the clip acts
            opt.step()
        params.append(w.detach())
    # the same steps with the factor B moved between terms, except that clip_grad_norm_
    # divides by (norm + 1e-6): the two clip factors differ by about 1e-6 / norm relative
    torch.testing.assert_close(params[0], params[1], rtol=1e-5, atol=0)
    assert params[0].abs().min() > 1e-3  # the steps moved every weight
    for bad in ({"lr": 0.0}, {"grad_clip": -1.0}, {"weight_decay": -1e-4}):
        with pytest.raises((TypeError, ValueError), match=next(iter(bad))):
            summed_loss_recipe(**{"lr": 0.1, "weight_decay": 5e-4, "grad_clip": 2.0, **bad})


def _val_pair(scale: float, seed: int, n: int = 2000, k: int = 5):
    """Validation logits of a model that is right on 70% of samples, its logits scaled."""
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, k, (n,), generator=gen)
    guess = torch.where(torch.rand(n, generator=gen) < 0.7, labels,
                        torch.randint(0, k, (n,), generator=gen))
    logits = torch.nn.functional.one_hot(guess, k).float() * scale
    return logits + 0.1 * torch.randn(n, k, generator=gen), labels


def test_choose_lr_takes_the_most_accurate_clearly_overconfident_candidate() -> None:
    calibrated = _val_pair(2.5, 1)   # confidence near its accuracy
    overconfident = _val_pair(8.0, 2)  # confidence near 1
    pilots = {0.1: calibrated, 0.05: overconfident, 0.02: _val_pair(8.0, 3)}
    lr, table = choose_lr(pilots)
    assert not table.loc[0.1, "eligible"] and table.loc[0.05, "eligible"]
    assert lr == table[table["eligible"]]["val_acc"].idxmax()
    assert table["chosen"].sum() == 1 and table.loc[lr, "chosen"]
    assert (table["ece_low"] <= table["val_ece"]).all()
    assert (table["val_ece"] <= table["ece_high"]).all()
    # no eligible candidate: the first (the default) stays
    lr, table = choose_lr({0.3: calibrated, 0.1: calibrated})
    assert lr == 0.3 and not table["eligible"].any()
    with pytest.raises(ValueError, match="pilots"):
        choose_lr({})
    with pytest.raises(ValueError, match="min_ece"):
        choose_lr(pilots, min_ece=1.5)


def test_per_seed_table_and_mean_std() -> None:
    logits, labels = predictions()
    probs = {"a": {0: torch.softmax(logits, 1), 1: torch.softmax(logits / 2, 1)},
             "b": {0: torch.softmax(logits / 4, 1)}}
    table = per_seed_table(probs, labels, n_bins=10)
    assert list(table.index) == [("a", 0), ("a", 1), ("b", 0)]
    assert table.loc[("a", 1), "ece"] == pytest.approx(
        methods_table({"x": probs["a"][1]}, labels, n_bins=10).loc["x", "ece"])
    text = mean_std(table, decimals=1)
    ece = table.loc["a", "ece"]
    assert text.loc["a", "ece"] == f"{ece.mean():.1f} ± {ece.std(ddof=1):.1f}"
    assert text.loc["b", "ece"] == f"{table.loc[('b', 0), 'ece']:.1f}"  # one seed: no ±
    assert list(text["n"]) == [2, 1] and list(text.index) == ["a", "b"]
    with pytest.raises(ValueError, match="method, seed"):
        mean_std(table.droplevel(1))
    with pytest.raises(ValueError, match="probs"):
        per_seed_table({"a": {}}, labels)


@pytest.mark.parametrize(("methods", "match"), [(["CE", "SVM"], "SVM"), ([], "non-empty"),
                                                 ("CE", "non-empty")])
def test_method_configs_rejects_unknown_methods(methods, match) -> None:
    with pytest.raises(ValueError, match=match):
        method_configs(default_config(), methods)


def test_methods_table_is_the_report_in_percent() -> None:
    logits, labels = predictions()
    probs = {"sharp": torch.softmax(logits, 1), "soft": torch.softmax(logits / 4, 1)}
    table = methods_table(probs, labels, n_bins=10)
    assert list(table.columns) == list(TABLE_COLUMNS) and list(table.index) == ["sharp", "soft"]
    for name, p in probs.items():
        assert table.loc[name, "ece"] == pytest.approx(100 * float(metrics.ece(p, labels, 10)))
        # the paper's ACE: the top-label ECE on equal-mass bins (not Nixon's classwise ACE)
        assert table.loc[name, "adaptive_ece"] == pytest.approx(
            100 * float(metrics.ece(p, labels, 10, binning="quantile")))
        assert table.loc[name, "mce_em"] == pytest.approx(
            100 * float(metrics.mce(p, labels, 10, binning="quantile")))
        assert table.loc[name, "nll"] == pytest.approx(float(metrics.nll(p, labels)))
        assert table.loc[name, "error"] == pytest.approx(100 * float(metrics.error(p, labels)))


def test_ece_vs_bins_rows_match_metrics() -> None:
    logits, labels = predictions()
    probs = {"a": torch.softmax(logits, 1).numpy()}
    frame = ece_vs_bins(probs, labels.numpy(), [10, 100])
    assert list(frame.columns) == ["method", "n_bins", "ece", "mce"] and len(frame) == 2
    row = frame[frame.n_bins == 100].iloc[0]
    assert row.ece == pytest.approx(100 * metrics.ece(probs["a"], labels.numpy(), n_bins=100))
    assert row.mce == pytest.approx(100 * metrics.mce(probs["a"], labels.numpy(), n_bins=100))
    # finer bins never lower the binned ECE of this many samples by much: noise adds to it
    assert frame.ece.iloc[1] >= frame.ece.iloc[0] - 1.0
    with pytest.raises(ValueError, match="bins"):
        ece_vs_bins(probs, labels.numpy(), [])
    with pytest.raises(ValueError, match="bins"):
        ece_vs_bins(probs, labels.numpy(), [0])
    with pytest.raises(ValueError, match="probs"):
        ece_vs_bins({}, labels.numpy(), [10])


def test_temperature_scaled_matches_the_calibrator() -> None:
    logits, labels = predictions(scale=6.0)
    probs, t = temperature_scaled(logits[:200], labels[:200], logits[200:])
    reference = TemperatureScaling().fit(logits[:200], labels[:200])
    assert t == pytest.approx(float(reference.temperature_)) and t > 1.0
    np.testing.assert_allclose(probs, reference.predict_proba(logits[200:]), rtol=1e-6)
