"""Issue 30 as a user sees it, with python-qpid-proton against a real node: an incremental rebalance moves only
a quarter of the groups when a fourth consumer joins three (judged by which consumer receives each group's
next message), and /metrics shows a stuck group's signals, which the shipped KEDA example queries."""

from __future__ import annotations

import time

import yaml

from tests.integration.harness import REPO, ManualReceiver, connect, grouped, wait_until
from tests.integration.test_node_endpoints import get, metric
from tests.integration.test_prometheus import exported, metric_names

GROUPS = 24  # 8 a consumer over three; 6 over four: 2 of each of the three move, 6 of 24
KEDA_EXAMPLE = REPO / "deploy" / "keda" / "scaledobject.yaml"


def next_consumers(receivers: list[ManualReceiver], count: int) -> dict[str, str]:
    """group -> the consumer its next message reached, once `count` messages arrived; all accepted."""
    connection = receivers[0].connection
    connection.wait(lambda: sum(r.arrived_count for r in receivers) >= count, timeout=10,
                    msg=f"{count} deliveries")
    got = {}
    for receiver in receivers:
        for held in receiver.take_arrived():
            got[held.message.group_id] = receiver.name
            held.accept()
    assert len(got) == count, got
    return got


def test_a_fourth_consumer_joining_three_takes_a_quarter_of_the_groups_and_the_others_keep_theirs(node_factory):
    node = node_factory('[[queue]]\nname = "work"\ngroup_rebalance = "incremental"\n'
                        'group_rebalance_pause_dispatch = true\n')
    connection = connect(node)
    try:
        consumers = [ManualReceiver(connection, "work", f"c{index}", credit=GROUPS) for index in range(3)]
        sender = connection.create_sender("work")
        for number in range(GROUPS):
            sender.send(grouped(f"first {number}", f"g{number}"))
        before = next_consumers(consumers, GROUPS)
        assert sorted(list(before.values()).count(c.name) for c in consumers) == [8, 8, 8]
        consumers.append(ManualReceiver(connection, "work", "c3", credit=GROUPS))
        for number in range(GROUPS):
            sender.send(grouped(f"next {number}", f"g{number}"))
        after = next_consumers(consumers, GROUPS)
        moved = {group for group in before if after[group] != before[group]}
        assert len(moved) == GROUPS // 4  # a reset would have freed all 24
        assert {after[group] for group in moved} == {"c3"}
        assert sorted(list(after.values()).count(c.name) for c in consumers) == [6, 6, 6, 6]
    finally:
        connection.close()


def test_metrics_show_a_stuck_groups_signals_and_the_keda_example_queries_only_those_exported(node):
    connection = connect(node)
    try:
        stuck = ManualReceiver(connection, "orders", "stuck")
        sender = connection.create_sender("orders")
        sent_s = time.time()
        sender.send(grouped("a1", "a"))
        held = stuck.fetch()  # taken, never settled: the consumer is stuck on group a, its credit spent
        sender.send(grouped("a2", "a"))  # waits behind a1 on the stuck consumer
        sender.send(grouped("b1", "b"))  # no consumer may take it: runnable
        text = wait_until(lambda: (lambda t: t if 'grouper_queue_runnable_groups{queue="orders"} 1.0' in t else None)(
            get(node, "/metrics")[1]), "the signals in /metrics")
        assert metric(text, 'grouper_queue_runnable_groups{queue="orders"}') == 1
        assert metric(text, 'grouper_queue_blocked_groups{queue="orders"}') == 1
        assert metric(text, 'grouper_queue_held_groups{queue="orders"}') == 1
        oldest_s = metric(text, 'grouper_queue_oldest_head_enqueued_timestamp_seconds{queue="orders"}')
        assert sent_s - 1 <= oldest_s <= time.time()  # a2's arrival: a1 is in flight, not waiting
        documents = [document for document in yaml.safe_load_all(KEDA_EXAMPLE.read_text()) if document]
        queries = [trigger["metadata"]["query"] for document in documents for trigger in document["spec"]["triggers"]
                   if trigger["type"] == "prometheus"]
        assert queries and documents[0]["kind"] == "ScaledObject"
        names = set().union(*(metric_names(query) for query in queries))
        assert "grouper_queue_runnable_groups" in names
        assert names <= set(exported(text)), names - set(exported(text))
        held.accept()
    finally:
        connection.close()
