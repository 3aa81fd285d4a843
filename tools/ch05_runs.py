"""Compute every run of chapter 5 (meta-regularization), most important first.

Executes ``book/05_meta_regularization.md`` as a notebook at the book's parameters (or
those given with ``-p NAME VALUE``). The chapter trains each run it does not find in the
store and stores it (``results/``, or ``$CALNOTES_RESULTS``), in this order: the regime's
pilot (cross-entropy, first seed, at every candidate learning rate), then every seed of
FLγ-SECE, CE, CE-DECE, FLγ-DECE and the fixed-gamma focal losses, then FLSD-53, label
smoothing, mixup and MMCE. A killed run resumes from its last epoch's checkpoint when the
script is started again; stored runs are loaded, not trained. Every finished run prints
one line. When all runs are stored the chapter goes on to its tables and checks the
prose's claims; a claim that fails there stops it with the claim named (the runs stay
stored). The executed notebook goes to ``--out`` (default ``_build/runs``)::

    PYTHONPATH=$PWD nohup .venv/bin/python tools/ch05_runs.py > ch05_runs.log 2>&1 &
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from pathlib import Path

from calnotes.book.chapters import REPO_ROOT, parse_value, run_chapter

CHAPTER = "05"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[],
                        metavar=("NAME", "VALUE"), help="a chapter parameter")
    parser.add_argument("--out", default=str(REPO_ROOT / "_build" / "runs"),
                        help="folder of the executed notebook")
    args = parser.parse_args(argv)
    params = {name: parse_value(value) for name, value in args.parameter}
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s",
                        stream=sys.stdout)
    start = time.perf_counter()
    try:
        out = run_chapter(CHAPTER, params, Path(args.out), progress=False, log_output=True)
    except (TypeError, ValueError) as err:  # parameters rejected before anything ran
        print(f"error: {err}", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - a failed cell: report it, the runs stay stored
        print(f"chapter {CHAPTER} stopped after {time.perf_counter() - start:.0f} s: "
              f"{type(err).__name__}: {err}", flush=True)
        return 1
    print(f"chapter {CHAPTER} done in {time.perf_counter() - start:.0f} s: {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
