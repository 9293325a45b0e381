"""node/core/dispatch/reroute.py: a queue's messages rerouted to another address, on a plain Broker."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.core.dispatch.broker import Broker
from node.core.effects import Removed, Stored
from node.core.errors import InvalidField, NotFound
from node.core.dispatch.message import Message, Outcome
from node.core.dispatch.reroute import Reroute
from node.core.dispatch.settings import QueueSettings


def _broker(target_depth_max: int = 0, durable: bool = True) -> Broker:
    broker = Broker()
    broker.declare_queue(QueueSettings(name="source", durable=durable))
    broker.declare_queue(QueueSettings(name="target", durable=durable, depth_max_messages=target_depth_max))
    return broker


def _send(broker: Broker, sends: list[tuple[str | None, str]], queue: str = "source") -> None:
    for group, body in sends:
        broker.enqueue(queue, Message(body.encode(), group), now_ms=0)


def _run(broker: Broker, reroute: Reroute, **options) -> list:
    effects: list = []
    while not reroute.done:
        batch_effects, forwards = reroute.batch(broker, 0, **options)
        effects.extend(batch_effects)
        assert not forwards  # a node alone forwards nothing
    return effects


def _bodies(broker: Broker, queue: str, group: str | None = "*") -> list[str]:
    return [m.payload.decode() for m in broker.queues[queue].browse_available()
            if group == "*" or m.group_id == group]


def test_a_groups_backlog_goes_to_the_destination_in_order_and_leaves_the_source():
    broker = _broker()
    _send(broker, [("a", "a1"), ("b", "b1"), ("a", "a2"), ("a", "a3")])
    reroute = Reroute("source", "target", group="a")
    _run(broker, reroute)
    assert (reroute.moved, reroute.stayed, reroute.stayed_reason) == (3, 0, "")
    assert _bodies(broker, "target") == ["a1", "a2", "a3"]
    assert _bodies(broker, "source") == ["b1"]


def test_the_first_n_of_a_queue_are_taken_in_queue_order_across_groups():
    broker = _broker()
    _send(broker, [("a", "a1"), ("b", "b1"), (None, "u1"), ("a", "a2"), ("b", "b2"), ("a", "a3")])
    reroute = Reroute("source", "target", count_max=4)
    _run(broker, reroute)
    assert reroute.moved == 4
    assert _bodies(broker, "target", "a") == ["a1", "a2"]
    assert _bodies(broker, "target", "b") == ["b1"]
    assert _bodies(broker, "target", None) == ["u1"]
    assert _bodies(broker, "source") == ["b2", "a3"]


def test_every_copy_is_stored_before_its_source_is_removed():
    broker = _broker()
    _send(broker, [("a", "a1"), ("a", "a2")])
    effects = _run(broker, Reroute("source", "target"))
    kinds = [(type(e).__name__, e.queue) for e in effects if isinstance(e, (Stored, Removed))]
    assert kinds == [("Stored", "target"), ("Stored", "target"), ("Removed", "source"), ("Removed", "source")]


def test_a_full_destination_stops_the_reroute_and_says_what_moved_and_what_stayed():
    broker = _broker(target_depth_max=3)
    _send(broker, [("a", "a1"), ("a", "a2"), ("b", "b1"), ("b", "b2"), ("a", "a3")])
    reroute = Reroute("source", "target")
    _run(broker, reroute)
    assert (reroute.moved, reroute.stayed) == (3, 2)
    assert "depth_max_messages=3" in reroute.stayed_reason and "3 moved before it" in reroute.stayed_reason
    assert _bodies(broker, "target") == ["a1", "a2", "a3"]
    assert _bodies(broker, "source") == ["b1", "b2"]  # a group's head never stays behind its tail


def test_a_group_with_an_unsettled_delivery_stays_whole_and_the_others_go():
    broker = _broker()
    _send(broker, [("a", "a1"), ("a", "a2"), ("b", "b1")])
    broker.attach_consumer("source", "c1", browse=False, now_ms=0)
    delivered = broker.set_credit("c1", 1, now_ms=0)  # a1 goes to c1, unsettled
    assert [type(e).__name__ for e in delivered] == ["Deliver"]
    reroute = Reroute("source", "target")
    _run(broker, reroute)
    assert (reroute.moved, reroute.stayed) == (1, 1)
    assert "group a" in reroute.stayed_reason and "not settled" in reroute.stayed_reason
    assert _bodies(broker, "target") == ["b1"]
    broker.settle("c1", delivered[0].delivery_id, Outcome.ACCEPTED, now_ms=0)
    again = Reroute("source", "target")
    _run(broker, again)
    assert (again.moved, again.stayed) == (1, 0)
    assert _bodies(broker, "target", "a") == ["a2"]


def test_a_multicast_address_gives_each_subscription_a_copy_grouped_by_its_own_header():
    broker = Broker()
    broker.declare_queue(QueueSettings(name="source", durable=False))
    broker.declare_queue(QueueSettings(name="sub.plain", durable=False, address="prices"))
    broker.declare_queue(QueueSettings(name="sub.region", durable=False, address="prices", group_header="region"))
    _send(broker, [("a", "a1"), ("a", "a2")])
    reroute = Reroute("source", "prices")
    _run(broker, reroute, regroup=lambda payload, header: f"{header}-of-{payload.decode()}")
    assert reroute.moved == 2
    assert [m.group_id for m in broker.queues["sub.plain"].browse_available()] == ["a", "a"]
    assert [m.group_id for m in broker.queues["sub.region"].browse_available()] == ["region-of-a1", "region-of-a2"]
    assert broker.queues["source"].depth_messages == 0


def test_groups_owned_elsewhere_are_forwarded_and_the_rest_stays_here():
    broker = _broker()
    _send(broker, [("a", "a1"), ("b", "b1"), ("a", "a2")])
    reroute = Reroute("source", "target")
    effects, forwards = reroute.batch(broker, 0,
                                      owner_of=lambda queue, key, size_bytes: "node-2" if key == "a" else None)
    assert reroute.done and reroute.moved == 3
    assert [(f.owner, f.queue, f.route_key, f.message.payload) for f in forwards] == [
        ("node-2", "target", "a", b"a1"), ("node-2", "target", "a", b"a2")]
    assert _bodies(broker, "target") == ["b1"]
    assert broker.queues["source"].depth_messages == 0
    assert sum(isinstance(e, Removed) for e in effects) == 3


def test_a_group_whose_owner_cannot_be_told_now_stops_the_reroute():
    broker = _broker()
    _send(broker, [("a", "a1"), ("b", "b1")])

    def owner_of(queue, key, size_bytes):
        raise NotFound(f"group {key!r} is moving")
    reroute = Reroute("source", "target")
    _run(broker, reroute, owner_of=owner_of)
    assert (reroute.moved, reroute.stayed) == (0, 2)
    assert "group 'a' is moving" in reroute.stayed_reason
    assert broker.queues["source"].depth_messages == 2


@pytest.mark.parametrize("destination, error, text", [
    ("nowhere", NotFound, "no queue or multicast address 'nowhere'"),
    ("source", InvalidField, "come back to it"),
])
def test_a_bad_destination_is_refused_before_anything_moves(destination, error, text):
    broker = _broker()
    _send(broker, [("a", "a1")])
    with pytest.raises(error, match=text):
        Reroute("source", destination).batch(broker, 0)
    assert broker.queues["source"].depth_messages == 1


def test_an_unknown_group_or_queue_is_not_found():
    broker = _broker()
    with pytest.raises(NotFound, match="no group 'x'"):
        Reroute("source", "target", group="x").batch(broker, 0)
    with pytest.raises(NotFound, match="no queue 'missing'"):
        Reroute("missing", "target").batch(broker, 0)


def test_batches_are_bounded_and_go_on_where_the_last_one_stopped():
    broker = _broker()
    _send(broker, [("a", f"a{i}") for i in range(5)] + [("b", f"b{i}") for i in range(3)])
    reroute = Reroute("source", "target")
    sizes = []
    while not reroute.done:
        before = reroute.moved
        reroute.batch(broker, 0, messages_max=3)
        sizes.append(reroute.moved - before)
    assert max(sizes) == 3 and reroute.moved == 8
    assert _bodies(broker, "target", "a") == [f"a{i}" for i in range(5)]
    assert _bodies(broker, "target", "b") == [f"b{i}" for i in range(3)]


@settings(max_examples=150, deadline=None)
@given(sends=st.lists(st.tuples(st.sampled_from(["a", "b", "c", None]), st.booleans()), max_size=30),
       count=st.one_of(st.none(), st.integers(1, 35)), group=st.sampled_from([None, "a"]),
       depth_max=st.integers(0, 20), batch_max=st.integers(1, 7))
def test_against_a_reference_model_each_group_keeps_its_order_and_nothing_is_lost_or_doubled(
        sends, count, group, depth_max, batch_max):
    """The reference: the selection in queue order (a group's, or the first `count`; all of a queue
    group by group), cut at the first message the destination has no room for; each message is at
    exactly one of the two queues, and each group's messages keep their order in both."""
    broker = _broker(target_depth_max=depth_max, durable=False)
    bodies = [(g, f"{g}{i}") for i, (g, _) in enumerate(sends)]
    _send(broker, bodies)
    if group is not None and group not in {g for g, _ in bodies}:
        with pytest.raises(NotFound):
            Reroute("source", "target", group=group, count_max=count).batch(broker, 0)
        return
    selected = [body for g, body in bodies if group is None or g == group][:count]
    if group is None and count is None:  # all of it: group by group (first arrival first), then those in no group
        firsts = list(dict.fromkeys(g for g, _ in bodies if g is not None)) + [None]
        selected = [body for g in firsts for h, body in bodies if h == g]
    room = depth_max or len(selected)
    moved_expected = selected[:room]
    reroute = Reroute("source", "target", group=group, count_max=count)
    while not reroute.done:
        reroute.batch(broker, 0, messages_max=batch_max)
    target, source = _bodies(broker, "target"), _bodies(broker, "source")
    assert sorted(target + source) == sorted(body for _, body in bodies)  # nothing lost, nothing doubled
    assert (reroute.moved, reroute.stayed) == (len(moved_expected), len(selected) - len(moved_expected))
    assert target == moved_expected
    for g in ("a", "b", "c", None):
        order = [body for h, body in bodies if h == g]
        assert [body for body in target if body in order] == order[:len([b for b in target if b in order])]
        assert _bodies(broker, "source", g) == order[len([b for b in target if b in order]):]


