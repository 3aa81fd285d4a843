"""A reader's rerun: every chapter completes at other parameters.

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
    "06": {"SEEDS": [0, 1], "ENSEMBLE_SIZE": 2},
    "07": {"ALPHAS": [0.2], "SEEDS": [1]},
}


def test_every_chapter_has_a_rerun():
    assert sorted(RERUNS) == [p.stem[:2] for p in chapters.chapter_paths()]


@pytest.mark.chapters
@pytest.mark.parametrize("chapter", sorted(RERUNS))
def test_a_rerun_at_other_parameters_completes(chapter, tmp_path):
    # The claims' verdicts come from the stored runs and hold at any parameters; what a
    # rerun must do is complete, without an error in any cell, at the reader's parameters.
    params = {"SMOKE": True, **RERUNS[chapter]}
    out = chapters.run_chapter(chapter, params, tmp_path, progress=False)
    cells = json.loads(out.read_text())["cells"]
    errors = [o for c in cells for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors
    injected = "".join("".join(c["source"]) for c in cells
                       if "injected-parameters" in c.get("metadata", {}).get("tags", []))
    for name in RERUNS[chapter]:
        assert name in injected
