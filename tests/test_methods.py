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
    ece_vs_bins,
    method_configs,
    methods_table,
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
