"""Doorbells: how a ring producer wakes a consumer that sleeps instead of polling.

Two kinds, because the node's two consumers sleep differently:
- `SemaphoreDoorbell` (a named posix_ipc semaphore): the timer process sleeps on one of these, shared
  by all workers, with a timeout equal to its next timer deadline:
      if announce_sleep_all(readers): bell.wait(timeout); woke_all(readers)
- `EventfdDoorbell` (a Linux eventfd): a network worker sleeps in one selectors call over its sockets
  and this fd. It is created by the supervisor before the children start and inherited
  (subprocess.Popen(pass_fds=[bell.fileno()])). The worker drains it when its selector reports it,
  then announces before the next sleep:
      bell.drain(); if reader.announce_sleep(): selector.select(timeout); reader.woke()

Invariants:
- `ring()` never blocks and never fails for a live doorbell; rings made while nobody sleeps
  accumulate (semaphore count, eventfd counter) and cost the consumer one spurious wakeup.
- Rings are taken once, so an idle consumer blocks in the kernel and uses no CPU: the semaphore's
  wait() drains after waking; the worker drains its eventfd when the selector reports it (not on the
  wakeup path's critical steps, which keeps wakeup latency low).
- A doorbell only says "look again"; the truth is in the rings. It is used with the
  announce-then-recheck protocol of shm.ring (RingReader.announce_sleep) so no wakeup is lost.
"""

from __future__ import annotations

import os

import posix_ipc

from shmbroker.shm.segment import unlink_name

# Bounds the drain loop of a semaphore; more pending rings than this just cause another wakeup.
MAX_SEMAPHORE_DRAIN = 1 << 16
_SEMAPHORE_VALUE = posix_ipc.SEMAPHORE_VALUE_SUPPORTED  # sem_getvalue (Linux: yes; macOS: no)


class SemaphoreDoorbell:
    """A named POSIX semaphore used as a doorbell (shows up as /dev/shm/sem.<name>)."""

    def __init__(self, name: str, *, create: bool = False) -> None:
        """Open the doorbell `name` (a leading '/' name); `create=True` creates it (must not exist)."""
        flags = posix_ipc.O_CREX if create else 0
        try:
            self._sem = posix_ipc.Semaphore(name, flags, mode=0o600, initial_value=0)
        except posix_ipc.ExistentialError as exc:
            raise (FileExistsError if create else FileNotFoundError)(f"doorbell {name!r}: {exc}") from exc
        self.name = name

    def ring(self) -> None:
        """Wake the sleeper (or make its next wait return at once)."""
        self._sem.release()

    def wait(self, timeout: float | None) -> bool:
        """Sleep until rung or `timeout` seconds pass (None: forever, 0: poll). True if rung.
        Also drains rings that piled up (safe: their frames were committed before the ring,
        so the caller's next read sees them), saving a spurious wakeup per extra ring."""
        try:
            self._sem.acquire(timeout)
        except posix_ipc.BusyError:
            return False
        self.drain()
        return True

    def drain(self) -> int:
        """Consume rings that accumulated while we were awake; returns how many."""
        drained = 0
        # Reading the count first spares the failing acquire(0) of every drain: its BusyError costs ~0.45 us
        # against ~0.05 us for sem_getvalue, on the timer process's wakeup path (wait() drains).
        while drained < MAX_SEMAPHORE_DRAIN and (not _SEMAPHORE_VALUE or self._sem.value > 0):
            try:
                self._sem.acquire(0)
            except posix_ipc.BusyError:
                break
            drained += 1
        return drained

    def close(self) -> None:
        """Close this process's handle (the semaphore stays until unlinked)."""
        self._sem.close()

    def unlink(self) -> None:
        """Remove the name; processes holding it open keep working."""
        unlink_semaphore(self.name)


def unlink_semaphore(name: str) -> bool:
    """Remove semaphore `name`; False if it did not exist."""
    return unlink_name(posix_ipc.unlink_semaphore, name)


class EventfdDoorbell:
    """An eventfd doorbell for a consumer that sleeps in select/epoll."""

    RING_BYTES = (1).to_bytes(8, "little")  # what ring() writes: add 1 to the counter

    def __init__(self, fd: int | None = None) -> None:
        """Create a new eventfd, or wrap an inherited one (`fd`)."""
        if fd is None:
            # CLOEXEC: only children that are meant to get it (pass_fds / fork) inherit it.
            fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:
            os.set_blocking(fd, False)
        # ring_fd and RING_BYTES are public for shm.ring's compiled write path, which rings the eventfd itself
        # (one C call per frame). -1 once closed, so a writer that outlives its doorbell never writes to a reused fd.
        self.ring_fd = fd

    def fileno(self) -> int:
        """The fd to register for reading with a selector."""
        return self.ring_fd

    def ring(self) -> None:
        """Make the fd readable."""
        try:
            os.eventfd_write(self.ring_fd, 1)
        except BlockingIOError:
            pass  # counter at its maximum: it is readable already

    def drain(self) -> int:
        """Reset after a wakeup; returns how many rings had accumulated (0 if none)."""
        try:
            return os.eventfd_read(self.ring_fd)
        except BlockingIOError:
            return 0

    def close(self) -> None:
        if self.ring_fd >= 0:
            os.close(self.ring_fd)
            self.ring_fd = -1
