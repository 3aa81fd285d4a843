"""Tests for calnotes.evaluation: the calibrator comparison, Table 1 layout, sklearn pairs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from calnotes import metrics
from calnotes.calibrators import TemperatureScaling
from calnotes.evaluation import (
    BINARY_METHODS,
    LABELS,
    MULTICLASS_METHODS,
    TABLE_METRICS,
    UNCALIBRATED,
    CalibrationComparison,
    compare_calibrators,
    compare_with_sklearn,
    table1,
)

pytestmark = pytest.mark.usefixtures("one_thread")


def _overconfident(n: int, c: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Logits 3 z whose labels are drawn from softmax(z): a 3x overconfident model."""
    g = torch.Generator().manual_seed(seed)
    z = 2.0 * torch.randn(n, c, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z, dim=1), 1, generator=g)[:, 0]
    return (3.0 * z).numpy(), y.numpy()


def _split(n: int, c: int, seed: int):
    z, y = _overconfident(2 * n, c, seed)
    return z[:n], y[:n], z[n:], y[n:]


def test_table_rows_columns_and_uncalibrated_row() -> None:
    zv, yv, zt, yt = _split(2000, 5, seed=0)
    cmp = compare_calibrators(zv, yv, zt, yt)
    assert list(cmp.table.index) == [UNCALIBRATED, *MULTICLASS_METHODS]
    assert cmp.table.index.name == "method"
    assert list(cmp.table.columns) == list(TABLE_METRICS)
    assert set(cmp.calibrators) == set(MULTICLASS_METHODS) and set(cmp.probs) == set(
        cmp.table.index)
    p = torch.softmax(torch.from_numpy(zt), dim=1).numpy()
    np.testing.assert_allclose(cmp.probs[UNCALIBRATED], p, atol=1e-12)
    assert cmp.table.loc[UNCALIBRATED, "ece"] == pytest.approx(metrics.ece(p, yt, n_bins=15))
    assert cmp.table.loc[UNCALIBRATED, "error"] == pytest.approx(metrics.error(p, yt))
    for name, probs in cmp.probs.items():
        assert isinstance(probs, np.ndarray), name
        np.testing.assert_allclose(probs.sum(axis=1), 1.0, atol=1e-9)
    # each row is the metric of the calibrator fitted on the validation split alone
    ts = TemperatureScaling().fit(zv, yv)
    assert cmp.calibrators["temperature"].temperature_ == pytest.approx(ts.temperature_)
    assert cmp.table.loc["temperature", "ece"] == pytest.approx(
        metrics.ece(ts.predict_proba(zt), yt, n_bins=15))


def test_every_method_helps_an_overconfident_model_and_ts_keeps_the_error() -> None:
    zv, yv, zt, yt = _split(3000, 4, seed=1)
    cmp = compare_calibrators(zv, yv, zt, yt)
    ece = cmp.table["ece"]
    assert (ece.drop(UNCALIBRATED) < ece[UNCALIBRATED]).all()
    # Two argmaxes, of softmax(z) and of softmax(z / T), both in float64. They can only
    # disagree on a row whose top two probabilities tie to rounding; continuous random
    # logits have none (checked), so the error rates, k / N on both sides, are equal.
    top2 = np.sort(cmp.probs[UNCALIBRATED], axis=1)[:, -2:]
    assert (top2[:, 1] - top2[:, 0] > 1e-9).all()
    assert cmp.table.loc["temperature", "error"] == cmp.table.loc[UNCALIBRATED, "error"]
    assert cmp.calibrators["temperature"].temperature_ == pytest.approx(3.0, rel=0.15)


