"""Run the book's chapters as notebooks: with parameters, in SMOKE mode, or to fill results/.

Chapters are MyST-markdown notebooks (``book/NN_slug.md``). Papermill cannot read them
directly, so each is converted with jupytext first. The cell tagged ``parameters`` holds
one ``NAME = literal  # domain`` line per parameter, which lets us check the parameters a
user passes before anything runs: their names, their types (those of the defaults) and
their values (the domain). A domain is one of

* ``bool``, ``dict``;
* ``int`` or ``float``, optionally bounded: ``positive int`` (1, 2, ...),
  ``nonnegative int``, ``positive float``, ``nonnegative float``, ``float > 0.5``,
  ``float in [0, 1)``, ``int in [0, 9]`` (no ``>=``: papermill reads a second ``=`` on a
  parameter's line as another assignment);
* ``one of a, b, c`` (strings);
* a name the library resolves: ``dataset``, ``model``, ``device``, ``ood set``,
  ``schedule``, ``resnet depth``;
* ``list of D`` for a domain ``D`` (a non-empty list).

Text after a ``;`` is a note for the reader: ``SUBSET = 0  # nonnegative int; 0: all``.

Command line (``python -m calnotes.book ...``)::

    list                                    chapters (and appendices) and their parameters
    run CHAPTER [-p NAME VALUE ...]         execute one chapter into _build/runs/
    smoke OUT_DIR                           write every chapter as .ipynb with SMOKE=True
    results [--preset NAME] [-p NAME VALUE ...]
                                            execute every chapter at default scale (or at
                                            a preset's, e.g. the papers' scale: paper)
    presets                                 each chapter's preset parameters and cost
"""

from __future__ import annotations

import argparse
import ast
import io
import math
import operator
import re
import sys
import time
import tokenize
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
BOOK_DIR = REPO_ROOT / "book"


def chapter_paths(book_dir: Path = BOOK_DIR) -> list[Path]:
    """Every chapter, in order: ``book/NN_slug.md``."""
    return sorted(p for p in book_dir.glob("[0-9][0-9]_*.md"))


def appendix_paths(book_dir: Path = BOOK_DIR) -> list[Path]:
    """The appendices that take a ``SMOKE`` parameter (``book/appendix_*.md``): run, listed
    and smoke-tested like the chapters."""
    paths = []
    for path in sorted(book_dir.glob("appendix_*.md")):
        try:
            if "SMOKE" in parameters_of(read_chapter(path)):
                paths.append(path)
        except (ValueError, SyntaxError):
            continue  # no parameters cell: a page without parameters is not run
    return paths


def page_paths(book_dir: Path = BOOK_DIR) -> list[Path]:
    """The chapters, then the appendices of :func:`appendix_paths`."""
    return chapter_paths(book_dir) + appendix_paths(book_dir)


def resolve_chapter(name: str, book_dir: Path = BOOK_DIR) -> Path:
    """Find a chapter by file name, stem, number (``01``) or slug (``measuring_calibration``),
    or an appendix by file name, stem or slug (``pitfalls`` for ``appendix_pitfalls``)."""
    if not isinstance(name, str):
        raise TypeError(f"chapter must be a string, got {type(name).__name__}")
    candidates = chapter_paths(book_dir)
    if not name.strip():
        listing = ", ".join(p.stem for p in candidates) or "(none)"
        raise ValueError(f"chapter must be named; chapters are: {listing}")
    for path in candidates:
        if name in (path.name, path.stem, path.stem[:2], path.stem[3:]):
            return path
    for path in appendix_paths(book_dir):
        if name in (path.name, path.stem, path.stem.removeprefix("appendix_")):
            return path
    listing = ", ".join(p.stem for p in candidates) or "(none)"
    raise ValueError(f"unknown chapter {name!r}; chapters are: {listing}")


def read_chapter(path: Path) -> Any:
    """The chapter as an in-memory notebook (jupytext, MyST format)."""
    import jupytext

    return jupytext.read(path, fmt="md:myst")


def _parameters_cell(notebook: Any) -> str:
    for cell in notebook.cells:
        if cell.cell_type == "code" and "parameters" in cell.metadata.get("tags", []):
            return str(cell.source)
    raise ValueError("this chapter has no cell tagged 'parameters'")


