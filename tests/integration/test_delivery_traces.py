"""A node's delivery traces (README "Auditing deliveries: node traces") on one real node, read by the checker.

The Spark audit of traces against client logs, with forwarding and rotation, is
tests/pipeline/test_node_trace_audit.py; here: what each line says for a refused send, a failed and
redelivered message, a multicast send copied to a traced and an untraced subscription queue, and the
trace settings as `grouper queue update` sets them.
"""

from __future__ import annotations

from proton import Delivery

from tests.drills.checker import check, load_jsonl
from tests.integration.cli import grouper_ok
from tests.integration.clients import queue_toml
from tests.integration.harness import ManualReceiver, connect, grouped, send_outcome, wait_until
from tests.integration.test_node_endpoints import get, metric

CONFIG = queue_toml("orders", trace=True, depth_max_messages=3) + """
[[address]]
name = "prices"
routing = "multicast"

[[address.queue]]
name = "prices.traced"
trace = true

[[address.queue]]
name = "prices.plain"
"""


def identified(group: str, sequence: int, producer: str = "p0"):
    return grouped(f"{group}:{sequence}", group, producer=producer, sequence=sequence)


def trace_lines(node) -> list[dict]:
    return load_jsonl(sorted((node.data_dir / "traces").glob("*.jsonl")))


def test_a_traced_queue_logs_refusals_redeliveries_and_outcomes_as_a_client_would(node_factory):
    node = node_factory(CONFIG)
    connection = connect(node)
    try:
        sender = connection.create_sender("orders")
        outcomes = [send_outcome(sender, identified("g1", sequence))[0] for sequence in (1, 2, 3, 4)]
        assert outcomes == [Delivery.ACCEPTED] * 3 + [Delivery.REJECTED]  # depth_max_messages = 3
        receiver = ManualReceiver(connection, "orders", "c0")
        first = receiver.fetch()
        first.modify(failed=True)  # a failed delivery: the next one carries delivery-count 1
        for held in receiver.fetch_many(3):
            held.accept()
    finally:
        connection.close()
    wait_until(lambda: any(line["kind"] == "detach" for line in trace_lines(node)), "the trace's detach line")
    lines = trace_lines(node)
    sends = [line for line in lines if line["kind"] == "send"]
    deliveries = [line for line in lines if line["kind"] == "delivery"]
    assert [(line["sequence"], line["outcome"]) for line in sends] == [
        (1, "accepted"), (2, "accepted"), (3, "accepted"), (4, "rejected")]
    assert sends[3]["condition"] == "amqp:resource-limit-exceeded"
    assert [(line["sequence"], line["outcome"], line["delivery_count"]) for line in deliveries] == [
        (1, "modified", 0), (1, "accepted", 1), (2, "accepted", 0), (3, "accepted", 0)]
    assert all(line["received_ms"] <= line["settled_ms"] for line in deliveries)
    assert [line["sequence"] for line in lines if line["kind"] == "enqueue"] == [1, 2, 3]
    report = check(sends, deliveries)
    assert report.ok and (report.accepted, report.refused, report.delivered, report.redeliveries) == (3, 1, 3, 1), \
        report.summary()
    status, text = get(node, "/metrics")
    assert status == 200 and metric(text, "grouper_trace_lines_written_total") == len(lines)
    assert metric(text, "grouper_trace_lines_dropped_total") == metric(text, "grouper_trace_files_deleted_total") == 0


def test_a_multicast_send_is_traced_for_its_traced_copy_only(node_factory):
    node = node_factory(CONFIG)
    connection = connect(node)
    try:
        sender = connection.create_sender("prices")
        for sequence in (1, 2):
            assert send_outcome(sender, identified("IBM", sequence))[0] == Delivery.ACCEPTED
        for queue in ("prices.traced", "prices.plain"):
            receiver = ManualReceiver(connection, queue, f"c-{queue}")
            for held in receiver.fetch_many(2):
                held.accept()
    finally:
        connection.close()
    wait_until(lambda: sum(line["kind"] == "delivery" for line in trace_lines(node)) == 2, "two delivery lines")
    lines = trace_lines(node)
    assert {line["queue"] for line in lines} == {"prices.traced"}
    report = check([line for line in lines if line["kind"] == "send"],
                   [line for line in lines if line["kind"] == "delivery"])
    assert report.ok and (report.sends, report.delivered) == (2, 2), report.summary()


def test_tracing_is_switched_on_by_queue_update_and_writes_nothing_before(node_factory):
    node = node_factory(queue_toml("later"))
    connection = connect(node)
    try:
        sender = connection.create_sender("later")
        assert send_outcome(sender, identified("g", 1))[0] == Delivery.ACCEPTED
        assert not (node.data_dir / "traces").exists()  # no trace, no writer thread, no directory
        updated = node.cli("queue", "update", "later", "--trace")
        assert updated.returncode == 0, updated.stderr
        assert send_outcome(sender, identified("g", 2))[0] == Delivery.ACCEPTED
    finally:
        connection.close()
    # both lines: the writer may have flushed the enqueue line before the send line
    wait_until(lambda: (node.data_dir / "traces").exists() and len(trace_lines(node)) >= 2, "the first trace lines")
    # the message is in its queue before its send is settled (once on disk)
    assert [(line["kind"], line["sequence"]) for line in trace_lines(node)] == [("enqueue", 2), ("send", 2)]


def test_what_grouper_send_sends_to_a_traced_queue_is_judged_by_its_identity_not_called_unexpected(node_factory):
    # the README's first commands against a traced queue: `grouper send` names each message's identity
    # (producer, sequence) as the trace reads it, so the trace's sends and deliveries match up
    node = node_factory(CONFIG)
    grouper_ok("send", "orders", "--group", "a", "--group", "b", "--count", "3", "--node", node.amqp_address)
    grouper_ok("receive", "orders", "--count", "3", "--node", node.amqp_address)
    wait_until(lambda: any(line["kind"] == "detach" for line in trace_lines(node)), "the trace's detach line")
    lines = trace_lines(node)
    sends = [line for line in lines if line["kind"] == "send"]
    deliveries = [line for line in lines if line["kind"] == "delivery"]
    assert [(line["group"], line["sequence"]) for line in sends] == [("a", 1), ("b", 1), ("a", 2)]
    assert len({line["producer"] for line in sends}) == 1 and sends[0]["producer"].startswith("grouper-send-")
    report = check(sends, deliveries)
    assert report.ok and (report.accepted, report.delivered, len(report.unexpected)) == (3, 3, 0), report.summary()
