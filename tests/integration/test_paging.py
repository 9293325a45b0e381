"""Paging message bodies to the journal, black-box: a real `grouper node` and proton clients.

- A durable queue filled past its memory budget pages bodies out (its queue listing and /metrics say
  how many bytes are paged), and several consumers then drain it with every group in order and every body whole.
- Past the node's record budget a queue's newest messages go cold (only their seqs in memory; the
  listing and /metrics count them); a group purge is refused, naming the budget; a kill -9 and a
  restart, which recovers the backlog cold, lose nothing; consumers drain it with every group in order.
  `grouper queue purge` reads a cold tail back and purges all of it, and none of it comes back after a
  kill -9 right after the command returned.
- A kill -9 while bodies are being paged in and out loses no accepted message: after the restart,
  which keeps only records past the node's budget, every message the consumer did not accept comes
  back (those it accepted without seeing them settled may or may not), none it saw settled does, and
  each group is in order.
"""

from __future__ import annotations

from node.admin.client import AdminClient
from tests.integration.clients import Client, group_message, queue_toml
from tests.integration.harness import wait_until
from tests.integration.test_node_endpoints import get, metric

QUEUE = "backlog"
BUDGET_BYTES = 64 << 10
GROUPS = [f"g{i}" for i in range(6)]
PAD = "x" * 300  # a few hundred bytes a message: a few thousand messages are several budgets


def _stats(node) -> dict:
    """The queue's row of `grouper queue list --json` (the admin call it makes, without a process per poll)."""
    with AdminClient(node.admin_address) as admin:
        return next(q for q in admin.list_queues() if q["name"] == QUEUE)


def _fill(node, per_group: int) -> list[tuple[str, int]]:
    sent = [(group, seq) for seq in range(1, per_group + 1) for group in GROUPS]
    with Client(node) as client:
        producer = client.producer(QUEUE)
        for start in range(0, len(sent), 200):
            producer.send(*(group_message(group, seq, pad=PAD) for group, seq in sent[start:start + 200]))
    return sent


def _check_order(keys: list[tuple[str, int]]) -> None:
    for group in GROUPS:
        seqs = [seq for g, seq in keys if g == group]
        assert seqs == sorted(seqs), f"group {group} out of order: {seqs[:40]}"


def _drain_in_order(node, sent: list[tuple[str, int]]) -> None:
    """Three consumers take everything sent, each body whole: nothing lost or twice, every group in order."""
    received: list[tuple[str, int]] = []
    with Client(node) as client:
        consumers = [client.consumer(QUEUE, f"worker{i}", credit=40) for i in range(3)]
        while len(received) < len(sent):
            assert client.wait_for(lambda: any(c.unread for c in consumers), 10.0), \
                f"nothing more arrived after {len(received)} of {len(sent)}: {_stats(node)}"
            for consumer in consumers:
                fresh = list(consumer.unread)
                consumer.unread.clear()
                for item in fresh:
                    assert item.message.properties["pad"] == PAD, f"{item} came back with a damaged body"
                consumer.accept(*fresh)
                consumer.flow(len(fresh))
                received.extend((item.group, item.seq) for item in fresh)
    assert sorted(received) == sorted(sent), "lost or duplicated messages"
    _check_order(received)


def test_a_backlog_past_its_budget_is_paged_and_drains_in_group_order_through_several_consumers(node_factory):
    node = node_factory(queue_toml(QUEUE, durable=True, memory_max_bytes=BUDGET_BYTES))
    refused = node.cli("queue", "add", "scratch", "--no-durable", "--memory-max-bytes", "1024")
    assert refused.returncode != 0 and "memory-max-bytes: 1024 bytes" in refused.stderr and "non-durable" in refused.stderr, \
        refused.stderr
    sent = _fill(node, per_group=300)  # 1,800 messages, ~650 KB: ten budgets
    filled = wait_until(lambda: (s := _stats(node))["resident_bytes"] <= BUDGET_BYTES and s,
                        "the queue's resident bytes to fall within its budget")
    assert filled["depth_messages"] == len(sent)
    assert filled["paged_bytes"] >= filled["depth_bytes"] - BUDGET_BYTES > 0
    status, text = get(node, "/metrics")
    assert status == 200
    assert metric(text, f'grouper_queue_paged_bytes{{queue="{QUEUE}"}}') > 0
    assert metric(text, f'grouper_queue_resident_bytes{{queue="{QUEUE}"}}') <= BUDGET_BYTES

    _drain_in_order(node, sent)
    drained = wait_until(lambda: (s := _stats(node))["depth_messages"] == 0 and s, "the queue to be empty")
    assert drained["paged_bytes"] == 0


