"""Temperature-scaling fit time: calnotes (torch L-BFGS) vs a plain scipy scalar search.

Both fit one temperature to the same ``N x C`` float32 logits (labels drawn from
``softmax(z / 2)``) by minimizing the mean NLL in float64:

* calnotes: ``TemperatureScaling().fit`` (input checks, float64 copy, L-BFGS over log T);
* peer: ``scipy.optimize.minimize_scalar(method="bounded")`` over T in [1e-2, 1e3] of a
  numpy NLL ``mean(logsumexp(z / T) - z_y / T)`` (the float64 copy is timed too).

Times are the best of ``--repeats`` runs after one untimed warm-up fit (the first
``torch.optim`` use in a process imports ``torch._dynamo``, a one-time cost reported as
``cold_s``). The target is < 1 s for 10,000 x 100 on a CPU.

    python benchmarks/bench_calibrators.py [--n 10000] [--classes 100] [--json]
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
from scipy.optimize import minimize_scalar
from scipy.special import logsumexp

from calnotes.calibrators import TemperatureScaling

TARGET_S = 1.0


def scipy_temperature(logits: np.ndarray, labels: np.ndarray) -> float:
    """Peer: bounded Brent search over T of the float64 numpy NLL."""
    z = logits.astype(np.float64)
    picked = z[np.arange(z.shape[0]), labels]

    def nll(t: float) -> float:
        return float(np.mean(logsumexp(z / t, axis=1) - picked / t))

    res = minimize_scalar(nll, bounds=(1e-2, 1e3), method="bounded", options={"xatol": 1e-6})
    return float(res.x)


def _best_of(fn: Callable[[], Any], repeats: int) -> tuple[float, Any]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=10_000, help="number of samples")
    parser.add_argument("--classes", type=int, default=100, help="number of classes")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs (best is kept)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: as is)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    g = torch.Generator().manual_seed(args.seed)
    z = 3.0 * torch.randn(args.n, args.classes, generator=g)
    y = torch.multinomial(torch.softmax(z / 2.0, dim=1), 1, generator=g)[:, 0]
    z_np, y_np = z.numpy(), y.numpy()

    start = time.perf_counter()
    TemperatureScaling().fit(z[:100], y[:100])  # warm-up: pays the one-time imports
    cold = time.perf_counter() - start

    ours_s, ours = _best_of(lambda: TemperatureScaling().fit(z, y), args.repeats)
    peer_s, peer_t = _best_of(lambda: scipy_temperature(z_np, y_np), args.repeats)
    row = {
        "task": f"temperature fit {args.n}x{args.classes} (CPU)",
        "calnotes_s": round(ours_s, 4),
        "peer": "scipy minimize_scalar (numpy NLL)",
        "peer_s": round(peer_s, 4),
        "ratio_calnotes_over_peer": round(ours_s / peer_s, 3),
        "T_calnotes": round(ours.temperature_, 5),
        "T_peer": round(peer_t, 5),
        "cold_s": round(cold, 3),
        "target_s": TARGET_S,
        "meets_target": ours_s < TARGET_S,
        "torch_threads": torch.get_num_threads(),
    }
    result = {"rows": [row]}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"{row['task']}: calnotes {ours_s:.3f} s (T = {ours.temperature_:.4f}), "
            f"scipy {peer_s:.3f} s (T = {peer_t:.4f}); ratio {row['ratio_calnotes_over_peer']} "
            f"(< 1 means calnotes is faster); target < {TARGET_S} s: "
            f"{'met' if row['meets_target'] else 'MISSED'}; first fit in process {cold:.2f} s; "
            f"{row['torch_threads']} torch threads"
        )
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
