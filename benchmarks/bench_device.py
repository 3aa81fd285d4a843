"""How well a training step uses the device, and how long a model takes to become useful.

1. Achieved FLOP/s of one Trainer step (forward, backward, SGD update; FLOPs counted by
   ``torch.utils.flop_counter``) against the device's peak: the dense bf16 tensor-core
   peak of known NVIDIA GPUs (bf16 autocast on CUDA unless ``--no-amp``). No peak is
   known for CPUs, so there the figure is the achieved rate alone.
2. Time to reach a fixed test accuracy on Fashion-MNIST: the Trainer trains epoch by epoch
   and the test accuracy is checked after each one (evaluation time included).

    python benchmarks/bench_device.py [--model resnet20] [--device auto] [--no-amp]
                                      [--target 0.9] [--max-epochs 15] [--json out.json]

Defaults follow the device: on CUDA ResNet-20 with bf16 and a 90% target on all 55,000
training images; on a CPU LeNet-5 on 10,000 images to 85% (the CPU run is a check of the
code path, the figures that matter are the CUDA ones).
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch
from _common import report, sync
from torch.utils.flop_counter import FlopCounterMode

from calnotes.data import load_dataset, make_loaders
from calnotes.models import build_model
from calnotes.training import Trainer, predict_logits, select_device

#: Dense bf16 tensor-core peak, TFLOP/s (vendor data sheets; SXM parts).
BF16_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0}


def peak_tflops(device: torch.device) -> float | None:
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((v for k, v in BF16_PEAK_TFLOPS.items() if k in name), None)



def step_rate(trainer: Trainer, x: torch.Tensor, y: torch.Tensor, steps: int) -> dict[str, float]:
    """FLOPs of one step (counted once) and the seconds per step (the mean over
    ``steps`` timed steps after 3 warm-up steps)."""
    with FlopCounterMode(display=False) as counter:
        trainer._train_step(x, y)
    flops = counter.get_total_flops()
    for _ in range(3):
        trainer._train_step(x, y)
    sync(trainer.device)
    start = time.perf_counter()
    for _ in range(steps):
        trainer._train_step(x, y)
    sync(trainer.device)
    seconds = (time.perf_counter() - start) / steps
    return {"flops_per_step": flops, "seconds_per_step": seconds}


class _Reached(Exception):
    """Raised by the epoch callback to stop training once the target is reached."""


def time_to_accuracy(splits: Any, model_name: str, batch_size: int, target: float,
                     max_epochs: int, device: torch.device, amp: bool) -> dict[str, Any]:
    """Wall time (training and the per-epoch test evaluations) until the test accuracy
    first reaches ``target``; ``None`` if ``max_epochs`` epochs do not get there."""
    train, _, test = make_loaders(splits, batch_size, device=device, augment=False, seed=0)
    torch.manual_seed(0)
    model = build_model(model_name, splits.num_classes, splits.in_channels, splits.image_size)
    result: dict[str, Any] = {"epochs": None, "seconds": None, "test_acc": []}
    start = time.perf_counter()

    def check(epoch: int, _trainer: Trainer, record: dict) -> None:
        logits, labels = predict_logits(model, test)
        result["test_acc"].append(float((logits.argmax(1) == labels).double().mean()))
        if result["test_acc"][-1] >= target:
            sync(device)
            result["epochs"], result["seconds"] = epoch, time.perf_counter() - start
            raise _Reached

    trainer = Trainer(model, lr=0.05, weight_decay=5e-4, epochs=max_epochs, device=device,
                      amp=amp, progress=False, schedule="cosine", epoch_callback=check)
    try:
        trainer.fit(train)
    except _Reached:
        pass
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--n", type=int, default=None, help="training images (0 = all)")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--no-amp", action="store_true",
                        help="float32 on CUDA (default there: bfloat16 autocast)")
    parser.add_argument("--target", type=float, default=None, help="test accuracy to reach")
    parser.add_argument("--max-epochs", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20, help="timed steps for the FLOP rate")
    parser.add_argument("--json", default=None, metavar="PATH")
    args = parser.parse_args(argv)

    device = select_device(args.device)
    on_cuda = device.type == "cuda"
    model_name = args.model or ("resnet20" if on_cuda else "lenet5")
    n = args.n if args.n is not None else (0 if on_cuda else 10000)
    target = args.target if args.target is not None else (0.9 if on_cuda else 0.85)
    amp = on_cuda and not args.no_amp

    splits = load_dataset("fashion_mnist", val_size=5000, train_subset=n or None)
    train, _, _ = make_loaders(splits, args.batch_size, device=device, augment=False, seed=0)
    x, y = next(iter(train))
    torch.manual_seed(0)
    model = build_model(model_name, splits.num_classes, splits.in_channels, splits.image_size)
    trainer = Trainer(model, lr=0.05, epochs=1, device=device, amp=amp, progress=False)
    rate = step_rate(trainer, x.to(device), y.to(device), args.steps)
    achieved = rate["flops_per_step"] / rate["seconds_per_step"] / 1e12
    peak = peak_tflops(device)
    reach = time_to_accuracy(splits, model_name, args.batch_size, target, args.max_epochs,
                             device, amp)
    label = f"{model_name}, batch {args.batch_size}, {device.type}{', bf16' if amp else ''}"
    rows = [
        {"task": f"training step of {label}",
         "gflop_per_step": round(rate["flops_per_step"] / 1e9, 3),
         "ms_per_step": round(1000 * rate["seconds_per_step"], 2),
         "achieved_tflops": round(achieved, 4),
         "peak_bf16_tflops": peak,
         "share_of_peak": None if peak is None else round(achieved / peak, 4)},
        {"task": f"{label}: epochs to {target:.0%} test accuracy on {len(splits.train)} "
                 "Fashion-MNIST images",
         "epochs_to_target": reach["epochs"],
         "seconds_to_target": None if reach["seconds"] is None else round(reach["seconds"], 1),
         "last_test_acc": round(reach["test_acc"][-1], 4),
         "max_epochs": args.max_epochs},
    ]
    return report(rows, args, args.json)


if __name__ == "__main__":
    main(sys.argv[1:])
