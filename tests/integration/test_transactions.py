"""AMQP 1.0 local transactions on one node, driven by python-qpid-proton's transaction API (issue 31).

What a user sees: sends inside a transaction appear at commit, in order, and never after a rollback;
a consumer's transactional accepts take effect at commit; a rollback gives the messages back to their
groups, in order, with the delivery count raised; a connection dropped mid-transaction rolls it back.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from proton.handlers import TransactionHandler

from tests.integration.harness import REPO

from node.store import records
from node.store.journal import JOURNAL_FILE
from tests.integration.clients import Client, group_message, queue_toml

QUEUE = "orders"


class Outcomes(TransactionHandler):
    def __init__(self):
        self.events: list[str] = []
        self.condition = None

    def on_transaction_declared(self, event):
        self.events.append("declared")

    def on_transaction_declare_failed(self, event):
        self.events.append("declare_failed")

    def on_transaction_committed(self, event):
        self.events.append("committed")

    def on_transaction_aborted(self, event):
        self.events.append("aborted")

    def on_transaction_commit_failed(self, event):
        self.events.append("commit_failed")
        self.condition = event.delivery.remote.condition


def declare(client: Client):
    outcomes = Outcomes()
    connection = client.connection
    transaction = connection.container.declare_transaction(connection.conn, handler=outcomes)
    assert client.wait_for(lambda: outcomes.events, 5.0) and outcomes.events == ["declared"], outcomes.events
    return transaction, outcomes


def discharge(client: Client, transaction, outcomes: Outcomes, fail: bool) -> str:
    (transaction.abort if fail else transaction.commit)()
    assert client.wait_for(lambda: len(outcomes.events) > 1, 5.0), outcomes.events
    return outcomes.events[-1]


def send_in(client: Client, transaction, producer, messages) -> None:
    deliveries = [transaction.send(producer.link, message) for message in messages]
    assert client.wait_for(lambda: all(d.settled for d in deliveries), 5.0)


def test_sends_in_a_committed_transaction_arrive_in_order_and_not_before(node):
    with Client(node) as producing, Client(node) as consuming:
        consumer = consuming.consumer(QUEUE, credit=10)
        transaction, outcomes = declare(producing)
        send_in(producing, transaction, producing.producer(QUEUE),
                [group_message("a", 1), group_message("b", 1), group_message("a", 2)])
        assert consumer.take_all(quiet_s=0.3) == []
        assert discharge(producing, transaction, outcomes, fail=False) == "committed"
        assert [(r.group, r.seq) for r in consumer.take(3)] == [("a", 1), ("b", 1), ("a", 2)]


def test_sends_in_a_rolled_back_transaction_never_arrive(node):
    with Client(node) as producing, Client(node) as consuming:
        consumer = consuming.consumer(QUEUE, credit=10)
        transaction, outcomes = declare(producing)
        send_in(producing, transaction, producing.producer(QUEUE), [group_message("a", 1), group_message("a", 2)])
        assert discharge(producing, transaction, outcomes, fail=True) == "aborted"
        producing.producer(QUEUE).send(group_message("a", 3))
        assert [(r.group, r.seq) for r in consumer.take_all(quiet_s=0.3)] == [("a", 3)]


def test_accepts_rolled_back_come_back_in_order_with_their_delivery_count_raised(node):
    with Client(node) as client:
        client.producer(QUEUE).send(*(group_message("a", seq) for seq in (1, 2, 3)))
        consumer = client.consumer(QUEUE, credit=10)
        taken = consumer.take(3)
        transaction, outcomes = declare(client)
        for received in taken[:2]:
            transaction.accept(received.delivery)
        assert discharge(client, transaction, outcomes, fail=True) == "aborted"
        consumer.accept(taken[2])  # the group's third message is settled outside the transaction
        again = consumer.take_all(quiet_s=0.3)
        assert [(r.group, r.seq, r.delivery_count) for r in again] == [("a", 1, 1), ("a", 2, 1)]


def test_accepts_committed_are_gone_and_the_rest_stay(node):
    with Client(node) as client:
        client.producer(QUEUE).send(*(group_message("a", seq) for seq in (1, 2)))
        consumer = client.consumer(QUEUE, credit=10)
        taken = consumer.take(2)
        transaction, outcomes = declare(client)
        transaction.accept(taken[0].delivery)
        assert discharge(client, transaction, outcomes, fail=False) == "committed"
        consumer.close()
        again = client.consumer(QUEUE, credit=10).take_all(quiet_s=0.3)
        assert [(r.group, r.seq) for r in again] == [("a", 2)]


@pytest.mark.parametrize("coordinator_first", [False, True])
def test_a_connection_dropped_mid_transaction_rolls_it_back(node, coordinator_first):
    """The client process is killed (kill -9) with its transaction open: no discharge, detach or close.
    Whichever link it opened first, the message comes back once, its delivery count raised by one."""
    with Client(node) as seed:
        seed.producer(QUEUE).send(group_message("a", 1))
    client = subprocess.Popen([sys.executable, "-c", _DROPPED_CLIENT, node.url, str(coordinator_first)], cwd=REPO,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert client.stdout.readline().strip() == "in transaction"
    finally:
        client.kill()
        client.wait()
    with Client(node) as after:
        again = after.consumer(QUEUE, credit=10).take_all(quiet_s=0.5)
        assert [(r.group, r.seq, r.delivery_count) for r in again] == [("a", 1, 1)]


_DROPPED_CLIENT = """
import sys, time
from node.store import records
from node.store.journal import JOURNAL_FILE
from tests.integration.clients import Client, group_message, queue_toml
from tests.integration.test_transactions import QUEUE, declare, send_in
client = Client(type("Node", (), {"url": sys.argv[1]})())
if sys.argv[2] == "True":
    transaction, outcomes = declare(client)
