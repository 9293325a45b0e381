"""The "grouper" streaming sink and source against a real node.

The sink is fed from a file stream (one file per micro-batch); the source's batches are checked
through Spark's memory sink and foreachBatch. Every wait on a query is bounded.
"""

from __future__ import annotations

import json
import time

import pytest

from tests.pipeline.test_sink import closed_port, consume
from tests.pipeline.test_source import grouped, interleaved, per_group, queue_stats, send, wait_nothing_acquired

QUERY_TIMEOUT_S = 120.0


def write_json_lines(path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def file_stream(spark, directory):
    return (spark.readStream.schema("group string, seq long, body string")
            .option("maxFilesPerTrigger", "1").json(str(directory)))


def test_the_streaming_sink_writes_each_micro_batch_in_order(grouper_spark, grouper_node, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    write_json_lines(source / "1.json", [{"group": f"g{i % 2}", "seq": i // 2, "body": f"g{i % 2}:{i // 2}"}
                                         for i in range(6)])
    write_json_lines(source / "2.json", [{"group": f"g{i % 2}", "seq": 3 + i // 2, "body": f"g{i % 2}:{3 + i // 2}"}
                                         for i in range(6)])
    query = (file_stream(grouper_spark, source).writeStream.format("grouper")
             .options(nodes=grouper_node.amqp_address, queue="stream-sink", propertyColumns="seq")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(QUERY_TIMEOUT_S)
    assert query.exception() is None
    assert [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]] == [6, 6]
    received = consume(grouper_node, "stream-sink", 12)
    bodies: dict[str, list[str]] = {}
    for message in received:
        bodies.setdefault(message.group_id, []).append(message.body)
    assert bodies == {g: [f"{g}:{s}" for s in range(6)] for g in ("g0", "g1")}


def test_a_refused_row_fails_the_streaming_query_with_the_nodes_condition(grouper_spark, grouper_node, tmp_path):
    source = tmp_path / "in"
    source.mkdir()
    write_json_lines(source / "1.json", [{"group": "x" * 300, "seq": 0, "body": "too long a group id"}])
    query = (file_stream(grouper_spark, source).writeStream.format("grouper")
             .options(nodes=grouper_node.amqp_address, queue="stream-refused")
             .option("checkpointLocation", str(tmp_path / "checkpoint"))
             .trigger(availableNow=True).start())
    with pytest.raises(Exception) as failure:
        query.awaitTermination(QUERY_TIMEOUT_S)
    assert "amqp:invalid-field" in str(failure.value)


def grouper_stream(spark, node, queue: str, **options):
    return (spark.readStream.format("grouper")
            .options(nodes=node.amqp_address, queue=queue, bodyType="string", **options).load())


def test_the_streaming_source_reads_bounded_batches_in_group_order_and_accepts_them(grouper_spark, grouper_node,
                                                                                     tmp_path):
    send(grouper_node, "stream-source", *interleaved(3, 8))
    query = (grouper_stream(grouper_spark, grouper_node, "stream-source", maxMessagesPerBatch="10", partitions="2")
             .writeStream.format("memory").queryName("stream_source_rows")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    try:
        query.processAllAvailable()
        rows = grouper_spark.sql("select * from stream_source_rows").collect()
        sizes = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"]]
    finally:
        query.stop()
    assert per_group(rows) == {f"g{g}": [f"g{g}:{s}" for s in range(8)] for g in range(3)}
    assert sizes == [10, 10, 4]
    stats = wait_nothing_acquired(grouper_node, "stream-source")
    assert stats["depth_messages"] == 0  # every committed batch was accepted, the last one included


def test_a_failed_micro_batch_releases_its_messages_in_order_for_the_next_query(grouper_spark, grouper_node,
                                                                                 tmp_path):
    send(grouper_node, "stream-failed", *interleaved(2, 3))

    def fail(batch, batch_id):
        raise ValueError(f"batch {batch_id} could not be stored")

    query = (grouper_stream(grouper_spark, grouper_node, "stream-failed").writeStream.foreachBatch(fail)
             .option("checkpointLocation", str(tmp_path / "first")).start())
    with pytest.raises(Exception, match="could not be stored"):
        query.awaitTermination(QUERY_TIMEOUT_S)
    assert wait_nothing_acquired(grouper_node, "stream-failed")["depth_messages"] == 6

    seen = []
    query = (grouper_stream(grouper_spark, grouper_node, "stream-failed")
             .writeStream.foreachBatch(lambda batch, batch_id: seen.extend(batch.collect()))
             .option("checkpointLocation", str(tmp_path / "second")).start())
    try:
        query.processAllAvailable()
    finally:
        query.stop()
    assert per_group(seen) == {"g0": ["g0:0", "g0:1", "g0:2"], "g1": ["g1:0", "g1:1", "g1:2"]}
    assert wait_nothing_acquired(grouper_node, "stream-failed")["depth_messages"] == 0


def test_a_streaming_source_on_an_unreachable_node_fails_the_query_naming_it(grouper_spark, tmp_path):
    address = f"127.0.0.1:{closed_port()}"
    query = (grouper_spark.readStream.format("grouper").options(nodes=address, queue="q").load()
             .writeStream.format("memory").queryName("stream_unreachable")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    with pytest.raises(Exception) as failure:
        query.awaitTermination(QUERY_TIMEOUT_S)
    assert f"cannot connect to the Grouper node at {address}" in str(failure.value)


def test_a_streaming_read_refuses_browse_mode(grouper_spark, grouper_node, tmp_path):
    with pytest.raises(Exception) as failure:
        query = (grouper_stream(grouper_spark, grouper_node, "stream-browse", mode="browse")
                 .writeStream.format("memory").queryName("stream_browse")
                 .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
        query.awaitTermination(QUERY_TIMEOUT_S)
    assert "a streaming read always consumes" in str(failure.value)
