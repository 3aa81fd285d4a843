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


def machine() -> str:
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    return (f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads,"
            f" {gpu}; torch {torch.__version__}")


def main(argv: list[str] | None = None) -> int:
    sys.path.insert(0, str(HERE))
    names = sorted(p.stem for p in HERE.glob("bench_*.py"))
    if argv:
        names = [n for n in names if any(a in n for a in argv)]
    report = {"machine": machine(), "date": time.strftime("%Y-%m-%d"), "benchmarks": {}}
    sections = [f"Machine: {report['machine']}; date: {report['date']}\n"]
    for name in names:
        print(f"== {name}", flush=True)
        result = importlib.import_module(name).main([])
        report["benchmarks"][name] = result
        sections.append(f"### {name}\n\n" + pd.DataFrame(result["rows"]).to_string(index=False))
    (HERE / "latest.json").write_text(json.dumps(report, indent=2, default=str))
    (HERE / "latest.md").write_text("\n\n".join(sections) + "\n")
    print("\n\n".join(sections))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
