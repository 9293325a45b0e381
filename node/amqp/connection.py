"""One client socket and its proton transport: bytes in, bytes out, and back-pressure.

Engine loop thread only. Rules:
- Bytes read go straight into proton (`pn_transport_push`); the loop drains the events they make
  once per wake-up, for every connection at once. Bytes proton has to send leave in one socket
  write per connection per wake-up (`flush`).
- Output waiting in the socket's buffer is capped at `output_max_bytes`: over it, this connection's
  input is no longer read, and proton keeps what it would send, until the socket drains. A client
  that stops reading can then hold no more than its cap plus what its link credit lets proton queue.
- At most INPUT_PER_BATCH_BYTES of a connection's input reach proton per wake-up; what a read
  brought beyond that waits here (`backlog`, at most one read) with the socket's reading paused,
  and the loop hands it over in the batches that follow. proton's work on some input grows with
  the square of it (each attach looks up every link and handle its session holds until the next
  output), so one peer's burst of link churn would otherwise stall every connection.
- The transport sees plaintext: TLS belongs to the socket below (asyncio's). The SASL exchange is
  ours (node/amqp/sasl.py): until it has named the client, what arrives goes to `sasl`, never to
  proton, and nothing the client sends can make the node hold more than one SASL frame. proton's
  transport has no SASL layer: it starts at the client's AMQP header.
- proton's objects are released only after the socket is gone and the loop has drained their last
  events (`release`); `released` then forbids any further use.
"""

from __future__ import annotations

import asyncio
import logging

from node.amqp.engine import ffi, lib

log = logging.getLogger("grouper.amqp")

INPUT_PER_BATCH_BYTES = 64 << 10  # input pushed into proton per connection per wake-up; hundreds of messages


