"""Streaming metrics: equal to the functional metrics on the concatenated batches (random
splits, weights, merged states, two gloo processes, the torchmetrics adapter), constant
state size for the equal-width binned ones, bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import calnotes.metrics as M
from calnotes.metrics import streaming as S

# Streaming sums the same float64 terms per batch and then over batches, the functional
# metric in one pass: the two orders differ by a few ulps of sums of at most N = 2000
# terms of order 1, i.e. below 2000 * 2^-52 ~ 5e-13. Equal-mass bins and SECE compute
# on the identical concatenated confidences and are compared exactly.
TOL = 1e-12


def _data(seed: int, n: int = 2000, c: int = 5, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(n, c, generator=gen, dtype=torch.float64)
    probs = torch.softmax(logits, dim=1).to(dtype)
    labels = torch.randint(0, c, (n,), generator=gen)
    weights = torch.rand(n, generator=gen, dtype=torch.float64) * 2
    return logits, probs, labels, weights


# (streaming metric factory, functional metric, exact): every streaming class and setting
CASES = {
    "ece": (lambda: S.StreamingECE(n_bins=15), lambda p, y, **k: M.ece(p, y, **k), False),
    "ece-l2": (lambda: S.StreamingECE(norm="l2"), lambda p, y, **k: M.ece(p, y, norm="l2", **k),
               False),
    "ece-mass": (lambda: S.StreamingECE(n_bins=10, binning="quantile"),
                 lambda p, y, **k: M.ece(p, y, n_bins=10, binning="quantile", **k), True),
    "mce": (lambda: S.StreamingMCE(n_bins=20), lambda p, y, **k: M.mce(p, y, n_bins=20, **k),
            False),
    "mce-mass": (lambda: S.StreamingMCE(binning="quantile"),
                 lambda p, y, **k: M.mce(p, y, binning="quantile", **k), True),
    "classwise": (lambda: S.StreamingClasswiseECE(n_classes=5),
                  lambda p, y, **k: M.classwise_ece(p, y, **k), False),
    "nll": (S.StreamingNLL, M.nll, False),
    "brier": (S.StreamingBrier, M.brier, False),
    "sece": (S.StreamingSECE, lambda p, y, **k: M.sece(p, y, **k), True),
    "sece-exact": (lambda: S.StreamingSECE(bandwidth=0.1, method="exact"),
                   lambda p, y, **k: M.sece(p, y, bandwidth=0.1, method="exact", **k), True),
}
WEIGHTED = [name for name in CASES if not name.startswith("sece")]


def _splits(n: int, seed: int) -> list[tuple[int, int]]:
    """Random batch boundaries, batches of 1 to 700 rows."""
    rng = np.random.default_rng(seed)
    cuts = sorted(set(rng.integers(1, n, size=rng.integers(1, 8)).tolist()))
    bounds = [0, *cuts, n]
    return list(zip(bounds[:-1], bounds[1:], strict=True))


def _close(got, want, exact: bool) -> None:
    if exact:
        assert float(got) == float(want)
    else:
        assert float(got) == pytest.approx(float(want), abs=TOL)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_streaming_equals_functional_on_random_splits(name, seed):
    make, functional, exact = CASES[name]
    _, p, y, _ = _data(seed)
    metric = make()
    for lo, hi in _splits(len(y), seed):
        metric.update(p[lo:hi], y[lo:hi])
    got = metric.compute()
    assert isinstance(got, torch.Tensor) and got.dtype == torch.float64
    _close(got, functional(p, y), exact)
    assert float(metric.compute()) == float(got)  # compute leaves the state as it was


@pytest.mark.parametrize("name", WEIGHTED)
def test_streaming_weighted_equals_functional(name):
    make, functional, _ = CASES[name]
    _, p, y, w = _data(3)
    metric = make()
    for lo, hi in _splits(len(y), 3):
        metric.update(p[lo:hi], y[lo:hi], sample_weight=w[lo:hi])
    assert float(metric.compute()) == pytest.approx(
        float(functional(p, y, sample_weight=w)), abs=TOL)


@pytest.mark.parametrize("name", list(CASES))
def test_merged_states_equal_one_stream(name):
    make, functional, _ = CASES[name]
    _, p, y, _ = _data(4)
    parts = [make() for _ in range(3)]
    for k, (lo, hi) in enumerate(_splits(len(y), 5)):
        parts[k % 3].update(p[lo:hi], y[lo:hi])
    merged = parts[0].merge(parts[1]).merge(parts[2])
    # merging reorders the batches, and with them the order of every float64 sum
    _close(merged.compute(), functional(p, y), exact=False)


def test_reset_forgets_and_logits_are_softmaxed():
    logits, p, y, _ = _data(6)
    metric = S.StreamingECE(from_logits=True)
    metric.update(torch.zeros(4, 5), torch.zeros(4, dtype=torch.long))
    metric.reset()
    with pytest.raises(ValueError, match="has no samples"):
        metric.compute()
    metric.update(logits, y)
    assert float(metric.compute()) == pytest.approx(float(M.ece(p, y)), abs=TOL)


def test_binned_state_has_constant_size():
    _, p, y, _ = _data(7)
    metric = S.StreamingClasswiseECE(n_classes=5, n_bins=15)
    sizes = []
    for lo in range(0, 2000, 100):
        metric.update(p[lo:lo + 100], y[lo:lo + 100])
        sizes.append(sum(t.numel() for t in metric.sums.values()))
    assert set(sizes) == {3 * 5 * 15} and not metric.cats
    ece = S.StreamingECE(n_bins=15)
    ece.update(p, y)
    assert sum(t.numel() for t in ece.sums.values()) == 3 * 15 and not ece.cats


def test_numpy_in_float_out_and_float32_kept():
    _, p, y, _ = _data(8, dtype=torch.float32)
    metric = S.StreamingBrier()
    metric.update(p.numpy(), y.numpy())
    assert isinstance(metric.compute(), float)
    metric = S.StreamingECE()
    metric.update(p, y)
    assert metric.compute().dtype == torch.float32
    assert float(metric.compute()) == pytest.approx(float(M.ece(p, y)), abs=1e-7)  # f32 rounding


def test_bad_input_names_the_argument():
    _, p, y, _ = _data(9)
    with pytest.raises(ValueError, match="n_bins"):
        S.StreamingECE(n_bins=0)
    with pytest.raises(ValueError, match="binning"):
        S.StreamingECE(binning="equal")
    with pytest.raises(ValueError, match="n_classes"):
        S.StreamingClasswiseECE(n_classes=1)
    with pytest.raises(TypeError, match="from_logits"):
        S.StreamingNLL(from_logits=1)
    with pytest.raises(ValueError, match="probs has 5 columns"):
        S.StreamingClasswiseECE(n_classes=3).update(p, y)
    with pytest.raises(ValueError, match="rows of probs must sum to 1"):
        S.StreamingECE().update(p * 0.5, y)
    with pytest.raises(ValueError, match="sample_weight has length"):
        S.StreamingNLL().update(p, y, sample_weight=torch.ones(3))
    with pytest.raises(ValueError, match="sample_weight is not supported"):
        S.StreamingSECE().update(p, y, sample_weight=torch.ones(len(y)))
    with pytest.raises(ValueError, match="other must be a StreamingECE with settings"):
        S.StreamingECE(n_bins=10).merge(S.StreamingECE(n_bins=15))
    with pytest.raises(TypeError, match="metric must be a StreamingMetric"):
        S.as_torchmetric(M.ece)


@pytest.mark.parametrize("weighted", [False, True])
def test_equal_mass_bins_of_float32_input_as_the_functional_metric(weighted):
    # two adjacent float32 confidences: the 3-bin edge between them (2/3 of the way)
    # rounds onto the upper one in float32, where ece() bins; binned in float64 instead,
    # the upper one fell in the next bin (0.62 against 0.5). Same bins: identical sums.
    a = np.float32(0.7)
    conf = np.array([0.55, 0.6, a, np.nextafter(a, np.float32(1)), 0.95], dtype=np.float32)
    p = torch.from_numpy(np.stack([1 - conf, conf], 1))
    y = torch.tensor([0, 0, 1, 0, 0])
    kwargs = {"sample_weight": torch.ones(5)} if weighted else {}
    metric = S.StreamingECE(n_bins=3, binning="quantile")
    metric.update(p, y, **kwargs)
    assert float(metric.compute()) == float(M.ece(p, y, n_bins=3, binning="quantile", **kwargs))


@pytest.mark.parametrize("make", [
    lambda m: S.StreamingECE(n_bins=m), lambda m: S.StreamingMCE(n_bins=m),
    lambda m: S.StreamingClasswiseECE(n_classes=3, n_bins=m)])
def test_n_bins_bounded_as_in_the_functional_metrics(make):
    # the state is allocated at construction: an unbounded n_bins takes all memory
    from calnotes.metrics._common import MAX_BINS
    with pytest.raises(ValueError, match=f"n_bins must be at most {MAX_BINS}"):
        make(MAX_BINS + 1)
    assert make(15).n_bins == 15


# ---------------------------------------------------------------- two processes (gloo)

WORKER = textwrap.dedent("""
    import json, sys
    import torch
    import torch.distributed as dist
    from calnotes.metrics import streaming as S

    rank, store, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=2)
    data = torch.load(sys.argv[4], weights_only=True)
    p, y, w = data["probs"], data["labels"], data["weights"]
    lo, hi = (0, 700) if rank == 0 else (700, len(y))  # unequal shares
    metrics = {
        "ece": S.StreamingECE(), "ece-mass": S.StreamingECE(binning="quantile"),
        "classwise": S.StreamingClasswiseECE(n_classes=p.shape[1]), "nll": S.StreamingNLL(),
        "brier": S.StreamingBrier(), "sece": S.StreamingSECE(),
        "ece-weighted": S.StreamingECE(),
    }
    for name, metric in metrics.items():
        for start in range(lo, hi, 128):
            stop = min(start + 128, hi)
            weight = w[start:stop] if name == "ece-weighted" else None
            metric.update(p[start:stop], y[start:stop], sample_weight=weight)
    values = {name: float(metric.compute()) for name, metric in metrics.items()}
    values["local"] = float(metrics["ece"].compute(sync=False))
    json.dump(values, open(out, "w"))
    dist.destroy_process_group()
