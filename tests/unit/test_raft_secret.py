"""Raft traffic under a raft secret: real pysyncobj members with `RaftTransport` on 127.0.0.1, in this
process. Members with the secret connect; a member with another secret, a plaintext pysyncobj dialer
and a socket that never finishes its handshake are closed, each refusal logged once per source and
reason. Waits are bounded waits on conditions; nothing here asserts how fast anything happens.
"""

from __future__ import annotations

import logging
import pickle
import socket
import struct
import zlib

import pytest
from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.tcp_connection import TcpConnection

from handler import raft_transport
from handler.raft_transport import CLOSED_IN_KEY_EXCHANGE, UNDECRYPTABLE, RaftTransport, hello, raft_encryptor
from tests.unit.test_raft_transport import WAIT_S, free_addresses, wait_until

OLD = "old-secret-0123456789"
NEW = "new-secret-0123456789"
CONF = {"connectionRetryTime": 0.1, "appendEntriesPeriod": 0.05, "raftMinTimeout": 0.2, "raftMaxTimeout": 0.4}


@pytest.fixture
def members():
    made: list[SyncObj] = []

    def make(address: str, others: list[str], secrets: tuple[str, ...]) -> SyncObj:
        conf = SyncObjConf(password=secrets[0] if secrets else None, **CONF)
        member = SyncObj(address, others, conf=conf,
                         transportClass=RaftTransport.with_secrets(secrets) if secrets else RaftTransport)
        made.append(member)
        return member

    yield make
    for member in made:
        member.destroy()


def connected(member: SyncObj, other: str) -> bool:
    return member.getStatus().get(f"partner_node_status_server_{other}") == 2


def refusals(caplog, reason: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and reason in r.getMessage()]


def frame(message, encryptor=None) -> bytes:
    """One message as pysyncobj's TcpConnection puts it on the wire."""
    data = zlib.compress(pickle.dumps(message), 3)
    if encryptor is not None:
        data = encryptor.encrypt_at_time(data, 0)
    return struct.pack("i", len(data)) + data


def closed_by_peer(sock: socket.socket) -> bool:
    sock.settimeout(WAIT_S)
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def test_members_sharing_the_secret_elect_a_leader(members):
    a, b = free_addresses(2)
    made = [members(a, [b], (NEW,)), members(b, [a], (NEW,))]
    wait_until(lambda: all(member._getLeader() is not None for member in made), "a leader")
    wait_until(lambda: connected(made[0], b) and connected(made[1], a), "both connected")


def test_a_member_with_another_secret_is_refused_once_and_never_connects(members, caplog, monkeypatch):
    failed = []
    extract_timestamp = raft_transport._Reporting.extract_timestamp

    def counted(self, token):
        try:
            return extract_timestamp(self, token)
        except Exception:
            failed.append(token)
            raise
    monkeypatch.setattr(raft_transport._Reporting, "extract_timestamp", counted)
    low, middle, high = sorted(free_addresses(3))  # the greater address dials: `high` dials both others
    good = [members(low, [middle, high], (NEW,)), members(middle, [low, high], (NEW,))]
    members(high, [low, middle], (OLD,))
    wait_until(lambda: all(member._getLeader() is not None for member in good), "a leader among the two")
    wait_until(lambda: len(failed) >= 20, "the stranger redialling many times")  # every connectionRetryTime
    assert not connected(good[0], high) and not connected(good[1], high)
    assert len(refusals(caplog, UNDECRYPTABLE)) == 2  # one per refusing member (this process logs for both)
    assert len(refusals(caplog, CLOSED_IN_KEY_EXCHANGE)) == 2  # one per member it dials
    assert all("(from 127.0.0.1)" in line for line in refusals(caplog, UNDECRYPTABLE))


def tuple_of(address: str) -> tuple[str, int]:
    host, port = address.rsplit(":", 1)
    return host, int(port)


