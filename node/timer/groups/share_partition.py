"""One share-partition (KIP-932): a share group's view of one topic partition, as Kafka's SharePartition keeps it,
in the timer process.

The partition's records from `start_offset` (Kafka's SPSO) up to `next_offset` (one past the last record ever
acquired; Kafka's end offset) are in flight: each has a state, a delivery count and, while acquired, the
member holding it and the id of the acquisition that locked it. Below `start_offset` every record is done
(acknowledged or archived); from `next_offset` on, no record was ever delivered.

- acquire: the available in-flight records first, in offset order (a released or expired record goes out again
  before new ones), then new records from `next_offset` up to the high watermark; each becomes ACQUIRED by the
  member, its delivery count one more, under one lock (the acquisition's id) whose deadline the caller arms in
  the timer's wheel. At most `max_records` per call, and no more than `max_in_flight` records in flight.
- acknowledge: an ACQUIRED record of the same member only; ACCEPT -> ACKNOWLEDGED, REJECT and GAP -> ARCHIVED,
  RELEASE -> AVAILABLE (ARCHIVED once its delivery count reached the limit), RENEW -> stays acquired under a
  fresh lock. A batch of several types gives one per offset; one type covers the whole range.
- a lock that runs out (`expire(lock id)`) and a member that leaves (`release_member`) make their still-acquired
  records AVAILABLE (or ARCHIVED at the delivery-count limit), as a RELEASE does.
- after every change the start offset moves past the done records at its head, which are then forgotten.
- `configure` takes the group's current delivery-count limit and in-flight bound (its group configs may change
  them): a record waiting for redelivery that has reached a lowered limit is archived then.

Invariants:
- start_offset <= next_offset; every offset in [start_offset, next_offset) has an entry (`records` holds them in
  offset order: an entry is only ever added at next_offset), and the entry at
  start_offset (if any) is not done.
- A record is acquired by at most one member at a time, and only under its current lock id.
- Delivery counts never decrease; a record delivered `delivery_limit` times is never acquired again.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from itertools import compress, groupby, islice, repeat
from operator import attrgetter, is_
from typing import Sequence

from kio.schema.errors import ErrorCode

from shmbroker.node.storage.share_records import DONE, RecordState

E = ErrorCode


class AckType(IntEnum):
    """ShareFetch/ShareAcknowledge's acknowledge types (KIP-932, KIP-1222's RENEW)."""
    GAP = 0
    ACCEPT = 1
    RELEASE = 2
    REJECT = 3
    RENEW = 4


_STATE, _COUNT, _HOLDER = attrgetter("state"), attrgetter("delivery_count"), attrgetter("state", "member")


@dataclass(slots=True)
class InFlight:
    state: RecordState = RecordState.AVAILABLE
    delivery_count: int = 0
    member: str = ""
    lock: int = 0  # the acquisition that holds it (while ACQUIRED)


@dataclass
class SharePartition:
    start_offset: int
    delivery_limit: int
    max_in_flight: int
    next_offset: int = -1
    topic_id: str = ""  # the topic's id when the state began: a topic made again under its name starts anew
    records: dict[int, InFlight] = field(default_factory=dict)
    # Counts for stats: acquired records, acknowledgements by type, records archived, redeliveries.
    acquired: int = 0
    redelivered: int = 0
    archived: int = 0

    def __post_init__(self) -> None:
        if self.next_offset < self.start_offset:
            self.next_offset = self.start_offset

    def configure(self, delivery_limit: int, max_in_flight: int) -> None:
        """Take the group's current limits (share.delivery.count.limit, share.partition.max.record.locks)."""
        self.max_in_flight = max_in_flight
        if delivery_limit == self.delivery_limit:
            return
        lowered = delivery_limit < self.delivery_limit
        self.delivery_limit = delivery_limit
        if lowered:
            for record in self.records.values():
                if record.state is RecordState.AVAILABLE and record.delivery_count >= delivery_limit:
                    record.state = RecordState.ARCHIVED
                    self.archived += 1
            self._advance_start()

    # -- acquisition -----------------------------------------------------------------------------

    def acquire(self, member: str, max_records: int, high_watermark: int, log_start: int, lock: int,
                excluded: Sequence[tuple[int, int]] = ()) -> list[tuple[int, int, int]]:
        """Acquire up to max_records for `member` under lock id `lock`: [(first, last, delivery count)]. New records
        in an `excluded` range (first, last), ascending (a read_committed group's control batches and aborted
        transactions), are archived as they are passed, never delivered."""
        if log_start > self.start_offset:  # retention or DeleteRecords took them: they will never be delivered
            self._move_start_to(log_start)
        records = self.records
        # The available records, in offset order (the order of `records`), found in C: none, as a rule.
        acquired = list(islice(compress(records, map(is_, map(_STATE, records.values()),
                                                     repeat(RecordState.AVAILABLE))), max_records))
        room = self.max_in_flight - (self.next_offset - self.start_offset)
        # New records past next_offset: without exclusions one run, made at once below; else one by one.
        fresh = 0 if excluded else max(0, min(max_records - len(acquired), high_watermark - self.next_offset, room))
        skip = 0
        while excluded and len(acquired) < max_records and self.next_offset < high_watermark and room > 0:
            offset = self.next_offset
            while skip < len(excluded) and excluded[skip][1] < offset:
                skip += 1
            if skip < len(excluded) and excluded[skip][0] <= offset:
                for passed in range(offset, min(excluded[skip][1] + 1, high_watermark)):
                    self.records[passed] = InFlight(RecordState.ARCHIVED)
                self.next_offset = min(excluded[skip][1] + 1, high_watermark)
                continue
            self.records[self.next_offset] = InFlight()
            acquired.append(self.next_offset)
            self.next_offset += 1
            room -= 1
        ranges: list[list[int]] = []
        for offset in acquired:
            record = self.records[offset]
            record.state, record.member, record.lock = RecordState.ACQUIRED, member, lock
            record.delivery_count += 1
            self.acquired += 1
            if record.delivery_count > 1:
                self.redelivered += 1
            if ranges and ranges[-1][1] == offset - 1 and ranges[-1][2] == record.delivery_count:
                ranges[-1][1] = offset
            else:
                ranges.append([offset, offset, record.delivery_count])
        if fresh:
            first = self.next_offset
            records.update(zip(range(first, first + fresh),
                               [InFlight(RecordState.ACQUIRED, 1, member, lock) for _ in range(fresh)]))
            self.next_offset += fresh
            self.acquired += fresh
            if ranges and ranges[-1][1] == first - 1 and ranges[-1][2] == 1:
                ranges[-1][1] = first + fresh - 1
            else:
                ranges.append([first, first + fresh - 1, 1])
        self._advance_start()
        return [tuple(r) for r in ranges]

    def locked(self, lock: int) -> list[int]:
        return [o for o, r in self.records.items() if r.state is RecordState.ACQUIRED and r.lock == lock]

    # -- acknowledgement --------------------------------------------------------------------------

    def acknowledge(self, member: str, first: int, last: int, types: list[int], renew_lock: int = 0) -> E:
        """Apply one acknowledgement batch; INVALID_RECORD_STATE (nothing changed) if a record in it is not
        acquired by `member`, INVALID_REQUEST if the types do not fit the range."""
        count = last - first + 1
        if count < 1 or not types or (len(types) != 1 and len(types) != count) \
                or any(t not in AckType._value2member_map_ for t in types):
            return E.invalid_request
        if first < self.start_offset or last >= self.next_offset:  # past the in-flight records: none acquired
            return E.invalid_record_state
        batch = list(map(self.records.get, range(first, last + 1)))
        if len(types) == 1 and None not in batch:  # the common case, checked in C: one type, every record there
            if set(map(_HOLDER, batch)) != {(RecordState.ACQUIRED, member)}:
                return E.invalid_record_state
            if types[0] == AckType.ACCEPT:
                for record in batch:
                    record.state, record.member, record.lock = RecordState.ACKNOWLEDGED, "", 0
                self._advance_start()
                return E.none
        else:
            for offset, record in enumerate(batch, first):
                kind = types[0] if len(types) == 1 else types[offset - first]
                if kind == AckType.GAP and record is None:  # an offset with no record (a control batch's, ...)
                    continue
                if record is None or record.state is not RecordState.ACQUIRED or record.member != member:
                    return E.invalid_record_state
        for offset, record in enumerate(batch, first):
            kind = types[0] if len(types) == 1 else types[offset - first]
            if record is None:
                continue
            if kind == AckType.ACCEPT:
                record.state, record.member, record.lock = RecordState.ACKNOWLEDGED, "", 0
            elif kind in (AckType.REJECT, AckType.GAP):
                record.state, record.member, record.lock = RecordState.ARCHIVED, "", 0
                self.archived += kind == AckType.REJECT
            elif kind == AckType.RELEASE:
                self._release(record)
            elif kind == AckType.RENEW:
                record.lock = renew_lock
        self._advance_start()
        return E.none

    def expire(self, lock: int) -> int:
        """The lock `lock` ran out: its records still acquired under it go back (or are archived)."""
        released = 0
        for offset in self.locked(lock):
            self._release(self.records[offset])
            released += 1
        self._advance_start()
        return released

    def release_member(self, member: str) -> int:
        released = 0
        for record in self.records.values():
            if record.state is RecordState.ACQUIRED and record.member == member:
                self._release(record)
                released += 1
        self._advance_start()
        return released

    def _release(self, record: InFlight) -> None:
        record.member, record.lock = "", 0
        if record.delivery_count >= self.delivery_limit:
            record.state = RecordState.ARCHIVED
            self.archived += 1
        else:
            record.state = RecordState.AVAILABLE

    def _advance_start(self) -> None:
        while self.start_offset < self.next_offset:
            record = self.records.get(self.start_offset)
            if record is not None and record.state not in DONE:
                break
            self.records.pop(self.start_offset, None)
            self.start_offset += 1

    def _move_start_to(self, offset: int) -> None:
        for gone in [o for o in self.records if o < offset]:
            del self.records[gone]
        self.start_offset = offset
        self.next_offset = max(self.next_offset, offset)

    # -- what is written --------------------------------------------------------------------------

    def runs(self) -> list[list[int]]:
        """The records from start_offset to next_offset as runs of one state and delivery count: [[first, last,
        state, count], ...] (an offset without an entry, if any, as ARCHIVED with count 0)."""
        records = self.records
        if records and len(records) == self.next_offset - self.start_offset \
                and next(iter(records)) == self.start_offset and next(reversed(records)) == self.next_offset - 1:
            # Every offset has its entry, in offset order (entries are only ever added at next_offset): the runs
            # are groups of equal neighbours, compared in C (the loop below costs ~0.6 us a record).
            runs, offset = [], self.start_offset
            values = records.values()
            for (state, count), same in groupby(zip(map(_STATE, values), map(_COUNT, values))):
                length = len(list(same))
                runs.append([offset, offset + length - 1, int(state), count])
                offset += length
            return runs
        runs = []
        for offset in range(self.start_offset, self.next_offset):
            record = records.get(offset)
            state, count = (int(record.state), record.delivery_count) if record is not None \
                else (int(RecordState.ARCHIVED), 0)
            if runs and runs[-1][1] == offset - 1 and runs[-1][2] == state and runs[-1][3] == count:
                runs[-1][1] = offset
            else:
                runs.append([offset, offset, state, count])
        return runs

    # -- what describes show ----------------------------------------------------------------------

    def in_flight(self) -> int:
        return sum(1 for r in self.records.values() if r.state not in DONE)
