"""A raw-socket AMQP SASL client: what a client puts on the wire before the node lets it in.

For the security tests (test_security.py): SCRAM-SHA-256, which a pip-built proton cannot do, and the
exchanges no well-behaved client library makes (a stall, an oversized frame, a connection over the
per-address limit). Rules:
- Frames are encoded and decoded with proton's `Data`, never with the node's own codec; the SCRAM
  client is the hashlib/hmac one the SASL unit tests check against RFC 7677.
- Every read is bounded by the socket's timeout; `closed_by_node` tells the node closing the socket
  apart from the node staying silent.
"""

from __future__ import annotations

import socket
import time

from proton import Array, Data, Described, symbol, ulong

from tests.unit.test_sasl import ScramClient

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
MECHANISMS, INIT, CHALLENGE, RESPONSE, OUTCOME = 0x40, 0x41, 0x42, 0x43, 0x44
OUTCOME_OK, OUTCOME_AUTH, OUTCOME_SYS = 0, 1, 2
READ_TIMEOUT_S = 10.0  # bound of every read from the node
SCRAM_CLIENT_NONCE = "grouper-security-test-nonce"


class NodeClosed(Exception):
    """The node closed the socket where the test expected bytes."""


def sasl_frame(body: bytes) -> bytes:
    return (8 + len(body)).to_bytes(4, "big") + bytes((2, 1, 0, 0)) + body


def performative(code: int, *fields) -> bytes:
    data = Data()
    data.put_object(Described(ulong(code), list(fields)))
    return sasl_frame(bytes(data.encode()))


def sasl_init(mechanism: str, initial_response: bytes | None = None) -> bytes:
    return performative(INIT, symbol(mechanism), initial_response)


def plain_response(user: str, password: str) -> bytes:
    return b"\x00" + user.encode() + b"\x00" + password.encode()


class SaslSocket:
    """One TCP connection to an AMQP listener, driven byte by byte."""

    def __init__(self, address: str, timeout_s: float = READ_TIMEOUT_S):
        host, port = address.rsplit(":", 1)
        self.socket = socket.create_connection((host, int(port)), timeout=timeout_s)

    def close(self) -> None:
        self.socket.close()

    def __enter__(self) -> "SaslSocket":
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def send(self, data: bytes) -> None:
        self.socket.sendall(data)

    def read_exactly(self, count: int) -> bytes:
        data = b""
        while len(data) < count:
            try:
                chunk = self.socket.recv(count - len(data))
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                raise NodeClosed(f"the node closed the socket after {data!r} (expected {count} bytes)")
            data += chunk
        return data

    def read_frame(self) -> tuple[int, list]:
        """The next SASL performative: (descriptor code, fields)."""
        size = int.from_bytes(self.read_exactly(4), "big")
        rest = self.read_exactly(size - 4)
        assert rest[1] == 1, f"not a SASL frame: type {rest[1]}"
        data = Data()
        data.decode(rest[rest[0] * 4 - 4:])
        described = data.get_object()
        fields = [bytes(value) if isinstance(value, memoryview) else value for value in described.value]
        return int(described.descriptor), fields

    def closed_by_node(self, timeout_s: float = READ_TIMEOUT_S) -> tuple[bool, bytes]:
        """Read until the node closes the socket or `timeout_s` passes: (closed, bytes read meanwhile)."""
        received = b""
        deadline = time.monotonic() + timeout_s
        while (left_s := deadline - time.monotonic()) > 0:
            self.socket.settimeout(left_s)
            try:
                chunk = self.socket.recv(4096)
            except socket.timeout:
                return False, received
            except ConnectionResetError:
                return True, received
            if not chunk:
                return True, received
            received += chunk
        return False, received

    # ---- the exchange ------------------------------------------------------------------------

    def mechanisms(self) -> list[str]:
        """Send the SASL header; the mechanisms the node offers."""
        self.send(SASL_HEADER)
        header = self.read_exactly(8)
        assert header == SASL_HEADER, f"the node answered the SASL header with {header!r}"
        code, fields = self.read_frame()
        assert code == MECHANISMS, f"expected sasl-mechanisms, got performative 0x{code:02x}"
        offered = fields[0]  # an array of symbols, or one symbol alone
        return [str(name) for name in (offered.elements if isinstance(offered, Array) else [offered])]

    def outcome(self) -> tuple[int, bytes | None]:
        code, fields = self.read_frame()
        assert code == OUTCOME, f"expected sasl-outcome, got performative 0x{code:02x}"
        return fields[0], fields[1] if len(fields) > 1 else None

    def plain(self, user: str, password: str) -> int:
        """A whole PLAIN exchange; the outcome code."""
        self.mechanisms()
        self.send(sasl_init("PLAIN", plain_response(user, password)))
        return self.outcome()[0]

    def scram(self, user: str, password: str) -> int:
        """A whole SCRAM-SHA-256 exchange; the outcome code. A success is checked to come with the
        server's signature, proving the node knew the user's keys."""
        offered = self.mechanisms()
        assert "SCRAM-SHA-256" in offered, f"the node offers {offered}"
        client = ScramClient(user, password, SCRAM_CLIENT_NONCE)
        self.send(sasl_init("SCRAM-SHA-256", client.first()))
        code, fields = self.read_frame()
        if code == OUTCOME:  # refused before any challenge
            return fields[0]
        assert code == CHALLENGE, f"expected sasl-challenge, got performative 0x{code:02x}"
        self.send(performative(RESPONSE, client.final(fields[0].decode())))
        outcome, additional_data = self.outcome()
        if outcome == OUTCOME_OK:
            assert additional_data is not None and client.verifies(additional_data.decode()), \
                f"the node's server-final message {additional_data!r} does not prove it knew the keys"
        return outcome

    def amqp_header_answered(self) -> bytes:
        """After a successful exchange: send the AMQP header; the node's own header in answer."""
        self.send(AMQP_HEADER)
        return self.read_exactly(8)
