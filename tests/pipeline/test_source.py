"""The "grouper" batch source against a real node: browse, drain, bounds, failures and bad input.

Messages are put in with plain proton clients; queue depths are read through the admin API.
"""

from __future__ import annotations

import threading
import time

import pytest
from proton import Message
from proton.utils import BlockingConnection

from node.admin.client import AdminClient
from tests.integration.harness import NodeProcess
from tests.pipeline.test_sink import closed_port

WAIT_S = 30.0


def send(node, queue: str, *messages: Message) -> None:
    connection = BlockingConnection(node.url, timeout=WAIT_S)
    try:
        sender = connection.create_sender(queue)
        for message in messages:
            sender.send(message)  # waits until the node accepts it
    finally:
        connection.close()


def grouped(group: str | None, body, **properties) -> Message:
    message = Message(body=body, properties=properties or None)
    if group is not None:
        message.group_id = group
    return message


def queue_stats(node, queue: str) -> dict:
    with AdminClient(node.admin_address) as admin:
        return next(stats for stats in admin.list_queues() if stats["name"] == queue)


def reader(spark, node, queue: str, **options):
    return spark.read.format("grouper").options(nodes=node.amqp_address, queue=queue, **options)


def interleaved(queue_groups: int, per_group: int) -> list[Message]:
    """g0:0, g1:0, ..., g0:1, g1:1, ...: groups interleaved, each in its own order."""
    return [grouped(f"g{group}", f"g{group}:{seq}") for seq in range(per_group) for group in range(queue_groups)]


def per_group(rows) -> dict[str, list[str]]:
    bodies: dict[str, list[str]] = {}
    for row in rows:
        bodies.setdefault(row.group, []).append(row.body)
    return bodies


def test_browse_returns_every_field_and_consumes_nothing(grouper_spark, grouper_node):
    message = grouped("g1", "hello", n=1, flag=True, name="x")
    message.id = "m-1"
    send(grouper_node, "src-browse", message, grouped(None, b"\x00raw"), grouped("g2", "jms", JMSXGroupID="ignored"))
    rows = reader(grouper_spark, grouper_node, "src-browse").load().collect()
    assert [(r.group, r.body, r.properties, r.message_id, r.delivery_count) for r in rows] == [
        ("g1", bytearray(b"hello"), {"n": "1", "flag": "true", "name": "x"}, "m-1", 0),
        (None, bytearray(b"\x00raw"), {}, None, 0),
        ("g2", bytearray(b"jms"), {"JMSXGroupID": "ignored"}, None, 0),
    ]
    again = reader(grouper_spark, grouper_node, "src-browse", bodyType="string").load().collect()
    assert [r.body for r in again] == ["hello", "\x00raw", "jms"]
    assert queue_stats(grouper_node, "src-browse")["depth_messages"] == 3


def test_the_group_comes_from_jmsxgroupid_or_from_the_configured_header(grouper_spark, grouper_node):
    send(grouper_node, "src-header", grouped(None, "a", JMSXGroupID="j1", tenant="t1"))
    [row] = reader(grouper_spark, grouper_node, "src-header").load().collect()
    assert row.group == "j1"
    [row] = reader(grouper_spark, grouper_node, "src-header", groupHeader="tenant").load().collect()
    assert row.group == "t1"


def test_the_enqueue_time_is_the_nodes_not_the_producers_creation_time(grouper_spark, grouper_node):
    message = grouped("g", "timed")
    message.creation_time = 1_700_000_000.25  # the producer's clock says 2023: the node's stamp wins
    before_ms = int(time.time() * 1000)
    send(grouper_node, "src-time", message, grouped("g", "untimed"))
    after_ms = int(time.time() * 1000)
    rows = reader(grouper_spark, grouper_node, "src-time").load().selectExpr(
        "body", "unix_millis(enqueued_at) as ms").collect()
    assert [bytes(r.body) for r in rows] == [b"timed", b"untimed"]
    assert all(before_ms <= r.ms <= after_ms for r in rows), (before_ms, [r.ms for r in rows], after_ms)


