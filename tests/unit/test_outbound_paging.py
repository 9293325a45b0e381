"""The outbound store's paging (node/core/cluster/outbound.py): a forwarder holds at most the budget, the rest of a
durable backlog waits as records and is read back in order.

Examples first, then a hypothesis machine that drives one owner's channel through entries made ready
(some as bare seqs, as a restart recovers them), acknowledgements (some beyond what was submitted, as
after a restart whose acknowledgement was lost), journal answers in any order, including a record the
journal no longer has, against a plain model:
every entry reaches the forwarder at most once and in forward seq order, none is skipped unless its
owner acknowledged it (or the journal lost it, reported), and the forwarder never holds more than the
budget unless it holds a single entry.
"""

from __future__ import annotations

import collections

from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from node.core.effects import ReadOutbound, SubmitForward
from node.core.dispatch.message import Message
from node.core.cluster.outbound import Entry, Outbound, outbound_name

OWNER = "n2"
QUEUE = "orders"
NAME = outbound_name(OWNER, QUEUE)


def entry(seq: int, size_bytes: int = 10) -> Entry:
    return Entry(seq, QUEUE, f"g{seq % 3}", b"x" * size_bytes, 0, False, 0)


def add(outbound: Outbound, *entries: Entry, journalled: bool = True) -> list[Entry]:
    for made in entries:
        outbound.add(OWNER, made.forward_seq, (QUEUE, made.group_id), NAME if journalled else None,
                     len(made.payload))
    return list(entries)


def submitted(effects: list) -> list[int]:
    return [made.forward_seq for effect in effects if type(effect) is SubmitForward for made in effect.entries]


def message_of(made: Entry) -> Message:
    return Message(made.payload, made.group_id, seq=made.forward_seq)


def test_without_a_budget_every_ready_entry_goes_to_the_forwarder_at_once():
    outbound, effects = Outbound(0), []
    outbound.ready(OWNER, add(outbound, *(entry(seq, 1000) for seq in range(1, 51))), effects)
    assert submitted(effects) == list(range(1, 51))
    assert outbound.stats()[OWNER]["memory_bytes"] == 50_000


def test_past_the_budget_journalled_entries_are_paged_and_read_back_in_order_as_the_owner_acknowledges():
    outbound, effects = Outbound(30), []
    outbound.ready(OWNER, add(outbound, *(entry(seq) for seq in range(1, 8))), effects)
    assert submitted(effects) == [1, 2, 3]
    assert outbound.stats()[OWNER] == {"messages": 7, "bytes": 70, "memory_messages": 3, "memory_bytes": 30,
                                       "journal_messages": 7, "journal_bytes": 70}
    effects = []
    assert outbound.acknowledge(OWNER, 2, effects) == [(NAME, 1), (NAME, 2)]
    assert effects == [ReadOutbound(OWNER, ((NAME, (4, 5)),))]
    effects = []
    outbound.read_back(NAME, {4: message_of(entry(4)), 5: message_of(entry(5))}, effects)
    assert effects == [SubmitForward(OWNER, [entry(4), entry(5)])]
    assert outbound.stats()[OWNER]["memory_messages"] == 3  # 3, 4, 5 with the forwarder; 6, 7 paged


def test_entries_recovered_without_bodies_are_paged_and_the_first_read_back_at_once():
    # a restart keeps the outbound store's bodies in the journal: its entries come as bare seqs
    outbound, effects = Outbound(20), []
    add(outbound, *(entry(seq) for seq in range(1, 5)))
    outbound.ready(OWNER, [1, 2, 3, 4], effects)
    assert effects == [ReadOutbound(OWNER, ((NAME, (1, 2)),))]
    assert outbound.paged_messages == {OWNER: 4}
    effects = []
    outbound.read_back(NAME, {1: message_of(entry(1)), 2: message_of(entry(2))}, effects)
    assert effects == [SubmitForward(OWNER, [entry(1), entry(2)])]


def test_an_entry_larger_than_the_budget_still_goes_alone():
    outbound, effects = Outbound(30), []
    outbound.ready(OWNER, add(outbound, entry(1, 100), entry(2, 100)), effects)
    assert submitted(effects) == [1]
    effects = []
    outbound.acknowledge(OWNER, 1, effects)
    assert effects == [ReadOutbound(OWNER, ((NAME, (2,)),))]


def test_a_non_durable_entry_waits_whole_in_its_place_and_a_read_holds_it_back_until_the_paged_one_before_it():
    outbound, effects = Outbound(10), []
    outbound.ready(OWNER, add(outbound, entry(1), entry(2)), effects)
    outbound.ready(OWNER, add(outbound, entry(3), journalled=False), effects)
    assert submitted(effects) == [1]
    assert outbound.stats()[OWNER]["memory_messages"] == 2  # 1 with the forwarder, 3 waiting whole
    effects = []
    outbound.acknowledge(OWNER, 1, effects)
    assert effects == [ReadOutbound(OWNER, ((NAME, (2,)),))]
    effects = []
    outbound.read_back(NAME, {2: message_of(entry(2))}, effects)
    assert submitted(effects) == [2]
    effects = []
    outbound.acknowledge(OWNER, 2, effects)
    assert submitted(effects) == [3]  # no read: it was in memory all along


