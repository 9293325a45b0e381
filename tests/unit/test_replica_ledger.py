"""A backup's bookkeeping for one owner (node/core/replication/replica.py), pure."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from node.core.replication.replica import REMOVE, STORE, ReplicaChange, ReplicaLedger, StaleEpoch
from node.store import records


def store(repl_seq: int, msg_seq: int, group: str | None = "g", queue: str = "q") -> ReplicaChange:
    return ReplicaChange(repl_seq, queue, group, STORE, msg_seq)


def remove(repl_seq: int, msg_seq: int, group: str | None = "g", queue: str = "q") -> ReplicaChange:
    return ReplicaChange(repl_seq, queue, group, REMOVE, msg_seq)


def test_the_kinds_are_the_journals_so_a_frames_kind_byte_passes_through():
    assert (STORE, REMOVE) == (records.STORE, records.REMOVE)


def test_stores_and_removes_leave_the_live_messages_of_each_group_in_order():
    ledger = ReplicaLedger("n1")
    assert ledger.apply(1, [store(1, 10), store(2, 11, "h"), store(3, 12), remove(4, 10), store(5, 13, None)]) == 5
    assert ledger.live("q", "g") == [12] and ledger.live("q", "h") == [11] and ledger.live("q", None) == [13]
    assert ledger.messages_count == 3 and ledger.groups_count == 3 and ledger.messages_by_queue() == {"q": 3}


def test_a_resent_batch_is_skipped_up_to_the_high_water():
    ledger = ReplicaLedger("n1")
    ledger.apply(1, [store(1, 10), store(2, 11)])
    assert ledger.apply(1, [store(1, 10), store(2, 11), remove(3, 10)]) == 3  # 1 and 2 skipped, 3 applied
    assert ledger.apply(1, [store(1, 10)]) == 3  # a duplicate of an old batch: nothing
    assert ledger.live("q", "g") == [11]


def test_a_batch_with_a_hole_applies_up_to_the_hole_and_says_where_to_resume():
    ledger = ReplicaLedger("n1")
    assert ledger.apply(1, [store(1, 10), store(3, 12)]) == 1
    assert ledger.apply(1, [store(4, 13)]) == 1
    assert ledger.live("q", "g") == [10]


def test_a_batch_of_an_older_epoch_is_refused_and_nothing_of_it_applied():
    ledger = ReplicaLedger("n1")
    ledger.apply(2, [store(1, 10)])
    with pytest.raises(StaleEpoch, match="epoch 1: the epoch is 2 now, so n1 no longer owns") as refused:
        ledger.apply(1, [store(2, 11)])
    assert refused.value.fault == "client" and not refused.value.retriable
    assert ledger.live("q", "g") == [10] and ledger.high_water == 1


def test_the_raft_tables_epoch_fences_the_old_owners_batches_before_any_new_one_arrives():
    ledger = ReplicaLedger("n1")
    ledger.apply(1, [store(1, 10)])
    assert ledger.fence(2) is True and ledger.fence(2) is False
    with pytest.raises(StaleEpoch):
        ledger.apply(1, [store(2, 11)])
    assert ledger.apply(2, [store(1, 11)]) == 1  # the new epoch numbers from 1
    assert ledger.live("q", "g") == [10, 11]


def test_a_newer_epoch_starts_the_high_water_again_and_keeps_the_live_messages():
    ledger = ReplicaLedger("n1")
    ledger.apply(1, [store(1, 10), store(2, 11)])
    assert ledger.apply(2, [remove(1, 10)]) == 1
    assert ledger.epoch == 2 and ledger.live("q", "g") == [11]


def test_a_re_store_keeps_its_place_and_a_remove_of_what_is_gone_is_nothing():
    ledger = ReplicaLedger("n1")
    ledger.apply(1, [store(1, 10), store(2, 11), store(3, 10), remove(4, 99), remove(5, 11), remove(6, 11)])
    assert ledger.live("q", "g") == [10] and ledger.messages_count == 1


def test_promote_hands_back_the_groups_live_messages_in_order_and_forgets_them():
    ledger = ReplicaLedger("n1")
    ledger.apply(1, [store(1, 10), store(2, 11, "h"), store(3, 12), store(4, 5, "g", "other")])
    assert ledger.promote([("q", "g"), ("q", "empty")]) == {("q", "g"): [10, 12]}
    assert ledger.live("q", "g") == [] and ledger.messages_count == 2
    assert ledger.apply(1, [remove(5, 10)]) == 5  # a late remove of a promoted message: nothing
    assert ledger.drop([("q", "h"), ("other", "g")]) == 2
    assert ledger.messages_count == 0 and ledger.groups_count == 0


@pytest.mark.parametrize("bad", [[store(1, 10), ReplicaChange(2, "q", "g", records.DECLARE, 0)],
                                 [store(2, 10), store(1, 11)], [store(1, 10), store(1, 11)]])
def test_a_malformed_batch_is_refused_naming_the_entry_and_nothing_of_it_applied(bad):
    ledger = ReplicaLedger("n1")
    with pytest.raises(ValueError, match="entry 1 .*nothing applied"):
        ledger.apply(1, bad)
    assert ledger.high_water == 0 and ledger.messages_count == 0 and ledger.epoch == 0


QUEUES = ("q1", "q2")
GROUPS = (None, "", "a", "b")


class LedgerAgainstOwner(RuleBasedStateMachine):
    """An owner changes its queues (stores, removes, re-stores) and streams every change; batches arrive
    resent, duplicated, with holes, from old epochs; acks get lost; epochs move (the owner resends what it
    does not know acknowledged) and groups are promoted or dropped. The model applies exactly the
    prefix the ledger acknowledges to a plain list per group; the ledger must agree with it at every
    step, and equal the owner's own state whenever it acknowledged the whole stream."""

    @initialize()
    def start(self):
        self.ledger = ReplicaLedger("n1")
        self.epoch = 1
        self.owner: dict[tuple, list[int]] = {}  # the owner's live messages per (queue, group)
        self.next_msg_seq = 1
        self.stream: list[tuple] = []  # this epoch's changes (queue, group, kind, msg_seq); repl_seq = index + 1
        self.known_ack = 0  # the high water the owner heard of (acks get lost)
        self.model: dict[tuple, list[int]] = {}  # what the ledger should hold: the acknowledged prefix applied
        self.model_high_water = 0
        self.old_batches: list[tuple[int, list]] = []  # (epoch, changes) sent in earlier epochs

    def send(self, first: int, last: int, hole: bool = False) -> int:
        changes = [ReplicaChange(repl_seq, *self.stream[repl_seq - 1]) for repl_seq in range(first, last + 1)
                   if not (hole and repl_seq == first + 1 and last > first)]
        self.old_batches.append((self.epoch, changes))
        high_water = self.ledger.apply(self.epoch, changes)
        expected = self.model_high_water
        for change in changes:
            if change.repl_seq == expected + 1:
                expected = change.repl_seq
            elif change.repl_seq > expected:
                break
        assert high_water == expected
        for queue, group, kind, msg_seq in self.stream[self.model_high_water:high_water]:
            seqs = self.model.setdefault((queue, group), [])
            if kind == STORE and msg_seq not in seqs:
                seqs.append(msg_seq)
            elif kind == REMOVE and msg_seq in seqs:
                seqs.remove(msg_seq)
        self.model_high_water = high_water
        return high_water

    @rule(queue=st.sampled_from(QUEUES), group=st.sampled_from(GROUPS))
    def owner_stores(self, queue, group):
        self.owner.setdefault((queue, group), []).append(self.next_msg_seq)
        self.stream.append((queue, group, STORE, self.next_msg_seq))
        self.next_msg_seq += 1

    @precondition(lambda self: any(self.owner.values()))
    @rule(data=st.data(), re_store=st.booleans())
    def owner_removes_or_re_stores(self, data, re_store):
        group = data.draw(st.sampled_from(sorted((key for key, seqs in self.owner.items() if seqs), key=repr)))
        msg_seq = data.draw(st.sampled_from(self.owner[group]))
        if not re_store:
            self.owner[group].remove(msg_seq)
        self.stream.append((*group, STORE if re_store else REMOVE, msg_seq))

    @precondition(lambda self: self.stream)
    @rule(data=st.data(), ack_lost=st.booleans(), hole=st.booleans())
    def a_batch_arrives(self, data, ack_lost, hole):
        """Any stretch of the stream starting at or before the ledger's next repl_seq (a resend, a
        duplicate, or new), or past it (a hole before it)."""
        first = data.draw(st.integers(1, len(self.stream)))
        last = data.draw(st.integers(first, len(self.stream)))
        high_water = self.send(first, last, hole)
        if not ack_lost:
            self.known_ack = max(self.known_ack, high_water)

    @precondition(lambda self: any(epoch < self.ledger.epoch for epoch, _ in self.old_batches))
    @rule(data=st.data())
    def an_old_epochs_batch_arrives_late(self, data):
        """Once the ledger knows the new epoch (fenced, or the new epoch's first batch), nothing of an
        older one applies."""
        epoch, changes = data.draw(st.sampled_from([batch for batch in self.old_batches
                                                    if batch[0] < self.ledger.epoch]))
        before = ({group: self.ledger.live(*group) for group in self.ledger.groups()}, self.ledger.high_water)
        with pytest.raises(StaleEpoch):
            self.ledger.apply(epoch, changes)
        assert ({group: self.ledger.live(*group) for group in self.ledger.groups()},
                self.ledger.high_water) == before

    @rule(data=st.data(), fenced_first=st.booleans(), drop=st.booleans())
    def the_epoch_moves(self, data, fenced_first, drop):
        """A promotion: some groups go (promoted here, or dropped: they went elsewhere); the owner starts a
        new epoch resending, from what it knows acknowledged, the changes of the groups it keeps."""
        groups = data.draw(st.lists(st.sampled_from([(queue, group) for queue in QUEUES for group in GROUPS]),
                                    unique=True, max_size=3))
        self.epoch += 1
        if fenced_first:
            assert self.ledger.fence(self.epoch)
        expected = {group: self.model[group] for group in groups if self.model.get(group)}
        if drop:
            assert self.ledger.drop(groups) == sum(len(seqs) for seqs in expected.values())
        else:
            assert self.ledger.promote(groups) == expected
        for group in groups:
            self.model.pop(group, None)
            self.owner.pop(group, None)
        self.stream = [change for change in self.stream[self.known_ack:] if change[:2] not in groups]
        self.known_ack = self.model_high_water = 0
        if not fenced_first and self.stream:
            self.send(1, 1)  # the new epoch's first batch is what fences the ledger
            self.known_ack = self.model_high_water

    @invariant()
    def the_ledger_holds_the_acknowledged_prefix_and_the_owners_state_once_caught_up(self):
        if not hasattr(self, "ledger"):
            return
        held = {group: self.ledger.live(*group) for group in self.ledger.groups()}
        assert held == {group: seqs for group, seqs in self.model.items() if seqs}
        assert self.ledger.messages_count == sum(len(seqs) for seqs in held.values())
        if self.ledger.high_water == len(self.stream) and self.ledger.epoch == self.epoch:
            assert held == {group: seqs for group, seqs in self.owner.items() if seqs}


LedgerAgainstOwner.TestCase.settings = settings(max_examples=100, stateful_step_count=30, deadline=None)
test_the_ledger_agrees_with_the_owner = LedgerAgainstOwner.TestCase
