"""Training throughput: calnotes Trainer vs a plain PyTorch loop with a DataLoader.

Both train the same model on the same Fashion-MNIST images with the same batch size,
optimizer and augmentation (random crop with padding 2, horizontal flip, normalization).
The peer is the textbook pipeline: a ``Dataset`` that turns each uint8 image into a PIL
image and runs torchvision's per-sample transforms, batched by ``DataLoader``. calnotes keeps
the whole uint8 tensor on the device and augments whole batches with tensor ops.

    python benchmarks/bench_training.py [--model lenet5] [--n 10000] [--epochs 1]
                                        [--device auto] [--workers 0] [--json out.json]
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

import torch
from _common import report, sync
from torch import nn

from calnotes.data import load_dataset, make_loaders
from calnotes.data.sources import _import_torchvision
from calnotes.models import build_model
from calnotes.training import Trainer, select_device


def time_calnotes(splits: Any, model_name: str, batch_size: int, epochs: int,
                  device: torch.device) -> float:
    train, _, _ = make_loaders(splits, batch_size, device=device, augment=True, seed=0)
    torch.manual_seed(0)
    model = build_model(model_name, splits.num_classes, splits.in_channels, splits.image_size)
    trainer = Trainer(model, lr=0.05, weight_decay=0.0, epochs=epochs, device=device,
                      progress=False, schedule="none")
    sync(device)
    start = time.perf_counter()
    trainer.fit(train)
    sync(device)
    return time.perf_counter() - start


def time_dataloader(splits: Any, model_name: str, batch_size: int, epochs: int,
                    device: torch.device, workers: int) -> float:
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

    loader = torch.utils.data.DataLoader(PerSample(), batch_size=batch_size, shuffle=True,
                                         num_workers=workers, pin_memory=device.type == "cuda")
    torch.manual_seed(0)
    model = build_model(model_name, splits.num_classes, splits.in_channels,
                        splits.image_size).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    sync(device)
    start = time.perf_counter()
    for _ in range(epochs):
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            loss = loss_fn(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
    sync(device)
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--n", type=int, default=10000, help="training images")
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--workers", type=int, default=0, help="DataLoader workers (peer)")
    parser.add_argument("--json", default=None, metavar="PATH")
    args = parser.parse_args(argv)

    device = select_device(args.device)
    splits = load_dataset("fashion_mnist", train_subset=args.n)
    images = len(splits.train) * args.epochs
    ours = time_calnotes(splits, args.model, args.batch_size, args.epochs, device)
    peer = time_dataloader(splits, args.model, args.batch_size, args.epochs, device,
                           args.workers)
    rows = [{
        "task": f"train {args.model}, {len(splits.train)} Fashion-MNIST images x {args.epochs} "
                f"epoch(s), batch {args.batch_size}, crop+flip ({device.type})",
        "calnotes_images_per_s": round(images / ours, 1),
        "peer": f"DataLoader + per-sample torchvision transforms, {args.workers} workers",
        "peer_images_per_s": round(images / peer, 1),
        "speedup_calnotes_over_peer": round(peer / ours, 2),
        "torch_threads": torch.get_num_threads(),
    }]
    return report(rows, args, args.json)


if __name__ == "__main__":
    main(sys.argv[1:])