def test_entries_the_owner_took_before_a_restart_leave_without_being_read_or_sent():
    outbound, effects = Outbound(10), []
    outbound.ready(OWNER, add(outbound, *(entry(seq) for seq in range(1, 6))), effects)
    assert submitted(effects) == [1]
    effects = []
    outbound.acknowledge(OWNER, 3, effects)  # the owner had 1-3 from this node's last run
    assert effects == [ReadOutbound(OWNER, ((NAME, (4,)),))]
    assert outbound.stats()[OWNER]["messages"] == 2 and outbound.paged_messages == {OWNER: 2}


def test_an_acknowledgement_while_a_read_is_out_skips_what_it_took():
    outbound, effects = Outbound(20), []
    outbound.ready(OWNER, add(outbound, *(entry(seq) for seq in range(1, 6))), effects)
    effects = []
    outbound.acknowledge(OWNER, 1, effects)
    assert effects == [ReadOutbound(OWNER, ((NAME, (3,)),))]
    effects = []
    outbound.acknowledge(OWNER, 3, effects)  # 2 was sent; 3 reached the owner before a restart here
    assert effects == []  # the read is still out: nothing later may overtake it
    outbound.read_back(NAME, {3: message_of(entry(3))}, effects)
    assert effects == [ReadOutbound(OWNER, ((NAME, (4, 5)),))]
    assert outbound.paged_messages == {OWNER: 2}


def test_a_record_the_journal_no_longer_has_leaves_the_channel_and_is_reported():
    outbound, effects = Outbound(10), []
    outbound.ready(OWNER, add(outbound, entry(1), entry(2), entry(3)), effects)
    effects = []
    outbound.acknowledge(OWNER, 1, effects)
    outbound.read_back(NAME, {2: None}, effects)
    assert outbound.lost == [(NAME, 2)]
    assert effects[-1] == ReadOutbound(OWNER, ((NAME, (3,)),))
    assert outbound.depths() == {OWNER: 1}


def test_one_read_spans_the_channels_journal_names_and_submits_once_all_are_back():
    other = outbound_name(OWNER, "payments")
    outbound, effects = Outbound(10), []
    outbound.ready(OWNER, add(outbound, entry(1), entry(2)), effects)
    outbound.add(OWNER, 3, ("payments", "g"), other, 10)
    outbound.ready(OWNER, [Entry(3, "payments", "g", b"y" * 10, 0, False, 0)], effects)
    effects = []
    outbound.memory_max_bytes = 30
    outbound.acknowledge(OWNER, 1, effects)
    assert effects == [ReadOutbound(OWNER, ((NAME, (2,)), (other, (3,))))]
    effects = []
    outbound.read_back(other, {3: Message(b"y" * 10, "g", seq=3)}, effects)
    assert effects == []
    outbound.read_back(NAME, {2: message_of(entry(2))}, effects)
    assert submitted(effects) == [2, 3]


def test_the_entries_of_one_group_share_one_route_key_until_its_last_entry_leaves():
    outbound = Outbound()
    for seq in (1, 2, 3):  # a new key tuple and group id string per message, as decoded messages bring them
        outbound.add(OWNER, seq, (QUEUE, "".join(["g", "1"])), NAME, 10)
    outbound.add(OWNER, 4, (QUEUE, "g2"), NAME, 10)
    records = outbound.channels[OWNER]
    assert records[1][0] is records[2][0] is records[3][0] and records[4][0] == (QUEUE, "g2")
    assert outbound.count(OWNER, (QUEUE, "g1")) == 3
    outbound.acknowledge(OWNER, 2)
    assert outbound.count(OWNER, (QUEUE, "g1")) == 1
    shared = records[3][0]
    outbound.add(OWNER, 5, (QUEUE, "".join(["g", "1"])), NAME, 10)
    assert records[5][0] is shared
    outbound.acknowledge(OWNER, 5)
    assert outbound.count(OWNER, (QUEUE, "g1")) == 0 and outbound.key_counts == {OWNER: {}}
    later = (QUEUE, "".join(["g", "1"]))  # the group's last entry left: a new one brings its own key
    outbound.add(OWNER, 6, later, NAME, 10)
    assert outbound.channels[OWNER][6][0] is later and outbound.count(OWNER, (QUEUE, "g1")) == 1


# ---- against a model -----------------------------------------------------------------------------

