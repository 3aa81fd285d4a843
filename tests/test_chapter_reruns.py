"""A reader's rerun: every chapter completes at other parameters and reports its claims.

Each rerun executes a whole chapter at SMOKE size with changed parameters (a minute or
more each), so the tests are marked ``chapters``: ``make test-unit`` leaves them out and
``make test-reruns`` runs them (``make test-chapters`` runs each chapter at its own SMOKE
parameters).
"""

import json

import pytest

from calnotes.book import chapters

#: Per chapter, parameters other than the book's (and cheap at SMOKE size).
RERUNS = {
    "01": {"DATASET": "mnist", "EPOCHS": 2},
    "02": {"MODEL": "resnet8", "DEPTHS": [8, 14], "WIDTHS": [8, 16],
           "WEIGHT_DECAYS": [0.0, 0.02]},
    "03": {"POSITIVE_CLASS": 3, "DEEP_MODEL": "resnet8"},
    "04": {"OOD_SETS": ["mnist", "letters"], "NOISE_SETS": ["uniform"], "TAUS": [0.1, 1.0],
           "REVERSE": False},
    "05": {"BIN_COUNTS": [10, 100], "MIN_VAL_ECE": 0.0},
}


def test_every_chapter_has_a_rerun():
    assert sorted(RERUNS) == [p.stem[:2] for p in chapters.chapter_paths()]


def _printed(notebook_path):
    cells = json.loads(notebook_path.read_text())["cells"]
    return "".join("".join(out.get("text", "")) for cell in cells
                   for out in cell.get("outputs", []) if out.get("output_type") == "stream")


@pytest.mark.chapters
@pytest.mark.parametrize("chapter", sorted(RERUNS))
def test_a_rerun_at_other_parameters_completes_and_reports_the_claims(chapter, tmp_path):
    params = {"SMOKE": True, **RERUNS[chapter]}
    out = chapters.run_chapter(chapter, params, tmp_path, progress=False)
    printed = _printed(out)
    assert "The prose was written for the book's parameters." in printed
    for name, value in RERUNS[chapter].items():
        assert f"{name}={value!r}" in printed
