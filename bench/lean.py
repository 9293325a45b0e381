"""The benchmark's AMQP 1.0 load generator: proton's C engine over plain sockets, no reactor.

A proton Container costs its client ~300-1,000 us of CPU per message on this machine, more than the
broker it measures; this client costs a few. Rules:
- proton's C engine through `node.amqp.engine` (`lib`, `ffi`), never proton's Python classes
  (Container, Handler, Event, Message) on the message path. Client-mode transports, SASL ANONYMOUS
  or PLAIN (RabbitMQ), one `selectors` loop per process, one collector shared by its connections.
- One wake-up is one batch: read every readable socket into its transport, drain the collector,
  send what credit and the window allow, then one socket write per connection.
- Messages are encoded by hand from per-group templates (`MessageEncoder`) and read by a walker that
  looks only at properties.group-id and the two application properties the order and latency checks
  need (`read_fields`); the body is never touched. `tests/unit/test_bench_lean.py` checks both
  against proton's own codec. (pipeline/messages.py's encoder builds each message from a dict: 3 us
  a message against these templates' 0.8-1, and it has no subject, which RabbitMQ's hash exchange
  routes on.)
- A consumer grants `prefetch` credit at attach and, after each pass, as much credit as it accepted,
  so at most `prefetch` deliveries are ever unsettled on its link.
- It moves messages and writes what it saw, in the form clients.py summarises; it never starts
  brokers and never formats tables.
- Security: TLS is Python's `ssl` around the socket (handshake blocking, bounded by
  HANDSHAKE_TIMEOUT_S, before the loop; the broker's certificate checked against the host dialled);
  proton's bytes pass through it unchanged. SASL PLAIN with a user, which proton must be told to
  allow as "insecure" (it cannot see our TLS): only over TLS or to a loopback broker.
- `python bench/lean.py --url ... --queue ...` runs one row against any AMQP 1.0 broker and prints
  what clients.py measured (no broker CPU: the broker may be elsewhere).
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import selectors
import socket
import ssl
import struct
import sys
import tempfile
import time
from array import array
from dataclasses import asdict
from pathlib import Path
from urllib.parse import unquote, urlsplit

import clients
from node.amqp.codec import skip_value
from node.amqp.engine import (ACCEPTED, CONNECTION_REMOTE_CLOSE, DELIVERY, LINK_REMOTE_CLOSE, LINK_REMOTE_DETACH,
                              LINK_REMOTE_OPEN, MODIFIED, NULL, REJECTED, RELEASED, TRANSPORT_ERROR,
                              condition_text, delivery_tag, ffi, lib, tag_value)

READ_BYTES = 256 << 10  # one socket read at most
OUTPUT_CHUNK_BYTES = 1 << 20  # one copy out of proton's output buffer
RECEIVE_BUFFER_BYTES = 64 << 10  # a delivery larger than this is read through a bigger buffer
WINDOW_MESSAGES = 1000  # unsettled sends a producer allows itself, whatever credit the broker grants
SELECT_TIMEOUT_S = 0.05  # the longest sleep: how often stop flags and deadlines are looked at
CLOSE_WAIT_S = 2.0  # after close, how long to wait for the broker's close frame
HANDSHAKE_TIMEOUT_S = 10.0  # TCP connect and TLS handshake, each
PASSWORD_FILE_MAX_BYTES = 4096
_BLOCKED = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)

_DURABLE_HEADER = b"\x00\x53\x70\xc0\x02\x01\x41"  # header section: list [durable = true]
_PROPERTIES, _APPLICATION_PROPERTIES, _FIRST_BODY_SECTION = 0x73, 0x74, 0x75
_GROUP_ID_INDEX = 10  # properties: message-id .. group-id
_SUBJECT_INDEX = 3
_SENT_KEY = clients.SENT_KEY.encode()
_SEQ_KEY = clients.SEQ_KEY.encode()
# application-properties: map8 of {bench_sent_ns: long, bench_seq: long}
_APPLICATION_HEAD = b"\x00\x53\x74\xc1" + bytes((1 + 2 + len(_SENT_KEY) + 9 + 2 + len(_SEQ_KEY) + 9, 4)) \
    + b"\xa1" + bytes((len(_SENT_KEY),)) + _SENT_KEY + b"\x81"
_PACK_TIMES = struct.Struct(f">q{2 + len(_SEQ_KEY) + 1}sq").pack
_SEQ_ITEM = b"\xa1" + bytes((len(_SEQ_KEY),)) + _SEQ_KEY + b"\x81"


class LeanError(Exception):
    """The broker refused or dropped something; the text says what and names the broker's condition."""


