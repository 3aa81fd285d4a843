"""Print the README's benchmark rows for metrics, training and the stored runs from
``latest.json``, so that the summary's numbers are the benchmark's output, not typed by
hand.

    python benchmarks/readme_rows.py
"""

from __future__ import annotations

import json
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _row(rows: list[dict], prefix: str) -> dict:
    return next(r for r in rows if r["task"].startswith(prefix))


def metrics_rows(entry: dict) -> list[str]:
    rows = entry["rows"]
    out = []
    for name, label in (("ece", "ECE, 15 bins"), ("classwise_ece", "classwise ECE")):
        full = _row(rows, f"{name} 15 bins 1000000")
        netcal = _row(rows, f"{name} 15 bins, netcal")
        out.append(
            f"| {label}, 1,000,000 x 100 | {full['speedup_over_peer']}x faster than torchmetrics"
            f"{' looped over classes' if name == 'classwise_ece' else ''}; "
            f"{netcal['speedup_per_row']}x faster than netcal per row (netcal on 100k rows); "
            f"{full['ratio_over_floor']}x the time of one read of the array |")
    sece = [r for r in rows if r["task"].startswith("sece")]
    largest = sece[-1]
    n = largest["task"].split("N=")[1].split(",")[0]
    out.append(
        f"| SECE forward + backward, {int(n):,} samples | {largest['calnotes_s']} s on the grid, "
        f"{largest['speedup_over_floor']}x faster than the exact O(N^2) sums "
        f"({largest['floor_s']} s), {largest['abs_diff_vs_exact']:.1e} from their value |")
    return out


def training_rows(entry: dict) -> list[str]:
    out = []
    for row in entry["rows"]:
        task = row["task"]
        if task.startswith("train "):
            model = task.split()[1].rstrip(",")
            extra = ""
            if "nhwc_speedup_over_calnotes" in row:
                extra = (f"; NHWC (opt-in for batch-norm models) another "
                         f"{row['nhwc_speedup_over_calnotes']}x")
            out.append(
                f"| training {model}, crop+flip, CPU | {row['speedup_over_previous']}x the "
                f"images/s of the previous Trainer settings ({row['previous']}), "
                f"{row['speedup_over_peer']}x a DataLoader with per-sample torchvision "
                f"transforms; {row['calnotes_layout']}, {row['torch_threads']} thread(s){extra} |")
        elif task.startswith("training step"):
            model = task.split(" of ")[1].split(",")[0]
            out.append(
                f"| training step, {model}, CPU | {row['gflop_per_step']} GFLOP per step at "
                f"{row['achieved_gflop_per_s']} GFLOP/s, {row['share_of_matmul_peak']:.0%} of the "
                f"float32 matmul rate measured in the same run; bf16 autocast "
                f"{row['bf16_autocast_slowdown']}x slower |")
        elif task.startswith("torch.compile"):
            model = task.split(" of the ")[1].split()[0]
            out.append(
                f"| torch.compile, {model} training step, CPU | "
                f"{row['speedup_compiled_over_eager']}x the eager step, after "
                f"{row['compile_and_first_step_s']} s of compiling and the first step |")
    return out


def results_rows(entry: dict) -> list[str]:
    total = entry["rows"][0]
    return [f"| {total['task']} | {total['wall_hours']} h of the machine, the chapters "
            f"scheduled as `make results` schedules them; the runs' own times sum to "
            f"{total['run_hours_now']} h, against {total['run_hours_then']} h recorded in "
            f"their provenance when they were first computed on the shared machine "
            f"({total['speedup_per_run']}x) |"]


def main() -> None:
    report = json.loads((HERE / "latest.json").read_text())["benchmarks"]
    for name, fn in (("bench_metrics", metrics_rows), ("bench_training", training_rows),
                     ("bench_results", results_rows)):
        if name in report:
            entry = report[name]
            print(f"<!-- {name}: {entry['machine']}, {entry['date']} -->")
            print("\n".join(fn(entry)))


if __name__ == "__main__":
    main()
