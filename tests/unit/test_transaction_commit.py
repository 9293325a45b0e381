"""Examples of a discharged transaction applied by the node shell (node/core/transaction_commit.py, issue 31):
what a commit refuses, and that a refused commit leaves no trace."""

from __future__ import annotations

from node.core.dispatch.broker import Broker
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings
from node.core.dispatch.transactions import TransactionRolledBack, Transactions
from node.core.durability import Durability
from node.core.effects import Deliver, Refuse
from node.core.shell import NodeShell


class Routes(dict):
    pass


class Protocol:
    """What the commit reads of the cluster protocol: this node's id and the routes it knows."""

    batch_due = False
    moves: dict = {}
    parked: dict = {}

    def __init__(self, node_id: str, routes: dict):
        self.node_id = node_id
        self.router = type("Router", (), {"routes": Routes(routes)})()


def shell_with(protocol=None, **settings) -> tuple[NodeShell, Broker]:
    broker = Broker(dedup_id_of=lambda payload: payload.decode())  # a message's id is its body
    broker.declare_queue(QueueSettings(name="q", **settings))
    return NodeShell(broker, Durability(1000), journalled=False, protocol=protocol), broker


def transaction_of(*sends) -> object:
    transactions = Transactions()
    transaction_id = transactions.declare(1)
    for group, route_key in sends:
        transactions.send(transaction_id, "q", Message(f"m-{group}".encode(), group), False, route_key, None)
    return transactions.discharge(transaction_id, 1)


def test_a_commit_whose_group_another_node_owns_is_refused_naming_the_group_and_owner():
    shell, broker = shell_with(Protocol("n1", {("q", "mine"): "n1", ("q", "theirs"): "n2"}))
    effects = shell.commit(transaction_of(("mine", "mine"), ("theirs", "theirs")), "discharge", 0)
    refusal = [effect for effect in effects if type(effect) is Refuse]
    assert len(refusal) == 1 and isinstance(refusal[0].error, TransactionRolledBack)
    assert "'theirs'" in refusal[0].error.description and "'n2'" in refusal[0].error.description
    assert broker.queues["q"].depth_messages == 0  # not even the send to the group this node owns


def test_a_commit_whose_group_no_node_owns_yet_is_refused():
    shell, broker = shell_with(Protocol("n1", {}))
    effects = shell.commit(transaction_of(("new", "new")), "discharge", 0)
    assert "no node yet" in [e for e in effects if type(e) is Refuse][0].error.description
    assert broker.queues["q"].depth_messages == 0


def test_a_commit_of_groups_this_node_owns_is_applied_in_order():
    shell, broker = shell_with(Protocol("n1", {("q", "a"): "n1", ("q", "b"): "n1"}))
    broker.attach_consumer("q", 7, False, 0)
    broker.set_credit(7, 10, 0)
    effects = shell.commit(transaction_of(("a", "a"), ("b", "b"), ("a", "a")), "discharge", 0)
    assert not [e for e in effects if type(e) is Refuse]
    assert [e.message.payload for e in effects if type(e) is Deliver] == [b"m-a", b"m-b", b"m-a"]


def test_a_commit_with_a_send_its_queue_would_refuse_is_refused_whole():
    shell, broker = shell_with(group_id_length_max_chars=3)
    effects = shell.commit(transaction_of(("ok", None), ("too-long", None)), "discharge", 0)
    refusal = [e for e in effects if type(e) is Refuse]
    assert len(refusal) == 1 and "at most 3" in refusal[0].error.description
    assert broker.queues["q"].depth_messages == 0


def test_a_commit_to_a_group_being_handed_over_is_refused():
    protocol = Protocol("n1", {("q", "a"): "n1"})
    protocol.moves = {("q", "a"): ("n2", "n1", 0)}  # coming here: a producer's sends park behind the handover
    protocol.handovers = type("Handovers", (), {"placement": lambda self, key, source, owner: "park"})()
    shell, broker = shell_with(protocol)
    effects = shell.commit(transaction_of(("a", "a")), "discharge", 0)
    assert "handed over" in [e for e in effects if type(e) is Refuse][0].error.description
    assert broker.queues["q"].depth_messages == 0


def test_a_send_its_de_duplicating_queue_took_already_commits_without_being_queued_again():
    shell, broker = shell_with(dedup=True)
    shell.enqueue_local("first", "q", Message(b"m-a", "a"), False, False, 0)  # id "m-a", outside the transaction
    effects = shell.commit(transaction_of(("a", None), ("b", None)), "discharge", 0)  # ids "m-a", "m-b"
    assert not [e for e in effects if type(e) is Refuse]
    assert broker.queues["q"].depth_messages == 2  # m-a once, m-b
