"""One client connection of a network worker: request framing in, ordered responses out, and what the
worker's bounds and timeouts need to know of it (the bytes it holds, when it was last active, since when
its current request is incomplete).

Invariants:
- Requests are cut from the received bytes by their 4-byte size prefix; a prefix above the configured
  request limit (or negative) marks the connection broken, never allocates.
- Memory follows the bytes that arrived, never the size a client announces. A request larger than one
  read (`recv_bytes`) is received straight into an anonymous mapping of its announced size
  (`recv_into`, no copies); the kernel backs only the pages written, so a client that announces 100 MiB
  and sends 1 MiB costs 1 MiB, and the mapping is returned to the system when the request is done or the
  connection closes. Smaller requests are parsed from the bytes of each read, leftovers kept in `inbuf`.
- `memory` is what the connection holds: its incomplete request, complete requests held back (`held`,
  see below) and responses not yet sent as bytes (sendfile ranges cost no memory). `queued_bytes` is what
  its client has yet to read, sendfile ranges counted at their length (the output bound).
- Responses leave in request order: each request takes a slot when it is read; a slot is filled at once
  or later (a delayed request) with `fill`, and only the filled prefix of the slot queue is written.
- A response is a list of pieces: bytes-like objects, written with sendmsg (one writev for many
  pieces), and FileRange, written with os.sendfile straight from the segment file (zero copy);
  `sendfile_bytes` counts the bytes that left that way (the worker's stats add it up).
- Writes are non-blocking; what the socket does not take stays queued with its exact offset,
  and the worker waits for writability only while something is queued.
- `last_active` is the loop time of the last byte read or written; `request_since` the loop time the
  current incomplete request began (None between requests), moved later by the time the worker paused
  reading it (`paused`), so a request timeout only counts time the client could have sent.
"""

from __future__ import annotations

import errno
import itertools
import mmap
import os
import socket
from collections import deque
from dataclasses import dataclass
from typing import Any

# sendmsg takes at most IOV_MAX buffers per call; more pieces go in later calls.
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024
_PREFIX = 4

# Why a connection is not read from (bits of Connection.paused).
PAUSED_MEMORY = 1  # its worker is over its memory budget and this connection holds much of it
PAUSED_OUTPUT = 2  # its client has not read enough of its responses
PAUSED_THROTTLE = 4  # its client is throttled (quotas, KIP-219): requests read meanwhile are held too


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
    header: Any  # workers.codecs.protocol.RequestHeader
    slot: ResponseSlot


class ConnectionClosed(Exception):
    """The peer closed, or the connection must be dropped (the message says why)."""


_request_order = itertools.count(1)


