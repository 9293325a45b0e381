"""The "grouper" sink against a real node: what arrives, what is refused, and per-group order at scale.

Messages are read back with plain proton clients, never with the pipeline's own source.
"""

from __future__ import annotations

import socket
import threading
import time

import pytest
from proton import Message
from proton.utils import BlockingConnection

import pipeline
from tests.integration.harness import NodeProcess

WAIT_S = 30.0


def consume(node, queue: str, count: int, timeout_s: float = WAIT_S) -> list[Message]:
    """Exactly `count` messages from `queue`, accepted, in arrival order; then checks nothing more is there."""
    connection = BlockingConnection(node.url, timeout=timeout_s)
    try:
        receiver = connection.create_receiver(queue, credit=min(count + 1, 1000))
        received = []
        for _ in range(count):
            received.append(receiver.receive(timeout=timeout_s))
            receiver.accept()
        with pytest.raises(Exception):
            receiver.receive(timeout=0.3)  # nothing beyond `count`
        return received
    finally:
        connection.close()


def sink_options(node, queue: str, **extra) -> dict:
    return {"nodes": node.amqp_address, "queue": queue, **extra}


def closed_port() -> int:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    listener.close()
    return port


def test_rows_arrive_with_group_body_properties_message_id_and_durable_header(grouper_spark, grouper_node):
    rows = [("g1", "a", 1, True, "k-1"), ("g2", "b", 2, False, "k-2"), (None, "c", 3, None, "k-3")]
    df = grouper_spark.createDataFrame(rows, "grp string, text string, n long, flag boolean, key string")
    (df.coalesce(1).write.format("grouper").mode("append")
     .options(**sink_options(grouper_node, "sink-fields", groupColumn="grp", bodyColumn="text",
                             propertyColumns="n, flag", messageIdColumn="key"))
     .save())
    received = consume(grouper_node, "sink-fields", 3)
    assert [(m.group_id, m.body, m.properties, m.id, m.durable) for m in received] == [
        ("g1", "a", {"n": 1, "flag": True}, "k-1", True),
        ("g2", "b", {"n": 2, "flag": False}, "k-2", True),
        (None, "c", {"n": 3, "flag": None}, "k-3", True),
    ]
    assert all(m.creation_time > 0 for m in received)


def test_binary_bodies_travel_as_data_sections_and_durable_false_clears_the_header(grouper_spark, grouper_node):
    df = grouper_spark.createDataFrame([("g", bytearray(b"\x00\xffraw"))], "group string, body binary")
    (df.write.format("grouper").mode("append")
     .options(**sink_options(grouper_node, "sink-binary", durable="false")).save())
    [message] = consume(grouper_node, "sink-binary", 1)
    assert bytes(message.body) == b"\x00\xffraw"
    assert message.inferred  # a data section, not an amqp-value
    assert not message.durable


def test_group_header_puts_the_group_in_that_application_property(grouper_spark, grouper_node):
    df = grouper_spark.createDataFrame([("g7", "x")], "group string, body string")
    (df.write.format("grouper").mode("append")
     .options(**sink_options(grouper_node, "sink-header", groupHeader="JMSXGroupID")).save())
    [message] = consume(grouper_node, "sink-header", 1)
    assert message.group_id is None
    assert message.properties == {"JMSXGroupID": "g7"}


def test_a_refused_delivery_fails_the_task_with_the_nodes_condition(grouper_spark, grouper_node):
    too_long = "x" * 300  # the node's default group-id-length-max-chars is 255
    df = grouper_spark.createDataFrame([("ok", "1"), (too_long, "2")], "group string, body string").coalesce(1)
    with pytest.raises(Exception) as failure:
        df.write.format("grouper").mode("append").options(**sink_options(grouper_node, "sink-refused")).save()
    text = str(failure.value)
    assert "amqp:invalid-field" in text and "sink-refused" in text and grouper_node.amqp_address in text
    [first] = consume(grouper_node, "sink-refused", 1)  # the row before it was accepted and stays
    assert first.body == "1"