def test_a_plaintext_pysyncobj_dialer_is_closed_before_anything_is_unpickled(members, caplog, monkeypatch):
    a, b = free_addresses(2)
    members(a, [b], (NEW,))
    unpickled = []
    monkeypatch.setattr(pickle, "loads", lambda *args, **kwargs: unpickled.append(args) or None)
    with socket.create_connection(tuple_of(a)) as sock:
        sock.sendall(frame(hello(b, a)))  # what a member without the secret sends first
        assert closed_by_peer(sock)
    with socket.create_connection(tuple_of(a)) as sock:
        sock.sendall(frame(b, raft_encryptor((OLD,))))  # a key exchange under another secret
        assert closed_by_peer(sock)
    assert unpickled == []
    assert len(refusals(caplog, UNDECRYPTABLE)) == 1  # the same source and reason: logged once


def test_a_rotation_in_steps_keeps_members_connected(members):
    # step 1 of a rotation: one member already lists the new secret second (still encrypting with
    # the old), the other has moved on to encrypting with the new one and still accepts the old
    a, b = free_addresses(2)
    made = [members(a, [b], (OLD, NEW)), members(b, [a], (NEW, OLD))]
    wait_until(lambda: connected(made[0], b) and connected(made[1], a), "both connected across the rotation")
    wait_until(lambda: all(member._getLeader() is not None for member in made), "a leader")


def test_members_that_share_no_secret_never_connect(members, caplog):
    a, b = sorted(free_addresses(2))
    made = [members(a, [b], (NEW,)), members(b, [a], (OLD,))]
    wait_until(lambda: refusals(caplog, UNDECRYPTABLE), "a refusal")
    assert not connected(made[0], b) and not connected(made[1], a)


def test_a_connection_that_never_names_itself_is_closed_after_the_handshake_timeout(members, caplog, monkeypatch):
    monkeypatch.setattr(raft_transport, "HANDSHAKE_TIMEOUT_S", 0.2)
    a, b = free_addresses(2)
    members(a, [b], (NEW,))
    with socket.create_connection(tuple_of(a)) as sock:
        assert closed_by_peer(sock)
    assert refusals(caplog, "did not complete the raft handshake within")


def test_a_connection_that_sends_too_much_before_naming_itself_is_closed(members, caplog):
    a, b = free_addresses(2)
    members(a, [b], (NEW,))
    with socket.create_connection(tuple_of(a)) as sock:
        sock.sendall(struct.pack("i", 1 << 30))  # announces a 1 GiB first message
        try:
            for _ in range(64):  # 4 MiB at most; the member closes after 64 KiB
                sock.sendall(b"x" * (64 << 10))
        except (BrokenPipeError, ConnectionResetError):
            pass
        assert closed_by_peer(sock)
    assert refusals(caplog, "bytes before naming itself")


def test_handshakes_beyond_the_limit_are_closed_at_once(members, caplog, monkeypatch):
    monkeypatch.setattr(raft_transport, "HANDSHAKES_MAX", 2)
    a, b = free_addresses(2)
    members(a, [b], (NEW,))
    sockets = [socket.create_connection(tuple_of(a)) for _ in range(3)]
    try:
        assert closed_by_peer(sockets[2])
    finally:
        for sock in sockets:
            sock.close()
    assert refusals(caplog, "more than 2 raft connections are in their handshake")


def test_pysyncobjs_private_connection_fields_read_here_still_exist():
    # the transport reads these to bound unauthenticated connections; a pysyncobj upgrade renaming
    # them would silently lift those bounds
    connection = TcpConnection(poller=None, socket=None)
    assert isinstance(getattr(connection, raft_transport._READ_BUFFER_ATTRIBUTE), bytes)
    assert hasattr(connection, raft_transport._SOCKET_ATTRIBUTE)


def test_an_encryptor_without_pysyncobjs_password_is_refused():
    class NoPassword:
        encryptor = None
    with pytest.raises(ValueError, match="password"):
        RaftTransport(NoPassword(), None, [], encryptor=raft_encryptor((NEW,)))
