"""calnotes.book.evidence.ch05: chapter 5's measures and studies, checked against
independent computations (numpy loops, the stored files read directly)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import reference as ref
import torch
import torch.nn.functional as F

from calnotes import losses, metrics
from calnotes.book.evidence import ch05
from calnotes.runs.claims import load_claims
from calnotes.runs.methods import temperature_scaled
from calnotes.runs.store import RunStore
from calnotes.training import History

RESULTS = Path(__file__).resolve().parent.parent / "results"
CLAIMS = Path(__file__).resolve().parent.parent / "book" / "claims" / "05.yaml"


def _fake_run(loss="focal", meta=None, seed=0, n=600, c=10, scale=3.0, records=()):
    g = torch.Generator().manual_seed(seed)
    logits = scale * torch.randn(n, c, generator=g)
    labels = torch.where(torch.rand(n, generator=g) < 0.7, logits.argmax(1),
                         torch.randint(0, c, (n,), generator=g))
    val = scale * torch.randn(300, c, generator=g)
    val_labels = torch.where(torch.rand(300, generator=g) < 0.7, val.argmax(1),
                             torch.randint(0, c, (300,), generator=g))
    config = {"loss": loss, "epochs": 7, "schedule": "step", "milestones": [3 / 7, 5 / 7],
              "batch_size": 128, "weight_decay": 1e-5, "train_subset": 1000}
    if meta is not None:
        config["meta"] = meta
    return SimpleNamespace(config=config, test_logits=logits, test_labels=labels,
                           val_logits=val, val_labels=val_labels, history=History(records),
                           path=Path(f"/nonexistent/{loss}-{seed}"))


def _reference_ece(probs, labels, n_bins, norm="l1"):
    return ref.ece(probs.numpy(), labels.numpy(), n_bins=n_bins, norm=norm)


def test_reference_dece_equals_the_library_form_and_its_gradient():
    for seed, c in ((0, 10), (1, 3), (2, 40)):
        g = torch.Generator().manual_seed(seed)
        z = (2.5 * torch.randn(128, c, generator=g, dtype=torch.float64)).requires_grad_(True)
        y = torch.randint(0, c, (128,), generator=g)
        ours = ch05.reference_dece(F.softmax(z, 1), y)
        (g_ours,) = torch.autograd.grad(ours, z)
        lib = losses.dece(F.softmax(z, 1), y, form="ranked", **losses.RANKED_DECE)
        (g_lib,) = torch.autograd.grad(lib, z)
        # the 1e-6 smoothing of the bin shares moves the value by < (2M + 1) 1e-6 (M = 15)
        assert abs(ours.item() - lib.item()) <= 31e-6
        assert lib.item() > 1e-3  # a clearly non-zero calibration error
        # the smoothing changes each bin's weights by ~1e-6 relative: gradients agree to 1e-3
        torch.testing.assert_close(g_ours, g_lib, atol=1e-3, rtol=1e-3)


def test_over_bins_measures_are_the_mean_of_a_numpy_binned_loop():
    run = _fake_run()
    probs = torch.softmax(run.test_logits.double(), 1)
    bins = [10, 15, 100]
    for fn, norm in ((ch05.ece_over_bins, "l1"), (ch05.mce_over_bins, "max")):
        expected = np.mean([_reference_ece(probs, run.test_labels, b, norm) for b in bins])
        # float64 both ways; only summation order differs
        assert fn(run, bins=bins) == pytest.approx(expected, abs=1e-9)
    idx = np.arange(0, 600, 2)
    expected = _reference_ece(probs[idx], run.test_labels[idx], 15)
    assert ch05.ece_over_bins(run, index=idx, bins=15) == pytest.approx(expected, abs=1e-9)


def test_classwise_ece_is_the_numpy_loop_raw_and_at_the_validation_temperature():
    run = _fake_run(loss="ce")
    probs = torch.softmax(run.test_logits.double(), 1).numpy()
    expected = ref.classwise_ece(probs, run.test_labels.numpy(), n_bins=15)
    assert ch05.classwise_ece(run) == pytest.approx(expected, abs=1e-9)  # float64 both ways
    idx = np.arange(0, 600, 3)
    expected = ref.classwise_ece(probs[idx], run.test_labels.numpy()[idx], n_bins=10)
    assert ch05.classwise_ece(run, index=idx, bins=10) == pytest.approx(expected, abs=1e-9)
    scaled, temperature = temperature_scaled(run.val_logits, run.val_labels, run.test_logits)
    assert abs(temperature - 1.0) > 0.05  # the fake logits are miscalibrated: T matters
    expected = ref.classwise_ece(np.asarray(scaled, dtype=np.float64), run.test_labels.numpy())
    # the same NLL fit by two paths (float32 vs float64 logits): temperatures agree to ~1e-5,
    # which moves a binned error by far less than 1e-4
    assert ch05.classwise_ece(run, temperature="val") == pytest.approx(expected, abs=1e-4)
    with pytest.raises(ValueError, match="temperature"):
        ch05.classwise_ece(run, temperature=1.5)
    with pytest.raises(TypeError, match="bins"):
        ch05.classwise_ece(run, bins=1.5)


def test_bin_growth_is_the_numpy_binned_loop_at_high_minus_at_low():
    run = _fake_run()
    probs = torch.softmax(run.test_logits.double(), 1)
    for fn, norm in ((ch05.ece_bin_growth, "l1"), (ch05.mce_bin_growth, "max")):
        expected = (_reference_ece(probs, run.test_labels, 1000, norm)
                    - _reference_ece(probs, run.test_labels, 10, norm))
        # float64 both ways; only summation order differs
        assert fn(run) == pytest.approx(expected, abs=1e-9)
        expected = (_reference_ece(probs, run.test_labels, 100, norm)
                    - _reference_ece(probs, run.test_labels, 15, norm))
        assert fn(run, low=15, high=100) == pytest.approx(expected, abs=1e-9)
    # 1000 equal-width bins refine 10: a coarse bin's gap is a weighted mean of its sub-bins'
    # gaps, so by the triangle inequality neither the ECE nor the MCE can fall (a property)
    assert ch05.ece_bin_growth(run) > 0
    assert ch05.mce_bin_growth(run) >= 0


def test_bin_growth_checks_its_bin_counts():
    run = _fake_run()
    with pytest.raises(ValueError, match="low"):
        ch05.ece_bin_growth(run, low=100, high=10)
    with pytest.raises(ValueError, match="low"):
        ch05.mce_bin_growth(run, low=15, high=15)
    with pytest.raises((ValueError, TypeError), match="high"):
        ch05.ece_bin_growth(run, high=0)


def test_over_bins_at_the_validation_temperature_is_temperature_scaling_then_binning():
    ce = _fake_run(loss="ce")
    scaled, temperature = temperature_scaled(ce.val_logits, ce.val_labels, ce.test_logits)
    assert abs(temperature - 1.0) > 0.05  # the fake logits are miscalibrated: T matters
    probs = torch.as_tensor(scaled).double()
    bins = [10, 15, 100]
    for fn, norm in ((ch05.ece_over_bins, "l1"), (ch05.mce_over_bins, "max")):
        expected = np.mean([_reference_ece(probs, ce.test_labels, b, norm) for b in bins])
        # the same NLL fit on the same data by two paths (float32 vs float64 logits): the
        # temperatures agree to ~1e-5, which moves a binned error by far less than 1e-4
        assert fn(ce, bins=bins, temperature="val") == pytest.approx(expected, abs=1e-4)
        assert fn(ce, bins=bins, temperature="val") != pytest.approx(fn(ce, bins=bins), abs=1e-3)


def test_the_ce_ts_arm_reads_the_ce_runs_at_their_validation_temperature():
    spec = load_claims(CLAIMS)
    assert spec["arms"]["CE+TS"]["options"] == {"temperature": "val"}
    assert spec["arms"]["CE+TS"]["where"] == spec["arms"]["CE"]["where"]
    for claim in spec["claims"]:
        if "CE+TS" in (claim.get("test", {}).get("a"), claim.get("test", {}).get("b")):
            assert claim["test"]["statistic"] in ("ece", "mce", "nll", "classwise_ece",
                                                  "ece_over_bins",
                                                  "mce_over_bins", "ece_bin_growth",
                                                  "mce_bin_growth")


def test_bad_options_name_the_argument():
    run = _fake_run()
    with pytest.raises(ValueError, match="bins"):
        ch05.ece_over_bins(run, bins=[])
    with pytest.raises(ValueError, match="binning"):
        ch05.ece_over_bins(run, binning="log")
    with pytest.raises(ValueError, match="temperature"):
        ch05.ece_over_bins(run, bins=15, temperature=1.5)
    with pytest.raises(ValueError, match="other"):
        ch05.bias_gap(32, draws=2, other="mce")
    with pytest.raises(ValueError, match="form"):
        ch05.outer_cost(10, rounds=1, calls=1, form="fast")
    with pytest.raises(TypeError, match="classes"):
        ch05.outer_cost(10.5, rounds=1, calls=1)
    with pytest.raises(ValueError, match="gamma_std"):
        ch05.gamma_std_growth(run)
    with pytest.raises(ValueError, match="index"):
        ch05.gamma_std_growth(run, index=[0, 1])


def test_bias_gap_is_deterministic_and_is_sece_minus_the_other_estimator():
    a = ch05.bias_gap(64, draws=4, other="ece", seed=3)
    b = ch05.bias_gap(64, draws=4, other="ece", seed=3)
    np.testing.assert_array_equal(a, b)
    assert not np.allclose(a, ch05.bias_gap(64, draws=4, other="ece", seed=4))
    from calnotes.synthetic import SyntheticModel

    probs, labels = SyntheticModel("calibrated").sample(64, seed=np.random.SeedSequence([3, 64, 2]))
    p = torch.as_tensor(probs)
    expected = (float(metrics.sece(p, torch.as_tensor(labels), bandwidth=0.05))
                - ref.ece(probs, labels, n_bins=15))
    assert a[2] == pytest.approx(expected, abs=1e-9)  # float64 both ways


def test_outer_cost_returns_one_finite_log_ratio_per_round():
    out = ch05.outer_cost(10, batch=32, rounds=3, calls=2)
    assert out.shape == (3,) and np.isfinite(out).all()
    assert torch.get_num_threads() >= 1


def test_meta_steps_by_hand():
    ours = ch05.meta_steps(8000, 128, 21, [3 / 7, 5 / 7])
    assert ours["epochs"].tolist() == [9, 6, 6]
    assert ours["meta steps"].tolist() == [9 * 63, 6 * 63, 6 * 63]  # ceil(8000 / 128) = 63
    paper = ch05.meta_steps(40000, 128, 350, [150 / 350, 250 / 350])
    assert paper["meta steps"].tolist() == [150 * 313, 100 * 313, 100 * 313]


def _stored(where):
    """Stored chapter-5 runs whose config matches ``where`` (top-level and meta keys)."""
    found = []
    for folder in sorted(RESULTS.glob("*/provenance.json")):
        prov = json.loads(folder.read_text())
        if prov.get("label") != ch05.LABEL:
            continue
        config = json.loads((folder.parent / "config.json").read_text())
        meta = config.get("meta") or {}
        if all((meta.get(k[5:]) if k.startswith("meta.") else config.get(k)) == v
               for k, v in where.items()):
            found.append(folder.parent)
    return found


@pytest.mark.parametrize("outer", ["sece", "dece"])
def test_gamma_std_growth_recomputed_from_the_stored_history(outer):
    folders = _stored({"loss": "focal", "meta.learner": "gamma-net", "meta.outer": outer})
    if not folders:
        pytest.skip("no stored chapter-5 gamma-Net runs")
    store = RunStore(RESULTS)
    for folder in folders:
        records = json.loads((folder / "history.json").read_text())["records"]
        config = json.loads((folder / "config.json").read_text())
        start = round(config["milestones"][0] * config["epochs"])
        expected = records[-1]["gamma_std"] - records[start - 1]["gamma_std"]
        run = store.load(config)
        assert ch05.gamma_std_growth(run) == pytest.approx(expected, abs=1e-12)


def test_l2_coefficients_recomputed_from_the_stored_history():
    folders = _stored({"loss": "ce", "meta.learner": "l2"})
    if not folders:
        pytest.skip("no stored CE-DECE runs")
    store = RunStore(RESULTS)
    runs = {folder.name: store.load(json.loads((folder / "config.json").read_text()))
            for folder in folders}
    table = ch05.l2_coefficients(runs)
    for name, run in runs.items():
        last = json.loads((RESULTS / name / "history.json").read_text())["records"][-1]
        wd = run.config["weight_decay"] * run.config["batch_size"]
        row = table.loc[name]
        assert row["mean λ"] == last["l2_mean"] and row["std λ"] == last["l2_std"]
        assert math.isclose(row["std λ / weight decay"], last["l2_std"] / wd, rel_tol=1e-12)
