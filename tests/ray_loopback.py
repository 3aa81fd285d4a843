"""A Ray cluster of several nodes on this machine's loopback interface, for the cluster
test and benchmark.

On Linux Ray replaces ``127.0.0.1`` in ``--node-ip-address`` and ``--address`` with the
machine's outward address (so that other machines can reach the node). We want a cluster
that no other machine can reach, so :func:`calnotes.runs.executor.keep_loopback` leaves
loopback addresses as given; run as a script, this module is the ``ray`` command with that
change.
:func:`local_cluster` starts a head and more nodes with it (``ray start --block``, no
dashboard, no usage reporting, a token of its own) and stops them, also on failure.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"the head exited:\n{log.read_text()[-3000:]}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.5)
    raise RuntimeError(f"the head did not listen on {port}:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM to a ``ray start --block`` (it stops its node), SIGKILL to its group after."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=30)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the session started for this node
    proc.wait(timeout=30)


@dataclass
class Cluster:
    """A running local cluster: its address, node processes (head first), environment."""

    address: str
    nodes: list[subprocess.Popen]
    env: dict[str, str]
    logs: Path


@contextlib.contextmanager
def local_cluster(nodes: int = 2, cpus: int = 1) -> Iterator[Cluster]:
    """A head and ``nodes - 1`` more nodes of ``cpus`` CPUs each on 127.0.0.1.

    ``env`` holds what a driver process needs (``PYTHONPATH``, the cluster's token); a
    driver must have it in its environment before it imports ray."""
    temp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths are capped
    port = _free_port()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
           "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token",
           "RAY_AUTH_TOKEN": secrets.token_hex(32),
           "PYTHONPATH": f"{REPO}{os.pathsep}{HERE}", "OMP_NUM_THREADS": "1"}
    common = ["--block", f"--num-cpus={cpus}", "--num-gpus=0", "--disable-usage-stats",
              "--node-ip-address=127.0.0.1"]
    procs: list[subprocess.Popen] = []
    logs = Path(temp) / "logs"
    logs.mkdir()

    def start(name: str, *args: str) -> subprocess.Popen:
        with open(logs / f"{name}.log", "wb") as out:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "start",
                                     *common, *args], env=env, stdout=out,
                                    stderr=subprocess.STDOUT, start_new_session=True)
        procs.append(proc)
        return proc

    try:
        head = start("head", "--head", f"--port={port}", "--include-dashboard=false",
                     f"--temp-dir={temp}")
        _wait_for_port(port, head, logs / "head.log")
        for i in range(1, nodes):
            start(f"node{i}", f"--address=127.0.0.1:{port}")
        yield Cluster(f"127.0.0.1:{port}", procs, env, logs)
    finally:
        for proc in reversed(procs):
            _stop(proc)
        shutil.rmtree(temp, ignore_errors=True)


if __name__ == "__main__":
    from calnotes.runs.executor import keep_loopback

    keep_loopback()
    from ray.scripts.scripts import main

    sys.argv[0] = "ray"
    sys.exit(main())
