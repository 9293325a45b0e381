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


@pytest.mark.parametrize("fields", [
    dict(group="g1", body="text"),
    dict(group=None, body=b"\x00\x01", durable=False),
    dict(group="g" * 300, body="x" * 70_000, message_id="id-" + "9" * 300, creation_ms=1_700_000_000_123),
    dict(group="g2", body=None, group_header="tenant", properties={"k": "v"}),
    dict(group=None, body="b", message_id="only-an-id"),
    dict(group="g3", body=b"y" * 300, properties={"small": 7, "big": -2**40, "f": 1.5, "yes": True, "no": False,
                                                  "none": None, "raw": b"\x01", "long": "z" * 300}),
])
def test_every_message_layout_the_sink_encodes_decodes_with_protons_own_decoder(fields):
    from pipeline import messages

    decoded = Message()
    decoded.decode(messages.encode(**fields))
    group, header = fields.get("group"), fields.get("group_header", "")
    expected_properties = dict(fields.get("properties") or {})
    if header and group is not None:
        expected_properties[header] = group
    body = decoded.body
    assert (bytes(body) if isinstance(body, memoryview) else body) == fields["body"]
    assert decoded.group_id == (None if header else group)
    assert (decoded.properties or {}) == expected_properties
    assert decoded.id == fields.get("message_id")
    assert decoded.creation_time == fields.get("creation_ms", 0) / 1000
    assert decoded.durable == fields.get("durable", True)


def test_a_producer_never_holds_more_unsettled_deliveries_than_its_window(grouper_node):
    from pipeline import messages
    from pipeline.amqp_client import AmqpConnection, Sender

    connection = AmqpConnection(grouper_node.amqp_address, 10_000, "window-test")
    try:
        producer = Sender(connection, "sink-window", "window-test", window_messages=3)
        most_unsettled = 0
        for seq in range(200):
            producer.send(messages.encode("g", str(seq)))
            most_unsettled = max(most_unsettled, producer.unsettled)
        producer.flush()
        assert (most_unsettled, producer.accepted, producer.unsettled) == (3, 200, 0)
    finally:
        connection.close()
    assert [m.body for m in consume(grouper_node, "sink-window", 200)] == [str(seq) for seq in range(200)]


def test_a_sender_or_receiver_used_after_its_connection_closed_raises_a_client_error(grouper_node):
    """close() frees proton's objects: a later send or settle is refused, never run on freed memory."""
    from pipeline import messages
    from pipeline.amqp_client import Acquisition, AmqpConnection, ClientError, Sender

    connection = AmqpConnection(grouper_node.amqp_address, 10_000, "closed-test")
    sender = Sender(connection, "sink-closed", "closed-test", window_messages=10)
    sender.send(messages.encode("g", "before"))
    sender.flush()
    acquisition = Acquisition(connection, "sink-closed", False, 10, 1, "closed-test-reader")
    taken = acquisition.take(1, 1000)
    connection.close()
    with pytest.raises(ClientError, match="closed by this client"):
        sender.send(messages.encode("g", "after"))
    with pytest.raises(ClientError, match="closed by this client"):
        acquisition.accept(taken)
    assert [m.body for m in consume(grouper_node, "sink-closed", 1)] == ["before"]  # released by the close


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


# ---- per-group order at scale -------------------------------------------------------------------

MILLION_ROWS = 1_000_000
MILLION_GROUPS = 10_000
CONSUMER_LINKS = 4
CONSUMER_CREDIT = 1000  # per link; topped up when half is used
MILLION_TIMEOUT_S = 900.0  # the whole write-and-consume must finish within this


class GroupOrderCheck:
    """Presettled consumers (one connection, one thread) that check per-group order as messages arrive.

    Presettled: the node counts a message delivered when it sends it, which costs it a quarter of
    what an accept does; order is all this check needs. Bodies are decoded with proton's decoder,
    so the check does not trust the sink's encoder."""

    def __init__(self, node, queue: str, expected: int):
        from pipeline.amqp_client import AmqpConnection

        self.connection = AmqpConnection(node.amqp_address, 30_000, "order-check")
        self.expected = expected
        self.received = 0
        self.next_seq: dict[str, int] = {}  # group -> the sequence number it must deliver next
        self.owner: dict[str, str] = {}  # group -> the consumer link that got it
        self.violations: list[str] = []
        self.links = [self._attach(queue, f"order-check-{index}") for index in range(CONSUMER_LINKS)]
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="order-check", daemon=True)

    def _attach(self, queue: str, name: str):
        from node.amqp.engine import lib

        connection = self.connection
        link = connection.endpoint.receiver(name, queue, open_now=False)
        lib.pn_link_set_snd_settle_mode(link, lib.PN_SND_SETTLED)
        owner = _OrderedLink(self, link, name)
        connection.attach(link, owner, f"consumer {name}")
        lib.pn_link_flow(link, CONSUMER_CREDIT)
        return owner

    def _run(self) -> None:
        try:
            deadline = time.monotonic() + MILLION_TIMEOUT_S
            while self.received < self.expected and time.monotonic() < deadline:
                self.connection.check()
                self.connection.pump(0.5)
        except BaseException as error:  # reported by the test thread
            self.error = error

    def record(self, consumer: str, group: str, seq: int) -> None:
        self.received += 1
        expected = self.next_seq.get(group, 0)
        if seq != expected and len(self.violations) < 20:
            self.violations.append(f"{group}: got {seq} after {expected - 1} on {consumer}")
        self.next_seq[group] = seq + 1
        owner = self.owner.setdefault(group, consumer)
        if owner != consumer and len(self.violations) < 20:
            self.violations.append(f"{group}: on {owner} and {consumer}")

    def close(self) -> None:
        self.connection.close()