# ---- message bytes ----------------------------------------------------------------------------

def _str8(data: bytes) -> bytes:
    return b"\xa1" + bytes((len(data),)) + data


def _binary(data: bytes) -> bytes:
    if len(data) < 256:
        return b"\xa0" + bytes((len(data),)) + data
    return b"\xb0" + len(data).to_bytes(4, "big") + data


class MessageEncoder:
    """Bench messages as AMQP 1.0 bytes: header and properties once per group, the rest per message."""

    def __init__(self, body_bytes: int, durable: bool, group_as_subject: bool):
        self.header = _DURABLE_HEADER if durable else b""
        self.group_as_subject = group_as_subject  # RabbitMQ's hash exchange routes on the subject
        self.body_section = b"\x00\x53\x75" + _binary(b"x" * body_bytes)
        self._prefixes: dict[str, bytes] = {}

    def prefix(self, group: str) -> bytes:
        prefix = self._prefixes.get(group)
        if prefix is None:
            encoded = _str8(group.encode())
            fields = [b"\x40"] * _GROUP_ID_INDEX + [encoded]
            if self.group_as_subject:
                fields[_SUBJECT_INDEX] = encoded
            items = b"".join(fields)
            prefix = self.header + b"\x00\x53\x73\xc0" + bytes((len(items) + 1, len(fields))) + items
            self._prefixes[group] = prefix
        return prefix

    def encode(self, group: str, sent_ns: int, seq: int) -> bytes:
        return b"".join((self.prefix(group), _APPLICATION_HEAD, _PACK_TIMES(sent_ns, _SEQ_ITEM, seq),
                         self.body_section))


def _compound(buf: bytes, position: int) -> tuple[int, int, int]:
    """A list or map: (end, item count, first item's position)."""
    code = buf[position]
    if code in (0xC0, 0xC1):
        return position + 2 + buf[position + 1], buf[position + 2], position + 3
    if code in (0xD0, 0xD1):
        size = int.from_bytes(buf[position + 1:position + 5], "big")
        return position + 5 + size, int.from_bytes(buf[position + 5:position + 9], "big"), position + 9
    if code == 0x45:  # list0
        return position + 1, 0, position + 1
    raise ValueError(f"format code 0x{code:02x} at byte {position} is not a list or map")


def _integer(buf: bytes, position: int) -> int:
    code = buf[position]
    if code in (0x81, 0x80):
        return int.from_bytes(buf[position + 1:position + 9], "big", signed=code == 0x81)
    if code in (0x55, 0x54):
        return int.from_bytes(buf[position + 1:position + 2], "big", signed=True)
    if code in (0x53, 0x52):
        return buf[position + 1]
    if code in (0x71, 0x70):
        return int.from_bytes(buf[position + 1:position + 5], "big", signed=code == 0x71)
    if code in (0x44, 0x43):
        return 0
    raise ValueError(f"format code 0x{code:02x} at byte {position} is not an integer")


def _group_id(buf: bytes, position: int):
    end, count, item = _compound(buf, position)
    if count <= _GROUP_ID_INDEX:
        return None, end
    for _ in range(_GROUP_ID_INDEX):
        item = item + 1 if buf[item] == 0x40 else skip_value(buf, item)
    code = buf[item]
    if code in (0xA1, 0xA3):
        return buf[item + 2:item + 2 + buf[item + 1]].decode(), end
    if code in (0xB1, 0xB3):
        size = int.from_bytes(buf[item + 1:item + 5], "big")
        return buf[item + 5:item + 5 + size].decode(), end
    return None, end


