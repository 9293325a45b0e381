"""Groups follow their consumers: the handover of node/core/cluster/handover.py, one node at a time, by example.

Each test drives one ClusterProtocol as its node would (effects carried out by hand, time as integers)
through a move of group g of queue q from n1 to n2, with n3 a third member. The seeded simulation
(tests/sim/test_route_follow.py) runs the same code across a whole cluster with faults.
"""

from __future__ import annotations

from node.core.dispatch.broker import Broker
from node.core.dispatch.cold import GROUP_RECORD_BYTES, MESSAGE_RECORD_BYTES
from node.core.cluster import PARK_PREFIX, ClusterProtocol, handover
from node.core.cluster.feed import MOVES, ROUTES
from node.core.cluster.outbound import Entry, outbound_name
from node.core.effects import (AcceptWhenStored, AfterFlush, Deliver, EnqueueLocal, PageIn, ProposeMoveClear, ReadRecords,
                               Refuse, Removed, Reply, Stored)
from node.core.dispatch.message import Message, Outcome
from node.core.dispatch.settings import QueueSettings

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
            elif type(effect) is Deliver or type(effect) in (Stored, Removed) and not effect.queue.startswith("\x00"):
                self.deliver([effect])  # the broker's, among the protocol's
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


def cluster_records(kind, effects: list) -> list:
    """The cluster's own journal records of `kind` (outbound channels, parks: NUL-led names), not a queue's."""
    return [effect for effect in of(kind, effects) if effect.queue.startswith("\x00")]


def queue_records(kind, effects: list) -> list:
    """The broker's journal records of `kind` among the protocol's effects: a queue's."""
    return [effect for effect in of(kind, effects) if not effect.queue.startswith("\x00")]


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
    assert cluster_records(Stored, old.tick(2)) == []  # m1 is still in flight
    old.run(old.broker.settle("c", 0, Outcome.ACCEPTED, 3))
    effects = old.tick(4)
    stores = cluster_records(Stored, effects)
    assert [store.message.payload for store in stores] == [b"m2", b"m3"]
    assert {store.queue for store in stores} == {outbound_name("n2", "q")}
    removed = queue_records(Removed, effects)
    assert len(removed) == 2
    assert effects.index(stores[-1]) < effects.index(removed[0])  # STOREs before REMOVEs
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


def test_status_tells_what_each_member_waits_for_before_it_clears_a_move():
    old, source = Node("n1"), Node("n3")

    def report(node: Node) -> dict:
        [move] = node.cluster.status()["moves"]
        return move

    old.run(old.broker.attach_consumer("q", "c", False, 0))
    old.run(old.broker.set_credit("c", 1, 0))
    old.send("m1")
    old.send("m2")
    old.move()
    assert old.cluster.status()["moving"] == 1
    move = report(old)
    assert (move["queue"], move["group"], move["from"], move["to"]) == ("q", "g", "n1", "n2")
    assert move["waiting"] == list(EVERYONE)
    assert move["here"] == ["the other members' clears (the old owner clears last)", "1 queued and 1 in flight here"]
    old.run(old.broker.settle("c", 0, Outcome.ACCEPTED, 1))
    old.tick(2)  # m2 handed over
    old.moved(waiting=("n1",))
    old.run(old.cluster.quiesced(3))
    old.flush(4)
    [seq] = old.cluster.outbound.channels["n2"]
    assert report(old)["here"] == [f"n2 to acknowledge forward seq {seq} (recovered up to 0; its channel starts at "
                                   f"{seq})"]
    old.cluster.acknowledged("n2", seq)
    assert report(old)["here"] == []
    source.send("m3")
    source.move()
    assert report(source)["here"] == ["n1 to acknowledge messages of the group forwarded to it (1 left)"]
    source.moved(waiting=("n1",))
    assert report(source)["here"] == [] and report(source)["waiting"] == ["n1"]


def test_the_old_owner_relays_what_others_sent_it_before_they_saw_the_move_and_clears_only_after_them():
    old = Node("n1")
    old.move()
    effects = old.forwarded("n3", 7, "late")
    [relayed] = cluster_records(Stored, effects)
    assert relayed.queue == outbound_name("n2", "q") and relayed.origin == ("n3", 7)
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