taken = client.consumer(QUEUE, credit=10).take(1)
if sys.argv[2] != "True":
    transaction, outcomes = declare(client)
transaction.accept(taken[0].delivery)
send_in(client, transaction, client.producer(QUEUE), [group_message("b", 1)])
client.barrier()
print("in transaction", flush=True)
time.sleep(60)
"""


def durable(message):
    message.durable = True  # journalled only when the queue and the message say so
    return message


def _commit_frame_ends(journal: bytes) -> list[int]:
    """Where each frame of the journal's last transaction batch ends, TXN_BEGIN's first."""
    ends, offset, begin = [], 0, None
    while offset < len(journal):
        length = int.from_bytes(journal[offset:offset + 4], "little")
        kind = journal[offset + records.FRAME_HEADER_BYTES]
        offset += records.FRAME_HEADER_BYTES + length
        if kind == records.TXN_BEGIN:
            begin, ends = offset, [offset]
        elif begin is not None:
            ends.append(offset)
    return ends


def test_a_node_killed_mid_commit_recovers_all_of_the_commit_or_none(node_factory):
    """kill -9 after a durable commit, then the journal torn where a crash mid-commit leaves it: each restart
    serves the state before the commit or the state after it, nothing in between."""
    node = node_factory(queue_toml(QUEUE, durable=True))
    with Client(node) as client:
        client.producer(QUEUE).send(durable(group_message("a", 1)))
        taken = client.consumer(QUEUE, credit=10).take(1)
        transaction, outcomes = declare(client)
        transaction.accept(taken[0].delivery)
        send_in(client, transaction, client.producer(QUEUE), [durable(group_message("b", seq)) for seq in (1, 2, 3)])
        assert discharge(client, transaction, outcomes, fail=False) == "committed"
    node.kill()
    path = node.data_dir / JOURNAL_FILE
    whole = path.read_bytes()
    ends = _commit_frame_ends(whole)
    assert len(ends) == 6, ends  # TXN_BEGIN, three STOREs, the REMOVE, TXN_COMMIT
    before, after = [("a", 1)], [("b", 1), ("b", 2), ("b", 3)]
    # every record of the commit on disk but its commit record: nothing of it; then the whole batch: all of it
    # (each other tear point is recovery's unit test, tests/unit/test_transaction_journal.py)
    for cut, expected in ((ends[4], before), (ends[5], after)):
        path.write_bytes(whole[:cut])
        node.start()
        with Client(node) as client:
            served = client.consumer(QUEUE, credit=10).take_all(quiet_s=0.3)
        node.kill()
        assert [(r.group, r.seq) for r in served] == expected, f"journal cut at {cut} of {len(whole)}"


def test_a_commit_whose_consumer_detached_first_is_refused_with_rollback_and_its_sends_vanish(node):
    with Client(node) as client:
        client.producer(QUEUE).send(group_message("a", 1))
        consumer = client.consumer(QUEUE, credit=10)
        taken = consumer.take(1)
        transaction, outcomes = declare(client)
        transaction.accept(taken[0].delivery)
        send_in(client, transaction, client.producer(QUEUE), [group_message("b", 1)])
        consumer.close()  # the node gives a:1 back: the transaction can no longer commit whole
        assert discharge(client, transaction, outcomes, fail=False) == "commit_failed"
        assert outcomes.condition.name == "amqp:transaction:rollback"
        assert "detached" in outcomes.condition.description
        again = client.consumer(QUEUE, credit=10).take_all(quiet_s=0.3)
        assert [(r.group, r.seq) for r in again] == [("a", 1)]


def test_in_a_cluster_a_commit_sending_to_a_group_another_node_owns_is_refused_naming_it(cluster):
    owner, other = cluster.nodes[0], cluster.nodes[1]
    with Client(owner) as at_owner, Client(other) as at_other:
        consumer = at_owner.consumer(QUEUE, credit=10)
        cluster.wait_consumers(QUEUE, {0: 1})
        at_owner.producer(QUEUE).send(group_message("g", 1))  # the group now lives on node 0, its consumer's
        assert [(r.group, r.seq) for r in consumer.take(1)] == [("g", 1)]
        transaction, outcomes = declare(at_other)
        send_in(at_other, transaction, at_other.producer(QUEUE), [group_message("g", 2)])
        assert discharge(at_other, transaction, outcomes, fail=False) == "commit_failed"
        assert outcomes.condition.name == "amqp:transaction:rollback"
        assert "'g'" in outcomes.condition.description and repr(cluster.node_ids[0]) in outcomes.condition.description
        transaction, outcomes = declare(at_owner)  # on the owner the same send commits
        send_in(at_owner, transaction, at_owner.producer(QUEUE), [group_message("g", 3)])
        assert discharge(at_owner, transaction, outcomes, fail=False) == "committed"
        assert [(r.group, r.seq) for r in consumer.take_all(quiet_s=0.3)] == [("g", 3)]


def test_a_transaction_id_of_another_connection_is_unknown_there(node):
    with Client(node) as owner, Client(node) as stranger:
        theirs, their_outcomes = declare(owner)
        mine, _ = declare(stranger)
        mine.id = theirs.id  # a guessed id: the node takes it only on the connection that declared it
        delivery = mine.send(stranger.producer(QUEUE).link, group_message("a", 1))
        assert stranger.wait_for(lambda: delivery.settled, 5.0)
        assert delivery.remote.condition.name == "amqp:transaction:unknown-id"
        assert discharge(owner, theirs, their_outcomes, fail=False) == "committed"
        assert stranger.consumer(QUEUE, credit=10).take_all(quiet_s=0.3) == []
