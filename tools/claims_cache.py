"""Keep the stored claims cache (``results/.claims-cache/``) in step with its inputs.

A chapter's cache entry is keyed by everything its evaluation reads: the claims file and
its commit, the library's source and the stored runs under the chapter's labels
(``calnotes.book.claims.cache_entry``). A commit that adds runs or changes the library leaves
the old entry unmatched, and the book then evaluates the chapter while it builds: minutes
per chapter, which a cell timeout does not allow. Run this before such a commit (but after
committing a changed claims file: its commit is part of the key)::

    python tools/claims_cache.py            # evaluate each chapter without a fresh entry,
                                            # then delete the entries nothing matches
    python tools/claims_cache.py --jobs 2   # two chapters at a time
    python tools/claims_cache.py --check    # list what is missing or stale; exit 1 if any

Each evaluation runs in its own process (``python -m calnotes claims NN --json``), which
writes its entry; an entry is deleted only once every chapter has a fresh one.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from calnotes.book import claims as bc  # noqa: E402
from calnotes.runs.store import RunStore  # noqa: E402


def fresh_names(store: RunStore) -> dict[str, str]:
    """``{chapter: file name}`` of the entry each chapter's present inputs would read."""
    return {ch: bc.cache_entry(ch, store)[0].name for ch in bc._chapters()}


def _evaluate(chapter: str, root: Path) -> tuple[str, int, str]:
    """``python -m calnotes claims NN --json`` in a process of its own, which writes the
    entry; returns the chapter, the exit status and the end of its error output."""
    done = subprocess.run([sys.executable, "-m", "calnotes", "claims", chapter, "--json"],
                          cwd=REPO, capture_output=True, text=True,
                          env={**os.environ, "CALNOTES_RESULTS": str(root)})
    return chapter, done.returncode, done.stderr[-2000:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="only list missing and stale entries; exit 1 if there are any")
    parser.add_argument("--jobs", type=int, default=1, help="chapters evaluated at once")
    parser.add_argument("--root", default=None,
                        help="the run store (default: $CALNOTES_RESULTS, else results/)")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be at least 1, got {args.jobs}")
    store = RunStore(args.root)
    folder = store.root / bc.CACHE_DIR
    names = fresh_names(store)
    missing = [ch for ch, name in names.items() if not (folder / name).is_file()]
    stale = sorted(p.name for p in folder.glob("*.json") if p.name not in names.values())
    print(f"chapters without a fresh entry: {' '.join(missing) or 'none'}")
    print(f"stale entries: {' '.join(stale) or 'none'}")
    if args.check:
        return 1 if missing or stale else 0
    with ThreadPoolExecutor(args.jobs) as pool:
        done = list(pool.map(_evaluate, missing, [store.root] * len(missing)))
    failed = [(ch, rc, err) for ch, rc, err in done if rc]
    for ch, rc, err in failed:
        print(f"chapter {ch}: evaluation failed (exit {rc})\n{err}", file=sys.stderr)
    still = [ch for ch, name in fresh_names(store).items() if not (folder / name).is_file()]
    if failed or still:
        print(f"no entry written for: {' '.join(still)}; stale entries kept", file=sys.stderr)
        return 1
    for name in stale:
        (folder / name).unlink()
    print(f"evaluated: {' '.join(missing) or 'none'}; deleted {len(stale)} stale entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
