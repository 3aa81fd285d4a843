"""Lines of code per chapter: ``python tools/chapter_code_lines.py [CHAPTER ...]``.

For each chapter (default: every ``book/NN_*.md``) prints the number of code cells, the
lines of code in them (non-blank lines that are not only a comment), the cells longer than
15 such lines and the longest cell. Cells whose name or first comment marks them as the
hidden checks (``remove-cell`` tag and a line with ``assert``) are counted apart, since the
chapter template allows them to be long.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import jupytext

BOOK = Path(__file__).resolve().parents[1] / "book"
LONG = 15


def code_lines(source: str) -> int:
    """Non-blank lines of a cell that are not only a comment."""
    return sum(1 for line in source.splitlines()
               if line.strip() and not line.strip().startswith("#"))


def is_checks(cell: dict) -> bool:
    """A hidden cell that asserts: the chapter's checks, exempt from the length limit."""
    tags = cell.get("metadata", {}).get("tags", [])
    return "remove-cell" in tags and "assert " in cell["source"]


def measure(path: Path) -> dict[str, int]:
    notebook = jupytext.read(path, fmt="md:myst")
    cells = [c for c in notebook.cells if c.cell_type == "code"]
    body = [code_lines(c.source) for c in cells if not is_checks(c)]
    checks = [code_lines(c.source) for c in cells if is_checks(c)]
    return {"cells": len(cells), "code": sum(body) + sum(checks), "checks": sum(checks),
            "long": sum(n > LONG for n in body), "longest": max(body, default=0)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="*", help="chapter numbers (default: all)")
    args = parser.parse_args(argv)
    paths = sorted(BOOK.glob("[0-9][0-9]_*.md"))
    if args.chapters:
        paths = [p for p in paths if p.name[:2] in {c.zfill(2) for c in args.chapters}]
        if not paths:
            print(f"error: no chapter among {args.chapters}", file=sys.stderr)
            return 2
    print(f"{'chapter':34} {'cells':>5} {'code':>5} {'checks':>6} {'>15':>4} {'longest':>7}")
    for path in paths:
        m = measure(path)
        print(f"{path.stem:34} {m['cells']:5d} {m['code']:5d} {m['checks']:6d} "
              f"{m['long']:4d} {m['longest']:7d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
