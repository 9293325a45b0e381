"""The gate with a real security policy and users, a real bridge and the real Connection's SASL path,
fake sockets and loop: PLAIN checks off the engine loop (issue 26 finding 6), attempts refused before
any password work while held, and successes that reset no other account's count (finding 5)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest

from node.amqp.bridge import Bridge
from node.amqp.connection import Connection
from node.amqp.gate import PLAIN_CHECKS_MAX, Gate
from node.core.access.roles import ADMINISTRATOR
from node.security import Security
from node.users import UserDatabase
from tests.unit.test_sasl import SASL_HEADER, ScramClient, init, outcome_code, response, server_frames

PASSWORD = "correct horse battery"
CONFIG = SimpleNamespace(connections_per_address_max=64, handshake_timeout_ms=10_000, sasl_plain_on_loopback=True,
                         sasl_frame_max_bytes=4096, allow_anonymous=False, password_chars_min=12)
THREAD_WAIT_S = 30  # a hang guard for the check thread, never a timing assertion


class CountingSecurity(Security):
    def __init__(self, database):
        super().__init__(CONFIG, "/nonexistent/users.json", database)
        self.checked_on: list[int] = []  # the thread of each PLAIN check

    def verify_plain(self, user, password):
        self.checked_on.append(threading.get_ident())
        return super().verify_plain(user, password)


class FakeSocket:
    def __init__(self):
        self.written, self.reading, self.closed = b"", True, False

    def write(self, data):
        self.written += data

    def pause_reading(self):
        self.reading = False

    def resume_reading(self):
        self.reading = True

    def close(self):
        self.closed = True


class FakeLoop:
    def __init__(self):
        self.later: list = []
        self.soon: list = []

    def call_later(self, delay_s, callback, *args):
        self.later.append((delay_s, callback, args))

    def call_soon(self, callback, *args):
        self.soon.append((callback, args))


class SaslConnection(Connection):
    """The real Connection's SASL path (data_received, _authenticate, refuse) on a fake socket; what
    would go to proton is kept in `pushed`."""

    def __init__(self, engine, host="127.0.0.1"):
        self.engine, self.host, self.peer, self.tls = engine, host, f"{host}:40000", True  # PLAIN offered
        self.socket, self.sasl, self.user, self.admitted = FakeSocket(), None, None, False
        self.output_paused = self.lost = self.closing = self.error_logged = False
        self.pushed = b""

    def _push(self, data):
        self.pushed += data


class Node:
    def __init__(self, security):
        self.posted = threading.Event()
        self.bridge = Bridge(self.posted.set)
        self.now_ms = 1_000
        self.loop = FakeLoop()
        self.gate = Gate(security, self.loop, lambda: self.now_ms, CONFIG)
        self.engine = SimpleNamespace(bridge=self.bridge, gate=self.gate, clock_ms=lambda: self.now_ms)

    def connect(self, host="127.0.0.1") -> SaslConnection:
        connection = SaslConnection(self.engine, host)
        self.gate.connected(connection, None)
        connection.data_received(SASL_HEADER)
        return connection

    def drain_check(self) -> None:
        """Wait for a check thread's post, then run it on this (the loop's) thread."""
        assert self.posted.wait(THREAD_WAIT_S), "no PLAIN check result reached the bridge"
        self.posted.clear()
        self.bridge.drain()

    def plain(self, user: str, password: str, host="127.0.0.1") -> SaslConnection:
        connection = self.connect(host)
        connection.data_received(init("PLAIN", f"\x00{user}\x00{password}".encode()))
        if connection.sasl is not None:  # a check runs off the loop
            self.drain_check()
        return connection

    def answer(self, connection: SaslConnection) -> int | None:
        """The outcome the client got, at once or after the held delay; None if none yet."""
        soon, self.loop.soon = self.loop.soon, []
        for callback, args in soon:
            callback(*args)
        for delay_s, callback, args in self.loop.later:
            if callback == connection.refuse:
                callback(*args)
        self.loop.later = [entry for entry in self.loop.later if entry[1] != connection.refuse]
        frames = server_frames(connection.socket.written)
        return frames[-1][1][0] if frames and frames[-1][0] == 0x44 else None


@pytest.fixture
def users() -> UserDatabase:
    database = UserDatabase()
    database.add_user("admin", PASSWORD, [ADMINISTRATOR])
    database.add_user("mallory", PASSWORD)
    return database


def test_a_plain_check_runs_off_the_loop_and_its_outcome_comes_back_through_the_bridge(users):
    security = CountingSecurity(users)
    node = Node(security)
    connection = node.connect()
    connection.data_received(init("PLAIN", f"\x00admin\x00{PASSWORD}".encode()) + b"AMQP\x00\x01\x00\x00")
    assert connection.socket.reading is False and connection.user is None  # waiting for the check
    node.drain_check()
    assert security.checked_on and security.checked_on[0] != threading.get_ident()
    assert (connection.user, node.answer(connection), connection.socket.reading) == ("admin", 0, True)
    assert connection.pushed == b"AMQP\x00\x01\x00\x00"  # the pipelined header waited, then went to proton


def test_a_wrong_plain_password_is_answered_through_the_bridge_and_counted(users):
    node = Node(CountingSecurity(users))
    connection = node.plain("admin", "guess")
    assert (connection.user, node.answer(connection), connection.socket.closed) == (None, 1, True)
    assert node.gate.failed_logins.stats()["users"] == 1


def test_a_held_address_is_refused_before_any_password_work(users):
    security = CountingSecurity(users)
    node = Node(security)
    for number in range(4):
        node.plain(f"user{number}", "guess")
    checks = len(security.checked_on)
    connection = node.plain("admin", PASSWORD)
    assert len(security.checked_on) == checks  # no key derived
    assert node.answer(connection) == 1 and connection.user is None


def test_successes_of_ones_own_account_do_not_reset_the_throttle_on_guesses_over_amqp(users):
    # issue 26 finding 5: one low-privilege account, 24 guesses at admin over AMQP went unthrottled
    security = CountingSecurity(users)
    node = Node(security)
    for attempt in range(24):
        node.now_ms += 5
        assert node.plain("mallory", PASSWORD).user == "mallory"
        node.plain("admin", f"guess {attempt}")
    guesses_checked = len(security.checked_on) - 24
    assert guesses_checked == 4  # three free, the fourth checked and held; then refused unchecked


def test_scram_from_a_held_address_is_refused_before_the_proof_and_looks_like_a_wrong_password(users):
    node = Node(CountingSecurity(users))
    for number in range(4):
        node.plain(f"user{number}", "guess")
    client = ScramClient("admin", PASSWORD, "fyko+d2lbbFgONRv9qkxdawL")
    connection = node.connect()
    connection.data_received(init("SCRAM-SHA-256", client.first()))
    challenge = server_frames(connection.socket.written)[-1][1][0].decode()
    connection.data_received(response(client.final(challenge)))
    assert (connection.user, node.answer(connection)) == (None, 1)


def test_a_client_that_logged_in_before_gets_in_while_its_user_is_guessed_from_elsewhere(users):
    node = Node(CountingSecurity(users))
    assert node.plain("admin", PASSWORD, host="10.0.0.1").user == "admin"
    for number in range(6):
        node.plain("admin", "guess", host=f"10.9.0.{number}")
    assert node.plain("admin", PASSWORD, host="10.0.0.2").user is None  # the user is held for strangers
    assert node.plain("admin", PASSWORD, host="10.0.0.1").user == "admin"


def test_past_plain_checks_max_an_attempt_fails_for_now_and_counts_nothing(users, monkeypatch):
    node = Node(CountingSecurity(users))
    node.gate._checks_running = PLAIN_CHECKS_MAX  # as if that many were queued
    connection = node.connect()
    connection.data_received(init("PLAIN", f"\x00admin\x00{PASSWORD}".encode()))
    assert node.answer(connection) == 4  # sys-temp: try again
    assert node.gate.failed_logins.stats() == {"addresses": 0, "users": 0, "pairs": 0, "trusted": 0}
    assert outcome_code(connection.socket.written) == 4