def test_binary_methods_and_torch_in_torch_out() -> None:
    zv, yv, zt, yt = (torch.from_numpy(a) for a in _split(1500, 2, seed=2))
    cmp = compare_calibrators(zv, yv, zt, yt, methods=BINARY_METHODS, n_bins=10)
    assert list(cmp.table.index) == [UNCALIBRATED, *BINARY_METHODS]
    assert cmp.n_bins == 10
    assert all(isinstance(p, torch.Tensor) and p.shape == (1500, 2) for p in cmp.probs.values())
    assert cmp.table.loc["platt", "ece"] < cmp.table.loc[UNCALIBRATED, "ece"]


@pytest.mark.parametrize("methods", [BINARY_METHODS, MULTICLASS_METHODS])
def test_float32_logits_give_the_table_of_their_float64_widening(methods) -> None:
    """Every probability of a comparison is float64, computed from the widened logits.

    Widening float32 to float64 is exact, after which both comparisons run the same float64
    operations on the same numbers (same process, same thread count): like with like, so
    the tables are equal exactly, not within a tolerance. Before, float32 logits gave a
    float32 softmax and float32-rounded calibrator outputs, whose metrics differ.
    """
    c = 2 if methods == BINARY_METHODS else 4
    zv, yv, zt, yt = _split(1500, c, seed=5)
    zv32, zt32 = zv.astype(np.float32), zt.astype(np.float32)
    narrow = compare_calibrators(zv32, yv, zt32, yt, methods=methods)
    wide = compare_calibrators(zv32.astype(np.float64), yv, zt32.astype(np.float64), yt,
                               methods=methods)
    pd.testing.assert_frame_equal(narrow.table, wide.table, check_exact=True)
    for name, probs in narrow.probs.items():
        assert probs.dtype == np.float64, name
        np.testing.assert_array_equal(probs, wide.probs[name], err_msg=name)
    # tensors likewise (float64 tensors out)
    tensors = compare_calibrators(*(torch.from_numpy(a) for a in (zv32, yv, zt32, yt)),
                                  methods=methods)
    assert all(p.dtype == torch.float64 for p in tensors.probs.values())
    pd.testing.assert_frame_equal(tensors.table, wide.table, check_exact=True)


def test_options_reach_the_constructor() -> None:
    zv, yv, zt, yt = _split(500, 3, seed=3)
    cmp = compare_calibrators(zv, yv, zt, yt, methods=["histogram", "matrix"],
                              options={"histogram": {"n_bins": 4}, "matrix": {"reg": 0.5}})
    assert cmp.calibrators["histogram"].n_bins == 4
    assert cmp.calibrators["matrix"].reg == 0.5


def test_interval_is_the_bootstrap_of_the_comparison_rows() -> None:
    zv, yv, zt, yt = _split(800, 3, seed=6)
    cmp = compare_calibrators(zv, yv, zt, yt, methods=["temperature", "isotonic"], n_bins=10)
    iv = cmp.interval("isotonic", "mce", reference=UNCALIBRATED, relative=True, n_boot=50)
    ref = metrics.bootstrap_interval(
        lambda p, y: metrics.mce(p, y, n_bins=10), cmp.probs["isotonic"], yt,
        baseline=cmp.probs[UNCALIBRATED], relative=True, n_boot=50)
    # the same resamples of the same probabilities; per-bin sums in another order (float64,
    # at most 1,600 terms in [0, 1]: below 1e-12) and a ratio of two MCEs near 0.1-0.3
    for a, b in ((iv.estimate, ref.estimate), (iv.low, ref.low), (iv.high, ref.high)):
        assert a == pytest.approx(b, abs=1e-9)
    change = cmp.relative_change(["mce"]).loc["isotonic", "mce"]
    assert iv.estimate == pytest.approx(change, rel=1e-12)  # two float64 roundings apart
    plain = cmp.interval("temperature", "nll", n_boot=50)
    assert plain.estimate == pytest.approx(cmp.table.loc["temperature", "nll"], rel=1e-12)
    assert plain.low < plain.estimate < plain.high
    with pytest.raises(ValueError, match="method must be one of"):
        cmp.interval("platt")
    with pytest.raises(ValueError, match="reference must be one of"):
        cmp.interval("isotonic", reference="bbq")
    with pytest.raises(ValueError, match="metric must be one of"):
        cmp.interval("isotonic", "sece")


