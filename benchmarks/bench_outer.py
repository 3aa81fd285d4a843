"""Cost of the outer (meta) losses: SECE against DECE, forward + backward, in one run.

The meta-regularization paper says SECE is cheaper than DECE. Each outer loss here is
computed from a batch of float32 logits ``(B, C)`` (``3 z``, ``z ~ N(0, 1)``, labels
uniform) through the softmax, then differentiated back to the logits, as
:class:`calnotes.training.meta.MetaTrainer` does on every meta-validation batch:

* ``sece``: :func:`calnotes.metrics.sece` (bandwidth 0.05; exact pairwise sums at these
  batch sizes, O(B^2));
* ``dece_ranked``: :func:`calnotes.losses.dece` in Bohdal et al.'s form (15 soft bins,
  the true class's soft rank: O(B M + B C));
* ``dece_all_pairs``: the same DECE with the soft rank of *every* class from all pairwise
  class differences, O(B C^2), as Bohdal et al.'s code computes it (the same value);
* ``dece_sharpened``: calnotes' other DECE form (Gaussian bins, sharpened softmax).

Per repetition the four run back to back, each ``--calls`` times (one call takes well
under a millisecond); the rows give the median seconds per call and the median of the
per-repetition ratios of each DECE to SECE (> 1: DECE is dearer). CPU only.

    python benchmarks/bench_outer.py [--batch 64 128 256 512] [--classes 10 100]
                                     [--repeat 7] [--calls 200] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from _common import report

from calnotes import metrics
from calnotes._threads import auto_threads
from calnotes.losses import RANKED_DECE, dece


def _all_pairs_ranked_dece(probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The ranked DECE with a soft rank for every class from the (B, C, C) pairwise
    differences, the true class's picked afterwards (the reference code's layout)."""
    conf = probs.max(dim=1).values
    m = torch.arange(1, 16, dtype=probs.dtype)
    bins = F.softmax((conf.unsqueeze(1) * m - m * (m - 1) / 30) / 0.01, dim=1)
    ranks = torch.sigmoid((probs.unsqueeze(1) - probs.unsqueeze(2)) / 0.01).sum(dim=2) + 0.5
    acc = F.relu(2.0 - ranks[torch.arange(len(labels)), labels])
    return (bins.t() @ (acc - conf)).abs().sum() / probs.shape[0]


LOSSES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sece": lambda p, y: metrics.sece(p, y, bandwidth=0.05),
    "dece_ranked": lambda p, y: dece(p, y, form="ranked", **RANKED_DECE),
    "dece_all_pairs": _all_pairs_ranked_dece,
    "dece_sharpened": lambda p, y: dece(p, y),
}


def _timed(fn: Callable, logits: torch.Tensor, labels: torch.Tensor, calls: int) -> float:
    """Seconds per forward + backward call, averaged over ``calls``."""
    start = time.perf_counter()
    for _ in range(calls):
        z = logits.detach().requires_grad_()
        fn(F.softmax(z, dim=1), labels).backward()
    return (time.perf_counter() - start) / calls


def bench(batch: int, classes: int, repeat: int, calls: int, seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    logits = 3.0 * torch.randn(batch, classes, generator=g)
    labels = torch.randint(0, classes, (batch,), generator=g)
    values = {name: float(fn(F.softmax(logits, 1), labels)) for name, fn in LOSSES.items()}
    times: dict[str, list[float]] = {name: [] for name in LOSSES}
    for fn in LOSSES.values():  # warm-up
        _timed(fn, logits, labels, max(1, calls // 10))
    for _ in range(repeat):
        for name, fn in LOSSES.items():
            times[name].append(_timed(fn, logits, labels, calls))
    row: dict[str, Any] = {"task": f"outer loss forward+backward, B={batch}, C={classes} (CPU)"}
    for name in LOSSES:
        row[f"{name}_us"] = round(1e6 * statistics.median(times[name]), 1)
    for name in LOSSES:
        if name != "sece":
            row[f"{name}_over_sece"] = round(statistics.median(
                d / s for d, s in zip(times[name], times["sece"], strict=True)), 2)
    row["all_pairs_minus_ranked"] = abs(values["dece_all_pairs"] - values["dece_ranked"])
    return row


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, nargs="*", default=[64, 128, 256, 512])
    parser.add_argument("--classes", type=int, nargs="*", default=[10, 100])
    parser.add_argument("--repeat", type=int, default=7, help="repetitions (median reported)")
    parser.add_argument("--calls", type=int, default=200, help="calls per timing")
    parser.add_argument("--threads", default="auto", help="torch threads: 'auto' or a number")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="PATH", help="also write results here")
    args = parser.parse_args(argv)
    threads = auto_threads() if args.threads == "auto" else int(args.threads)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        rows = [bench(b, c, args.repeat, args.calls, args.seed)
                for c in args.classes for b in args.batch]
    finally:
        torch.set_num_threads(previous)
    for row in rows:
        row["torch_threads"] = threads
    return report(rows, args, args.json, note=(
        "median seconds per call; *_over_sece is the median over repetitions of that DECE's "
        "time over SECE's in the same repetition (> 1: DECE is dearer)"))


if __name__ == "__main__":
    main(sys.argv[1:])
