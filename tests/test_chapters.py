"""The chapter runner: parameter cells, parameter checking, SMOKE preparation."""

import json

import pytest

from calnotes.book import chapters


def test_every_chapter_has_literal_parameters_with_the_tiers():
    paths = chapters.chapter_paths()
    assert paths, "no chapters found in book/"
    for path in paths:
        params = chapters.parameters_of(chapters.read_chapter(path))
        for name in ("SMOKE", "SEED", "DEVICE", "USE_STORE"):
            assert name in params, f"{path.name} lacks parameter {name}"
        assert params["SMOKE"] is False, f"{path.name} must default to the full tier"


def test_every_chapter_is_in_the_toc():
    toc = (chapters.REPO_ROOT / "_toc.yml").read_text()
    for path in chapters.chapter_paths():
        assert f"book/{path.stem}" in toc


def test_resolve_chapter_by_number_stem_and_slug():
    path = chapters.chapter_paths()[0]
    for name in (path.stem, path.name, path.stem[:2], path.stem[3:]):
        assert chapters.resolve_chapter(name) == path
    with pytest.raises(ValueError, match="unknown chapter 'nope'"):
        chapters.resolve_chapter("nope")
    with pytest.raises(TypeError, match="chapter"):
        chapters.resolve_chapter(3)


def test_appendices_with_a_smoke_parameter_are_pages():
    appendix = chapters.resolve_chapter("pitfalls")
    assert appendix.name == "appendix_pitfalls.md"
    assert chapters.resolve_chapter("appendix_pitfalls") == appendix
    assert appendix in chapters.appendix_paths()
    assert chapters.page_paths()[:len(chapters.chapter_paths())] == chapters.chapter_paths()
    assert all(p.stem.startswith("appendix_") for p in chapters.appendix_paths())


@pytest.mark.parametrize(
    ("text", "value"),
    [("5", 5), ("0.5", 0.5), ("True", True), ("cuda", "cuda"), ("'cpu'", "cpu"),
     ("resnet20", "resnet20")],
)
def test_parse_value(text, value):
    parsed = chapters.parse_value(text)
    assert parsed == value and type(parsed) is type(value)


def test_check_parameters_reports_unknown_and_mistyped():
    defaults = {"SMOKE": False, "EPOCHS": 30, "LR": 0.1, "DEVICE": "auto", "SUBSET": None}
    checked = chapters.check_parameters(defaults, {"EPOCHS": 5, "LR": 1, "SUBSET": 10})
    assert checked == {"EPOCHS": 5, "LR": 1.0, "SUBSET": 10}
    # an int for a float parameter becomes a float (`-p LR 1`), so configs built from it
    # hash like the default spelling; ints stay ints
    assert type(checked["LR"]) is float and type(checked["EPOCHS"]) is int
    with pytest.raises(ValueError, match="unknown parameter.*EPOCH.*takes: SMOKE=False"):
        chapters.check_parameters(defaults, {"EPOCH": 5})
    with pytest.raises(ValueError, match="EPOCHS expects int"):
        chapters.check_parameters(defaults, {"EPOCHS": "five"})
    with pytest.raises(ValueError, match="EPOCHS expects int"):
        chapters.check_parameters(defaults, {"EPOCHS": True})
    with pytest.raises(ValueError, match="SMOKE expects bool"):
        chapters.check_parameters(defaults, {"SMOKE": 1})


def test_parameters_cell_must_hold_literals():
    nb = chapters.read_chapter(chapters.chapter_paths()[0])
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source = "EPOCHS = compute()"
    with pytest.raises(ValueError):
        chapters.parameters_of(nb)
    cell.source = "import os"
    with pytest.raises(ValueError, match="only `NAME = literal`"):
        chapters.parameters_of(nb)


def test_cli_rejects_unknown_parameter_before_running(capsys):
    code = chapters.main(["run", "01", "-p", "NOT_A_PARAMETER", "1"])
    assert code == 2
    assert "unknown parameter(s) NOT_A_PARAMETER" in capsys.readouterr().err


