"""The gate's answers to failed SASL exchanges, with a fake loop and fake connections: which failures
the throttle holds back, and which refused clients proton's error log stays quiet about."""

from __future__ import annotations

from types import SimpleNamespace

from node.amqp.gate import Gate
from node.amqp.sasl import SaslStep

CONFIG = SimpleNamespace(connections_per_address_max=8, handshake_timeout_ms=10_000)


class FakeLoop:
    def __init__(self):
        self.held: list[tuple[float, object, tuple]] = []  # (delay_s, callback, args) of call_later

    def call_later(self, delay_s: float, callback, *args) -> None:
        self.held.append((delay_s, callback, args))


class FakeConnection:
    def __init__(self, host: str = "192.0.2.7"):
        self.host, self.peer = host, f"{host}:40000"
        self.user = None
        self.admitted = False
        self.error_logged = False
        self.refusals: list[bytes] = []

    def refuse(self, output: bytes = b"") -> None:
        self.refusals.append(output)


def failure(mechanism: str | None, reason: str) -> SaslStep:
    return SaslStep(output=b"outcome", state="failed", mechanism=mechanism, failure=reason, fault="client")


def gate() -> tuple[Gate, FakeLoop]:
    loop = FakeLoop()
    return Gate(security=None, loop=loop, clock_ms=lambda: 1_000, config=CONFIG), loop


def test_wrong_passwords_from_one_address_are_answered_at_once_three_times_then_held_back():
    the_gate, loop = gate()
    connections = [FakeConnection() for _ in range(5)]
    for connection in connections:
        the_gate.failed(connection, failure("PLAIN", "PLAIN: unknown user or wrong password for user 'u'"))

    assert [c.refusals for c in connections[:3]] == [[b"outcome"]] * 3
    assert connections[3].refusals == connections[4].refusals == []
    assert [(delay_s, args) for delay_s, _, args in loop.held] == [(0.25, (b"outcome",)), (0.5, (b"outcome",))]


def test_garbage_and_unoffered_mechanisms_are_refused_at_once_however_often_they_come():
    the_gate, loop = gate()
    reasons = [None, "the client opened with b'GET / HT', not AMQP 1.0's SASL header",
               "the client asked for SASL mechanism 'PLAIN'; this listener offers ['SCRAM-SHA-256']"]
    connections = [FakeConnection() for _ in range(30)]
    for number, connection in enumerate(connections):
        the_gate.failed(connection, failure(None, reasons[number % 3]))

    assert all(connection.refusals == [b"outcome"] for connection in connections)
    assert loop.held == []


def test_a_client_refused_before_proton_saw_a_byte_leaves_proton_nothing_to_log():
    the_gate, _ = gate()
    refused, served = FakeConnection(), FakeConnection()
    served.user = "alice"

    the_gate.lost(refused)
    the_gate.lost(served)

    assert refused.error_logged and not served.error_logged
