"""Store how long each page took to execute in the last test run and book build.

``python tools/chapter_times.py [--junit _build/smoke-junit.xml]
[--cache _build/.jupyter_cache] [--out book/chapter_times.json]``

Run after ``make test`` (whose nbval step writes the JUnit report of the SMOKE cells) and
``make book`` (whose execution cache records each page's time at the book's parameters),
on an otherwise idle machine: the pages' "In this chapter" boxes quote these times with
the machine and date recorded here.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from calnotes.book import timings  # noqa: E402
from calnotes.runs.store import git_commit  # noqa: E402
from calnotes.training.devices import cpu_features  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--junit", default=str(REPO / "_build" / "smoke-junit.xml"))
    ap.add_argument("--cache", default=str(REPO / "_build" / ".jupyter_cache"))
    ap.add_argument("--out", default=str(timings.TIMES_PATH))
    args = ap.parse_args()
    try:
        smoke = timings.smoke_times_from_junit(args.junit)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        book = timings.book_times_from_cache(args.cache)
    except ValueError as err:  # the book not built here: its times stay unmeasured
        print(f"warning: {err}; the times at the book's parameters are not recorded",
              file=sys.stderr)
        book = {}
    features = cpu_features()
    machine = {"cpu_model": features["cpu_model"], "cores": os.cpu_count(),
               "torch_cpu_capability": features["torch_cpu_capability"],
               "commit": git_commit()}
    path = timings.write_times(smoke, book, machine, args.out)
    for page in sorted(set(smoke) | set(book)):
        print(f"{page:40s} SMOKE {smoke.get(page, float('nan')):8.1f} s   "
              f"book {book.get(page, float('nan')):8.1f} s")
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
