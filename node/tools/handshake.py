"""The SASL exchange of `grouper send/receive/browse` on a plain connection, done before proton sees it.

Why here and not in proton: python-qpid-proton as pip builds it knows ANONYMOUS, PLAIN and EXTERNAL
only, and a node with users offers SCRAM-SHA-256 always but PLAIN without TLS only with
--sasl-plain-on-loopback (node/security.py). So the tools read the node's header and mechanisms
themselves, then hand the authenticated socket to proton with its SASL layer off. Rules:
- The mechanism is chosen from what the node offers: with a user SCRAM-SHA-256, else PLAIN; without
  one ANONYMOUS. A mechanism missing is reported with what the node offers and what enables the one
  needed (`HandshakeRefused`), never guessed at.
- The first bytes say whether the peer speaks AMQP at all. Anything but the SASL header is named
  by what it looks like (HTTP/2: a gRPC admin port; HTTP/1; TLS) in `NotAmqp`, and never dumped.
- Every read is bounded by the socket's timeout; the password never leaves this process but as
  PLAIN's response (the caller allows that only to loopback) or as SCRAM's proof.
- proton's reactor is handed the authenticated socket by `dialled`, the one place that reaches
  into proton's internals (proton._io.IO.connect).
"""

from __future__ import annotations

import socket
from contextlib import contextmanager

from proton import Array, Data, Described, symbol, ulong
from scramp import ScramClient, ScramException

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
SCRAM, PLAIN, ANONYMOUS = "SCRAM-SHA-256", "PLAIN", "ANONYMOUS"
HEADER_BYTES = 8
HEADER_ANSWER_TIMEOUT_S = 5.0  # a node answers the header at once; an HTTP/1 server waits for a request line
SILENT = (f"a server silent for {HEADER_ANSWER_TIMEOUT_S:g} s after the AMQP header, as an HTTP/1 server "
          f"waiting for a request line is (a node's HTTP port)")
SASL_FRAME_MAX_BYTES = 65536  # a larger frame announced by the peer is not SASL from a node
_MECHANISMS, _INIT, _CHALLENGE, _RESPONSE, _OUTCOME = 0x40, 0x41, 0x42, 0x43, 0x44
_OUTCOME_OK, _OUTCOME_AUTH = 0, 1
_HTTP2_SETTINGS, _HTTP2_GOAWAY = 0x04, 0x07
_TLS_ALERT, _TLS_HANDSHAKE = 0x15, 0x16


class NotAmqp(Exception):
    """The peer answered the AMQP header with something else; `looks_like` says what it resembles."""

    def __init__(self, looks_like: str):
        super().__init__(looks_like)
        self.looks_like = looks_like


class HandshakeRefused(Exception):
    """The node speaks AMQP but did not let this client in; the text says why and what to do."""


def looks_like(answer: bytes) -> str | None:
    """What the first bytes a peer sent back resemble; None when they are AMQP's SASL header."""
    if answer == SASL_HEADER:
        return None
    if answer.startswith(b"AMQP") and len(answer) == HEADER_BYTES:
        return (f"an AMQP peer wanting protocol id {answer[4]} (version {answer[5]}.{answer[6]}.{answer[7]}), "
                f"not SASL")
    if answer.startswith(b"HTTP/"):
        return "an HTTP/1 server (a node's HTTP port: health, metrics, console)"
    if len(answer) >= 4 and answer[3] in (_HTTP2_SETTINGS, _HTTP2_GOAWAY) and answer[:3] < b"\x00\x40\x00":
        return "an HTTP/2 server (a node's gRPC admin port)"
    if len(answer) >= 2 and answer[0] in (_TLS_ALERT, _TLS_HANDSHAKE) and answer[1] == 0x03:
        return "a TLS server (an amqps port: give --ca, or use the node's plain AMQP port)"
    return "a server that answered with bytes that are no AMQP header"


def choose_mechanism(offered: list[str], user: str) -> str:
    """The mechanism to use of those `offered`; HandshakeRefused naming what is missing if none fits."""
    if user:
        for mechanism in (SCRAM, PLAIN):
            if mechanism in offered:
                return mechanism
        if offered == [ANONYMOUS]:
            raise HandshakeRefused("it offers ANONYMOUS only, as a node without a users file does (every client "
                                   "is anonymous there): leave out --user, or give the node a users file "
                                   "(`grouper user add`, README: Security)")
        raise HandshakeRefused(f"it offers {', '.join(offered) or 'no mechanism'}, none that takes a password "
                               f"(SCRAM-SHA-256 comes with a users file; PLAIN needs TLS or "
                               f"--sasl-plain-on-loopback)")
    if ANONYMOUS in offered:
        return ANONYMOUS
    raise HandshakeRefused(f"it does not let anonymous clients in (it offers {', '.join(offered)}): give --user "
                           f"NAME with a password (--password-stdin or $GROUPER_PASSWORD), or start the node with "
                           f"--allow-anonymous")


# ---- frames (AMQP 1.0 part 5.3: SASL frames are type 1, channel 0) -------------------------------

def _frame(code: int, *fields) -> bytes:
    data = Data()
    data.put_object(Described(ulong(code), list(fields)))
    body = bytes(data.encode())
    return (8 + len(body)).to_bytes(4, "big") + bytes((2, 1, 0, 0)) + body


