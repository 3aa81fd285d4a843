"""Store the per-sample test gamma of chapter 5's FLγ-SECE runs (arm ``FLgamma-SECE-0``).

The stored runs keep logits, not weights: each run is trained again and gamma-Net's gamma
on every test image is stored in the run's folder with the retrained network's test logits
(:func:`calnotes.runs.gamma.run_test_gamma`; whether they reproduce the stored ones is
printed). Seeds default to
the arm's; a stored gamma is not recomputed::

    PYTHONPATH=$PWD OMP_NUM_THREADS=1 nohup .venv/bin/python tools/ch05_gamma.py \\
        > ch05_gamma.log 2>&1 &
"""

from __future__ import annotations

import argparse
import sys
import time

from calnotes.book.claims import claims_path
from calnotes.runs.claims import arm_runs
from calnotes.runs.gamma import run_test_gamma

ARM = "FLgamma-SECE-0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arm", default=ARM, help="an arm of book/claims/05.yaml")
    args = parser.parse_args(argv)
    for seed, run in arm_runs(claims_path("05"), args.arm).items():
        start = time.perf_counter()
        out = run_test_gamma(run, device="cpu")
        print(f"{run.path.name} seed {seed}: gamma mean {float(out.gamma.mean()):.3f}, std "
              f"{float(out.gamma.std()):.3f}; the network reproduces the stored logits: "
              f"{out.reproduces} (largest difference {out.max_logit_diff:.3g}) "
              f"({time.perf_counter() - start:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