def test_smoke_preparation_injects_parameters(tmp_path):
    assert chapters.main(["smoke", str(tmp_path)]) == 0
    notebooks = sorted(tmp_path.glob("*.ipynb"))
    assert [p.stem for p in notebooks] == sorted(p.stem for p in chapters.page_paths())
    assert "appendix_pitfalls" in [p.stem for p in notebooks]  # appendices run in SMOKE too
    nb = json.loads(notebooks[0].read_text())
    injected = [c for c in nb["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
    assert injected and "SMOKE = True" in "".join(injected[0]["source"])


# ------------------------------------------------------------------ parameter domains


def test_every_parameter_has_a_domain_holding_its_default():
    for path in chapters.chapter_paths():
        notebook = chapters.read_chapter(path)
        domains = chapters.parameter_domains(notebook)  # raises on a default outside it
        assert set(domains) == set(chapters.parameters_of(notebook)), path.name


def _notebook_with_parameters(source: str):
    nb = chapters.read_chapter(chapters.chapter_paths()[0])
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source = source
    return nb


def test_parameter_without_domain_or_outside_it_is_an_error():
    nb = _notebook_with_parameters("SEED = 0  # nonnegative int\nEPOCHS = 3\n")
    with pytest.raises(ValueError, match="EPOCHS has no domain"):
        chapters.parameter_domains(nb)
    nb = _notebook_with_parameters("SEED = 0  # integer\n")
    with pytest.raises(ValueError, match="SEED: unknown domain 'integer'"):
        chapters.parameter_domains(nb)
    nb = _notebook_with_parameters("N_BINS = 0  # positive int\n")
    with pytest.raises(ValueError, match="default of N_BINS is outside its domain"):
        chapters.parameter_domains(nb)
    nb = _notebook_with_parameters('XS = [1,\n      2]  # list of positive int; a note\n')
    assert chapters.parameter_domains(nb)["XS"].text == "list of positive int"


@pytest.mark.parametrize(
    ("domain", "good", "bad"),
    [
        ("bool", [True, False], [0, "yes"]),
        ("positive int", [1, 500], [0, -1, 2.0, True]),
        ("nonnegative int", [0, 7], [-1, 0.0]),
        ("positive float", [0.1, 3, 1e-9], [0, -0.5, float("inf"), True]),
        ("nonnegative float", [0, 0.0, 2.5], [-1e-9, float("nan")]),
        ("float > 0.5", [0.6], [0.5]),
        ("int < 3", [2, -4], [3]),
        ("int in [0, 9]", [0, 9], [10, -1]),
        ("float in (0, inf)", [1e300], [0, float("inf")]),
        ("float in [0, 1)", [0, 0.5], [1, 1.5, -0.1]),
        ("float in (0, 1]", [1, 0.5], [0]),
        ("one of cosine, step", ["step"], ["linear", 1]),
        ("dict", [{}, {"width": 8}], [[], "x"]),
        ("dataset", ["mnist", "fashion_mnist", "cifar10"], ["cifar11", "MNIST"]),
        ("model", ["lenet5", "resnet20", "wrn-16-4"], ["resnet10", "vgg16", 5]),
        ("device", ["auto", "cpu"], ["tpu", "", 0]),
        ("ood set", ["mnist", "gaussian", "animals", "letters", "folder:/tmp/x"], ["noise"]),
        ("schedule", ["cosine", "step", "none"], ["linear"]),
        ("resnet depth", [8, 14, 110], [10, 2, 8.0]),
        ("list of positive int", [[1], [10, 15]], [[], [0], 5, [1.5]]),
        ("list of dataset", [["mnist"]], [["mnist", "cifar11"]]),
    ],
)
def test_domains(domain, good, bad):
    parsed = chapters.Domain.parse(domain)
    for value in good:
        assert parsed.error(value) is None, (domain, value)
    for value in bad:
        message = parsed.error(value)
        assert message is not None and message.startswith("expected "), (domain, value)
        assert message.endswith(f"got {value!r}")


def test_domain_errors_list_the_allowed_values():
    assert "mnist, fashion_mnist" in chapters.Domain.parse("dataset").error("cifar11")
    assert "cosine, step, none" in chapters.Domain.parse("schedule").error("x")
    for text in ("int => 1", "int >= 1", "positive", "integer"):
        with pytest.raises(ValueError, match="unknown domain"):
            chapters.Domain.parse(text)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DEVICE", "tpu", "parameter DEVICE: expected a device"),
        ("SEED", "-1", "parameter SEED: expected a nonnegative int, got -1"),
        ("DATASET", "cifar11", "parameter DATASET: expected one of mnist"),
        ("N_BINS", "0", "parameter N_BINS: expected a positive int, got 0"),
        ("MODEL", "resnet10", "parameter MODEL: expected a model name"),
    ],
)
def test_cli_rejects_values_outside_the_domain_before_running(
    name, value, message, capsys, monkeypatch, tmp_path
):
    import papermill

    def must_not_run(*args, **kwargs):
        raise AssertionError("the chapter was executed")

    monkeypatch.setattr(papermill, "execute_notebook", must_not_run)
    assert chapters.main(["run", "01", "-p", name, value, "--out", str(tmp_path)]) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-p", "EPOCS", "5"], "unknown parameter(s) EPOCS: no chapter takes them"),
        (["-p", "N_BINS", "0"], "parameter N_BINS: expected a positive int, got 0"),
        (["-p", "DEVICE", "tpu"], "parameter DEVICE"),
        (["-p", "EPOCHS", "2", "-p", "DEPTHS", "[8, 10]"], "parameter DEPTHS"),
    ],
)
def test_results_checks_every_parameter_before_the_first_chapter(
    args, message, capsys, monkeypatch
):
    ran = []
    monkeypatch.setattr(chapters, "run_chapter", lambda *a, **k: ran.append(a))
    assert chapters.main(["results", *args]) == 2
    assert message in capsys.readouterr().err
    assert ran == []


