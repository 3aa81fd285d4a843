"""Meta-regularization overhead: one FLgamma-SECE epoch against one cross-entropy epoch.

Both train the same model from the same initialization on the same Fashion-MNIST batches,
with the same validation pass at the end of the epoch. The FLgamma-SECE epoch adds, per
step, gamma-Net, the look-ahead step of the classifier head, a forward of one validation
batch and the SECE hypergradient, and per epoch the gamma statistics. Epochs alternate
(CE, meta, CE, meta, ...) so a slow spell of the machine hits both; the ratio of the
medians is reported, with the smallest and largest ratio of one pair.

    python benchmarks/bench_meta.py [--model resnet14] [--n 10000] [--repeats 5]
                                    [--device auto] [--json out.json]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any

import torch
from _common import report, sync

from calnotes.data import load_dataset, make_loaders
from calnotes.models import build_model
from calnotes.training import Trainer, select_device
from calnotes.training.meta import GammaNet, MetaTrainer


def _epoch_seconds(trainer: Trainer, fit_args: tuple, device: torch.device) -> float:
    sync(device)
    start = time.perf_counter()
    trainer.fit(*fit_args)
    sync(device)
    return time.perf_counter() - start


def time_epochs(splits: Any, model_name: str, batch_size: int, repeats: int,
                device: torch.device, amp: bool) -> dict[str, list[float]]:
    """Seconds of ``repeats`` single CE epochs and as many FLgamma-SECE epochs, alternating."""
    train, val, _ = make_loaders(splits, batch_size, device=device, augment=False, seed=0)
    times: dict[str, list[float]] = {"ce": [], "meta": []}
    options = dict(lr=0.05, weight_decay=0.0, epochs=1, device=device, progress=False,
                   amp=amp and device.type == "cuda")
    for _ in range(repeats):
        torch.manual_seed(0)
        model = build_model(model_name, splits.num_classes, splits.in_channels, splits.image_size)
        times["ce"].append(_epoch_seconds(Trainer(model, **options), (train, val), device))
        torch.manual_seed(0)
        model = build_model(model_name, splits.num_classes, splits.in_channels, splits.image_size)
        meta = MetaTrainer(model, GammaNet(model.head.in_features), outer="sece", **options)
        times["meta"].append(_epoch_seconds(meta, (train, val), device))
    return times


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="resnet14")
    parser.add_argument("--n", type=int, default=10000, help="training images")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--amp", action="store_true", help="bfloat16 autocast (CUDA only)")
    parser.add_argument("--json", default=None, metavar="PATH")
    args = parser.parse_args(argv)

    device = select_device(args.device)
    splits = load_dataset("fashion_mnist", val_size=5000, train_subset=args.n)
    times = time_epochs(splits, args.model, args.batch_size, args.repeats, device, args.amp)
    ce, meta = statistics.median(times["ce"]), statistics.median(times["meta"])
    pairs = [m / c for c, m in zip(times["ce"], times["meta"], strict=True)]
    rows = [{
        "task": f"one epoch of {args.model} on {len(splits.train)} Fashion-MNIST images + "
                f"validation on {len(splits.val)}, batch {args.batch_size} ({device.type}"
                f"{', bf16' if args.amp and device.type == 'cuda' else ''})",
        "flgamma_sece_s": round(meta, 2),
        "peer": "cross-entropy epoch, same model, data and validation",
        "ce_s": round(ce, 2),
        "overhead_meta_over_ce": round(meta / ce, 2),
        "pair_ratio_min": round(min(pairs), 2),
        "pair_ratio_max": round(max(pairs), 2),
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
    }]
    return report(rows, args, args.json, times=times)


if __name__ == "__main__":
    main(sys.argv[1:])
