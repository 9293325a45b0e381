"""The outbound store's bounds (outbound_max_bytes per owner, outbound_total_max_bytes for all owners) in
node/core/cluster/forwarding.py, by example and against a reference model, with time as integers.

A producer's send for an owner whose channel is full is refused naming the owner and the bound with its
unit; nothing accepted is dropped; the channel takes sends again once its owner acknowledges; local groups
and other owners are unaffected; a handover and a relay count but are never refused.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from node.core.dispatch.broker import Broker
from node.core.cluster import ClusterProtocol
from node.core.cluster.feed import MOVES, ROUTES
from node.core.cluster.outbound import Entry, outbound_name
from node.core.effects import AcceptWhenStored, AfterFlush, EnqueueLocal, Refuse, Stored, SubmitForward
from node.core.errors import ResourceLimitExceeded
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings

OWNERS = {"g1": "n1", "g2": "n2", "g3": "n3"}  # group -> the node its route names; this node is n1


def protocol(follows_consumers: bool = False, **bounds) -> ClusterProtocol:
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    cluster = ClusterProtocol("n1", broker, handler_timeout_ms=300, routes_max=10, seq_reserve_block=100,
                              follows_consumers=follows_consumers, **bounds)
    cluster.ready(0)
    cluster.applied(ROUTES, [("q", group, owner) for group, owner in sorted(OWNERS.items())], 0, 0)
    return cluster


def send(cluster: ClusterProtocol, incoming: str, group: str, size_bytes: int, now_ms: int = 0) -> list:
    payload = incoming.encode().ljust(size_bytes, b".")
    return cluster.arrive(incoming, "q", group, Message(payload, group), True, False, now_ms)


def of(kind, effects: list) -> list:
    return [effect for effect in effects if type(effect) is kind]


def outbound_stores(effects: list) -> list:
    """The STOREs of the cluster's own journal names (outbound channels), not a queue's."""
    return [effect for effect in of(Stored, effects) if effect.queue.startswith("\x00")]


def flush(cluster: ClusterProtocol, now_ms: int = 0) -> list[SubmitForward]:
    """End the batch and let the journal say every write is on disk; the forwards that may leave now."""
    pending, submitted = list(cluster.quiesced(now_ms)), []
    while pending:
        effect = pending.pop(0)
        if type(effect) is AfterFlush:
            pending.extend(cluster.flushed(effect.what, None, now_ms))
        elif type(effect) is SubmitForward:
            submitted.append(effect)
    return submitted


def test_sends_for_an_owner_are_refused_past_its_bound_naming_the_owner_and_the_limit_in_bytes():
    cluster = protocol(outbound_max_bytes=1000)
    for index in range(4):
        assert of(AcceptWhenStored, send(cluster, f"m{index}", "g2", 250))
    effects = send(cluster, "m4", "g2", 1)
    [refused] = effects
    assert type(refused) is Refuse and refused.incoming == "m4"
    assert isinstance(refused.error, ResourceLimitExceeded)
    description = refused.error.description
    assert "owner node n2" in description and "outbound_max_bytes = 1000 bytes" in description
    assert "has not taken the 1000 bytes node n1 holds for it" in description
    assert cluster.outbound.depth_bytes == {"n2": 1000}  # nothing accepted was dropped, the refused one not added
    assert cluster.status()["outbound_refused"] == {"n2": 1}
    assert cluster.counts["outbound_refused"] == 1


def test_sends_for_an_owner_are_refused_at_its_bound_in_messages_whatever_their_size():
    # each message keeps a record in memory even with its body paged: bytes alone do not bound that
    cluster = protocol(outbound_max_bytes=1 << 20, outbound_max_messages=3)
    for index in range(3):
        assert of(AcceptWhenStored, send(cluster, f"m{index}", "g2", 10))
    [refused] = send(cluster, "m3", "g2", 10)
    assert type(refused) is Refuse and "outbound_max_messages = 3 messages per owner" in refused.error.description
    assert "owner node n2" in refused.error.description
    assert of(AcceptWhenStored, send(cluster, "m4", "g3", 10))  # another owner is unaffected
    flush(cluster)
    cluster.acknowledged("n2", max(cluster.outbound.channels["n2"]))
    assert of(AcceptWhenStored, send(cluster, "m5", "g2", 10))  # its owner took its backlog


def test_a_refused_send_stores_nothing_and_every_accepted_one_is_forwarded_in_order():
    cluster = protocol(outbound_max_bytes=500)
    accepted = [f"m{index}" for index in range(5) if of(AcceptWhenStored, send(cluster, f"m{index}", "g2", 200))]
    assert accepted == ["m0", "m1"]
    [submit] = flush(cluster)
    assert submit.owner == "n2"
    assert [entry.payload.rstrip(b".") for entry in submit.entries] == [b"m0", b"m1"]


def test_the_channel_takes_sends_again_once_its_owner_acknowledged_its_backlog():
    cluster = protocol(outbound_max_bytes=500)
    send(cluster, "m0", "g2", 300)
    send(cluster, "m1", "g2", 200)
    assert of(Refuse, send(cluster, "m2", "g2", 100))
    [submit] = flush(cluster)
    cluster.acknowledged("n2", submit.entries[0].forward_seq)  # the owner is back and took m0
    assert of(AcceptWhenStored, send(cluster, "m3", "g2", 300))
    assert of(Refuse, send(cluster, "m4", "g2", 1))
    cluster.acknowledged("n2", max(cluster.outbound.channels["n2"]))
    assert cluster.outbound.depth_bytes == {}
    assert of(AcceptWhenStored, send(cluster, "m5", "g2", 500))


def test_after_a_refusal_a_smaller_send_that_would_fit_is_refused_too_until_the_owner_takes_some():
    cluster = protocol(outbound_max_bytes=1000)
    send(cluster, "m0", "g2", 600)
    send(cluster, "m1", "g2", 300)
    assert of(Refuse, send(cluster, "big", "g2", 200))  # 1100 > 1000
    assert of(Refuse, send(cluster, "small", "g2", 50))  # 950 would fit, but must not overtake "big"
    assert of(AcceptWhenStored, send(cluster, "other", "g3", 50))  # another owner's channel is not held up
    [submit] = [s for s in flush(cluster) if s.owner == "n2"]
    cluster.acknowledged("n2", 0)  # an old acknowledgement takes nothing: still refusing
    assert of(Refuse, send(cluster, "small", "g2", 50))
    cluster.acknowledged("n2", submit.entries[0].forward_seq)  # m0 taken: 300 bytes held
    assert of(AcceptWhenStored, send(cluster, "big", "g2", 200))


def test_local_groups_and_other_owners_are_unaffected_by_a_full_channel():
    cluster = protocol(outbound_max_bytes=100)
    send(cluster, "m0", "g2", 100)
    assert of(Refuse, send(cluster, "m1", "g2", 1))
    assert of(AcceptWhenStored, send(cluster, "m2", "g3", 100))
    [local] = send(cluster, "m3", "g1", 10_000)
    assert type(local) is EnqueueLocal


def test_an_empty_channel_takes_a_message_larger_than_the_bound_so_it_is_not_refused_forever():
    cluster = protocol(outbound_max_bytes=100)
    assert of(AcceptWhenStored, send(cluster, "big", "g2", 5000))
    assert of(Refuse, send(cluster, "next", "g2", 1))


def test_the_node_wide_bound_counts_every_owner_and_names_the_owner_of_the_refused_send():
    cluster = protocol(outbound_max_bytes=1000, outbound_total_max_bytes=1500)
    send(cluster, "m0", "g2", 1000)
    assert of(AcceptWhenStored, send(cluster, "m1", "g3", 500))
    [refused] = of(Refuse, send(cluster, "m2", "g3", 1))
    assert "owner node n3" in refused.error.description
    assert "outbound_total_max_bytes = 1500 bytes for all owners together" in refused.error.description


def test_no_bound_is_the_default_of_the_pure_core():
    cluster = protocol()
    for index in range(50):
        assert of(AcceptWhenStored, send(cluster, f"m{index}", "g2", 10_000))


def test_a_waiting_send_is_refused_when_its_route_arrives_naming_a_full_owner():
    cluster = protocol(outbound_max_bytes=100)
    send(cluster, "m0", "g2", 100)
    assert send(cluster, "m1", "g9", 10) == []  # waits for a route
    [refused] = of(Refuse, cluster.applied(ROUTES, [("q", "g9", "n2")], 1, 1))
    assert refused.incoming == "m1" and "owner node n2" in refused.error.description


def test_a_recovered_backlog_counts_toward_the_bound():
    cluster = protocol(outbound_max_bytes=100)
    message = Message(b"x" * 100, "g2")
    message.seq = 5
    cluster.recover_outbound({outbound_name("n2", "q"): [message]})
    assert cluster.outbound.stats()["n2"]["journal_bytes"] == 100
    assert of(Refuse, send(cluster, "m0", "g2", 1))


def test_recovery_merges_a_channels_journal_names_in_seq_order_and_empties_their_lists():
    cluster = protocol()
    cluster.broker.declare_queue(QueueSettings(name="p", durable=True))
    by_name = {outbound_name("n2", "q"): [Message(b"q", "g2", seq=seq) for seq in (2, 5, 6)],
               outbound_name("n2", "p"): [Message(b"p", "g2", seq=seq) for seq in (4, 1)],  # any order
               outbound_name("n3", "q"): [Message(b"q", "g3", seq=3)]}
    assert cluster.recover_outbound(by_name) == 6
    assert all(messages == [] for messages in by_name.values())
    assert list(cluster.outbound.channels["n2"]) == [1, 2, 4, 5, 6]
    assert cluster.in_transit() == {"p": 2, "q": 4}
    forwards = of(SubmitForward, cluster.quiesced(0))
    assert {forward.owner: [(entry.forward_seq, entry.queue) for entry in forward.entries]
            for forward in forwards} == {"n2": [(1, "p"), (2, "q"), (4, "p"), (5, "q"), (6, "q")], "n3": [(3, "q")]}
    assert cluster.broker.next_seq >= 7


def test_recovery_takes_the_journals_bodiless_backlogs_merged_with_lists_and_reads_their_bodies_back():
    from array import array

    from node.core.effects import ReadOutbound
    from node.store.journal import BodilessBacklog

    cluster = protocol(outbound_memory_max_bytes=1000)
    cluster.broker.declare_queue(QueueSettings(name="p", durable=True))
    bodiless = BodilessBacklog(array("q", [2, 5, 9]), ["g2", None, "g2"], array("q", [10, 20, 30]))
    with_bodies = [Message(b"p" * 40, "g2", seq=seq) for seq in (1, 4)]  # a queue's: lists stay possible
    by_name = {outbound_name("n2", "q"): bodiless, outbound_name("n2", "p"): with_bodies,
               outbound_name("n3", "q"): BodilessBacklog(array("q", [3]), ["g3"], array("q", [7]))}
    assert cluster.recover_outbound(by_name) == 6
    assert len(bodiless) == 0 and bodiless.group_ids == [] and len(bodiless.size_bytes) == 0
    assert with_bodies == []
    channel = cluster.outbound.channels["n2"]
    assert [(seq, key, size_bytes) for seq, (key, _name, size_bytes) in channel.items()] == [
        (1, ("p", "g2"), 40), (2, ("q", "g2"), 10), (4, ("p", "g2"), 40), (5, ("q", None), 20),
        (9, ("q", "g2"), 30)]
    assert cluster.outbound.count("n2", ("q", "g2")) == 2 and cluster.in_transit() == {"p": 2, "q": 4}
    assert cluster.broker.next_seq >= 10 and cluster.forwarding.recovered_top == {"n2": 9, "n3": 3}
    effects = cluster.quiesced(0)
    # the first goes with its body; from the first bodiless one on, all wait paged (the bodied 4 too, behind
    # 2) and are read back together, the budget having room for them
    assert [[entry.forward_seq for entry in forward.entries] for forward in of(SubmitForward, effects)] == [[1]]
    assert {read.owner: read.reads for read in of(ReadOutbound, effects)} == {
        "n2": ((outbound_name("n2", "q"), (2, 5, 9)), (outbound_name("n2", "p"), (4,))),
        "n3": ((outbound_name("n3", "q"), (3,)),)}


def test_recovery_takes_bodiless_backlogs_longer_than_a_chunk_whole_and_in_seq_order():
    from array import array

    from node.core.cluster.recovery import RECOVERY_CHUNK_ENTRIES
    from node.store.journal import BodilessBacklog

    cluster = protocol(outbound_memory_max_bytes=1000)
    count = 2 * RECOVERY_CHUNK_ENTRIES + 3  # two whole chunks and a part of one, per name
    seqs = {name: list(range(start, 2 * count + 1, 2)) for name, start in
            ((outbound_name("n2", "q"), 1), (outbound_name("n2", "p"), 2))}
    by_name = {name: BodilessBacklog(array("q", taken), [f"g{seq % 7}" for seq in taken], array("q", taken))
               for name, taken in seqs.items()}
    assert cluster.recover_outbound(by_name) == 2 * count
    assert all(len(backlog) == 0 and not backlog.group_ids and not backlog.size_bytes for backlog in by_name.values())
    channel = cluster.outbound.channels["n2"]
    assert list(channel) == list(range(1, 2 * count + 1))
    assert all(channel[seq][0][1] == f"g{seq % 7}" and channel[seq][2] == seq for seq in channel)


def test_a_handover_and_a_relay_count_toward_the_bound_but_are_never_refused():
    cluster = protocol(follows_consumers=True, outbound_max_bytes=100)
    for index in range(3):  # g1 lives here
        assert of(EnqueueLocal, send(cluster, f"m{index}", "g1", 80))
        cluster.broker.enqueue("q", Message(b"y" * 80, "g1"), 0)  # what EnqueueLocal asks of the broker
    cluster.applied(MOVES, [("q", "g1", "n1", "n2", ("n1", "n2", "n3"))], None, 1)
    cluster.applied(ROUTES, [("q", "g1", "n2")], 1, 1)
    handed = outbound_stores(cluster.tick(2, {}))
    assert len(handed) == 3 and cluster.outbound.depth_bytes["n2"] == 240  # past the bound of 100
    relayed = cluster.forward_received("n3", [Entry(7, "q", "g1", b"z" * 50, 0, False, 2)], lambda *reply: None, 3)
    assert outbound_stores(relayed) and cluster.outbound.depth_bytes["n2"] == 290
    assert of(Refuse, send(cluster, "m9", "g1", 1))  # a producer's send for n2 is refused meanwhile


@pytest.mark.parametrize("bound", [{"outbound_max_bytes": 250}, {"outbound_max_messages": 2}])
def test_a_reroute_stops_at_a_full_channel_counting_what_its_batch_promised_and_leaves_the_rest_queued(bound):
    from node.core.dispatch.reroute import Reroute

    broker = Broker()
    for name in ("source", "target"):
        broker.declare_queue(QueueSettings(name=name, durable=True))
    cluster = ClusterProtocol("n1", broker, handler_timeout_ms=300, seq_reserve_block=100, **bound)
    cluster.ready(0)
    cluster.applied(ROUTES, [("target", "a", "n2")], 0, 0)  # the destination's group a lives on n2
    for index in range(5):
        broker.enqueue("source", Message(b"x" * 100, "a"), 0)
    reroute = Reroute("source", "target")
    effects = cluster.rerouted(*reroute.batch(broker, 0, owner_of=cluster.reroute_owner), 0)
    assert len(outbound_stores(effects)) == 2 and cluster.outbound.depth_bytes == {"n2": 200}
    assert (reroute.moved, reroute.stayed) == (2, 3)
    assert "owner node n2" in reroute.stayed_reason
    assert ("outbound_max_bytes = 250 bytes" if "outbound_max_bytes" in bound
            else "outbound_max_messages = 2 messages") in reroute.stayed_reason
    assert broker.queues["source"].depth_messages == 3  # nothing lost: the rest waits in its queue


class OutboundBoundsModel(RuleBasedStateMachine):
    """Random sends (local, n2, n3), batch ends and acknowledgements against a model of the channels."""

    OWNER_MAX_BYTES = 600
    TOTAL_MAX_BYTES = 1000
    OWNER_MAX_MESSAGES = 4

    def __init__(self):
        super().__init__()
        self.cluster = protocol(outbound_max_bytes=self.OWNER_MAX_BYTES, outbound_total_max_bytes=self.TOTAL_MAX_BYTES,
                                outbound_max_messages=self.OWNER_MAX_MESSAGES)
        self.held: dict[str, list] = {"n2": [], "n3": []}  # owner -> [(seq, size, submitted)] accepted, not acked
        self.sent: dict[str, list[str]] = {"n2": [], "n3": []}  # owner -> ids accepted, in order
        self.forwarded: dict[str, list[str]] = {"n2": [], "n3": []}  # owner -> ids submitted, in order
        self.top_submitted: dict[str, int] = {"n2": 0, "n3": 0}
        self.full: set = set()  # owners (None: the node-wide bound) refusing until some backlog leaves
        self.next_id = 0

    @rule(group=st.sampled_from(sorted(OWNERS)), size_bytes=st.integers(8, 700))  # 8: room for the id
    def send(self, group, size_bytes):
        owner = OWNERS[group]
        incoming = f"m{self.next_id}"
        self.next_id += 1
        effects = send(self.cluster, incoming, group, size_bytes)
        if owner == "n1":
            assert [type(effect) for effect in effects] == [EnqueueLocal]
            return
        held_bytes = sum(size for _, size, _ in self.held[owner])
        total_bytes = sum(size for entries in self.held.values() for _, size, _ in entries)
        refuse = False
        if held_bytes and (owner in self.full or held_bytes + size_bytes > self.OWNER_MAX_BYTES):
            refuse = True
            self.full.add(owner)
        elif owner in self.full or len(self.held[owner]) >= self.OWNER_MAX_MESSAGES:
            refuse = True
            self.full.add(owner)
        elif total_bytes and (None in self.full or total_bytes + size_bytes > self.TOTAL_MAX_BYTES):
            refuse = True
            self.full.add(None)
        if refuse:
            [refused] = effects
            assert type(refused) is Refuse and f"owner node {owner}" in refused.error.description
            return
        [store] = outbound_stores(effects)
        assert of(AcceptWhenStored, effects)
        self.held[owner].append((store.message.seq, size_bytes, False))
        self.sent[owner].append(incoming)

    @rule()
    def end_batch(self):
        for submit in flush(self.cluster):
            self.forwarded[submit.owner] += [entry.payload.rstrip(b".").decode() for entry in submit.entries]
            self.top_submitted[submit.owner] = max(entry.forward_seq for entry in submit.entries)
        for owner, entries in self.held.items():
            self.held[owner] = [(seq, size, seq <= self.top_submitted[owner]) for seq, size, _ in entries]

    @rule(owner=st.sampled_from(["n2", "n3"]))
    def owner_acknowledges(self, owner):
        self.cluster.acknowledged(owner, self.top_submitted[owner])
        left = [entry for entry in self.held[owner] if not entry[2]]
        if len(left) < len(self.held[owner]):
            self.full -= {owner, None}
        self.held[owner] = left

    @invariant()
    def the_store_holds_what_the_model_holds_and_forwards_every_accepted_send_in_order(self):
        for owner, entries in self.held.items():
            assert self.cluster.outbound.depth_bytes.get(owner, 0) == sum(size for _, size, _ in entries)
            assert list(self.cluster.outbound.channels.get(owner, {})) == [seq for seq, _, _ in entries]
            assert self.forwarded[owner] == self.sent[owner][:len(self.forwarded[owner])]
        assert self.cluster.outbound.total_bytes == sum(
            size for entries in self.held.values() for _, size, _ in entries)


OutboundBoundsModel.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None,
                                                 suppress_health_check=[HealthCheck.too_slow])
test_outbound_bounds_against_the_model = OutboundBoundsModel.TestCase
