"""The lean AMQP 1.0 client engine: proton's C engine over plain sockets, no reactor.

`grouper perf` and the benchmark's load generator (bench/lean.py) move messages with it. A proton
Container costs its client ~300-1,000 us of CPU per message, more than the broker it measures; this
costs a few. Rules:
- proton's C engine through `node.amqp.engine` (`lib`, `ffi`), never proton's Python classes on the
  message path. Client-mode transports, SASL ANONYMOUS or PLAIN, one `selectors` loop (`Pump`) per
  process, one collector shared by its connections. With a user on a plain connection and no
  mechanism imposed by the caller, the SASL exchange is node/tools/handshake.py's (SCRAM-SHA-256
  where the node offers it) and the transport has no SASL layer.
- One wake-up is one batch: read every readable socket into its transport, drain the collector into
  the caller's handler, then one socket write per connection (`Pump.flush`).
- Messages are encoded by hand from per-group templates (`MessageEncoder`) and read by a walker that
  looks only at properties.group-id and the two application properties the order and latency checks
  need (`read_fields`); the body is never touched. tests/unit/test_bench_lean.py checks both against
  proton's own codec.
- Security: TLS is Python's `ssl` around the socket (handshake blocking, bounded by
  HANDSHAKE_TIMEOUT_S, the broker's certificate checked against the host dialled). SASL PLAIN with a
  user, which proton must be told to allow as "insecure" (it cannot see our TLS): only over TLS or to
  a loopback broker.
- No producer or consumer policy here: what to send, when, and what to count is the caller's.
"""

from __future__ import annotations

import selectors
import socket
import ssl
import struct
import time
from urllib.parse import unquote, urlsplit

from node.amqp.type_encoding import skip_value
from node.amqp.engine import CONNECTION_REMOTE_CLOSE, TRANSPORT_ERROR, condition_text, ffi, lib
from node.net import is_loopback
from node.tools.handshake import HandshakeRefused, NotAmqp, authenticate, not_amqp_text

SENT_KEY = "bench_sent_ns"  # application property: the producer's CLOCK_MONOTONIC send time, ns
SEQ_KEY = "bench_seq"  # application property: the message's number within its group
READ_BYTES = 256 << 10  # one socket read at most
OUTPUT_CHUNK_BYTES = 1 << 20  # one copy out of proton's output buffer
RECEIVE_BUFFER_BYTES = 64 << 10  # a delivery larger than this is read through a bigger buffer
WINDOW_MESSAGES = 1000  # unsettled sends a producer allows itself, whatever credit the broker grants
SELECT_TIMEOUT_S = 0.05  # the longest sleep: how often stop flags and deadlines are looked at
CLOSE_WAIT_S = 2.0  # after close, how long to wait for the broker's close frame
HANDSHAKE_TIMEOUT_S = 10.0  # TCP connect and TLS handshake, each
_BLOCKED = (BlockingIOError, InterruptedError, ssl.SSLWantReadError, ssl.SSLWantWriteError)

_DURABLE_HEADER = b"\x00\x53\x70\xc0\x02\x01\x41"  # header section: list [durable = true]
_PROPERTIES, _APPLICATION_PROPERTIES, _FIRST_BODY_SECTION = 0x73, 0x74, 0x75
_GROUP_ID_INDEX = 10  # properties: message-id .. group-id
_SUBJECT_INDEX = 3
_SENT_KEY = SENT_KEY.encode()
_SEQ_KEY = SEQ_KEY.encode()
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
        # a user on a plain connection, no mechanism imposed: the exchange is ours (SCRAM-SHA-256 where
        # offered, node/tools/handshake.py) and the transport has no SASL layer
        own_sasl = bool(user) and not self.tls and not target.sasl_mechs
        if not own_sasl:
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
        if own_sasl:
            try:
                authenticate(self.socket, user, password)
            except NotAmqp as error:
                self.socket.close()
                raise LeanError(not_amqp_text(self.host, self.port, error.looks_like)) from None
            except HandshakeRefused as error:
                self.socket.close()
                raise LeanError(f"the node at {self.host}:{self.port} did not let {user!r} in: {error}") from None
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
