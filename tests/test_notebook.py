"""Helpers shared by the chapters."""

import numpy as np
import torch

from calnotes.book import notebook
from calnotes.runs.experiment import default_config
from calnotes.runs.store import RunStore


def test_glue_turns_scalars_into_plain_numbers(monkeypatch):
    seen = {}

    def fake_glue(name, value, display=True):
        seen[name] = (value, display)

    import myst_nb

    monkeypatch.setattr(myst_nb, "glue", fake_glue)
    notebook.glue("a", np.float64(1.5))
    notebook.glue("b", torch.tensor(2.5))
    notebook.glue("c", np.int64(3))
    notebook.glue("d", "text")
    assert seen == {"a": (1.5, False), "b": (2.5, False), "c": (3, False), "d": ("text", False)}
    assert type(seen["a"][0]) is float and type(seen["c"][0]) is int


def test_smoke_runs_never_touch_the_stored_results(tmp_path, monkeypatch):
    monkeypatch.setenv("CALNOTES_RESULTS", str(tmp_path / "results"))
    config = default_config(dataset="digits", model="lenet5", epochs=1, batch_size=64,
                            val_size=None)
    run = notebook.chapter_run(config, label="nb_test", use_store=True, smoke=True,
                               device="cpu")
    assert run.test_logits.shape[1] == 10 and run.label == "nb_test"
    assert not RunStore().exists(config)
    assert "results" in str(run.path) and str(tmp_path) not in str(run.path)


def test_setup_chapter_picks_device_and_seeds():
    device = notebook.setup_chapter(seed=3, device="cpu", style=False)
    a = torch.rand(3)
    notebook.setup_chapter(seed=3, device="cpu", style=False)
    assert device.type == "cpu" and torch.equal(a, torch.rand(3))