""")


@pytest.mark.skipif(not torch.distributed.is_available(), reason="no torch.distributed")
def test_two_gloo_processes_reduce_to_the_functional_metric(tmp_path: Path):
    _, p, y, w = _data(10)
    torch.save({"probs": p, "labels": y, "weights": w}, tmp_path / "data.pt")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if sys.platform.startswith("linux"):  # both processes are local: skip interface lookup
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    procs = [subprocess.Popen(
        [sys.executable, str(script), str(rank), str(tmp_path / "store"),
         str(tmp_path / f"out{rank}.json"), str(tmp_path / "data.pt")],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    ) for rank in range(2)]
    for proc in procs:
        output = proc.communicate(timeout=240)[0]
        assert proc.returncode == 0, output
    results = [json.loads((tmp_path / f"out{rank}.json").read_text()) for rank in range(2)]
    want = {
        "ece": M.ece(p, y), "ece-mass": M.ece(p, y, binning="quantile"),
        "classwise": M.classwise_ece(p, y), "nll": M.nll(p, y), "brier": M.brier(p, y),
        "sece": M.sece(p, y), "ece-weighted": M.ece(p, y, sample_weight=w),
    }
    for values in results:
        for name, value in want.items():
            exact = name in ("ece-mass", "sece")
            _close(values[name], value, exact)
    assert results[0]["local"] == pytest.approx(float(M.ece(p[:700], y[:700])), abs=TOL)


# ---------------------------------------------------------------- torchmetrics adapter


@pytest.fixture(scope="module")
def torchmetrics_module():
    # torchmetrics imports torchvision, which needs its operator schemas declared first
    # next to a CPU torch (calnotes.data does this).
    from calnotes.data.sources import _import_torchvision

    _import_torchvision()
    return pytest.importorskip("torchmetrics")


@pytest.mark.parametrize("name", ["ece", "ece-mass", "classwise", "nll", "sece"])
def test_torchmetrics_adapter_equals_functional(torchmetrics_module, name):
    make, functional, exact = CASES[name]
    _, p, y, _ = _data(11)
    metric = S.as_torchmetric(make())
    assert isinstance(metric, torchmetrics_module.Metric)
    for lo, hi in _splits(len(y), 11):
        metric.update(p[lo:hi], y[lo:hi])
    _close(metric.compute(), functional(p, y), exact)
    metric.reset()
    metric.update(p[:500], y[:500])
    _close(metric.compute(), functional(p[:500], y[:500]), exact)
