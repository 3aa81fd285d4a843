"""Run every benchmark in this folder and write benchmarks/latest.{json,md}.

Each ``bench_*.py`` module exposes ``main(argv) -> dict`` whose ``"rows"`` entry is a list
of flat dicts (one per comparison). Every figure is a ratio against a peer measured in
the same run, on the machine recorded in the output.
"""

from __future__ import annotations

import importlib
import json
import platform
import sys
import time
from pathlib import Path

import pandas as pd
import torch

HERE = Path(__file__).resolve().parent
#: Benchmarks that run only when named (bench_results takes about 40 minutes).
NAMED_ONLY = {"bench_results"}

PREAMBLE = (
    "# Benchmarks\n\n"
    "Taken on a shared 2-core machine (other jobs ran on the same cores), so absolute times "
    "vary from run to run; each ratio compares calnotes with its peer or floor measured in "
    "the same run, back to back, as the median over repetitions. `torch_threads` is the "
    "number of intra-op threads used (the thread policy of `calnotes._threads`).\n\n"
)


def machine() -> str:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads,"
            f" {gpu}; torch {torch.__version__}")


def selected(names: list[str], argv: list[str] | None) -> list[str]:
    """The benchmarks of ``names`` whose names contain one of ``argv``; without ``argv``,
    all but :data:`NAMED_ONLY`."""
    if argv:
        return [n for n in names if any(a in n for a in argv)]
    return [n for n in names if n not in NAMED_ONLY]


def split_options(argv: list[str] | None) -> tuple[list[str], list[str]]:
    """``(names, options)``: the arguments before ``--`` and those after it."""
    argv = list(argv or [])
    if "--" not in argv:
        return argv, []
    cut = argv.index("--")
    return argv[:cut], argv[cut + 1:]


def main(argv: list[str] | None = None) -> int:
    """Run the :func:`selected` benchmarks, each with the options after ``--`` (as in
    ``run_all.py bench_training -- --compile``). Results of benchmarks not run now stay
    in ``latest.json``, each with its own machine and date."""
    argv, options = split_options(argv)
    sys.path.insert(0, str(HERE))
    names = selected(sorted(p.stem for p in HERE.glob("bench_*.py")), argv)
    latest = HERE / "latest.json"
    previous = json.loads(latest.read_text()) if latest.exists() else {}
    report = {"benchmarks": {**_entries(previous)}}
    for name in names:
        print(f"== {name}", flush=True)
        result = importlib.import_module(name).main(options)
        report["benchmarks"][name] = {"machine": machine(), "date": time.strftime("%Y-%m-%d"),
                                      **result}
    sections = []
    for name, entry in sorted(report["benchmarks"].items()):
        sections.append(f"### {name}\n\nMachine: {entry['machine']}; date: {entry['date']}\n\n"
                        + pd.DataFrame(entry["rows"]).to_string(index=False))
    latest.write_text(json.dumps(report, indent=2, default=str))
    (HERE / "latest.md").write_text(PREAMBLE + "\n\n".join(sections) + "\n")
    print("\n\n".join(sections))
    return 0


def _entries(previous: dict) -> dict:
    """Benchmark entries of an earlier ``latest.json``, each carrying its machine and date
    (older files kept one machine and date for the whole report)."""
    entries = previous.get("benchmarks", {})
    return {name: {"machine": previous.get("machine", "unknown"),
                   "date": previous.get("date", "unknown"), **entry}
            for name, entry in entries.items()}


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
