"""The fast path's equivalence pilot: bfloat16 autocast + channels_last against float32.

The declaration (regimes, seeds, measures, margins, test) is ``benchmarks/fast_path_pilot.yaml``,
committed before any pilot run. This script

* ``margins``: recomputes each margin from the exploratory runs the declaration names
  (``fraction`` x the seed standard deviation of the measure) and prints them;
* ``run``: trains the pilot's runs through the executor into the store (label
  ``pilot_fast_path``), one at a time, in the declared order (the ResNet-14 pairs, then the
  meta pairs; within a seed float32 first). Stored runs are skipped and a killed run resumes
  from its checkpoint, so the command can simply be started again::

      OMP_NUM_THREADS=1 PYTHONPATH=$PWD nohup .venv/bin/python tools/fast_path_pilot.py run \\
          > pilot.log 2>&1 &

* ``table``: the equivalence table of the runs stored so far.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from calnotes.runs.claims import arm_runs
from calnotes.runs.executor import execute
from calnotes.runs.store import RunNotFound, RunStore
from calnotes.training.pilot import (
    load_declaration,
    margin_from_sd,
    pilot_configs,
    pilot_table,
    run_measures,
)

ROOT = Path(__file__).resolve().parent.parent
DECLARATION = ROOT / "benchmarks" / "fast_path_pilot.yaml"


def exploratory_margins(decl: dict[str, Any]) -> dict[str, dict[str, tuple[float, float]]]:
    """``{regime: {measure: (seed sd, margin)}}`` from the declared exploratory runs."""
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for regime, spec in decl["regimes"].items():
        runs = arm_runs(ROOT / spec["exploratory"]["claims"], spec["exploratory"]["arm"])
        rows = [run_measures(r.test_logits, r.test_labels, r.history.to_dict())
                for _, r in sorted(runs.items())]
        out[regime] = {}
        for m in spec["measures"]:
            margin = margin_from_sd([row[m] for row in rows], decl["margin_fraction"])
            out[regime][m] = (margin / decl["margin_fraction"], margin)
    return out


def stored(store: RunStore, config: dict[str, Any]) -> Any:
    """The stored run of ``config``, or ``None``."""
    try:
        return store.load(config)
    except RunNotFound:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=("margins", "run", "table"))
    args = parser.parse_args(argv)
    decl = load_declaration(DECLARATION)
    if args.command == "margins":
        for regime, values in exploratory_margins(decl).items():
            for m, (sd, margin) in values.items():
                print(f"{regime:20s} {m:18s} seed sd {sd:.6g}  margin {margin:.6g}")
        return 0
    if args.command == "table":
        store = RunStore()
        for row in pilot_table(decl, lambda cfg: stored(store, cfg)):
            print(row)
        return 0
    torch.set_num_threads(1)  # one core per run: the other is kept for other training
    for regime, seed, arm, cfg in pilot_configs(decl):
        print(f"{regime} seed {seed} {arm}", flush=True)
        execute([cfg], label=decl["label"], device="cpu", backend="sequential")
    return 0


if __name__ == "__main__":
    sys.exit(main())