class _Wire:
    def __init__(self, sock: socket.socket):
        self.socket = sock

    def read_exactly(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            try:
                chunk = self.socket.recv(count - len(data))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return data
            data += chunk
        return data

    def read_frame(self) -> tuple[int, list]:
        size = int.from_bytes(self.read_exactly(4).rjust(4, b"\x00"), "big")
        if not 8 <= size <= SASL_FRAME_MAX_BYTES:
            raise HandshakeRefused(f"it sent a SASL frame of {size} bytes, which no node sends: is it a Grouper node?")
        rest = self.read_exactly(size - 4)
        if len(rest) < size - 4:
            raise HandshakeRefused("it closed the connection in the middle of the SASL exchange (see the node's log)")
        data = Data()
        data.decode(rest[rest[0] * 4 - 4:])
        described = data.get_object()
        fields = [bytes(value) if isinstance(value, memoryview) else value for value in described.value]
        return int(described.descriptor), fields


def authenticate(sock: socket.socket, user: str, password: str) -> str:
    """Run the SASL exchange on a connected socket; the mechanism used. On success the socket is
    ready for the client's AMQP header. NotAmqp or HandshakeRefused otherwise."""
    wire = _Wire(sock)
    sock.sendall(SASL_HEADER)
    timeout_s = sock.gettimeout()
    sock.settimeout(HEADER_ANSWER_TIMEOUT_S)
    try:
        answer = wire.read_exactly(HEADER_BYTES)
    except socket.timeout:
        raise NotAmqp(SILENT) from None
    finally:
        sock.settimeout(timeout_s)
    if not answer:  # a node turns an address with too many connections away so, before any byte
        raise HandshakeRefused("it closed the connection without answering the AMQP header: it is no AMQP port, "
                               "or a node turning this address away (too many connections from it: its log "
                               "says)")
    resemblance = looks_like(answer)
    if resemblance is not None:
        raise NotAmqp(resemblance)
    code, fields = wire.read_frame()
    if code != _MECHANISMS:
        raise HandshakeRefused(f"it sent SASL performative 0x{code:02x} where its mechanisms belong")
    offered = fields[0] if fields else []
    offered = [str(name) for name in (offered.elements if isinstance(offered, Array) else [offered] if offered else [])]
    mechanism = choose_mechanism(offered, user)
    if mechanism == SCRAM:
        client = ScramClient([SCRAM], user, password)
        sock.sendall(_frame(_INIT, symbol(SCRAM), client.get_client_first().encode()))
        code, fields = wire.read_frame()
        if code == _CHALLENGE:
            try:
                client.set_server_first(bytes(fields[0]).decode())
            except ScramException as error:
                raise HandshakeRefused(f"its SCRAM challenge did not read: {error}") from None
            sock.sendall(_frame(_RESPONSE, client.get_client_final().encode()))
            code, fields = wire.read_frame()
    else:
        response = b"\x00" + user.encode() + b"\x00" + password.encode() if mechanism == PLAIN else b""
        sock.sendall(_frame(_INIT, symbol(mechanism), response))
        code, fields = wire.read_frame()
    if code != _OUTCOME:
        raise HandshakeRefused(f"it sent SASL performative 0x{code:02x} where the outcome belongs")
    outcome = fields[0]
    if outcome == _OUTCOME_AUTH:
        who = f"user {user!r} with {mechanism}" if user else "an anonymous client"
        raise HandshakeRefused(f"it refused {who}: the user or the password is wrong (`grouper user add` on the "
                               f"node's users file makes one)")
    if outcome != _OUTCOME_OK:
        raise HandshakeRefused(f"the SASL exchange failed (outcome code {outcome}; the node's log says why)")
    if mechanism == SCRAM:
        try:
            client.set_server_final(bytes(fields[1] or b"").decode())
        except (ScramException, IndexError, TypeError) as error:
            raise HandshakeRefused(f"it let us in without proving it knows the user's keys ({error}): is it the "
                                   f"node you meant?") from None
    return mechanism


@contextmanager
def dialled(sock: socket.socket):
    """While open, proton's reactor "connects" to `sock`, already connected and authenticated, instead
    of dialling: python-qpid-proton has no public way to take a socket of ours. Its reactor dials
    through proton._io.IO.connect; the one connection opened inside (sasl_enabled=False) takes `sock`.
    The tools are single-threaded: nothing else dials meanwhile."""
    from proton._io import IO

    dial = IO.__dict__["connect"]
    IO.connect = staticmethod(lambda address: sock)
    try:
        yield
    finally:
        IO.connect = dial


# ---- what the tools say ----------------------------------------------------------------------

PROBE_TIMEOUT_S = 2.0  # how long a neighbouring port may take to answer the AMQP header
# where a node's AMQP port is, seen from another of its ports (node/config/settings.py defaults, `grouper up`)
AMQP_PORT_OFFSET_BY_KIND = {"HTTP/2": -1, "HTTP/1": -3, "TLS": +1}


def speaks_amqp(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> bool:
    """The peer at host:port answers the SASL header with its own (then the probe hangs up)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as probe:
            probe.sendall(SASL_HEADER)
            return _Wire(probe).read_exactly(HEADER_BYTES) == SASL_HEADER
    except OSError:
        return False


def not_amqp_text(host: str, port: int, resemblance: str, probe=speaks_amqp) -> str:
    """The tools' answer when host:port does not speak AMQP, with the AMQP port when a neighbour
    at the usual offset answers like one."""
    kind = next((kind for kind in AMQP_PORT_OFFSET_BY_KIND if kind in resemblance), None)
    where = f"{host}:{port}"
    text = f"{where} is not an AMQP port (it answered like {resemblance})"
    if kind is not None and 0 < port + AMQP_PORT_OFFSET_BY_KIND[kind] <= 65535:
        candidate = port + AMQP_PORT_OFFSET_BY_KIND[kind]
        if probe(host, candidate):
            return f"{text}; the AMQP port is {host}:{candidate}: give --node {host}:{candidate}"
    return (f"{text}; a node's AMQP port is the one its start-up prints as `amqp:` (5672 by default, node0 of "
            f"`grouper up`; `grouper cluster status` lists each member's): give it with --node")
