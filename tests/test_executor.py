"""Tests of calnotes.runs.executor: the backend rule, the sequential and local Ray paths
(runs stored once, by the driver, equal across paths), failures reported by name and
config hash while the other runs go on, and sweeps handing their runs over together."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
import torch

from calnotes.runs import executor, sweeps
from calnotes.runs.executor import RunsFailed, choose_backend, execute
from calnotes.runs.experiment import default_config
from calnotes.runs.store import RunStore, config_hash, load_or_run


def _tiny(seed: int, **kw) -> dict:
    return default_config(**{"dataset": "digits", "model": "lenet5", "epochs": 1,
                             "batch_size": 64, "val_size": 200, "test_subset": 100,
                             "seed": seed, **kw})


# raises inside the run: more validation images than digits' 1438 training images
FAILING = _tiny(5, val_size=100000)


def test_backend_rule(monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(executor, "ray_available", lambda: True)
    assert choose_backend("auto", 1, None) == "sequential"  # one run: no Ray start-up
    assert choose_backend("auto", 0, None) == "sequential"
    assert choose_backend("auto", 2, None) == "ray"
    assert choose_backend("auto", 1, "10.0.0.1:6379") == "ray"  # a cluster is asked for
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert choose_backend("auto", 1, None) == "ray"
    assert choose_backend("sequential", 5, None) == "sequential"
    monkeypatch.setattr(executor, "ray_available", lambda: False)
    with pytest.raises(ValueError, match="calnotes\\[ray\\]"):
        choose_backend("auto", 1, None)  # RAY_ADDRESS without ray installed
    monkeypatch.delenv("RAY_ADDRESS")
    assert choose_backend("auto", 5, None) == "sequential"  # no Ray: today's path
    with pytest.raises(ValueError, match="calnotes\\[ray\\]"):
        choose_backend("ray", 5, None)
    with pytest.raises(ValueError, match="backend must be one of"):
        choose_backend("threads", 5, None)


def test_backend_variable_overrides_the_rule_for_auto_only(monkeypatch) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(executor, "ray_available", lambda: True)
    monkeypatch.setenv("CALNOTES_EXECUTOR", "sequential")
    assert choose_backend("auto", 5, None) == "sequential"
    assert choose_backend("auto", 5, "10.0.0.1:6379") == "sequential"
    assert choose_backend("ray", 5, None) == "ray"  # an explicit backend wins
    monkeypatch.setenv("CALNOTES_EXECUTOR", "ray")
    assert choose_backend("auto", 1, None) == "ray"
    monkeypatch.setenv("CALNOTES_EXECUTOR", "threads")
    with pytest.raises(ValueError, match="CALNOTES_EXECUTOR must be one of sequential, ray"):
        choose_backend("auto", 1, None)


def test_execute_rejects_bad_arguments(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    with pytest.raises(TypeError, match="configs must be a list"):
        execute(_tiny(0), store=store)
    with pytest.raises(TypeError, match="each config must be a dict"):
        execute([1], store=store)
    with pytest.raises(ValueError, match="threads must be an int >= 1"):
        execute([], store=store, threads=0)
    with pytest.raises(TypeError, match="store must be a RunStore"):
        execute([], store=str(tmp_path))
    with pytest.raises(ValueError, match="unknown config key|epoch"):
        execute([{"epoch": 1}], store=store)


def test_sequential_trains_the_missing_runs_and_reports_a_failure(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "results")
    ckpt = tmp_path / "ckpt"
    load_or_run(_tiny(0), store=store, checkpoint_root=ckpt, device="cpu", progress=False)
    log = io.StringIO()
    with pytest.raises(RunsFailed) as failed:
        execute([_tiny(0), FAILING, _tiny(1), _tiny(1)], label="t", store=store,
                checkpoint_root=ckpt, device="cpu", backend="sequential", stream=log)
    bad = config_hash(FAILING)
    assert list(failed.value.failures) == [bad]
    assert f"{bad} (digits/lenet5/ce seed 5): ValueError: val_size must lie" in str(failed.value)
    text = log.getvalue()
    assert f"run {bad} (digits/lenet5/ce seed 5) failed; the other runs go on" in text
    assert "runs: 1/2 done" in text and "cost of the 1 run(s) trained (sequential" in text
    assert store.exists(_tiny(1)) and not store.exists(FAILING)
    assert store.load(_tiny(1)).label == "t"
    report = execute([_tiny(0), _tiny(1)], store=store, checkpoint_root=ckpt, stream=log)
    assert report.trained == [] and report.stored_before == [config_hash(_tiny(0)),
                                                             config_hash(_tiny(1))]


@pytest.mark.slow
def test_local_ray_stores_what_the_sequential_path_stores(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the Ray tasks train with one thread each
    try:
        local = RunStore(tmp_path / "local")
        configs = [_tiny(0), _tiny(1)]
        execute(configs, store=local, checkpoint_root=tmp_path / "c1", device="cpu",
                backend="sequential", stream=io.StringIO())
    finally:
        torch.set_num_threads(threads)
    remote = RunStore(tmp_path / "ray")
    log = io.StringIO()
    with pytest.raises(RunsFailed) as failed:
        execute([FAILING, *configs], label="ray", store=remote,
                checkpoint_root=tmp_path / "c2", device="cpu", backend="ray", threads=1,
                stream=log)
    assert list(failed.value.failures) == [config_hash(FAILING)]
    assert "ValueError: val_size must lie" in str(failed.value)
    assert "cost of the 2 run(s) trained (ray" in log.getvalue()
    assert sorted(p.name for p in remote.root.iterdir() if not p.name.startswith(".")) == \
        sorted(config_hash(c) for c in configs)
    for config in configs:
        a, b = local.load(config), remote.load(config)
        # same machine, one thread, same computation: identical bits (float32 stored)
        assert torch.equal(a.test_logits, b.test_logits)
        assert torch.equal(a.val_logits, b.val_logits)
        assert a.history.without_timing() == b.history.without_timing()
        assert b.label == "ray" and b.provenance["cpu_threads"] == 1


def test_a_sweep_hands_its_missing_runs_over_together(monkeypatch) -> None:
    calls = []

    def fake_chapter_runs(configs, **kw):
        calls.append([c["seed"] for c in configs])
        return [f"run{c['seed']}" for c in configs]

    monkeypatch.setattr(sweeps, "chapter_runs", fake_chapter_runs)
    runner = sweeps.SweepRunner("t", use_store=True, smoke=True)
    assert runner.run_fn is None  # the default: the executor
    assert runner.runs([_tiny(0), _tiny(1), _tiny(0)]) == ["run0", "run1", "run0"]
    assert calls == [[0, 1]]
    # one new run goes to the executor too (which may send it to a cluster)
    assert runner.runs([_tiny(1), _tiny(2)]) == ["run1", "run2"]
    assert runner.run(_tiny(3)) == "run3"
    assert calls == [[0, 1], [2], [3]]
    with pytest.raises(TypeError, match="configs must be a list"):
        runner.runs(_tiny(0))


def test_in_a_kernel_progress_goes_to_the_terminal_alone(tmp_path: Path, monkeypatch,
                                                         capsys) -> None:
    import os
    import sys

    terminal = tmp_path / "terminal.txt"
    fd = os.open(terminal, os.O_WRONLY | os.O_CREAT)

    class KernelStderr(io.StringIO):  # what ipykernel puts in sys.stderr
        _original_stdstream_copy = fd

    monkeypatch.setattr(sys, "stderr", KernelStderr())
    try:
        execute([_tiny(3)], store=RunStore(tmp_path / "r"), checkpoint_root=tmp_path / "c",
                device="cpu", backend="sequential")
    finally:
        os.close(fd)
    shown = terminal.read_text()
    assert "runs: 0/1 done, 1 running" in shown and "runs: 1/1 done" in shown
    out = capsys.readouterr().out
    assert "runs:" not in out and "cost of the 1 run(s) trained (sequential" in out