class Connection(asyncio.Protocol):
    def __init__(self, engine, collector, container_id: bytes, output_max_bytes: int, tls: bool):
        self.engine = engine
        self.output_max_bytes = output_max_bytes
        self.tls = tls
        self.socket: asyncio.Transport | None = None
        self.peer = ""
        self.host = ""  # the client's address, without its port
        self.sasl = None  # the SASL exchange until it has named the client
        self.user: str | None = None  # who the SASL exchange named
        self.admitted = False  # counted by the engine's admission (connections per address)
        # proton's objects are made at connection_made, not here: on the TLS listener asyncio makes this
        # protocol at accept but calls it only once the handshake succeeded, and a failed handshake is
        # never reported to it, so objects made here would never be released
        self._collector = collector
        self._container_id = container_id
        self.transport = None
        self.connection = None
        self.key = 0  # nonzero once the node has accepted the connection's open
        self.links: set = set()  # Consumer and Producer records of this connection
        self.output_paused = False
        self.closing = False  # the socket is being closed (proton has nothing more to send)
        self.eof = False  # the peer has sent everything it will
        self.backlog = bytearray()  # input read but not yet pushed into proton (see the header)
        self.lost = False  # the socket is gone
        self.released = False
        self.error_logged = False

    # ---- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, socket) -> None:
        self.transport = lib.pn_transport()
        lib.pn_transport_set_server(self.transport)
        self.connection = lib.pn_connection()
        lib.pn_connection_set_container(self.connection, self._container_id)
        lib.pn_connection_collect(self.connection, self._collector)
        lib.pn_transport_bind(self.transport, self.connection)
        self.engine.made(self)
        self.socket = socket
        peer = socket.get_extra_info("peername")
        self.host = peer[0] if peer else "?"
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        socket.set_write_buffer_limits(high=self.output_max_bytes)
        self.engine.gate.connected(self, socket.get_extra_info("ssl_object"))

    def data_received(self, data: bytes) -> None:
        if self.sasl is not None:
            data = self._authenticate(data)
            if not data:
                return
        self._push(data)

    def _authenticate(self, data: bytes) -> bytes:
        """Feed the SASL exchange; returns what follows it once it has named the client."""
        step = self.sasl.received(data, self.engine.clock_ms())
        if step.state == "failed":
            self.sasl = None
            self.socket.pause_reading()
            self.engine.gate.failed(self, step)
            return b""
        if step.output:
            self.socket.write(step.output)
        if step.state != "authenticated":
            return b""
        self.sasl = None
        self.engine.gate.authenticated(self, step)
        return step.rest

    def refuse(self, output: bytes = b"") -> None:
        """End a connection the engine will not serve: write `output` (a SASL outcome), then close."""
        if self.lost or self.closing:
            return
        self.closing = True
        if output:
            self.socket.write(output)
        self.socket.close()

    def _push(self, data) -> None:
        if self.backlog:
            self.backlog += data
            return
        if len(data) > INPUT_PER_BATCH_BYTES:
            self.backlog += memoryview(data)[INPUT_PER_BATCH_BYTES:]
            data = bytes(memoryview(data)[:INPUT_PER_BATCH_BYTES])
            self.socket.pause_reading()
            self.engine.backlogged(self)
        self._push_now(data)

    def push_backlog(self) -> bool:
        """The loop, once per batch: hand proton the next part of the backlog; True while some is left."""
        if self.lost or self.released or self.output_paused:
            return False  # resume_writing brings it back
        chunk = bytes(self.backlog[:INPUT_PER_BATCH_BYTES])
        del self.backlog[:INPUT_PER_BATCH_BYTES]
        self._push_now(chunk)
        if self.backlog:
            return True
        if self.eof:
            lib.pn_transport_close_tail(self.transport)
        else:
            self.socket.resume_reading()
        return False

    def _push_now(self, data: bytes) -> None:
        transport = self.transport
        pushed = lib.pn_transport_push(transport, data, len(data))
        if pushed < len(data):
            view = memoryview(data)
            while 0 < pushed < len(view):  # proton's input buffer is smaller than what arrived
                view = view[pushed:]
                pushed = lib.pn_transport_push(transport, ffi.from_buffer(view), len(view))
            # pushed <= 0: proton reads no more (a framing error or a closed tail); the rest is dropped
        self.engine.touched(self)

    def eof_received(self) -> bool:
        self.eof = True
        if self.user is None:  # gone before the SASL exchange named it: proton has nothing to answer
            self.sasl = None
            self.refuse()
            return not self.tls
        if not self.backlog:  # else once the backlog has gone to proton
            lib.pn_transport_close_tail(self.transport)
        self.engine.touched(self)
        # keep the socket open for proton's last frames; flush closes it. asyncio's TLS transport closes
        # on EOF whatever this returns, and logs a warning per connection if it returns True
        return not self.tls

    def connection_lost(self, error) -> None:
        self.lost = True
        if not self.released:
            lib.pn_transport_close_tail(self.transport)
            lib.pn_transport_close_head(self.transport)
        self.engine.lost(self)

    def pause_writing(self) -> None:
        self.output_paused = True
        self.socket.pause_reading()

    def resume_writing(self) -> None:
        self.output_paused = False
        if self.lost:
            return
        if self.backlog:
            self.engine.backlogged(self)
        else:
            self.socket.resume_reading()
        self.engine.touched(self)

    # ---- the loop's side ---------------------------------------------------------------------

    def flush(self, buffer, buffer_bytes: int) -> None:
        """Move what proton has to send into the socket, unless the socket's buffer is over its cap."""
        if self.lost or self.closing or self.released:
            return
        transport = self.transport
        while not self.output_paused:
            pending = lib.pn_transport_pending(transport)
            if pending > 0:
                count = lib.pn_transport_peek(transport, buffer, min(pending, buffer_bytes))
                self.socket.write(ffi.unpack(buffer, count))
                lib.pn_transport_pop(transport, count)
            else:
                # pending < 0: proton has closed its output, the AMQP connection is over. Or the peer's
                # EOF came inside a frame: proton then neither errs nor closes, and waits for ever
                if pending < 0 or (self.eof and not self.backlog):
                    self.closing = True
                    self.socket.close()  # after what is buffered has been written
                return

    def tick(self, now_ms: int) -> None:
        """Heartbeats: proton sends an empty frame when the peer's idle timeout asks for one."""
        if not self.released and not self.lost:
            lib.pn_transport_tick(self.transport, now_ms)

    def close_socket(self) -> None:
        if self.socket is not None and not self.lost:
            self.socket.close()

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        lib.pn_transport_unbind(self.transport)
        lib.pn_decref(self.transport)  # the binding has no pn_transport_free: ours is the only reference
        lib.pn_connection_release(self.connection)  # frees its sessions and links, not the connection
        lib.pn_decref(self.connection)  # ours since pn_connection(): without it, it leaked