def _assignments(source: str) -> list[ast.Assign]:
    nodes = ast.parse(source).body
    for node in nodes:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)):
            raise ValueError("the parameters cell may hold only `NAME = literal` lines")
    return nodes  # type: ignore[return-value]


def parameters_of(notebook: Any) -> dict[str, Any]:
    """Names and default values of the cell tagged ``parameters`` (literals only)."""
    return {node.targets[0].id: ast.literal_eval(node.value)  # type: ignore[attr-defined]
            for node in _assignments(_parameters_cell(notebook))}


def parameter_domains(notebook: Any) -> dict[str, Domain]:
    """The domain of every parameter, from the comment that ends its line.

    Raises ``ValueError`` naming each parameter without a domain, or with one that does
    not parse, and each default that lies outside its own domain.
    """
    source = _parameters_cell(notebook)
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline)
                if tok.type == tokenize.COMMENT}
    domains: dict[str, Domain] = {}
    problems = []
    for node in _assignments(source):
        name = node.targets[0].id  # type: ignore[attr-defined]
        text = comments.get(node.end_lineno or node.lineno, "").split(";")[0].strip()
        if not text:
            problems.append(f"{name} has no domain (end its line with `# domain`)")
            continue
        try:
            domains[name] = Domain.parse(text)
        except ValueError as err:
            problems.append(f"{name}: {err}")
            continue
        error = domains[name].error(ast.literal_eval(node.value))
        if error:
            problems.append(f"the default of {name} is outside its domain: {error}")
    if problems:
        raise ValueError("parameters cell: " + "; ".join(problems))
    return domains


# ------------------------------------------------------------------ parameter domains

_COMPARE = {">": operator.gt, "<": operator.lt}
_SIGNS = {"positive": "> 0", "nonnegative": "in [0, inf)"}
_NUMBER = re.compile(
    r"(?P<kind>int|float)"
    r"(?:\s*(?P<op>[<>])\s*(?P<bound>[-+0-9.e]+)"
    r"|\s+in\s+(?P<lo_b>[\[(])\s*(?P<lo>-?inf|[-+0-9.e]+)\s*,"
    r"\s*(?P<hi>inf|[-+0-9.e]+)\s*(?P<hi_b>[\])]))?"
)


def _is_number(value: Any, kind: str) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) if kind == "int" else isinstance(value, (int, float))


def _dataset(value: Any) -> str | None:
    from calnotes.data import DATASETS

    return None if value in DATASETS else f"one of {', '.join(DATASETS)}"


def _ood_set(value: Any) -> str | None:
    from calnotes.data import DATASETS, OOD_NOISE, PACKAGED_SETS

    names = (*DATASETS, *PACKAGED_SETS, *OOD_NOISE)
    if value in names or (isinstance(value, str) and value.startswith("folder:")):
        return None
    return f"one of {', '.join(names)}, or folder:<path>"


def _model(value: Any) -> str | None:
    import torch

    from calnotes.models import build_model

    if not isinstance(value, str):
        return "a model name"
    try:
        with torch.device("meta"):  # builds the modules without allocating their weights
            build_model(value, num_classes=10)
    except ValueError as err:
        return f"a model name ({err})"
    return None


def _device(value: Any) -> str | None:
    from calnotes.training import select_device

    try:
        select_device(value)
    except (TypeError, ValueError) as err:
        return f"a device available here ({err})"
    return None


def _schedule(value: Any) -> str | None:
    from calnotes.training.trainer import SCHEDULES

    return None if value in SCHEDULES else f"one of {', '.join(SCHEDULES)}"


def _resnet_depth(value: Any) -> str | None:
    ok = _is_number(value, "int") and value >= 8 and (value - 2) % 6 == 0
    return None if ok else "a CIFAR ResNet depth 6n + 2 (8, 14, 20, 32, 44, 56, 110, ...)"


#: Domains the library resolves: name -> function(value) giving None when the value is
#: allowed, else a description of the allowed values.
NAMED_DOMAINS: dict[str, Callable[[Any], str | None]] = {
    "dataset": _dataset,
    "model": _model,
    "device": _device,
    "ood set": _ood_set,
    "schedule": _schedule,
    "resnet depth": _resnet_depth,
}


