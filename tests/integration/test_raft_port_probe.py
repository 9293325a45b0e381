"""A stranger at a raft port runs nothing (issue 26, finding 1).

pysyncobj unpickles a raft frame (struct 'i' length + zlib(pickle)). With a raft secret it first
checks the frame's Fernet HMAC (`extract_timestamp`, then `decrypt`) and closes the connection on a
bad one before `pickle.loads`; `grouper up` gives its nodes a secret, and a cluster node refuses
to start without one unless --allow-insecure-cluster. The control test shows the probe is real:
against nodes run insecure on purpose, the same frame does run.
"""

from __future__ import annotations

import json
import time

from proton import Message
from proton.utils import BlockingConnection

from tests.integration.cli import grouper
from tests.integration.cluster import Cluster
from tests.integration.grouper_up import GrouperUp, malicious_frame, send_to_raft_port

MARKER_WAIT_S = 3.0  # a frame that runs is unpickled within milliseconds of arriving
WRONG_SECRET = "not-the-cluster-secret-0123456789"


def no_marker_within(marker, timeout_s: float = MARKER_WAIT_S) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if marker.exists():
            return False
        time.sleep(0.1)
    return not marker.exists()


def test_a_pickle_sent_to_every_raft_port_of_grouper_up_runs_nothing_and_the_nodes_keep_working(tmp_path):
    up = GrouperUp(tmp_path / "cluster").start()
    try:
        markers = []
        for index in range(3):
            for key in (None, WRONG_SECRET):  # in plaintext, and encrypted with another secret
                marker = tmp_path / f"ran-node{index}-{'plain' if key is None else 'wrong-key'}"
                markers.append(marker)
                assert send_to_raft_port(up.raft_port(index), malicious_frame(marker, key)) == b""
        assert all(no_marker_within(marker) for marker in markers), [m.name for m in markers if m.exists()]
        # the nodes keep working: one leader, every member connected, a message goes from node0 to node2
        status = json.loads(grouper("cluster", "status", "--json", "--node", up.admin(1)).stdout)
        assert status["leader"] and all(member["connected"] for member in status["members"])
        consumer = BlockingConnection(f"amqp://{up.amqp(2)}", timeout=10)
        producer = BlockingConnection(f"amqp://{up.amqp(0)}", timeout=10)
        try:
            receiver = consumer.create_receiver("probed", name="c", credit=1)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:  # until the route table, replicated by raft, knows the consumer
                status = json.loads(grouper("cluster", "status", "--json", "--node", up.admin(0)).stdout)
                if status["members"][2]["consumers"].get("probed"):
                    break
                time.sleep(0.2)
            sender = producer.create_sender("probed", name="p")
            message = Message(body="still here")
            message.group_id = "g"
            sender.send(message)
            assert receiver.receive(timeout=30).body == "still here"
            receiver.accept()
        finally:
            producer.close()
            consumer.close()
    finally:
        up.kill_tree()


def test_the_probe_runs_code_in_a_node_that_clusters_without_a_raft_secret(tmp_path):
    """The control: what --allow-insecure-cluster leaves open, and why the refusal exists."""
    cluster = Cluster(tmp_path, 2, args=("--allow-insecure-cluster",))
    try:
        cluster.nodes[0].start()
        assert any("INSECURE (--allow-insecure-cluster)" in line for line in cluster.nodes[0].output)
        assert any(line.startswith("cluster security: open (--allow-insecure-cluster)")
                   for line in cluster.nodes[0].output)
        marker = tmp_path / "ran"
        send_to_raft_port(cluster.raft_ports[0], malicious_frame(marker))
        assert not no_marker_within(marker, timeout_s=10.0), "the unauthenticated raft port did not run the frame"
    finally:
        cluster.kill_all()
