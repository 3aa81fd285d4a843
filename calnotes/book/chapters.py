"""Run the book's chapters as notebooks: with parameters, in SMOKE mode, or to fill results/.

Chapters are MyST-markdown notebooks (``book/NN_slug.md``). Papermill cannot read them
directly, so each is converted with jupytext first; the cell tagged ``parameters`` holds
literals only, which lets us check the parameters a user passes before anything runs.

Command line (``python -m calnotes.book ...``)::

    list                                    chapters and their parameters
    run CHAPTER [-p NAME VALUE ...]         execute one chapter into _build/runs/
    smoke OUT_DIR                           write every chapter as .ipynb with SMOKE=True
    results [-p NAME VALUE ...]             execute every chapter at default scale
"""

from __future__ import annotations

import argparse
import ast
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
BOOK_DIR = REPO_ROOT / "book"


def chapter_paths(book_dir: Path = BOOK_DIR) -> list[Path]:
    """Every chapter, in order: ``book/NN_slug.md``."""
    return sorted(p for p in book_dir.glob("[0-9][0-9]_*.md"))


def resolve_chapter(name: str, book_dir: Path = BOOK_DIR) -> Path:
    """Find a chapter by file name, stem, number (``01``) or slug (``measuring_calibration``)."""
    if not isinstance(name, str) or not name:
        raise TypeError(f"chapter must be a non-empty string, got {name!r}")
    candidates = chapter_paths(book_dir)
    for path in candidates:
        if name in (path.name, path.stem, path.stem[:2], path.stem[3:]):
            return path
    listing = ", ".join(p.stem for p in candidates) or "(none)"
    raise ValueError(f"unknown chapter {name!r}; chapters are: {listing}")


def read_chapter(path: Path) -> Any:
    """The chapter as an in-memory notebook (jupytext, MyST format)."""
    import jupytext

    return jupytext.read(path, fmt="md:myst")


def parameters_of(notebook: Any) -> dict[str, Any]:
    """Names and default values of the cell tagged ``parameters`` (literals only)."""
    for cell in notebook.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            params: dict[str, Any] = {}
            for node in ast.parse(cell.source).body:
                if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                        and isinstance(node.targets[0], ast.Name)):
                    raise ValueError("the parameters cell may hold only `NAME = literal` lines")
                params[node.targets[0].id] = ast.literal_eval(node.value)
            return params
    raise ValueError("this chapter has no cell tagged 'parameters'")


def parse_value(text: str) -> Any:
    """Read a command-line value as a Python literal when it is one, else as a string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def check_parameters(defaults: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """Reject unknown names and values whose type does not match the default's.

    An int given for a float parameter becomes a float (``-p WEIGHT_DECAY 0`` is ``0.0``),
    so the runs it configures are the ones the default spelling names.
    """
    unknown = sorted(set(given) - set(defaults))
    if unknown:
        raise ValueError(
            f"unknown parameter(s) {', '.join(unknown)}; this chapter takes: "
            + ", ".join(f"{k}={v!r}" for k, v in defaults.items())
        )
    for name, value in given.items():
        default = defaults[name]
        if default is None:
            continue
        ok = (
            isinstance(value, bool) if isinstance(default, bool)
            else isinstance(value, (int, float)) and not isinstance(value, bool)
            if isinstance(default, float)
            else isinstance(value, int) and not isinstance(value, bool)
            if isinstance(default, int)
            else isinstance(value, type(default))
        )
        if not ok:
            raise ValueError(
                f"parameter {name} expects {type(default).__name__} (default {default!r}), "
                f"got {value!r}"
            )
    return {name: float(value) if isinstance(defaults[name], float) else value
            for name, value in given.items()}


def run_chapter(
    name: str,
    parameters: dict[str, Any] | None = None,
    out_dir: Path = REPO_ROOT / "_build" / "runs",
    *,
    prepare_only: bool = False,
    progress: bool = True,
) -> Path:
    """Execute one chapter with papermill; returns the path of the output notebook."""
    import papermill

    path = resolve_chapter(name)
    notebook = read_chapter(path)
    params = check_parameters(parameters_of(notebook), dict(parameters or {}))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "" if prepare_only else "-" + time.strftime("%Y%m%d-%H%M%S")
    out_path = out_dir / f"{path.stem}{suffix}.ipynb"
    papermill.execute_notebook(
        notebook, str(out_path), parameters=params, cwd=str(path.parent),
        kernel_name="python3", prepare_only=prepare_only, progress_bar=progress,
    )
    return out_path


def _collect(pairs: list[list[str]] | None) -> dict[str, Any]:
    return {name: parse_value(value) for name, value in (pairs or [])}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m calnotes.book", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("list")
    p_run = sub.add_parser("run")
    p_run.add_argument("chapter")
    p_run.add_argument("-p", "--parameter", nargs=2, action="append", metavar=("NAME", "VALUE"))
    p_run.add_argument("--out", default=str(REPO_ROOT / "_build" / "runs"))
    p_smoke = sub.add_parser("smoke")
    p_smoke.add_argument("out_dir")
    p_results = sub.add_parser("results")
    p_results.add_argument("-p", "--parameter", nargs=2, action="append",
                           metavar=("NAME", "VALUE"))
    args = parser.parse_args(argv)

    try:
        if args.command == "list":
            for path in chapter_paths():
                print(f"{path.stem}: {parameters_of(read_chapter(path))}")
        elif args.command == "run":
            out = run_chapter(args.chapter, _collect(args.parameter), Path(args.out))
            print(f"executed notebook: {out}")
        elif args.command == "smoke":
            paths = chapter_paths()
            if not paths:
                raise ValueError("no chapters found in book/")
            for path in paths:
                out = run_chapter(path.stem, {"SMOKE": True}, Path(args.out_dir),
                                  prepare_only=True)
                print(f"prepared {out}")
        elif args.command == "results":
            return _results(_collect(args.parameter))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _results(parameters: dict[str, Any]) -> int:
    """Execute every chapter at default scale so its stored runs exist, then summarize."""
    from calnotes.runs.store import RunStore

    for path in chapter_paths():
        defaults = parameters_of(read_chapter(path))
        params = {k: v for k, v in parameters.items() if k in defaults}
        start = time.perf_counter()
        print(f"== {path.stem} {params or ''}", flush=True)
        run_chapter(path.stem, params, REPO_ROOT / "_build" / "results")
        print(f"   done in {time.perf_counter() - start:.0f} s", flush=True)
    print(RunStore().summary().to_string(index=False))
    return 0
