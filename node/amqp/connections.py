"""The engine loop's connections and sessions: proton's connection, session and transport events.

Engine loop thread only. Rules:
- A connection is named by its `pn_connection` pointer (`server._by_pointer`) from the moment its
  socket is ready (`made`) until the batch after its socket is gone releases it; it is accepted
  (`server._accepted`, a key) only once its open arrives within connections_max.
- A connection over connections_max, or one that opens while the node is stopping, gets an open
  then a close with amqp:resource-limit-exceeded and why.
- A session's incoming window is SESSION_INCOMING_MAX_BYTES: what stops a client sending more than
  proton should buffer before the node reads it.
- A connection's end (close, transport closed) ends its links at once, in the order they attached
  (node/amqp/link_table.py); proton's objects are released later, by the batch (node/amqp/loop.py).
- `Connection` (node/amqp/connection.py) calls `made`, `touched`, `backlogged` and `lost` here, and
  reads `gate`, `clock_ms` and `bridge`: this object is its `engine`.
"""

from __future__ import annotations

import logging

from node.amqp.conditions import RESOURCE_LIMIT
from node.amqp.connection import Connection
from node.amqp.engine import LOCAL_ACTIVE, LOCAL_UNINIT, condition_text, lib, set_condition

log = logging.getLogger("grouper.amqp")

# bytes proton buffers per session before the node reads them: the session's incoming window is this
# over the max frame size (32 KiB by default: 256 frames), which stops a client sending more
SESSION_INCOMING_MAX_BYTES = 8 << 20
OUTPUT_MAX_BYTES = 4 << 20  # socket output buffered per connection before its input is no longer read


class Connections:
    def __init__(self, server):
        self.server = server
        self.gate = server.gate
        self.clock_ms = server.clock_ms
        self.bridge = server.bridge
        self._by_pointer = server._by_pointer
        self._accepted = server._accepted

    def new(self, tls: bool) -> Connection:
        """The protocol for a socket the listener accepted (node/amqp/listener.py)."""
        server = self.server
        return Connection(self, server._collector, server._container_id, OUTPUT_MAX_BYTES, tls)

    def of(self, event) -> Connection | None:
        return self._by_pointer.get(lib.pn_event_connection(event))

    # ---- what a Connection reports -----------------------------------------------------------

    def made(self, connection: Connection) -> None:
        """A socket is ready (over TLS: its handshake succeeded) and its proton objects exist."""
        self._by_pointer[connection.connection] = connection

    def touched(self, connection: Connection) -> None:
        """A connection has new input or room for output: it takes part in the next batch."""
        server = self.server
        server._dirty.add(connection)
        server.wake()

    def backlogged(self, connection: Connection) -> None:
        server = self.server
        server._backlogged.add(connection)
        server.wake()

    def lost(self, connection: Connection) -> None:
        server = self.server
        self.gate.lost(connection)
        server._lost.append(connection)
        server.wake()

    # ---- proton's events ---------------------------------------------------------------------

    def on_transport(self, event) -> None:
        connection = self.of(event)
        if connection is not None:
            self.server._dirty.add(connection)

    def on_connection_remote_open(self, event) -> None:
        connection = self.of(event)
        if connection is None:
            return
        server = self.server
        pointer = connection.connection
        server._dirty.add(connection)
        connections_max = server.config.connections_max
        if len(self._accepted) >= connections_max or server.stopping:
            lib.pn_connection_open(pointer)
            reason = ("the node is shutting down" if server.stopping else
                      f"this node accepts at most {connections_max} connections (connections_max)")
            set_condition(lib.pn_connection_condition(pointer), RESOURCE_LIMIT, reason)
            lib.pn_connection_close(pointer)
            return
        connection.key = server._next_connection_key
        server._next_connection_key += 1
        self.gate.opened(connection)
        self._accepted[connection.key] = connection
        if lib.pn_connection_state(pointer) & LOCAL_UNINIT:
            lib.pn_connection_open(pointer)

    def on_session_remote_open(self, event) -> None:
        session = lib.pn_event_session(event)
        if lib.pn_session_state(session) & LOCAL_UNINIT:
            lib.pn_session_set_incoming_capacity(session, SESSION_INCOMING_MAX_BYTES)
            lib.pn_session_open(session)

    def on_session_remote_close(self, event) -> None:
        session = lib.pn_event_session(event)
        connection = self.of(event)
        if connection is not None:
            forget = self.server.link_table.forget
            for state in [state for state in connection.links if lib.pn_link_session(state.link) == session]:
                forget(state)
        if lib.pn_session_state(session) & LOCAL_ACTIVE:
            lib.pn_session_close(session)
        lib.pn_session_free(session)  # with its links, which no record names any more

    def on_connection_remote_close(self, event) -> None:
        connection = self.of(event)
        if connection is None:
            return
        self.forget(connection)
        self.server._dirty.add(connection)
        if lib.pn_connection_state(connection.connection) & LOCAL_ACTIVE:
            lib.pn_connection_close(connection.connection)

    def on_transport_error(self, event) -> None:
        connection = self.of(event)
        if connection is None or connection.error_logged:
            return  # proton reports a broken connection more than once
        connection.error_logged = True
        reason = condition_text(lib.pn_transport_condition(lib.pn_event_transport(event)))
        log.info("connection %s dropped: %s", connection.peer, reason or "no reason given")

    def on_transport_closed(self, event) -> None:
        connection = self.of(event)
        if connection is not None:
            self.forget(connection)
            self.server._dirty.add(connection)

    # ---- ends --------------------------------------------------------------------------------

    def forget(self, connection: Connection) -> None:
        """The connection has ended: it is no longer accepted, and its links end with it."""
        if not connection.key:
            return
        self._accepted.pop(connection.key, None)
        connection.key = 0
        states = sorted(connection.links, key=lambda state: state.id)
        connection.links.clear()
        self.server.link_table.forget_all(states)

    def close_all(self) -> None:
        """Send every open connection a close (the node is stopping)."""
        server = self.server
        for connection in list(self._by_pointer.values()):
            if not connection.released and lib.pn_connection_state(connection.connection) & LOCAL_ACTIVE:
                lib.pn_connection_close(connection.connection)
                server._dirty.add(connection)
        server.wake()

    def close_sockets(self) -> None:
        for connection in list(self._by_pointer.values()):
            connection.close_socket()
