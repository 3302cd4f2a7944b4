"""A worker's end of its two rings to the timer process, with the frames it sends and receives.

Invariants:
- Sending never blocks: frames go to a local backlog, and `flush()` moves as many as the request
  ring takes (one head update for the batch); the rest wait for the next turn, in order.
- Both ring ends are taken over on attach (`takeover=True`): a restarted worker resumes from the
  committed head and tail its dead predecessor left.
- What comes back is turned into `Message`s: a delayed request's completion (with whether it
  expired), a control reply (its outcome document), the timer's start announcement, or a layout
  change. Anything undecodable is logged and dropped; it never stops the worker.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Any, NamedTuple

from node.config import NodeConfig
from node.resources import ring_config
from shm import frames as F
from shm import instance as shm_instance
from shm.doorbell import EventfdDoorbell, SemaphoreDoorbell
from shm.ring import RingReader, RingWriter

log = logging.getLogger("shmbroker.timer_link")

# Control document ops, shared with node.timer.process.
OP_TIMER_STARTED = "timer_started"
OP_REPLY = "reply"
OP_LAYOUT = "layout"


class Message(NamedTuple):
    op: str  # "completion", OP_REPLY, OP_TIMER_STARTED or OP_LAYOUT
    request_id: int = 0
    outcome: Any = None  # completion: True if expired; reply: the outcome document


class TimerLink:
    def __init__(self, instance: str, index: int, config: NodeConfig, bell_fd: int) -> None:
        rings = ring_config(config)
        self.bell = EventfdDoorbell(bell_fd)
        self.timer_bell = SemaphoreDoorbell(shm_instance.timer_doorbell_name(instance))
        self.writer = RingWriter(shm_instance.request_ring_name(instance, index), self.timer_bell,
                                 config=rings, takeover=True)
        self.reader = RingReader(shm_instance.completion_ring_name(instance, index), config=rings, takeover=True)
        self.backlog: deque[bytes] = deque()

    @property
    def doorbell_fd(self) -> int:
        return self.bell.fileno()

    # -- sending -----------------------------------------------------------------------------

    def send(self, frame: bytes) -> None:
        self.backlog.append(frame)

    def flush(self) -> None:
        if not self.backlog:
            return
        written = self.writer.write_many(self.backlog)
        for _ in range(written):
            self.backlog.popleft()

    def backlogged(self) -> bool:
        return bool(self.backlog)

    def send_appends(self, appends: dict[int, tuple[int, int]]) -> None:
        self.send(F.encode_rows(F.Kind.APPEND, None, [(row, *end) for row, end in appends.items()]))

    @staticmethod
    def delay_produce_frame(request_id: int, deadline_ms: int, waits: list[tuple[int, int]]) -> bytes:
        return F.encode_rows(F.Kind.DELAY_PRODUCE, (request_id, deadline_ms), waits)

    @staticmethod
    def delay_fetch_frame(request_id: int, deadline_ms: int, min_bytes: int, watch: list[tuple[int, int]]) -> bytes:
        return F.encode_rows(F.Kind.DELAY_FETCH, (request_id, deadline_ms, min_bytes), watch)

    @staticmethod
    def control_frame(request_id: int, payload: dict) -> bytes:
        return F.encode_control({**payload, "request_id": request_id})

    @staticmethod
    def cancel_frame(request_id: int) -> bytes:
        return F.encode_rows(F.Kind.CANCEL, None, [(request_id,)])

    # -- receiving ---------------------------------------------------------------------------

    def announce_sleep(self) -> bool:
        return self.reader.announce_sleep()

    def woke(self) -> None:
        self.reader.woke()

    def drain_doorbell(self) -> None:
        self.bell.drain()

    def receive(self) -> list[Message]:
        frames = self.reader.read_batch()
        if not frames:
            return []
        out: list[Message] = []
        for frame in frames:
            try:
                kind = F.kind_of(frame)
                if kind == F.Kind.COMPLETION:
                    _, _, items = F.decode_rows(frame, F.Kind.COMPLETION)
                    out.extend(Message("completion", rid, status != F.Status.SATISFIED) for rid, status, _ in items)
                elif kind == F.Kind.CONTROL:
                    doc = F.decode_control(frame)
                    out.append(Message(doc["op"], int(doc.get("request_id", 0)), doc.get("outcome")))
                else:
                    log.warning("unexpected %s frame from the timer", kind.name)
            except (F.FrameError, KeyError, TypeError) as exc:
                log.warning("dropping an undecodable frame from the timer: %s", exc)
        self.reader.release()
        return out

    def close(self) -> None:
        self.flush()
        for end in (self.writer, self.reader):
            end.close()
        self.bell.close()
        self.timer_bell.close()

