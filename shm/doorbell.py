"""Doorbells: how a ring producer wakes a consumer that sleeps instead of polling.

Two kinds, because the two consumers sleep differently:
- `SemaphoreDoorbell` (a named posix_ipc semaphore): the timer process sleeps on one of
  these shared by all workers, with a timeout equal to its next timer deadline.
- `EventfdDoorbell` (a Linux eventfd): a network worker sleeps in one selectors call over
  its sockets and this fd. It is created by the supervisor before the children start and
  inherited (fork, or subprocess.Popen(pass_fds=[bell.fileno()])). `PipeDoorbell` is the
  same thing on a pipe (two fds), for platforms or tools without eventfd.

Consumer loop, for a consumer that sleeps on one ring's doorbell (shm.ring's RingReader.wait_batch does it):
    if reader.announce_sleep(): bell.wait(timeout); reader.woke()
Every wait() takes the rings it returns for (`EventfdDoorbell.wait` is edge-triggered, the others drain), so
a consumer that sleeps only in wait() needs no drain(). One that watches the fd in its own selector drains:
    bell.drain(); if reader.announce_sleep(): selector.select(timeout); reader.woke()

Invariants:
- `ring()` never blocks and never fails for a live doorbell; rings made while nobody sleeps
  accumulate (semaphore count, eventfd counter) and cost the consumer one spurious wakeup.
- Rings are taken once, so an idle consumer blocks in the kernel and uses no CPU: wait() takes
  them itself (a semaphore or pipe drains after waking; an eventfd wait is edge-triggered); a
  sleeper that watches the fd in its own selector drains before announcing sleep (not on the
  wakeup path, which keeps wakeup latency low).
- `EventfdDoorbell.wait` (epoll, EPOLLET) returns once for the rings made since it last
  returned, whatever the counter holds: every eventfd write is a new edge. Undrained, the
  counter grows by one per ring and saturates only after 2**64 - 2 rings (centuries at a
  million rings a second), past which a ring would add no edge.
- A doorbell only says "look again"; the truth is in the rings. It is used with the
  announce-then-recheck protocol of shm.ring (RingReader.announce_sleep) so no wakeup is lost.
"""

from __future__ import annotations

import os
import select

import posix_ipc

# Bounds the drain loop of a semaphore; more pending rings than this just cause another wakeup.
MAX_SEMAPHORE_DRAIN = 1 << 16
_SEMAPHORE_VALUE = posix_ipc.SEMAPHORE_VALUE_SUPPORTED  # sem_getvalue (Linux: yes; macOS: no)
PIPE_DRAIN_CHUNK = 4096
MAX_PIPE_DRAIN_READS = 64


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
    try:
        posix_ipc.unlink_semaphore(name)
        return True
    except posix_ipc.ExistentialError:
        return False


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
        # ring_fd and RING_BYTES are public for shm.ring's compiled write path, which rings an fd doorbell itself
        # (one C call per frame). -1 once closed, so a writer that outlives its doorbell never writes to a reused fd.
        self.ring_fd = fd
        self._epoll: select.epoll | None = None  # made on first wait(), in the sleeping process

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

    def wait(self, timeout: float | None) -> bool:
        """Sleep until rung or `timeout` seconds pass; True if rung since the last wait() returned.

        Edge-triggered, so the consumer need not drain(): a drain is a syscall per wakeup, and it made the
        consumer heavy enough that the scheduler let it preempt its producer less often. Measured on the paced
        ring latency test (5,000 frames/s, 8 interleaved runs): consumer CPU per wakeup 8.2-8.8 -> 6.4-6.8 us
        (schedstat), p50 9.4 -> 6.0 us at 100 B and 13.2 -> 7.0 us at 4 KiB.
        A ring made while the consumer was awake costs at most one spurious return."""
        return bool(self._waiter().poll(-1 if timeout is None else max(0.0, timeout), 1))

    @property
    def wait_fd(self) -> int:
        """The epoll fd wait() sleeps on: readable once per batch of rings (edge-triggered). shm.ring's compiled
        RingReader.wait_batch sleeps on it directly. -1 once closed."""
        return self._waiter().fileno() if self.ring_fd >= 0 else -1

    def _waiter(self) -> select.epoll:
        # Made in the sleeping process on first use: an epoll made before a fork would be shared with the child.
        if self._epoll is None:
            self._epoll = select.epoll(1)
            self._epoll.register(self.ring_fd, select.EPOLLIN | select.EPOLLET)
        return self._epoll

    def close(self) -> None:
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None
        if self.ring_fd >= 0:
            os.close(self.ring_fd)
            self.ring_fd = -1


class PipeDoorbell:
    """A pipe doorbell for a consumer that sleeps in select/epoll (same API as EventfdDoorbell).

    Measured no latency difference to eventfd on our 2-vCPU VM; costs two fds instead of one.
    """

    RING_BYTES = b"\x01"  # what ring() writes

    def __init__(self, fds: tuple[int, int] | None = None) -> None:
        """Create a new pipe, or wrap inherited (read_fd, write_fd)."""
        if fds is None:
            fds = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        # ring_fd (the write end) is public for shm.ring's compiled write path, as with EventfdDoorbell.
        self._read_fd, self.ring_fd = fds
        os.set_blocking(self._read_fd, False)
        os.set_blocking(self.ring_fd, False)

    def fileno(self) -> int:
        """The fd to register for reading with a selector."""
        return self._read_fd

    def fds(self) -> tuple[int, int]:
        """(read fd, write fd), e.g. for subprocess.Popen(pass_fds=...)."""
        return self._read_fd, self.ring_fd

    def ring(self) -> None:
        """Make the read end readable."""
        try:
            os.write(self.ring_fd, self.RING_BYTES)
        except BlockingIOError:
            pass  # pipe full of rings: it is readable already

    def drain(self) -> int:
        """Reset after a wakeup; returns how many rings had accumulated (0 if none)."""
        total = 0
        for _ in range(MAX_PIPE_DRAIN_READS):
            try:
                chunk = os.read(self._read_fd, PIPE_DRAIN_CHUNK)
            except BlockingIOError:
                break
            total += len(chunk)
            if len(chunk) < PIPE_DRAIN_CHUNK:
                break
        return total

    def wait(self, timeout: float | None) -> bool:
        """Sleep until rung or `timeout` seconds pass; True if rung. Takes the rings it woke for (as every
        doorbell's wait() does), so the next wait() sleeps until a new ring."""
        ready, _, _ = select.select([self._read_fd], [], [], timeout)
        if ready:
            self.drain()
        return bool(ready)

    def close(self) -> None:
        for fd in (self._read_fd, self.ring_fd):
            if fd >= 0:
                os.close(fd)
        self._read_fd = self.ring_fd = -1
