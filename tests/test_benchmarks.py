"""benchmarks/: which benchmarks ``make bench`` runs, and the workload of bench_results."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

from calnotes.runs.experiment import default_config
from calnotes.runs.store import RunStore, config_hash

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def bench():
    sys.path.insert(0, str(BENCHMARKS))
    import bench_results
    import run_all
    yield run_all, bench_results
    sys.path.remove(str(BENCHMARKS))


def test_make_bench_leaves_out_the_hour_long_benchmark_unless_named(bench) -> None:
    run_all, _ = bench
    names = ["bench_metrics", "bench_results", "bench_training"]
    assert run_all.selected(names, []) == ["bench_metrics", "bench_training"]
    assert run_all.selected(names, ["results"]) == ["bench_results"]
    assert run_all.selected(names, ["metrics", "training"]) == ["bench_metrics",
                                                                  "bench_training"]
    assert run_all.split_options(["training", "--", "--compile"]) == (["training"],
                                                                       ["--compile"])
    assert run_all.split_options(None) == ([], [])


def test_the_stored_workload_loads_in_todays_schema_and_is_scheduled_once(bench) -> None:
    _, bench_results = bench
    path = BENCHMARKS / "workloads" / "fc0bfb4_runs.json"
    commit, runs = bench_results.load_workload(path)
    assert commit == "fc0bfb4" and len(runs) == 42
    assert all(run["seconds"] > 0 for run in runs)
    phases = bench_results.schedule(runs)
    assert [chapter for chapter, _, _ in phases] == [
        "ch01_measuring", "ch02_diagnosing", "ch03_posthoc", "ch04_logitnorm", "ch05_meta"]
    assert {chapter: workers for chapter, workers, _ in phases}["ch05_meta"] == 2
    scheduled = [config_hash(c) for _, _, configs in phases for c in configs]
    # one run (ResNet-14, cross-entropy) was stored by chapters 3 and 5: trained once
    assert len(scheduled) == len(set(scheduled)) == len({config_hash(r["config"])
                                                          for r in runs}) == 41


def test_load_workload_rejects_another_file(bench, tmp_path: Path) -> None:
    _, bench_results = bench
    path = tmp_path / "w.json"
    path.write_text(json.dumps({"commit": "x"}))
    with pytest.raises(ValueError, match="w.json.*runs"):
        bench_results.load_workload(path)
    path.write_text(json.dumps({"commit": "x", "runs": [{"chapter": "ch01", "config": {}}]}))
    with pytest.raises(ValueError, match="w.json: run 0 lacks seconds"):
        bench_results.load_workload(path)


def test_bench_results_recomputes_a_small_workload_and_reports_its_cost(
        bench, tmp_path: Path, one_thread) -> None:
    _, bench_results = bench
    tiny = default_config(dataset="digits", model="lenet5", epochs=1, lr=0.05, seed=0,
                          train_subset=128, test_subset=64, batch_size=64, val_size=100)
    workload = {"commit": "abc1234", "runs": [
        {"chapter": "ch01_a", "hash": config_hash(tiny), "seconds": 7.0, "config": tiny},
        {"chapter": "ch02_b", "hash": config_hash(tiny), "seconds": 5.0, "config": tiny},
    ]}
    path = tmp_path / "abc1234_runs.json"
    path.write_text(json.dumps(workload))
    result = bench_results.main(["--workload", str(path), "--scratch", str(tmp_path / "s")])
    total, first, second = result["rows"]
    assert total["run_hours_then"] == round(12.0 / 3600, 3)
    assert first["runs"] == 1 and second["runs"] == 0  # the shared config is trained once
    stored = RunStore(tmp_path / "s" / "abc1234" / "results").load(tiny)
    assert first["run_seconds_now"] == round(stored.provenance["seconds"], 1)
    assert not total["resumed"] and first["wall_s"] > 0
    assert total["wall_hours"] == round((first["wall_s"] + second["wall_s"]) / 3600, 3)
    assert torch.isfinite(stored.test_logits).all()
    # run again: the stored run is loaded, and the row says the wall time was resumed
    again = bench_results.main(["--workload", str(path), "--scratch", str(tmp_path / "s")])
    assert again["rows"][0]["resumed"] and again["rows"][1]["wall_s"] >= first["run_seconds_now"]


def test_the_smece_benchmark_compares_equal_values(bench) -> None:
    """The straightforward reference (image-sum kernel, bisection) finds the same smECE as
    the library's closed-form kernel and Brent's method, within the fixed point's 1e-6."""
    import bench_metrics

    (row,) = bench_metrics.bench_smece([500], repeat=1, seed=3)
    assert row["abs_diff_vs_peer"] < 2e-6
    assert row["calnotes_s"] > 0 and row["peer_s"] > 0 and row["floor_s"] > 0