@dataclass(frozen=True)
class Domain:
    """The values a chapter parameter may take, parsed from its ``# domain`` comment."""

    text: str
    check: Callable[[Any], str | None]

    @classmethod
    def parse(cls, text: str) -> Domain:
        """Parse a domain (see the module docstring); ``ValueError`` if it does not parse."""
        text = " ".join(text.split())
        if text.startswith("list of "):
            inner = cls.parse(text[len("list of "):])

            def check_list(value: Any) -> str | None:
                if not isinstance(value, list) or not value:
                    return f"a non-empty list of {inner.text}"
                for item in value:
                    problem = inner.check(item)
                    if problem:
                        return f"a list of {inner.text} ({item!r} is not {problem})"
                return None

            return cls(text, check_list)
        if text.startswith("one of "):
            choices = tuple(c.strip() for c in text[len("one of "):].split(","))
            return cls(text, lambda v: None if v in choices else f"one of {', '.join(choices)}")
        if text in ("bool", "dict"):
            expected: type = bool if text == "bool" else dict
            return cls(text, lambda v: None if isinstance(v, expected) else f"a {text}")
        if text in NAMED_DOMAINS:
            return cls(text, NAMED_DOMAINS[text])
        sign, _, kind = text.partition(" ")
        match = _NUMBER.fullmatch(f"{kind} {_SIGNS[sign]}" if sign in _SIGNS else text)
        if match is None:
            raise ValueError(f"unknown domain {text!r}")
        return cls(text, _number_check(match, text))

    def error(self, value: Any) -> str | None:
        """None if ``value`` lies in the domain, else a message with the allowed values."""
        problem = self.check(value)
        return None if problem is None else f"expected {problem}, got {value!r}"


def _number_check(match: re.Match[str], text: str) -> Callable[[Any], str | None]:
    kind = match["kind"]
    tests: list[Callable[[Any], bool]] = []
    if match["op"]:
        op, bound = _COMPARE[match["op"]], float(match["bound"])
        tests.append(lambda v: op(v, bound))
    elif match["lo"]:
        lo, hi = float(match["lo"]), float(match["hi"])
        lo_op = operator.ge if match["lo_b"] == "[" else operator.gt
        hi_op = operator.le if match["hi_b"] == "]" else operator.lt
        tests.append(lambda v: lo_op(v, lo) and hi_op(v, hi))

    def check(value: Any) -> str | None:
        ok = _is_number(value, kind) and math.isfinite(value) and all(t(value) for t in tests)
        return None if ok else f"{'an' if text[0] in 'aeiou' else 'a'} {text}"

    return check


def parse_value(text: str) -> Any:
    """Read a command-line value as a Python literal when it is one, else as a string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def check_parameters(
    defaults: dict[str, Any], given: dict[str, Any], domains: dict[str, Domain] | None = None
) -> dict[str, Any]:
    """Reject unknown names, values whose type does not match the default's, and values
    outside the parameter's domain (when ``domains`` are given), naming the allowed ones.

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
    checked = {name: float(value) if isinstance(defaults[name], float) else value
               for name, value in given.items()}
    for name, value in checked.items():
        error = domains[name].error(value) if domains and name in domains else None
        if error:
            raise ValueError(f"parameter {name}: {error}")
    return checked


