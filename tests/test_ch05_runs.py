"""tools/ch05_runs.py: the background driver of chapter 5's runs (the chapter is not run)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def driver():
    spec = importlib.util.spec_from_file_location("ch05_runs", ROOT / "tools" / "ch05_runs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_driver_executes_chapter_5_with_its_parameters_and_streams_the_output(
        driver, monkeypatch, tmp_path, capsys):
    import papermill

    seen = {}

    def execute(notebook, out_path, **kwargs):
        seen.update(kwargs, out_path=out_path)

    monkeypatch.setattr(papermill, "execute_notebook", execute)
    assert driver.main(["-p", "N_SEEDS", "4", "--out", str(tmp_path)]) == 0
    assert Path(seen["out_path"]).parent == tmp_path
    assert Path(seen["out_path"]).name.startswith("05_meta_regularization")
    assert seen["parameters"]["N_SEEDS"] == 4 and seen["log_output"] is True
    assert "chapter 05 done" in capsys.readouterr().out


def test_driver_rejects_bad_parameters_before_running(driver, monkeypatch, capsys):
    import papermill

    def must_not_run(*args, **kwargs):
        raise AssertionError("the chapter was executed")

    monkeypatch.setattr(papermill, "execute_notebook", must_not_run)
    assert driver.main(["-p", "N_SEEDS", "1"]) == 2  # the seed intervals need two seeds
    assert "N_SEEDS" in capsys.readouterr().err


def test_driver_reports_a_failed_cell(driver, monkeypatch, tmp_path, capsys):
    import papermill

    def fails(*args, **kwargs):
        raise RuntimeError("a claim failed")

    monkeypatch.setattr(papermill, "execute_notebook", fails)
    assert driver.main(["--out", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "stopped after" in out and "RuntimeError: a claim failed" in out
