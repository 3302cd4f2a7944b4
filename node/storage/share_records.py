"""The share-partition state records of the offsets log (`__consumer_offsets`, node.timer.groups.offsets): their
format, shared by the timer's share coordinator, which writes and restores them (node.timer.groups.share), and the
tools, which read them (`shmbroker groups describe`'s in-flight counts, node.tools.admin).

    key    orjson ["share-partition", group, topic, partition]
    value  orjson [version, state]      state: [STATE_FORMAT, start offset, next offset,
                                               [[first, last, record state, delivery count], ...], topic id]
           null (a tombstone)           the share-partition is gone

Each run covers offsets of one state and count, from the start offset to the next offset (one past the last record
ever acquired): every record in flight has its run. `version` is the offsets log's logical clock: of the records
of one key, the one of the highest version is the share-partition's state, and a tombstone deletes the key
(`apply_versioned`, as the log's load applies them).

Invariants: `decoded` accepts exactly the states of STATE_FORMAT (a newer format is refused, never misread);
`recorded_in_flight` counts what SharePartition.in_flight counts of the share-partition the record was written
from.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any

import orjson

SHARE_STATE = "share-partition"  # the first element of a share-partition state record's key
STATE_FORMAT = 1  # the share-partition state's own format version
ShareKey = tuple[str, str, int]  # group, topic, partition


class RecordState(IntEnum):
    """A share-partition's record state (Kafka's RecordState numbers)."""
    AVAILABLE = 0
    ACQUIRED = 1
    ACKNOWLEDGED = 2
    ARCHIVED = 4


DONE = (RecordState.ACKNOWLEDGED, RecordState.ARCHIVED)
Run = tuple[int, int, RecordState, int]  # first offset, last offset, state, delivery count


def share_state_key(decoded_key: Any) -> ShareKey | None:
    """The (group, topic, partition) of a share-partition state record's key (decoded by orjson); None for a
    record of another kind. Raises ValueError or TypeError on a malformed one."""
    if isinstance(decoded_key, list) and len(decoded_key) == 4 and decoded_key[0] == SHARE_STATE:
        return str(decoded_key[1]), str(decoded_key[2]), int(decoded_key[3])
    return None


def apply_versioned(key: Any, value: bytes | None, states: dict, versions: dict) -> int | None:
    """A versioned state record (a group's or a share-partition's) into `states`, as the log's load keeps them: a
    newer version replaces what is there, a tombstone (None) drops it (and its version: a later record starts
    anew). Returns the record's version (None for a tombstone). Raises ValueError or TypeError on a malformed
    value."""
    if value is None:
        versions.pop(key, None)
        states.pop(key, None)
        return None
    version, state = orjson.loads(value)
    version = int(version)
    if version > versions.get(key, -1):
        versions[key] = version
        states[key] = state
    return version


def encoded_state(start: int, next_offset: int, runs: list[list[int]], topic_id: str) -> list:
    """The state a record carries (STATE_FORMAT)."""
    return [STATE_FORMAT, start, next_offset, runs, topic_id]


def decoded(state: list) -> tuple[int, int, list[Run], str]:
    """(start offset, next offset, runs, topic id) of a record's state; ValueError (TypeError, IndexError) if it is
    not one of STATE_FORMAT."""
    version, start, next_offset, runs, topic_id = state
    if version != STATE_FORMAT:
        raise ValueError(f"share-partition state format {version}")
    return (int(start), int(next_offset), [(int(first), int(last), RecordState(record_state), int(count))
                                           for first, last, record_state, count in runs], str(topic_id))


def recorded_in_flight(state: list) -> tuple[int, int]:
    """(start offset, records in flight) of a record's state: the records from its start offset to the end of its
    in-flight window (its next offset) that are acquired or available for redelivery."""
    start, _, runs, _ = decoded(state)
    return start, sum(last - first + 1 for first, last, record_state, _ in runs if record_state not in DONE)
