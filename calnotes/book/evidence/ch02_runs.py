"""The stored runs chapter 2's claims read (``book/claims/02.yaml``), as configs.

``python -m calnotes.book.evidence.ch02_runs`` trains those the store lacks, most important
first, one thread (``compute_runs``); a killed run resumes from its checkpoint.
"""

from __future__ import annotations

from typing import Any

from calnotes.runs.experiment import default_config

WEIGHT_DECAY_GRID = (0.0, 0.0005, 0.005)  # the grid both networks choose from
SEEDS = (0, 1, 2, 3, 4)
CH01_SEEDS = (0, 1, 2)


def sweep_config(model: str = "resnet8", seed: int = 0, weight_decay: float = 0.0,
                 width: int = 16, batch_norm: bool = True) -> dict[str, Any]:
    """Chapter 2's sweep regime: 2,000 training and 1,000 validation images, 20 epochs."""
    options = {} if model == "lenet5" else {"width": width, "batch_norm": batch_norm}
    return default_config(
        dataset="fashion_mnist", model=model, model_options=options, epochs=20,
        batch_size=64, lr=0.05, schedule="cosine", weight_decay=weight_decay, augment=False,
        seed=seed, val_size=1000, train_subset=2000, test_subset=None)


def ch01_config(seed: int = 0) -> dict[str, Any]:
    """Chapter 1's LeNet-5: all 55,000 training images, 30 epochs, no weight decay."""
    return default_config(dataset="fashion_mnist", model="lenet5", epochs=30,
                          weight_decay=0.0, lr=0.05, seed=seed, train_subset=None,
                          test_subset=None)


def claim_runs() -> list[tuple[str, dict[str, Any]]]:
    """(label, config) of every run the claims read, most important first."""
    runs: list[tuple[str, dict[str, Any]]] = []
    for seed in SEEDS:  # Figure 1 (same way and tuned) and weight decay
        for wd in WEIGHT_DECAY_GRID:
            runs.append(("ch02_diagnosing", sweep_config("lenet5", seed, wd)))
            runs.append(("ch02_diagnosing", sweep_config("resnet8", seed, wd)))
    runs += [("ch01_measuring", ch01_config(seed)) for seed in CH01_SEEDS]
    for seed in SEEDS:  # width and batch normalization
        runs.append(("ch02_diagnosing", sweep_config("resnet8", seed, width=4)))
        runs.append(("ch02_diagnosing", sweep_config("resnet8", seed, batch_norm=False)))
    runs += [("ch02_diagnosing", sweep_config("resnet14", seed)) for seed in SEEDS]
    return runs


def main() -> None:
    from calnotes.runs.executor import compute_runs

    for label, config in claim_runs():
        compute_runs([config], label=label, workers=1, device="cpu")


if __name__ == "__main__":
    main()