def test_the_new_owner_delivers_the_handover_as_it_comes_and_parks_what_must_wait_behind_it_until_the_move_ends():
    new = Node("n2")
    new.run(new.broker.attach_consumer("q", "c", False, 0))
    new.run(new.broker.set_credit("c", 10, 0))
    new.move()
    local = new.send("local")  # a producer here, after the move
    assert [type(effect) for effect in local if type(effect) is not AfterFlush] == [Stored, AcceptWhenStored]
    assert cluster_records(Stored, local)[0].queue == PARK_PREFIX + "q"
    assert cluster_records(Stored, new.forwarded("n3", 1, "direct"))[0].queue == PARK_PREFIX + "q"
    handed = new.forwarded("n1", 1, "handed")  # the old owner's backlog goes into the queue, delivered at once
    assert queue_records(Stored, handed)
    new.flush(1)
    new.tick(2)
    assert new.delivered == [b"handed"]  # the old owner sent it only once nothing of the group was in flight there
    effects = new.moved(now_ms=3)
    assert new.delivered == [b"handed", b"local", b"direct"]
    assert len(cluster_records(Removed, effects)) == 2  # out of the park, after their STOREs in the queue
    assert new.cluster.parked == {} and new.cluster.held == set()


def test_a_handover_reaching_the_new_owner_before_its_replica_saw_the_move_is_held_and_later_arrivals_parked():
    new = Node("n2")
    new.run(new.broker.attach_consumer("q", "c", False, 0))
    new.run(new.broker.set_credit("c", 10, 0))
    new.forwarded("n1", 1, "handed")  # the route here still names n1: a move is coming
    new.forwarded("n3", 1, "direct")  # n3 saw the move already: it waits behind the handover
    new.flush(1)
    new.tick(2)
    assert new.delivered == []  # perhaps what must wait behind a handover: held until the replica knows
    new.move(now_ms=3)
    new.tick(4)
    assert new.delivered == [b"handed"]
    new.moved(now_ms=5)
    assert new.delivered == [b"handed", b"direct"]


def test_a_forward_reaching_a_node_that_knows_the_group_moving_between_two_others_waits_for_the_move_here():
    # campaign-like race in the simulation (seed 23 of the paging sweep): n4 saw the group move on from n5
    # to n1 while n1 still knew only its move from n4 to n5; n1 took n4's send as its own and delivered it
    # ahead of what n5 had yet to hand over
    third = Node("n3", owner="n4")
    third.run(third.broker.attach_consumer("q", "c", False, 0))
    third.run(third.broker.set_credit("c", 10, 0))
    third.run(third.cluster.applied(MOVES, [("q", "g", "n4", "n5", ("n4",))], None, 0))
    assert third.cluster.moves[("q", "g")][:2] == ("n4", "n5")
    parked = third.forwarded("n4", 1, "after")  # n4 sends here: a later move names this node
    assert cluster_records(Stored, parked)[0].queue == PARK_PREFIX + "q"
    handed = third.forwarded("n5", 1, "handed")  # n5 hands over what it has: the next move's old owner
    assert not cluster_records(Stored, handed) or cluster_records(Stored, handed)[0].queue != PARK_PREFIX + "q"
    third.flush(1)
    third.tick(2)
    assert third.delivered == []  # held until the replica knows the move here
    third.run(third.cluster.applied(MOVES, [("q", "g", "n4", "n5", ())], None, 3))
    third.run(third.cluster.applied(ROUTES, [("q", "g", "n5")], 3, 3))
    third.run(third.cluster.applied(MOVES, [("q", "g", "n5", "n3", ("n5",))], None, 4))
    third.run(third.cluster.applied(ROUTES, [("q", "g", "n3")], 4, 4))
    third.tick(5)
    assert third.delivered == [b"handed"]
    third.run(third.cluster.applied(MOVES, [("q", "g", "n5", "n3", ())], None, 6))
    third.tick(7)
    assert third.delivered == [b"handed", b"after"]


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
    assert [effect.message.payload for effect in of(Deliver, effects)] \
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
    [store] = cluster_records(Stored, effects)
    assert store.queue == outbound_name("n2", "q") and store.message.payload == b"ghost"
    assert not of(Deliver, effects)
    assert broker.queues["q"].depth_messages == 0 and cluster.held == set()


