"""Groups follow their consumers: the handover of node/core/cluster_protocol.py, one node at a time, by example.

Each test drives one ClusterProtocol as its node would (effects carried out by hand, time as integers)
through a move of group g of queue q from n1 to n2, with n3 a third member. The seeded simulation
(tests/sim/test_route_follow.py) runs the same code across a whole cluster with faults.
"""

from __future__ import annotations

from handler.route_table import MOVES, ROUTES
from node.core.broker import Broker
from node.core.cluster_protocol import PARK_PREFIX, ClusterProtocol, Entry
from node.core.outbound import outbound_name
from node.core.effects import (AcceptWhenStored, AfterFlush, ApplyBroker, Deliver, EnqueueLocal, JournalRemove,
                               JournalStore, ProposeMoveClear, Removed, Reply, Stored)
from node.core.message import Message, Outcome
from node.core.settings import QueueSettings

EVERYONE = ("n1", "n2", "n3")
MOVE = ("q", "g", "n1", "n2")


class Node:
    """One protocol and its broker; carries out the effects a test does not look at itself."""

    def __init__(self, node_id: str, owner: str = "n1"):
        self.broker = Broker()
        self.broker.declare_queue(QueueSettings(name="q", durable=True))
        self.cluster = ClusterProtocol(node_id, self.broker, handler_timeout_ms=300, routes_max=10,
                                       seq_reserve_block=100, follows_consumers=True)
        self.cluster.ready(0)
        self.cluster.applied(ROUTES, [("q", "g", owner)], 0, 0)
        self.delivered: list[bytes] = []
        self.flushes: list = []

    def run(self, effects: list) -> list:
        for effect in effects:
            if type(effect) is EnqueueLocal:
                self.deliver(self.broker.enqueue(effect.queue, effect.message, effect.now_ms))
            elif type(effect) is ApplyBroker:
                self.deliver(effect.effects)
            elif type(effect) is AfterFlush:
                self.flushes.append(effect.what)
        return effects

    def deliver(self, effects: list) -> None:
        self.delivered += [effect.message.payload for effect in effects if type(effect) is Deliver]

    def flush(self, now_ms: int = 0) -> list:
        flushes, self.flushes = self.flushes, []
        return [effect for what in flushes for effect in self.run(self.cluster.flushed(what, None, now_ms))]

    def send(self, payload: str, now_ms: int = 0) -> list:
        return self.run(self.cluster.arrive(payload, "q", "g", Message(payload.encode(), "g"), True, False, now_ms))

    def forwarded(self, source: str, seq: int, payload: str, now_ms: int = 0) -> list:
        entry = Entry(seq, "q", "g", payload.encode(), 0, False, now_ms)
        return self.run(self.cluster.forward_received(source, [entry], lambda *reply: None, now_ms))

    def move(self, waiting=EVERYONE, now_ms: int = 0) -> list:
        """The log's follow_consumers: the move first, then the route (as the replica feeds them)."""
        effects = self.cluster.applied(MOVES, [MOVE + (tuple(waiting),)], None, now_ms)
        return self.run(effects + self.cluster.applied(ROUTES, [("q", "g", "n2")], now_ms, now_ms))

    def moved(self, waiting=(), now_ms: int = 0) -> list:
        return self.run(self.cluster.applied(MOVES, [MOVE + (tuple(waiting),)], None, now_ms))

    def tick(self, now_ms: int) -> list:
        return self.run(self.cluster.tick(now_ms, {}))


def of(kind, effects: list) -> list:
    return [effect for effect in effects if type(effect) is kind]


def test_the_old_owner_hands_a_group_over_only_once_its_delivery_in_flight_is_settled_and_in_queue_order():
    old = Node("n1")
    old.run(old.broker.attach_consumer("q", "c", False, 0))
    old.run(old.broker.set_credit("c", 1, 0))
    for payload in ("m1", "m2", "m3"):
        old.send(payload)
    assert old.delivered == [b"m1"]
    old.move()
    old.run(old.broker.set_credit("c", 5, 1))
    assert old.delivered == [b"m1"]  # held: nothing more of the group is delivered here
    assert of(JournalStore, old.tick(2)) == []  # m1 is still in flight
    old.run(old.broker.settle("c", 0, Outcome.ACCEPTED, 3))
    effects = old.tick(4)
    stores = of(JournalStore, effects)
    assert [store.message.payload for store in stores] == [b"m2", b"m3"]
    assert {store.name for store in stores} == {outbound_name("n2", "q")}
    removed = [effect for batch in of(ApplyBroker, effects) for effect in batch.effects if type(effect) is Removed]
    assert len(removed) == 2
    assert effects.index(stores[-1]) < effects.index(of(ApplyBroker, effects)[0])  # STOREs before REMOVEs
    assert old.broker.queues["q"].depth_messages == 0


def test_the_old_owner_clears_last_once_the_new_owner_stored_the_handover():
    old = Node("n1")
    old.send("m1")
    old.move()
    old.tick(1)
    old.moved(waiting=("n1",))  # n2 and n3 cleared
    assert of(ProposeMoveClear, old.tick(2)) == []  # m1 is on its way to n2
    old.run(old.cluster.quiesced(3))
    old.flush(4)
    old.cluster.acknowledged("n2", max(old.cluster.outbound.channels["n2"]))
    assert of(ProposeMoveClear, old.tick(5)) == [ProposeMoveClear([MOVE])]
    assert of(ProposeMoveClear, old.tick(6)) == []  # proposed again only if the log still waits later