class _OrderedLink:
    def __init__(self, check: GroupOrderCheck, link, name: str):
        from node.amqp.engine import ffi, lib

        self.lib, self.ffi = lib, ffi
        self.check = check
        self.link = link
        self.name = name
        self.detached = False
        self.message = Message()

    def on_delivery(self, delivery) -> None:
        lib, ffi, link = self.lib, self.ffi, self.link
        if lib.pn_link_current(link) != delivery or lib.pn_delivery_partial(delivery):
            return
        size = lib.pn_delivery_pending(delivery)
        buffer = ffi.new("char[]", size)
        lib.pn_link_recv(link, buffer, size)
        lib.pn_link_advance(link)
        lib.pn_delivery_settle(delivery)
        message = self.message
        message.decode(ffi.unpack(buffer, size))
        self.check.record(self.name, message.group_id, int(message.body))
        credit = lib.pn_link_credit(link)
        if credit < CONSUMER_CREDIT // 2:
            lib.pn_link_flow(link, CONSUMER_CREDIT - credit)

    def on_detached(self) -> None:
        self.detached = True


def test_a_million_rows_in_ten_thousand_groups_reach_consumers_in_group_order(grouper_spark, tmp_path):
    """write_grouped sends each group from one task, sorted; consumers see every group in order."""
    from pyspark.sql import functions as F

    config = "[[queue]]\nname = \"million\"\ndurable = false\ndepth_max_messages = 0\n"
    node = NodeProcess(tmp_path / "million", config, ("--no-fsync",)).start()
    check = GroupOrderCheck(node, "million", MILLION_ROWS)
    try:
        check.thread.start()
        ids = grouper_spark.range(0, MILLION_ROWS, numPartitions=2)
        # ids ascend while each group's `seq` descends, and spark.range spreads every group over both
        # partitions: only the repartition by group and the sort make the groups arrive in order
        last_seq = MILLION_ROWS // MILLION_GROUPS - 1
        seq = (F.lit(last_seq) - F.floor(ids.id / MILLION_GROUPS)).cast("long")
        rows = ids.select(F.concat(F.lit("g"), (ids.id % MILLION_GROUPS).cast("string")).alias("group"),
                          seq.alias("seq"), seq.cast("string").alias("body"))
        started = time.monotonic()
        pipeline.write_grouped(rows, group="group", order_by="seq", partitions=2,
                               nodes=node.amqp_address, queue="million")
        written_s = time.monotonic() - started
        check.thread.join(MILLION_TIMEOUT_S)
        consumed_s = time.monotonic() - started
        print(f"\n1M rows: written in {written_s:.1f} s, all consumed after {consumed_s:.1f} s")
        assert check.error is None, check.error
        assert check.received == MILLION_ROWS
        assert check.violations == []
        assert len(check.next_seq) == MILLION_GROUPS
        assert set(check.next_seq.values()) == {MILLION_ROWS // MILLION_GROUPS}
    finally:
        check.close()
        node.kill()


def test_write_grouped_through_every_node_of_a_cluster_keeps_each_group_in_order(grouper_spark, tmp_path):
    """Task i writes to node i; groups live where the consumers are, so nodes 1 and 2 forward."""
    from pyspark.sql import functions as F

    from tests.integration.cluster import Cluster

    rows_count, groups_count = 6000, 60
    cluster = Cluster(tmp_path / "cluster", 3, "", ("--no-fsync",)).start()
    check = None
    try:
        check = GroupOrderCheck(cluster.nodes[0], "clustered", rows_count)
        cluster.wait_consumers("clustered", {0: CONSUMER_LINKS, 1: 0, 2: 0})
        check.thread.start()
        ids = grouper_spark.range(0, rows_count, numPartitions=3)
        seq = (F.lit(rows_count // groups_count - 1) - F.floor(ids.id / groups_count)).cast("long")
        rows = ids.select(F.concat(F.lit("g"), (ids.id % groups_count).cast("string")).alias("group"),
                          seq.alias("seq"), seq.cast("string").alias("body"))
        nodes = ",".join(node.amqp_address for node in cluster.nodes)
        pipeline.write_grouped(rows, group="group", order_by="seq", partitions=3, nodes=nodes, queue="clustered")
        check.thread.join(WAIT_S * 4)
        assert check.error is None, check.error
        assert (check.received, check.violations, len(check.next_seq)) == (rows_count, [], groups_count)
    finally:
        if check is not None:
            check.close()
        cluster.kill_all()