# ---- in a cluster: node/core/cluster/ places each copy as a send's ---------------------

def _cluster_node():
    from node.core.cluster.feed import ROUTES
    from node.core.cluster import ClusterProtocol

    broker = _broker()
    cluster = ClusterProtocol("n1", broker, handler_timeout_ms=300, seq_reserve_block=100)
    cluster.ready(0)
    cluster.applied(ROUTES, [("target", "a", "n2")], 0, 0)  # the destination's group a lives on n2
    _send(broker, [("a", "a1"), ("b", "b1"), ("a", "a2")])
    return broker, cluster


def test_in_a_cluster_copies_for_another_owner_are_journalled_in_its_channel_before_the_source_removals():
    from node.core.cluster.outbound import outbound_name
    from node.core.effects import AfterFlush, ProposeTouch, SubmitForward

    broker, cluster = _cluster_node()
    reroute = Reroute("source", "target")
    effects = cluster.rerouted(*reroute.batch(broker, 0, owner_of=cluster.reroute_owner), 0)
    stores = [effect for effect in effects if type(effect) is Stored and effect.queue.startswith("\x00")]
    assert [(store.queue, store.message.payload) for store in stores] == [(outbound_name("n2", "target"), b"a1"),
                                                                          (outbound_name("n2", "target"), b"a2")]
    applied = [e for e in effects if isinstance(e, (Stored, Removed)) and not e.queue.startswith("\x00")]  # the broker's
    assert effects.index(applied[0]) > effects.index(stores[-1])  # the source's REMOVEs come after the STOREs
    # group a's removals (its copies are the STOREs above), then group b's STORE here before its removal
    assert [(type(e).__name__, e.queue) for e in applied] == [
        ("Removed", "source"), ("Removed", "source"), ("Stored", "target"), ("Removed", "source")]
    assert type(effects[-1]) is AfterFlush  # a failed write stops the node, as a handover's
    assert _bodies(broker, "target") == ["b1"] and broker.queues["source"].depth_messages == 0

    at_batch_end = cluster.quiesced(0)
    assert [touch.entries for touch in at_batch_end if type(touch) is ProposeTouch] == [[("target", "b", "n1")]]
    [flushing] = [effect for effect in at_batch_end if type(effect) is AfterFlush]
    [submit] = cluster.flushed(flushing.what, None, 1)
    assert type(submit) is SubmitForward and [entry.payload for entry in submit.entries] == [b"a1", b"a2"]


