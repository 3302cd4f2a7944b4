"""The committed-offsets watch: every read of the coordinator's offsets table agrees with the commits it
acknowledged.

On only where `checks.watch_answers` is (tests; node.config.ChecksConfig). It wraps one OffsetStore's `commit`,
`delete` and `fetch`, so a node without it runs the store's own methods, unchanged.

Algorithm: each commit takes a sequence number when it is written, in the order the requests came. When its
fsync is done and its client is told success, each of its partitions' offset becomes the expected one, unless a
later commit or deletion of that partition was already recorded (a later sequence). A deletion (OffsetDelete,
DeleteGroups, expiry) expects the partition absent from then on. A read (an OffsetFetch answer, or the
coordinator's own look-up) that finds another offset than the expected one logs one line starting with
node.config.ANSWER_WATCH_BREACH, naming the group and partition.

The expectations live in this process: a restarted timer starts with none (what it loads from the log is then
checked against later commits only).
"""

from __future__ import annotations

import logging
from typing import Any, Callable

from shmbroker.node.config import ANSWER_WATCH_BREACH
from shmbroker.node.timer.groups.offsets import OffsetEntry, OffsetStore

log = logging.getLogger("shmbroker.offsets_watch")

_ABSENT = None


class OffsetsWatch:
    def __init__(self, store: OffsetStore) -> None:
        self.expected: dict[tuple[str, str, int], tuple[int, int | None]] = {}  # key -> (sequence, offset)
        self.breaches = 0
        self._sequence = 0
        commit, delete, fetch = store.commit, store.delete, store.fetch

        def watched_commit(group: str, entries: dict, now_ms: int, done: Callable[..., None]) -> None:
            self._sequence += 1
            sequence = self._sequence

            def acknowledged(flushed: bool, fault: bool = False) -> None:
                if flushed:
                    for (topic, partition), (offset, _, _) in entries.items():
                        self._expect((group, topic, partition), sequence, int(offset))
                done(flushed, fault)
            commit(group, entries, now_ms, acknowledged)

        def watched_delete(group: str, partitions: list | None, now_ms: int, done: Any = None) -> list:
            deleted = delete(group, partitions, now_ms, done)
            self._sequence += 1
            for topic, partition in deleted:
                self._expect((group, topic, partition), self._sequence, _ABSENT)
            return deleted

        def watched_fetch(group: str, partitions: list | None) -> dict[tuple[str, int], OffsetEntry | None]:
            found = fetch(group, partitions)
            for (topic, partition), entry in found.items():
                self.check(group, topic, partition, None if entry is None else entry.offset)
            if partitions is None:  # every partition of the group: none expected may be missing
                for (g, topic, partition), (_, offset) in self.expected.items():
                    if g == group and offset is not _ABSENT and (topic, partition) not in found:
                        self.check(group, topic, partition, None)
            return found

        store.commit, store.delete, store.fetch = watched_commit, watched_delete, watched_fetch

    def _expect(self, key: tuple[str, str, int], sequence: int, offset: int | None) -> None:
        before = self.expected.get(key)
        if before is None or before[0] < sequence:
            self.expected[key] = (sequence, offset)

    def check(self, group: str, topic: str, partition: int, offset: int | None) -> None:
        expected = self.expected.get((group, topic, partition))
        if expected is not None and expected[1] != offset:
            self.breaches += 1
            log.error("%s: group %r reads %s-%d at offset %s; the last commit acknowledged %s", ANSWER_WATCH_BREACH,
                      group, topic, partition, offset,
                      "was deleted" if expected[1] is _ABSENT else f"was {expected[1]}")