class OutboundPaging(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.budget_bytes = 25
        self.outbound = Outbound(self.budget_bytes, collections.Counter())
        self.next_seq = 1
        self.made: dict[int, Entry] = {}  # seq -> the entry as made
        self.durable: set[int] = set()  # journalled (the journal holds it until its REMOVE)
        self.journal_lost: set[int] = set()  # the journal no longer has these
        self.sent: list[int] = []  # every seq given to the forwarder, in order
        self.forwarder: list[int] = []  # seqs the forwarder holds, not acknowledged
        self.acked = 0  # the owner's high water
        self.reads: list[tuple[str, tuple]] = []  # journal reads asked for, not answered

    def _carry(self, effects: list) -> None:
        for effect in effects:
            if type(effect) is SubmitForward:
                seqs = [made.forward_seq for made in effect.entries]
                assert effect.entries == [self.made[seq] for seq in seqs]  # whole, as made
                self.sent.extend(seqs)
                self.forwarder.extend(seqs)
            else:
                assert type(effect) is ReadOutbound
                self.reads.extend(effect.reads)

    @rule(sizes=st.lists(st.integers(1, 30), min_size=1, max_size=5), journalled=st.booleans(),
          recovered=st.booleans())
    def ready(self, sizes, journalled, recovered):
        entries = []
        for size_bytes in sizes:
            made = Entry(self.next_seq, QUEUE, "g", bytes([self.next_seq % 256]) * size_bytes, 0, False, 0)
            self.made[made.forward_seq] = made
            if journalled:
                self.durable.add(made.forward_seq)
            entries.append(made)
            self.next_seq += 1
        add(self.outbound, *entries, journalled=journalled)
        effects: list = []
        if journalled and recovered:  # as after a restart: bare seqs, the bodies in the journal only
            entries = [made.forward_seq for made in entries]
        self.outbound.ready(OWNER, entries, effects)
        self._carry(effects)

    @precondition(lambda self: self.forwarder)
    @rule(data=st.data())
    def owner_acknowledges_some_it_was_sent(self, data):
        high_water = data.draw(st.sampled_from(self.forwarder))
        self._acknowledge(high_water)

    @precondition(lambda self: self.next_seq > self.acked + 1)
    @rule(data=st.data())
    def owner_acknowledges_beyond_what_this_run_sent(self, data):
        self._acknowledge(data.draw(st.integers(self.acked + 1, self.next_seq - 1)))

    def _acknowledge(self, high_water: int) -> None:
        effects: list = []
        self.outbound.acknowledge(OWNER, high_water, effects)
        self.acked = max(self.acked, high_water)
        self.forwarder = [seq for seq in self.forwarder if seq > high_water]
        self._carry(effects)

    @precondition(lambda self: self.reads)
    @rule(data=st.data(), lose=st.booleans())
    def journal_answers(self, data, lose):
        name, seqs = self.reads.pop(data.draw(st.integers(0, len(self.reads) - 1)))
        if lose:
            self.journal_lost.add(seqs[0])
        records = {seq: None if seq in self.journal_lost else message_of(self.made[seq]) for seq in seqs}
        effects: list = []
        self.outbound.read_back(name, records, effects)
        self._carry(effects)

    @invariant()
    def sent_in_order_at_most_once_and_only_what_was_paged_needed_reading(self):
        assert self.sent == sorted(set(self.sent))
        assert {seq for _, seqs in self.reads for seq in seqs} <= self.durable

    @invariant()
    def the_forwarder_holds_the_budget_at_most_or_one_entry(self):
        held_bytes = sum(len(self.made[seq].payload) for seq in self.forwarder)
        assert len(self.forwarder) <= 1 or held_bytes <= self.budget_bytes

    @invariant()
    def nothing_is_skipped_unless_the_owner_took_it_or_the_journal_lost_it(self):
        outbound = self.outbound
        channel = outbound.channels.get(OWNER, {})
        lost = {seq for _, seq in outbound.lost}
        for seq in self.made:
            if seq <= self.acked:
                assert seq not in channel
            elif seq in lost:
                assert seq not in channel and seq not in self.sent
            else:
                assert seq in channel
        # every entry still in the channel is with the forwarder, waiting, or being read, and counted right
        stats = outbound.stats().get(OWNER, {"messages": 0, "memory_messages": 0, "memory_bytes": 0, "bytes": 0})
        assert stats["messages"] == len(channel)
        paged = [seq for seq in channel if seq not in self.forwarder and seq in self.durable]
        waiting_whole = [seq for seq in channel if seq not in self.forwarder and seq not in self.durable]
        assert stats["memory_messages"] == len(channel) - len(paged) == len(self.forwarder) + len(waiting_whole)

    @invariant()
    def each_group_in_the_channel_is_counted_and_its_records_share_one_key(self):
        channel = self.outbound.channels.get(OWNER, {})
        counts = collections.Counter(record[0] for record in channel.values())
        assert self.outbound.key_counts.get(OWNER, {}) == counts
        assert len({id(record[0]) for record in channel.values()}) == len(counts)

    def teardown(self):
        # the owner takes everything it is sent and the journal answers every read: the channel drains
        for _ in range(10_000):
            if self.reads:
                name, seqs = self.reads.pop(0)
                effects: list = []
                self.outbound.read_back(name, {seq: None if seq in self.journal_lost else message_of(self.made[seq])
                                               for seq in seqs}, effects)
                self._carry(effects)
            elif self.forwarder:
                self._acknowledge(self.forwarder[-1])
            else:
                break
        assert self.outbound.depths() == {}
        lost = {seq for _, seq in self.outbound.lost}
        assert set(self.sent) | lost | set(range(1, self.acked + 1)) >= set(self.made)


OutboundPaging.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_outbound_paging_against_a_model = OutboundPaging.TestCase
