"""What a delayed fetch waits for: min_bytes appended past where its reads ended, summed over its rows, as the
shared partition table says; for a read_committed fetch, only rows whose last stable offset (LSO) moved since
the read count, so appends to an open transaction do not answer a consumer that cannot see them yet.

One definition for both processes that check it: a network worker on the appends it sees (its own, or a peer's
doorbell) and the timer process at a wait's arrival and deadline.

Invariants:
- `watch` is the (row, start_bytes, stable_from) items of the DELAY_FETCH message, in its order; start_bytes is
  the row's `end_bytes` when the fetch read it, so an append after the read counts even if it raced the read;
  stable_from is the row's LSO then (read_committed), or -1 (read_uncommitted: the LSO is not looked at).
- Without open transactions the LSO is the high watermark, which every append moves: a read_committed wait
  is then answered exactly as a read_uncommitted one.
- A row whose end_bytes is below its start (recovery refilled it) counts 0, never less.
- `satisfied` reads each row's end_bytes with the table's consistent one-field read and allocates nothing (but
  the row's state for a read_committed item whose row grew); it stops at the first row that brings the sum to
  min_bytes (every term is >= 0, so the answer is the same).
"""

from __future__ import annotations

from dataclasses import dataclass

from shmbroker.shm.table import END_BYTES, PartitionTable


@dataclass(slots=True)
class FetchCondition:
    watch: list[tuple[int, int, int]]  # (row, start_bytes, stable_from)
    min_bytes: int

    def satisfied(self, table: PartitionTable) -> bool:
        read = table.read_field
        needed = self.min_bytes
        appended = 0
        for row, start, stable_from in self.watch:
            end = read(row, END_BYTES)
            if end > start:
                if stable_from >= 0 and table.read(row).last_stable_offset <= stable_from:
                    continue  # only an open transaction grew: nothing more to read_committed
                appended += end - start
                if appended >= needed:
                    return True
        return appended >= needed