def _bench_properties(buf: bytes, position: int) -> tuple[int, int]:
    end, count, item = _compound(buf, position)
    seq, sent_ns = -1, 0
    for _ in range(count // 2):
        code = buf[item]
        if code in (0xA1, 0xA3):
            key_end = item + 2 + buf[item + 1]
            key = buf[item + 2:key_end]
        else:
            key_end, key = skip_value(buf, item), None
        if key == _SEQ_KEY:
            seq = _integer(buf, key_end)
        elif key == _SENT_KEY:
            sent_ns = _integer(buf, key_end)
        item = skip_value(buf, key_end)
    return seq, sent_ns


def read_fields(buf: bytes) -> tuple[str | None, int, int]:
    """(group id, bench_seq, bench_sent_ns) of an encoded message; -1 and 0 for what is missing."""
    group, seq, sent_ns = None, -1, 0
    position, end = 0, len(buf)
    while position < end:
        if buf[position] != 0x00 or buf[position + 1] != 0x53:
            raise ValueError(f"byte {position} does not start a section with a small descriptor")
        section = buf[position + 2]
        position += 3
        if section >= _FIRST_BODY_SECTION:
            break
        if section == _PROPERTIES:
            group, position = _group_id(buf, position)
        elif section == _APPLICATION_PROPERTIES:
            seq, sent_ns = _bench_properties(buf, position)
            break  # the body follows
        else:
            position = skip_value(buf, position)
    return group, seq, sent_ns


# ---- one connection ---------------------------------------------------------------------------

def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def credentials(target) -> tuple[str, str]:
    """(user, password) for SASL PLAIN: the target's own fields, else the url's; ("", "") for none."""
    if getattr(target, "user", ""):
        return target.user, target.password
    parts = urlsplit(target.url if "//" in target.url else f"amqp://{target.url}")
    if parts.username is None:
        return "", ""
    return unquote(parts.username), unquote(parts.password or "")


def tls_context(ca_file: str = "") -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca_file or None)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


