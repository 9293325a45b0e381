"""A backup's receiving end of replication (issue 28), on real node processes on 127.0.0.1.

A two-node loopback cluster with a raft secret and no cluster TLS takes Replicate calls on its admin port,
each carrying the replication credential (an HMAC keyed from the raft secret with a label of its own).
Node 1 is the backup; a batch claiming node 0 as owner, signed as node 0 signs, is stored and acknowledged
with its high water; a resend is skipped; an unsigned call and one carrying a forwarding credential are
refused and store nothing. After the backup restarts, its mark holds (a resend is still skipped, the next
entry taken), and its replica journal under <data_dir>/replicas lists the owner's live messages in order.
With cluster TLS the same batch is taken on the backup's peer port from the owner's node certificate, and
refused from a client certificate of the cluster's CA and at the admin port. Every wait is bounded.
"""

from __future__ import annotations

import stat
from pathlib import Path

import grpc
import pytest

from node.core.dispatch.message import Message
from node.peer.replica_batch import batch_to_pb
from node.peer.signature import FORWARDING, REPLICATION, Signer
from node.store import records
from node.store.replica_journal import ReplicaJournal, owners_in, replica_directory
from tests.integration.cluster import Cluster
from tests.integration.test_cluster_security import banner_value, make_certs, secure
from tests.integration.test_forward_credentials import body_of
from proto import peer_pb2, peer_pb2_grpc

SECRET = "integration-replica-secret-0123456789"
WAIT_S = 20.0
QUEUE = "orders"


def store(seq: int, group: str = "g") -> bytes:
    return records.encode_store(QUEUE, Message(body_of(f"{group}:{seq}"), group, seq=seq))


def replicate(address: str, batch: peer_pb2.ReplicaBatch, metadata=()) -> peer_pb2.ReplicaAck:
    with grpc.insecure_channel(address) as channel:
        return peer_pb2_grpc.PeerServiceStub(channel).Replicate(batch, timeout=WAIT_S, metadata=metadata)


def refused(address: str, batch: peer_pb2.ReplicaBatch, metadata=()) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as raised:
        replicate(address, batch, metadata)
    return raised.value


def test_a_backup_stores_an_owners_signed_batches_durably_and_refuses_every_other_caller(tmp_path):
    secret_file = tmp_path / "raft.secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    cluster = Cluster(tmp_path, 2, args=("--raft-secret-file", str(secret_file))).start()
    owner, backup_id = cluster.node_ids
    backup = cluster.nodes[1]
    signer = Signer([SECRET], REPLICATION)
    try:
        first = batch_to_pb(owner, 1, [(1, QUEUE, "g", store(1)), (2, QUEUE, "h", store(2, "h")),
                                       (3, QUEUE, "g", store(3))])
        ack = replicate(backup.admin_address, first, signer.metadata(first, backup_id))
        assert (ack.high_water, ack.epoch) == (3, 1)
        assert replicate(backup.admin_address, first, signer.metadata(first, backup_id)).high_water == 3  # resend

        second = batch_to_pb(owner, 1, [(3, QUEUE, "g", store(3)), (4, QUEUE, "g", records.encode_remove(QUEUE, 1))])
        assert replicate(backup.admin_address, second, signer.metadata(second, backup_id)).high_water == 4

        stranger = batch_to_pb(owner, 1, [(5, QUEUE, "g", store(50))])
        unsigned = refused(backup.admin_address, stranger)
        assert unsigned.code() is grpc.StatusCode.UNAUTHENTICATED
        assert "no replication credential" in unsigned.details()
        forwarding = refused(backup.admin_address, stranger, Signer([SECRET], FORWARDING).metadata(stranger, backup_id))
        assert forwarding.code() is grpc.StatusCode.UNAUTHENTICATED

        backup.restart()
        assert replicate(backup.admin_address, second, signer.metadata(second, backup_id)).high_water == 4
        third = batch_to_pb(owner, 1, [(5, QUEUE, "g", store(5))])
        assert replicate(backup.admin_address, third, signer.metadata(third, backup_id)).high_water == 5
        backup.stop()
        assert owners_in(str(backup.data_dir)) == [owner]
        directory = Path(replica_directory(str(backup.data_dir), owner))
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700  # private, as every file of a node's data
        assert {stat.S_IMODE(path.stat().st_mode) for path in directory.iterdir()} == {0o600}
        journal = ReplicaJournal(str(backup.data_dir), owner).open()  # the node let go of its lock
        try:
            live = journal.live([(QUEUE, "g"), (QUEUE, "h")])
            assert (journal.epoch, journal.high_water) == (1, 5)
        finally:
            journal.close()
        assert {key: [m.seq for m in messages] for key, messages in live.items()} == \
            {(QUEUE, "g"): [3, 5], (QUEUE, "h"): [2]}
        assert live[(QUEUE, "g")][0].payload == body_of("g:3")  # the owner's bytes, as sent
    finally:
        cluster.kill_all()


def test_with_cluster_tls_an_owner_replicates_on_the_peer_port_with_its_node_certificate_only(tmp_path):
    cert_dir = make_certs(tmp_path / "certs", 2)
    secret_file = tmp_path / "raft.secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    cluster = Cluster(tmp_path, 2)
    for index, node in enumerate(cluster.nodes):
        secure(node, index, cert_dir, secret_file)
    cluster.start()
    owner, backup = cluster.node_ids[0], cluster.nodes[1]
    ca = (cert_dir / "ca.pem").read_bytes()

    def over_tls(name: str, batch: peer_pb2.ReplicaBatch) -> peer_pb2.ReplicaAck:
        credentials = grpc.ssl_channel_credentials(ca, (cert_dir / f"{name}-key.pem").read_bytes(),
                                                   (cert_dir / f"{name}.pem").read_bytes())
        with grpc.secure_channel(banner_value(backup, "peer"), credentials) as channel:
            return peer_pb2_grpc.PeerServiceStub(channel).Replicate(batch, timeout=WAIT_S)

    try:
        batch = batch_to_pb(owner, 1, [(1, QUEUE, "g", store(1)), (2, QUEUE, "g", store(2))])
        ack = over_tls("node0", batch)
        assert (ack.high_water, ack.epoch) == (2, 1)
        with pytest.raises(grpc.RpcError) as client:  # a client certificate of the cluster's CA is no node's
            over_tls("alice", batch)
        assert client.value.code() is grpc.StatusCode.PERMISSION_DENIED and "CN alice" in client.value.details()
        elsewhere = refused(backup.admin_address, batch, Signer([SECRET], REPLICATION).metadata(batch, cluster.node_ids[1]))
        assert elsewhere.code() is grpc.StatusCode.UNAUTHENTICATED and "peer port" in elsewhere.details()
    finally:
        cluster.kill_all()
