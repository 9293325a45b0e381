"""The HTTP endpoints supervisors use (/healthz, /readyz, /metrics), against real node processes."""

from __future__ import annotations

import urllib.error
import urllib.request

from tests.integration.cluster import Cluster
from tests.integration.harness import ManualReceiver, connect, grouped, wait_until


def get(node, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://{node.http_address}{path}", timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def metric(text: str, name: str) -> float:
    """The value of one sample line `name value` (name with its labels, as printed)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample {name} in:\n{text}")


def test_a_single_node_is_healthy_ready_and_counts_its_queues(node):
    assert get(node, "/healthz") == (200, "ok\n")
    assert get(node, "/readyz") == (200, "ready\n")
    assert get(node, "/nope")[0] == 404
    connection = connect(node)
    try:
        receiver = connection.create_receiver("orders", name="c1", credit=10)
        sender = connection.create_sender("orders")
        for n in range(3):
            sender.send(grouped(f"m{n}", "g"))
        for _ in range(3):
            receiver.receive(timeout=10)
        status, text = get(node, "/metrics")
        assert status == 200
        assert metric(text, 'grouper_queue_messages_in_total{queue="orders"}') == 3
        assert metric(text, 'grouper_queue_messages_out_total{queue="orders"}') == 3
        assert metric(text, 'grouper_queue_groups{queue="orders"}') == 1
        owned = [line for line in text.splitlines() if line.startswith("grouper_consumer_owned_groups{")]
        assert len(owned) == 1 and owned[0].endswith(" 1.0") and "/c1" in owned[0]
        assert metric(text, "grouper_journal_fsync_latency_seconds_count") >= 1
        assert metric(text, "grouper_ready") == 1
        assert "grouper_raft_term" not in text  # a single node has no raft
    finally:
        connection.close()


def test_cluster_nodes_are_ready_with_a_leader_and_not_ready_without_a_majority(tmp_path):
    cluster = Cluster(tmp_path, 3).start()
    try:
        for node in cluster.nodes:
            wait_until(lambda: get(node, "/readyz")[0] == 200, f"{node.http_address} ready")
        leader = cluster.wait_leader()
        sender_node = cluster.nodes[(leader + 1) % 3]
        connection = connect(sender_node)
        try:
            receiver = connection.create_receiver("orders", credit=10)
            cluster.wait_consumers("orders", {(leader + 1) % 3: 1})
            connection.create_sender("orders").send(grouped("m0", "g"))
            receiver.receive(timeout=10)
        finally:
            connection.close()
        text = get(sender_node, "/metrics")[1]
        assert metric(text, 'grouper_route_decisions_total{outcome="routed"}') == 1
        assert metric(text, "grouper_route_decision_latency_seconds_count") == 1
        # the one claim this node proposed, timed from proposal to decided route; the others proposed none
        assert metric(text, "grouper_raft_decision_latency_seconds_count") == 1
        assert metric(text, "grouper_raft_decision_latency_seconds_sum") > 0
        # and its raft part, timed by the node's raft member: no longer than the whole
        assert metric(text, "grouper_raft_member_decision_latency_seconds_count") == 1
        assert 0 < metric(text, "grouper_raft_member_decision_latency_seconds_sum") <= metric(
            text, "grouper_raft_decision_latency_seconds_sum")
        for other in cluster.nodes:
            if other is not sender_node:
                other_text = get(other, "/metrics")[1]
                assert metric(other_text, "grouper_raft_decision_latency_seconds_count") == 0
                assert metric(other_text, "grouper_raft_member_decision_latency_seconds_count") == 0
        assert metric(text, "grouper_raft_term") >= 1

        def agreed_leader():  # every node names the same leader, and that node says it leads
            texts = [get(node, "/metrics")[1] for node in cluster.nodes]
            named = {line.split('"')[1] for text in texts for line in text.splitlines()
                     if line.startswith("grouper_raft_leader{")}
            if len(named) != 1 or next(iter(named)) not in cluster.node_ids:
                return None
            index = cluster.index_of(next(iter(named)))
            return index if metric(texts[index], "grouper_raft_is_leader") == 1 else None

        leader = wait_until(lambda: (lambda index: None if index is None else [index])(agreed_leader()),
                            "every node's metrics naming one leader")[0]
        survivor = cluster.nodes[leader]
        for index, node in enumerate(cluster.nodes):
            if index != leader:
                node.kill()
        status, reason = wait_until(lambda: (lambda r: r if r[0] == 503 else None)(get(survivor, "/readyz")),
                                    "the survivor not ready")
        assert "no raft" in reason and "majority of --peers" in reason
        assert get(survivor, "/healthz")[0] == 200  # alive: a supervisor must not restart it for this
    finally:
        cluster.kill_all()


def test_engine_object_gauges_count_what_clients_hold_and_return_to_zero_when_they_leave(node):
    text = get(node, "/metrics")[1]
    assert metric(text, "grouper_engine_connections") == 0
    assert metric(text, "grouper_process_resident_bytes") > 1 << 20  # a Python process with proton loaded
    connection = connect(node)
    try:
        receiver = ManualReceiver(connection, "orders", "c1")
        sender = connection.create_sender("orders")
        for n in range(3):
            sender.send(grouped(f"m{n}", "g"))
        held = receiver.fetch_many(2)  # delivered, left unsettled
        text = get(node, "/metrics")[1]
        assert metric(text, "grouper_engine_connections") == 1
        assert metric(text, "grouper_engine_links") == 2  # the consumer and the producer
        assert metric(text, "grouper_engine_unsettled_deliveries") == 2
        held[0].accept()
        assert metric(get(node, "/metrics")[1], "grouper_engine_unsettled_deliveries") == 1
    finally:
        connection.close()
    wait_until(lambda: metric(get(node, "/metrics")[1], "grouper_engine_connections") == 0,
               "the closed connection's engine objects released")
    text = get(node, "/metrics")[1]
    assert metric(text, "grouper_engine_links") == 0
    assert metric(text, "grouper_engine_unsettled_deliveries") == 0