def test_a_kill_while_paging_loses_no_accepted_message_and_keeps_group_order(node_factory):
    config = f"[node]\nmessage_memory_max_bytes = {BUDGET_BYTES}\n\n" + queue_toml(QUEUE, durable=True)
    node = node_factory(config)
    sent = _fill(node, per_group=300)  # every send accepted: each must survive the kill
    wait_until(lambda: _stats(node)["paged_bytes"] > 0, "bodies paged out under the node's budget")

    settled: set[tuple[str, int]] = set()
    accepted: set[tuple[str, int]] = set()
    client = Client(node)
    try:
        consumer = client.consumer(QUEUE, "worker", credit=50, settle_second=True)
        taken: list = []
        while len(taken) < len(sent) // 3:  # a third in: groups are paging bodies in as they go
            assert client.wait_for(lambda: bool(consumer.unread), 10.0), f"stalled at {len(taken)}"
            fresh = list(consumer.unread)
            consumer.unread.clear()
            consumer.accept(*fresh)
            consumer.flow(len(fresh))
            taken.extend(fresh)
        node.kill()
        try:
            client.settle_down(0.2)  # settlements already on the wire still count
        except Exception:
            pass  # the connection died with the node
        settled = {(item.group, item.seq) for item in taken if item.broker_settled}
        accepted = {(item.group, item.seq) for item in taken}  # those not seen settled may or may not return
    finally:
        try:
            client.close()
        except Exception:
            pass  # its connection died with the node

    node.start()
    # recovered cold (seqs only), then read back into the warm part, where bodies past the budget page out
    wait_until(lambda: _stats(node)["paged_bytes"] > 0, "bodies paged out again after the restart")
    back: list[tuple[str, int]] = []
    with Client(node) as client:
        consumers = [client.consumer(QUEUE, f"after{i}", credit=60) for i in range(2)]
        owed = set(sent) - accepted
        while not owed <= set(back):
            if not client.wait_for(lambda: any(c.unread for c in consumers), 10.0):
                break
            for consumer in consumers:
                fresh = list(consumer.unread)
                consumer.unread.clear()
                consumer.accept(*fresh)
                consumer.flow(len(fresh))
                back.extend((item.group, item.seq) for item in fresh)
    assert len(back) == len(set(back)), "duplicates after the restart"
    lost = sorted(set(sent) - accepted - set(back))
    assert not lost, f"{len(lost)} accepted messages lost: {lost[:10]}"
    assert not settled & set(back), "messages seen settled came back"
    _check_order(back)


def test_past_the_record_budget_a_backlog_waits_cold_and_survives_a_kill_in_group_order(node_factory):
    records_bytes = 64 << 10  # ~400 warm messages of these 6 groups (node/core/dispatch/cold.py counts 160 B each)
    node = node_factory(f"[node]\nrecord_memory_max_bytes = {records_bytes}\n\n" + queue_toml(QUEUE, durable=True))
    sent = _fill(node, per_group=300)
    filled = wait_until(lambda: (s := _stats(node))["cold_messages"] > 1000 and s, "most of the backlog to go cold")
    assert filled["depth_messages"] == len(sent)
    assert filled["resident_bytes"] < filled["depth_bytes"] // 2
    status, text = get(node, "/metrics")
    assert status == 200 and metric(text, f'grouper_queue_cold_messages{{queue="{QUEUE}"}}') > 1000
    refused = node.cli("group", "purge", QUEUE, "g1")
    assert refused.returncode != 0 and "record_memory_max_bytes" in refused.stderr, refused.stderr

    node.kill()
    node.start()
    restarted = wait_until(lambda: (s := _stats(node))["depth_messages"] == len(sent) and s, "the backlog back")
    assert restarted["cold_messages"] > 1000, f"recovery read every record despite the budget: {restarted}"
    # the oldest were read back up to the budget before the node served: none of its warm part is missing
    assert restarted["groups"] == len(GROUPS) and restarted["cold_messages"] < len(sent) - 300, restarted
    _drain_in_order(node, sent)
    drained = wait_until(lambda: (s := _stats(node))["depth_messages"] == 0 and s, "the queue to be empty")
    assert drained["cold_messages"] == 0 and drained["depth_bytes"] == 0


def test_a_queue_purge_reads_a_cold_tail_back_and_purges_every_message(node_factory):
    records_bytes = 16 << 10  # ~90 warm messages of these 6 groups: most of the 600 go cold
    node = node_factory(f"[node]\nrecord_memory_max_bytes = {records_bytes}\n\n" + queue_toml(QUEUE, durable=True))
    sent = _fill(node, per_group=100)
    wait_until(lambda: _stats(node)["cold_messages"] > 400, "most of the backlog to go cold")
    purged = node.cli("queue", "purge", QUEUE)
    node.kill()  # at once: "purged" means the removals are on disk (node/admin/flushes.py)
    assert purged.returncode == 0, purged.stderr
    assert purged.stdout.strip() == f"purged {len(sent)} messages from queue {QUEUE}"
    node.start()
    emptied = _stats(node)
    assert emptied["depth_messages"] == 0 and emptied["cold_messages"] == 0 and emptied["depth_bytes"] == 0
