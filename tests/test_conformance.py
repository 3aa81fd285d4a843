"""The conformance appendix's library code: conventions emulated by hand-computable cases,
and each peer's number explained by the convention the table names."""

import math

import numpy as np
import pytest

from calnotes import metrics
from calnotes.book.evidence import conformance as C
from calnotes.book.evidence.conformance_cases import reproducer_table, reproducers


def _binned(conf, correct, convention, m=15, norm="l1"):
    index, bins, dtype = C._uniform_index(np.asarray(conf, float), m, convention)
    return C.binned_error(np.asarray(conf, float), np.asarray(correct, float), index, bins,
                          norm, dtype)


def test_saturated_case_by_hand():
    # 0.95 right, 1.0 wrong: (lo, hi] pools both in (14/15, 1]: |0.5 - 0.975| = 0.475;
    # a bin of its own for 1.0: 0.5 * 0.05 + 0.5 * 1 = 0.525
    assert _binned([0.95, 1.0], [1, 0], "calnotes") == pytest.approx(0.475, abs=1e-15)
    assert _binned([0.95, 1.0], [1, 0], "left-closed-own-bin") == pytest.approx(0.525,
                                                                                abs=1e-15)
    # float32 sums of two terms: within a few float32 units
    assert _binned([0.95, 1.0], [1, 0], "left-closed-float32") == pytest.approx(0.525,
                                                                                abs=1e-6)
    probs = np.array([[0.05, 0.95], [0.0, 1.0]])
    assert metrics.ece(probs, np.array([1, 0])) == pytest.approx(0.475, abs=1e-15)


def test_edge_and_edge_count_cases_by_hand():
    # 0.6 = 9/15 on an edge: (lo, hi] -> 0.5 * 0.4 + 0.5 * 0.65; [lo, hi) -> |0.5 - 0.625|
    assert _binned([0.6, 0.65], [1, 0], "calnotes") == pytest.approx(0.525, abs=1e-15)
    assert _binned([0.6, 0.65], [1, 0], "left-closed") == pytest.approx(0.125, abs=1e-15)
    # num_bins=15 edges = 14 bins: 0.93 and 0.94 share (13/14, 1]
    assert _binned([0.93, 0.94], [1, 0], "calnotes") == pytest.approx(0.505, abs=1e-15)
    assert _binned([0.93, 0.94], [1, 0], "edges-count") == pytest.approx(0.435, abs=1e-15)


def test_emulated_calnotes_convention_is_calnotes():
    rng = np.random.default_rng(0)
    p = rng.dirichlet(np.ones(5) * 0.3, size=3000)
    y = rng.integers(0, 5, 3000)
    conf, correct = (np.asarray(a) for a in metrics.confidences_and_correct(p, y))
    bound = C.rounding_tolerance(3000, np.float64)
    for norm, fn in (("l1", metrics.ece), ("max", metrics.mce)):
        assert abs(_binned(conf, correct, "calnotes", norm=norm) - fn(p, y)) <= bound
    index, bins = C._mass_index(conf, 15, "calnotes")
    assert abs(C.binned_error(conf, correct, index, bins)
               - metrics.ece(p, y, binning="quantile")) <= bound


def test_rounding_tolerance():
    assert C.rounding_tolerance(10, np.float64) == 20 * np.finfo(np.float64).eps
    assert C.rounding_tolerance(10, np.float32, 3.0) == pytest.approx(
        60 * float(np.finfo(np.float32).eps))


