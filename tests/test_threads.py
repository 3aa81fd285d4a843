"""Tests of calnotes._threads: the CPU thread policy and its context manager."""

from __future__ import annotations

import pytest
import torch

from calnotes import _threads as T


@pytest.fixture(autouse=True)
def no_cached_answer(monkeypatch):
    monkeypatch.setattr(T, "_last_answer", None)


def test_usable_cpus_is_positive_and_at_most_the_cpu_count() -> None:
    import os

    assert 1 <= T.usable_cpus() <= (os.cpu_count() or 1)


def test_busy_share_of_others_is_a_share() -> None:
    assert 0.0 <= T.busy_share_of_others(0.05) <= 1.0


@pytest.mark.parametrize(("cpus", "busy", "default", "expected"), [
    (2, 1.0, 2, 1),    # a 2-core machine that others keep busy: one thread
    (2, 0.0, 2, 2),    # the same machine idle: both cores
    (2, 0.3, 2, 1),    # 1.4 CPUs free rounds to 1
    (2, 0.2, 2, 2),    # 1.6 CPUs free rounds to 2
    (64, 0.0, 32, 32), # an idle big machine: torch's default (physical cores)
    (64, 0.75, 32, 16),
])
def test_auto_threads_policy(monkeypatch, cpus, busy, default, expected) -> None:
    monkeypatch.setattr(T, "usable_cpus", lambda: cpus)
    monkeypatch.setattr(T, "busy_share_of_others", lambda window=0.1: busy)
    monkeypatch.setattr(T, "TORCH_DEFAULT_THREADS", default)
    with T.cpu_threads(default):  # the process at torch's default
        assert T.auto_threads() == expected


def test_auto_threads_never_exceed_the_process_setting(monkeypatch) -> None:
    monkeypatch.setattr(T, "usable_cpus", lambda: 2)
    monkeypatch.setattr(T, "busy_share_of_others", lambda window=0.1: 0.0)  # idle machine
    monkeypatch.setattr(T, "TORCH_DEFAULT_THREADS", 2)
    with T.cpu_threads(1):  # as a worker process pinned to one thread
        assert T.auto_threads() == 1
    monkeypatch.setattr(T, "_last_answer", None)
    with T.cpu_threads(2):
        assert T.auto_threads() == 2


def test_auto_threads_answers_from_its_last_sample_for_a_while(monkeypatch) -> None:
    shares = iter([1.0, 0.0])
    monkeypatch.setattr(T, "usable_cpus", lambda: 2)
    monkeypatch.setattr(T, "TORCH_DEFAULT_THREADS", 2)
    monkeypatch.setattr(T, "busy_share_of_others", lambda window=0.1: next(shares))
    with T.cpu_threads(2):
        assert T.auto_threads() == 1
        assert T.auto_threads() == 1  # cached: the second share is not read
        monkeypatch.setattr(T, "AUTO_THREADS_TTL", 0.0)
        assert T.auto_threads() == 2


def test_cpu_threads_sets_and_restores_even_after_an_error() -> None:
    before = torch.get_num_threads()
    with pytest.raises(RuntimeError), T.cpu_threads(1) as n:
        assert n == 1 and torch.get_num_threads() == 1
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before
    with T.cpu_threads(None) as n:
        assert n == before
