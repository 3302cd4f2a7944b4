"""Open client connections of the node's workers, in all and per client address: what the node-wide
connection limits (server.max_connections, server.max_connections_per_ip) are checked against, while
each worker accepts on its own listening socket.

Layout: a 64-byte header (magic, workers, buckets, row words), a 64-byte line of log marks (MARKS u64
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
- Log marks have many writers: two workers logging the same cause at the same moment may both log
  (a race the log can afford); otherwise one line per cause per interval for the whole node.
- The segment is named by the caller under the node instance (shm.instance.connections_name), whose
  shutdown unlinks it.
"""

from __future__ import annotations

import mmap
import struct
import zlib

import posix_ipc

MAGIC = 0x534E_4E4F_4343_4D53  # "SMCCONNS" little-endian
HEADER = struct.Struct("<qqqq")
HEADER_BYTES = 64
MARKS = 8
MARKS_BYTES = MARKS * 8
WORD_BYTES = 4
LINE_WORDS = 64 // WORD_BYTES
ROWS_START = HEADER_BYTES + MARKS_BYTES


class ConnectionCounts:
    def __init__(self, name: str, memory: mmap.mmap) -> None:
        magic, workers, buckets, row_words = HEADER.unpack_from(memory, 0)
        if magic != MAGIC or ROWS_START + workers * row_words * WORD_BYTES > len(memory):
            memory.close()
            raise ValueError(f"{name} is not a connection count table of this version")
        self.name = name
        self.workers = workers
        self.buckets = buckets
        self._row_words = row_words
        self._memory = memory
        self._words = memoryview(memory)[ROWS_START:ROWS_START + workers * row_words * WORD_BYTES].cast("I")
        self._marks = memoryview(memory)[HEADER_BYTES:ROWS_START].cast("Q")

    @classmethod
    def create(cls, name: str, workers: int, buckets: int) -> "ConnectionCounts":
        if workers <= 0 or buckets <= 0:
            raise ValueError("a connection count table needs workers and buckets")
        row_words = -(-(1 + buckets) // LINE_WORDS) * LINE_WORDS
        size = ROWS_START + workers * row_words * WORD_BYTES
        shared = posix_ipc.SharedMemory(name, posix_ipc.O_CREX, mode=0o600, size=size)
        try:
            memory = mmap.mmap(shared.fd, size)
        finally:
            shared.close_fd()
        HEADER.pack_into(memory, 0, MAGIC, workers, buckets, row_words)
        return cls(name, memory)

    @classmethod
    def attach(cls, name: str) -> "ConnectionCounts":
        shared = posix_ipc.SharedMemory(name)
        try:
            memory = mmap.mmap(shared.fd, shared.size)
        finally:
            shared.close_fd()
        return cls(name, memory)

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
        return LogMarks(self._marks, causes)

    def close(self) -> None:
        self._words.release()
        self._marks.release()
        self._memory.close()


class LogMarks:
    """When a line about each cause was last logged anywhere in the node (monotonic seconds, None: never)."""

    def __init__(self, words: memoryview, causes: tuple[str, ...]) -> None:
        self._words = words
        self._index = {cause: i for i, cause in enumerate(causes)}

    def last(self, cause: str) -> float | None:
        value = self._words[self._index[cause]]
        return value / 1000 if value else None

    def mark(self, cause: str, now: float) -> None:
        self._words[self._index[cause]] = max(1, int(now * 1000))


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
