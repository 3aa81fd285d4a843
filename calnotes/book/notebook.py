"""Small helpers the chapters share: set-up, where runs are stored, glued numbers, and the
checks of the prose's claims."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from calnotes._io import scratch_dir
from calnotes._threads import auto_threads
from calnotes.book.claims import claims_table, show_claims, verdict_of
from calnotes.runs.executor import chapter_runs
from calnotes.runs.store import StoredRun
from calnotes.training import seed_everything, select_device

__all__ = [
    "Claims", "argmax_ties", "changed_parameters", "chapter_run", "claims_table", "glue",
    "scratch_dir", "setup_chapter", "show_claims", "verdict_of",
]


def setup_chapter(seed: int = 0, device: str = "auto", style: bool = True) -> torch.device:
    """Seed every generator, pick the device, set the book's plot style and the number of
    torch's intra-op threads.

    The style is set here, by the chapter, never when ``calnotes`` is imported. The threads
    follow :func:`calnotes._threads.auto_threads`: one on a machine whose cores other
    processes keep busy, where each parallel operator would wait for a descheduled thread
    (a chapter's many small operations ran up to 15x slower), else as torch chose.
    """
    seed_everything(seed)
    torch.set_num_threads(auto_threads())
    if style:
        import matplotlib.pyplot as plt
        import seaborn as sns

        sns.set_theme(style="whitegrid", context="notebook", font_scale=0.9)
        plt.rcParams["figure.dpi"] = 110
    return select_device(device)


def chapter_run(config: Mapping[str, Any], *, label: str | None = None, use_store: bool,
                smoke: bool, device: str | torch.device = "auto") -> StoredRun:
    """One run of a chapter, through the executor like every list of runs
    (:func:`calnotes.runs.executor.chapter_runs`): loaded from ``results/``, or trained and
    stored first, in this process, or on the cluster that ``$RAY_ADDRESS`` names. SMOKE runs
    and ``use_store=False`` train into a fresh temporary store."""
    return chapter_runs([config], label=label, use_store=use_store, smoke=smoke,
                        device=device)[0]


def glue(name: str, value: Any) -> None:
    """``myst_nb.glue`` for numbers in prose: numpy and 0-d torch scalars become plain
    Python numbers first, so ``{glue:text}`name:.2f``` can format them."""
    from myst_nb import glue as myst_glue

    if isinstance(value, torch.Tensor):
        value = value.item()
    elif hasattr(value, "item") and getattr(value, "ndim", None) == 0:
        value = value.item()
    myst_glue(name, value, display=False)


def argmax_ties(scores: torch.Tensor, rtol: float = 1e-6) -> int:
    """Rows of ``scores (N, C)`` whose two largest entries agree within ``rtol`` (relative).

    Two computations of the predictions from the same logits (float32 and float64
    softmax, or two CPU kernel families) can pick different argmaxes only on such rows,
    since each errs by a few units of float32 rounding (about 1e-7) at most. Accuracies
    computed along two paths may therefore differ by up to ``argmax_ties / N``.
    """
    top2 = scores.detach().double().topk(2, dim=1).values
    return int((top2[:, 0] - top2[:, 1] <= rtol * top2[:, 0].abs()).sum())


def changed_parameters(chapter: str, namespace: Mapping[str, Any]) -> dict[str, Any]:
    """The parameters of ``chapter`` whose value in ``namespace`` (a notebook's
    ``globals()``) differs from the default in its parameters cell: ``{name: value}``.

    Empty exactly at the book's own parameters, those ``make book`` runs.
    """
    from calnotes.book.chapters import parameters_of, read_chapter, resolve_chapter

    defaults = parameters_of(read_chapter(resolve_chapter(chapter)))
    missing = sorted(set(defaults) - set(namespace))
    if missing:
        raise ValueError(f"namespace lacks the parameter(s) {', '.join(missing)} of {chapter}")
    return {k: namespace[k] for k, v in defaults.items() if namespace[k] != v}


class Claims:
    """What a chapter's prose says about its results, checked where the prose says it.

    ``claims = Claims("01", globals())``, one ``claims.add(description, holds)`` per claim
    (it returns the claim's truth), then ``claims.report()``. At the book's own parameters
    (every parameter at the default of the chapter's parameters cell, as ``make book`` runs
    it) a failed claim raises an ``AssertionError`` naming every claim that fails. At any
    other parameters the prose was not written for the numbers, so the chapter completes
    and prints which claims hold there. (Checks that hold at any parameters, such as a
    from-scratch computation agreeing with the library, are plain ``assert`` statements,
    not claims.)
    """

    def __init__(self, chapter: str, namespace: Mapping[str, Any]) -> None:
        self.chapter = chapter
        self.changed = changed_parameters(chapter, namespace)
        self.results: dict[str, bool] = {}

    @property
    def at_book_parameters(self) -> bool:
        return not self.changed

    def add(self, description: str, holds: Any) -> bool:
        """Record one claim and return whether it holds (``bool(holds)``; ``holds`` is
        anything ``bool()`` reads, a numpy bool, ...), so that a verdict built on the same
        comparison reuses it."""
        if not isinstance(description, str) or not description:
            raise TypeError(f"description must be a non-empty str, got {description!r}")
        if description in self.results:
            raise ValueError(f"claim {description!r} was added twice")
        self.results[description] = bool(holds)
        return self.results[description]

    @property
    def failed(self) -> list[str]:
        return [claim for claim, holds in self.results.items() if not holds]

    def report(self) -> None:
        """Raise at the book's parameters if a claim fails; elsewhere print the table."""
        if self.at_book_parameters:
            if self.failed:
                raise AssertionError(
                    f"claims of chapter {self.chapter} that do not hold at the book's "
                    f"parameters: {'; '.join(self.failed)}"
                )
            return
        changed = ", ".join(f"{k}={v!r}" for k, v in self.changed.items())
        print(f"The prose was written for the book's parameters. At these ({changed}), "
              f"{len(self.failed)} of its {len(self.results)} claims do not hold:")
        for claim, holds in self.results.items():
            print(f"  {'holds ' if holds else 'FAILS '} {claim}")
