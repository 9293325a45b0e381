"""Forwarding between nodes under cluster TLS: the files a node checks at start and reloads, who the
peer listener lets forward, and forwarding end to end over mutual TLS on 127.0.0.1 in this process.

Certificates come from `node.certs` (what `grouper certs` writes). Waits are bounded waits on
conditions; nothing here asserts how fast anything happens.
"""

from __future__ import annotations

import datetime
import os
import threading
from dataclasses import replace
from pathlib import Path

import grpc
import pytest
from cryptography import x509

from node import certs
from node.config import NodeConfig, files_stamp
from node.core.errors import InvalidConfig
from node.peer import cluster_secrets
from node.peer.cluster_secrets import (RAFT_SECRET_CHARS_MIN, RAFT_SECRETS_MAX, ClusterTls, describe,
                                       insecure_cluster_refusal, parse_raft_secrets, read_raft_secrets)
from node.peer.forwarder import Forwarder
from node.peer.members import ADMITTED, ELSEWHERE, caller_refusal, refuse_all
from node.peer.node_certificate import certificate_hosts, read_tls_material
from node.peer.service import PeerServicer, RefusalLog, bind_peer_listener, source_host
from proto import peer_pb2, peer_pb2_grpc

WAIT_S = 10.0  # longest any single wait in this file may take before the test fails
NOW = datetime.datetime.now(datetime.timezone.utc)
SECRET = "s" * RAFT_SECRET_CHARS_MIN


