"""Training speed: the calnotes Trainer against a DataLoader loop, against its previous
settings, and a step's achieved FLOP/s against the machine's measured matmul peak.

All runs train on the same Fashion-MNIST images with batch 128, SGD (lr 0.05, momentum
0.9) and the same augmentation (random crop with padding 2, horizontal flip). For each
model, every configuration trains one epoch from the same initialization per round, the
configurations in turn, for ``--rounds`` rounds (the machine may be shared: a slow spell
then hits all of them); the table gives median images/s and the median of the per-round
ratios.

* ``calnotes``: the Trainer with its defaults (NHWC on the CPU for convolutional models
  without batch norm, threads from :func:`calnotes._threads.auto_threads`).
* ``previous``: the Trainer as it was, NCHW and torch's default threads.
* ``peer``: the textbook pipeline, a ``Dataset`` turning each uint8 image into a PIL image
  for torchvision's per-sample transforms, batched by ``DataLoader`` (same threads as
  ``calnotes``, so the ratio is that of the pipelines).
* ``nhwc``: (batch-norm models) the Trainer with ``channels_last=True``, opt-in because
  torch's NHWC batch norm rounds more (see the Trainer's docstring).

Then, for ``--flops-model``: the FLOPs of one step (``torch.utils.flop_counter``) over the
step time of the ``calnotes`` configuration, against the float32 matmul rate measured in
the same round (``--peak-size`` square matrices, same threads), and the step with bf16
autocast against float32 (why ``amp`` is CUDA-only). ``--compile`` adds ``torch.compile``
(compile time and the steady-state step ratio; not run by default, it takes minutes).

    python benchmarks/bench_training.py [--models lenet5:10000 resnet20:1024 resnet14:1024]
                                        [--rounds 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from _common import report
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from calnotes._threads import auto_threads, cpu_threads
from calnotes.data import load_dataset, make_loaders
from calnotes.data.sources import _import_torchvision
from calnotes.models import build_model
from calnotes.training import Trainer

BATCH = 128
LR = 0.05


def _model(name: str, splits: Any) -> nn.Module:
    torch.manual_seed(0)
    return build_model(name, splits.num_classes, splits.in_channels, splits.image_size)


def _trainer(name: str, splits: Any, **options: Any) -> Trainer:
    return Trainer(_model(name, splits), lr=LR, weight_decay=0.0, epochs=1, device="cpu",
                   progress=False, schedule="none", **options)


def calnotes_epoch(name: str, splits: Any, **options: Any) -> Callable[[], float]:
    def run() -> float:
        train, _, _ = make_loaders(splits, BATCH, device="cpu", augment=True, seed=0)
        trainer = _trainer(name, splits, **options)
        start = time.perf_counter()
        trainer.fit(train)
        return time.perf_counter() - start
    return run


def dataloader_epoch(name: str, splits: Any, threads: int) -> Callable[[], float]:
    tv = _import_torchvision()
    from PIL import Image

    transforms = tv.transforms
    pipeline = transforms.Compose([
        transforms.RandomCrop(splits.image_size, padding=2),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        transforms.Normalize(splits.mean, splits.std),
    ])
    images = splits.train.images[:, 0].numpy()  # (N, H, W) uint8, one channel
    labels = splits.train.labels

    class PerSample(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(labels)

        def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
            return pipeline(Image.fromarray(images[i], mode="L")), labels[i]

    def run() -> float:
        loader = torch.utils.data.DataLoader(PerSample(), batch_size=BATCH, shuffle=True)
        model = _model(name, splits)
        optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        with cpu_threads(threads):
            start = time.perf_counter()
            for x, y in loader:
                loss = loss_fn(model(x), y)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
            return time.perf_counter() - start
    return run


def rounds(fns: dict[str, Callable[[], float]], n_rounds: int) -> dict[str, list[float]]:
    """Seconds of each function per round, the functions in turn (after one warm-up)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for r in range(n_rounds):
        for name, fn in fns.items():
            times[name].append(fn())
        print(f"    round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()),
              flush=True)
    return times


def ratio(times: dict[str, list[float]], num: str, den: str) -> float:
    return round(statistics.median(a / b for a, b in zip(times[num], times[den], strict=True)),
                 2)


def bench_model(name: str, n: int, n_rounds: int, threads: int) -> dict[str, Any]:
    print(f"  {name} on {n} images ...", flush=True)
    splits = load_dataset("fashion_mnist", train_subset=n)
    fns = {
        "calnotes": calnotes_epoch(name, splits),
        "previous": calnotes_epoch(name, splits, channels_last=False, threads=None),
        "peer": dataloader_epoch(name, splits, threads),
    }
    batch_norm = any(isinstance(m, nn.modules.batchnorm._BatchNorm)
                     for m in _model(name, splits).modules())
    if batch_norm:
        fns["nhwc"] = calnotes_epoch(name, splits, channels_last=True)
    times = rounds(fns, n_rounds)
    images = len(splits.train)
    row: dict[str, Any] = {
        "task": f"train {name}, {images} Fashion-MNIST images x 1 epoch, batch {BATCH}, "
                "crop+flip (CPU)",
        "calnotes_images_per_s": round(images / statistics.median(times["calnotes"]), 1),
        "calnotes_layout": "NHWC" if _trainer(name, splits).channels_last else "NCHW",
        "previous": f"Trainer before: NCHW, {torch.get_num_threads()} threads",
        "previous_images_per_s": round(images / statistics.median(times["previous"]), 1),
        "speedup_over_previous": ratio(times, "previous", "calnotes"),
        "peer": "DataLoader + per-sample torchvision transforms, 0 workers",
        "peer_images_per_s": round(images / statistics.median(times["peer"]), 1),
        "speedup_over_peer": ratio(times, "peer", "calnotes"),
    }
    if batch_norm:
        row["nhwc_opt_in_images_per_s"] = round(images / statistics.median(times["nhwc"]), 1)
        row["nhwc_speedup_over_calnotes"] = ratio(times, "calnotes", "nhwc")
    row["torch_threads"] = threads
    return row