def test_relative_change_hand_computed() -> None:
    table = pd.DataFrame({"ece": [0.10, 0.02, 0.15], "mce": [0.40, 0.10, 0.40]},
                         index=pd.Index([UNCALIBRATED, "a", "b"], name="method"))
    cmp = CalibrationComparison(table=table, probs={}, calibrators={})
    change = cmp.relative_change()
    assert list(change.index) == ["a", "b"]
    np.testing.assert_allclose(change.loc["a"].to_numpy(), [-0.8, -0.75])
    np.testing.assert_allclose(change.loc["b"].to_numpy(), [0.5, 0.0])
    np.testing.assert_allclose(cmp.relative_change(["mce"])["mce"].to_numpy(), [-0.75, 0.0])
    with pytest.raises(ValueError, match="unknown columns"):
        cmp.relative_change(["nll"])
    with pytest.raises(ValueError, match="non-empty sequence"):
        cmp.relative_change("ece")


def test_table1_layout() -> None:
    def fake(values: dict[str, float]) -> CalibrationComparison:
        frame = pd.DataFrame({m: [values.get(k, 0.0) for k in values] for m in TABLE_METRICS},
                             index=pd.Index(list(values), name="method"))
        frame["ece"] = list(values.values())
        return CalibrationComparison(table=frame, probs={}, calibrators={})

    cmps = {"A": fake({UNCALIBRATED: 0.1, "temperature": 0.01}),
            "B": fake({UNCALIBRATED: 0.2, "histogram": 0.05, "temperature": 0.03})}
    out = table1(cmps)
    assert list(out.index) == ["A", "B"]
    assert list(out.columns) == [LABELS[UNCALIBRATED], LABELS["temperature"],
                                 LABELS["histogram"]]
    assert out.loc["B", "Hist. binning"] == 0.05 and np.isnan(out.loc["A", "Hist. binning"])
    raw = table1(cmps, labels=False)
    assert list(raw.columns) == [UNCALIBRATED, "temperature", "histogram"]
    with pytest.raises(ValueError, match="metric"):
        table1(cmps, metric="sece")
    with pytest.raises(ValueError, match="non-empty"):
        table1({})
    with pytest.raises(TypeError, match="CalibrationComparison"):
        table1({"A": 3})


def test_compare_calibrators_input_errors() -> None:
    zv, yv, zt, yt = _split(200, 3, seed=4)
    with pytest.raises(ValueError, match="methods"):
        compare_calibrators(zv, yv, zt, yt, methods=["nope"])
    with pytest.raises(ValueError, match="methods"):
        compare_calibrators(zv, yv, zt, yt, methods=[])
    with pytest.raises(ValueError, match="methods"):
        compare_calibrators(zv, yv, zt, yt, methods="temperature")
    with pytest.raises(ValueError, match="repeat"):
        compare_calibrators(zv, yv, zt, yt, methods=["bbq", "bbq"])
    with pytest.raises(ValueError, match="not in methods"):
        compare_calibrators(zv, yv, zt, yt, methods=["bbq"], options={"matrix": {}})
    with pytest.raises(TypeError, match="options"):
        compare_calibrators(zv, yv, zt, yt, methods=["bbq"], options={"bbq": 3})
    with pytest.raises(ValueError, match="classes"):
        compare_calibrators(zv, yv, zt[:, :2], yt % 2)
    with pytest.raises(ValueError, match="test_labels"):
        compare_calibrators(zv, yv, zt, yt[:-1])
    with pytest.raises(ValueError, match="val_logits"):
        compare_calibrators(zv[:, :1], yv, zt, yt)