def test_in_a_cluster_a_destination_group_on_the_move_stops_the_reroute_before_it():
    broker, cluster = _cluster_node()
    cluster.held.add(("target", "b"))  # as a move's old or new owner holds it
    reroute = Reroute("source", "target")
    effects, forwards = reroute.batch(broker, 0, owner_of=cluster.reroute_owner)
    assert (reroute.moved, reroute.stayed) == (2, 1)  # group a (first to arrive) went; b stayed
    assert "group 'b' of queue 'target' is moving between nodes" in reroute.stayed_reason
    assert [f.message.payload for f in forwards] == [b"a1", b"a2"]
    assert _bodies(broker, "source") == ["b1"]


# ---- bodies paged out to the journal (node/core/dispatch/paging.py) ----------------------------------------

def _paged_source(memory_max_bytes: int, sends: list) -> tuple:
    """A broker with a durable "source" of that memory budget and a durable "target"; `sends` ((body,
    group) pairs) enqueued on the source and reported on disk, so its newest bodies are paged out.
    Returns the broker and the sends' Stored effects."""
    broker = Broker()
    broker.declare_queue(QueueSettings(name="source", durable=True, memory_max_bytes=memory_max_bytes))
    broker.declare_queue(QueueSettings(name="target", durable=True))
    stored = [effect for body, group in sends for effect in broker.enqueue("source", Message(body, group), 0)
              if type(effect) is Stored]
    broker.journalled([("source", effect.message) for effect in stored], 0)
    return broker, stored


