"""Admin removals of a durable queue are on disk when the command returns, black-box: a real `grouper
node`, the `grouper` CLI and proton clients.

- `grouper queue purge` answers "purged N" only once its REMOVE records are written: a kill -9 right
  after the command returned, and a restart, bring none of them back.
- The same holds for `grouper group purge`, and messages sent after a purge are stored as ever: after
  the kill and restart exactly those not purged come back, every group in order.
- `grouper group move` answers once the copies and the removals are written: after a kill -9 the moved
  messages are at the destination only.
"""

from __future__ import annotations

from node.admin.client import AdminClient
from tests.integration.clients import Client, group_message, parse_body, queue_toml

QUEUE = "orders"
DESTINATION = "archive"
GROUPS = [f"g{i}" for i in range(6)]


def _depths(node) -> dict[str, int]:
    with AdminClient(node.admin_address) as admin:
        return {row["name"]: row["depth_messages"] for row in admin.list_queues()}


def _send(node, per_group: int, first_seq: int = 1, groups: list[str] = GROUPS) -> list[tuple[str, int]]:
    sent = [(group, seq) for seq in range(first_seq, first_seq + per_group) for group in groups]
    with Client(node) as client:
        producer = client.producer(QUEUE)
        for start in range(0, len(sent), 200):
            producer.send(*(group_message(group, seq) for group, seq in sent[start:start + 200]))
    return sent


def _receive(node, queue: str, count: int) -> list[tuple[str, int]]:
    """Exactly `count` messages of `queue` (a quiet period after them catches any extra one), accepted."""
    with Client(node) as client:
        consumer = client.consumer(queue, "drain", credit=count + 1)
        received = client.collect([consumer], count)
        consumer.accept(*received)
    return [parse_body(item.message) for item in received]


def _purged_then_killed(node, *command: str) -> str:
    """Run `grouper COMMAND`, kill -9 the node the moment it returns, restart it; the command's output."""
    result = node.cli(*command)
    node.kill()
    assert result.returncode == 0, result.stderr
    node.start()
    return result.stdout.strip()


def test_a_queue_purge_comes_back_neither_after_a_kill_right_after_it_nor_takes_later_sends(node_factory):
    node = node_factory(queue_toml(QUEUE, durable=True))
    sent = _send(node, per_group=100)
    assert _purged_then_killed(node, "queue", "purge", QUEUE) == f"purged {len(sent)} messages from queue {QUEUE}"
    assert _depths(node)[QUEUE] == 0

    later = _send(node, per_group=5, first_seq=101)  # after the purge: stored, as every send
    output = _purged_then_killed(node, "group", "purge", QUEUE, "g1")
    assert output.startswith("purged 5 messages"), output
    kept = [key for key in later if key[0] != "g1"]
    assert _depths(node)[QUEUE] == len(kept)
    received = _receive(node, QUEUE, len(kept))
    assert sorted(received) == sorted(kept)
    for group in GROUPS:
        seqs = [seq for g, seq in received if g == group]
        assert seqs == sorted(seqs), f"group {group} out of order: {seqs}"


def test_a_group_move_is_at_its_destination_only_after_a_kill_right_after_it(node_factory):
    node = node_factory(queue_toml(QUEUE, durable=True) + "\n" + queue_toml(DESTINATION, durable=True))
    sent = _send(node, per_group=50)
    output = _purged_then_killed(node, "group", "move", QUEUE, "g2", DESTINATION)
    assert output.startswith("moved 50 messages"), output
    assert _depths(node) == {QUEUE: len(sent) - 50, DESTINATION: 50}
    assert _receive(node, DESTINATION, 50) == [("g2", seq) for seq in range(1, 51)]
