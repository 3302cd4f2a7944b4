"""Connection handoff between network workers: one worker passes an open client socket to another.

Each worker has an inbox, a Unix datagram socket pair the supervisor creates before the children start
and keeps open for the node's life; every worker inherits every inbox (as the doorbells). A worker hands
a connection over by sending its descriptor to the peer's inbox with SCM_RIGHTS, then closing its own
copy; the peer receives it as a new descriptor of the same kernel socket and serves it from then on.
Bytes the client sent meanwhile wait in the socket's receive buffer, which travels with it.

Why: a long poll that another worker's appends answer costs a doorbell ring and a wake of a second
process on every record; the consumer served by the appending worker costs neither (workers.affinity
decides when a connection moves). And the kernel's SO_REUSEPORT hash can put three of a client's four
connections on one worker: a new connection goes to the worker holding the fewest (BALANCE).

Invariants:
- A message is one datagram: a fixed header (magic, the sending worker's index, why it moves: AFFINITY
  or BALANCE) and exactly one descriptor. Sends never block (MSG_DONTWAIT): a full inbox refuses, and the
  sender keeps its connection.
- A descriptor is never in two workers at once: the sender closes its copy only after the send succeeded,
  and then never touches the socket again (no shutdown, which would end the connection for both).
- The supervisor holds both ends of every inbox, so descriptors sent to a worker that died wait for the
  worker that replaces it.
- What arrives is never trusted: a message without a descriptor is skipped, descriptors past the first
  are closed by the kernel (there is room for one), and a descriptor under a header that is not ours is
  returned without a sender, for the caller to close and log.
"""

from __future__ import annotations

import array
import socket
import struct

MAGIC = 0x5348_4F46  # "SHOF"
HEADER = struct.Struct("<III")  # magic, the sending worker's index, the reason
# Reasons: its long polls are answered there (workers.affinity); a new connection, to the least loaded worker.
AFFINITY, BALANCE = 0, 1
# A datagram carries at most this many bytes of header: a larger one is not ours.
MAX_MESSAGE_BYTES = 64
MAX_RECEIVE_PER_CALL = 64  # handoffs taken per readiness event (the rest on the next turn)
_RIGHTS_SPACE = socket.CMSG_SPACE(array.array("i").itemsize)  # room for one descriptor


class Inbox:
    """One worker's inbox: the receiving end and the end the others send to (both inheritable)."""

    def __init__(self, receiving: socket.socket, sending: socket.socket) -> None:
        self.receiving = receiving
        self.sending = sending

    @classmethod
    def create(cls) -> "Inbox":
        receiving, sending = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
        for end in (receiving, sending):
            end.set_inheritable(True)
        return cls(receiving, sending)

    def close(self) -> None:
        self.receiving.close()
        self.sending.close()


class Handoffs:
    """What a worker holds: its own inbox's receiving end and every peer's sending end (`sending_fds` by
    worker index; its own entry, not inherited, is skipped)."""

    def __init__(self, index: int, receiving_fd: int, sending_fds: dict[int, int]) -> None:
        self.index = index
        self._receiving = socket.socket(fileno=receiving_fd)
        self._sending = {peer: socket.socket(fileno=fd) for peer, fd in sending_fds.items() if peer != index}

    @property
    def receiving_fd(self) -> int:
        return self._receiving.fileno()

    def peers(self) -> tuple[int, ...]:
        return tuple(self._sending)

    def send(self, peer: int, fd: int, reason: int) -> bool:
        """Pass descriptor `fd` to worker `peer` for `reason`; False if its inbox refused (full, or gone). The
        caller closes its copy only on True."""
        # sendmsg/recvmsg, not socket.send_fds/recv_fds: Python 3.11's drop their flags (and would block).
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [fd]))]
        try:
            return self._sending[peer].sendmsg([HEADER.pack(MAGIC, self.index, reason)], rights,
                                                 socket.MSG_DONTWAIT) > 0
        except (BlockingIOError, InterruptedError, ConnectionError):
            return False

    def receive(self) -> list[tuple[int, int | None, int]]:
        """The descriptors that arrived: (fd, sending worker, reason), the worker None for a malformed message
        (its fd is still returned, for the caller to close). Never blocks."""
        received: list[tuple[int, int | None, int]] = []
        for _ in range(MAX_RECEIVE_PER_CALL):
            try:
                data, ancillary, _flags, _address = self._receiving.recvmsg(
                    MAX_MESSAGE_BYTES, _RIGHTS_SPACE, socket.MSG_DONTWAIT | socket.MSG_CMSG_CLOEXEC)
            except (BlockingIOError, InterruptedError):
                break
            fds = array.array("i")
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
            if not fds:
                continue  # nothing to serve (a message whose descriptor the kernel could not install)
            sender, reason = None, AFFINITY
            if len(data) == HEADER.size:
                magic, sender, reason = HEADER.unpack(data)
                if magic != MAGIC or reason not in (AFFINITY, BALANCE):
                    sender = None
            received.extend((fd, sender, reason) for fd in fds)
        return received

    def close(self) -> None:
        self._receiving.close()
        for end in self._sending.values():
            end.close()
