"""AMQP 1.0 local transactions on one node, driven by python-qpid-proton's transaction API (issue 31).

What a user sees: sends inside a transaction appear at commit, in order, and never after a rollback;
a consumer's transactional accepts take effect at commit; a rollback gives the messages back to their
groups, in order, with the delivery count raised; a connection dropped mid-transaction rolls it back.
"""

from __future__ import annotations

import subprocess
import sys

from proton.handlers import TransactionHandler

from tests.integration.harness import REPO

from tests.integration.clients import Client, group_message

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


def test_a_connection_dropped_mid_transaction_rolls_it_back(node):
    """The client process is killed (kill -9) with its transaction open: no discharge, detach or close."""
    with Client(node) as seed:
        seed.producer(QUEUE).send(group_message("a", 1))
    client = subprocess.Popen([sys.executable, "-c", _DROPPED_CLIENT, node.url], cwd=REPO, stdout=subprocess.PIPE,
                              text=True)
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
from tests.integration.clients import Client, group_message
from tests.integration.test_transactions import QUEUE, declare, send_in
client = Client(type("Node", (), {"url": sys.argv[1]})())
taken = client.consumer(QUEUE, credit=10).take(1)
transaction, outcomes = declare(client)
transaction.accept(taken[0].delivery)
send_in(client, transaction, client.producer(QUEUE), [group_message("b", 1)])
client.barrier()
print("in transaction", flush=True)
time.sleep(60)
"""
