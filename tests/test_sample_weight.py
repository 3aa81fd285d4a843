"""``sample_weight`` in the binned metrics, NLL and Brier: hand-computed cases, weights of
1 against the unweighted metric, integer weights against repeated rows, float weights
against a reference loop, bad weights."""

from __future__ import annotations

import numpy as np
import pytest
import reference as ref
import torch

import calnotes.metrics as M
from calnotes.metrics._weights import weighted_quantile_edges

# (name, function, keyword arguments): every metric that takes sample_weight
WEIGHTED = [
    ("ece", M.ece, {}),
    ("ece-l2", M.ece, {"norm": "l2"}),
    ("ece-mass", M.ece, {"binning": "quantile"}),
    ("mce", M.mce, {}),
    ("mce-mass", M.mce, {"binning": "quantile"}),
    ("classwise", M.classwise_ece, {}),
    ("classwise-mass", M.classwise_ece, {"binning": "quantile"}),
    ("ace", M.ace, {}),
    ("nll", M.nll, {}),
    ("brier", M.brier, {}),
]
IDS = [w[0] for w in WEIGHTED]
# Two computations of the same float64 sums in another order (per sample, or once per
# repeated row) differ by a few ulps of the sums: N * 2^-52 * |value| with N <= 1000 is
# below 1e-12 for values of order 1.
TOL = 1e-12


def _data(seed: int, n: int = 300, c: int = 4) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(c, 0.4), size=n), rng.integers(0, c, n)


def test_hand_computed_weighted_ece_nll_brier():
    # top labels: 0.9 (class 1, right) and 0.6 (class 0, wrong), weights 3 and 1.
    p, y, w = np.array([0.9, 0.4]), np.array([1, 1]), np.array([3.0, 1.0])
    # one bin: acc = 3/4, conf = (3 * 0.9 + 0.6) / 4 = 0.825
    assert M.ece(p, y, n_bins=1, sample_weight=w) == pytest.approx(0.075, abs=1e-15)
    # two bins: (0.5, 1] holds both -> same; ten bins: |1 - 0.9| * 3/4 + |0 - 0.6| * 1/4
    assert M.ece(p, y, n_bins=10, sample_weight=w) == pytest.approx(0.225, abs=1e-15)
    assert M.mce(p, y, n_bins=10, sample_weight=w) == pytest.approx(0.6, abs=1e-15)
    assert M.nll(p, y, sample_weight=w) == pytest.approx(
        -(3 * np.log(0.9) + np.log(0.4)) / 4, abs=1e-15)
    assert M.brier(p, y, sample_weight=w) == pytest.approx(
        (3 * 2 * 0.1**2 + 2 * 0.6**2) / 4, abs=1e-15)


