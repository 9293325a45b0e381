"""Security between nodes, against real node processes on 127.0.0.1: cluster TLS for forwarding, a
raft secret for the raft cluster, and the rule that a node with users on a routable host needs both.

A secured 3-node cluster (each node its own certificate from one development CA, one raft secret)
forwards grouped messages to their owner in order; strangers calling its peer service (no
certificate, another CA's, a client certificate of the cluster's CA, plaintext at the admin port)
are refused and forward nothing; a member started with another raft secret, and a raw socket
speaking pysyncobj's protocol without it, are refused and never join. Each refusal is logged once
per source and reason. Every wait is bounded.
"""

from __future__ import annotations

import os
import shutil
import socket
import struct
import subprocess
import sys
import time
import zlib
import pickle
from pathlib import Path

import grpc
import pytest
from proton import Delivery

from node import certs
from tests.integration.cli import write_users_file
from tests.integration.cluster import Cluster, free_ports
from tests.integration.harness import REPO, ManualReceiver, NodeProcess, connect, grouped, send_outcome
from proto import peer_pb2, peer_pb2_grpc

QUEUE = "orders"
SECRET = "integration-raft-secret-0123456789"
OTHER_SECRET = "another-raft-secret-0123456789"
WAIT_S = 20.0  # bound of every wait for a log line or a refusal
POLL_S = 0.1
UNDECRYPTABLE = "does not decrypt with this node's raft secret"


def make_certs(directory: Path, nodes: int) -> Path:
    certs.make_ca(directory)
    for index in range(nodes):
        certs.make_leaf(directory, f"node{index}", dns=["localhost"], ips=["127.0.0.1"])
    certs.make_leaf(directory, "alice", client_only=True)  # an AMQP user's certificate from the same CA
    return directory


def secure(node: NodeProcess, index: int, cert_dir: Path, secret_file: Path) -> None:
    node.args += ("--cluster-tls-cert-file", str(cert_dir / f"node{index}.pem"),
                  "--cluster-tls-key-file", str(cert_dir / f"node{index}-key.pem"),
                  "--cluster-tls-ca-file", str(cert_dir / "ca.pem"),
                  "--peer-port", "0", "--raft-secret-file", str(secret_file))


def banner_value(node: NodeProcess, key: str) -> str:
    return next(line.split(": ", 1)[1] for line in node.output if line.startswith(f"{key}: "))


def lines_with(node: NodeProcess, needle: str) -> list[str]:
    return [line for line in list(node.output) if needle in line]


def wait_lines(node: NodeProcess, needle: str, count: int = 1) -> list[str]:
    deadline_s = time.monotonic() + WAIT_S
    while len(found := lines_with(node, needle)) < count:
        if time.monotonic() > deadline_s:
            raise AssertionError(f"fewer than {count} lines with {needle!r} within {WAIT_S} s; its output:\n"
                                 + "\n".join(node.output[-40:]))
        time.sleep(POLL_S)
    return found


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    directory = tmp_path_factory.mktemp("secured")
    cert_dir = make_certs(directory / "certs", 3)
    other_dir = directory / "other-ca"
    certs.make_ca(other_dir)
    certs.make_leaf(other_dir, "node0", ips=["127.0.0.1"])
    secret_file = directory / "raft.secret"
    secret_file.write_text(SECRET + "\n")
    cluster = Cluster(directory, 3)
    for index, node in enumerate(cluster.nodes):
        secure(node, index, cert_dir, secret_file)
    try:
        yield cluster.start(), cert_dir, other_dir
    finally:
        cluster.kill_all()


def test_a_secured_cluster_forwards_each_group_to_its_owner_in_order(secured, connections):
    cluster, _, _ = secured
    for index, node in enumerate(cluster.nodes):
        assert banner_value(node, "cluster security") == \
            f"forwarding over mutual TLS as node{index}; raft encrypted (1 secret accepted)"
        assert banner_value(node, "peer").startswith("127.0.0.1:")
    connections.append(connect(cluster.nodes[1]))
    consumer = ManualReceiver(connections[-1], QUEUE, "c1", credit=100)
    cluster.wait_consumers(QUEUE, {1: 1})
    groups = [f"g{n}" for n in range(6)]
    for index in (0, 2):  # both forward to node 1, over mutual TLS
        connections.append(connect(cluster.nodes[index]))
        sender = connections[-1].create_sender(QUEUE, name=f"p{index}")
        for seq in range(3):
            for group in groups:
                state, condition = send_outcome(sender, grouped(f"{group}:{index}:{seq}", group))
                assert state == Delivery.ACCEPTED, condition
    received = consumer.fetch_many(36)
    for held in received:
        held.accept()
    by_group: dict[str, list[str]] = {}
    for held in received:
        group, index, seq = held.body.split(":")
        by_group.setdefault(f"{group}:{index}", []).append(seq)
    assert by_group == {f"{group}:{index}": ["0", "1", "2"] for group in groups for index in ("0", "2")}
    status = cluster.status()
    assert all(member["connected"] for member in status["members"]) and not status["outbound"]


