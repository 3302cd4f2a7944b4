"""systemd's notify protocol (sd_notify): one datagram per state change to $NOTIFY_SOCKET.

Invariants: without NOTIFY_SOCKET (not under systemd, or Type=simple) every call is a no-op;
a failing send never stops the node, it is only logged.
"""

from __future__ import annotations

import logging
import os
import socket

log = logging.getLogger("shmbroker.sdnotify")


def notify(state: str) -> bool:
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]  # abstract namespace socket
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(state.encode(), address)
        return True
    except OSError as exc:
        log.warning("sd_notify %r failed: %s", state, exc)
        return False
