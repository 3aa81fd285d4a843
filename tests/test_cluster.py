"""The executor against a real two-node Ray cluster on this machine (``make test-cluster``).

A head and a second node are started as separate processes (``ray start --block``, bound
to 127.0.0.1, no dashboard, no usage reporting, one CPU each); tiny runs go through
:func:`calnotes.runs.executor.execute`; the second node's worker is killed while it
trains a run. Every run must be stored exactly once and equal, bit for bit, the run
trained in this process with one thread; a run that raises must be reported by name and
config hash while the others go on. The cluster is stopped at the end, also on failure.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from calnotes.runs import experiment
from calnotes.runs.experiment import default_config
from calnotes.runs.store import RunStore, config_hash

pytest.importorskip("ray")
pytestmark = pytest.mark.cluster

HERE = Path(__file__).resolve().parent


def _children(pid: int) -> list[int]:
    """Every descendant of ``pid`` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rpartition(")")[2].split()[1])
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        found += kids
        frontier += kids
    return found


def _title(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


@pytest.fixture
def cluster():
    """A head and a second node of one CPU each on 127.0.0.1; stopped at teardown."""
    if str(HERE) not in sys.path:
        sys.path.insert(0, str(HERE))
    from ray_loopback import local_cluster

    with local_cluster(nodes=2, cpus=1) as running:
        yield running


def _tiny(seed: int) -> dict:
    # LeNet-5 on scikit-learn's digits: about a second of training per epoch, one thread
    return default_config(dataset="digits", model="lenet5", epochs=2, batch_size=32,
                          val_size=200, test_subset=200, seed=seed)


# The driver, in a process of its own (Ray reads its authentication settings when it is
# imported): waits for both nodes, then trains the runs through the executor.
DRIVER = textwrap.dedent(
    """
    import json, sys, time
    from calnotes.runs.executor import keep_loopback
    keep_loopback()  # connect to 127.0.0.1 as given
    import ray
    from calnotes.runs.executor import RunsFailed, execute
    from calnotes.runs.store import RunStore
    address, configs, root, checkpoints = sys.argv[1], json.loads(sys.argv[2]), *sys.argv[3:]
    ray.init(address=address, log_to_driver=False)
    deadline = time.monotonic() + 120
    while sum(n["Alive"] for n in ray.nodes()) < 2:
        assert time.monotonic() < deadline, "the second node did not join"
        time.sleep(0.5)
    try:
        execute(configs, label="cluster", store=RunStore(root), checkpoint_root=checkpoints,
                device="cpu", backend="ray", address=address, threads=1, stream=sys.stdout)
    except RunsFailed as err:
        print("FAILED", json.dumps(sorted(err.failures)))
        print(err)
    """
)


def test_runs_survive_a_killed_worker_and_equal_the_local_runs(cluster, tmp_path) -> None:
    address, second, env = cluster.address, cluster.nodes[1], cluster.env
    configs = [_tiny(seed) for seed in range(4)]
    # raises inside the run (more validation images than the training split holds)
    failing = default_config(dataset="digits", model="lenet5", epochs=1, val_size=100000)
    killed: list[str] = []

    def kill_a_worker_of_the_second_node() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and not killed:
            for pid in _children(second.pid):
                title = _title(pid)
                if title.startswith("ray::train_task"):
                    time.sleep(0.5)  # let it start training
                    os.kill(pid, signal.SIGKILL)
                    killed.append(f"{pid} {title.strip()}")
                    return
            time.sleep(0.1)

    killer = threading.Thread(target=kill_a_worker_of_the_second_node, daemon=True)
    killer.start()
    store = RunStore(tmp_path / "results")
    driver = subprocess.run(
        [sys.executable, "-c", DRIVER, address, json.dumps([failing, *configs, configs[1]]),
         str(tmp_path / "results"), str(tmp_path / "checkpoints")],
        env=env, capture_output=True, text=True, timeout=420)
    killer.join(timeout=5)
    log = driver.stdout
    print(log, driver.stderr[-3000:], "killed:", killed, sep="\n")
    assert driver.returncode == 0
    assert killed, "no worker of the second node was seen training a run"

    # the run that raised is named with its hash; the others were not stopped by it
    bad = config_hash(failing)
    assert f"FAILED {json.dumps([bad])}" in log
    assert f"run {bad} (digits/lenet5/ce seed 0) failed; the other runs go on" in log
    assert f"{bad} (digits/lenet5/ce seed 0): ValueError: val_size must lie in" in log

    # every run stored exactly once, nothing half-written
    folders = sorted(p.name for p in (tmp_path / "results").iterdir() if not p.name.startswith("."))
    assert folders == sorted(config_hash(c) for c in configs)
    assert not [p for p in (tmp_path / "results").iterdir() if p.name.startswith((".tmp", ".old"))]
    nodes = set()
    torch.set_num_threads(1)
    for config in configs:
        stored = store.load(config)
        nodes.add(stored.provenance["cpu_threads"])
        local = experiment.train_run(config, device="cpu", progress=False)
        # same CPU, one thread, same computation: identical bits (float32 stored)
        assert torch.equal(stored.test_logits, local.test_logits)
        assert torch.equal(stored.val_logits, local.val_logits)
        assert stored.history.without_timing() == local.history.without_timing()
        assert stored.metrics == local.metrics
        assert stored.label == "cluster"
    assert nodes == {1}
    assert f"cost of the {len(configs)} run(s) trained (ray" in log
