"""One client connection of a network worker: request framing in, ordered responses out.

Invariants:
- Requests are cut from the receive buffer by their 4-byte size prefix; a prefix above the
  configured request limit (or negative) marks the connection broken, never allocates.
- Responses leave in request order: each request takes a slot when it is read; a slot is
  filled at once or later (a delayed request), and only the filled prefix of the slot queue
  is written. A request with no response (produce acks=0) takes no slot.
- A response is a list of pieces: bytes-like objects, written with sendmsg (one writev for many
  pieces), and FileRange, written with os.sendfile straight from the segment file (zero copy).
- Writes are non-blocking; what the socket does not take stays queued with its exact offset,
  and the worker waits for writability only while something is queued.
"""

from __future__ import annotations

import errno
import os
import socket
from collections import deque
from dataclasses import dataclass
from typing import Any

# sendmsg takes at most IOV_MAX buffers per call; more pieces go in later calls.
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


@dataclass(slots=True)
class FileRange:
    """`length` bytes of an open segment file descriptor from `position`, sent with os.sendfile."""

    file: int
    position: int
    length: int


class ResponseSlot:
    __slots__ = ("pieces", "ready", "context")

    def __init__(self, context: Any = None) -> None:
        self.pieces: list[Any] = []
        self.ready = False
        # Whatever the handler needs to finish a delayed response.
        self.context = context

    def fill(self, pieces: list[Any]) -> None:
        self.pieces = pieces
        self.ready = True


@dataclass(slots=True)
class Request:
    """A request read from a connection: its header and the slot its response goes into."""

    conn: "Connection"
    header: Any  # workers.protocol.RequestHeader
    slot: ResponseSlot


class ConnectionClosed(Exception):
    """The peer closed, or the connection must be dropped (the message says why)."""


class Connection:
    __slots__ = ("sock", "fd", "peer", "inbuf", "slots", "outq", "max_request", "recv_bytes", "wants_write", "closed",
                 "mutes", "held")

    def __init__(self, sock: socket.socket, peer: Any, max_request: int, recv_bytes: int) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.inbuf = bytearray()
        self.slots: deque[ResponseSlot] = deque()
        # Pieces ready to write, in order; the head may be partly written.
        self.outq: deque[Any] = deque()
        self.max_request = max_request
        self.recv_bytes = recv_bytes  # most bytes taken from the socket per read
        self.wants_write = False
        self.closed = False
        self.mutes = 0  # throttles in force (quotas): the connection is read only when none is
        # Requests read before a throttle muted the connection, handled when it ends (as Kafka, which handles
        # one request of a connection at a time, would read them only then).
        self.held: deque[memoryview] = deque()

    # -- input ---------------------------------------------------------------------------

    def receive(self) -> list[memoryview]:
        """Read what the socket has and return the whole request frames (without prefixes).

        The returned views point into immutable bytes, so they stay valid while the handler runs.
        Raises ConnectionClosed on EOF, reset, or an oversize / negative length prefix.
        """
        try:
            data = self.sock.recv(self.recv_bytes)
        except (BlockingIOError, InterruptedError):
            return []
        except ConnectionResetError:
            raise ConnectionClosed("peer closed") from None  # an abrupt close is still the peer's close
        except OSError as exc:
            raise ConnectionClosed(f"recv failed: {exc}") from exc
        if not data:
            raise ConnectionClosed("peer closed")
        # Parse straight from the received bytes when nothing was left over: the frames are then
        # views of that immutable object, with no copy. Leftovers are copied into inbuf.
        if self.inbuf:
            buf = self.inbuf
            buf += data
            # Wait for the whole first frame before copying, so a large request arriving in
            # many reads is copied once, not once per read.
            if len(buf) < 4:
                return []
            size = int.from_bytes(buf[:4], "big", signed=True)
            if 0 <= size <= self.max_request and len(buf) < 4 + size:
                return []
            source = bytes(buf)
            buf.clear()
        else:
            source = data
        view = memoryview(source)
        frames: list[memoryview] = []
        start = 0
        end = len(source)
        while end - start >= 4:
            size = int.from_bytes(source[start:start + 4], "big", signed=True)
            if size < 0 or size > self.max_request:
                raise ConnectionClosed(f"request size {size} outside 0..{self.max_request}")
            if end - start - 4 < size:
                break
            frames.append(view[start + 4:start + 4 + size])
            start += 4 + size
        if start < end:
            self.inbuf += view[start:]
        return frames

    # -- output --------------------------------------------------------------------------

    def new_slot(self, context: Any = None) -> ResponseSlot:
        slot = ResponseSlot(context)
        self.slots.append(slot)
        return slot

    def collect_ready(self) -> bool:
        """Move the filled prefix of the slot queue to the output queue; True if anything moved."""
        moved = False
        slots = self.slots
        while slots and slots[0].ready:
            self.outq.extend(slots.popleft().pieces)
            moved = True
        return moved

    def flush(self) -> bool:
        """Write as much queued output as the socket takes. True when all of it is written."""
        outq = self.outq
        while outq:
            head = outq[0]
            if isinstance(head, FileRange):
                if head.length <= 0:
                    outq.popleft()
                    continue
                try:
                    sent = os.sendfile(self.fd, head.file, head.position, head.length)
                except (BlockingIOError, InterruptedError):
                    return False
                except OSError as exc:
                    raise ConnectionClosed(f"sendfile failed: {exc}") from exc
                if sent == 0:
                    # The file is shorter than the range promised (truncated under us): the
                    # response is now malformed, so the only honest move is to drop the connection.
                    raise ConnectionClosed("segment file ended before the fetched range")
                head.position += sent
                head.length -= sent
                if head.length:
                    return False
                outq.popleft()
                continue
            buffers = []
            for piece in outq:
                if isinstance(piece, FileRange) or len(buffers) >= _IOV_MAX:
                    break
                buffers.append(piece)
            try:
                sent = self.sock.sendmsg(buffers)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    return False
                raise ConnectionClosed(f"send failed: {exc}") from exc
            while sent:
                piece = outq[0]
                size = len(piece)
                if sent >= size:
                    outq.popleft()
                    sent -= size
                else:
                    outq[0] = memoryview(piece)[sent:]
                    return False
        return True

    def pending_output(self) -> bool:
        return bool(self.outq)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            try:
                self.sock.close()
            except OSError:
                pass
