"""Gives the memory that start-up freed back to the system."""

from __future__ import annotations

import ctypes
import gc
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from smlens.model import Snapshot

# By the third tick every steady-state structure exists (the first only primes counters), and what imports,
# set-up and the first ticks freed is garbage.
START_UP_TICKS = 3


def release_freed_memory() -> None:
    """Imports and set-up free much of what they allocate, but glibc keeps freed pages inside its heap until
    ``malloc_trim`` hands them back. Elsewhere than glibc
    (musl has no ``malloc_trim``) this only collects garbage."""
    gc.collect()
    trim = getattr(ctypes.CDLL(None), "malloc_trim", None)
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int  # glibc: int malloc_trim(size_t pad)
        trim(0)


def release_after_start_up(snapshot: Snapshot) -> None:
    """A sampler listener: :func:`release_freed_memory` once, after the start-up ticks."""
    if snapshot.sequence == START_UP_TICKS:
        release_freed_memory()
