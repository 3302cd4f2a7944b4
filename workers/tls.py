"""TLS connections of the SSL and SASL_SSL listeners (Python's ssl on non-blocking sockets, in the worker's loop).

A TlsConnection is a workers.connection.Connection whose socket is a TlsStream: the same recv, recv_into and
sendmsg calls, through the TLS session. The handshake (TlsHandshake) runs before the connection is read: a step
on each readiness of the socket, never a blocking call.

Invariants:
- Nothing blocks: every TLS call that would wait (SSLWantRead, SSLWantWrite) is a BlockingIOError to the
  connection, which waits for the loop's next readiness, as for a plain socket.
- Bytes TLS decrypted but the connection did not take yet (`pending`) are read in the same turn: the kernel
  socket, all epoll sees, may have nothing more to announce.
- A write that TLS could not finish is retried with the same bytes first: the head of the output queue is only
  ever extended, never changed, until it is sent (what OpenSSL requires of a retried write).
- Record data leaves by read + send (os.pread of the segment file, then TLS), never sendfile: the bytes must be
  encrypted in this process. The queued bytes stay counted as before; the memory they hold is counted once read.
- A TLS end of the session (close_notify) and an EOF without one are both the peer's close.
"""

from __future__ import annotations

import os
import ssl
from typing import Any, Callable

from shmbroker.workers.connection import Connection, ConnectionClosed, FileRange

# Most bytes one TLS write takes (a multiple of TLS's 16 KiB records; one sendmsg's worth of pieces is joined).
SEND_CHUNK_BYTES = 256 * 1024
_WOULD_BLOCK = (ssl.SSLWantReadError, ssl.SSLWantWriteError)
_PEER_CLOSED = (ssl.SSLZeroReturnError, ssl.SSLEOFError)


class TlsStream:
    """An SSLSocket as a Connection's socket: would-block is BlockingIOError, the peer's close is b"" / 0."""

    __slots__ = ("tls",)

    def __init__(self, tls: ssl.SSLSocket) -> None:
        self.tls = tls

    def fileno(self) -> int:
        return self.tls.fileno()

    def pending(self) -> int:
        return self.tls.pending()

    def recv(self, size: int) -> bytes:
        """Up to `size` bytes: every record TLS can decrypt now, not only the first."""
        parts = []
        have = 0
        while have < size:
            try:
                data = self.tls.recv(size - have)
            except _WOULD_BLOCK:
                break
            except _PEER_CLOSED:
                data = b""
            if not data:
                if not parts:
                    return b""
                break
            parts.append(data)
            have += len(data)
        if not parts:
            raise BlockingIOError
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def recv_into(self, view: memoryview) -> int:
        have = 0
        while have < len(view):
            try:
                got = self.tls.recv_into(view[have:])
            except _WOULD_BLOCK:
                break
            except _PEER_CLOSED:
                got = 0
            if not got:
                if not have:
                    return 0
                break
            have += got
        if not have:
            raise BlockingIOError
        return have

    def sendmsg(self, buffers: list[Any], ancillary: Any = (), flags: int = 0) -> int:
        chunk = []
        size = 0
        for piece in buffers:
            chunk.append(piece)
            size += len(piece)
            if size >= SEND_CHUNK_BYTES:
                break
        try:
            return self.tls.send(chunk[0] if len(chunk) == 1 else b"".join(chunk))
        except _WOULD_BLOCK:
            raise BlockingIOError from None

    def close(self) -> None:
        self.tls.close()


class TlsConnection(Connection):
    __slots__ = ()

    def receive(self, now: float) -> list[memoryview]:
        frames = super().receive(now)
        while self.sock.pending():  # decrypted bytes epoll cannot announce
            frames += super().receive(now)
        return frames

    def flush(self, now: float = 0.0) -> bool:
        outq = self.outq
        for position, piece in enumerate(outq):
            if type(piece) is FileRange:
                outq[position] = self._read_range(piece)
        return super().flush(now)

    def _read_range(self, piece: FileRange) -> bytes:
        if piece.length <= 0:
            return b""
        try:
            data = os.pread(piece.file, piece.length, piece.position)
        except OSError as exc:
            raise ConnectionClosed(f"reading records failed: {exc}") from exc
        if len(data) != piece.length:
            # The file is shorter than the range promised (truncated under us): the response would be malformed.
            raise ConnectionClosed("segment file ended before the fetched range")
        self.queued_memory += len(data)
        return data


def peer_subject(tls: ssl.SSLSocket) -> str | None:
    """The client certificate's subject as Kafka's principal name ("CN=client,O=org"), None without one."""
    certificate = tls.getpeercert()
    if not certificate:
        return None
    parts = [f"{key}={value}" for rdn in reversed(certificate.get("subject", ())) for key, value in rdn]
    return ",".join(parts) or None


class TlsHandshake:
    """Drives one connection's server handshake on the loop; `done(conn)` once it succeeded, `failed(conn, why)`
    once it cannot (the caller closes the connection)."""

    def __init__(self, loop: Any, done: Callable[[TlsConnection], None],
                 failed: Callable[[TlsConnection, str], None]) -> None:
        self.loop = loop
        self.done = done
        self.failed = failed

    def start(self, conn: TlsConnection) -> None:
        self.loop.watch(conn.sock, lambda: self.step(conn), on_hangup=lambda: self.failed(conn, "peer closed"))
        self.step(conn)

    def step(self, conn: TlsConnection) -> None:
        if conn.closed:
            return
        tls = conn.sock.tls
        try:
            tls.do_handshake()
        except ssl.SSLWantReadError:
            self.loop.want_write(conn.sock, None)
            return
        except ssl.SSLWantWriteError:
            self.loop.want_write(conn.sock, lambda: self.step(conn))
            return
        except (ssl.SSLError, OSError) as exc:
            self.failed(conn, f"TLS handshake failed: {getattr(exc, 'reason', None) or exc}")
            return
        self.loop.want_write(conn.sock, None)
        self.loop.unwatch(conn.sock)
        self.done(conn)
