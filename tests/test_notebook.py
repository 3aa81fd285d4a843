"""Helpers shared by the chapters."""

import numpy as np
import pytest
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


@pytest.fixture
def threads_restored():
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_setup_chapter_picks_device_and_seeds(threads_restored):
    device = notebook.setup_chapter(seed=3, device="cpu", style=False)
    a = torch.rand(3)
    notebook.setup_chapter(seed=3, device="cpu", style=False)
    assert device.type == "cpu" and torch.equal(a, torch.rand(3))


@pytest.mark.parametrize(("others_busy", "expected"), [(0.0, 2), (1.0, 1)])
def test_setup_chapter_takes_one_thread_when_other_processes_keep_the_cores_busy(
        monkeypatch, threads_restored, others_busy, expected):
    from calnotes import _threads

    torch.set_num_threads(2)
    monkeypatch.setattr(_threads, "TORCH_DEFAULT_THREADS", 2)
    monkeypatch.setattr(_threads, "usable_cpus", lambda: 2)
    monkeypatch.setattr(_threads, "busy_share_of_others", lambda window=0.1: others_busy)
    monkeypatch.setattr(_threads, "_last_answer", None)
    notebook.setup_chapter(seed=0, device="cpu", style=False)
    assert torch.get_num_threads() == expected


# ------------------------------------------------------------------ the prose's claims


def _book_namespace(chapter="01"):
    from calnotes.book import chapters

    return dict(chapters.parameters_of(chapters.read_chapter(chapters.resolve_chapter(chapter))))


def test_changed_parameters_are_empty_exactly_at_the_book_parameters():
    namespace = _book_namespace()
    assert notebook.changed_parameters("01", namespace) == {}
    namespace.update(EPOCHS=2, DATASET="mnist")
    assert notebook.changed_parameters("01", namespace) == {"EPOCHS": 2, "DATASET": "mnist"}
    assert notebook.changed_parameters("01", {**_book_namespace(), "SMOKE": True}) == {
        "SMOKE": True}
    del namespace["N_BINS"]
    with pytest.raises(ValueError, match="N_BINS"):
        notebook.changed_parameters("01", namespace)


def test_claims_raise_at_the_book_parameters_naming_every_failure(capsys):
    claims = notebook.Claims("01", _book_namespace())
    claims.add("holds", True)
    claims.add("fails one", np.bool_(False))
    claims.add("fails two", 1 > 2)
    with pytest.raises(AssertionError, match="do not hold at the book's parameters: "
                                             "fails one; fails two"):
        claims.report()
    passing = notebook.Claims("01", _book_namespace())
    passing.add("holds", True)
    passing.report()
    assert capsys.readouterr().out == ""


def test_claims_elsewhere_report_which_hold_and_complete(capsys):
    claims = notebook.Claims("01", {**_book_namespace(), "EPOCHS": 2, "DATASET": "mnist"})
    assert not claims.at_book_parameters
    claims.add("NLL is said to bottom out before the end", False)
    claims.add("the model is overconfident", True)
    claims.report()  # no exception
    out = capsys.readouterr().out
    assert "At these (DATASET='mnist', EPOCHS=2), 1 of its 2 claims do not hold" in out
    assert "FAILS  NLL is said to bottom out before the end" in out
    assert "holds  the model is overconfident" in out


def test_claims_add_returns_what_it_recorded():
    claims = notebook.Claims("01", _book_namespace())
    assert claims.add("numpy true", np.float64(2.0) > 1) is True
    assert claims.add("numpy false", np.bool_(False)) is False
    assert claims.add("empty list", []) is False
    assert claims.results == {"numpy true": True, "numpy false": False, "empty list": False}


def test_claims_reject_duplicates_and_unreadable_values():
    claims = notebook.Claims("01", _book_namespace())
    claims.add("a", True)
    with pytest.raises(ValueError, match="twice"):
        claims.add("a", True)
    with pytest.raises(TypeError, match="description"):
        claims.add("", True)
    with pytest.raises(ValueError):  # the truth of a whole array is ambiguous
        claims.add("b", np.array([True, False]))


def test_argmax_ties_counts_rows_whose_top_two_agree_to_rounding():
    p = torch.tensor([[0.5, 0.5, 0.0], [0.6, 0.3, 0.1], [0.4, 0.2, 0.4 * (1 + 1e-8)],
                      [0.3, 0.3, 0.4]], dtype=torch.float64)
    assert notebook.argmax_ties(p) == 2
    assert notebook.argmax_ties(p, rtol=0.0) == 1


def test_every_chapter_shows_its_claims_file_through_the_evaluator():
    from calnotes.book import chapters
    from calnotes.book.claims import claims_path

    for path in chapters.chapter_paths():
        text = path.read_text()
        number = path.stem[:2]
        assert claims_path(number).is_file(), path.name
        assert f'show_claims("{number}")' in text, path.name
        assert "verdict_of(" in text, path.name  # the prose's verdicts are the evaluator's
        assert "glue_claims" not in text and "seed_verdict" not in text, path.name
        assert "book_scale" not in text and "BOOK_SCALE" not in text, path.name


def test_two_accuracy_paths_agree_within_the_argmax_ties_bound():
    # Chapter 2's check: accuracy from a float64 log-softmax against the library's, from a
    # float32 softmax. float16 logits tie exactly on some rows; there either path may pick
    # either class, and a float32 mean of 0/1 values is rounded (so `< 1e-9` cannot hold).
    from calnotes import metrics

    g = torch.Generator().manual_seed(0)
    logits = (3 * torch.randn(5000, 10, generator=g)).half()
    top = logits.argmax(dim=1)
    logits[:400, 7] = logits[torch.arange(400), top[:400]]  # 400 exact ties for the top
    labels = torch.randint(0, 10, (5000,), generator=g)
    predicted = torch.log_softmax(logits.double(), dim=1).argmax(dim=1)
    accuracy64 = float((predicted == labels).double().mean())
    probs32 = torch.softmax(logits.float(), dim=1)
    accuracy32 = float(metrics.confidences_and_correct(probs32, labels)[1].mean())
    ties = notebook.argmax_ties(probs32)
    assert ties >= 400 - (top[:400] == 7).sum()
    assert abs(accuracy64 - accuracy32) <= ties / len(labels) + 1e-6