def test_drain_consumes_in_group_order_and_leaves_the_queue_empty(grouper_spark, grouper_node):
    send(grouper_node, "src-drain", *interleaved(3, 4))
    rows = reader(grouper_spark, grouper_node, "src-drain", mode="drain", bodyType="string").load().collect()
    assert per_group(rows) == {f"g{g}": [f"g{g}:{s}" for s in range(4)] for g in range(3)}
    stats = queue_stats(grouper_node, "src-drain")
    assert (stats["depth_messages"], stats["acquired_messages"], stats["consumers"]) == (0, 0, 0)
    assert reader(grouper_spark, grouper_node, "src-drain", mode="drain").load().count() == 0


def test_max_messages_bounds_a_drain_and_the_rest_stays_queued(grouper_spark, grouper_node):
    send(grouper_node, "src-max", *interleaved(2, 5))
    rows = reader(grouper_spark, grouper_node, "src-max", mode="drain", maxMessages="4").load().collect()
    assert len(rows) == 4
    assert queue_stats(grouper_node, "src-max")["depth_messages"] == 6


def test_a_drain_larger_than_the_nodes_unsettled_cap_uses_several_links(grouper_spark, grouper_node):
    # linkUnsettledMax below the node's real cap (1000) makes the reader open a link per 7 messages
    send(grouper_node, "src-links", *[grouped(f"g{i}", f"m{i}") for i in range(20)])
    rows = reader(grouper_spark, grouper_node, "src-links", mode="drain", linkUnsettledMax="7").load().collect()
    assert sorted(r.body for r in rows) == sorted(f"m{i}".encode() for i in range(20))
    assert queue_stats(grouper_node, "src-links")["depth_messages"] == 0


def test_a_drain_split_over_partitions_reads_every_message_once(grouper_spark, grouper_node):
    send(grouper_node, "src-split", *interleaved(8, 5))
    df = reader(grouper_spark, grouper_node, "src-split", mode="drain", partitions="3", bodyType="string").load()
    assert df.rdd.getNumPartitions() == 3
    rows = df.collect()
    assert sorted(r.body for r in rows) == sorted(f"g{g}:{s}" for g in range(8) for s in range(5))
    assert queue_stats(grouper_node, "src-split")["depth_messages"] == 0


def wait_nothing_acquired(node, queue: str) -> dict:
    """Queue stats once no message is held by a consumer (a closing reader's releases have landed)."""
    deadline = time.monotonic() + WAIT_S
    while (stats := queue_stats(node, queue))["acquired_messages"] and time.monotonic() < deadline:
        time.sleep(0.05)
    return stats


@pytest.mark.parametrize("ending", ["closed early", "failed"])
def test_a_drain_read_that_does_not_complete_releases_its_messages_in_order(grouper_spark, grouper_node, ending):
    # the read task's own generator, driven as Spark's worker drives it: closed when Spark stops
    # reading early (a task killed or interrupted), or given the exception that failed the task
    from pipeline.options import parse_source
    from pipeline.source import read_share

    queue = f"src-incomplete-{ending.replace(' ', '-')}"
    send(grouper_node, queue, *interleaved(2, 3))
    options = parse_source({"nodes": grouper_node.amqp_address, "queue": queue, "mode": "drain",
                            "bodyType": "string"})
    rows = read_share(options, 0, 100, "test-reader")
    assert [next(rows)[1], next(rows)[1]] == ["g0:0", "g1:0"]
    assert queue_stats(grouper_node, queue)["acquired_messages"] == 6
    if ending == "closed early":
        rows.close()
    else:
        with pytest.raises(RuntimeError):
            rows.throw(RuntimeError("the task failed"))
    assert wait_nothing_acquired(grouper_node, queue)["depth_messages"] == 6
    again = reader(grouper_spark, grouper_node, queue, bodyType="string").load().collect()
    assert per_group(again) == {"g0": ["g0:0", "g0:1", "g0:2"], "g1": ["g1:0", "g1:1", "g1:2"]}