@pytest.fixture(scope="module")
def cluster_ca(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("cluster-ca")
    certs.make_ca(directory)
    for name in ("node0", "node1"):
        certs.make_leaf(directory, name, dns=["localhost"], ips=["127.0.0.1"])
    certs.make_leaf(directory, "alice", client_only=True)
    return directory


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("other-ca")
    certs.make_ca(directory)
    certs.make_leaf(directory, "node0", dns=["localhost"], ips=["127.0.0.1"])
    return directory


def files(directory: Path, name: str, ca: Path | None = None) -> tuple[str, str, str]:
    return str(directory / f"{name}.pem"), str(directory / f"{name}-key.pem"), str((ca or directory) / "ca.pem")


# ---- the files ------------------------------------------------------------------------------------

def test_a_node_certificate_signed_by_the_cluster_ca_is_taken_with_its_common_name(cluster_ca):
    material = read_tls_material(*files(cluster_ca, "node0"), now=NOW)
    assert material.common_name == "node0" and material.not_after > NOW
    assert b"BEGIN CERTIFICATE" in material.certificate_chain and b"PRIVATE KEY" in material.private_key


def test_a_key_that_is_not_the_certificates_is_refused_naming_the_key_file(cluster_ca):
    cert, _, ca = files(cluster_ca, "node0")
    with pytest.raises(InvalidConfig, match=r"cluster_tls_key_file: .*node1-key.pem is not the key of .*node0.pem"):
        read_tls_material(cert, str(cluster_ca / "node1-key.pem"), ca, now=NOW)


def test_a_certificate_another_ca_signed_is_refused_at_start_not_at_every_handshake(cluster_ca, other_ca):
    with pytest.raises(InvalidConfig, match=r"cluster_tls_cert_file: .* is not signed by a CA in .*the other nodes "
                                            r"would refuse it"):
        read_tls_material(*files(other_ca, "node0", ca=cluster_ca), now=NOW)


def test_a_client_certificate_cannot_serve_as_a_node_certificate(cluster_ca):
    with pytest.raises(InvalidConfig, match=r"alice.pem lacks extended key usage serverAuth.*grouper certs node"):
        read_tls_material(*files(cluster_ca, "alice"), now=NOW)


def test_an_expired_node_certificate_is_refused_with_its_date(cluster_ca, tmp_path):
    for name in ("ca.pem", "ca-key.pem"):
        (tmp_path / name).write_bytes((cluster_ca / name).read_bytes())
    start = NOW - datetime.timedelta(days=10)
    certs.make_leaf(tmp_path, "old", not_before=start, not_after=start + datetime.timedelta(days=1))
    with pytest.raises(InvalidConfig, match=r"old.pem expired on "):
        read_tls_material(*files(tmp_path, "old"), now=NOW)


@pytest.mark.parametrize("which, key", [(0, "cluster_tls_cert_file"), (1, "cluster_tls_key_file"),
                                        (2, "cluster_tls_ca_file")])
def test_a_missing_or_garbled_file_is_named_with_its_setting(cluster_ca, tmp_path, which, key):
    paths = list(files(cluster_ca, "node0"))
    paths[which] = str(tmp_path / "absent.pem")
    with pytest.raises(InvalidConfig, match=rf"{key}: cannot read .*absent.pem"):
        read_tls_material(*paths, now=NOW)
    (tmp_path / "garbled.pem").write_text("not pem\n")
    paths[which] = str(tmp_path / "garbled.pem")
    with pytest.raises(InvalidConfig, match=rf"{key}: .*garbled.pem holds no"):
        read_tls_material(*paths, now=NOW)


class Clock:
    def __init__(self):
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def copy_files(source: Path, name: str, target: Path) -> tuple[str, str, str]:
    for suffix in (".pem", "-key.pem"):
        (target / f"current{suffix}").write_bytes((source / f"{name}{suffix}").read_bytes())
    (target / "ca.pem").write_bytes((source / "ca.pem").read_bytes())
    return str(target / "current.pem"), str(target / "current-key.pem"), str(target / "ca.pem")


def touch_later(path: str) -> None:
    status = os.stat(path)
    os.utime(path, ns=(status.st_atime_ns, status.st_mtime_ns + 1_000_000_000))


def test_changed_files_are_taken_at_the_next_look_after_the_check_interval(cluster_ca, tmp_path):
    clock = Clock()
    paths = copy_files(cluster_ca, "node0", tmp_path)
    tls = ClusterTls(*paths, clock=clock)
    assert tls.generation == 1 and tls.material.common_name == "node0"
    copy_files(cluster_ca, "node1", tmp_path)
    touch_later(paths[0])
    assert tls.current_generation() == 1  # within the interval: not looked at
    clock.now_s += cluster_secrets.RELOAD_CHECK_INTERVAL_S
    assert tls.current_generation() == 2 and tls.material.common_name == "node1"
    clock.now_s += cluster_secrets.RELOAD_CHECK_INTERVAL_S
    assert not tls.refresh()  # unchanged since


def test_a_half_written_change_keeps_the_files_in_force_and_is_logged_once(cluster_ca, tmp_path, caplog):
    clock = Clock()
    paths = copy_files(cluster_ca, "node0", tmp_path)
    tls = ClusterTls(*paths, clock=clock)
    Path(paths[0]).write_bytes((cluster_ca / "node1.pem").read_bytes())  # the certificate before its key
    touch_later(paths[0])
    for _ in range(3):
        clock.now_s += cluster_secrets.RELOAD_CHECK_INTERVAL_S
        assert not tls.refresh()
    assert tls.generation == 1 and tls.material.common_name == "node0"
    assert [r.levelname for r in caplog.records if "do not check out" in r.message] == ["ERROR"]
    Path(paths[1]).write_bytes((cluster_ca / "node1-key.pem").read_bytes())
    touch_later(paths[1])
    clock.now_s += cluster_secrets.RELOAD_CHECK_INTERVAL_S
    assert tls.refresh() and tls.material.common_name == "node1"


# ---- the raft secret -----------------------------------------------------------------------------

def test_the_raft_secret_file_holds_one_secret_a_line_the_current_one_first():
    assert parse_raft_secrets(f"  {SECRET}\n\n{SECRET}x  \n", "f") == (SECRET, SECRET + "x")


@pytest.mark.parametrize("text, problem", [
    ("", "holds no secret"),
    ("\n  \n", "holds no secret"),
    ("short\n", f"secret 1 has 5 characters; use at least {RAFT_SECRET_CHARS_MIN}"),
    (f"{SECRET}\nshort", "secret 2 has 5 characters"),
    ("\n".join([SECRET] * (RAFT_SECRETS_MAX + 1)), f"at most {RAFT_SECRETS_MAX}"),
])
def test_a_raft_secret_file_that_cannot_be_used_is_refused_saying_why(text, problem):
    with pytest.raises(InvalidConfig, match="raft_secret_file: f") as raised:
        parse_raft_secrets(text, "f")
    assert problem in str(raised.value)


def test_reading_the_raft_secret_file_names_it_when_it_is_absent_or_too_large(tmp_path):
    with pytest.raises(InvalidConfig, match=r"raft_secret_file: cannot read .*absent"):
        read_raft_secrets(str(tmp_path / "absent"))
    (tmp_path / "big").write_text("x" * (cluster_secrets.RAFT_SECRET_FILE_BYTES_MAX + 1))
    with pytest.raises(InvalidConfig, match="is 4097 bytes"):
        read_raft_secrets(str(tmp_path / "big"))
    (tmp_path / "ok").write_text(SECRET + "\n")
    assert read_raft_secrets(str(tmp_path / "ok")) == (SECRET,)


# ---- secure by default ---------------------------------------------------------------------------

CLUSTER = NodeConfig(host="10.0.0.7", raft_port=5674, peers="10.0.0.7:5674,10.0.0.8:5674")
SECURED = replace(CLUSTER, cluster_tls_cert_file="n.pem", cluster_tls_key_file="n-key.pem",
                  cluster_tls_ca_file="ca.pem", raft_secret_file="raft.secret")


LOOPBACK = replace(CLUSTER, host="127.0.0.1", peers="127.0.0.1:5674,127.0.0.1:5684")  # as grouper up runs them


@pytest.mark.parametrize("config, users, refused", [
    (CLUSTER, True, True),  # users, a cluster, a routable host, nothing between nodes
    (replace(SECURED, raft_secret_file=""), True, True),
    (replace(SECURED, cluster_tls_cert_file="", cluster_tls_key_file="", cluster_tls_ca_file=""), True, True),
    (SECURED, True, False),
    (replace(CLUSTER, allow_insecure_cluster=True), True, False),  # the operator says so
    (replace(CLUSTER, peers=""), True, False),  # a single node has no one to talk to
    (replace(CLUSTER, peers="", host="0.0.0.0", allow_anonymous=True), False, False),
])
def test_a_node_with_users_on_a_routable_host_clusters_only_with_cluster_tls_and_a_raft_secret(config, users, refused):
    assert bool(insecure_cluster_refusal(config, users_database=users)) == refused


@pytest.mark.parametrize("config, users", [
    (CLUSTER, False),  # no users: open to clients, but its raft port must not run a stranger's pickle
    (replace(CLUSTER, host="0.0.0.0", allow_anonymous=True), False),
    (LOOPBACK, False),  # `grouper up` before it made a secret: any local user reaches 127.0.0.1
    (LOOPBACK, True),  # `grouper up --users-file`
    (replace(LOOPBACK, host="localhost", peers="localhost:5674,localhost:5684"), True),
])
def test_every_cluster_node_without_a_raft_secret_is_refused_whatever_its_host_and_users(config, users):
    refusal = insecure_cluster_refusal(config, users_database=users)
    assert refusal is not None and "no raft secret" in refusal


@pytest.mark.parametrize("config, users", [
    (replace(LOOPBACK, raft_secret_file="raft.secret"), True),  # loopback: only this machine reaches forwarding
    (replace(LOOPBACK, raft_secret_file="raft.secret"), False),
    (replace(CLUSTER, raft_secret_file="raft.secret"), False),  # no users: forwarding is as open as AMQP
    (replace(CLUSTER, allow_insecure_cluster=True), False),
    (replace(LOOPBACK, allow_insecure_cluster=True), True),
])
def test_a_cluster_node_with_a_raft_secret_or_the_insecure_flag_starts(config, users):
    assert insecure_cluster_refusal(config, users_database=users) is None


def test_the_refusal_names_what_is_missing_and_both_ways_out():
    refusal = insecure_cluster_refusal(replace(SECURED, raft_secret_file=""), users_database=True)
    assert "has no raft secret (raft_secret_file):" in refusal and "cluster_tls_cert_file" not in refusal
    assert "--allow-insecure-cluster" in refusal
    refusal = insecure_cluster_refusal(replace(SECURED, cluster_tls_cert_file=""), users_database=True)
    assert "it has no cluster TLS (cluster_tls_cert_file" in refusal and "raft_secret_file" not in refusal
    assert "grouper certs dev" in refusal and "--allow-insecure-cluster" in refusal
    assert "(umask 077; openssl rand -base64 32 > raft.secret)" in refusal


def test_the_refusal_of_a_node_without_a_raft_secret_says_how_to_make_one_and_names_the_flag():
    refusal = insecure_cluster_refusal(LOOPBACK, users_database=False)
    assert "127.0.0.1:5674" in refusal and "run code in this node" in refusal
    assert "(umask 077; openssl rand -base64 32 > raft.secret)" in refusal and "--raft-secret-file" in refusal
    assert "--allow-insecure-cluster" in refusal


@pytest.mark.parametrize("values, key", [
    ({"cluster_tls_cert_file": "n.pem"}, "cluster_tls_key_file"),
    ({"cluster_tls_cert_file": "n.pem", "cluster_tls_key_file": "k.pem"}, "cluster_tls_ca_file"),
    ({"cluster_tls_ca_file": "ca.pem"}, "cluster_tls_cert_file"),
    ({"cluster_tls_server_name": "grouper"}, "cluster_tls_server_name"),
    ({"peer_port": 70000}, "peer_port"),
])
def test_half_a_cluster_tls_configuration_is_refused_naming_the_missing_setting(values, key):
    with pytest.raises(InvalidConfig, match=f"^{key}: "):
        NodeConfig(**values).validate()


def test_the_banner_says_what_protects_forwarding_and_raft(cluster_ca):
    assert describe(None, ()).startswith("open (--allow-insecure-cluster): ")
    tls = ClusterTls(*files(cluster_ca, "node0"))
    assert describe(tls, (SECRET, SECRET)) == "forwarding over mutual TLS as node0; raft encrypted (2 secrets accepted)"
    assert describe(None, (SECRET,)).endswith("raft encrypted (1 secret accepted)")
    assert describe(tls, ()).endswith("(--allow-insecure-cluster) raft traffic is unauthenticated: any process "
                                      "reaching the raft port can run code in this node")


# ---- who may forward -----------------------------------------------------------------------------

def usages_of(pem: bytes) -> set[str]:
    return {"node": {"serverAuth", "clientAuth"}, "client": {"clientAuth"}}[pem.decode()]


@pytest.mark.parametrize("auth, code", [
    ({"transport_security_type": [b"insecure"]}, grpc.StatusCode.UNAUTHENTICATED),
    ({}, grpc.StatusCode.UNAUTHENTICATED),
    ({"transport_security_type": [b"ssl"]}, grpc.StatusCode.UNAUTHENTICATED),
    ({"transport_security_type": [b"ssl"], "x509_pem_cert": [b"client"], "x509_common_name": [b"alice"]},
     grpc.StatusCode.PERMISSION_DENIED),
    ({"transport_security_type": [b"ssl"], "x509_pem_cert": [b"node"], "x509_common_name": [b"node1"]}, None),
])
def test_only_a_caller_over_tls_with_a_node_certificate_may_forward(auth, code):
    verdict = caller_refusal(auth, usages_of)
    assert verdict[0] == code and (verdict == ADMITTED) == (code is None)


def test_a_client_certificate_is_refused_by_its_common_name():
    _, reason = caller_refusal({"transport_security_type": [b"ssl"], "x509_pem_cert": [b"client"],
                                "x509_common_name": [b"alice"]}, usages_of)
    assert reason.startswith("the caller's certificate (CN alice) lacks serverAuth")


NODE_AUTH = {"transport_security_type": [b"ssl"], "x509_pem_cert": [b"node"], "x509_common_name": [b"node1"]}


def hosts_of(pem: bytes) -> frozenset[str]:
    return {"node": frozenset({"node1", "localhost", "127.0.0.1", "::1"})}[pem.decode()]


@pytest.mark.parametrize("source_node", ["node1:5674", "NODE1:5674", "127.0.0.1:40000", "[::1]:5674",
                                         "[0:0:0:0:0:0:0:1]:5674", "node1"])
def test_a_node_may_forward_as_a_node_id_whose_host_its_certificate_names(source_node):
    assert caller_refusal(NODE_AUTH, usages_of, source_node, hosts_of) == ADMITTED


@pytest.mark.parametrize("source_node", ["node2:5674", "10.0.0.1:5674", "node1.evil:5674", ":5674", ""])
def test_a_node_cannot_forward_as_another_node(source_node):
    code, reason = caller_refusal(NODE_AUTH, usages_of, source_node, hosts_of)
    assert code is grpc.StatusCode.PERMISSION_DENIED
    assert f"claims to come from node {source_node!r}" in reason and "forwards only as itself" in reason
    assert "(CN node1) names 127.0.0.1, ::1, localhost, node1" in reason


def test_without_binding_the_claim_is_not_looked_at():  # cluster_tls_server_name: certificates name no node
    assert caller_refusal(NODE_AUTH, usages_of, "node2:5674") == ADMITTED


def test_the_hosts_a_certificate_names_are_its_alternative_names_or_else_its_common_name(cluster_ca):
    certs.make_leaf(cluster_ca, "Node7", dns=["Node7.Example", "localhost"], ips=["127.0.0.1", "::1"])
    node7 = x509.load_pem_x509_certificate((cluster_ca / "Node7.pem").read_bytes())
    assert certificate_hosts(node7) == {"node7", "node7.example", "localhost", "127.0.0.1", "::1"}
    certs.make_leaf(cluster_ca, "Carol", client_only=True)  # no subjectAltName
    carol = x509.load_pem_x509_certificate((cluster_ca / "Carol.pem").read_bytes())
    assert certificate_hosts(carol) == {"carol"}


def test_each_source_and_reason_is_logged_once_and_the_memory_is_bounded():
    refusals = RefusalLog(remembered_max=2)
    assert refusals.first("10.0.0.1", "a") and not refusals.first("10.0.0.1", "a")
    assert refusals.first("10.0.0.1", "b") and refusals.first("10.0.0.2", "a")
    assert refusals.first("10.0.0.1", "a")  # the oldest pair was forgotten to make room
    assert not refusals.first("10.0.0.2", "a")


@pytest.mark.parametrize("peer, host", [("ipv4:10.0.0.7:51234", "10.0.0.7"), ("ipv6:[::1]:51234", "::1"),
                                        ("ipv6:[fe80::1%eth0]:1", "fe80::1%eth0"), ("unix:/tmp/s", "unix:/tmp/s"),
                                        ("", "unknown")])
def test_the_source_of_a_call_is_its_address_without_the_port(peer, host):
    assert source_host(peer) == host


class Aborted(Exception):
    pass


class RefusedContext:
    def __init__(self, peer: str):
        self._peer = peer
        self.aborted: tuple | None = None

    def peer(self):
        return self._peer

    def abort(self, code, details):
        self.aborted = (code, details)
        raise Aborted


def test_a_refused_call_never_reaches_the_owner_and_is_logged_once_per_source(caplog):
    handled = []
    servicer = PeerServicer(lambda *args: handled.append(args) or 1, check=refuse_all(ELSEWHERE))
    batch = peer_pb2.ForwardBatch(source_node="x", messages=[peer_pb2.Forwarded(forward_seq=1, queue="q")])
    for peer in ("ipv4:10.0.0.9:1000", "ipv4:10.0.0.9:1001", "ipv4:10.0.0.10:1000"):
        context = RefusedContext(peer)
        with pytest.raises(Aborted):
            servicer.Forward(batch, context)
        assert context.aborted == (grpc.StatusCode.UNAUTHENTICATED, ELSEWHERE)
    assert handled == []
    logged = [r.getMessage() for r in caplog.records if "forwarding from" in r.getMessage()]
    assert len(logged) == 2 and "10.0.0.9 refused" in logged[0] and "10.0.0.10 refused" in logged[1]


# ---- end to end over mutual TLS ------------------------------------------------------------------

class Owner:
    def __init__(self):
        self.changed = threading.Condition()
        self.high_water = 0

    def handle(self, source, entries, timeout_ms, seq_bound=0, disputed_high_water=0) -> int:
        with self.changed:
            self.high_water = max(self.high_water, entries[-1].forward_seq)
            self.changed.notify_all()
            return self.high_water


class Acks:
    def __init__(self):
        self.changed = threading.Condition()
        self.high_water = 0
        self.states: list[tuple[bool, str]] = []

    def on_acked(self, high_water):
        with self.changed:
            self.high_water = high_water
            self.changed.notify_all()

    def on_state(self, connected, reason):
        with self.changed:
            self.states.append((connected, reason))
            self.changed.notify_all()

    def wait(self, predicate, what):
        with self.changed:
            assert self.changed.wait_for(predicate, WAIT_S), f"not within {WAIT_S} s: {what}; states {self.states}"


@pytest.fixture
def listener(cluster_ca):
    owner = Owner()
    server, port = bind_peer_listener("127.0.0.1", 0, owner.handle, ClusterTls(*files(cluster_ca, "node1")))
    server.start()
    yield owner, f"127.0.0.1:{port}"
    server.stop(None).wait(WAIT_S)


def entries(first, last):
    from node.peer.forwarder import Entry
    return [Entry(seq, "q", "g", b"m", 0, False, 0) for seq in range(first, last + 1)]


def test_a_member_forwards_over_mutual_tls(listener, cluster_ca):
    owner, address = listener
    acks = Acks()
    forwarder = Forwarder("node0", "node1", lambda: address, acks.on_acked, on_state=acks.on_state,
                          tls=ClusterTls(*files(cluster_ca, "node0")))
    try:
        forwarder.submit(entries(1, 5))
        acks.wait(lambda: acks.high_water == 5, "the batch acked")
    finally:
        forwarder.close()
    assert owner.high_water == 5


@pytest.mark.parametrize("credentials_of", ["no certificate", "another CA", "plaintext"])
def test_a_stranger_cannot_forward_to_the_peer_listener(listener, cluster_ca, other_ca, credentials_of):
    owner, address = listener
    ca = (cluster_ca / "ca.pem").read_bytes()
    if credentials_of == "plaintext":
        channel = grpc.insecure_channel(address)
    elif credentials_of == "no certificate":
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(ca))
    else:
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(
            ca, (other_ca / "node0-key.pem").read_bytes(), (other_ca / "node0.pem").read_bytes()))
    with channel:
        with pytest.raises(grpc.RpcError) as raised:
            peer_pb2_grpc.PeerServiceStub(channel).Forward(
                peer_pb2.ForwardBatch(source_node="x", messages=[peer_pb2.Forwarded(forward_seq=1, queue="q")]),
                timeout=WAIT_S)
    assert raised.value.code() is grpc.StatusCode.UNAVAILABLE  # the handshake itself refused it
    assert owner.high_water == 0


