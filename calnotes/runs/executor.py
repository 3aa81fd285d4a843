"""Executor: every list of runs the book trains goes through :func:`execute`.

:func:`execute` takes configs, drops those the store already holds (and duplicates), and
trains the rest on one of two backends:

* ``"sequential"``: one after another in this process (:func:`~calnotes.runs.store.load_or_run`);
* ``"ray"``: each run a Ray core task (``ray.remote``), on this machine's cores or on the
  cluster at ``address`` / ``$RAY_ADDRESS``. A task asks for the resources its run needs:
  one GPU when ``device`` names CUDA, else ``threads`` CPUs, and trains with that many
  intra-op threads.

The default (``backend="auto"``) is Ray when an address is given or ``$RAY_ADDRESS`` is
set; otherwise Ray on this machine when Ray is installed and more than one run is
missing; otherwise sequential. Why: one run gains nothing from Ray but its start-up
(seconds), and without Ray installed the book still runs (Ray is an optional extra), so
those cases keep the path that has always trained the book's runs.
``$CALNOTES_EXECUTOR`` (``sequential`` or ``ray``) overrides that rule for every ``"auto"``
call, e.g. to time a chapter both ways.

One writer: a Ray task returns its :class:`~calnotes.runs.experiment.RunResult` (logits,
history, metrics, wall time, device) to the driver, which alone publishes it into the
store (checksums, one atomic rename, :meth:`~calnotes.runs.store.RunStore.save`), so the
nodes need no shared file system. Checkpoints go to ``checkpoint_root/<config hash>``
(default :func:`~calnotes.runs.store.default_checkpoint_root`): on a cluster, name a shared
folder and a retried run resumes from its last epoch; elsewhere it restarts from scratch.

Faults: a task whose worker process or node dies is retried by Ray (``max_retries``
times) on any live node; the driver stores each config once (a run arriving twice is
kept once by the store's first-writer rule). An exception raised by a run is not retried:
it is reported with the run's name and config hash, the other runs go on, and
:class:`~calnotes.runs.executor.RunsFailed` lists every failed run at the end.

Progress: one line per update (done / running / waiting, the node of each running run)
and, at the end, a table of the cost of each run from its provenance, on ``stream``
(default ``sys.stdout``). In a Jupyter kernel (a chapter executed by papermill) the
progress lines go to the terminal that started the kernel instead, so that ``make run``
shows them while a cell trains and the notebook keeps only the cost table.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import socket
import sys
import time
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import pandas as pd
import torch

from calnotes._io import file_lock, scratch_dir
from calnotes.runs import experiment as experiments
from calnotes.runs.store import (
    LOCK_TIMEOUT,
    RunStore,
    StoredRun,
    config_hash,
    default_checkpoint_root,
    load_or_run,
)

__all__ = ["BACKENDS", "BACKEND_VARIABLE", "LOOPBACK", "ExecutionReport", "RunsFailed",
           "chapter_runs", "choose_backend", "compute_runs", "execute", "keep_loopback",
           "ray_available", "run_name"]

BACKENDS = ("auto", "sequential", "ray")
#: Environment variable naming the backend of every ``backend="auto"`` call.
BACKEND_VARIABLE = "CALNOTES_EXECUTOR"
#: Seconds between two progress lines while Ray runs train.
PROGRESS_EVERY = 10.0


class RunsFailed(RuntimeError):
    """Runs that raised an exception; ``failures`` maps config hash to ``(name, error text)``."""

    def __init__(self, failures: Mapping[str, tuple[str, str]]) -> None:
        self.failures = dict(failures)
        lines = [f"{len(self.failures)} run(s) failed:"]
        lines += [f"  {digest} ({name}): {_summary(error)}"
                  for digest, (name, error) in self.failures.items()]
        super().__init__("\n".join(lines))


def _summary(error: str) -> str:
    """The exception line of a formatted traceback (its first line after the frames)."""
    lines = error.strip().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("Traceback ")]
    for line in lines[starts[-1] + 1 if starts else 0:]:
        if line and not line[0].isspace():
            return line
    return lines[-1] if lines else ""


@dataclass
class ExecutionReport:
    """What :func:`execute` did: ``trained`` and ``stored_before`` config hashes (in the
    order given), the ``backend`` used, its wall time and each trained run's cost."""

    backend: str
    trained: list[str] = field(default_factory=list)
    stored_before: list[str] = field(default_factory=list)
    seconds: float = 0.0
    cost: pd.DataFrame = field(default_factory=pd.DataFrame)


def ray_available() -> bool:
    """Whether the ``ray`` package is installed (``pip install calnotes[ray]``)."""
    return importlib.util.find_spec("ray") is not None


