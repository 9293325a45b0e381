"""The engine loop's trace lines (node/amqp/tracer.py), judged by the checker as client logs are."""

from __future__ import annotations

from types import SimpleNamespace

from proton import Message as AmqpMessage

from node.amqp.tracer import Tracer
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings
from tests.drills.checker import check


class Clock:
    def __init__(self):
        self.now_ms = 1000

    def __call__(self) -> int:
        self.now_ms += 1
        return self.now_ms


class Writer:
    def __init__(self):
        self.lines = []

    def submit(self, lines):
        self.lines += lines


def tracer_for(*queues: QueueSettings) -> Tracer:
    broker = SimpleNamespace(queues={settings.name: SimpleNamespace(settings=settings) for settings in queues})
    return Tracer("node-a", broker, Writer(), Clock())


def message(group: str, producer: str | None, sequence: int | None, delivery_count: int = 0) -> Message:
    properties = {key: value for key, value in (("producer", producer), ("sequence", sequence)) if value is not None}
    encoded = AmqpMessage(body="x", properties=properties or None, group_id=group).encode()
    made = Message(encoded, group)
    made.delivery_count = delivery_count
    return made


def test_only_a_queue_with_trace_on_is_traced():
    tracer = tracer_for(QueueSettings("orders", trace=True), QueueSettings("plain"))
    assert tracer.traced("orders") and not tracer.traced("plain") and not tracer.traced("unknown")


def test_an_accepted_send_and_its_acceptance_read_as_client_logs_do():
    tracer = tracer_for(QueueSettings("orders", trace=True))
    sent = message("g1", "p0", 1)
    tracer.send_arrived("send-1", "orders", "g1", sent.payload, 990)
    tracer.send_settled("send-1", None)
    tracer.enqueued("orders", sent)
    tracer.attached(7, "container/c0", "orders")
    tracer.delivered(7, "container/c0", "delivery-1", "orders", sent, settled=False)
    tracer.delivery_settled(7, "delivery-1", "accepted", on_disk_later=True)
    assert [line["kind"] for line in tracer.lines] == ["send", "enqueue", "attach"]  # waits for the disk
    tracer.delivery_confirmed(7, "delivery-1", True)
    tracer.flush()
    lines = tracer.writer.lines
    send, delivery = lines[0], lines[-1]
    assert send == {"kind": "send", "producer": "p0", "node": "node-a", "queue": "orders", "group": "g1",
                    "sequence": 1, "sent_ms": 990, "settled_ms": send["settled_ms"], "outcome": "accepted",
                    "condition": None}
    assert (delivery["consumer"], delivery["outcome"], delivery["settle_confirmed"], delivery["delivery_count"]) == (
        "container/c0", "accepted", True, 0)
    assert delivery["received_ms"] < delivery["settled_ms"] < delivery["confirmed_ms"]
    report = check([line for line in lines if line["kind"] == "send"],
                   [line for line in lines if line["kind"] == "delivery"])
    assert report.ok and (report.accepted, report.delivered, report.lost) == (1, 1, [])


def test_a_refused_send_carries_its_condition():
    tracer = tracer_for(QueueSettings("orders", trace=True))
    tracer.send_arrived("send-1", "orders", "g1", message("g1", "p0", 1).payload, 990)
    tracer.send_settled("send-1", ("amqp:resource-limit-exceeded", "queue orders is full"))
    assert tracer.lines[0]["outcome"] == "rejected"
    assert (tracer.lines[0]["condition"], tracer.lines[0]["description"]) == (
        "amqp:resource-limit-exceeded", "queue orders is full")


def test_a_link_ending_drops_what_it_held_and_leaves_an_acceptance_waiting_for_the_disk_unconfirmed():
    tracer = tracer_for(QueueSettings("orders", trace=True))
    tracer.attached(7, "container/c0", "orders")
    tracer.delivered(7, "container/c0", "d1", "orders", message("g1", "p0", 1), settled=False)
    tracer.delivered(7, "container/c0", "d2", "orders", message("g1", "p0", 2), settled=False)
    tracer.delivery_settled(7, "d1", "accepted", on_disk_later=True)
    tracer.detached(7, "container/c0", "connection closed")
    tracer.delivery_confirmed(7, "d1", True)  # after the link: written already, nothing more
    deliveries = {line["sequence"]: line for line in tracer.lines if line["kind"] == "delivery"}
    assert (deliveries[1]["outcome"], deliveries[1]["settle_confirmed"]) == ("accepted", False)
    assert (deliveries[2]["outcome"], deliveries[2]["settle_confirmed"]) == ("dropped", False)
    assert tracer.lines[-1]["kind"] == "detach" and tracer.lines[-1]["condition"] == "connection closed"
    assert len(tracer.lines) == 4 and not tracer.deliveries


def test_a_released_delivery_and_its_redelivery_are_two_lines_with_their_counts():
    tracer = tracer_for(QueueSettings("orders", trace=True))
    first, again = message("g1", "p0", 1), message("g1", "p0", 1, delivery_count=1)
    tracer.delivered(7, "c", "d1", "orders", first, settled=False)
    tracer.delivery_settled(7, "d1", "released", on_disk_later=False)
    tracer.delivered(7, "c", "d2", "orders", again, settled=False)
    tracer.delivery_settled(7, "d2", "accepted", on_disk_later=False)
    assert [(line["outcome"], line["delivery_count"]) for line in tracer.lines] == [("released", 0), ("accepted", 1)]


def test_a_presettled_delivery_is_an_acceptance_at_once_and_a_message_without_identity_has_nulls():
    tracer = tracer_for(QueueSettings("orders", trace=True))
    tracer.delivered(7, "c", "d1", "orders", message("g1", None, None), settled=True)
    line = tracer.lines[0]
    assert (line["producer"], line["sequence"], line["outcome"], line["settle_confirmed"]) == (
        None, None, "accepted", True)


def test_trace_is_left_out_of_an_untraced_queue_record_for_older_nodes():
    assert "trace" not in QueueSettings("plain").to_dict()
    assert QueueSettings.from_dict(QueueSettings("orders", trace=True).to_dict()).trace


def test_a_multicast_send_has_a_line_per_traced_copy_all_with_its_one_outcome():
    tracer = tracer_for(QueueSettings("prices.a", trace=True), QueueSettings("prices.b", trace=True))
    payload = message("IBM", "p0", 1).payload
    tracer.send_arrived("send-1", "prices.a", "IBM", payload, 990)
    tracer.send_arrived("send-1", "prices.b", "IBM", payload, 990)
    tracer.send_settled("send-1", None)
    assert [(line["queue"], line["outcome"]) for line in tracer.lines] == [
        ("prices.a", "accepted"), ("prices.b", "accepted")]
    assert not tracer.sends