class Endpoint:
    """One socket, its transport and connection; the process's pump owns the collector."""

    def __init__(self, target, container_id: str, collector):
        url = target.url
        parts = urlsplit(url if "//" in url else f"amqp://{url}")
        self.host, self.port = parts.hostname or "127.0.0.1", parts.port or 5672
        user, password = credentials(target)
        self.tls = bool(getattr(target, "tls", False))
        if user and not self.tls and not is_loopback(self.host):
            raise LeanError(f"refusing to send the password of {user!r} unencrypted to {self.host}; use --tls")
        context = tls_context(getattr(target, "ca_file", "")) if self.tls else None
        self.transport = lib.pn_transport()
        self.connection = lib.pn_connection()
        sasl = lib.pn_sasl(self.transport)
        if user:
            lib.pn_connection_set_user(self.connection, user.encode())
            lib.pn_connection_set_password(self.connection, password.encode())
            # proton cannot see our TLS; the check above keeps PLAIN to TLS or loopback
            lib.pn_sasl_set_allow_insecure_mechs(sasl, True)
        lib.pn_sasl_allowed_mechs(sasl, (target.sasl_mechs or ("PLAIN" if user else "ANONYMOUS")).encode())
        lib.pn_connection_set_container(self.connection, container_id.encode())
        lib.pn_connection_set_hostname(self.connection, self.host.encode())
        lib.pn_connection_collect(self.connection, collector)
        lib.pn_transport_bind(self.transport, self.connection)
        self.socket = socket.create_connection((self.host, self.port), timeout=HANDSHAKE_TIMEOUT_S)
        self.socket.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if context is not None:
            try:
                self.socket = context.wrap_socket(self.socket, server_hostname=self.host)
            except (ssl.SSLError, OSError) as error:
                self.socket.close()
                raise LeanError(f"TLS with {self.host}:{self.port} failed: {error}") from None
        self.socket.setblocking(False)
        self.closed = False  # the socket is gone or proton's input and output are both over
        self.error = ""
        lib.pn_connection_open(self.connection)
        self.session = lib.pn_session(self.connection)
        lib.pn_session_open(self.session)

    def sender(self, name: str, address: str):
        link = lib.pn_sender(self.session, name.encode())
        lib.pn_terminus_set_address(lib.pn_link_target(link), address.encode())
        lib.pn_terminus_set_address(lib.pn_link_source(link), name.encode())
        lib.pn_link_open(link)
        return link

    def receiver(self, name: str, address: str):
        link = lib.pn_receiver(self.session, name.encode())
        lib.pn_terminus_set_address(lib.pn_link_source(link), address.encode())
        lib.pn_terminus_set_address(lib.pn_link_target(link), name.encode())
        lib.pn_link_open(link)
        return link

    def read(self) -> None:
        """Move what the socket has into the transport (the transport's capacity bounds a read)."""
        while True:
            capacity = lib.pn_transport_capacity(self.transport)
            if capacity <= 0:
                return
            try:
                data = self.socket.recv(min(capacity, READ_BYTES))
            except _BLOCKED:
                return
            except OSError as error:
                self._lose(f"read failed: {error}")
                return
            if not data:
                lib.pn_transport_close_tail(self.transport)
                return
            lib.pn_transport_push(self.transport, data, len(data))
            if not self.buffered():
                return

    def buffered(self) -> bool:
        """TLS holds decrypted bytes the socket no longer shows as readable."""
        return self.tls and self.socket.pending() > 0

    def write(self, buffer) -> bool:
        """Send what proton has; True while bytes are left over for when the socket drains."""
        transport = self.transport
        while True:
            pending = lib.pn_transport_pending(transport)
            if pending < 0:
                self.closed = lib.pn_transport_closed(transport)
                return False
            if pending == 0:
                return False
            # a TLS write that would block is retried with at least the same bytes: pending only grows
            count = lib.pn_transport_peek(transport, buffer, min(pending, OUTPUT_CHUNK_BYTES))
            try:
                sent = self.socket.send(ffi.buffer(buffer, count))
            except _BLOCKED:
                return True
            except OSError as error:
                self._lose(f"write failed: {error}")
                return False
            lib.pn_transport_pop(transport, sent)
            if sent < count:
                return True

    def _lose(self, why: str) -> None:
        self.error = self.error or why
        lib.pn_transport_close_tail(self.transport)
        lib.pn_transport_close_head(self.transport)
        self.closed = True

    def close(self) -> None:
        lib.pn_connection_close(self.connection)

    def release(self) -> None:
        self.socket.close()
        lib.pn_transport_unbind(self.transport)
        lib.pn_decref(self.transport)  # the binding has no pn_transport_free
        lib.pn_connection_release(self.connection)


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
        endpoint = Endpoint(target, container_id, self.collector)
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


def _problem(kind: int, event) -> str:
    """The broker's reason for an event that ends a link, connection or transport ('' if none)."""
    if kind == TRANSPORT_ERROR:
        return condition_text(lib.pn_transport_condition(lib.pn_event_transport(event))) or "transport error"
    if kind == CONNECTION_REMOTE_CLOSE:
        reason = condition_text(lib.pn_connection_remote_condition(lib.pn_event_connection(event)))
        return f"connection closed by the broker: {reason}" if reason else ""
    reason = condition_text(lib.pn_link_remote_condition(lib.pn_event_link(event)))
    return f"link detached by the broker: {reason}" if reason else ""


# ---- the producer -----------------------------------------------------------------------------