def test_drained_accepts_only_when_the_block_succeeds_and_releases_in_order_when_it_raises(
        grouper_spark, grouper_node):
    import pipeline

    send(grouper_node, "src-drained", *interleaved(2, 3))
    options = {"nodes": grouper_node.amqp_address, "queue": "src-drained", "bodyType": "string"}
    with pytest.raises(ValueError, match="the job failed"):
        with pipeline.drained(grouper_spark, **options) as df:
            assert df.count() == 6
            assert queue_stats(grouper_node, "src-drained")["acquired_messages"] == 6
            raise ValueError("the job failed")
    assert wait_nothing_acquired(grouper_node, "src-drained")["depth_messages"] == 6
    with pipeline.drained(grouper_spark, **options) as df:
        assert per_group(df.collect()) == {"g0": ["g0:0", "g0:1", "g0:2"], "g1": ["g1:0", "g1:1", "g1:2"]}
    assert queue_stats(grouper_node, "src-drained")["depth_messages"] == 0


def test_an_empty_queue_reads_as_no_rows_at_once(grouper_spark, grouper_node):
    send(grouper_node, "src-empty")  # attaching a producer creates the queue
    started = time.monotonic()
    assert reader(grouper_spark, grouper_node, "src-empty", mode="drain").load().count() == 0
    assert time.monotonic() - started < 10.0  # a drain round trip, not a timeout


def test_idle_timeout_waits_for_messages_sent_after_the_read_began(grouper_spark, grouper_node):
    send(grouper_node, "src-idle")

    def send_once_the_reader_is_attached():
        deadline = time.monotonic() + WAIT_S
        while queue_stats(grouper_node, "src-idle")["consumers"] == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        send(grouper_node, "src-idle", grouped("g", "late"))

    sender = threading.Thread(target=send_once_the_reader_is_attached, daemon=True)
    sender.start()
    rows = reader(grouper_spark, grouper_node, "src-idle", mode="drain", idleTimeoutMs="3000").load().collect()
    sender.join(WAIT_S)
    assert [bytes(r.body) for r in rows] == [b"late"]


def test_an_unknown_queue_is_refused_with_not_found_when_auto_create_is_off(grouper_spark, tmp_path):
    node = NodeProcess(tmp_path / "strict", "", ("--no-auto-create", "--no-fsync")).start()
    try:
        with pytest.raises(Exception) as failure:
            reader(grouper_spark, node, "nowhere").load().collect()
        text = str(failure.value)
        assert "amqp:not-found" in text and "'nowhere'" in text and node.amqp_address in text
    finally:
        node.kill()


def test_an_unreachable_node_fails_the_read_naming_it(grouper_spark):
    address = f"127.0.0.1:{closed_port()}"
    with pytest.raises(Exception) as failure:
        grouper_spark.read.format("grouper").options(nodes=address, queue="q").load().collect()
    assert f"cannot connect to the Grouper node at {address}" in str(failure.value)


@pytest.mark.parametrize("options, message", [
    ({"queue": "q"}, "'nodes': required"),
    ({"nodes": "127.0.0.1:1"}, "'queue': required"),
    ({"nodes": "127.0.0.1:1", "queue": "q", "mode": "peek"}, "'peek' is neither 'browse'"),
    ({"nodes": "127.0.0.1:1", "queue": "q", "partitions": "2"}, "a browse reads every message"),
    ({"nodes": "127.0.0.1:1", "queue": "q", "maxMessages": "lots"}, "'lots' is not an integer number of messages"),
    ({"nodes": "127.0.0.1:1", "queue": "q", "idleTimeoutMs": "-1"}, "-1 ms is out of range"),
    ({"nodes": "127.0.0.1:1", "queue": "q", "bodyType": "json"}, "'json' is neither 'binary' nor 'string'"),
    ({"nodes": "127.0.0.1:1", "queue": "q", "groupColumn": "g"}, "'groupcolumn': unknown source option"),
])
def test_bad_options_fail_naming_the_option(grouper_spark, options, message):
    with pytest.raises(Exception) as failure:
        grouper_spark.read.format("grouper").options(**options).load().collect()
    assert message in str(failure.value)