def test_results_passes_each_parameter_to_the_chapters_that_take_it(monkeypatch, capsys):
    ran = {}
    monkeypatch.setattr(chapters, "run_chapter",
                        lambda name, params, out: ran.update({name: params}))

    class NoStore:
        def summary(self):
            import pandas as pd

            return pd.DataFrame()

    import calnotes.runs.store

    monkeypatch.setattr(calnotes.runs.store, "RunStore", NoStore)
    assert chapters.main(["results", "-p", "DEPTHS", "[8, 14]", "-p", "SEED", "1"]) == 0
    assert ran["02_diagnosing_miscalibration"] == {"DEPTHS": [8, 14], "SEED": 1}
    assert ran["01_measuring_calibration"] == {"SEED": 1}
    ran.clear()
    assert chapters.main(["results", "--chapter", "02", "-p", "EPOCHS", "2"]) == 0
    assert ran == {"02_diagnosing_miscalibration": {"EPOCHS": 2}}
    assert chapters.main(["results", "--chapter", "01", "-p", "DEPTHS", "[8]"]) == 2
    assert "no chapter takes them" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["", "  "])
def test_run_with_an_empty_chapter_is_a_usage_error(name, capsys):
    assert chapters.main(["run", name]) == 2
    assert "chapter must be named; chapters are: 01_" in capsys.readouterr().err


def _included_code(chapter_path):
    """Per ``literalinclude`` of a chapter: its options and the code Sphinx would show."""
    import re

    code = pytest.importorskip("sphinx.directives.code")
    from sphinx.config import Config

    config = Config({}, {})
    config.source_encoding = "utf-8"
    blocks = re.findall(r"```\{literalinclude\} (\S+)\n((?::\S+: .*\n)*)```",
                        chapter_path.read_text())
    out = []
    for target, option_text in blocks:
        options = dict(re.findall(r"^:(\S+): (.*)$", option_text, flags=re.MULTILINE))
        path = (chapter_path.parent / target).resolve()
        text, _ = code.LiteralIncludeReader(str(path), options, config).read()
        out.append((options, text))
    return out


def test_every_literalinclude_shows_code():
    found = 0
    for path in chapters.chapter_paths():
        for options, text in _included_code(path):
            found += 1
            assert text.strip(), f"{path.name}: {options} shows nothing"
    assert found >= 5


def test_gamma_net_include_shows_the_signature_and_the_math_not_the_checks():
    path = next(p for p in chapters.chapter_paths() if p.stem.startswith("05"))
    (text,) = [t for o, t in _included_code(path) if o.get("pyobject") == "GammaNet.forward"]
    lines = text.strip().splitlines()
    assert lines[0].strip().startswith("def forward(self, features")
    assert "softmax" in text and lines[-1].strip().startswith("return ")
    assert "raise" not in text and "isinstance" not in text
