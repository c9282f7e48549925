"""The one release of start-up's freed memory."""

from __future__ import annotations

import ctypes

import pytest

from smlens.pipeline import heap
from smlens.pipeline.sampler import Sampler
from smlens.sources.sim import Scenario, SimBackend


def test_released_once_after_the_start_up_ticks(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(heap, "release_freed_memory", lambda: calls.append(1))
    sampler = Sampler(SimBackend(Scenario.steady(1)), [], hostname="node-a", interval=1.0)
    sampler.open()
    sampler.subscribe(heap.release_after_start_up)
    for ticks in range(1, 6):
        sampler.tick()
        assert len(calls) == (ticks >= heap.START_UP_TICKS)


def test_glibc_trims() -> None:
    assert hasattr(ctypes.CDLL(None), "malloc_trim")  # this machine's libc is glibc: the trim is not skipped
    heap.release_freed_memory()


def test_a_libc_without_malloc_trim_only_collects(monkeypatch: pytest.MonkeyPatch) -> None:
    class Musl:
        """musl's libc as ctypes shows it: looking up a symbol it lacks raises AttributeError."""

        def __getattr__(self, name: str) -> object:
            raise AttributeError(f"python3: symbol not found: {name}")

    collected: list[int] = []
    monkeypatch.setattr(heap.ctypes, "CDLL", lambda name: Musl())
    monkeypatch.setattr(heap.gc, "collect", lambda: collected.append(1) or 0)
    heap.release_freed_memory()
    assert collected == [1]
