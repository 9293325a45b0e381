"""Issue 26's probes, run as an attacker on the same machine would run them, against two real targets;
every probe must fail ("How to test it": a CI file that starts the quick start and a production-style
cluster and tries each).

The targets (tests/integration/probe_targets.py), each started once for the module and killed in its
finalizer: the quick start (`grouper up`, 3 nodes, open, then secured the README's way while it runs
by the probes that need users) and a production-style cluster (users file, cluster TLS, raft secret
0600, on 127.0.0.1).

Rules of this file:
- Each probe is one test per target; the helpers come from the tests that guard each fix, imported.
- pytest runs a file's tests in order, and the order matters twice: the HTTP probes come before the
  SCRAM probe secures the quick start (DNS rebinding mattered against its open console), and the
  throttle probes come last, as they leave `admin` held back on their target. Every probe works in
  either state of the quick start all the same (it logs in when the target has users).
- Every wait is bounded and polls; timing is asserted as lower bounds only (the throttle's hold).
"""

from __future__ import annotations

import base64
import json
import stat
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Callable

import grpc
import pytest
from proton import Delivery

from node.admin.callers import basic_value
from node.peer.signature import Signer
from proto import peer_pb2_grpc
from tests.integration.grouper_up import GrouperUp, malicious_frame, send_to_raft_port
from tests.integration.harness import ManualReceiver, grouped, send_outcome
from tests.integration.probe_targets import (PASSWORD, POLL_S, WAIT_S, Production, Target, production_cluster,
                                             production_target, quick_start_target, secure_quick_start)
from tests.integration.sasl_socket import CHALLENGE, OUTCOME, OUTCOME_AUTH, OUTCOME_OK, RESPONSE, SaslSocket, \
    performative, sasl_init
from tests.integration.test_file_modes import modes_open_to_others, written_files
from tests.integration.test_forward_credentials import HUGE_SEQ, OTHER_SECRET, forged_batch, refused
from tests.integration.test_http_hosts import REBOUND, request
from tests.integration.test_login_probes import THROTTLE_DELAY_MIN_S, plain_s, server_first
from tests.unit.test_sasl import ScramClient

MARKER_WAIT_S = 3.0  # a frame that runs is unpickled within milliseconds of arriving
GROUPS = [f"g{n}" for n in range(4)]
SENDS_PER_GROUP = 5
REFUSED_AT_THE_PEER_PORT = {grpc.StatusCode.UNAVAILABLE,  # the TLS handshake failed
                            grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED}


# ---- the targets (tests/integration/probe_targets.py), each once for the module ----------------

@pytest.fixture(scope="module")
def quick_start_up(tmp_path_factory):
    up = GrouperUp(tmp_path_factory.mktemp("quick-start") / "cluster")
    try:
        yield up.start()
    finally:
        up.kill_tree()


@pytest.fixture(scope="module")
def quick_start(quick_start_up) -> Target:
    return quick_start_target(quick_start_up)


@pytest.fixture(scope="module")
def secured_quick_start(quick_start_up, quick_start) -> Target:
    return secure_quick_start(quick_start_up, quick_start)


@pytest.fixture(scope="module")
def production_made(tmp_path_factory) -> Production:
    made = production_cluster(tmp_path_factory.mktemp("production"))
    try:
        yield made
    finally:
        made.cluster.kill_all()


@pytest.fixture(scope="module")
def production(production_made) -> Target:
    return production_target(production_made)


TARGETS = ["quick_start", "production"]


@pytest.fixture(params=TARGETS)
def target(request) -> Target:
    return request.getfixturevalue(request.param)


@pytest.fixture(params=TARGETS)
def target_with_users(request) -> Target:
    return request.getfixturevalue({"quick_start": "secured_quick_start"}.get(request.param, request.param))


# ---- 1. raft ports ----------------------------------------------------------------------------