def test_the_old_owner_relays_what_others_sent_it_before_they_saw_the_move_and_clears_only_after_them():
    old = Node("n1")
    old.move()
    effects = old.forwarded("n3", 7, "late")
    [relayed] = of(JournalStore, effects)
    assert relayed.name == outbound_name("n2", "q") and relayed.origin == ("n3", 7)
    old.moved(waiting=("n1", "n3"))
    assert of(ProposeMoveClear, old.tick(10)) == []  # n3 may still send it some


def test_a_source_clears_once_its_channel_to_the_old_owner_holds_nothing_of_the_group():
    source = Node("n3")
    source.send("m1")
    source.move()
    assert of(ProposeMoveClear, source.tick(1)) == []
    source.cluster.acknowledged("n1", max(source.cluster.outbound.channels["n1"]))
    assert of(ProposeMoveClear, source.tick(2)) == [ProposeMoveClear([MOVE])]
    assert of(ProposeMoveClear, source.tick(1001)) == []
    assert of(ProposeMoveClear, source.tick(1002)) == [ProposeMoveClear([MOVE])]  # the log still waits: lost?
    source.moved(waiting=("n1", "n2"))
    assert of(ProposeMoveClear, source.tick(3000)) == []  # the log has its clear


def test_the_new_owner_parks_what_must_wait_behind_the_handover_and_delivers_nothing_until_the_move_ends():
    new = Node("n2")
    new.run(new.broker.attach_consumer("q", "c", False, 0))
    new.run(new.broker.set_credit("c", 10, 0))
    new.move()
    local = new.send("local")  # a producer here, after the move
    assert [type(effect) for effect in local if type(effect) is not AfterFlush] == [JournalStore, AcceptWhenStored]
    assert of(JournalStore, local)[0].name == PARK_PREFIX + "q"
    assert of(JournalStore, new.forwarded("n3", 1, "direct"))[0].name == PARK_PREFIX + "q"
    handed = new.forwarded("n1", 1, "handed")  # the old owner's backlog goes into the queue, held
    assert of(Stored, [effect for batch in of(ApplyBroker, handed) for effect in batch.effects])
    new.flush(1)
    new.tick(2)
    assert new.delivered == []
    effects = new.moved(now_ms=3)
    assert new.delivered == [b"handed", b"local", b"direct"]
    assert len(of(JournalRemove, effects)) == 2  # out of the park, after their STOREs in the queue
    assert new.cluster.parked == {} and new.cluster.held == set()


def test_a_handover_reaching_the_new_owner_before_its_replica_saw_the_move_is_held_and_later_arrivals_parked():
    new = Node("n2")
    new.run(new.broker.attach_consumer("q", "c", False, 0))
    new.run(new.broker.set_credit("c", 10, 0))
    new.forwarded("n1", 1, "handed")  # the route here still names n1: a move is coming
    new.forwarded("n3", 1, "direct")  # n3 saw the move already: it waits behind the handover
    new.flush(1)
    new.move(now_ms=2)
    assert new.delivered == []
    new.moved(now_ms=3)
    assert new.delivered == [b"handed", b"direct"]


def test_a_parked_message_whose_journal_write_failed_is_dropped_and_never_delivered():
    new = Node("n2")
    new.run(new.broker.attach_consumer("q", "c", False, 0))
    new.run(new.broker.set_credit("c", 10, 0))
    new.move()
    new.send("lost")
    for what in new.flushes:
        new.run(new.cluster.flushed(what, "disk full", 1))
    new.flushes = []
    new.moved(now_ms=2)
    assert new.delivered == [] and new.cluster.parked == {}


def test_a_restarted_node_holds_what_it_recovered_until_its_replica_is_current():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    broker.restore("q", Message(b"kept", "g", seq=5))
    cluster = ClusterProtocol("n2", broker, handler_timeout_ms=300, follows_consumers=True)
    cluster.hold_recovered()
    broker.attach_consumer("q", "c", False, 0)
    assert of(Deliver, broker.set_credit("c", 5, 0)) == []
    cluster.applied(ROUTES, [("q", "g", "n2")], 0, 0)
    effects = cluster.ready(1)
    assert [effect.message.payload for batch in of(ApplyBroker, effects) for effect in of(Deliver, batch.effects)] \
        == [b"kept"]


def test_forwarded_messages_wait_for_a_current_replica_and_a_known_route():
    cluster = ClusterProtocol("n2", Broker(), handler_timeout_ms=300, follows_consumers=True)
    replies = []
    entry = Entry(1, "q", "g", b"m", 0, False, 0)
    [reply] = cluster.forward_received("n1", [entry], lambda *answer: replies.append(answer), 0)
    assert type(reply) is Reply and reply.error is not None and reply.error.retriable
    cluster.ready(0)
    [reply] = cluster.forward_received("n1", [entry], None, 0)
    assert "does not know the route" in reply.error.description


def test_a_restarted_node_sends_what_it_recovered_of_a_group_living_elsewhere_now_to_its_owner():
    # an accepted message whose REMOVE a failed journal write lost, after its group moved on to n2
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    broker.restore("q", Message(b"ghost", "g", seq=5))
    cluster = ClusterProtocol("n1", broker, handler_timeout_ms=300, follows_consumers=True)
    cluster.hold_recovered()
    broker.attach_consumer("q", "c", False, 0)
    assert of(Deliver, broker.set_credit("c", 5, 0)) == []
    cluster.applied(ROUTES, [("q", "g", "n2")], 0, 0)
    effects = cluster.ready(1)
    [store] = of(JournalStore, effects)
    assert store.name == outbound_name("n2", "q") and store.message.payload == b"ghost"
    assert not [effect for batch in of(ApplyBroker, effects) for effect in of(Deliver, batch.effects)]
    assert broker.queues["q"].depth_messages == 0 and cluster.held == set()
