"""Tests for calnotes.report and ``python -m calnotes report`` on small real .npz/.pt files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from calnotes import calibrators, report
from calnotes.__main__ import main

pytestmark = pytest.mark.usefixtures("one_thread")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _overconfident(n: int, c: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """float32 logits 3 z of a calibrated model z (labels drawn from softmax(z))."""
    g = torch.Generator().manual_seed(seed)
    z = 2.0 * torch.randn(n, c, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z, dim=1), 1, generator=g)[:, 0]
    return (3.0 * z).float().numpy(), y.numpy()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    """A validation split as .npz and a test split as .pt, written by numpy and torch."""
    val, test = _overconfident(600, 4, seed=1), _overconfident(400, 4, seed=2)
    np.savez(tmp_path / "val.npz", logits=val[0], labels=val[1])
    torch.save({"logits": torch.from_numpy(test[0]), "labels": torch.from_numpy(test[1])},
               tmp_path / "test.pt")
    return {"val": tmp_path / "val.npz", "test": tmp_path / "test.pt", "dir": tmp_path}


def test_load_logits_reads_npz_as_numpy_and_pt_as_tensors(files) -> None:
    z, y = report.load_logits(files["val"])
    assert isinstance(z, np.ndarray) and z.shape == (600, 4) and y.shape == (600,)
    zt, yt = report.load_logits(files["test"])
    assert isinstance(zt, torch.Tensor) and zt.shape == (400, 4) and yt.dtype == torch.int64


def test_make_report_fits_on_validation_and_measures_on_test(files) -> None:
    val, test = report.load_logits(files["val"]), report.load_logits(files["test"])
    rep = report.make_report(*val, *test)
    table = rep.comparison.table
    assert list(table.index) == ["uncalibrated", *report.default_methods(4)]
    # the test metrics of temperature scaling are those of the calibrator fitted on val
    ts = calibrators.TemperatureScaling().fit(*val)
    assert ts.temperature_ == pytest.approx(rep.calibrators["temperature"].temperature_,
                                            rel=1e-9)
    # an overconfident model: temperature scaling softens it and lowers the test ECE
    assert ts.temperature_ > 1.5
    assert table.loc["temperature", "ece"] < 0.5 * table.loc["uncalibrated", "ece"]
    text = rep.summary()
    assert "overconfident" in text and "T = " in text and "Temp. scaling" in text


def test_binary_logits_get_platt_scaling_too() -> None:
    (zv, yv), (zt, yt) = _overconfident(300, 2, seed=3), _overconfident(300, 2, seed=4)
    rep = report.make_report(zv, yv, zt, yt)
    assert "platt" in rep.calibrators and "matrix" not in rep.calibrators


def test_save_figures_writes_png_files(files, tmp_path) -> None:
    rep = report.make_report(*report.load_logits(files["val"]),
                             *report.load_logits(files["test"]), methods=["temperature"])
    paths = rep.save_figures(tmp_path / "figs")
    assert sorted(p.name for p in paths) == ["confidence.png", "reliability.png",
                                             "risk_coverage.png"]
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in paths)


def test_cli_prints_the_table_writes_figures_and_the_calibrator(files, capsys) -> None:
    out_dir, saved = files["dir"] / "out", files["dir"] / "ts.json"
    rc = main(["report", str(files["val"]), str(files["test"]), "--out", str(out_dir),
               "--methods", "temperature,isotonic", "--save-calibrator", str(saved)])
    printed = capsys.readouterr().out
    assert rc == 0
    assert "Uncalibrated" in printed and "Isotonic" in printed and "ECE (%)" in printed
    assert (out_dir / "reliability.png").read_bytes()[:8] == PNG_MAGIC
    back = calibrators.load(saved)
    assert isinstance(back, calibrators.TemperatureScaling)
    assert json.loads(saved.read_text())["class"] == "TemperatureScaling"


def test_cli_runs_as_a_module_and_imports_only_the_toolkit(files) -> None:
    code = (
        "import sys, runpy; sys.argv = ['calnotes', 'report', sys.argv[1], sys.argv[2], "
        "'--out', sys.argv[3], '--methods', 'temperature']\n"
        "try:\n    runpy.run_module('calnotes', run_name='__main__')\n"
        "except SystemExit as e:\n    assert e.code == 0, e.code\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[:2] in ("
        "['calnotes', 'data'], ['calnotes', 'training'], ['calnotes', 'experiments'], "
        "['calnotes', 'store'], ['calnotes', 'runs'], ['calnotes', 'models'], "
        "['calnotes', 'meta'], ['calnotes', 'sweeps']) or m == 'torchvision')\n"
        "print('HEAVY', heavy)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, str(files["val"]), str(files["test"]),
         str(files["dir"] / "cli")],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "Temp. scaling" in result.stdout
    assert "HEAVY []" in result.stdout


@pytest.mark.parametrize(("make", "message"), [
    (lambda d: d / "missing.npz", r"missing\.npz: no such file"),
    (lambda d: _write(d / "x.csv", b"1,2"), r"x\.csv: unsupported file type '\.csv'"),
    (lambda d: _npz(d / "nolabels.npz", logits=np.zeros((3, 2), np.float32)),
     r"nolabels\.npz: no array named 'labels'; found \['logits'\]"),
    (lambda d: _npz(d / "flat.npz", logits=np.zeros(3, np.float32), labels=np.zeros(3, int)),
     r"flat\.npz: logits must have shape \(N, C\)"),
    (lambda d: _npz(d / "short.npz", logits=np.zeros((3, 2), np.float32),
                    labels=np.zeros(2, int)), r"short\.npz: labels has length 2"),
    (lambda d: _npz(d / "range.npz", logits=np.zeros((3, 2), np.float32),
                    labels=np.array([0, 1, 2])), r"range\.npz: labels must lie in \[0, 2\)"),
    (lambda d: _npz(d / "nan.npz", logits=np.full((3, 2), np.nan, np.float32),
                    labels=np.zeros(3, int)), r"nan\.npz: logits contains NaN"),
    (lambda d: _write(d / "broken.npz", b"not a zip file"), r"broken\.npz: not a readable"),
    (lambda d: _pt(d / "tensor.pt", torch.zeros(3, 2)), r"tensor\.pt: expected a dict"),
    (lambda d: _pt(d / "evil.pt", {"logits": Path("x"), "labels": torch.zeros(3)}),
     r"evil\.pt: not a readable tensor file for torch.load\(weights_only=True\)"),
])
def test_bad_files_raise_errors_that_name_the_path(tmp_path, make, message) -> None:
    path = make(tmp_path)
    with pytest.raises((ValueError, TypeError), match=message):
        report.load_logits(path)


def test_float_labels_are_a_type_error_naming_the_path(tmp_path) -> None:
    path = _npz(tmp_path / "f.npz", logits=np.zeros((3, 2), np.float32), labels=np.zeros(3))
    with pytest.raises(TypeError, match=r"f\.npz: labels must have an integer dtype"):
        report.load_logits(path)


def test_cli_reports_bad_input_on_stderr_with_exit_code_2(files, tmp_path, capsys) -> None:
    other = _npz(tmp_path / "three.npz", logits=np.zeros((5, 3), np.float32),
                 labels=np.arange(5) % 3)
    assert main(["report", str(files["val"]), str(other), "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "val.npz has 4 classes but" in err and "three.npz has 3" in err
    assert main(["report", str(tmp_path / "none.npz"), str(other)]) == 2
    assert "none.npz: no such file" in capsys.readouterr().err
    assert main(["report", str(files["val"]), str(files["test"]), "--methods", "magic"]) == 2
    err = capsys.readouterr().err
    assert "methods must hold names from" in err and "got 'magic'" in err


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _npz(path: Path, **arrays: np.ndarray) -> Path:
    np.savez(path, **arrays)
    return path


def _pt(path: Path, obj: object) -> Path:
    torch.save(obj, path)
    return path


def test_a_single_method_name_must_come_in_a_list(files) -> None:
    val, test = report.load_logits(files["val"]), report.load_logits(files["test"])
    with pytest.raises(ValueError, match="non-empty sequence of names"):
        report.make_report(*val, *test, methods="temperature")


def test_cli_reports_an_unwritable_output_folder(files, tmp_path, capsys) -> None:
    blocker = _write(tmp_path / "a_file", b"")
    assert main(["report", str(files["val"]), str(files["test"]),
                 "--out", str(blocker / "figures")]) == 2
    assert "a_file" in capsys.readouterr().err


# ------------------------------------------------------------ intervals, choice, probabilities


def test_every_printed_metric_has_a_test_bootstrap_interval(files) -> None:
    from calnotes import metrics

    val, test = report.load_logits(files["val"]), report.load_logits(files["test"])
    rep = report.make_report(*val, *test, methods=["temperature"], n_boot=50)
    assert list(rep.intervals.columns) == list(report.REPORT_COLUMNS)
    p = rep.comparison.probs["temperature"]
    # the same resamples as metrics.bootstrap with the report's seed
    assert rep.intervals.loc["temperature", "nll"] == metrics.bootstrap(
        "nll", p, test[1], n_boot=50, seed=0)
    assert rep.intervals.loc["temperature", "ece"].estimate == pytest.approx(
        rep.comparison.table.loc["temperature", "ece"], rel=1e-12)
    assert rep.intervals.loc["uncalibrated", "aurc"].estimate == metrics.aurc(
        rep.comparison.probs["uncalibrated"], test[1])
    for iv in rep.intervals.to_numpy().ravel():
        assert iv.low <= iv.estimate <= iv.high or iv.low == iv.high
    text = rep.summary()
    assert "AURC (%)" in text and "risk@90% (%)" in text and "[95% interval]" in text
    assert "lowest test ECE" not in text


def test_the_recommendation_is_cross_validated_on_validation_only(files) -> None:
    val, test = report.load_logits(files["val"]), report.load_logits(files["test"])
    rep = report.make_report(*val, *test, methods=["temperature", "vector"], n_boot=100)
    # the test labels play no part: scrambling them leaves the recommendation and its table
    scrambled = np.asarray(test[1].numpy())[::-1].copy()
    rep2 = report.make_report(*val, test[0], scrambled, methods=["temperature", "vector"],
                              n_boot=100)
    assert rep.recommended == rep2.recommended
    pd_testing = pytest.importorskip("pandas.testing")
    pd_testing.assert_frame_equal(rep.validation, rep2.validation)
    # an overconfident model (logits 3x a calibrated one): temperature scaling wins clearly
    assert rep.recommended in ("temperature", "vector")
    row = rep.validation.loc[rep.recommended]
    assert row["diff_high"] < 0
    assert "chosen on the validation split alone" in rep.summary()


def test_no_recommendation_when_nothing_beats_the_uncalibrated_model() -> None:
    g = torch.Generator().manual_seed(5)
    z = 2.0 * torch.randn(1200, 3, generator=g, dtype=torch.float64)
    y = torch.multinomial(torch.softmax(z, dim=1), 1, generator=g)[:, 0]  # calibrated
    table, best = report.cross_validate(z[:600], y[:600], ["matrix"], n_boot=100)
    assert best is None and table.loc["matrix", "diff_high"] >= 0
    rep = report.make_report(z[:600], y[:600], z[600:], y[600:], methods=["matrix"],
                             n_boot=50)
    assert rep.recommended is None and "none. No calibrator beat" in rep.summary()


def test_probabilities_passed_as_logits_are_refused(tmp_path, capsys) -> None:
    z, y = _overconfident(200, 4, seed=7)
    p = torch.softmax(torch.from_numpy(z).double(), dim=1).numpy()
    path = _npz(tmp_path / "probs.npz", logits=p, labels=y)
    with pytest.raises(ValueError, match=r"probs\.npz: logits look like probabilities.*--probs"):
        report.load_logits(path)
    with pytest.raises(ValueError, match="val_logits look like probabilities"):
        report.make_report(p, y, p, y)
    assert main(["report", str(path), str(path), "--out", str(tmp_path / "o")]) == 2
    assert "look like probabilities" in capsys.readouterr().err
    # --probs takes their log: the same probabilities as the logits gave
    logits, _ = report.load_logits(path, probs=True)
    np.testing.assert_allclose(torch.softmax(torch.from_numpy(logits), 1).numpy(), p,
                               rtol=1e-12)
    zero = p.copy()
    zero[0] = [1.0, 0.0, 0.0, 0.0]
    assert np.isfinite(report.logits_from_probs(zero)).all()
    with pytest.raises(ValueError, match="probs"):
        report.logits_from_probs(p * 2)
    with pytest.raises(TypeError, match="probs"):
        report.load_logits(path, probs="yes")


def test_probs_flag_gives_the_diagnosis_of_the_logits(tmp_path) -> None:
    (zv, yv), (zt, yt) = _overconfident(500, 4, seed=8), _overconfident(400, 4, seed=9)
    by_logits = report.make_report(zv, yv, zt, yt, methods=["temperature"], n_boot=20)
    pv = torch.softmax(torch.from_numpy(zv).double(), 1).numpy()
    pt = torch.softmax(torch.from_numpy(zt).double(), 1).numpy()
    by_probs = report.make_report(pv, yv, pt, yt, methods=["temperature"], n_boot=20,
                                  probs=True)
    # float32 logits against float64 probabilities' logs: the same model up to rounding
    assert by_probs.calibrators["temperature"].temperature_ == pytest.approx(
        by_logits.calibrators["temperature"].temperature_, rel=1e-5)
    assert by_probs.gap.estimate == pytest.approx(by_logits.gap.estimate, abs=1e-6)
    assert by_logits.gap.low > 0 and "overconfident" in by_probs.summary()


def test_cli_json_output(files, capsys) -> None:
    rc = main(["report", str(files["val"]), str(files["test"]), "--out",
               str(files["dir"] / "j"), "--methods", "temperature", "--json", "--boot", "20"])
    assert rc == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data["test"]) == {"uncalibrated", "temperature"}
    assert set(data["test"]["temperature"]) == set(report.REPORT_COLUMNS)
    ece = data["test"]["temperature"]["ece"]
    assert ece["low"] <= ece["estimate"] <= ece["high"]
    assert data["recommended"] in (None, "temperature")
    assert data["validation"]["n_folds"] == 5 and data["temperature"] > 1
    assert any(f.endswith("risk_coverage.png") for f in data["files"])


@pytest.mark.parametrize("kind", ["bfloat16", "float16", "round3", "round2", "round1"])
def test_probabilities_at_any_precision_are_refused_as_logits(tmp_path, capsys, kind) -> None:
    """bfloat16 or rounded probabilities miss a row sum of 1 by more than 1e-3; they are
    still probabilities, within their own precision."""
    (zv, yv), (zt, yt) = _overconfident(500, 10, seed=3), _overconfident(400, 10, seed=4)
    pv, pt = (torch.softmax(torch.from_numpy(z).double(), 1) for z in (zv, zt))
    if kind in ("bfloat16", "float16"):
        cast = getattr(torch, kind)
        val, test = pv.to(cast), pt.to(cast)
        torch.save({"logits": val, "labels": torch.from_numpy(yv)}, tmp_path / "val.pt")
        torch.save({"logits": test, "labels": torch.from_numpy(yt)}, tmp_path / "test.pt")
    else:
        digits = int(kind[-1])
        val, test = pv.numpy().round(digits), pt.numpy().round(digits).astype(np.float32)
        torch.save({"logits": torch.from_numpy(val), "labels": torch.from_numpy(yv)},
                   tmp_path / "val.pt")
        torch.save({"logits": torch.from_numpy(test), "labels": torch.from_numpy(yt)},
                   tmp_path / "test.pt")
    worst = float((torch.as_tensor(val).double().sum(1) - 1).abs().max())
    assert worst > 1e-3 or kind == "float16"  # beyond the old fixed tolerance
    with pytest.raises(ValueError, match=r"val\.pt: logits look like probabilities"):
        report.load_logits(tmp_path / "val.pt")
    with pytest.raises(ValueError, match="test_logits look like probabilities"):
        report.make_report(zv, yv, test, yt)
    args = ["report", str(tmp_path / "val.pt"), str(tmp_path / "test.pt"),
            "--out", str(tmp_path / "o"), "--methods", "temperature", "--boot", "20"]
    assert main(args) == 2
    assert "VAL file" in capsys.readouterr().err
    # with --probs they are read, renormalised, and give the model's overconfidence
    logits, _ = report.load_logits(tmp_path / "val.pt", probs=True)
    assert torch.allclose(torch.softmax(torch.as_tensor(logits).double(), 1).sum(1),
                          torch.ones(500, dtype=torch.float64))
    assert main([*args, "--probs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["confidence_minus_accuracy"]["low"] > 0


def test_simplex_tolerance_follows_dtype_and_rounding() -> None:
    p = torch.tensor([[0.25, 0.25, 0.5], [0.125, 0.375, 0.5]], dtype=torch.float64)
    assert report.simplex_tolerance(p) == pytest.approx(1e-3 + 3 * 0.0005)  # 3 decimals
    q = torch.tensor([[0.1234567, 0.8765433]], dtype=torch.float64)
    assert report.simplex_tolerance(q) == pytest.approx(1e-3)  # not rounded
    assert report.simplex_tolerance(q.bfloat16()) >= 2.0 ** -7
    # real logits in [0, 1] that do not sum to 1 stay logits
    report.check_not_probs(np.array([[0.2, 0.3, 0.1], [0.5, 0.1, 0.1]]))


def test_an_empty_npz_names_the_file_and_the_split(tmp_path, capsys, files) -> None:
    empty = tmp_path / "empty.npz"
    empty.write_bytes(b"")
    with pytest.raises(ValueError, match=r"empty\.npz: not a readable \.npz file"):
        report.load_logits(empty)
    assert main(["report", str(files["val"]), str(empty), "--out", str(tmp_path / "o")]) == 2
    assert f"TEST file {empty}: not a readable .npz file" in capsys.readouterr().err


def test_one_class_validation_labels_name_the_val_file(tmp_path, capsys, files) -> None:
    z, _ = _overconfident(100, 4, seed=5)
    one = _npz(tmp_path / "one.npz", logits=z, labels=np.zeros(100, dtype=np.int64))
    with pytest.raises(ValueError, match=r"VAL file .*one\.npz: labels hold only class 0"):
        report.load_pair(one, files["test"])
    assert main(["report", str(one), str(files["test"]), "--out", str(tmp_path / "o")]) == 2
    assert "VAL file" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"TEST file .*missing\.npz: no such file"):
        report.load_pair(files["val"], tmp_path / "missing.npz")


def _documented_names() -> set[str]:
    """Dotted names the API pages document (``.. auto*:: NAME``; an ``automodule`` with
    ``:members:`` documents its ``__all__`` too)."""
    import importlib
    import re
    names: set[str] = set()
    api = Path(__file__).resolve().parent.parent / "book" / "api"
    for page in api.glob("*.md"):
        lines = page.read_text(encoding="utf-8").splitlines()
        for i, line in enumerate(lines):
            m = re.match(r"\.\. auto(\w+):: (calnotes[\w.]*)", line.strip())
            if not m:
                continue
            names.add(m.group(2))
            if m.group(1) == "module" and any(":members:" in nxt for nxt in lines[i + 1:i + 3]):
                module = importlib.import_module(m.group(2))
                names.update(f"{m.group(2)}.{n}" for n in getattr(module, "__all__", []))
    return names


def test_report_docstrings_reference_documented_objects():
    # the book builds nitpicky (-n -W): a :func: to an undocumented object fails it
    import re
    documented = _documented_names()
    refs = set()
    for name in report.__all__:
        doc = getattr(report, name).__doc__ or ""
        refs.update(re.findall(r":(?:func|class|data|meth):`~?(calnotes\.[\w.]+)`", doc))
    assert refs, "the report's docstrings cross-reference the library"
    missing = sorted(r for r in refs if r not in documented)
    assert not missing, f"referenced but on no API page: {missing}"