@pytest.mark.parametrize(("name", "metric", "kwargs"), WEIGHTED, ids=IDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_unit_weights_equal_unweighted(name, metric, kwargs, seed):
    p, y = _data(seed)
    plain = metric(p, y, **kwargs)
    assert metric(p, y, sample_weight=np.ones(len(y)), **kwargs) == pytest.approx(plain, abs=TOL)


@pytest.mark.parametrize(("name", "metric", "kwargs"), WEIGHTED, ids=IDS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_integer_weights_equal_repeated_rows(name, metric, kwargs, seed):
    p, y = _data(seed)
    w = np.random.default_rng(seed + 10).integers(0, 4, len(y))
    rows = np.repeat(np.arange(len(y)), w)
    repeated = metric(p[rows], y[rows], **kwargs)
    assert metric(p, y, sample_weight=w, **kwargs) == pytest.approx(repeated, abs=TOL)
    # float weights and torch input give the same number
    t = metric(torch.from_numpy(p), torch.from_numpy(y),
               sample_weight=torch.from_numpy(w.astype(np.float32)), **kwargs)
    assert isinstance(t, torch.Tensor) and t.dtype == torch.float64
    assert float(t) == pytest.approx(repeated, abs=TOL)


@pytest.mark.parametrize(("name", "metric", "kwargs"), WEIGHTED, ids=IDS)
def test_scaling_weights_changes_nothing(name, metric, kwargs):
    # equal-mass edges too: they are computed on the weights divided by the smallest one
    p, y = _data(3)
    w = np.random.default_rng(4).uniform(0.1, 2.0, len(y))
    # scaling by a power of two is exact in binary floating point
    assert metric(p, y, sample_weight=8 * w, **kwargs) == pytest.approx(
        metric(p, y, sample_weight=w, **kwargs), abs=TOL)


@pytest.mark.parametrize(("name", "metric", "kwargs"), WEIGHTED, ids=IDS)
def test_weights_summing_to_one_equal_unweighted(name, metric, kwargs):
    # normalised equal weights: a total W below 1 once put every equal-mass edge at the
    # minimum (one bin). Each w_i / min(w) is exactly 1, so the comparison is to TOL.
    p, y = _data(8)
    plain = metric(p, y, **kwargs)
    w = np.full(len(y), 1 / len(y))
    assert metric(p, y, sample_weight=w, **kwargs) == pytest.approx(plain, abs=TOL)


def test_weighted_quantile_edges_repeat_rows_and_reference():
    rng = np.random.default_rng(5)
    v = torch.from_numpy(rng.uniform(size=50))
    w = torch.from_numpy(rng.integers(0, 5, 50).astype(np.float64))
    got = weighted_quantile_edges(v.unsqueeze(0), w, 7)[0].numpy()
    want = np.quantile(np.repeat(v.numpy(), w.numpy().astype(int)), np.arange(8) / 7)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


def test_float32_input_keeps_its_dtype_with_weights():
    p, y = _data(6)
    t = M.ece(torch.from_numpy(p).float(), torch.from_numpy(y), sample_weight=np.ones(len(y)))
    assert t.dtype == torch.float32


@pytest.mark.parametrize(
    ("weights", "error", "match"),
    [
        (np.ones(3), ValueError, "sample_weight has length 3"),
        (np.ones((300, 1)), ValueError, "sample_weight must have shape"),
        (-np.ones(300), ValueError, "sample_weight must be >= 0"),
        (np.zeros(300), ValueError, "sample_weight must have a positive sum"),
        (np.full(300, np.nan), ValueError, "sample_weight contains NaN"),
        (np.ones(300, dtype=bool), TypeError, "sample_weight must have a real"),
        ([1.0] * 300, TypeError, "sample_weight must be a torch.Tensor"),
    ],
)
@pytest.mark.parametrize(("name", "metric", "kwargs"), WEIGHTED[:1] + WEIGHTED[5:], ids=[
    IDS[0]] + IDS[5:])
def test_bad_weights_name_the_argument(weights, error, match, name, metric, kwargs):
    p, y = _data(7)
    with pytest.raises(error, match=match):
        metric(p, y, sample_weight=weights, **kwargs)


def _weighted_ece_loop(probs: np.ndarray, labels: np.ndarray, w: np.ndarray,
                       n_bins: int) -> float:
    """sum_m (W_m / W) |acc_m - conf_m| by a loop over samples and bins, equal-width bins."""
    conf, correct = ref.top_label(probs, labels)
    edges = ref.uniform_edges(n_bins)
    total = float(sum(w))
    value = 0.0
    for m in range(n_bins):
        members = [i for i in range(len(conf)) if ref.bin_of(conf[i], edges) == m]
        w_m = sum(w[i] for i in members)
        if w_m > 0:
            acc = sum(w[i] * correct[i] for i in members) / w_m
            mean_conf = sum(w[i] * conf[i] for i in members) / w_m
            value += w_m / total * abs(acc - mean_conf)
    return value


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_float_weights_match_a_reference_loop(seed):
    p, y = _data(seed, n=200)
    w = np.random.default_rng(seed + 20).uniform(0, 3, len(y))
    assert M.ece(p, y, n_bins=10, sample_weight=w) == pytest.approx(
        _weighted_ece_loop(p, y, w, 10), abs=TOL)