def test_a_restarted_node_reads_back_the_paged_bodies_of_a_group_living_elsewhere_before_sending_it_on():
    # recovery past the body budget: the group's messages came back as records; it stays held, what is in
    # memory goes on at once, the rest once its bodies are back (before: every body was loaded at a restart)
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    broker.restore("q", Message(b"first", "g", seq=5))
    paged = Message(b"second", "g", seq=6)
    paged.payload = None  # as the journal's recovery returns a message past the body budget
    broker.restore("q", paged)
    cluster = ClusterProtocol("n1", broker, handler_timeout_ms=300, follows_consumers=True)
    cluster.hold_recovered()
    cluster.applied(ROUTES, [("q", "g", "n2")], 0, 0)
    effects = cluster.ready(1)
    assert [store.message.payload for store in cluster_records(Stored, effects)] == [b"first"]
    assert cluster.held == {("q", "g")} and cluster.counts["restored_handed_over"] == 0
    [page_in] = of(PageIn, broker.tick(2))
    assert page_in.seqs == (6,)
    assert cluster_records(Stored, cluster.tick(3, {})) == []  # still waiting for the body: held, nothing sent
    assert broker.queues["q"].delivered_total == 0
    broker.page_in("q", {6: b"second"}, 4)
    stores = cluster_records(Stored, cluster.tick(5, {}))
    assert [store.message.payload for store in stores] == [b"second"]
    assert broker.queues["q"].depth_messages == 0 and cluster.held == set()
    assert cluster.counts["restored_handed_over"] == 1


class ColdOwner(Node):
    """n1 owning g and h with a record budget of one message and its group: what follows goes cold
    (node/core/dispatch/cold.py). `journal` keeps every STORE of queue q whole, as the journal would."""

    def __init__(self):
        super().__init__("n1")
        self.broker.records.max_bytes = MESSAGE_RECORD_BYTES + GROUP_RECORD_BYTES
        self.cluster.applied(ROUTES, [("q", "h", "n1")], 0, 0)
        self.journal: dict[int, Message] = {}
        self.unwritten: list = []  # STOREs not on disk yet while `writing` is False
        self.writing = True

    def deliver(self, effects: list) -> None:
        super().deliver(effects)
        for effect in effects:
            if type(effect) is Stored:
                stored = effect.message
                self.unwritten.append(Message(stored.payload, stored.group_id, seq=stored.seq))
                self.unwritten.append(stored)
                if self.writing:
                    self.write()
            elif type(effect) is Removed:
                self.journal.pop(effect.seq, None)

    def write(self) -> None:
        """The journal reports the STOREs so far on disk."""
        unwritten, self.unwritten = self.unwritten, []
        for record, stored in zip(unwritten[::2], unwritten[1::2]):
            self.journal[record.seq] = record
            self.run(self.broker.journalled([("q", stored)], 0))

    def send_to(self, group: str, payload: str, now_ms: int = 0) -> list:
        return self.run(self.cluster.arrive(payload, "q", group, Message(payload.encode(), group), True, False,
                                            now_ms))

    def read(self, read: ReadRecords) -> dict:
        """Journal.read_records_after: the next live records of q above read.after_seq."""
        seqs = sorted(seq for seq in self.journal if seq > read.after_seq)[:read.count]
        return {seq: Message(self.journal[seq].payload, self.journal[seq].group_id, seq=seq) for seq in seqs}


