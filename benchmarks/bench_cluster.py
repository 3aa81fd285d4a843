"""A chapter's stored runs trained again through a two-node Ray cluster on this machine
and sequentially in one process: wall time of each path, and whether they store the same.

The runs are the ``--runs`` cheapest (by the seconds their provenance recorded) of those
in ``results/`` whose label is ``--chapter``; ``results/`` is only read. Both paths train
into scratch stores under ``--scratch`` (removed at the end unless ``--keep``): the
sequential path with one intra-op thread, the cluster (a head and a second node of one
CPU each on 127.0.0.1, see ``tests/ray_loopback.py``) with one thread per run, so the two
must store identical bits. Named explicitly, not part of ``make bench``::

    python benchmarks/bench_cluster.py --chapter ch02_diagnosing --runs 6

``--results CHAPTER`` instead runs a whole chapter as ``make results CHAPTER=..`` does
(``python -m calnotes.book results --chapter CHAPTER``, with the chapter parameters given by
``-p NAME VALUE``) twice, each into a scratch copy of ``results/`` (a reader's clone: the
chapters read the book's stored evidence runs at any parameters): once on the sequential
path (``CALNOTES_EXECUTOR=sequential``) and once with ``RAY_ADDRESS`` naming the two-node
cluster, both with one thread per run; then it compares, run by run, what each path
trained::

    python benchmarks/bench_cluster.py --results 02 -p TRAIN_SUBSET 500 -p EPOCHS 2
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO_RESULTS = HERE.parent / "results"
sys.path.insert(0, str(HERE.parent / "tests"))

DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from calnotes.runs.executor import keep_loopback
    keep_loopback()
    import ray
    from calnotes.runs.executor import execute
    from calnotes.runs.store import RunStore
    address, configs, root, checkpoints = sys.argv[1], json.loads(sys.argv[2]), *sys.argv[3:]
    ray.init(address=address, log_to_driver=False)
    while sum(n["Alive"] for n in ray.nodes()) < 2:
        time.sleep(0.5)
    start = time.perf_counter()
    execute(configs, label="bench", store=RunStore(root), checkpoint_root=checkpoints,
            device="cpu", backend="ray", address=address, threads=1, stream=sys.stdout)
    print("WALL", time.perf_counter() - start)
    """
)


