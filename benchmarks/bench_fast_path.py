"""The CPU fast path against the float32 NCHW path: one training step of each book regime.

Regimes (the book's batch sizes): LeNet-5, ResNet-8, ResNet-14 and ResNet-20 with plain SGD
on 28x28 single-channel batches of 64, and the FLgamma-SECE meta step of chapter 5
(ResNet-14, batch 128, a meta-validation batch of 128). Paths: ``float32`` is
``Trainer(amp=False, channels_last=False, compile=False)``, ``fast`` is bfloat16 autocast
with channels_last (``amp=True, channels_last=True``). Steps of the two paths alternate in
blocks, so a slow spell of the shared machine hits both; each path's step time is the median
of its blocks. One intra-op thread, as the book's runs train; times are this process's CPU
time (``time.process_time``), so other jobs on the shared cores do not count as ours.

The machine's matmul peaks are measured in the same run (float32 and bfloat16 ``torch.mm``
of 1024 x 1024, best of several), and each step's FLOPs counted by
``torch.utils.flop_counter``; a path's share of a peak is ``FLOPs / step time / peak``.

``--compile`` (default on; ``--no-compile`` skips it) times ``torch.compile`` of the
ResNet-14 fast step in two fresh processes sharing one inductor cache folder: the first
compiles into the empty cache, the second finds it warm (as a later run of the same
architecture does), and reports the per-step gain and the steps needed to pay back each
compile time (compile times are wall time, as inductor compiles in worker processes; on a
loaded machine they are upper bounds).

    python benchmarks/bench_fast_path.py [--blocks 5] [--steps 4] [--no-compile]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from _common import report

from calnotes.models import build_model
from calnotes.training import Trainer, cpu_features
from calnotes.training.meta import GammaNet, MetaTrainer

#: name, architecture, model options, batch size, meta step
REGIMES = [
    ("LeNet-5", "lenet5", {}, 64, False),
    ("ResNet-8", "resnet8", {"width": 16, "batch_norm": True}, 64, False),
    ("ResNet-14", "resnet14", {"width": 16, "batch_norm": True}, 64, False),
    ("ResNet-20", "resnet20", {}, 64, False),
    ("meta step (ResNet-14, FLgamma-SECE)", "resnet14", {}, 128, True),
]
PATHS = {"float32": dict(amp=False, channels_last=False, compile=False),
         "fast": dict(amp=True, channels_last=True, compile=False)}


def matmul_peak(dtype: torch.dtype, n: int = 1024, repeats: int = 5) -> float:
    """Best FLOP/s (per CPU second) of an ``n x n`` matrix product in ``dtype``."""
    a, b = torch.randn(n, n).to(dtype), torch.randn(n, n).to(dtype)
    for _ in range(2):
        torch.mm(a, b)
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        torch.mm(a, b)
        best = min(best, time.process_time() - start)
    return 2 * n**3 / best


def make_step(arch: str, options: dict, batch: int, meta: bool, path: dict) -> Any:
    """A closure doing one training step of the regime on fixed random batches."""
    torch.manual_seed(0)
    model = build_model(arch, 10, 1, 28, **options)
    common = dict(device="cpu", progress=False, lr=0.01, **path)
    x, y = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
    if meta:
        trainer: Trainer = MetaTrainer(model, GammaNet(model.head.in_features), outer="sece",
                                       inner_reduction="mean", **common)
        xv, yv = torch.randn(batch, 1, 28, 28), torch.randint(0, 10, (batch,))
        xi, xvi = trainer._input(x), trainer._input(xv)
        return lambda: trainer.train_step(xi, y, xvi, yv)  # type: ignore[attr-defined]
    trainer = Trainer(model, threads=1, **common)
    xi = trainer._input(x)
    return lambda: trainer._train_step(xi, y)


def step_flops(step: Any) -> int:
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        step()
    return int(counter.get_total_flops())


def time_paths(steps: dict[str, Any], blocks: int, per_block: int) -> dict[str, float]:
    """Median seconds per step of each path over alternating blocks."""
    for step in steps.values():
        for _ in range(2):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(blocks):
        for name, step in steps.items():
            start = time.process_time()
            for _ in range(per_block):
                step()
            times[name].append((time.process_time() - start) / per_block)
    return {name: statistics.median(t) for name, t in times.items()}


def compile_child(cache: str, compiled: bool, steps: int) -> dict[str, float]:
    """In this process: the ResNet-14 fast step, compiled or eager; first step and median."""
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = build_model("resnet14", 10, 1, 28, width=16, batch_norm=True)
    trainer = Trainer(model, device="cpu", progress=False, threads=1, amp=True,
                      channels_last=True, compile=compiled)
    x, y = trainer._input(torch.randn(64, 1, 28, 28)), torch.randint(0, 10, (64,))
    start = time.perf_counter()  # wall time: inductor compiles in worker processes
    trainer._train_step(x, y)
    first = time.perf_counter() - start
    times = []
    for _ in range(steps):
        start = time.process_time()
        trainer._train_step(x, y)
        times.append(time.process_time() - start)
    return {"first_s": first, "step_s": statistics.median(times[1:])}


def compile_row(steps: int) -> dict[str, Any]:
    here = str(Path(__file__).resolve())
    with tempfile.TemporaryDirectory(prefix="inductor-") as cache:
        def child(compiled: bool) -> dict[str, float]:
            out = subprocess.run(
                [sys.executable, here, "--child", cache, "--child-compiled", str(int(compiled)),
                 "--steps", str(steps)], capture_output=True, text=True, check=True,
                env={**os.environ, "OMP_NUM_THREADS": "1"})
            return json.loads(out.stdout.strip().splitlines()[-1])

        eager, cold, warm = child(False), child(True), child(True)
    load = os.getloadavg()[0]
    gain = eager["step_s"] - warm["step_s"]

    def payback(seconds: float) -> int | None:
        return round(seconds / gain) if gain > 0 else None

    return {"task": "torch.compile of the ResNet-14 fast step (1 thread)",
            "eager_step_ms": round(1e3 * eager["step_s"], 1),
            "compiled_step_ms": round(1e3 * warm["step_s"], 1),
            "speedup": round(eager["step_s"] / warm["step_s"], 2),
            "compile_cold_cache_s": round(cold["first_s"] - eager["first_s"], 1),
            "compile_warm_cache_s": round(warm["first_s"] - eager["first_s"], 1),
            "payback_steps_cold": payback(cold["first_s"] - eager["first_s"]),
            "payback_steps_warm": payback(warm["first_s"] - eager["first_s"]),
            "load_average_1min": round(load, 1)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--blocks", type=int, default=5)
    parser.add_argument("--steps", type=int, default=4, help="steps per block")
    parser.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--json", default=None)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child-compiled", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(compile_child(args.child, bool(args.child_compiled), 6)))
        return {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        peaks = {"float32": matmul_peak(torch.float32), "bfloat16": matmul_peak(torch.bfloat16)}
        rows: list[dict[str, Any]] = []
        for name, arch, options, batch, meta in REGIMES:
            steps = {p: make_step(arch, options, batch, meta, s) for p, s in PATHS.items()}
            flops = {p: step_flops(s) for p, s in steps.items()}
            secs = time_paths(steps, args.blocks, args.steps)
            row: dict[str, Any] = {"regime": name, "batch": batch}
            for p in PATHS:
                row[f"{p}_ms"] = round(1e3 * secs[p], 1)
            row["speedup_fast_over_float32"] = round(secs["float32"] / secs["fast"], 2)
            for p in PATHS:
                rate = flops[p] / secs[p]
                row[f"{p}_share_fp32_peak"] = round(rate / peaks["float32"], 3)
                row[f"{p}_share_bf16_peak"] = round(rate / peaks["bfloat16"], 3)
            rows.append(row)
            print(row, flush=True)
        if args.compile:
            rows.append(compile_row(args.steps * 2))
    finally:
        torch.set_num_threads(threads)
    peak_text = {k: f"{v / 1e9:.1f} GFLOP/s" for k, v in peaks.items()}
    print(f"matmul peaks (1 thread): {peak_text}; cpu: {cpu_features()}")
    return report(rows, args, args.json, peaks_gflops={k: v / 1e9 for k, v in peaks.items()},
                  cpu=cpu_features())


if __name__ == "__main__":
    main(sys.argv[1:])
