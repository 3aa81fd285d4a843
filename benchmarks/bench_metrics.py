"""Calibration-metric speed: calnotes vs torchmetrics vs netcal, and SECE time vs N.

All inputs are random float32 softmax probabilities ``softmax(3 z)``, ``z ~ N(0, 1)``, of
``--n`` samples and ``--classes`` classes, labels uniform; CPU only. Times are the best of
``--repeat`` runs after one untimed warm-up call (SECE above N = 20,000: one run, no
warm-up).

* ECE (15 equal-width bins, top-label) and MCE on the full ``N x C``:
  calnotes ``ece`` / ``mce`` vs ``torchmetrics.functional.classification.
  multiclass_calibration_error`` (same quantity; its bins are [lo, hi) instead of our
  (lo, hi], which only matters for values exactly on an edge).
* Classwise ECE (Kull et al.): calnotes ``classwise_ece`` vs the mean over classes of
  torchmetrics' ``binary_calibration_error(p[:, k], y == k)`` (a Python loop over classes;
  torchmetrics has no classwise ECE of its own).
* netcal (``ECE``, ``MCE``, and ``ECE`` on each one-vs-rest column for classwise) is slow on
  10^8 entries, so it runs on the first ``--n-netcal`` samples. Two ratios are reported:
  ``ratio_same_n`` (calnotes on that same subsample vs netcal) and
  ``ratio_per_sample`` (calnotes seconds per sample on the full input vs netcal seconds per
  sample on the subsample), labelled as such.
* SECE at N in ``--sece-n`` (default 1k, 10k, 100k): forward time, forward + backward time,
  and a dense peer (plain torch, N x N kernel matrix materialized) where it fits in
  ``--dense-max-n``. No other library implements SECE.

A ratio < 1 means calnotes is faster. Every value is also checked against the peer's.

    python benchmarks/bench_metrics.py [--n 1000000 --classes 100 --repeat 3 --json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from calnotes import metrics


def _best_of(fn: Callable[[], Any], repeat: int, warmup: bool = True) -> tuple[float, Any]:
    """Warm up once (optional), then the best wall time of ``repeat`` calls and the result."""
    out = fn() if warmup else None
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def _data(n: int, c: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(3.0 * torch.randn(n, c, generator=g), dim=1)
    y = torch.randint(0, c, (n,), generator=g)
    return p, y


def _torchmetrics() -> Any | None:
    """torchmetrics' classification functional API, or None if it cannot be imported."""
    try:
        from calnotes.data.sources import _import_torchvision

        _import_torchvision()  # torchmetrics imports torchvision (see calnotes.data.sources)
        import torchmetrics.functional.classification as tmc
    except Exception as exc:  # any import failure means "peer unavailable"
        print(f"torchmetrics unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    return tmc


def _netcal() -> Any | None:
    try:
        import netcal.metrics as ncm
    except Exception as exc:
        print(f"netcal unavailable: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None
    return ncm


def _row(task: str, ours_s: float, peer: str, peer_s: float | None, **extra: Any) -> dict:
    row: dict[str, Any] = {
        "task": task,
        "calnotes_s": round(ours_s, 4),
        "peer": peer,
        "peer_s": None if peer_s is None else round(peer_s, 4),
        "ratio_calnotes_over_peer": None if not peer_s else round(ours_s / peer_s, 3),
    }
    row.update(extra)
    return row


def bench_binned(p: torch.Tensor, y: torch.Tensor, repeat: int) -> list[dict]:
    """ECE, MCE, classwise ECE on the full input vs torchmetrics."""
    n, c = p.shape
    size = f"{n}x{c}"
    tmc = _torchmetrics()
    ours = {
        "ece": lambda: metrics.ece(p, y, n_bins=15),
        "mce": lambda: metrics.mce(p, y, n_bins=15),
        "classwise_ece": lambda: metrics.classwise_ece(p, y, n_bins=15),
    }
    peers: dict[str, Callable[[], Any]] = {}
    if tmc is not None:
        cols = [p[:, k].contiguous() for k in range(c)]

        def tm_classwise() -> float:
            return float(
                np.mean(
                    [
                        float(tmc.binary_calibration_error(cols[k], (y == k).long(), n_bins=15))
                        for k in range(c)
                    ]
                )
            )

        peers = {
            "ece": lambda: tmc.multiclass_calibration_error(
                p, y, num_classes=c, n_bins=15, norm="l1"
            ),
            "mce": lambda: tmc.multiclass_calibration_error(
                p, y, num_classes=c, n_bins=15, norm="max"
            ),
            "classwise_ece": tm_classwise,
        }
    rows = []
    for name, fn in ours.items():
        print(f"  {name} {size} ...", flush=True)
        ours_s, ours_v = _best_of(fn, repeat)
        peer_name = "torchmetrics " + (
            "mean_k binary_calibration_error (loop over classes)"
            if name == "classwise_ece"
            else "multiclass_calibration_error"
        )
        if name in peers:
            peer_s, peer_v = _best_of(peers[name], repeat)
            diff = abs(float(ours_v) - float(peer_v))
        else:
            peer_s, diff, peer_name = None, None, "torchmetrics (unavailable)"
        rows.append(
            _row(f"{name} 15 bins {size} (CPU)", ours_s, peer_name, peer_s,
                 value=round(float(ours_v), 6), abs_diff_vs_peer=diff)
        )
    return rows


def bench_netcal(p: torch.Tensor, y: torch.Tensor, n_sub: int, repeat: int) -> list[dict]:
    """ECE, MCE, classwise ECE vs netcal on a subsample, plus per-sample ratios."""
    ncm = _netcal()
    n, c = p.shape
    n_sub = min(n_sub, n)
    ps, ys = p[:n_sub].contiguous(), y[:n_sub].contiguous()
    ps_np, ys_np = ps.numpy().astype(np.float64), ys.numpy()
    if ncm is None:
        return [_row(f"{name} vs netcal", float("nan"), "netcal (unavailable)", None)
                for name in ("ece", "mce", "classwise_ece")]
    ours = {
        "ece": lambda q, t: metrics.ece(q, t, n_bins=15),
        "mce": lambda q, t: metrics.mce(q, t, n_bins=15),
        "classwise_ece": lambda q, t: metrics.classwise_ece(q, t, n_bins=15),
    }
    peers = {
        "ece": lambda: ncm.ECE(bins=15).measure(ps_np, ys_np),
        "mce": lambda: ncm.MCE(bins=15).measure(ps_np, ys_np),
        "classwise_ece": lambda: float(
            np.mean(
                [ncm.ECE(bins=15).measure(ps_np[:, k], (ys_np == k).astype(np.int64))
                 for k in range(c)]
            )
        ),
    }
    rows = []
    for name in ours:
        print(f"  {name} vs netcal on {n_sub}x{c} ...", flush=True)
        sub_s, sub_v = _best_of(lambda name=name: ours[name](ps, ys), repeat)
        full_s, _ = _best_of(lambda name=name: ours[name](p, y), max(1, repeat))
        peer_s, peer_v = _best_of(peers[name], max(1, repeat))
        rows.append(
            _row(
                f"{name} 15 bins {n_sub}x{c} subsample (CPU)",
                sub_s,
                "netcal " + ("ECE per one-vs-rest column" if name == "classwise_ece"
                             else name.upper()),
                peer_s,
                value=round(float(sub_v), 6),
                abs_diff_vs_peer=abs(float(sub_v) - float(peer_v)),
                ratio_same_n=round(sub_s / peer_s, 4),
                ratio_per_sample=round((full_s / n) / (peer_s / n_sub), 4),
                per_sample_note=f"calnotes on {n} rows vs netcal on {n_sub} rows, per row",
            )
        )
    return rows


def _dense_sece(p: torch.Tensor, y: torch.Tensor, h: float) -> torch.Tensor:
    """Peer: the textbook formula with the full N x N kernel matrix."""
    conf, pred = p.max(dim=1)
    r = (pred == y).to(p.dtype)
    k = torch.exp(-((conf[:, None] - conf[None, :]) ** 2) / (2 * h * h))
    return ((k @ r) / k.sum(dim=1) - conf).abs().mean()


def bench_sece(c: int, sizes: list[int], dense_max_n: int, repeat: int, seed: int) -> list[dict]:
    rows = []
    for n in sizes:
        print(f"  sece N={n} ...", flush=True)
        p, y = _data(n, c, seed)
        # Large N: one timed run, no warm-up (the smaller sizes already warmed up the kernels)
        reps, warm = (repeat, True) if n <= 20_000 else (1, False)
        fwd_s, value = _best_of(lambda p=p, y=y: metrics.sece(p, y), reps, warm)

        def fwd_bwd(p: torch.Tensor = p, y: torch.Tensor = y) -> None:
            q = p.clone().requires_grad_()
            metrics.sece(q, y).backward()

        bwd_s, _ = _best_of(fwd_bwd, reps, warm)
        if n <= dense_max_n:
            peer_s, peer_v = _best_of(lambda p=p, y=y: _dense_sece(p, y, 0.05), reps)
            peer, diff = "dense torch (N x N kernel)", abs(float(value) - float(peer_v))
        else:
            peer_s, diff = None, None
            peer = f"dense torch: not run (N x N = {4 * n * n / 2**30:.0f} GiB)"
        rows.append(
            _row(f"sece forward N={n} (CPU)", fwd_s, peer, peer_s,
                 sece_forward_backward_s=round(bwd_s, 4), timed_runs=reps,
                 value=round(float(value), 6), abs_diff_vs_peer=diff)
        )
    return rows


def _markdown(rows: list[dict]) -> str:
    keys = ["task", "calnotes_s", "peer", "peer_s", "ratio_calnotes_over_peer",
            "ratio_same_n", "ratio_per_sample", "sece_forward_backward_s", "abs_diff_vs_peer"]
    keys = [k for k in keys if any(k in r for r in rows)]
    lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        cells = ["" if r.get(k) is None else str(r.get(k)) for k in keys]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="samples for ECE/MCE/classwise")
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=3, help="timed runs (best is kept)")
    parser.add_argument("--n-netcal", type=int, default=100_000, help="netcal subsample size")
    parser.add_argument("--sece-n", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    parser.add_argument("--dense-max-n", type=int, default=20_000,
                        help="largest N for the dense N x N SECE peer")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: as is)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="PATH", help="also write results here")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    print(f"bench_metrics: {args.n}x{args.classes}, {torch.get_num_threads()} torch threads")
    p, y = _data(args.n, args.classes, args.seed)
    rows = bench_binned(p, y, args.repeat)
    rows += bench_netcal(p, y, args.n_netcal, args.repeat)
    del p, y
    rows += bench_sece(args.classes, args.sece_n, args.dense_max_n, args.repeat, args.seed)
    for row in rows:
        row["torch_threads"] = torch.get_num_threads()
    result = {
        "rows": rows,
        "config": {k: v for k, v in vars(args).items() if k != "json"},
        "note": "ratio < 1 means calnotes is faster; ratio_per_sample compares seconds per "
        "row at different N (netcal subsampled)",
    }
    print(_markdown(rows))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2, default=str)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
