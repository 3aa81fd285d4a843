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
    assert [p.stem for p in notebooks] == [p.stem for p in chapters.chapter_paths()]
    nb = json.loads(notebooks[0].read_text())
    injected = [c for c in nb["cells"] if "injected-parameters" in c["metadata"].get("tags", [])]
    assert injected and "SMOKE = True" in "".join(injected[0]["source"])