def run_chapter(
    name: str,
    parameters: dict[str, Any] | None = None,
    out_dir: Path = REPO_ROOT / "_build" / "runs",
    *,
    prepare_only: bool = False,
    progress: bool = True,
    log_output: bool = False,
) -> Path:
    """Execute one chapter with papermill; returns the path of the output notebook.

    ``log_output`` sends what the cells print to the ``papermill`` logger as it happens
    (for long runs followed in a log file)."""
    import papermill

    path = resolve_chapter(name)
    notebook = read_chapter(path)
    params = check_parameters(parameters_of(notebook), dict(parameters or {}),
                              parameter_domains(notebook))
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    suffix = "" if prepare_only else "-" + time.strftime("%Y%m%d-%H%M%S")
    out_path = out_dir / f"{path.stem}{suffix}.ipynb"
    papermill.execute_notebook(
        notebook, str(out_path), parameters=params, cwd=str(path.parent),
        kernel_name="python3", prepare_only=prepare_only, progress_bar=progress,
        log_output=log_output,
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
    p_results.add_argument("--preset", default=None)
    p_results.add_argument("--chapter", action="append", default=None,
                           help="only this chapter (repeatable); default: every chapter")
    sub.add_parser("presets")
    args = parser.parse_args(argv)

    try:
        if args.command == "list":
            for path in page_paths():
                notebook = read_chapter(path)
                domains = parameter_domains(notebook)
                print(path.stem)
                for name, default in parameters_of(notebook).items():
                    print(f"    {name} = {default!r}  # {domains[name].text}")
        elif args.command == "run":
            out = run_chapter(args.chapter, _collect(args.parameter), Path(args.out))
            print(f"executed notebook: {out}")
        elif args.command == "smoke":
            paths = page_paths()
            if not paths:
                raise ValueError("no chapters found in book/")
            for path in paths:
                out = run_chapter(path.stem, {"SMOKE": True}, Path(args.out_dir),
                                  prepare_only=True)
                print(f"prepared {out}")
        elif args.command == "results":
            return _results(_collect(args.parameter), args.preset, args.chapter)
        elif args.command == "presets":
            _print_presets()
    except (TypeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


def _print_presets() -> None:
    """Each preset's parameters per chapter, with the estimated GPU-hours of its runs."""
    from calnotes.book.presets import PRESETS, SUSTAINED_TFLOPS, estimate
    from calnotes.runs.store import RunStore

    labels = RunStore().summary()
    for name, presets in PRESETS.items():
        print(f"preset {name} (GPU-hours estimated from FLOPs per step at an assumed "
              f"{SUSTAINED_TFLOPS:g} TFLOP/s, for as many runs as the chapter stores at its "
              "default scale)")
        for chapter, p in presets.items():
            runs = 0 if labels.empty else int(
                labels["label"].astype(str).str.startswith(f"ch{chapter[:2]}_").sum())
            cost = estimate(p, max(runs, 1))
            print(f"{chapter}  ({p.source})")
            print(f"    {cost['runs']} runs of {cost['model']} on {cost['dataset']}, "
                  f"{cost['epochs']} epochs, {cost['gflops_per_step']:.0f} GFLOP per step: "
                  f"about {cost['gpu_hours']:.1f} GPU-hours (estimate)")
            print("    ARGS: " + " ".join(f"-p {k} {v!r}" for k, v in p.parameters.items()))


def _results(parameters: dict[str, Any], preset_name: str | None = None,
             chapters: list[str] | None = None) -> int:
    """Execute every chapter (or those of ``chapters``, by number or name) at default scale
    so its stored runs exist, then summarize.

    Each parameter goes to the chapters that take it; every one is checked against every
    such chapter before the first runs, and a name no chapter takes is an error. With
    ``preset_name`` each chapter first takes its preset's parameters
    (:mod:`calnotes.book.presets`); those given here win.
    """
    from calnotes.book.presets import preset
    from calnotes.runs.store import RunStore

    presets = preset(preset_name) if preset_name is not None else {}
    paths = chapter_paths() if not chapters else [resolve_chapter(c) for c in chapters]
    per_chapter = {}
    for path in paths:
        notebook = read_chapter(path)
        defaults = parameters_of(notebook)
        params = {k: v for k, v in parameters.items() if k in defaults}
        if path.stem in presets:
            params = {**presets[path.stem].parameters, **params}
        per_chapter[path] = check_parameters(defaults, params, parameter_domains(notebook))
    taken = {name for params in per_chapter.values() for name in params}
    unknown = sorted(set(parameters) - taken)
    if unknown:
        known = sorted({k for p in paths for k in parameters_of(read_chapter(p))})
        raise ValueError(f"unknown parameter(s) {', '.join(unknown)}: no chapter takes them; "
                         f"the chapters take: {', '.join(known)}")
    for path, params in per_chapter.items():
        start = time.perf_counter()
        print(f"== {path.stem} {params or ''}", flush=True)
        run_chapter(path.stem, params, REPO_ROOT / "_build" / "results")
        print(f"   done in {time.perf_counter() - start:.0f} s", flush=True)
    print(RunStore().summary().to_string(index=False))
    return 0