class Connection:
    __slots__ = ("sock", "fd", "peer", "bucket", "inbuf", "large", "large_view", "large_have", "slots", "outq",
                 "max_request", "recv_bytes", "wants_write", "closed", "queued_bytes", "queued_memory", "held",
                 "held_bytes", "last_active", "request_since", "request_order", "paused", "paused_at",
                 "accounted", "timer", "mutes", "sendfile_bytes", "listener", "advertised", "principal", "sasl",
                 "pinned", "acl_cache", "closing", "repeated_fetches", "last_fetch")

    def __init__(self, sock: socket.socket, peer: Any, max_request: int, recv_bytes: int, now: float = 0.0,
                 bucket: int = 0) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.peer = peer
        self.bucket = bucket  # the client address's bucket in the node's connection counts
        self.inbuf = bytearray()
        self.large: mmap.mmap | None = None  # the mapping a request larger than one read is received into
        self.large_view: memoryview | None = None
        self.large_have = 0
        self.slots: deque[ResponseSlot] = deque()
        # Pieces ready to write, in order; the head may be partly written.
        self.outq: deque[Any] = deque()
        self.max_request = max_request
        self.recv_bytes = recv_bytes  # most bytes taken from the socket per read
        self.wants_write = False
        self.closed = False
        self.mutes = 0  # throttles in force (quotas): PAUSED_THROTTLE while any is
        self.queued_bytes = 0  # response bytes not yet sent, sendfile ranges at their length
        self.queued_memory = 0  # of those, the ones held in memory (not sendfile ranges)
        self.sendfile_bytes = 0  # response bytes sent by sendfile since the connection opened
        self.held: deque[memoryview] = deque()  # complete requests read but not yet served (output bound)
        self.held_bytes = 0
        self.last_active = now
        self.request_since: float | None = None
        self.request_order = 0  # arrival order of the current incomplete request (oldest first)
        self.paused = 0
        self.paused_at = 0.0
        self.accounted = 0  # `memory` as the worker's budget last counted it
        self.timer: Any = None  # the worker's deadline timer for this connection
        self.listener: Any = None  # the workers.listeners.Listener it came through (None: the default one)
        self.advertised: tuple[str, int] | None = None  # the address Metadata names to it (None: the server's)
        # Who the client is (Kafka's "User:NAME"); None until a SASL listener's client authenticated.
        self.principal: str | None = "User:ANONYMOUS"
        self.sasl: Any = None  # its SASL state on a SASL listener (workers.api.sasl)
        self.acl_cache: Any = None  # (epoch, principal, decisions, writable topics) of workers.api.authorizer
        self.pinned = False  # its state lives in this process (TLS, a SASL session): it never moves to a peer
        self.closing: str | None = None  # why it closes once its responses are out (it serves no more requests)
        # Its recent Fetches, kept for a repeat (workers.api.repeated_fetch.RepeatedFetches), and the current one's.
        self.repeated_fetches: Any = None
        self.last_fetch: Any = None

    # -- what it holds -----------------------------------------------------------------------

    @property
    def partial_bytes(self) -> int:
        """Bytes of the incomplete request (size prefix included)."""
        return len(self.inbuf) + (_PREFIX + self.large_have if self.large is not None else 0)

    @property
    def memory(self) -> int:
        large = _PREFIX + self.large_have if self.large is not None else 0  # partial_bytes, inlined (hot path)
        return len(self.inbuf) + large + self.held_bytes + self.queued_memory

    # -- input ---------------------------------------------------------------------------

    def receive(self, now: float) -> list[memoryview]:
        """Read what the socket has and return the whole request frames (without prefixes).

        The returned views stay valid while the handler runs (they keep their buffer alive).
        Raises ConnectionClosed on EOF, reset, or an oversize / negative length prefix.
        """
        if self.large is not None:
            frames = self._receive_large()
        else:
            frames = self._receive_small()
        self.last_active = now
        if self.large is None and not self.inbuf:
            self.request_since = None
        elif frames or self.request_since is None:  # a new request began in this read
            self.request_since = now
            self.request_order = next(_request_order)
        return frames

    def _recv_failed(self, exc: OSError) -> ConnectionClosed:
        return ConnectionClosed(f"recv failed: {exc}")

    def _size(self, buffer: Any, start: int) -> int:
        size = int.from_bytes(buffer[start:start + _PREFIX], "big", signed=True)
        if size < 0 or size > self.max_request:
            raise ConnectionClosed(f"request size {size} outside 0..{self.max_request}")
        return size

    def _receive_small(self) -> list[memoryview]:
        try:
            data = self.sock.recv(self.recv_bytes)
        except (BlockingIOError, InterruptedError):
            return []
        except ConnectionResetError:
            raise ConnectionClosed("peer closed") from None  # an abrupt close is still the peer's close
        except OSError as exc:
            raise self._recv_failed(exc) from exc
        if not data:
            raise ConnectionClosed("peer closed")
        # Parse straight from the received bytes when nothing was left over: the frames are then
        # views of that immutable object, with no copy. Leftovers are copied into inbuf.
        if self.inbuf:
            buf = self.inbuf
            buf += data
            # Wait for the whole first frame before copying, so a request arriving in several
            # reads is copied once, not once per read.
            if len(buf) < _PREFIX:
                return []
            size = self._size(buf, 0)
            if len(buf) < _PREFIX + size:
                if _PREFIX + size > self.recv_bytes:
                    with memoryview(buf) as view:
                        self._start_large(size, view[_PREFIX:])
                    buf.clear()
                return []
            source = bytes(buf)
            buf.clear()
        else:
            source = data
        view = memoryview(source)
        frames: list[memoryview] = []
        start = 0
        end = len(source)
        size = 0
        while end - start >= _PREFIX:
            size = self._size(source, start)
            if end - start - _PREFIX < size:
                break
            frames.append(view[start + _PREFIX:start + _PREFIX + size])
            start += _PREFIX + size
        if start < end:
            if end - start >= _PREFIX and _PREFIX + size > self.recv_bytes:
                self._start_large(size, view[start + _PREFIX:])
            else:
                self.inbuf += view[start:]
        return frames

    def _start_large(self, size: int, first: memoryview) -> None:
        """Receive the rest of a request of `size` bytes into a mapping of its own."""
        try:
            self.large = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE)
        except OSError as exc:
            raise ConnectionClosed(f"no memory for a request of {size} bytes: {exc}") from exc
        self.large_view = memoryview(self.large)
        self.large_view[:len(first)] = first
        self.large_have = len(first)

    def _receive_large(self) -> list[memoryview]:
        view = self.large_view
        have = self.large_have
        size = len(view)
        try:
            got = self.sock.recv_into(view[have:have + min(size - have, self.recv_bytes)])
        except (BlockingIOError, InterruptedError):
            return []
        except OSError as exc:
            raise self._recv_failed(exc) from exc
        if not got:
            raise ConnectionClosed("peer closed")
        have += got
        if have < size:
            self.large_have = have
            return []
        self.large = self.large_view = None  # the frame's view keeps the mapping until the request is done
        self.large_have = 0
        return [view.toreadonly()]  # as immutable as the small path's bytes (decoders insist)

    # -- requests held back (the output bound) ----------------------------------------------

    def hold(self, frames: list[memoryview]) -> None:
        """Keep complete requests to serve later, in order (the client must first read responses)."""
        for frame in frames:
            self.held.append(frame)
            self.held_bytes += len(frame)

    def take_held(self) -> list[memoryview]:
        frames = list(self.held)
        self.held.clear()
        self.held_bytes = 0
        return frames

    # -- output --------------------------------------------------------------------------

    def new_slot(self, context: Any = None) -> ResponseSlot:
        slot = ResponseSlot(context)
        self.slots.append(slot)
        return slot

    def fill(self, slot: ResponseSlot, pieces: list[Any]) -> int:
        """Fill `slot` with its response and count the bytes it queues; returns them (the response's size)."""
        size = memory = 0
        for piece in pieces:
            if type(piece) is FileRange:
                size += piece.length
            else:
                length = len(piece)
                size += length
                memory += length
        self.queued_bytes += size
        self.queued_memory += memory
        slot.fill(pieces)
        return size

    def collect_ready(self) -> bool:
        """Move the filled prefix of the slot queue to the output queue; True if anything moved."""
        moved = False
        slots = self.slots
        while slots and slots[0].ready:
            self.outq.extend(slots.popleft().pieces)
            moved = True
        return moved

    def flush(self, now: float = 0.0) -> bool:
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
                self.queued_bytes -= sent
                self.sendfile_bytes += sent
                self.last_active = now
                head.position += sent
                head.length -= sent
                if head.length:
                    return False
                outq.popleft()
                continue
            buffers = []
            flags = 0
            for piece in outq:
                if isinstance(piece, FileRange):
                    # The records follow by sendfile: the kernel holds these bytes to send them in the same
                    # segment (one loopback delivery and one client wake-up per response, not two).
                    if piece.length > 0:
                        flags = socket.MSG_MORE
                    break
                if len(buffers) >= _IOV_MAX:
                    break
                buffers.append(piece)
            try:
                sent = self.sock.sendmsg(buffers, (), flags)
            except (BlockingIOError, InterruptedError):
                return False
            except OSError as exc:
                if exc.errno == errno.EAGAIN:
                    return False
                raise ConnectionClosed(f"send failed: {exc}") from exc
            self.queued_bytes -= sent
            self.queued_memory -= sent
            self.last_active = now
            while sent:
                piece = outq[0]
                size = len(piece)
                if sent >= size:
                    outq.popleft()
                    sent -= size
                else:
                    outq[0] = memoryview(piece)[sent:]
                    return False
            # Empty pieces left at the head: a send of only those writes nothing, and would be tried forever.
            while outq and not isinstance(outq[0], FileRange) and not len(outq[0]):
                outq.popleft()
        return True

    def pending_output(self) -> bool:
        return bool(self.outq)

    # -- pauses --------------------------------------------------------------------------

    def pause(self, reason: int, now: float) -> bool:
        """Add a reason not to read; True if reading must stop now (it was the first reason)."""
        first = not self.paused
        self.paused |= reason
        if first:
            self.paused_at = now
        return first

    def unpause(self, reason: int, now: float) -> bool:
        """Drop a reason; True if reading may resume now (it was the last one). The paused time does not
        count against the current request."""
        if not self.paused & reason:
            return False
        self.paused &= ~reason
        if self.paused:
            return False
        if self.request_since is not None:
            self.request_since += now - self.paused_at
        return True

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            # Drop every buffer now: timers and delayed requests may keep the object a while longer.
            self.large = self.large_view = None
            self.inbuf = bytearray()
            self.held.clear()
            self.outq.clear()
            try:
                self.sock.close()
            except OSError:
                pass
