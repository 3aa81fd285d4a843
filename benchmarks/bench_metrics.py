"""Calibration-metric speed against peers and floors, each ratio taken in one run.

Inputs are random float32 softmax probabilities ``softmax(3 z)``, ``z ~ N(0, 1)``, of
``--n`` samples and ``--classes`` classes, labels uniform; CPU only. Every comparison is
repeated ``--repeat`` times with ours, the peer and the floor back to back in each
repetition (the machine may be shared: a slow spell then hits all three); the tables give
the median seconds and the median of the per-repetition ratios.

* ECE (15 equal-width bins, top label), MCE and classwise ECE on the full ``N x C``:
  against torchmetrics (``multiclass_calibration_error``; classwise: its
  ``binary_calibration_error`` looped over classes, it has no classwise ECE) and against
  the floor ``p.sum()``, one read of the array.
* The same against netcal (``ECE``, ``MCE``, ``ECE`` per one-vs-rest column), which is slow
  on 10^8 entries and runs on the first ``--n-netcal`` rows: ``ratio_same_n`` compares
  calnotes on those rows with netcal, ``ratio_per_row`` calnotes' seconds per row on the
  full input with netcal's per row on the subsample.
* SECE forward + backward at N in ``--sece-n``: the default method (exact sums up to
  ``metrics.SECE_EXACT_MAX_N``, the grid above) against the exact O(N^2) sums (the floor
  the grid must beat, run once above 20,000 samples), with the difference of the values,
  and against the textbook dense N x N formula where it fits in ``--dense-max-n``.

* Smooth ECE (``metrics.smece``, automatic bandwidth) at N in ``--smece-n``, binary
  top-label input: against the floor, one evaluation at the bandwidth it finds
  (``smece(p, y, bandwidth=sigma)``: the fixed point's cost in evaluations), and against the
  straightforward method on the same grid (the reflected kernel summed over its images in
  real space and transformed, the fixed point bisected to 1e-6), with the difference of
  the values.

Threads: ``--threads auto`` (default) uses :func:`calnotes._threads.auto_threads`, the
policy the trainer uses, for everything, peers and floors included.

    python benchmarks/bench_metrics.py [--n 1000000 --classes 100 --repeat 5 --json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from _common import report

from calnotes import metrics
from calnotes._threads import auto_threads


def _seconds(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def compare(fns: dict[str, Callable[[], Any]], repeat: int,
            warmup: bool = True) -> tuple[dict[str, float], dict[str, list[float]], dict]:
    """Run every function once per repetition, in turn; returns the median seconds, the
    per-repetition seconds and the last results."""
    if warmup:
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    results: dict[str, Any] = {}
    for _ in range(repeat):
        for name, fn in fns.items():
            seconds, results[name] = _seconds(fn)
            times[name].append(seconds)
    return {k: statistics.median(v) for k, v in times.items()}, times, results


def median_ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    return statistics.median(a / b for a, b in zip(times[num], times[den], strict=True))


def _data(n: int, c: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p = torch.softmax(3.0 * torch.randn(n, c, generator=g), dim=1)
    y = torch.randint(0, c, (n,), generator=g)
    return p, y


def _torchmetrics() -> Any | None:
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


def _ours(p: torch.Tensor, y: torch.Tensor) -> dict[str, Callable[[], Any]]:
    return {
        "ece": lambda: metrics.ece(p, y, n_bins=15),
        "mce": lambda: metrics.mce(p, y, n_bins=15),
        "classwise_ece": lambda: metrics.classwise_ece(p, y, n_bins=15),
    }


def bench_binned(p: torch.Tensor, y: torch.Tensor, repeat: int) -> list[dict]:
    """ECE, MCE, classwise ECE on the full input vs torchmetrics and vs one read."""
    n, c = p.shape
    tmc = _torchmetrics()
    peers: dict[str, Callable[[], Any]] = {}
    if tmc is not None:
        cols = [p[:, k].contiguous() for k in range(c)]
        peers = {
            "ece": lambda: tmc.multiclass_calibration_error(p, y, num_classes=c, n_bins=15),
            "mce": lambda: tmc.multiclass_calibration_error(p, y, num_classes=c, n_bins=15,
                                                            norm="max"),
            "classwise_ece": lambda: float(np.mean([
                float(tmc.binary_calibration_error(cols[k], (y == k).long(), n_bins=15))
                for k in range(c)])),
        }
    rows = []
    for name, ours in _ours(p, y).items():
        print(f"  {name} {n}x{c} ...", flush=True)
        fns = {"ours": ours, "floor": lambda: p.sum()}
        if name in peers:
            fns["peer"] = peers[name]
        med, times, out = compare(fns, repeat)
        row: dict[str, Any] = {
            "task": f"{name} 15 bins {n}x{c} (CPU)",
            "calnotes_s": round(med["ours"], 4),
            "floor_s (p.sum())": round(med["floor"], 4),
            "ratio_over_floor": round(median_ratio(times, "ours", "floor"), 2),
        }
        if "peer" in fns:
            row.update({
                "peer": "torchmetrics " + ("binary_calibration_error looped over classes"
                                           if name == "classwise_ece"
                                           else "multiclass_calibration_error"),
                "peer_s": round(med["peer"], 4),
                "speedup_over_peer": round(median_ratio(times, "peer", "ours"), 2),
                "abs_diff_vs_peer": abs(float(out["ours"]) - float(out["peer"])),
            })
        row["value"] = round(float(out["ours"]), 6)
        rows.append(row)
    return rows


def bench_netcal(p: torch.Tensor, y: torch.Tensor, n_sub: int, repeat: int) -> list[dict]:
    """ECE, MCE, classwise ECE vs netcal on a subsample, with per-row ratios."""
    ncm = _netcal()
    n, c = p.shape
    n_sub = min(n_sub, n)
    if ncm is None:
        return [{"task": f"{name} vs netcal", "peer": "netcal (unavailable)"}
                for name in ("ece", "mce", "classwise_ece")]
    ps, ys = p[:n_sub].contiguous(), y[:n_sub].contiguous()
    ps_np, ys_np = ps.numpy().astype(np.float64), ys.numpy()
    peers = {
        "ece": lambda: ncm.ECE(bins=15).measure(ps_np, ys_np),
        "mce": lambda: ncm.MCE(bins=15).measure(ps_np, ys_np),
        "classwise_ece": lambda: float(np.mean(
            [ncm.ECE(bins=15).measure(ps_np[:, k], (ys_np == k).astype(np.int64))
             for k in range(c)])),
    }
    subsample, full = _ours(ps, ys), _ours(p, y)
    rows = []
    for name in peers:
        print(f"  {name} vs netcal on {n_sub}x{c} ...", flush=True)
        med, times, out = compare({"sub": subsample[name], "full": full[name],
                                   "peer": peers[name]}, repeat)
        per_row = statistics.median(
            (f / n) / (q / n_sub) for f, q in zip(times["full"], times["peer"], strict=True))
        rows.append({
            "task": f"{name} 15 bins, netcal on {n_sub}x{c}, calnotes also on {n}x{c} (CPU)",
            "calnotes_s": round(med["sub"], 4),
            "peer": "netcal " + ("ECE per one-vs-rest column" if name == "classwise_ece"
                                 else name.upper()),
            "peer_s": round(med["peer"], 4),
            "speedup_same_n": round(median_ratio(times, "peer", "sub"), 2),
            "speedup_per_row": round(1.0 / per_row, 2),
            "abs_diff_vs_peer": abs(float(out["sub"]) - float(out["peer"])),
        })
    return rows


def _dense_sece(p: torch.Tensor, y: torch.Tensor, h: float) -> torch.Tensor:
    """Peer: the textbook formula with the full N x N kernel matrix."""
    conf, pred = p.max(dim=1)
    r = (pred == y).to(p.dtype)
    k = torch.exp(-((conf[:, None] - conf[None, :]) ** 2) / (2 * h * h))
    return ((k @ r) / k.sum(dim=1) - conf).abs().mean()


def _forward_backward(p: torch.Tensor, y: torch.Tensor, fn: Callable) -> float:
    q = p.clone().requires_grad_()
    value = fn(q, y)
    value.backward()
    return float(value.detach())


def bench_sece(c: int, sizes: list[int], dense_max_n: int, repeat: int,
               seed: int) -> list[dict]:
    rows = []
    for n in sizes:
        print(f"  sece N={n} ...", flush=True)
        p, y = _data(n, c, seed)
        fns: dict[str, Callable[[], Any]] = {
            "ours": lambda p=p, y=y: _forward_backward(p, y, metrics.sece),
        }
        floor = {"exact": lambda p=p, y=y: _forward_backward(
            p, y, lambda q, t: metrics.sece(q, t, method="exact"))}
        if n <= 20_000:
            fns.update(floor)
        if n <= dense_max_n:
            fns["dense"] = lambda p=p, y=y: _forward_backward(
                p, y, lambda q, t: _dense_sece(q, t, 0.05))
        med, times, out = compare(fns, repeat)
        if "exact" not in med:  # large N: the O(N^2) floor once, no warm-up
            seconds, out["exact"] = _seconds(floor["exact"])
            med["exact"], times["exact"] = seconds, [seconds] * repeat
        method = "exact" if n <= metrics.SECE_EXACT_MAX_N else "grid"
        row: dict[str, Any] = {
            "task": f"sece forward+backward N={n}, default method ({method}) (CPU)",
            "calnotes_s": round(med["ours"], 4),
            "floor": "exact O(N^2) sums, forward+backward"
                     + ("" if n <= 20_000 else " (one run)"),
            "floor_s": round(med["exact"], 4),
            "speedup_over_floor": round(statistics.median(
                e / o for e, o in zip(times["exact"], times["ours"], strict=True)), 1),
            "abs_diff_vs_exact": abs(out["ours"] - out["exact"]),
            "value": round(out["ours"], 6),
        }
        if "dense" in med:
            row.update({"peer": "dense torch (N x N kernel), forward+backward",
                        "peer_s": round(med["dense"], 4),
                        "speedup_over_peer": round(median_ratio(times, "dense", "ours"), 1)})
        rows.append(row)
    return rows


def _smece_bisection_images(p: torch.Tensor, y: torch.Tensor) -> float:
    """smECE at its fixed point, straightforwardly: on the same grid as
    :func:`calnotes.metrics.smece`, the reflected kernel summed image by image in real space
    and transformed by FFT at each bandwidth, the fixed point bisected to 1e-6."""
    import math

    from calnotes.metrics import smooth

    conf, correct = metrics.confidences_and_correct(p, y)
    c = conf.to(torch.float64)
    r = c - correct.to(torch.float64)
    cells = smooth._smece_cells(smooth.SMECE_MIN_BANDWIDTH)
    ring = torch.fft.rfft(smooth._smece_mass(c, r, cells))
    size = 2 * cells
    d = torch.arange(size, dtype=torch.float64)
    d = torch.minimum(d, size - d) / cells

    def value(s: float) -> float:
        kernel = torch.zeros_like(d)
        for k in range(-math.ceil(4 * s), math.ceil(4 * s) + 1):
            kernel += torch.exp(-0.5 * ((d + 2 * k) / s) ** 2)
        kernel /= s * math.sqrt(2 * math.pi)
        h = torch.fft.irfft(ring * torch.fft.rfft(kernel), n=size)[: cells + 1] / c.shape[0]
        a = h.abs()
        return float((a.sum() - 0.5 * (a[0] + a[-1])) / cells)

    lo, hi = smooth.SMECE_MIN_BANDWIDTH, 1.0
    if value(hi) >= hi:
        return value(hi)
    if value(lo) <= lo:
        return value(lo)
    while hi - lo > 1e-6:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if value(mid) > mid else (lo, mid)
    return value(0.5 * (lo + hi))


def bench_smece(sizes: list[int], repeat: int, seed: int) -> list[dict]:
    rows = []
    for n in sizes:
        print(f"  smece N={n} ...", flush=True)
        p, y = _data(n, 2, seed)
        sigma = metrics.smece_bandwidth(p, y)
        med, times, out = compare({
            "ours": lambda p=p, y=y: float(metrics.smece(p, y)),
            "floor": lambda p=p, y=y, s=sigma: float(metrics.smece(p, y, bandwidth=s)),
            "peer": lambda p=p, y=y: _smece_bisection_images(p, y),
        }, repeat)
        rows.append({
            "task": f"smece N={n}, automatic bandwidth (fixed point sigma = {sigma:.4f}) (CPU)",
            "calnotes_s": round(med["ours"], 4),
            "floor": "one evaluation at the bandwidth found",
            "floor_s": round(med["floor"], 4),
            "ratio_over_floor": round(median_ratio(times, "ours", "floor"), 1),
            "peer": "image-sum kernel in real space + FFT, bisection to 1e-6, same grid",
            "peer_s": round(med["peer"], 4),
            "speedup_over_peer": round(median_ratio(times, "peer", "ours"), 1),
            "abs_diff_vs_peer": abs(out["ours"] - out["peer"]),
            "value": round(out["ours"], 6),
        })
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000, help="samples for ECE/MCE/classwise")
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--repeat", type=int, default=5, help="repetitions (median reported)")
    parser.add_argument("--n-netcal", type=int, default=100_000, help="netcal subsample size")
    parser.add_argument("--sece-n", type=int, nargs="*", default=[1_000, 10_000, 100_000])
    parser.add_argument("--smece-n", type=int, nargs="*", default=[1_000, 100_000])
    parser.add_argument("--dense-max-n", type=int, default=10_000,
                        help="largest N for the dense N x N SECE peer")
    parser.add_argument("--threads", default="auto", help="torch threads: 'auto' or a number")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, metavar="PATH", help="also write results here")
    args = parser.parse_args(argv)
    threads = auto_threads() if args.threads == "auto" else int(args.threads)
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        print(f"bench_metrics: {args.n}x{args.classes}, {threads} torch threads", flush=True)
        p, y = _data(args.n, args.classes, args.seed)
        rows = bench_binned(p, y, args.repeat)
        rows += bench_netcal(p, y, args.n_netcal, args.repeat)
        del p, y
        rows += bench_sece(args.classes, args.sece_n, args.dense_max_n, args.repeat,
                           args.seed)
        rows += bench_smece(args.smece_n, args.repeat, args.seed)
    finally:
        torch.set_num_threads(previous)
    for row in rows:
        row["torch_threads"] = threads
    return report(rows, args, args.json, note=(
        "median over repetitions, ours, peer and floor back to back in each; speedup > 1 "
        "means calnotes is faster, ratio_over_floor is calnotes' time in reads of the input"))


if __name__ == "__main__":
    main(sys.argv[1:])
