"""The engine loop's listening sockets: plain AMQP through asyncio's server, AMQP over TLS through an
accept loop of our own.

Rules:
- `listen` runs on the caller's thread before the loop starts (it drives the loop to bind); the rest
  runs on the engine loop's thread.
- A TLS socket is admitted by the gate (counted toward its address's connections_per_address_max)
  when it is accepted, before its handshake, and released if the handshake fails: asyncio's own TLS
  server shows the protocol nothing before the handshake has succeeded, so it cannot be used here.
- Nothing here touches proton: a socket becomes a `Connection` (node/amqp/connections.py makes it),
  which makes its proton objects once the socket is ready.
"""

from __future__ import annotations

import asyncio
import socket

LISTEN_BACKLOG = 1024  # connections the kernel queues before the loop accepts them


class Listener:
    def __init__(self, server):
        self.server = server
        self._listeners = server._listeners  # asyncio servers and _TlsListeners, closed at shutdown

    def listen(self, host: str, port: int, tls: bool = False) -> int:
        """Bind an AMQP listener, over TLS if `tls`; returns the port (port 0 picks one). Raises OSError
        if it cannot."""
        if tls:
            return self._listen_tls(host, port)
        loop, connections = self.server.loop, self.server.connections
        listener = loop.run_until_complete(loop.create_server(
            lambda: connections.new(False), host, port, reuse_address=True, backlog=LISTEN_BACKLOG))
        self._listeners.append(listener)
        return listener.sockets[0].getsockname()[1]

    def close(self) -> None:
        for listener in self._listeners:
            listener.close()

    def _listen_tls(self, host: str, port: int) -> int:
        family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                                flags=socket.AI_PASSIVE)[0]
        listener = socket.socket(family, kind, protocol)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(address)
            listener.listen(LISTEN_BACKLOG)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listeners.append(_TlsListener(listener, self.server.loop.create_task(self._accept_tls(listener))))
        return listener.getsockname()[1]

    async def _accept_tls(self, listener: socket.socket) -> None:
        server = self.server
        while not server.stopping:
            try:
                client, address = await server.loop.sock_accept(listener)
            except OSError:  # the listener closed: the node is stopping
                return
            except asyncio.CancelledError:
                return
            if server.gate.admit_tls(address[0]):
                server.loop.create_task(self._handshake_tls(client, address[0]))
            else:
                client.close()

    async def _handshake_tls(self, client: socket.socket, host: str) -> None:
        server = self.server
        connection = server.connections.new(True)
        connection.admitted = True  # by admit_tls
        try:
            await server.loop.connect_accepted_socket(
                lambda: connection, client, ssl=server.gate.tls_context,
                ssl_handshake_timeout=server.config.handshake_timeout_ms / 1000)
        except Exception as error:  # noqa: BLE001 - however the handshake fails (SSL, timeout, reset), it ends here
            client.close()
            connection.admitted = False
            server.gate.tls_failed(host, error)


class _TlsListener:
    """The TLS listener's socket and the task accepting on it; closed like asyncio's servers."""

    def __init__(self, listener: socket.socket, accepting: asyncio.Task):
        self.listener = listener
        self.accepting = accepting

    def close(self) -> None:
        self.accepting.cancel()
        self.listener.close()