def test_an_old_owner_sweeps_its_cold_tail_for_a_moving_group_and_hands_it_over_in_order_behind_the_warm_part():
    old = ColdOwner()
    for group, payload in (("g", "g0"), ("h", "h0"), ("g", "g1"), ("h", "h1"), ("g", "g2")):
        old.send_to(group, payload)
    queue = old.broker.queues["q"]
    assert queue.cold.count == 4 and queue.cold.stored == 4  # all but g0; which groups is not known
    old.move()
    effects = old.tick(1)
    stores = [store.message.payload for store in cluster_records(Stored, effects)]
    assert stores == [b"g0"]  # the warm part first
    [read] = of(ReadRecords, effects)  # then the tail, read through for g
    assert queue.cold.frozen and queue.cold.ask(True) == 0  # no read-back for dispatch meanwhile
    old.run(old.cluster.quiesced(2))
    old.flush(2)
    old.cluster.acknowledged("n2", max(old.cluster.outbound.channels["n2"]))
    old.moved(waiting=("n1",))
    assert of(ProposeMoveClear, old.tick(2)) == []  # g0 is with n2, but the tail may hold more of g
    [refused] = of(Refuse, old.send_to("g", "g9", 3))  # a producer here, while the sweep is out: refused,
    assert "is moving from node n1 to n2" in refused.error.description  # so it cannot keep the move going
    parked = old.forwarded("n3", 7, "g3", 3)  # another node's send from before it saw the move: parked
    assert cluster_records(Stored, parked)[0].queue == PARK_PREFIX + "q"
    effects = old.run(old.cluster.cold_records("q", old.read(read), 4))
    assert [store.message.payload for store in cluster_records(Stored, effects)] == [b"g1", b"g2"]
    assert queue.cold.count == 2 and sorted(m.payload for m in old.journal.values()) == [b"h0", b"h1"]  # h stays cold
    old.flush(5)
    assert not queue.cold.frozen  # their REMOVEs are on disk: the queue may read its tail back again
    effects = old.tick(6)
    [relayed] = cluster_records(Stored, effects)
    assert relayed.message.payload == b"g3" and relayed.queue == outbound_name("n2", "q")
    assert old.cluster.parked == {}
    old.run(old.cluster.quiesced(7))
    old.flush(8)
    channel = old.cluster.outbound.channels["n2"]
    assert len(channel) == 3  # g1, g2, g3 in forward seq order, behind g0
    assert of(ProposeMoveClear, old.tick(9)) == []  # n2 has not acknowledged them yet
    old.cluster.acknowledged("n2", max(channel))
    assert of(ProposeMoveClear, old.tick(10)) == [ProposeMoveClear([MOVE])]


def test_a_sweep_waits_for_what_the_group_has_in_flight_and_leaves_other_groups_cold():
    old = ColdOwner()
    old.run(old.broker.attach_consumer("q", "c", False, 0))
    old.run(old.broker.set_credit("c", 1, 0))
    for group, payload in (("g", "g0"), ("h", "h0"), ("g", "g1")):
        old.send_to(group, payload)
    assert old.delivered == [b"g0"]
    old.move()
    assert of(ReadRecords, old.tick(1)) == []  # g0 is in flight: g1 must not overtake it
    old.run(old.broker.settle("c", 0, Outcome.ACCEPTED, 2))
    [read] = of(ReadRecords, old.tick(3))
    effects = old.run(old.cluster.cold_records("q", old.read(read), 4))
    assert [store.message.payload for store in cluster_records(Stored, effects)] == [b"g1"]
    assert old.broker.queues["q"].cold.count == 1  # h0
    assert old.cluster.cold_records("q", {}, 5) is None  # not a sweep's read: the queue's own


def test_cold_records_read_back_of_a_group_living_elsewhere_are_held_and_sent_to_its_owner():
    # after a cold recovery, a group's messages surface only as they are read back: one whose route names
    # another node (failed over while this node was down) must not be delivered here
    old = ColdOwner()
    old.cluster.applied(ROUTES, [("q", "h", "n2")], 0, 0)
    old.run(old.broker.attach_consumer("q", "c", False, 0))
    old.run(old.broker.set_credit("c", 5, 0))
    queue = old.broker.queues["q"]
    queue.restore_cold(2, 10, 4)
    records = {11: Message(b"g9", "g", seq=11), 12: Message(b"h9", "h", seq=12)}
    queue.cold.ask(True)
    assert old.cluster.cold_records("q", records, 1) is None
    old.deliver(old.broker.promote("q", records, 1))
    assert old.delivered == [b"g9"]  # g lives here; h is held
    stores = cluster_records(Stored, old.tick(2))
    assert [(store.queue, store.message.payload) for store in stores] == [(outbound_name("n2", "q"), b"h9")]
    assert old.cluster.held == set()