def run_name(config: Mapping[str, Any]) -> str:
    """A short human name of a run: dataset, model, loss (and meta method), seed."""
    meta = config.get("meta")
    loss = config["loss"] + ("" if meta is None else f"+meta {meta['learner']}/{meta['outer']}")
    return f"{config['dataset']}/{config['model']}/{loss} seed {config['seed']}"


def choose_backend(backend: str, missing: int, address: str | None) -> str:
    """The backend :func:`execute` uses (see the module docstring for the rule)."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    chosen = os.environ.get(BACKEND_VARIABLE, "")
    if backend == "auto" and chosen:
        if chosen not in BACKENDS[1:]:
            raise ValueError(f"${BACKEND_VARIABLE} must be one of "
                             f"{', '.join(BACKENDS[1:])}, got {chosen!r}")
        backend = chosen
    address = address or os.environ.get("RAY_ADDRESS") or None
    if backend == "ray" or (backend == "auto" and address):
        if not ray_available():
            raise ValueError("backend 'ray' (or RAY_ADDRESS) needs the ray package: "
                             "pip install 'calnotes[ray]'")
        return "ray"
    if backend == "auto" and missing > 1 and ray_available():
        return "ray"
    return "sequential"


def _check_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return value


# --------------------------------------------------------------------------- the task


def train_task(config: dict[str, Any], device: str, checkpoint_root: str, threads: int,
               lock_timeout: float, board: Any = None) -> tuple[experiments.RunResult, str]:
    """One run trained where the task landed: ``(result without its model, node name)``.

    Checkpoints go to ``checkpoint_root/<config hash>``, under a lock so that two workers
    never train the same config at once (a retry waits for a worker that is still alive).
    ``board`` (a Ray actor) is told which node took the run.
    """
    torch.set_num_threads(threads)
    digest = config_hash(config)
    if board is not None:
        board.start.remote(digest, _node_name())
    root = Path(checkpoint_root)
    with file_lock(root / f"{digest}.lock", timeout=lock_timeout,
                   what=f"training run {digest}"):
        result = experiments.train_run(config, device=device,
                                       checkpoint_dir=str(root / digest), progress=False)
    result.model = None  # the driver stores logits, not weights
    return result, _node_name()


def _node_name() -> str:
    """``host/node id`` of the Ray node running this task (the host alone outside Ray)."""
    host = socket.gethostname()
    with contextlib.suppress(Exception):
        import ray

        if ray.is_initialized():
            return f"{host}/{ray.get_runtime_context().get_node_id()[:6]}"
    return host


# --------------------------------------------------------------------------- execute


def execute(
    configs: Sequence[Mapping[str, Any]],
    *,
    label: str | None = None,
    store: RunStore | None = None,
    checkpoint_root: str | os.PathLike | None = None,
    device: str | torch.device = "auto",
    backend: str = "auto",
    address: str | None = None,
    threads: int = 1,
    max_retries: int = 3,
    lock_timeout: float = LOCK_TIMEOUT,
    stream: TextIO | None = None,
    ray_options: Mapping[str, Any] | None = None,
) -> ExecutionReport:
    """Train and store every run of ``configs`` that the store lacks (see the module doc).

    Runs are submitted in the order given. ``threads`` is the number of CPU threads of
    each Ray task (the sequential backend keeps this process's setting). Failures and the
    cost table go to ``stream`` (default ``sys.stdout``), progress lines too, except in a
    Jupyter kernel writing to its own output (see the module docstring). ``ray_options``
    go to ``ray.init`` when this call starts or joins Ray (e.g. a ``runtime_env``). Raises
    :class:`~calnotes.runs.executor.RunsFailed` after the other runs are done if any run raised.
    """
    if isinstance(configs, (str, bytes, Mapping)) or not isinstance(configs, Sequence):
        raise TypeError(f"configs must be a list of config dicts, got {type(configs).__name__}")
    store = RunStore() if store is None else store
    if not isinstance(store, RunStore):
        raise TypeError(f"store must be a RunStore, got {type(store).__name__}")
    _check_int("threads", threads, 1)
    _check_int("max_retries", max_retries, 0)
    progress = _terminal() if stream is None else None
    stream = sys.stdout if stream is None else stream
    progress = stream if progress is None else progress
    start = time.perf_counter()
    missing: dict[str, dict[str, Any]] = {}
    report = ExecutionReport(backend="")
    for config in configs:
        if not isinstance(config, Mapping):
            raise TypeError(f"each config must be a dict, got {type(config).__name__}")
        cfg = experiments.default_config(**config)
        digest = config_hash(cfg)
        if digest in missing or digest in report.stored_before:
            continue
        if store.exists(cfg):
            report.stored_before.append(digest)
        else:
            missing[digest] = cfg
    report.backend = choose_backend(backend, len(missing), address)
    root = default_checkpoint_root() if checkpoint_root is None else Path(checkpoint_root)
    if not missing:
        return report
    run = _run_ray if report.backend == "ray" else _run_sequential
    nodes, failures = run(missing, label=label, store=store, root=root, device=str(device),
                          address=address, threads=threads, max_retries=max_retries,
                          lock_timeout=lock_timeout, stream=stream, progress=progress,
                          ray_options=dict(ray_options or {}))
    report.trained = [d for d in missing if d not in failures]
    report.seconds = time.perf_counter() - start
    report.cost = _cost(store, [missing[d] for d in report.trained], nodes)
    if not report.cost.empty:
        print(f"cost of the {len(report.cost)} run(s) trained ({report.backend}, "
              f"{report.seconds:.0f} s of wall time):", file=stream)
        print(report.cost.to_string(index=False), file=stream, flush=True)
    if failures:
        raise RunsFailed(failures)
    return report


def _terminal() -> TextIO | None:
    """The terminal that started this Jupyter kernel (its original stderr), if any.

    ipykernel sends what is written to file descriptor 2 to the notebook and keeps a copy
    of the original descriptor; writing to that copy reaches the terminal alone."""
    fd = getattr(sys.stderr, "_original_stdstream_copy", None)
    if not isinstance(fd, int):
        return None
    try:
        return open(fd, "w", buffering=1, closefd=False)  # noqa: SIM115 (not ours to close)
    except OSError:
        return None


def _line(stream: TextIO, done: int, total: int, running: Mapping[str, str], waiting: int,
          failed: int) -> None:
    where = ", ".join(f"{d}@{node}" for d, node in running.items())
    print(f"runs: {done}/{total} done, {len(running)} running"
          f"{' (' + where + ')' if where else ''}, {waiting} waiting"
          f"{f', {failed} failed' if failed else ''}", file=stream, flush=True)


def _report_failure(stream: TextIO, digest: str, name: str, error: str) -> None:
    print(f"run {digest} ({name}) failed; the other runs go on:\n{error}", file=stream,
          flush=True)


def _run_sequential(missing: dict[str, dict[str, Any]], *, label: str | None, store: RunStore,
                    root: Path, device: str, lock_timeout: float, stream: TextIO,
                    progress: TextIO, **_: Any
                    ) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    nodes: dict[str, str] = {}
    failures: dict[str, tuple[str, str]] = {}
    total = len(missing)
    for i, (digest, cfg) in enumerate(missing.items()):
        _line(progress, i - len(failures), total, {digest: _node_name()}, total - i - 1,
              len(failures))
        try:
            load_or_run(cfg, label=label, store=store, device=device, checkpoint_root=root,
                        progress=False, lock_timeout=lock_timeout)
            nodes[digest] = _node_name()
        except Exception:
            failures[digest] = (run_name(cfg), traceback.format_exc())
            _report_failure(stream, digest, run_name(cfg), failures[digest][1])
    _line(progress, total - len(failures), total, {}, 0, len(failures))
    return nodes, failures


#: Host names of a cluster on this machine's loopback interface.
LOOPBACK = ("127.0.0.1", "localhost")


def keep_loopback() -> None:
    """Make Ray keep a loopback address where it is given (in this process).

    On Linux Ray replaces ``127.0.0.1`` in a node's or a driver's address with the
    machine's outward address, so that other machines can reach it; a cluster started on
    127.0.0.1 (which no other machine can reach) is then not found. Called by
    :func:`execute` for an address on the loopback interface, and by the scripts that start
    such a cluster."""
    import ray._private.services as services

    resolve = services.resolve_ip_for_localhost
    if getattr(resolve, "keeps_loopback", False):
        return

    def resolve_keeping_loopback(host: str) -> str:
        return host if host in LOOPBACK else resolve(host)

    resolve_keeping_loopback.keeps_loopback = True  # type: ignore[attr-defined]
    services.resolve_ip_for_localhost = resolve_keeping_loopback


def _connect_ray(address: str | None, options: Mapping[str, Any]) -> bool:
    """``ray.init`` unless already connected; True when this call connected."""
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None and address.rsplit(":", 1)[0] in LOOPBACK:
        keep_loopback()
    kwargs: dict[str, Any] = {"log_to_driver": False, "include_dashboard": False}
    if address is None:  # a local Ray on this machine's cores, torn down at the end
        kwargs.update(address="local", num_cpus=os.cpu_count() or 1)
    else:
        kwargs = {"address": address, "log_to_driver": False}
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(**{**kwargs, **options})
    return True


def _run_ray(missing: dict[str, dict[str, Any]], *, label: str | None, store: RunStore,
             root: Path, device: str, address: str | None, threads: int, max_retries: int,
             lock_timeout: float, stream: TextIO, progress: TextIO,
             ray_options: Mapping[str, Any]) -> tuple[dict[str, str], dict[str, tuple[str, str]]]:
    import ray

    connected = _connect_ray(address, ray_options)
    try:
        gpu = device.startswith("cuda")
        task = ray.remote(train_task).options(
            num_cpus=0 if gpu else threads, num_gpus=1 if gpu else 0,
            max_retries=max_retries, retry_exceptions=False)
        board: Any = ray.remote(num_cpus=0)(_Board).remote()  # where each task started
        pending = {task.remote(cfg, device, str(root), threads, lock_timeout, board): digest
                   for digest, cfg in missing.items()}
        nodes: dict[str, str] = {}
        failures: dict[str, tuple[str, str]] = {}
        total, last = len(missing), 0.0
        while pending:
            # every run finished within the second (not just one), so none looks running
            ready, _ = ray.wait(list(pending), num_returns=len(pending), timeout=1.0)
            for ref in ready:
                digest = pending.pop(ref)
                cfg = missing[digest]
                try:
                    result, node = ray.get(ref)
                except Exception as err:  # the run raised, or its retries ran out
                    failures[digest] = (run_name(cfg), _ray_error_text(err))
                    _report_failure(stream, digest, run_name(cfg), failures[digest][1])
                    continue
                store.save(result, label=label, lock_timeout=lock_timeout)
                nodes[digest] = node
            now = time.monotonic()
            if ready or now - last >= PROGRESS_EVERY:
                started = ray.get(board.where.remote())
                running = {d: started[d] for d in pending.values() if d in started}
                _line(progress, len(nodes), total, running, len(pending) - len(running),
                      len(failures))
                last = now
        return nodes, failures
    finally:
        if connected:
            ray.shutdown()


def _ray_error_text(err: BaseException) -> str:
    cause = getattr(err, "cause", None)
    if isinstance(cause, BaseException):
        return "".join(traceback.format_exception(type(cause), cause, cause.__traceback__))
    return f"{type(err).__name__}: {err}"


class _Board:
    """Where each Ray task started: config hash -> node name (read by the driver)."""

    def __init__(self) -> None:
        self.started: dict[str, str] = {}

    def start(self, digest: str, node: str) -> None:
        self.started[digest] = node

    def where(self) -> dict[str, str]:
        return dict(self.started)


def _cost(store: RunStore, configs: list[dict[str, Any]], nodes: Mapping[str, str]
          ) -> pd.DataFrame:
    """One row per trained run, from its stored provenance: who, where, how long."""
    rows = []
    for cfg in configs:
        run = store.load(cfg)
        digest, p = config_hash(cfg), run.provenance
        rows.append({"run": digest, "name": run_name(cfg), "node": nodes.get(digest),
                     "device": p.get("device"), "threads": p.get("cpu_threads"),
                     "seconds": round(float(p.get("seconds") or 0.0), 1)})
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- helpers


def compute_runs(
    configs: list[Mapping[str, Any]], *, label: str | None = None, workers: int = 1,
    store: RunStore | None = None, checkpoint_root: str | os.PathLike | None = None,
    device: str | torch.device = "auto",
) -> int:
    """Train and store every run of ``configs`` that the store lacks; returns how many.

    ``workers=1`` trains them one after another in this process, unless ``$RAY_ADDRESS``
    sends them to a cluster; ``workers > 1`` lets :func:`execute` choose (Ray when
    installed). A config given twice is trained once; a killed run resumes from its
    checkpoint. Raises :class:`~calnotes.runs.executor.RunsFailed` after the others if runs raised.
    """
    _check_int("workers", workers, 1)
    if not isinstance(configs, list):
        raise TypeError(f"configs must be a list of config dicts, got {type(configs).__name__}")
    backend = "auto" if workers > 1 or os.environ.get("RAY_ADDRESS") else "sequential"
    report = execute(configs, label=label, store=store, checkpoint_root=checkpoint_root,
                     device=device, backend=backend)
    return len(report.trained)


def chapter_runs(
    configs: Sequence[Mapping[str, Any]], *, label: str | None = None, use_store: bool,
    smoke: bool, device: str | torch.device = "auto", backend: str = "auto",
) -> list[StoredRun]:
    """The runs of ``configs``, in order: loaded from ``results/``, or trained together
    (:func:`execute`) and stored first. Like :func:`~calnotes.runs.store.chapter_run`,
    SMOKE runs and ``use_store=False`` train into a fresh temporary store, removed
    when the process exits."""
    for flag, value in (("use_store", use_store), ("smoke", smoke)):
        if not isinstance(value, bool):
            raise TypeError(f"{flag} must be a bool, got {type(value).__name__}")
    if use_store and not smoke:
        store, root = RunStore(), None
    else:
        scratch = scratch_dir("calnotes-runs-")
        store, root = RunStore(scratch / "results"), scratch / "checkpoints"
    execute(list(configs), label=label, store=store, checkpoint_root=root, device=device,
            backend=backend)
    return [store.load(cfg) for cfg in configs]
