"""CPU thread policy: how many intra-op threads torch should use on this machine, now.

torch starts one intra-op thread per physical core. Every parallel operator ends at a
barrier that waits for its slowest thread, so on a machine whose cores other processes
keep busy, a thread that loses its core stalls the whole operator until the scheduler
runs it again (with GNU OpenMP the waiting threads also spin, taking time from the one
being waited for). A training step runs hundreds of operators: on a 2-core machine with
six other busy processes a ResNet-20 step took 5x longer with 2 threads than with 1.

Policy (:func:`auto_threads`): the CPUs this process may use (affinity mask and cgroup
quota) times the share of CPU time that other processes left free during a short sample
of ``/proc/stat``, rounded, at least 1 and at most torch's default and the process's
current setting (a worker process pinned to one thread with ``torch.set_num_threads(1)``
stays at one, even if it samples an idle machine before its siblings start). On a busy
2-core machine that is 1; on an idle one 2; on an idle 64-core machine torch's default.
Where ``/proc/stat`` is missing (not Linux) the 1-minute load average stands in.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

#: torch's own choice (one thread per physical core), read before anything changes it.
TORCH_DEFAULT_THREADS = torch.get_num_threads()


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask, capped by a cgroup v2 CPU quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        count = os.cpu_count() or 1
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            count = min(count, max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass
    return max(1, count)


def _cpu_jiffies() -> tuple[int, int]:
    """``(busy, total)`` jiffies of all CPUs since boot, from the first line of /proc/stat."""
    with open("/proc/stat") as fh:
        fields = [int(v) for v in fh.readline().split()[1:9]]  # user .. steal
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def busy_share_of_others(window: float = 0.1) -> float:
    """Share (0 to 1) of the machine's CPU time that other processes used during
    ``window`` seconds: the busy jiffies of ``/proc/stat`` less this process's own CPU
    time. Without ``/proc/stat`` the 1-minute load average per CPU (which counts this
    process too) stands in."""
    cpus = os.cpu_count() or 1
    try:
        busy0, total0 = _cpu_jiffies()
        own0, wall0 = time.process_time(), time.perf_counter()
        time.sleep(window)
        busy1, total1 = _cpu_jiffies()
        own1, wall1 = time.process_time(), time.perf_counter()
    except (OSError, ValueError, IndexError):
        try:
            return min(1.0, os.getloadavg()[0] / cpus)
        except OSError:
            return 0.0
    share = (busy1 - busy0) / max(1, total1 - total0)
    own = (own1 - own0) / max(1e-9, wall1 - wall0) / cpus
    return min(1.0, max(0.0, share - own))


#: :func:`auto_threads` answers from its last sample for this many seconds (runs started
#: in quick succession, as a chapter's or the tests', cost one sample).
AUTO_THREADS_TTL = 30.0
_last_answer: tuple[float, int] | None = None


def auto_threads(window: float = 0.1) -> int:
    """The policy above: the usable CPUs times the share of CPU time others leave free,
    rounded, clamped to ``[1, min(torch default, torch.get_num_threads())]``."""
    global _last_answer
    now = time.monotonic()
    if _last_answer is not None and now - _last_answer[0] < AUTO_THREADS_TTL:
        return _last_answer[1]
    cpus = usable_cpus()
    free = cpus * (1.0 - busy_share_of_others(window))
    cap = min(TORCH_DEFAULT_THREADS, torch.get_num_threads())
    answer = max(1, min(cap, cpus, math.floor(free + 0.5)))
    _last_answer = (now, answer)
    return answer


@contextmanager
def cpu_threads(threads: int | None) -> Iterator[int]:
    """Run the block with ``threads`` intra-op threads (``None``: as they are) and restore
    the previous number afterwards. Yields the number in force."""
    before = torch.get_num_threads()
    if threads is not None and threads != before:
        torch.set_num_threads(threads)
    try:
        yield torch.get_num_threads()
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)
