"""Prediction: :func:`predict_logits` (always float32), :func:`eval_mode` and the batch
helpers the trainers share."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

from calnotes._checks import model_device
from calnotes.training.devices import select_device
from calnotes.training.fast_path import _autocast

__all__ = ["eval_mode", "predict_logits"]


def _iter_batches(loader: Iterable, name: str) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    for batch in loader:
        if not isinstance(batch, (tuple, list)) or len(batch) != 2:
            raise ValueError(f"{name} must yield (x, y) pairs, got {type(batch).__name__}")
        x, y = batch
        if not isinstance(x, torch.Tensor) or not isinstance(y, torch.Tensor):
            raise TypeError(f"{name} must yield torch tensors (x, y)")
        yield x, y


@contextmanager
def eval_mode(model: nn.Module) -> Iterator[nn.Module]:
    """``model`` in eval mode inside the block; its previous train/eval mode afterwards."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def _batch_input(x: torch.Tensor, device: torch.device, channels_last: bool) -> torch.Tensor:
    """A batch of inputs on ``device``, NHWC (``channels_last``) when the model is."""
    x = x.to(device, non_blocking=True)
    if channels_last and x.ndim == 4:
        x = x.contiguous(memory_format=torch.channels_last)
    return x


def _collect_logits(
    forward: Callable[[torch.Tensor], torch.Tensor],
    loader: Iterable,
    device: torch.device,
    *,
    amp: bool = False,
    channels_last: bool = False,
    name: str = "loader",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Concatenated float32 logits and int64 labels, left on ``device``."""
    chunks, labels = [], []
    with torch.no_grad():
        for x, y in _iter_batches(loader, name):
            x = _batch_input(x, device, channels_last)
            with _autocast(device, amp):
                out = forward(x)
            chunks.append(out.float())
            labels.append(y.to(device, non_blocking=True).long())
    if not chunks:
        raise ValueError(f"{name} yielded no batches")
    return torch.cat(chunks), torch.cat(labels)


def predict_logits(
    model: nn.Module, loader: Iterable, device: str | torch.device | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of ``model`` on every batch of ``loader``.

    Runs in eval mode without gradients and restores the model's previous mode. ``device``
    (default: where the model's parameters are) is where batches are moved. Only loaders
    are accepted; wrap raw images in a loader (see ``calnotes.data.make_loaders``).

    Returns ``(logits float32 (N, C), labels int64 (N,))``, both on the CPU.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    dev = model_device(model) if device is None else select_device(device)
    with eval_mode(model):
        logits, labels = _collect_logits(model, loader, dev,
                                         channels_last=_is_channels_last(model))
    if logits.ndim != 2:
        raise ValueError(f"model must output (B, C) logits, got shape {tuple(logits.shape[1:])}")
    return logits.cpu(), labels.cpu()


def _is_channels_last(model: nn.Module) -> bool:
    """Whether the model's 4-d weights (its 2-d convolutions) are stored NHWC."""
    weights = [p for p in model.parameters() if p.ndim == 4]
    return all(p.is_contiguous(memory_format=torch.channels_last) for p in weights) and any(
        not p.is_contiguous() for p in weights  # one input channel: both layouts agree
    )