def test_a_client_certificate_from_the_cluster_ca_is_refused_and_logged_once(listener, cluster_ca, caplog):
    owner, address = listener
    credentials_ = grpc.ssl_channel_credentials((cluster_ca / "ca.pem").read_bytes(),
                                                (cluster_ca / "alice-key.pem").read_bytes(),
                                                (cluster_ca / "alice.pem").read_bytes())
    for _ in range(2):
        with grpc.secure_channel(address, credentials_) as channel:
            with pytest.raises(grpc.RpcError) as raised:
                peer_pb2_grpc.PeerServiceStub(channel).Forward(
                    peer_pb2.ForwardBatch(source_node="x", messages=[peer_pb2.Forwarded(forward_seq=1, queue="q")]),
                    timeout=WAIT_S)
        assert raised.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "CN alice" in raised.value.details()
    assert owner.high_water == 0
    assert len([r for r in caplog.records if "forwarding from 127.0.0.1 refused" in r.getMessage()]) == 1


def test_a_forwarder_whose_certificate_another_ca_signed_stops_and_resumes_once_given_the_clusters(
        listener, cluster_ca, other_ca, tmp_path):
    owner, address = listener
    acks = Acks()
    paths = copy_files(other_ca, "node0", tmp_path)
    (tmp_path / "ca.pem").write_bytes((cluster_ca / "ca.pem").read_bytes())  # trusts the listener
    clock = Clock()
    forwarder = Forwarder("node0", "node1", lambda: address, acks.on_acked, on_state=acks.on_state,
                          retry_min_ms=10, retry_max_ms=50, tls=_unchecked(paths, clock))
    try:
        forwarder.submit(entries(1, 3))
        acks.wait(lambda: acks.states and acks.states[-1][0] is False, "forwarding stopped")
        copy_files(cluster_ca, "node0", tmp_path)  # rotated to a certificate the cluster CA signed
        touch_later(paths[0])
        clock.now_s += cluster_secrets.RELOAD_CHECK_INTERVAL_S
        acks.wait(lambda: acks.high_water == 3, "forwarding resumed with the new certificate")
    finally:
        forwarder.close()
    assert owner.high_water == 3