def test_a_sweep_ending_while_a_message_of_its_group_is_still_on_its_way_to_disk_goes_through_again():
    old = ColdOwner()
    old.send_to("g", "g0")
    old.send_to("h", "h0")
    old.writing = False
    old.send_to("g", "g1")  # cold, whole in memory until its STORE is on disk: not in the journal's index
    old.move()
    [read] = of(ReadRecords, old.tick(1))
    assert cluster_records(Stored, old.run(old.cluster.cold_records("q", old.read(read), 2))) == []  # only h0 there
    [read] = of(ReadRecords, old.tick(3))  # g1 may still be cold here: another pass
    old.write()
    effects = old.run(old.cluster.cold_records("q", old.read(read), 4))
    assert [store.message.payload for store in cluster_records(Stored, effects)] == [b"g1"]
    assert of(ReadRecords, old.tick(5)) == []  # g has nothing cold left


def test_what_an_old_owner_parked_is_relayed_at_the_handovers_rate_never_through_its_queue_at_the_record_budgets(
        monkeypatch):
    # campaign X: after a restart, sources' backlogs reached the old owner as the move began and parked
    # there (26,561 messages); put through its queue at the record budget's ~50 a tick, they held the
    # move up past the nemesis's 40 s bound
    monkeypatch.setattr(handover, "HANDOVER_MESSAGES_PER_TICK", 8)
    old = Node("n1")
    old.broker.records.max_bytes = 2 * (MESSAGE_RECORD_BYTES + GROUP_RECORD_BYTES)
    old.run(old.broker.attach_consumer("q", "c", False, 0))
    old.run(old.broker.set_credit("c", 1, 0))
    old.send("m0")
    old.move()
    for seq in range(1, 21):  # n3's, sent before it saw the move: the first few fit in the queue, the rest park
        old.forwarded("n3", seq, f"m{seq}")
        old.flush(1)
    parked = len(old.cluster.parked[("q", "g")])
    assert old.delivered == [b"m0"] and parked >= 15
    [move] = old.cluster.status()["moves"]
    assert move["here"][-1] == f"{parked} parked here, relayed once nothing else of the group is left here"
    old.run(old.broker.settle("c", 0, Outcome.ACCEPTED, 2))
    relayed = []
    for now_ms in range(3, 6):
        relayed.append([store.message.payload for store in cluster_records(Stored, old.tick(now_ms))])
    assert [len(payloads) for payloads in relayed] == [8, 8, 4]  # those queued handed over, then the rest relayed
    assert [payload for payloads in relayed for payload in payloads] == [f"m{seq}".encode() for seq in range(1, 21)]
    assert old.cluster.parked == {}


def test_an_old_owner_hands_over_a_bounded_number_of_messages_and_bytes_a_tick_a_group_in_pieces(monkeypatch):
    monkeypatch.setattr(handover, "HANDOVER_MESSAGES_PER_TICK", 3)
    monkeypatch.setattr(handover, "HANDOVER_BYTES_PER_TICK", 1 << 20)
    old = Node("n1")
    old.cluster.applied(ROUTES, [("q", "h", "n1")], 0, 0)
    for group in ("g", "h"):
        for number in range(4):
            old.run(old.cluster.arrive(None, "q", group, Message(f"{group}{number}".encode(), group), True, False, 0))
    old.run(old.cluster.applied(MOVES, [MOVE + (EVERYONE,), ("q", "h", "n1", "n2", EVERYONE)], None, 0))
    ticks = [[store.message.payload for store in cluster_records(Stored, old.tick(now_ms))] for now_ms in (1, 2, 3, 4)]
    # three a tick, each group in order; what is left stays held, never delivered here
    assert ticks == [[b"g0", b"g1", b"g2"], [b"g3", b"h0", b"h1"], [b"h2", b"h3"], []]
    assert old.broker.queues["q"].depth_messages == 0 and old.delivered == []
    monkeypatch.setattr(handover, "HANDOVER_MESSAGES_PER_TICK", 100)
    monkeypatch.setattr(handover, "HANDOVER_BYTES_PER_TICK", 5)  # past it with the message that reaches it
    old.cluster.applied(ROUTES, [("q", "k", "n1")], 0, 0)
    for number in range(5):
        old.run(old.cluster.arrive(None, "q", "k", Message(b"k%d" % number * 2, "k"), True, False, 0))
    old.run(old.cluster.applied(MOVES, [("q", "k", "n1", "n2", EVERYONE)], None, 5))
    ticks = [[store.message.payload for store in cluster_records(Stored, old.tick(now_ms))] for now_ms in (6, 7, 8)]
    assert ticks == [[b"k0k0", b"k1k1"], [b"k2k2", b"k3k3"], [b"k4k4"]]