def test_a_body_paged_out_is_read_back_before_it_moves_and_nothing_overtakes_it():
    from node.core.effects import PageIn

    sends = [(b"a%d" % index + b"." * 98, "a") for index in range(5)]
    broker, stored = _paged_source(200, sends)
    bodies = {effect.message.seq: body for effect, (body, _) in zip(stored, sends)}  # the journal's copies
    assert broker.queues["source"].stats()["paged_bytes"] == 300

    reroute = Reroute("source", "target")
    effects, _ = reroute.batch(broker, 0)
    assert (reroute.moved, reroute.done, reroute.waiting_for_bodies) == (2, False, True)
    asked = [seq for effect in effects if type(effect) is PageIn for seq in effect.seqs]
    assert sorted(asked) == sorted(bodies)[2:]
    effects, _ = reroute.batch(broker, 0)  # nothing back yet: nothing more moves, nothing is asked twice
    assert (reroute.moved, reroute.waiting_for_bodies) == (2, True)
    assert not [effect for effect in effects if type(effect) is PageIn]

    broker.page_in("source", {seq: bodies[seq] for seq in asked}, 0)
    _run(broker, reroute)
    assert (reroute.moved, reroute.stayed) == (5, 0)
    assert [m.payload[:2] for m in broker.queues["target"].browse_available()] == [b"a0", b"a1", b"a2", b"a3", b"a4"]


def test_a_reroute_that_gives_up_waiting_for_bodies_counts_them_as_stayed():
    broker, _ = _paged_source(100, [(b"." * 100, "a")] * 3 + [(b"b0", "b")])
    reroute = Reroute("source", "target")
    reroute.batch(broker, 0)
    assert reroute.waiting_for_bodies and not reroute.done
    reroute.give_up(broker, "bodies not read back in time")
    assert reroute.done and (reroute.moved, reroute.stayed) == (1, 3)  # a0 went; a1, a2 and b0 stay
    assert "bodies not read back in time" in reroute.stayed_reason
