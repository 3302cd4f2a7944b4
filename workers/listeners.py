"""A worker's view of one listener ([[listeners]] in the config): its security protocol, its TLS context, and the
address it advertises to the clients that connected through it.

Invariants:
- A connection belongs to the listener whose socket accepted it, found again by its local address when another
  worker passed it here (`Listeners.of_socket`): the passing carries the socket, never the listener.
- A TLS listener's context accepts TLS 1.2 and newer only; with [tls] cafile set it requires a client certificate
  that the CA file verifies (mTLS), else it asks for none.
- A listener with a wildcard host (0.0.0.0) advertises the address its client connected to; any other advertises
  its advertised_address, or its address.
"""

from __future__ import annotations

import socket
import ssl

from shmbroker.node.config import ListenerConfig, ServerConfig, TlsConfig, split_address

WILDCARD_HOSTS = ("0.0.0.0", "")
ANONYMOUS = "User:ANONYMOUS"


def tls_context(tls: TlsConfig) -> ssl.SSLContext:
    """The server context of the TLS listeners (ssl.SSLError, OSError: the files cannot be used)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = (ssl.TLSVersion.TLSv1_3 if tls.minimum_version == "TLSv1.3"
                               else ssl.TLSVersion.TLSv1_2)
    context.load_cert_chain(tls.certfile, tls.keyfile)
    if tls.cafile:
        context.load_verify_locations(cafile=tls.cafile)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


class Listener:
    __slots__ = ("name", "index", "protocol", "address", "advertised", "tls", "sasl", "mutual_tls")

    def __init__(self, config: ListenerConfig, context: ssl.SSLContext | None, index: int = 0) -> None:
        self.name = config.name
        self.index = index  # its position in the config's listeners
        self.protocol = config.security_protocol
        self.address = split_address(config.address)
        advertised = split_address(config.advertised_address) if config.advertised_address else self.address
        self.advertised: tuple[str, int] | None = None if advertised[0] in WILDCARD_HOSTS else advertised
        self.tls = context if config.tls else None
        self.sasl = config.sasl
        self.mutual_tls = self.tls is not None and self.tls.verify_mode == ssl.CERT_REQUIRED

    def advertised_for(self, sock: socket.socket) -> tuple[str, int]:
        """The host and port Metadata names for a client of `sock`."""
        if self.advertised is not None:
            return self.advertised
        try:
            host, port = sock.getsockname()[:2]
        except OSError:
            return self.address
        return host, port

    def __repr__(self) -> str:
        return f"Listener({self.name} {self.protocol} {self.address[0]}:{self.address[1]})"


class Listeners:
    """Every listener of the node, in the config's order (the order of the worker's listening fds)."""

    def __init__(self, configs: list[ListenerConfig], tls: TlsConfig, server: ServerConfig) -> None:
        context = tls_context(tls) if any(config.tls for config in configs) else None
        self.all = [Listener(config, context, index) for index, config in enumerate(configs)]
        first = self.all[0]
        if not configs[0].advertised_address and (server.advertised_host or server.advertised_port):
            # server.advertised_host and _port: the first listener's advertised address, as before [[listeners]]
            first.advertised = (server.advertised_host or first.address[0], server.advertised_port or first.address[1])
        self._by_address = {listener.address: listener for listener in self.all}
        self._by_port = {listener.address[1]: listener for listener in self.all}

    def of_socket(self, sock: socket.socket) -> Listener | None:
        """The listener a connected socket came through (its local address; a wildcard listener's by its port),
        None if none (the socket closed meanwhile)."""
        try:
            address = sock.getsockname()[:2]
        except OSError:
            return None
        return self._by_address.get(address) or self._by_port.get(address[1])
