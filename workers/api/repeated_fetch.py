"""The Fetches a connection sends again, kept so that the same request again costs little. An idle consumer sends
the same long poll every max_wait (librdkafka's fetch.wait.max.ms), all day long; its decode, its first read and
its answer's encoding are most of what a worker spends on it.

- RepeatedFetch: the API version, the body's bytes and the decoded request. A Fetch of the same version and
  body bytes is the same request (the correlation id is in the header), so the worker hands the handler the
  decoded form it already has: a dictionary look-up, not a decode.
- RepeatedFetches: the Fetches a connection sent again, up to server.repeated_fetches_per_connection of them
  (the oldest kept goes first); the worker offers none whose body is over server.repeated_fetch_max_bytes.
  Not only the last one: librdkafka rotates the order of a fetch's partitions on every request, so its idle
  consumer of P partitions cycles through P bodies. A body is kept only when it comes again: a consumer that
  reads records sends a new body every time, and keeps no decoded request it will not send again.
- IdleRead: a sessionless long poll's first read that found nothing and that its expiry answered: the results
  per partition, the watch items of its delayed fetch, the catalog version, and the version of each
  partition's row (shm.table) at which the rows were seen to hold exactly what the read answered. While the
  catalog and every row keep those versions, nothing the read looked at has changed: the repeat waits on the
  same watch items without reading, and an expiry is answered with the first read's answer, encoded once,
  under the request's correlation id.

Invariants:
- Decoded requests are immutable (kio entities): one may serve any number of requests.
- An IdleRead hangs off the RepeatedFetch of the very request object it was read for, so it answers only that
  request; it goes when that RepeatedFetch leaves its connection's RepeatedFetches.
- A row's version changes with every publish (an append, a flush, a truncation, a roll, a deletion), so a
  reused read is never staler than a read made now; a publish that changes nothing a Fetch answers only costs a
  read again.
- Only sessionless fetches (session id 0 and epoch -1, or a version before sessions) keep an IdleRead (a
  session's fetch changes the session), and only with the authorizer off (every read follows the ACLs).
"""

from __future__ import annotations

import struct
from array import array
from dataclasses import dataclass
from typing import Any

from shmbroker.shm.table import PartitionTable
from shmbroker.workers.codecs.fetch import FetchTopicResult, encode_fetch_response

_SIZE_AND_CORRELATION = struct.Struct(">ii")
_MARK_MASK = 0x7FFF_FFFF  # a mark fits a signed 32-bit array item


@dataclass(slots=True)
class IdleRead:
    """An empty first read of a sessionless long poll, valid while the catalog and its rows keep their versions."""

    context: Any  # the request's workers.api.fetch_sessions.FetchContext (sessionless: holds no state)
    topics: list[FetchTopicResult]
    watch: list[tuple[int, int, int]]  # shm.fetch_condition's items
    catalog_version: int
    row_versions: list[tuple[int, int]]  # (row, its version when the read was confirmed)
    encoded: bytes | None = None  # the answer after its size and correlation id, once encoded

    def unchanged(self, table: PartitionTable, catalog_version: int) -> bool:
        if catalog_version != self.catalog_version:
            return False
        version = table.version
        for row, seen in self.row_versions:
            if version(row) != seen:
                return False
        return True

    def answer(self, api_version: int, correlation_id: int) -> bytes:
        """The answer of an expiry with nothing changed: no throttle, no error, no session, as the first read."""
        encoded = self.encoded
        if encoded is None:
            frame = encode_fetch_response(api_version, correlation_id, self.topics)
            encoded = self.encoded = b"".join(frame.pieces)[_SIZE_AND_CORRELATION.size:]  # no records: all bytes
        return _SIZE_AND_CORRELATION.pack(len(encoded) + 4, correlation_id) + encoded


@dataclass(slots=True)
class RepeatedFetch:
    """A Fetch a connection sent: its version, body bytes and decoded form, and its empty first read if any."""

    version: int
    body: bytes
    request: Any
    idle: IdleRead | None = None



class RepeatedFetches:
    """A connection's Fetches that came again: a body is kept, decoded, once it comes a second time within the
    last `limit` bodies seen, so a consumer whose every fetch differs (it is reading records) keeps `limit`
    marks and nothing more. At most `limit` are kept, the oldest dropped first."""

    __slots__ = ("kept", "seen", "next_seen", "limit")

    def __init__(self, limit: int) -> None:
        # Made small: every connection that fetches holds one (the marks: 4 bytes each; no dict until one is kept).
        self.kept: dict[bytes, RepeatedFetch] | None = None
        self.seen = array("i", bytes(4 * limit))  # marks of the last bodies seen (hash and version), a ring
        self.next_seen = 0
        self.limit = limit

    def get(self, version: int, body: bytes) -> RepeatedFetch | None:
        kept = self.kept.get(body) if self.kept is not None else None
        return kept if kept is not None and kept.version == version else None

    def came_again(self, version: int, body: bytes) -> bool:
        """Note a body that is not kept; True if it is one of the last `limit` seen (keep it now)."""
        mark = (hash(body) ^ version) & _MARK_MASK  # a collision only keeps a fetch that did not repeat
        seen = self.seen
        if mark in seen:
            return True
        seen[self.next_seen] = mark
        self.next_seen = (self.next_seen + 1) % self.limit
        return False

    def keep(self, fetch: RepeatedFetch) -> RepeatedFetch:
        kept = self.kept
        if kept is None:
            kept = self.kept = {}
        kept.pop(fetch.body, None)
        if len(kept) >= self.limit:
            del kept[next(iter(kept))]
        kept[fetch.body] = fetch
        return fetch
