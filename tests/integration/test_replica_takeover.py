"""Takeover and fencing on three real node processes (issue 28): an owner killed with -9 has its replicated
groups taken over by its in-sync backup, which delivers exactly the owner's messages, in group order, each
counted one delivery more; the old owner, restarted, serves none of those groups and holds none of their
messages, while the groups no backup held stay with it.

Until the owner's replica streams exist, the test plays them: the owner (node 0) holds the messages in its own
journal (sent with proton), and the test writes the same STORE frames to the backup (node 1) by authenticated
Replicate calls signed as node 0 signs; node 0 proposes replica_in_sync(node 1) through its own grouping handler
(tests/integration/in_sync_launcher.py). The time from the kill to the first delivery at node 1 is printed.
Every wait is bounded.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import grpc
from proton import Delivery, Message

from node.core.dispatch.message import Message as StoredMessage
from node.core.replication.assignment import promotion_target
from node.peer.replica_batch import batch_to_pb
from node.peer.signature import REPLICATION, Signer
from node.store import records
from proto import peer_pb2_grpc
from tests.integration.cluster import Cluster
from tests.integration.clients import queue_toml
from tests.integration.harness import ManualReceiver, connect, send_outcome

SECRET = "integration-takeover-secret-0123456789"
QUEUE = "orders"
GROUPS = [f"g{number}" for number in range(8)]
PER_GROUP = 3
REPLICA_FAILOVER_MS = 2000
REPLICA_LEASE_MS = 700  # the owner's lease must end before promotion: 2000 - 2 x 500 (raft fallback) - 250 margin
WAIT_S = 20.0
LAUNCHER = str(Path(__file__).with_name("in_sync_launcher.py"))


def encoded(group: str, seq: int) -> bytes:
    message = Message(body=f"{group}:{seq}")
    message.group_id = group
    message.durable = True
    return bytes(message.encode())


def wait(predicate, what: str, timeout_s: float = WAIT_S):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"not within {timeout_s} s: {what}")


def test_a_killed_owners_replicated_groups_are_taken_over_in_order_and_it_comes_back_fenced(tmp_path):
    secret_file = tmp_path / "raft.secret"
    secret_file.write_text(SECRET + "\n")
    secret_file.chmod(0o600)
    config = (f"[node]\nreplica_failover_ms = {REPLICA_FAILOVER_MS}\nreplica_lease_ms = {REPLICA_LEASE_MS}\n"
              f"replication_factor = 2\nplacement = \"local\"\n"
              + queue_toml(QUEUE, durable=True))
    cluster = Cluster(tmp_path, 3, config_text=config, args=("--raft-secret-file", str(secret_file)))
    owner_node, backup_node = cluster.nodes[0], cluster.nodes[1]
    owner_node.command_prefix = (sys.executable, LAUNCHER)
    cluster.start()
    owner, backup = cluster.node_ids[0], cluster.node_ids[1]
    members = sorted(cluster.node_ids)
    connections = []
    try:
        # the owner's messages, in its journal: a consumer there first, so local placement keeps the groups
        owner_connection = connect(owner_node)
        connections.append(owner_connection)
        ManualReceiver(owner_connection, QUEUE, "idle", credit=0)
        cluster.wait_consumers(QUEUE, {0: 1})
        sender = owner_connection.create_sender(QUEUE, name="producer")
        sent = [(group, seq) for seq in range(1, PER_GROUP + 1) for group in GROUPS]
        for group, seq in sent:
            message = Message(body=f"{group}:{seq}")
            message.group_id = group
            message.durable = True
            assert send_outcome(sender, message)[0] == Delivery.ACCEPTED
        taken = [group for group in GROUPS
                 if promotion_target(owner, QUEUE, group, members, {backup}, 2) == backup]
        kept = [group for group in GROUPS if group not in taken]
        assert taken and kept, (taken, kept)  # some groups are backed by node 2, never in sync: they stay

        # the backup's replica journal: the same STORE frames, as the owner's stream will send them
        entries = [(repl_seq, QUEUE, group, records.encode_store(QUEUE, StoredMessage(encoded(group, seq), group,
                                                                                      seq=repl_seq)))
                   for repl_seq, (group, seq) in enumerate([item for item in sent if item[0] in taken], 1)]
        batch = batch_to_pb(owner, 0, entries)
        with grpc.insecure_channel(backup_node.admin_address) as channel:
            ack = peer_pb2_grpc.PeerServiceStub(channel).Replicate(
                batch, timeout=WAIT_S, metadata=Signer([SECRET], REPLICATION).metadata(batch, backup))
        assert ack.high_water == len(entries)
        (owner_node.data_dir / "propose_in_sync").write_text(f"{backup} 0")
        answer = wait(lambda: (owner_node.data_dir / "in_sync_answer").exists()
                      and (owner_node.data_dir / "in_sync_answer").read_text(), "the in-sync answer")
        assert answer == "None True", answer
        status = cluster.wait_for(lambda status: any(member["in_sync"] == [backup] for member in status["members"]),
                                  "the in-sync set known on the backup", via=1)
        assert {member["node"]: member["routes"] for member in status["members"]}[owner] == len(GROUPS)  # local
        owner_connection.close()  # before the kill: a dead peer's close waits out its timeout
        connections.remove(owner_connection)

        consumer = ManualReceiver(connect(backup_node), QUEUE, "taker", credit=100)
        connections.append(consumer.connection)
        killed_at = time.monotonic()
        owner_node.kill()
        first = consumer.fetch(timeout_s=REPLICA_FAILOVER_MS / 1000 + WAIT_S)
        first_delivery_s = time.monotonic() - killed_at
        held = [first] + consumer.fetch_many(len(entries) - 1)
        got = [(message.body, message.delivery_count) for message in (h.message for h in held)]
        expected = {group: [f"{group}:{seq}" for seq in range(1, PER_GROUP + 1)] for group in taken}
        by_group: dict = {}
        for body, count in got:
            by_group.setdefault(body.split(":")[0], []).append(body)
            assert count == 1, got  # delivered once more than the owner's STORE said, as after a restart
        assert by_group == expected
        for message in held:
            message.accept()
        time.sleep(0.3)
        assert consumer.arrived_count == 0  # nothing twice, nothing of the groups left behind
        print(f"\nkill -9 of the owner to the first delivery at its in-sync backup: {first_delivery_s * 1000:.0f} ms "
              f"(replica_failover_ms {REPLICA_FAILOVER_MS})")

        # the old owner returns fenced: none of the taken groups, their messages gone; the kept ones stay
        owner_node.start()
        wait(lambda: any("promoted away" in line for line in owner_node.output), "the old owner's fencing log")
        receiver = ManualReceiver(connect(owner_node), QUEUE, "back", credit=100)
        connections.append(receiver.connection)
        back = receiver.fetch_many(len(kept) * PER_GROUP)
        assert sorted(str(h.message.body).split(":")[0] for h in back) == sorted(kept * PER_GROUP)
        time.sleep(0.3)
        assert receiver.arrived_count == 0
        assert consumer.arrived_count == 0  # nor handed to the backup again: it has them (no duplicates)
        assert sum("promoted away" in line for line in owner_node.output) == 1  # logged once
    finally:
        for connection in connections:
            try:
                connection.close()
            except Exception:
                pass
        cluster.kill_all()