def _unchecked(paths, clock) -> ClusterTls:
    """A ClusterTls over files the start-up check would refuse (a certificate another CA signed)."""
    tls = ClusterTls.__new__(ClusterTls)
    tls.paths, tls.server_name, tls._clock = paths, "", clock
    tls._lock, tls._bad_stamps, tls._checked_s, tls.generation = threading.Lock(), None, clock(), 1
    tls._stamps = files_stamp(paths)
    cert, key, ca = (Path(path).read_bytes() for path in paths)
    tls.material = cluster_secrets.TlsMaterial(cert, key, ca, "node0", NOW)
    return tls


def test_the_target_name_override_checks_every_peer_for_one_shared_name(tmp_path, caplog):
    certs.make_ca(tmp_path)
    certs.make_leaf(tmp_path, "grouper-cluster")  # no 127.0.0.1 among its names
    owner = Owner()
    # the owner has the cluster's name override too (every node has): its certificates name no node, so the
    # batches' source node is not bound to them
    server, port = bind_peer_listener("127.0.0.1", 0, owner.handle,
                                      ClusterTls(*files(tmp_path, "grouper-cluster"), server_name="grouper-cluster"))
    server.start()
    try:
        for server_name, expected in (("", 0), ("grouper-cluster", 2)):
            acks = Acks()
            tls = ClusterTls(*files(tmp_path, "grouper-cluster"), server_name=server_name)
            forwarder = Forwarder("node0", "node1", lambda: f"127.0.0.1:{port}", acks.on_acked,
                                  on_state=acks.on_state, retry_min_ms=10, retry_max_ms=50, tls=tls)
            try:
                forwarder.submit(entries(1, 2) if expected else entries(1, 1))
                if expected:
                    acks.wait(lambda: acks.high_water == expected, "forwarded with the name override")
                else:  # the certificate does not name 127.0.0.1: the dialer refuses the listener
                    acks.wait(lambda: acks.states and acks.states[-1][0] is False, "forwarding refused")
            finally:
                forwarder.close()
    finally:
        server.stop(None).wait(WAIT_S)
    assert owner.high_water == 2


def test_a_listener_on_a_port_in_use_fails_naming_the_setting(cluster_ca, listener):
    _, address = listener
    with pytest.raises(Exception, match="--peer-port"):
        bind_peer_listener("127.0.0.1", int(address.rsplit(":", 1)[1]), lambda *a: 0,
                           ClusterTls(*files(cluster_ca, "node0")))
