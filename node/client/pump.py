"""The selectors loop of one load-generating process: every connection's reads, events and writes.

Rules:
- One `Pump` per process, one collector shared by its connections (node/client/endpoint.py).
- One wake-up is one batch: read every readable socket into its transport, drain the collector into
  the caller's `handle(type, event)`, then one socket write per connection (`flush`).
- No producer or consumer policy here: what to send, when, and what to count is the caller's.
"""

from __future__ import annotations

import selectors
import time

from node.amqp.engine import ffi, lib
from node.client.endpoint import OUTPUT_CHUNK_BYTES, Endpoint, connect

SELECT_TIMEOUT_S = 0.05  # the longest sleep: how often stop flags and deadlines are looked at
CLOSE_WAIT_S = 2.0  # after close, how long to wait for the broker's close frame


class Pump:
    """The selectors loop of one process: read, drain events into `handle(type, event)`, write."""

    def __init__(self, handle):
        self.handle = handle
        self.collector = lib.pn_collector()
        self.selector = selectors.DefaultSelector()
        self.endpoints: list[Endpoint] = []
        self.tls_endpoints: list[Endpoint] = []
        self.by_connection: dict = {}
        self._buffer = ffi.new("char[]", OUTPUT_CHUNK_BYTES)

    def connect(self, target, container_id: str) -> Endpoint:
        endpoint = connect(target, container_id, self.collector)
        self.endpoints.append(endpoint)
        if endpoint.tls:
            self.tls_endpoints.append(endpoint)
        self.by_connection[endpoint.connection] = endpoint
        self.selector.register(endpoint.socket, selectors.EVENT_READ, endpoint)
        return endpoint

    def endpoint_of(self, event) -> Endpoint | None:
        return self.by_connection.get(lib.pn_event_connection(event))

    def run_once(self, timeout_s: float) -> None:
        buffered = [endpoint for endpoint in self.tls_endpoints if endpoint.buffered()] if self.tls_endpoints else ()
        for key, _ in self.selector.select(0 if buffered else timeout_s):
            key.data.read()
        for endpoint in buffered:
            endpoint.read()
        self.drain()

    def drain(self) -> None:
        collector, handle = self.collector, self.handle
        peek, pop, event_type = lib.pn_collector_peek, lib.pn_collector_pop, lib.pn_event_type
        event = peek(collector)
        while event:
            handle(event_type(event), event)
            pop(collector)
            event = peek(collector)

    def flush(self) -> None:
        for endpoint in self.endpoints:
            if endpoint.closed:
                continue
            blocked = endpoint.write(self._buffer)
            mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if blocked else 0)
            if self.selector.get_key(endpoint.socket).events != mask:
                self.selector.modify(endpoint.socket, mask, endpoint)

    def close_all(self) -> None:
        """Close every connection and wait (bounded) for the broker's close frames."""
        for endpoint in self.endpoints:
            if not endpoint.closed:
                endpoint.close()
        deadline = time.monotonic() + CLOSE_WAIT_S
        while time.monotonic() < deadline and not all(endpoint.closed for endpoint in self.endpoints):
            self.flush()
            self.run_once(SELECT_TIMEOUT_S)
        self.drain()
        for endpoint in self.endpoints:
            self.selector.unregister(endpoint.socket)
            endpoint.release()
        self.endpoints.clear()
        lib.pn_collector_free(self.collector)