def markers_made_within(markers: list[Path], timeout_s: float = MARKER_WAIT_S) -> list[str]:
    """The markers that exist by `timeout_s` (polled; any one found ends the wait)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if any(marker.exists() for marker in markers):
            break
        time.sleep(POLL_S)
    return [marker.name for marker in markers if marker.exists()]


def test_a_pickle_at_every_raft_port_runs_nothing_and_the_cluster_keeps_its_leader(target, tmp_path):
    markers = []
    for index, port in enumerate(target.raft_ports):
        for key in (None, OTHER_SECRET):  # in plaintext, and encrypted as a member with another secret would
            marker = tmp_path / f"ran-node{index}-{'plain' if key is None else 'wrong-key'}"
            markers.append(marker)
            assert send_to_raft_port(port, malicious_frame(marker, key)) == b"", f"node{index} answered {key=}"
    assert markers_made_within(markers) == []
    target.wait_leader()


# ---- 2. forwarding ----------------------------------------------------------------------------

def sends_from_node0_to_a_consumer_on_node1(target: Target, connections: list, queue: str) -> dict[str, list[str]]:
    """node0's grouped sends to groups a consumer on node1 owns, so node0 forwards them to node1: what
    the consumer received, per group in order; it is checked that nothing else (a forged message) came."""
    connections.append(target.connect(1))
    consumer = ManualReceiver(connections[-1], queue, "c1", credit=len(GROUPS) * SENDS_PER_GROUP + 1)
    target.wait_status(lambda s: {m["node"]: m["consumers"] for m in s["members"]}[target.node_ids[1]].get(queue) == 1,
                       f"the consumer on node1 of {queue}")
    connections.append(target.connect(0))
    sender = connections[-1].create_sender(queue, name="p0")
    for seq in range(SENDS_PER_GROUP):
        for group in GROUPS:
            state, condition = send_outcome(sender, grouped(f"{group}:{seq}", group))
            assert state == Delivery.ACCEPTED, condition
    received = consumer.fetch_many(len(GROUPS) * SENDS_PER_GROUP)
    for held in received:
        held.accept()
    extra = consumer.poll()
    assert extra is None, f"more than node0 sent reached the consumer: {extra}"
    by_group: dict[str, list[str]] = {}
    for held in received:
        group, seq = held.body.split(":")
        by_group.setdefault(group, []).append(seq)
    return by_group


def queue_names(target: Target) -> set[str]:
    return {queue["name"] for member in target.status()["members"] for queue in member["queues"]}


def test_forwarding_from_a_stranger_to_the_admin_port_is_refused_and_node0s_sends_all_arrive_in_order(
        target, connections):
    queue, owner = "probe.forwarded", target.admin[1]
    forged = forged_batch(target.node_ids[0], queue, HUGE_SEQ)  # claims node0, leaping its forward seq
    for metadata in (None, Signer([OTHER_SECRET]).metadata(forged, target.node_ids[1])):
        error = refused(owner, forged, metadata)
        assert error.code() is grpc.StatusCode.UNAUTHENTICATED, (error.code(), error.details())
    error = refused(owner, forged_batch("stranger:1", "probe.stolen", 1))
    assert error.code() is grpc.StatusCode.UNAUTHENTICATED, (error.code(), error.details())

    by_group = sends_from_node0_to_a_consumer_on_node1(target, connections, queue)
    assert by_group == {group: [str(seq) for seq in range(SENDS_PER_GROUP)] for group in GROUPS}
    assert "probe.stolen" not in queue_names(target)


def forward_through(channel: grpc.Channel, batch) -> grpc.RpcError:
    with channel:
        with pytest.raises(grpc.RpcError) as raised:
            peer_pb2_grpc.PeerServiceStub(channel).Forward(batch, timeout=WAIT_S)
    return raised.value


def test_the_peer_port_refuses_a_caller_without_a_node_certificate_and_node0s_sends_all_arrive(
        production, production_made, connections):
    cert_dir = production_made.cert_dir
    queue, peer = "probe.peer", production.peer[1]
    forged = forged_batch(production.node_ids[0], queue, HUGE_SEQ)
    ca = (cert_dir / "ca.pem").read_bytes()
    mallory = grpc.ssl_channel_credentials(ca, (cert_dir / "mallory-key.pem").read_bytes(),
                                           (cert_dir / "mallory.pem").read_bytes())
    for channel in (grpc.insecure_channel(peer),  # plaintext
                    grpc.secure_channel(peer, grpc.ssl_channel_credentials(ca)),  # TLS without a certificate
                    grpc.secure_channel(peer, mallory)):  # a user's certificate of the cluster's own CA
        error = forward_through(channel, forged)
        assert error.code() in REFUSED_AT_THE_PEER_PORT, (error.code(), error.details())

    by_group = sends_from_node0_to_a_consumer_on_node1(production, connections, queue)
    assert by_group == {group: [str(seq) for seq in range(SENDS_PER_GROUP)] for group in GROUPS}


# ---- 5. the HTTP port (before the SCRAM probe secures the quick start) ------------------------

def http(target: Target, method: str, path: str, headers: dict, body: dict | None = None) -> tuple[int, str]:
    encoded = None if body is None else json.dumps(body).encode()
    if body is not None:
        headers = {**headers, "Content-Type": "application/json"}
    return request(SimpleNamespace(http_address=target.http[0]), method, path, headers, encoded)


def test_a_foreign_host_is_misdirected_and_a_foreign_origin_may_not_act(target):
    port = target.http[0].rsplit(":", 1)[1]
    rebound = {**target.http_headers(), "Host": f"{REBOUND}:{port}"}  # a DNS rebinding page's request
    for method, path, body in (("GET", "/", None), ("GET", "/api/queues", None),
                               ("POST", "/api/queues", {"name": "probe.rebound"})):
        status, answer = http(target, method, path, rebound, body)
        assert status == 421, (method, path, status, answer)
    for origin in ("http://attacker.example", f"http://{REBOUND}:{port}", "null"):
        status, answer = http(target, "POST", "/api/queues", {**target.http_headers(), "Origin": origin},
                              {"name": "probe.cross.site"})
        assert status == 403, (origin, status, answer)
    assert not {"probe.rebound", "probe.cross.site"} & queue_names(target)


def group_depths(target: Target, queue: str) -> dict[str, int]:
    """{group: available messages} of `queue` over every member, from the admin API."""
    depths: dict[str, int] = {}
    for index in range(len(target.admin)):
        with target.admin_client(index) as admin:
            for row in admin.group_page(queue, page_size=500)["groups"]:
                if row["messages"]:
                    depths[row["group"]] = depths.get(row["group"], 0) + row["messages"]
    return depths


def test_the_consoles_purge_of_group_dot_dot_purges_that_group_only(target, connections):
    queue = "probe.names"
    connections.append(target.connect(0))
    sender = connections[-1].create_sender(queue, name="p-names")
    for group in ("..", "keep"):
        for index in range(2):
            assert send_outcome(sender, grouped(f"{group}-{index}", group))[0] == Delivery.ACCEPTED
    deadline = time.monotonic() + WAIT_S
    while (depths := group_depths(target, queue)) != {"..": 2, "keep": 2}:
        assert time.monotonic() < deadline, f"the sent messages are not all queued: {depths}"
        time.sleep(POLL_S)

    status, answer = http(target, "POST", "/api/groups/purge", target.http_headers(), {"queue": queue, "group": ".."})
    assert (status, json.loads(answer)) == (200, {"messages_purged": 2}), answer
    assert group_depths(target, queue) == {"keep": 2}


def test_metrics_of_the_production_cluster_need_a_login(production):
    headers = {"Host": production.http[0]}
    status, answer = http(production, "GET", "/metrics", headers)
    assert status == 401 and "probe." not in answer, (status, answer)
    status, answer = http(production, "GET", "/metrics", {**headers, "Authorization": basic_value("admin", PASSWORD)})
    assert status == 200 and "grouper_" in answer, status


# ---- 3. SCRAM ---------------------------------------------------------------------------------

def test_an_unknown_scram_user_gets_the_same_salt_everywhere_shaped_like_a_known_users(target_with_users):
    nodes = target_with_users.amqp
    unknown = [server_first(address, "nobody") for address in nodes + nodes]  # every node, asked twice
    known = server_first(nodes[0], "admin")
    assert len({answer["s"] for answer in unknown}) == 1, unknown
    assert len(base64.b64decode(unknown[0]["s"])) == len(base64.b64decode(known["s"]))
    assert {answer["i"] for answer in unknown} == {known["i"]}


# ---- 6. files ---------------------------------------------------------------------------------

def private_modes(path: Path) -> str:
    return f"{stat.S_IMODE(path.stat().st_mode):04o}"


def test_every_data_directory_is_private_and_every_file_in_it_too(target_with_users, request):
    if target_with_users.name == "quick_start":
        data_dir = request.getfixturevalue("quick_start_up").data_dir
        written = written_files(data_dir)
        assert {"raft.secret", "users.json"} <= written, written
        for index in range(3):
            assert {f"node{index}.log", f"node{index}/raft/raft.journal"} <= written, written
        assert private_modes(data_dir) == "0700"
        assert modes_open_to_others(data_dir) == {}
        return
    made = request.getfixturevalue("production_made")
    for node in made.cluster.nodes:
        assert "raft/raft.journal" in written_files(node.data_dir)
        assert private_modes(node.data_dir) == "0700"
        assert modes_open_to_others(node.data_dir) == {}
    for secret in (made.secrets / "users.json", made.secrets / "raft.secret", *sorted(made.cert_dir.glob("*-key.pem"))):
        assert private_modes(secret) == "0600", secret


# ---- 4. the throttle (last: it leaves admin held back on its target) --------------------------

def scram_s(address: str, user: str, password: str) -> tuple[int, float]:
    """One SCRAM-SHA-256 exchange: (outcome code, seconds from sasl-init to the outcome)."""
    with SaslSocket(address) as raw:
        raw.mechanisms()
        client = ScramClient(user, password, "probe-throttle-nonce")
        started = time.monotonic()
        raw.send(sasl_init("SCRAM-SHA-256", client.first()))
        code, fields = raw.read_frame()
        if code == CHALLENGE:  # a held attempt is refused before any challenge
            raw.send(performative(RESPONSE, client.final(fields[0].decode())))
            code, fields = raw.read_frame()
        assert code == OUTCOME, f"expected sasl-outcome, got performative 0x{code:02x}"
        return fields[0], time.monotonic() - started


def test_guesses_at_admin_are_held_back_though_ones_own_account_logs_in_between(target_with_users):
    address = target_with_users.amqp[2]
    login_s: Callable[[str, str, str], tuple[int, float]] = \
        plain_s if target_with_users.plain_on_loopback else scram_s
    answers_s = []
    for attempt in range(5):
        assert login_s(address, "mallory", PASSWORD)[0] == OUTCOME_OK
        outcome, took_s = login_s(address, "admin", f"guess {attempt}")
        assert outcome == OUTCOME_AUTH
        answers_s.append(took_s)
    assert answers_s[3] >= THROTTLE_DELAY_MIN_S and answers_s[4] >= 2 * THROTTLE_DELAY_MIN_S, answers_s
