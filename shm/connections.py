"""Open client connections of the node's workers, in all and per client address: what the node-wide
connection limits (server.max_connections, server.max_connections_per_ip) are checked against, while
each worker accepts on its own listening socket.

Layout: a 64-byte header (shm.segment: magic, version, workers, buckets, row words), a 64-byte line of log marks (MARKS u64
words: when a line about a cause was last logged, monotonic ms, so causes are logged once per interval
across the node, see `LogMarks`), then one row of u32 words per worker, padded to whole cache lines:

    word 0        open connections of the worker
    words 1..B    its open connections per client-address bucket (`bucket_of(address)`)

Invariants:
- Worker w is the only writer of row w (aligned u32 stores); anyone sums a column over the rows without
  locks. A worker deciding on a new connection sees the others' counts of a moment ago, so two workers
  accepting at once may both pass a limit: the node holds at most limit + workers - 1 connections.
- A client address maps to one of B buckets by a hash that is the same in every process (crc32 of its
  text); addresses that share a bucket share its count, which can only make the per-address limit
  stricter, never looser.
- A worker zeroes its row when it starts, and the supervisor when it reaps a worker, so the connections
  of a dead worker are never counted again.
- Log marks have many writers: a worker claims a cause's mark (reads it and, if an interval has passed, sets
  it) under an flock on the segment's file, so each cause gets one line per interval for the whole node, even
  from two workers refusing at the same moment.
- The segment is named by the caller under the node instance (shm.instance.connections_name), whose
  shutdown unlinks it.
"""

from __future__ import annotations

import fcntl
import zlib
from typing import Any

import posix_ipc

from shmbroker.shm.segment import HEADER_BYTES, Layout, Segment

MARKS = 8
MARKS_BYTES = MARKS * 8
WORD_BYTES = 4
LINE_WORDS = 64 // WORD_BYTES
ROWS_START = HEADER_BYTES + MARKS_BYTES
LAYOUT = Layout("a connection count table", magic=0x534E_4E4F_4343_4D53, version=1,  # "SMCCONNS" little-endian
                sizes=("workers", "buckets", "row_words"),
                bytes_for=lambda workers, buckets, row_words: ROWS_START + workers * row_words * WORD_BYTES)


class ConnectionCounts:
    def __init__(self, segment: Segment) -> None:
        self.name = segment.name
        self.workers = segment.sizes["workers"]
        self.buckets = segment.sizes["buckets"]
        self._row_words = segment.sizes["row_words"]
        self._segment = segment
        memory = memoryview(segment.memory)
        self._words = memory[ROWS_START:ROWS_START + self.workers * self._row_words * WORD_BYTES].cast("I")
        self._marks = memory[HEADER_BYTES:ROWS_START].cast("Q")

    @classmethod
    def create(cls, name: str, workers: int, buckets: int) -> "ConnectionCounts":
        if workers <= 0 or buckets <= 0:
            raise ValueError("a connection count table needs workers and buckets")
        row_words = -(-(1 + buckets) // LINE_WORDS) * LINE_WORDS
        return cls(Segment.create(name, LAYOUT, workers=workers, buckets=buckets, row_words=row_words))

    @classmethod
    def attach(cls, name: str) -> "ConnectionCounts":
        return cls(Segment.attach(name, LAYOUT))

    def bucket_of(self, address: str) -> int:
        return zlib.crc32(address.encode()) % self.buckets

    # -- readers ----------------------------------------------------------------------------------

    def total(self) -> int:
        """Open connections of the whole node."""
        words, step = self._words, self._row_words
        return sum(words[w * step] for w in range(self.workers))

    def in_bucket(self, bucket: int) -> int:
        """Open connections of the whole node from the addresses of `bucket`."""
        words, step = self._words, self._row_words
        return sum(words[w * step + 1 + bucket] for w in range(self.workers))

    # -- the owner of a row (a worker), or the supervisor while no worker owns it -----------------

    def row(self, worker: int) -> "WorkerConnections":
        if not 0 <= worker < self.workers:
            raise IndexError(f"worker {worker} outside connection table of {self.workers}")
        return WorkerConnections(self, worker * self._row_words)

    def reset(self, worker: int) -> None:
        start = worker * self._row_words
        self._words[start:start + self._row_words] = memoryview(bytes(self._row_words * WORD_BYTES)).cast("I")

    def log_marks(self, causes: tuple[str, ...]) -> "LogMarks":
        if len(causes) > MARKS:
            raise ValueError(f"at most {MARKS} log causes")
        return LogMarks(self._marks, causes, posix_ipc.SharedMemory(self.name))

    def close(self) -> None:
        self._words.release()
        self._marks.release()
        self._segment.close()


class LogMarks:
    """When a line about each cause was last logged anywhere in the node (monotonic milliseconds, 0: never).
    A claim reads and sets a mark under an flock on the segment's file: two workers refusing at the same instant
    must not both see the mark unset and both log."""

    def __init__(self, words: memoryview, causes: tuple[str, ...], segment: Any) -> None:
        self._words = words
        self._index = {cause: i for i, cause in enumerate(causes)}
        self._segment = segment  # a posix_ipc.SharedMemory of this table, open for its fd

    def claim(self, cause: str, now: float, interval_s: float) -> bool:
        """True, and `cause` marked at `now`, unless it was marked less than interval_s ago."""
        index = self._index[cause]
        fcntl.flock(self._segment.fd, fcntl.LOCK_EX)
        try:
            last = self._words[index]
            if last and now - last / 1000 < interval_s:
                return False
            self._words[index] = max(1, int(now * 1000))
            return True
        finally:
            fcntl.flock(self._segment.fd, fcntl.LOCK_UN)

    def close(self) -> None:
        self._segment.close_fd()


class WorkerConnections:
    """One worker's row: count its connections as they open and close."""

    __slots__ = ("_words", "_start")

    def __init__(self, counts: ConnectionCounts, start: int) -> None:
        self._words = counts._words
        self._start = start

    def opened(self, bucket: int) -> None:
        words, start = self._words, self._start
        words[start] += 1
        words[start + 1 + bucket] += 1

    def closed(self, bucket: int) -> None:
        words, start = self._words, self._start
        words[start] = max(0, words[start] - 1)
        words[start + 1 + bucket] = max(0, words[start + 1 + bucket] - 1)

    @property
    def count(self) -> int:
        return self._words[self._start]
