"""Producer de-duplication seen by a real client (issue 31): a resend of a message-id or `_AMQ_DUPL_ID` that a
de-duplicating queue took is accepted and delivered once, also after the first copy was consumed and the
node was killed with SIGKILL and restarted; /metrics and the admin API count the resends; a queue without it
queues them all; a queue added at run time with dedup keeps it, and its ids, across the restart."""

from __future__ import annotations

from proton import Message

from node.admin.client import AdminClient
from node.core.dispatch.settings import QueueSettings
from tests.integration.clients import Client, queue_toml
from tests.integration.test_node_endpoints import get, metric

QUEUE = "payments"


def _message(body: str, message_id=None, *, durable: bool = True, **properties) -> Message:
    """`body` is NAME:N, as the test clients read bodies. Durable, as a JMS producer's PERSISTENT: a durable
    queue journals only durable messages, and their ids with them."""
    return Message(id=message_id, body=body, properties=properties or None, durable=durable)


def _bodies(client: Client, queue: str) -> list[str]:
    """Everything the queue delivers now, accepted and its removal on disk (the node settles second)."""
    consumer = client.consumer(queue, credit=50, settle_second=True)
    received = consumer.take_all()
    consumer.accept(*received)
    assert len(consumer.wait_broker_settled(received)) == len(received)
    consumer.close()
    return [str(item.message.body) for item in received]


def test_a_resend_is_accepted_and_delivered_once_even_after_a_kill_and_restart(node_factory):
    node = node_factory(queue_toml(QUEUE, dedup=True) + queue_toml("plain"))
    with Client(node) as client:
        producer = client.producer(QUEUE)
        producer.send(_message("first:1", "pay-1"), _message("resend:2", "pay-1"), _message("other:3", "pay-2"),
                      _message("artemis:4", "x-1", _AMQ_DUPL_ID="d-1"),
                      _message("artemis resend:5", "x-2", _AMQ_DUPL_ID="d-1"), _message("no id:6"),
                      _message("no id again:7"))
        assert _bodies(client, QUEUE) == ["first:1", "other:3", "artemis:4", "no id:6", "no id again:7"]
        client.producer("plain").send(_message("a:1", "pay-1"), _message("b:2", "pay-1"))
        assert _bodies(client, "plain") == ["a:1", "b:2"]
    status, text = get(node, "/metrics")
    assert status == 200 and metric(text, f'grouper_queue_dedup_dropped_messages_total{{queue="{QUEUE}"}}') == 2
    with AdminClient(node.admin_address) as admin:
        stats = {row["name"]: row for row in admin.list_queues()}
    assert (stats[QUEUE]["dedup_dropped_total"], stats["plain"]["dedup_dropped_total"]) == (2, 0)

    with AdminClient(node.admin_address) as admin:  # a queue added at run time: its settings are journalled
        admin.add_queue(QueueSettings(name="refunds", dedup=True, dedup_window_ms=60_000))
    with Client(node) as client:
        client.producer("refunds").send(_message("refund:11", "ref-1"), _message("transient:13", "tr-1", durable=False))

    node.kill()  # SIGKILL: the marks must come back from the journal, their messages consumed already
    node.start()
    with Client(node) as client:
        client.producer(QUEUE).send(_message("after restart:8", "pay-1"),
                                    _message("artemis after:9", "x-9", _AMQ_DUPL_ID="d-1"), _message("new:10", "pay-3"))
        assert _bodies(client, QUEUE) == ["new:10"]
        # a message sent non-durable is lost with the node, and so is its id: its resend is queued
        client.producer("refunds").send(_message("refund again:12", "ref-1"), _message("transient again:14", "tr-1"))
        assert _bodies(client, "refunds") == ["refund:11", "transient again:14"]
