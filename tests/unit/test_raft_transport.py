"""The raft handshake: a connection is kept only by the member it was meant for.

`judge_hello` is pure; the pickle round trip is how pysyncobj carries the first message over the wire.
The last test runs real pysyncobj members with `RaftTransport` on 127.0.0.1, in this process: the
members connect, and pysyncobj's own utility and read-only connections are still served.
"""

from __future__ import annotations

import pickle
import socket
import time

from pysyncobj import SyncObj, SyncObjConf
from pysyncobj.utility import TcpUtility

from handler.raft_transport import HELLO, HelloVerdict, RaftTransport, hello, judge_hello

WAIT_S = 10.0  # longest any wait for the in-process raft cluster may take

GROUPER_1 = "grouper-1.grouper-headless.ns.svc:5674"
GROUPER_2 = "grouper-2.grouper-headless.ns.svc:5674"
GROUPER_3 = "grouper-3.grouper-headless.ns.svc:5674"


def over_the_wire(message):
    return pickle.loads(pickle.dumps(message))


def test_a_connection_meant_for_this_node_is_accepted_as_the_dialers():
    assert judge_hello(over_the_wire(hello(GROUPER_2, GROUPER_1)), GROUPER_1) == HelloVerdict(GROUPER_2)


def test_a_connection_meant_for_another_member_is_refused_naming_the_dialer_both_addresses_and_what_happens_next():
    verdict = judge_hello(over_the_wire(hello(GROUPER_2, GROUPER_1)), GROUPER_3)
    assert verdict.dialer_address == GROUPER_2
    assert verdict.refusal.startswith(f"member {GROUPER_2} dialled {GROUPER_1} but reached this node, {GROUPER_3}")
    assert "stale" in verdict.refusal and f"so {GROUPER_2} redials and resolves {GROUPER_1} again" in verdict.refusal


def test_addresses_are_compared_exactly_as_members_name_themselves():
    assert judge_hello(hello(GROUPER_2, "grouper-1:5674"), GROUPER_1).refusal
    assert judge_hello(hello(GROUPER_2, GROUPER_1.replace("5674", "5675")), GROUPER_1).refusal


def test_a_bare_address_as_vanilla_pysyncobj_sends_it_is_refused_as_another_version():
    verdict = judge_hello(GROUPER_2, GROUPER_1)
    assert verdict.dialer_address == ""
    assert "not a Grouper raft hello" in verdict.refusal and "every member must run this version" in verdict.refusal


def test_malformed_hellos_are_refused_and_quoted_briefly():
    for message in [(HELLO, GROUPER_2), (HELLO, GROUPER_2, None), (HELLO, 2, GROUPER_1), ["hello", GROUPER_1],
                    ("other", GROUPER_2, GROUPER_1), {"type": "append_entries"}, None,
                    (HELLO, GROUPER_2, GROUPER_1, "")]:
        assert judge_hello(message, GROUPER_1).refusal, message
    long = judge_hello("x" * 10_000, GROUPER_1).refusal
    assert len(long) < 400


def free_addresses(count: int) -> list[str]:
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [f"127.0.0.1:{sock.getsockname()[1]}" for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_until(predicate, what: str) -> None:
    deadline_s = time.monotonic() + WAIT_S
    while not predicate():
        assert time.monotonic() < deadline_s, f"not within {WAIT_S} s: {what}"
        time.sleep(0.05)


def test_members_connect_and_pysyncobjs_utility_and_read_only_connections_are_still_served():
    addresses = free_addresses(2)
    conf = {"connectionRetryTime": 0.1, "appendEntriesPeriod": 0.05, "raftMinTimeout": 0.2, "raftMaxTimeout": 0.4}
    made = [SyncObj(address, [other for other in addresses if other != address], conf=SyncObjConf(**conf),
                    transportClass=RaftTransport) for address in addresses]
    try:
        wait_until(lambda: all(member._getLeader() is not None for member in made), "both members agreeing on a leader")
        status = TcpUtility(timeout=WAIT_S).executeCommand(addresses[0], ["status"])  # what syncobj_admin sends
        assert str(status["self"]) == addresses[0] and status["has_quorum"]
        assert status[f"partner_node_status_server_{addresses[1]}"] == 2  # connected
        read_only = SyncObj(None, addresses, conf=SyncObjConf(**conf), transportClass=RaftTransport)
        made.append(read_only)
        wait_until(lambda: read_only._getLeader() is not None, "the read-only node learning the leader")
        assert str(read_only._getLeader()) in addresses
        # what an election's log line says: whom this member heard from when, and its own tick pauses
        transport = made[0]._SyncObj__transport
        wait_until(lambda: addresses[1] in transport.heard_at_s, "the first member hearing from the second")
        now_s = time.monotonic()
        assert f"last heard from: {addresses[1]} " in transport.pulse(now_s)
        transport.tick_pauses.append((now_s, 340.0))  # as if the process had been starved of CPU for 340 ms
        assert "its tick loop paused up to 340 ms" in transport.pulse(now_s)
        assert "never paused" in transport.pulse(now_s + 60)  # only the last 10 s count
    finally:
        for member in made:
            member.destroy()