def _matmul_seconds(size: int) -> tuple[float, float]:
    a, b = torch.randn(size, size), torch.randn(size, size)
    a @ b
    start = time.perf_counter()
    a @ b
    return time.perf_counter() - start, 2.0 * size**3


def _compile_row(name: str, compiled: Trainer, eager_step: Callable[[], float],
                 x: torch.Tensor, y: torch.Tensor, n_rounds: int, threads: int) -> dict[str, Any]:
    """torch.compile's first step (compiling into an empty kernel cache, as on a fresh
    machine) and its steady-state step against the eager one."""
    before = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory() as cold:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cold
        try:
            start = time.perf_counter()
            compiled._train_step(x, y)
            first = time.perf_counter() - start

            def compiled_step() -> float:
                start = time.perf_counter()
                compiled._train_step(x, y)
                return time.perf_counter() - start

            times = rounds({"eager": eager_step, "compiled": compiled_step}, n_rounds)
        finally:
            if before is None:
                os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
            else:
                os.environ["TORCHINDUCTOR_CACHE_DIR"] = before
    return {"task": f"torch.compile of the {name} training step (CPU)",
            "compile_and_first_step_s": round(first, 1),
            "speedup_compiled_over_eager": ratio(times, "eager", "compiled"),
            "torch_threads": threads}


def bench_flops(name: str, n_rounds: int, threads: int, peak_size: int,
                compile_too: bool) -> list[dict[str, Any]]:
    print(f"  {name}: FLOP/s of a step against the matmul peak ...", flush=True)
    splits = load_dataset("fashion_mnist", train_subset=BATCH)
    trainer = _trainer(name, splits)
    x = splits.train.images.float().div(255).sub(splits.mean[0]).div(splits.std[0])
    x, y = trainer._input(x), splits.train.labels
    with cpu_threads(threads):
        with FlopCounterMode(display=False) as counter:
            trainer._train_step(x, y)
        flops = counter.get_total_flops()
        amp_model = _model(name, splits).to(memory_format=torch.channels_last
                                             if trainer.channels_last else torch.contiguous_format)
        amp_opt = torch.optim.SGD(amp_model.parameters(), lr=LR, momentum=0.9)

        def amp_step() -> float:
            start = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = amp_model(x)
            loss = nn.functional.cross_entropy(out.float(), y)
            amp_opt.zero_grad(set_to_none=True)
            loss.backward()
            amp_opt.step()
            return time.perf_counter() - start

        def step() -> float:
            start = time.perf_counter()
            trainer._train_step(x, y)
            return time.perf_counter() - start

        def peak() -> float:
            seconds, work = _matmul_seconds(peak_size)
            return seconds / work  # seconds per FLOP

        times = rounds({"step": step, "peak": peak, "amp": amp_step}, n_rounds)
        rows = [{
            "task": f"training step of {name}, batch {BATCH}, float32, "
                    f"{'NHWC' if trainer.channels_last else 'NCHW'} (CPU)",
            "gflop_per_step": round(flops / 1e9, 3),
            "ms_per_step": round(1e3 * statistics.median(times["step"]), 1),
            "achieved_gflop_per_s": round(flops / statistics.median(times["step"]) / 1e9, 1),
            "floor": f"float32 matmul {peak_size}x{peak_size}, same threads",
            "matmul_gflop_per_s": round(1 / statistics.median(times["peak"]) / 1e9, 1),
            "share_of_matmul_peak": round(statistics.median(
                flops * p / s for s, p in zip(times["step"], times["peak"], strict=True)), 3),
            "bf16_autocast_slowdown": ratio(times, "amp", "step"),
            "torch_threads": threads,
        }]
        if compile_too:
            rows.append(_compile_row(name, _trainer(name, splits, compile=True), step, x, y,
                                     n_rounds, threads))
    return rows


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="*",
                        default=["lenet5:10000", "resnet20:1024", "resnet14:1024"],
                        help="NAME:IMAGES per model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--flops-model", default="resnet20")
    parser.add_argument("--peak-size", type=int, default=2048)
    parser.add_argument("--compile", action="store_true", help="also time torch.compile")
    parser.add_argument("--json", default=None, metavar="PATH")
    args = parser.parse_args(argv)

    threads = auto_threads()
    print(f"bench_training: calnotes and peer with {threads} threads, previous with "
          f"{torch.get_num_threads()}", flush=True)
    rows = []
    for spec in args.models:
        name, _, n = spec.partition(":")
        rows.append(bench_model(name, int(n or 10000), args.rounds, threads))
    if args.flops_model:
        rows += bench_flops(args.flops_model, args.rounds, threads, args.peak_size,
                            args.compile)
    return report(rows, args, args.json, note=(
        "median over rounds, configurations in turn in each round; speedup > 1 means the "
        "calnotes defaults are faster"))


if __name__ == "__main__":
    main(sys.argv[1:])