def test_compare_with_sklearn_agrees() -> None:
    pytest.importorskip("sklearn.frozen")
    # binary logits of a model whose true P(y = 1 | s) = sigmoid(0.4 s - 0.3)
    rng = np.random.default_rng(5)
    s = rng.normal(0.0, 3.0, 4000)
    y = (rng.random(4000) < 1.0 / (1.0 + np.exp(-(0.4 * s - 0.3)))).astype(np.int64)
    z = np.stack([np.zeros_like(s), s], axis=1).astype(np.float32)
    out = compare_with_sklearn(z[:2000], y[:2000], z[2000:], y[2000:])
    assert list(out.index) == ["isotonic, on p", "isotonic, on s", "Platt",
                               "Platt, smoothed targets"]
    assert list(out.columns) == ["sklearn", "ece_calnotes", "ece_sklearn", "max_abs_diff"]
    assert out.loc["isotonic, on p", "max_abs_diff"] < 1e-9
    assert out.loc["Platt", "max_abs_diff"] < 1e-3
    assert out.loc["Platt, smoothed targets", "max_abs_diff"] < 1e-3
    # interpolation in s instead of p moves predictions between the fitted steps only
    assert out.loc["isotonic, on s", "max_abs_diff"] < 0.1
    assert abs(out.loc["isotonic, on s", "ece_calnotes"]
               - out.loc["isotonic, on s", "ece_sklearn"]) < 0.01
    for name in ("isotonic, on p", "Platt"):
        assert out.loc[name, "ece_calnotes"] == pytest.approx(out.loc[name, "ece_sklearn"],
                                                              abs=1e-3)


def test_compare_with_sklearn_needs_binary_logits() -> None:
    zv, yv, zt, yt = _split(100, 3, seed=6)
    with pytest.raises(ValueError, match="binary"):
        compare_with_sklearn(zv, yv, zt, yt)
    z2, y2 = zv[:, :2], yv % 2
    with pytest.raises(ValueError, match="val_labels"):
        compare_with_sklearn(z2, yv + 5, z2, y2)


def test_bootstrap_is_paired_and_reproducible() -> None:
    zv, yv, zt, yt = _split(600, 3, seed=7)
    cmp = compare_calibrators(zv, yv, zt, yt, methods=["temperature", "histogram"])
    cmp.probs["copy"] = cmp.probs["temperature"].copy()  # identical to the reference
    out = cmp.bootstrap(n_boot=20, seed=3)
    assert list(out.index) == [UNCALIBRATED, "temperature", "histogram", "copy"]
    assert list(out.columns) == ["ece_std", "diff_std"]
    assert out.loc["temperature", "diff_std"] == 0 and out.loc["copy", "diff_std"] == 0
    assert (out["ece_std"] > 0).all()
    pd.testing.assert_frame_equal(out, cmp.bootstrap(n_boot=20, seed=3))
    # the same draws by hand
    rng = np.random.default_rng(3)
    draws = []
    for _ in range(20):
        i = rng.integers(0, len(yt), len(yt))
        draws.append([metrics.ece(cmp.probs[m][i], yt[i], n_bins=15)
                      for m in ("uncalibrated", "histogram")])
    draws = np.array(draws)
    assert out.loc[UNCALIBRATED, "ece_std"] == pytest.approx(draws[:, 0].std(ddof=1))
    assert out.loc["histogram", "ece_std"] == pytest.approx(draws[:, 1].std(ddof=1))


def test_bootstrap_errors() -> None:
    zv, yv, zt, yt = _split(200, 3, seed=8)
    cmp = compare_calibrators(zv, yv, zt, yt, methods=["histogram"])
    with pytest.raises(ValueError, match="reference"):
        cmp.bootstrap()  # temperature is not in this comparison
    with pytest.raises(ValueError, match="n_boot"):
        cmp.bootstrap(reference="histogram", n_boot=1)
    bare = CalibrationComparison(table=cmp.table, probs=cmp.probs, calibrators={})
    with pytest.raises(ValueError, match="no test labels"):
        bare.bootstrap(reference="histogram")