class Producer:
    """Sends the workload's plan on one link, at most `window_messages` unsettled, counting outcomes."""

    def __init__(self, target, workload, window_messages: int = WINDOW_MESSAGES):
        self.groups, self.seqs = clients.plan(workload)
        self.total = workload.messages
        self.rate_per_s = workload.rate_per_s
        self.window_messages = window_messages
        self.encoder = MessageEncoder(workload.body_bytes, workload.durable, target.routing_subject)
        self.pump = Pump(self._on_event)
        self.endpoint = self.pump.connect(target, "bench-producer")
        self.link = self.endpoint.sender("bench-producer", target.send_address)
        self.opened = False
        self.sent = self.accepted = self.rejected = self.released = self.modified = 0
        self.first_send_ns = self.last_send_ns = 0
        self.outcome_seen = bytearray(self.total)
        self.error = ""

    @property
    def settled(self) -> int:
        return self.accepted + self.rejected + self.released + self.modified

    def _on_event(self, kind: int, event) -> None:
        if kind == DELIVERY:
            delivery = lib.pn_event_delivery(event)
            if lib.pn_delivery_updated(delivery):
                self._outcome(delivery)
        elif kind == LINK_REMOTE_OPEN:
            self.opened = lib.pn_link_remote_target(self.link) != NULL
        elif kind in (LINK_REMOTE_CLOSE, LINK_REMOTE_DETACH, CONNECTION_REMOTE_CLOSE, TRANSPORT_ERROR):
            self.error = self.error or _problem(kind, event)

    def _outcome(self, delivery) -> None:
        # A delivery's second event (RabbitMQ sends the outcome, then the settlement) can wait in the
        # collector after the first has settled it: each tag (the send's number) counts once.
        number = int(tag_value(delivery))
        if self.outcome_seen[number]:
            return
        state = lib.pn_delivery_remote_state(delivery)
        if state == ACCEPTED:
            self.accepted += 1
        elif state == REJECTED:
            self.rejected += 1
            if not self.error:
                self.error = "rejected: " + condition_text(lib.pn_disposition_condition(lib.pn_delivery_remote(delivery)))
        elif state == RELEASED:
            self.released += 1
        elif state == MODIFIED:
            self.modified += 1
        else:
            return  # not an outcome yet
        self.outcome_seen[number] = 1
        lib.pn_delivery_settle(delivery)

    def wait_attached(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.opened and not self.error and not self.endpoint.closed:
            if time.monotonic() > deadline:
                raise LeanError(f"the producer link was not attached within {timeout_s} s")
            self.pump.flush()
            self.pump.run_once(SELECT_TIMEOUT_S)
        if self.error or self.endpoint.closed:
            raise LeanError(self.error or self.endpoint.error or "the connection closed during attach")

    def run(self, stall_timeout_s: float) -> None:
        """Send everything and wait for every outcome; stops early on an error or a stall."""
        start_ns = time.monotonic_ns()
        last_progress_ns, last_settled = start_ns, -1
        while (self.sent < self.total or self.settled < self.sent) and not self.error and not self.endpoint.closed:
            self._send_due(start_ns)
            self.pump.flush()
            self.pump.run_once(self._sleep_s(start_ns))
            now_ns = time.monotonic_ns()
            if self.settled != last_settled:
                last_settled, last_progress_ns = self.settled, now_ns
            elif now_ns - last_progress_ns > stall_timeout_s * 1e9:
                self.error = f"no outcome for {stall_timeout_s} s ({self.settled}/{self.sent} settled)"
        self.error = self.error or self.endpoint.error

    def _send_due(self, start_ns: int) -> None:
        link = self.link
        count = min(lib.pn_link_credit(link), self.window_messages - (self.sent - self.settled), self.total - self.sent)
        if self.rate_per_s:
            due = (time.monotonic_ns() - start_ns) * self.rate_per_s // 1_000_000_000 + 1
            count = min(count, due - self.sent)
        if count <= 0:
            return
        groups, seqs, encode = self.groups, self.seqs, self.encoder.encode
        send, advance, new_delivery, monotonic_ns = lib.pn_link_send, lib.pn_link_advance, lib.pn_delivery, time.monotonic_ns
        number = self.sent
        if not number:
            self.first_send_ns = monotonic_ns()
        for number in range(number, number + count):
            payload = encode(groups[number], monotonic_ns(), seqs[number])
            new_delivery(link, delivery_tag(number))
            send(link, payload, len(payload))
            advance(link)
        self.sent = number + 1
        self.last_send_ns = monotonic_ns()

    def _sleep_s(self, start_ns: int) -> float:
        if not self.rate_per_s or self.sent >= self.total:
            return SELECT_TIMEOUT_S
        next_due_ns = start_ns + self.sent * 1_000_000_000 // self.rate_per_s
        return min(SELECT_TIMEOUT_S, max(0.0, (next_due_ns - time.monotonic_ns()) / 1e9))

    def result(self) -> dict:
        return {"sent": self.sent, "accepted": self.accepted, "rejected": self.rejected,
                "released": self.released + self.modified, "first_send_ns": self.first_send_ns,
                "last_send_ns": self.last_send_ns, "error": self.error}


def producer(target, workload, go, result_path: str) -> None:
    """The producer process: attach, wait for `go`, send the plan, write what happened."""
    result = {"sent": 0, "accepted": 0, "rejected": 0, "released": 0, "first_send_ns": 0, "last_send_ns": 0,
              "cpu_s": 0.0, "error": ""}
    cpu_start_s = clients._cpu_s()
    sender = None
    try:
        sender = Producer(target, workload)
        sender.wait_attached(clients.READY_TIMEOUT_S)
        go.wait()
        cpu_start_s = clients._cpu_s()
        sender.run(clients.STALL_TIMEOUT_S)
        result.update(sender.result())
    except Exception as error:  # reported in the row, not raised: a benchmark records failures
        result["error"] = f"{type(error).__name__}: {error}"
    result["cpu_s"] = clients._cpu_s() - cpu_start_s
    if sender is not None:
        sender.pump.close_all()
    clients._dump(result_path, result)


# ---- consumers --------------------------------------------------------------------------------

class _Consumer:
    __slots__ = ("index", "link", "opened", "accepted_since_flow", "count", "groups", "seqs", "received_ns",
                 "latencies_ns", "last_accept_ns", "error")

    def __init__(self, index: int, link):
        self.index = index
        self.link = link
        self.opened = False
        self.accepted_since_flow = 0
        self.count = 0
        self.groups: list = []
        self.seqs = array("q")
        self.received_ns = array("q")
        self.latencies_ns = array("q")
        self.last_accept_ns = 0
        self.error = ""

    def as_dict(self, cpu_s: float) -> dict:
        return {"count": self.count, "groups": self.groups, "seqs": self.seqs, "received_ns": self.received_ns,
                "latencies_ns": self.latencies_ns, "last_accept_ns": self.last_accept_ns, "error": self.error,
                "cpu_s": cpu_s}


class Consumers:
    """Consumers in one process, one connection each; every delivery accepted as soon as it is read."""

    def __init__(self, target, indexes: list, prefetch: int):
        self.prefetch = prefetch
        self.pump = Pump(self._on_event)
        self.by_link: dict = {}
        self.consumers: list[_Consumer] = []
        self._buffer = ffi.new("char[]", RECEIVE_BUFFER_BYTES)
        self._buffer_bytes = RECEIVE_BUFFER_BYTES
        for index in indexes:
            endpoint = self.pump.connect(target, f"bench-consumer-{index}")
            for number, address in enumerate(target.consumer_addresses[index]):
                link = endpoint.receiver(f"bench-c{index}-{number}", address)
                lib.pn_link_flow(link, prefetch)
                consumer = _Consumer(index, link)
                self.by_link[link] = consumer
                self.consumers.append(consumer)

    def _on_event(self, kind: int, event) -> None:
        if kind == DELIVERY:
            self._receive(lib.pn_event_delivery(event))
        elif kind == LINK_REMOTE_OPEN:
            link = lib.pn_event_link(event)
            consumer = self.by_link.get(link)
            if consumer is not None:
                consumer.opened = lib.pn_link_remote_source(link) != NULL
        elif kind in (LINK_REMOTE_CLOSE, LINK_REMOTE_DETACH):
            consumer = self.by_link.get(lib.pn_event_link(event))
            if consumer is not None:
                consumer.error = consumer.error or _problem(kind, event) or "link detached by the broker"
        elif kind in (CONNECTION_REMOTE_CLOSE, TRANSPORT_ERROR):
            problem = _problem(kind, event)
            if problem:
                for consumer in self.consumers:
                    consumer.error = consumer.error or problem

    def _receive(self, delivery) -> None:
        if not lib.pn_delivery_readable(delivery) or lib.pn_delivery_partial(delivery):
            return  # an update of a delivery already read, or more frames to come
        link = lib.pn_delivery_link(delivery)
        size = lib.pn_delivery_pending(delivery)
        if size > self._buffer_bytes:
            self._buffer_bytes = max(size, 2 * self._buffer_bytes)
            self._buffer = ffi.new("char[]", self._buffer_bytes)
        count = lib.pn_link_recv(link, self._buffer, size)
        payload = ffi.unpack(self._buffer, max(count, 0))
        lib.pn_link_advance(link)
        lib.pn_delivery_update(delivery, ACCEPTED)
        lib.pn_delivery_settle(delivery)
        received_ns = time.monotonic_ns()
        consumer = self.by_link[link]
        group, seq, sent_ns = read_fields(payload)
        consumer.count += 1
        consumer.groups.append(group)
        consumer.seqs.append(seq)
        consumer.received_ns.append(received_ns)
        consumer.latencies_ns.append(received_ns - sent_ns)
        consumer.last_accept_ns = received_ns
        consumer.accepted_since_flow += 1

    def top_up(self) -> None:
        """Credit back what each link accepted since the last pass: one flow frame per link per pass."""
        for consumer in self.consumers:
            if consumer.accepted_since_flow:
                lib.pn_link_flow(consumer.link, consumer.accepted_since_flow)
                consumer.accepted_since_flow = 0

    def pass_once(self, timeout_s: float) -> None:
        self.pump.flush()
        self.pump.run_once(timeout_s)
        self.top_up()


def consumers(target, indexes: list, workload, readies, stop, progress, result_paths) -> None:
    """The consumer process: attach, signal each ready, consume until `stop`, write what each saw."""
    group = None
    cpu_start_s = clients._cpu_s()
    try:
        group = Consumers(target, indexes, workload.prefetch)
        _attach(group, readies, clients.READY_TIMEOUT_S)
        cpu_start_s = clients._cpu_s()
        next_look_s = 0.0
        while True:
            group.pass_once(SELECT_TIMEOUT_S)
            now_s = time.monotonic()
            if now_s >= next_look_s:  # progress and the stop flag cost a lock each: looked at ~50 times a second
                next_look_s = now_s + 0.02
                for consumer in group.consumers:
                    progress[consumer.index] = consumer.count
                if stop.is_set():
                    break
    except Exception as error:
        if group is None:
            for index in indexes:
                clients._dump(result_paths[index], {**_Consumer(index, None).as_dict(0.0),
                                                    "error": f"{type(error).__name__}: {error}"})
            return
        for consumer in group.consumers:
            consumer.error = consumer.error or f"{type(error).__name__}: {error}"
    cpu_s = clients._cpu_s() - cpu_start_s
    group.pump.close_all()
    # The process's CPU is shared by its consumers; only the sum over all processes is reported.
    for consumer in group.consumers:
        clients._dump(result_paths[consumer.index], consumer.as_dict(cpu_s / len(group.consumers)))


def _attach(group: Consumers, readies, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    waiting = list(group.consumers)
    while waiting:
        if time.monotonic() > deadline:
            raise LeanError(f"{len(waiting)} consumer link(s) not attached within {timeout_s} s")
        group.pass_once(SELECT_TIMEOUT_S)
        failed = [consumer.error for consumer in waiting if consumer.error]
        if failed:
            raise LeanError(failed[0])
        waiting = [consumer for consumer in waiting if not consumer.opened]
    for consumer in group.consumers:
        readies[consumer.index].set()


# ---- one row from the command line -----------------------------------------------------------

def read_password_file(path: str) -> str:
    """A password file's content, one trailing newline dropped (as a mounted Secret or `echo` leaves it)."""
    with open(path, "rb") as handle:
        data = handle.read(PASSWORD_FILE_MAX_BYTES + 1)
    if len(data) > PASSWORD_FILE_MAX_BYTES:
        raise ValueError(f"{path} is over {PASSWORD_FILE_MAX_BYTES} bytes: not a password file")
    text = data.decode("utf-8")
    for ending in ("\r\n", "\n"):
        if text.endswith(ending):
            return text[:-len(ending)]
    return text


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python bench/lean.py", description="One grouped row against an AMQP 1.0 broker: 1 producer, N "
        "consumers, lean.py's clients; prints throughput, latency, order and client CPU as JSON.")
    parser.add_argument("--url", required=True, help="HOST:PORT or amqp://HOST:PORT of the broker")
    parser.add_argument("--queue", required=True, help="the queue to send to and consume from")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--groups", type=int, default=1000)
    parser.add_argument("--prefetch", type=int, default=100)
    parser.add_argument("--consumers", type=int, default=4)
    parser.add_argument("--durable", action="store_true", help="set the header's durable flag")
    parser.add_argument("--rate", type=int, default=0, help="messages per second the producer offers (0: flat out)")
    parser.add_argument("--user", default="", help="SASL PLAIN user; its password comes from --password-file")
    parser.add_argument("--password-file", default="", help="a file holding the password (one trailing newline "
                        "is dropped), such as a mounted Kubernetes Secret")
    parser.add_argument("--tls", action="store_true", help="speak TLS (the broker's amqps port)")
    parser.add_argument("--ca", default="", help="PEM CAs for the broker's certificate (implies --tls; without "
                        "it the system's CAs)")
    return parser


def target_from_args(args, parse: argparse.ArgumentParser):
    """The Target a row from the command line sends to; bad combinations end in parse.error (exit 2)."""
    from peers import Target

    if args.password_file and not args.user:
        parse.error("--password-file needs --user")
    if args.user and not args.password_file:
        parse.error("--user needs --password-file (a password is never a flag: it would show in ps)")
    tls = args.tls or bool(args.ca)
    parts = urlsplit(args.url if "//" in args.url else f"amqp://{args.url}")
    if not parts.hostname or parts.port is None:
        parse.error(f"--url {args.url!r} is not HOST:PORT")
    if parts.username is not None:
        parse.error("--url must not carry credentials; use --user and --password-file")
    if args.user and not tls and not is_loopback(parts.hostname):
        parse.error(f"--user would send its password unencrypted to {parts.hostname}; add --tls (and --ca)")
    password = ""
    if args.password_file:
        try:
            password = read_password_file(args.password_file)
        except (OSError, ValueError) as error:
            parse.error(f"--password-file: cannot read {args.password_file}: {error}")
    if args.ca:
        try:
            tls_context(args.ca)
        except (OSError, ssl.SSLError) as error:
            parse.error(f"--ca: cannot load {args.ca}: {error}")
    return Target("amqp", f"amqp://{parts.hostname}:{parts.port}", args.queue,
                  tuple((args.queue,) for _ in range(args.consumers)), user=args.user, password=password,
                  tls=tls, ca_file=args.ca)


def main(argv: list[str] | None = None) -> int:
    parse = parser()
    args = parse.parse_args(argv)
    target = target_from_args(args, parse)
    workload = clients.Workload(messages=args.messages, groups=args.groups, prefetch=args.prefetch,
                                durable=args.durable, consumers=args.consumers, rate_per_s=args.rate)
    with tempfile.TemporaryDirectory(prefix="grouper-lean-") as scratch:
        outcome = clients.measure(target, workload, lambda: 0.0, Path(scratch), 1)
    result = {key: value for key, value in asdict(outcome).items() if key != "broker_cpu_us_per_msg"}
    print(json.dumps(result, indent=1))
    return 0 if not outcome.errors and not outcome.lost and outcome.unique == args.messages else 1


if __name__ == "__main__":
    sys.exit(main())