def test_relplot_grid_smece_explains_relplot():
    relplot = pytest.importorskip("relplot")
    case = reproducers()["confidences near 1"]
    conf, correct = (np.asarray(a) for a in metrics.confidences_and_correct(
        case.probs, case.labels))
    for sigma in (0.02, 0.1):
        ours, _ = C.relplot_grid_smece(conf, correct, sigma)
        # the same operations in another order (np.interp for relplot's interpolation)
        assert ours == pytest.approx(relplot.smECE_sigma(conf, correct, sigma), abs=1e-12)
    value, width = relplot.smECE(conf, correct, return_width=True)
    ours, ours_width = C.relplot_grid_smece(conf, correct)
    assert ours_width == width
    assert ours == pytest.approx(value, abs=1e-12)
    # and it differs from the integral that calnotes computes by more than 1%
    assert abs(value - metrics.smece(case.probs, case.labels)) > 0.01 * value


@pytest.mark.parametrize("name", ["saturated confidence", "confidence on a bin edge",
                                  "num_bins counts edges", "few distinct values",
                                  "true class underflowed"])
def test_reproducers_are_explained_and_match_the_hand_values(name):
    pytest.importorskip("netcal")
    case = reproducers()[name]
    table = reproducer_table(case)
    rows = table[table["status"] != "not available"]
    assert len(rows) > 0
    assert not (rows["status"] == "unexplained").any(), rows
    worked = rows.dropna(subset=["by_hand"])
    assert ((worked["value"] - worked["by_hand"]).abs()
            <= np.maximum(worked["tolerance"], 1e-12)).all(), worked
    assert (rows["explanation"] == rows["convention"].map(C.CONVENTIONS)).all()


def test_torchmetrics_row_names_the_own_bin_convention():
    pytest.importorskip("torchmetrics")
    table = reproducer_table(reproducers()["saturated confidence"], peers=["torchmetrics"])
    row = table.set_index("library").loc["torchmetrics"]
    assert row["status"] == "explained"
    assert row["convention"] == "left-closed-float32"
    assert "1.0" in row["explanation"]
    assert row["calnotes"] == pytest.approx(0.475, abs=1e-15)
    assert row["value"] == pytest.approx(0.525, abs=row["tolerance"])


def test_sklearn_nll_clips_at_machine_epsilon():
    pytest.importorskip("sklearn")
    table = reproducer_table(reproducers()["true class underflowed"], peers=["scikit-learn"])
    row = table.set_index("library").loc["scikit-learn"]
    eps = float(np.finfo(np.float64).eps)
    assert row["value"] == pytest.approx((-math.log(eps) - math.log(0.9)) / 2, abs=1e-12)
    assert row["calnotes"] == pytest.approx((-math.log(1e-12) - math.log(0.9)) / 2,
                                            abs=1e-12)
    assert row["status"] == "explained" and row["convention"] == "machine-eps-clip"


def test_debiased_l2_discrete_switch():
    pytest.importorskip("calibration")
    case = reproducers()["few distinct values"]
    row = reproducer_table(case, peers=["uncertainty-calibration"]).iloc[0]
    assert row["convention"] == "discrete-switch" and row["status"] == "explained"
    # a bin per sample reproduces the per-value binning, as debiased_l2_ce says
    assert metrics.debiased_l2_ce(case.probs, case.labels, n_bins=len(case.labels)) == (
        pytest.approx(row["value"], abs=row["tolerance"]))


def test_missing_peer_is_a_row_not_an_error(monkeypatch):
    monkeypatch.setitem(C.PEERS, "netcal", ("netcal", "no_such_module_for_test"))
    table = C.conformance_table(np.array([[0.2, 0.8], [0.7, 0.3]]), np.array([1, 1]),
                                peers=["netcal"], metric_names=["ECE"])
    assert list(table["status"]) == ["not available"]
    assert "No module named" in table["explanation"].iloc[0]
    versions = C.peer_versions(["netcal"])
    assert not versions["importable"].iloc[0]


def test_bad_arguments():
    p, y = np.array([[0.2, 0.8]]), np.array([1])
    with pytest.raises(ValueError, match="peers"):
        C.conformance_table(p, y, peers=["nope"])
    with pytest.raises(ValueError, match="metric_names"):
        C.conformance_table(p, y, metric_names=["ECE", "AUC"])