def forward(channel: grpc.Channel, queue: str, source_node: str = "stranger:1") -> grpc.RpcError:
    batch = peer_pb2.ForwardBatch(source_node=source_node, messages=[
        peer_pb2.Forwarded(forward_seq=1, queue=queue, has_group=True, group_id="g", payload=b"stolen")])
    with channel:
        with pytest.raises(grpc.RpcError) as raised:
            peer_pb2_grpc.PeerServiceStub(channel).Forward(batch, timeout=WAIT_S)
    return raised.value


def test_strangers_calling_the_peer_service_are_refused_and_forward_nothing(secured):
    cluster, cert_dir, other_dir = secured
    owner = cluster.nodes[1]
    peer_address, admin_address = banner_value(owner, "peer"), owner.admin_address
    ca = (cert_dir / "ca.pem").read_bytes()
    # at the peer port the TLS handshake itself refuses a caller without a node certificate the CA signed
    for credentials in (grpc.ssl_channel_credentials(ca),
                        grpc.ssl_channel_credentials(ca, (other_dir / "node0-key.pem").read_bytes(),
                                                     (other_dir / "node0.pem").read_bytes())):
        assert forward(grpc.secure_channel(peer_address, credentials), "stolen-1").code() is \
            grpc.StatusCode.UNAVAILABLE
    assert forward(grpc.insecure_channel(peer_address), "stolen-2").code() is grpc.StatusCode.UNAVAILABLE
    # a client certificate of the cluster's CA passes the handshake but is no node's
    alice = grpc.ssl_channel_credentials(ca, (cert_dir / "alice-key.pem").read_bytes(),
                                         (cert_dir / "alice.pem").read_bytes())
    for _ in range(2):
        error = forward(grpc.secure_channel(peer_address, alice), "stolen-3")
        assert error.code() is grpc.StatusCode.PERMISSION_DENIED and "CN alice" in error.details()
    # a node certificate of the cluster's CA forwards only as the node whose host it names: node9's (which names
    # node9) not as a member at 127.0.0.1, node0's (which names 127.0.0.1) not as a node elsewhere
    certs.make_leaf(cert_dir, "node9", dns=["node9"], force=True)
    for name, claimed in (("node9", cluster.node_ids[0]), ("node0", "node9:5674")):
        node_certificate = grpc.ssl_channel_credentials(ca, (cert_dir / f"{name}-key.pem").read_bytes(),
                                                        (cert_dir / f"{name}.pem").read_bytes())
        error = forward(grpc.secure_channel(peer_address, node_certificate, options=[
            ("grpc.ssl_target_name_override", "localhost")]), "stolen-5", claimed)
        assert error.code() is grpc.StatusCode.PERMISSION_DENIED and "forwards only as itself" in error.details() \
            and f"(CN {name})" in error.details(), error.details()
    # where forwarding used to be, the admin port, it is refused too, saying where it went
    for _ in range(2):
        error = forward(grpc.insecure_channel(admin_address), "stolen-4")
        assert error.code() is grpc.StatusCode.UNAUTHENTICATED and "peer port" in error.details()
    refused = wait_lines(owner, "forwarding from 127.0.0.1 refused", count=4)
    assert len(refused) == 4  # once per source and reason, though some were tried twice
    assert any("CN alice" in line for line in refused) and any("peer port" in line for line in refused)
    assert sum("forwards only as itself" in line for line in refused) == 2
    listed = owner.cli("queue", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert "stolen" not in listed.stdout


def pysyncobj_frame(message) -> bytes:
    data = zlib.compress(pickle.dumps(message), 3)
    return struct.pack("i", len(data)) + data


def test_a_member_with_another_raft_secret_is_refused_once_and_never_joins(tmp_path, connections):
    cert_dir = make_certs(tmp_path / "certs", 3)
    cluster = Cluster(tmp_path, 3)
    stranger_id = max(cluster.node_ids)  # the greater address dials: it dials both others, who refuse it
    stranger = cluster.index_of(stranger_id)
    good = [i for i in range(3) if i != stranger]
    for index, node in enumerate(cluster.nodes):
        secret_file = tmp_path / f"raft{index}.secret"
        secret_file.write_text((OTHER_SECRET if index == stranger else SECRET) + "\n")
        secure(node, index, cert_dir, secret_file)
    try:
        for node in cluster.nodes:
            node.start()
        for index in good:
            wait_lines(cluster.nodes[index], UNDECRYPTABLE)
        wait_lines(cluster.nodes[stranger], "in a row before the key exchange completed", count=2)
        # a raw socket speaking pysyncobj's protocol in plaintext: closed, and not logged again
        for index in good:
            raft_port = int(cluster.node_ids[index].rsplit(":", 1)[1])
            for _ in range(3):
                with socket.create_connection(("127.0.0.1", raft_port), timeout=WAIT_S) as sock:
                    sock.sendall(pysyncobj_frame(cluster.node_ids[stranger]))
                    assert sock.recv(4096) == b""
        status = cluster.wait_for(lambda s: s["leader"] in {cluster.node_ids[i] for i in good},
                                  "a leader among the members sharing the secret", via=good[0])
        assert {m["node"]: m["connected"] for m in status["members"]}[stranger_id] is False
        alone = cluster.status(via=stranger)
        assert alone is not None and alone["leader"] == "" and not alone["has_quorum"]
        for index in good:
            assert len(lines_with(cluster.nodes[index], UNDECRYPTABLE)) == 1
        assert len(lines_with(cluster.nodes[stranger], "in a row before the key exchange completed")) == 2
        # the two members that share the secret decide routes
        connections.append(connect(cluster.nodes[good[0]]))
        sender = connections[-1].create_sender(QUEUE, name="p")
        assert send_outcome(sender, grouped("g:0", "g"))[0] == Delivery.ACCEPTED
    finally:
        cluster.kill_all()


def test_a_node_with_users_on_a_routable_host_refuses_to_cluster_without_tls_and_a_raft_secret(tmp_path):
    data_dir = tmp_path / "node0"
    added = subprocess.run([sys.executable, "-m", "node.cli", "user", "add", "admin", "--role", "administrator",
                            "--password-stdin", "--data-dir", str(data_dir)], cwd=REPO, input="secret-password\n",
                           capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    node = NodeProcess(data_dir, "", ("--host", "0.0.0.0", "--advertise-host", "10.9.9.9", "--raft-port", "5674",
                                      "--peers", "10.9.9.9:5674,10.9.9.10:5674"))
    node.session_raft_secret = False
    with pytest.raises(RuntimeError, match="exited with 1") as raised:
        node.start()
    output = str(raised.value)
    assert "cannot start: this node has users and serves a cluster on 0.0.0.0" in output
    assert "cluster TLS" in output and "raft secret" in output and "--allow-insecure-cluster" in output


def test_a_node_joins_a_cluster_with_users_and_admin_tls_with_the_cli_credentials(tmp_path, monkeypatch):
    """--join and the lost-identity check ask a secured cluster as the CLI would: admin TLS and
    $GROUPER_USER/$GROUPER_PASSWORD. Without the credentials the join is refused, naming them."""
    cert_dir = make_certs(tmp_path / "certs", 3)
    certs.make_leaf(cert_dir, "node3", ips=["127.0.0.2"])
    secret_file = tmp_path / "raft.secret"
    secret_file.write_text(SECRET + "\n")
    password = "join-test-password"
    users = write_users_file(tmp_path / "users.json", {}, {"admin": "administrator"}, password)

    def admin_tls(node: NodeProcess, name: str) -> None:
        node.args += ("--admin-tls-cert-file", str(cert_dir / f"{name}.pem"),
                      "--admin-tls-key-file", str(cert_dir / f"{name}-key.pem"), "--users-file", str(users))

    cluster = Cluster(tmp_path, 3)
    for index, node in enumerate(cluster.nodes):
        secure(node, index, cert_dir, secret_file)
        admin_tls(node, f"node{index}")
    # the nodes, the joiner and the harness's CLI calls (cluster status) all take the CLI's variables
    for key, value in {"GROUPER_USER": "admin", "GROUPER_PASSWORD": password,
                       "GROUPER_CA": str(cert_dir / "ca.pem")}.items():
        monkeypatch.setenv(key, value)
    [raft_port] = free_ports(1)
    node_id = f"127.0.0.2:{raft_port}"
    # --join asks a member at the member's host and this node's admin port: node 0's port number
    joiner = NodeProcess(tmp_path / "member", "[node]\njoin_timeout_ms = 3000\n",
                         ("--host", "127.0.0.2", "--raft-port", str(raft_port), "--peers", cluster.node_ids[0],
                          "--join"))
    secure(joiner, 3, cert_dir, secret_file)
    admin_tls(joiner, "node3")
    try:
        cluster.start()
        joiner._admin_port = int(cluster.nodes[0].admin_address.rsplit(":", 1)[1])
        joiner.environment = {key: value for key, value in os.environ.items()
                              if key not in ("GROUPER_USER", "GROUPER_PASSWORD")}
        with pytest.raises(RuntimeError, match="exited with 1") as refused:
            joiner.start()
        assert "could not join" in str(refused.value) and "refused this node" in str(refused.value) \
            and "GROUPER_USER" in str(refused.value), refused.value

        joiner.environment = None
        seen = len(joiner.output)
        joiner.start()
        assert any("joined the cluster" in line for line in joiner.output[seen:]), joiner.output[seen:]
        cluster.wait_for(lambda s: node_id in [m["node"] for m in s["members"] if m["raft_member"]
                                               and m["amqp_address"]], "the joined member registered")

        joiner.kill()  # its volume is replaced: the secured members still tell it apart from a founder
        shutil.rmtree(joiner.data_dir)
        joiner.data_dir.mkdir()
        seen = len(joiner.output)
        with pytest.raises(RuntimeError, match="exited with 1"):
            joiner.start()
        said = "\n".join(joiner.output[seen:])
        assert "raft state is missing" in said and f"grouper cluster remove-node {node_id}" in said, said
    finally:
        joiner.kill()
        cluster.kill_all()
