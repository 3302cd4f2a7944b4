"""A full memory fence (store->load barrier) callable from Python.

Why it exists: the sleep/wakeup handshake between a ring's producer and consumer is a
Dekker pattern (each side stores its own flag, then loads the other's). x86-64's total
store order keeps stores in order and loads in order, but lets a later load pass an
earlier store still sitting in the store buffer. Without a full fence on both sides,
both could read stale values and the wakeup would be lost.

How: any lock-prefixed instruction is a full barrier on x86-64. CPython's `threading.Lock`
on Linux is a POSIX `sem_t`; an uncontended acquire is a `lock cmpxchg` and release a
`lock xadd` inside glibc. Acquiring and releasing a private lock therefore executes two
locked instructions, at the cost of two C calls (~60 ns), with no ctypes and no extension.

Invariants:
- `full_fence()` orders every load/store issued before it against every load/store after
  it, on x86-64. On arm64 glibc's semaphore CAS is acquire/release only; a real
  `atomic_thread_fence(memory_order_seq_cst)` (a `dmb ish`) would have to replace this.
  The ring's compiled paths (shm/_ringops.c: one-frame write, announce_sleep) already
  use that fence; this one serves the Python paths (batches, and builds without a compiler).
"""

from __future__ import annotations

import threading

_FENCE_LOCK = threading.Lock()
# full_fence() without its Python frame, for the hottest paths: call fence_enter() then fence_exit() (the
# two locked instructions), nothing in between. Measured ~0.3 us less per fence with cold caches.
fence_enter = _FENCE_LOCK.acquire
fence_exit = _FENCE_LOCK.release


def full_fence() -> None:
    """Execute a full memory barrier (two locked instructions on x86-64)."""
    _FENCE_LOCK.acquire()
    _FENCE_LOCK.release()
