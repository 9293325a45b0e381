"""An outbound channel's records in arrays (node/core/cluster/outbound_channel.py OutboundChannel) behave as the dict
of tuples they replace: a hypothesis machine adds entries (ascending forward seqs, some groups shared), acknowledges high
waters, forgets present entries anywhere and compacts, against a plain dict seq -> (key, journal name or
None, size) in insertion order; after every step the length, the order, membership, lookups, the head and
the per-group counts agree, and the entries of one group share one key tuple. The compaction threshold is
lowered so the arrays are compacted often. The waiting line's runs of paged seqs are checked likewise
against a deque.
"""

from __future__ import annotations

import collections

import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from node.core.cluster.outbound import Entry
from node.core.cluster.outbound_channel import OutboundChannel
from node.core.cluster.outbound_line import Waiting

OWNER = "n2"
QUEUES = ("orders", "audit")
GROUPS = ("g0", "g1", "g2", None)


class SmallChannel(OutboundChannel):
    __slots__ = ()
    compact_min_entries = 3


class SmallWaiting(Waiting):
    __slots__ = ()
    compact_min_entries = 2


def journal_name(owner: str, queue: str) -> str:
    return f"{owner}/{queue}"


def test_a_channel_reads_as_the_dict_it_replaces():
    channel = OutboundChannel(OWNER, journal_name)
    for seq in (1, 2, 4, 5, 6):
        channel.append(seq, ("orders", f"g{seq % 2}"), None if seq == 5 else journal_name(OWNER, "orders"), 10 * seq)
    channel.pop(4)
    assert list(channel) == [1, 2, 5, 6] and len(channel) == 4 and max(channel) == 6
    assert channel[5] == (("orders", "g1"), None, 50) and channel[6] == (("orders", "g0"), "n2/orders", 60)
    assert 4 not in channel and 3 not in channel and "x" not in channel and channel.get(4) is None
    with pytest.raises(KeyError):
        channel[4]
    assert channel.pop_through(5) == [(1, (("orders", "g1"), "n2/orders", 10)),
                                      (2, (("orders", "g0"), "n2/orders", 20)), (5, (("orders", "g1"), None, 50))]
    assert next(iter(channel)) == 6 and channel.key_counts == {("orders", "g0"): 1}


def test_a_seq_at_or_below_the_last_breaks_the_channel_rule():
    channel = OutboundChannel(OWNER, journal_name)
    channel.append(5, ("orders", "g0"), None, 1)
    with pytest.raises(AssertionError):
        channel.append(5, ("orders", "g0"), None, 1)


def test_a_journal_name_other_than_the_channels_own_is_kept_until_its_entry_leaves():
    channel = OutboundChannel(OWNER, journal_name)
    channel.append(1, ("orders", "g0"), "elsewhere", 1)
    channel.append(2, ("orders", "g0"), "".join(["n2/", "orders"]), 1)  # equal to the channel's: not kept
    assert channel[1][1] == "elsewhere" and channel[2][1] == "n2/orders" and channel.other_names == {1: "elsewhere"}
    channel.pop_through(1)
    assert channel.other_names == {}


class ChannelAgainstADict(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.channel = SmallChannel(OWNER, journal_name)
        self.model: dict[int, tuple] = {}
        self.top = 0  # the highest seq ever added
        self.gone: set[int] = set()  # acknowledged or forgotten

    @rule(gaps=st.lists(st.integers(1, 3), min_size=1, max_size=8), queue=st.sampled_from(QUEUES),
          group=st.sampled_from(GROUPS), name=st.sampled_from(("none", "own", "other")),
          size_bytes=st.integers(0, 100))
    def add(self, gaps, queue, group, name, size_bytes):
        for gap in gaps:
            self.top += gap
            key = (queue, None if group is None else "".join(group))  # a new tuple and string each time
            journalled = {"none": None, "own": journal_name(OWNER, queue), "other": f"other{self.top}"}[name]
            self.channel.append(self.top, key, journalled, size_bytes)
            self.model[self.top] = (key, journalled, size_bytes)

    @rule(data=st.data())
    def acknowledge(self, data):
        high_water = data.draw(st.integers(0, self.top + 1))
        expected = [(seq, record) for seq, record in self.model.items() if seq <= high_water]
        assert self.channel.pop_through(high_water) == expected
        for seq, _ in expected:
            del self.model[seq]
            self.gone.add(seq)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def forget(self, data):
        for seq in data.draw(st.lists(st.sampled_from(sorted(self.model)), min_size=1, max_size=4, unique=True)):
            assert self.channel.pop(seq) == self.model.pop(seq)
            self.gone.add(seq)

    @rule()
    def compact(self):
        self.channel._compact()

    @invariant()
    def it_reads_as_the_model(self):
        channel, model = self.channel, self.model
        assert len(channel) == len(model) and bool(channel) == bool(model)
        assert list(channel) == list(model)
        assert list(channel.items()) == list(model.items()) and channel.values() == list(model.values())
        assert next(iter(channel), None) == next(iter(model), None)
        for seq in range(self.top + 2):
            assert (seq in channel) == (seq in model)
            assert channel.get(seq) == model.get(seq)
            if seq in model:
                assert channel[seq] == model[seq] and channel.size_of(seq) == model[seq][2]
            else:
                with pytest.raises(KeyError):
                    channel[seq]

    @invariant()
    def each_group_is_counted_and_its_records_share_one_key(self):
        counts = collections.Counter(record[0] for record in self.model.values())
        assert self.channel.key_counts == counts
        assert len({id(record[0]) for record in self.channel.values()}) == len(counts)
        assert set(self.channel.other_names) == {seq for seq, record in self.model.items()
                                                 if record[1] is not None and record[1].startswith("other")}

    @invariant()
    def the_arrays_keep_little_dead_room(self):
        channel = self.channel
        assert channel.head == len(channel.seqs) or not channel.flags[channel.head] & 2  # never at a dead one
        garbage = channel.head + channel.flagged
        assert garbage < channel.compact_min_entries or 2 * garbage < len(channel.seqs) or not channel.live


ChannelAgainstADict.TestCase.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)
test_a_channel_against_a_dict = ChannelAgainstADict.TestCase


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.just("pop"), st.booleans()), max_size=60))
def test_the_waiting_line_keeps_order_with_paged_runs_in_arrays(steps):
    waiting, model, seq = SmallWaiting(), collections.deque(), 0
    for step in steps:
        if step == "pop":
            if model:
                assert waiting.first() == model[0] and waiting.popleft() == model.popleft()
        else:
            seq += 1
            item = seq if step else Entry(seq, "orders", "g", b"", 0, False, 0)  # True: paged
            waiting.append(item)
            model.append(item)
        assert bool(waiting) == bool(model)
        assert sum(len(item) if type(item) is not Entry else 1 for item in waiting.items) - waiting.head == len(model)