def test_the_next_node_is_used_when_the_first_is_unreachable(grouper_spark, grouper_node):
    df = grouper_spark.createDataFrame([("g", "only")], "group string, body string").coalesce(1)
    nodes = f"127.0.0.1:{closed_port()},{grouper_node.amqp_address}"
    df.write.format("grouper").mode("append").options(nodes=nodes, queue="sink-failover").save()
    assert [m.body for m in consume(grouper_node, "sink-failover", 1)] == ["only"]


def test_an_unreachable_node_fails_the_write_naming_it(grouper_spark):
    address = f"127.0.0.1:{closed_port()}"
    df = grouper_spark.createDataFrame([("g", "x")], "group string, body string").coalesce(1)
    with pytest.raises(Exception) as failure:
        df.write.format("grouper").mode("append").options(nodes=address, queue="q", timeoutMs="2000").save()
    assert f"cannot connect to the Grouper node at {address}" in str(failure.value)


def test_an_unknown_queue_is_refused_with_not_found_when_auto_create_is_off(grouper_spark, tmp_path):
    node = NodeProcess(tmp_path / "strict", "", ("--no-auto-create", "--no-fsync")).start()
    try:
        df = grouper_spark.createDataFrame([("g", "x")], "group string, body string").coalesce(1)
        with pytest.raises(Exception) as failure:
            df.write.format("grouper").mode("append").options(nodes=node.amqp_address, queue="nowhere").save()
        text = str(failure.value)
        assert "amqp:not-found" in text and "'nowhere'" in text
    finally:
        node.kill()


@pytest.mark.parametrize("options, columns, message", [
    ({"queue": "q"}, "group string, body string", "'nodes': required"),
    ({"nodes": "localhost", "queue": "q"}, "group string, body string", "'localhost' is not HOST:PORT"),
    ({"nodes": "127.0.0.1:1"}, "group string, body string", "'queue': required"),
    ({"nodes": "127.0.0.1:1", "queue": "q"}, "group int, body string", "column 'group' is int; it must be string"),
    ({"nodes": "127.0.0.1:1", "queue": "q"}, "group string, payload string", "no column 'body'"),
    ({"nodes": "127.0.0.1:1", "queue": "q", "bodyColumn": "n"}, "group string, n int", "'n' is int"),
    ({"nodes": "127.0.0.1:1", "queue": "q", "propertyColumns": "m"}, "group string, body string, m map<string,int>",
     "column 'm' is map<string,int>"),
    ({"nodes": "127.0.0.1:1", "queue": "q", "groupColum": "g"}, "group string, body string",
     "'groupcolum': unknown sink option"),
    ({"nodes": "127.0.0.1:1", "queue": "q", "unsettledMaxMessages": "0"}, "group string, body string",
     "0 messages is out of range; use 1..100000 messages"),
    ({"nodes": "127.0.0.1:1", "queue": "q", "durable": "yes"}, "group string, body string", "'yes' is not true or false"),
])
def test_bad_options_fail_before_any_task_naming_the_option(grouper_spark, options, columns, message):
    df = grouper_spark.createDataFrame([], columns)
    with pytest.raises(Exception) as failure:
        df.write.format("grouper").mode("append").options(**options).save()
    assert message in str(failure.value)


def test_overwrite_is_refused(grouper_spark):
    df = grouper_spark.createDataFrame([], "group string, body string")
    with pytest.raises(Exception) as failure:
        df.write.format("grouper").mode("overwrite").options(nodes="127.0.0.1:1", queue="q").save()
    assert "cannot be overwritten" in str(failure.value)


def test_write_grouped_rejects_an_unknown_group_column(grouper_spark):
    df = grouper_spark.createDataFrame([], "group string, body string")
    with pytest.raises(ValueError, match="group='symbol' is not a column"):
        pipeline.write_grouped(df, group="symbol", order_by="body", nodes="127.0.0.1:1", queue="q")