def _hashes(root: Path) -> set[str]:
    return {p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")}


def compare_stores(a_root: Path, b_root: Path, before: set[str] = frozenset()) -> bool:
    """Print, run by run, whether two stores hold the same configs with identical logits,
    history (less its timings) and metrics, leaving out the runs of ``before`` (those both
    started with); True when they all are."""
    import torch

    from calnotes.runs.store import RunStore

    a, b = RunStore(a_root), RunStore(b_root)
    hashes_a, hashes_b = sorted(_hashes(a.root) - before), sorted(_hashes(b.root) - before)
    print(f"{len(hashes_a)} runs trained and stored sequentially, {len(hashes_b)} through the "
          f"cluster; same config hashes: {hashes_a == hashes_b}")
    same = hashes_a == hashes_b and bool(hashes_a)
    for digest in sorted(set(hashes_a) & set(hashes_b)):
        config = json.loads((a.root / digest / "config.json").read_text())
        x, y = a.load(config), b.load(config)
        equal = (torch.equal(x.test_logits, y.test_logits)
                 and (x.val_logits is None) == (y.val_logits is None)
                 and (x.val_logits is None or torch.equal(x.val_logits, y.val_logits))
                 and x.history.without_timing() == y.history.without_timing()
                 and x.metrics == y.metrics)
        print(f"{digest} {config['model']:>9} {config['epochs']:>3} ep: logits, history and "
              f"metrics {'identical' if equal else 'DIFFER'}")
        same = same and equal
    return same


def chapter_results(chapter: str, parameters: list[list[str]], scratch: Path) -> int:
    """``make results`` of one chapter, sequential then through the two-node cluster."""
    from ray_loopback import local_cluster

    command = [sys.executable, "-m", "calnotes.book", "results", "--chapter", chapter,
               *[x for pair in parameters for x in ("-p", *pair)]]
    base = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "CALNOTES_"))}

    book_runs = scratch / "book-results"  # one snapshot: results/ may grow meanwhile
    shutil.copytree(REPO_RESULTS, book_runs)
    before = _hashes(book_runs)

    def run(name: str, env: dict[str, str]) -> float:
        shutil.copytree(book_runs, scratch / name / "results")
        env = {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(HERE.parent),
               "CALNOTES_RESULTS": str(scratch / name / "results"),
               "CALNOTES_CHECKPOINTS": str(scratch / name / "checkpoints")}
        start = time.perf_counter()
        with open(scratch / f"{name}.log", "w") as log:
            done = subprocess.run(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                  cwd=HERE.parent, check=False)
        wall = time.perf_counter() - start
        print(f"{name}: exit {done.returncode} in {wall:.0f} s (log {scratch / f'{name}.log'})",
              flush=True)
        if done.returncode != 0:
            raise SystemExit((scratch / f"{name}.log").read_text()[-5000:])
        return wall

    print(" ".join(command[1:]), flush=True)
    sequential = run("sequential", {**base, "CALNOTES_EXECUTOR": "sequential"})
    with local_cluster(nodes=2, cpus=1) as cluster:
        clustered = run("cluster", {**base, **cluster.env, "RAY_ADDRESS": cluster.address})
    same = compare_stores(scratch / "sequential" / "results", scratch / "cluster" / "results",
                          before)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"make results CHAPTER={chapter}: sequential {sequential:.0f} s; two-node cluster "
          f"(1 CPU each, its start-up included) {clustered:.0f} s; speed-up "
          f"{sequential / clustered:.2f}x")
    print(f"same config hashes and identical stored content: {same}")
    return 0 if same else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--chapter", default="ch02_diagnosing")
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--results", default=None, metavar="CHAPTER",
                        help="run a whole chapter as make results does, both ways")
    parser.add_argument("-p", "--parameter", nargs=2, action="append", default=[],
                        metavar=("NAME", "VALUE"), help="a chapter parameter (--results)")
    parser.add_argument("--scratch", default=None)
    parser.add_argument("--keep", action="store_true")
    args = parser.parse_args()
    if args.results is not None:
        scratch = Path(args.scratch or tempfile.mkdtemp(prefix="bench-cluster-"))
        scratch.mkdir(parents=True, exist_ok=True)
        try:
            return chapter_results(args.results, args.parameter, scratch)
        finally:
            if not args.keep:
                shutil.rmtree(scratch, ignore_errors=True)

    import torch

    from calnotes.runs.executor import execute
    from calnotes.runs.store import RunStore, config_hash

    stored = RunStore()
    table = stored.summary()
    table = table[table["label"] == args.chapter].sort_values("seconds").head(args.runs)
    if table.empty:
        raise SystemExit(f"no stored run labelled {args.chapter} in {stored.root}")
    configs = [json.loads((stored.root / run / "config.json").read_text())
               for run in table["run"]]
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="bench-cluster-"))
    print(f"{len(configs)} runs of {args.chapter} ({table['seconds'].sum():.0f} s recorded)",
          flush=True)

    from ray_loopback import local_cluster

    with local_cluster(nodes=2, cpus=1) as cluster:
        driver = subprocess.run(
            [sys.executable, "-c", DRIVER, cluster.address, json.dumps(configs),
             str(scratch / "cluster"), str(scratch / "ckpt-cluster")],
            env=cluster.env, capture_output=True, text=True, check=False)
    print(driver.stdout, flush=True)
    if driver.returncode != 0:
        print(driver.stderr[-5000:])
        return 1
    cluster_wall = float(driver.stdout.split("WALL")[1])

    torch.set_num_threads(1)
    start = time.perf_counter()
    execute(configs, label="bench", store=RunStore(scratch / "sequential"),
            checkpoint_root=scratch / "ckpt-sequential", device="cpu", backend="sequential")
    sequential_wall = time.perf_counter() - start

    same = compare_stores(scratch / "sequential", scratch / "cluster") and sorted(
        config_hash(c) for c in configs) == sorted(
        p.name for p in (scratch / "cluster").iterdir() if not p.name.startswith("."))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    print(f"sequential (1 thread): {sequential_wall:.0f} s; two-node cluster (1 CPU each, "
          f"start-up excluded): {cluster_wall:.0f} s; "
          f"speed-up {sequential_wall / cluster_wall:.2f}x")
    print(f"same config hashes and identical stored content: {same}")
    if not args.keep:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
