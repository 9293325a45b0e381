"""The owner's side of replication (node/core/replication/streams.py): what goes to which backup, what a
producer's accept waits for, the catch-up copy and the in-sync proposals. Pure: no clock, no threads."""

from __future__ import annotations

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from node.core.cluster.replicas import Replicas
from node.core.dispatch.message import Message
from node.core.effects import AcceptSend, Refuse
from node.core.errors import ResourceLimitExceeded
from node.core.replication.assignment import backups_of
from node.core.replication.channel import LAG_MS
from node.core.replication.streams import (CopyChunk, ProposeReplicaInSync, ProposeReplicaOutOfSync, ReplicaCallDue,
                                           ReplicaStreams)

OWNER, B1, B2 = "n0", "n1", "n2"
MEMBERS = (OWNER, B1, B2)


class View:
    def __init__(self, members=MEMBERS):
        self.members = {"nodes": {member: {} for member in members}, "down": {}}
        self.replicas = Replicas()

    def in_sync(self, *backups, epoch: int = 0) -> None:
        self.replicas.applied({"epochs": {OWNER: epoch} if epoch else {}, "in_sync": {OWNER: list(backups)} if backups else {}})


class Source:
    """The owner's queues: {queue: {seq: Message}}; factor per queue."""

    def __init__(self, factors=None, messages=None):
        self.factors = factors if factors is not None else {"q": 3}
        self.messages = messages or {}
        self.paged = set()

    def factor_of(self, queue):
        return self.factors.get(queue, 0)  # 0: no such queue (yet)

    def queues(self):
        return sorted(self.factors)

    def copy(self, queue, after_seq, bytes_max, wanted):
        entries, last = [], after_seq
        for seq, message in sorted(self.messages.get(queue, {}).items()):
            if seq <= after_seq:
                continue
            if wanted(message.group_id):
                entries.append((message.group_id, seq, b"S%d" % seq))
            last = seq
            if sum(len(frame) for *_, frame in entries) >= bytes_max:
                return CopyChunk(entries, last, False, True)
        return CopyChunk(entries, last, True, not self.paged)


def message(seq: int, group: str | None = "g", size: int = 10) -> Message:
    made = Message(b"x" * size, group, seq=seq)
    return made


def made(view=None, source=None, **options) -> ReplicaStreams:
    return ReplicaStreams(OWNER, view or View(), source or Source(), **options)


def calls(effects) -> list:
    return [effect for effect in effects if type(effect) is ReplicaCallDue]


def answer_all(streams, effects, now_ms, skip=()) -> list:
    """Answer every call in `effects` with its last repl_seq (backups in `skip` get no answer); the other effects."""
    out = []
    pending = list(effects)
    while pending:
        effect = pending.pop(0)
        if type(effect) is ReplicaCallDue and effect.backup not in skip:
            high_water = effect.call.entries[-1].repl_seq if effect.call.entries else 0
            pending += streams.answered(effect.backup, effect.call, high_water, "", now_ms)
        elif type(effect) is not ReplicaCallDue:
            out.append(effect)
    return out


def synced(view, streams, now_ms=1000) -> None:
    """Bring both backups in sync: the copy, the reset calls answered, the proposals applied."""
    effects = answer_all(streams, streams.tick(now_ms), now_ms)
    assert {type(e) for e in effects} == {ProposeReplicaInSync} or effects == []
    effects += answer_all(streams, streams.tick(now_ms + 1), now_ms + 1)
    proposed = sorted(e.backup for e in effects if type(e) is ProposeReplicaInSync)
    assert proposed == [B1, B2]
    view.in_sync(B1, B2)
    assert answer_all(streams, streams.tick(now_ms + 2), now_ms + 2) == []


def test_a_new_stream_resets_the_backup_copies_then_proposes_in_sync_once_acknowledged():
    source = Source(messages={"q": {1: message(1), 2: message(2, "h"), 3: message(3, None)}})
    view, streams = View(), None
    streams = made(view, source)
    effects = streams.tick(1000)
    due = calls(effects)
    assert sorted(call.backup for call in due) == [B1, B2] and all(call.reset for call in due)
    assert [e.queue for e in due[0].call.entries] == ["q"] * 3  # factor 3: both back every group
    assert not [e for e in effects if type(e) is ProposeReplicaInSync]  # nothing acknowledged yet
    assert answer_all(streams, due, 1000) == []
    assert sorted(e.backup for e in streams.tick(1001)) == [B1, B2]
    assert all(type(e) is ProposeReplicaInSync and e.epoch == 0 for e in streams.tick(1002)) is True
    assert streams.tick(1003) == []  # proposed once, not again before lag_ms


def test_an_incomplete_copy_never_proposes_in_sync():
    source = Source(messages={"q": {1: message(1)}})
    source.paged.add(1)
    streams = made(source=source)
    answer_all(streams, streams.tick(1000), 1000)
    assert not [e for e in streams.tick(1001) if type(e) is ProposeReplicaInSync]


def test_an_accept_waits_for_every_in_sync_backup_after_the_journal():
    view = View()
    streams = made(view)
    synced(view, streams)
    streams.check_room("q", message(5))
    streams.expect("p5", "q", 5)
    streams.stored("q", message(5), b"S5", 2000)
    due = calls(streams.pump(2000))
    assert sorted(call.backup for call in due) == [B1, B2] and not any(call.reset for call in due)
    assert streams.accept_now("p5") is False  # the journal is done; the backups are not
    first = [call for call in due if call.backup == B1][0]
    assert streams.answered(B1, first.call, first.call.entries[-1].repl_seq, "", 2001) == []
    second = [call for call in due if call.backup == B2][0]
    assert streams.answered(B2, second.call, second.call.entries[-1].repl_seq, "", 2002) == [AcceptSend("p5")]


def test_an_acknowledgement_before_the_journal_releases_at_once():
    view = View()
    streams = made(view)
    synced(view, streams)
    streams.expect("p5", "q", 5)
    streams.stored("q", message(5), b"S5", 2000)
    assert answer_all(streams, streams.pump(2000), 2000) == []
    assert streams.accept_now("p5") is True


def test_an_out_of_sync_backup_is_not_waited_on_and_a_leave_releases_its_waiters():
    view = View()
    streams = made(view)
    synced(view, streams)
    view.in_sync(B1)  # B2 is out
    streams.tick(3000)
    streams.expect("p5", "q", 5)
    streams.stored("q", message(5), b"S5", 3000)
    effects = answer_all(streams, streams.pump(3000), 3000, skip=(B2,))
    assert effects == [] and streams.accept_now("p5") is True  # B2 still gets the frame, nobody waits for it
    streams.expect("p6", "q", 6)
    streams.stored("q", message(6), b"S6", 3001)
    assert answer_all(streams, streams.pump(3001), 3001, skip=(B1, B2)) == []
    assert streams.accept_now("p6") is False
    assert [type(e) for e in streams.tick(3001 + 1999)] == []  # replica_lag_ms (2000) not reached
    assert [type(e) for e in streams.tick(3001 + 2000)] == [ProposeReplicaOutOfSync]  # B1 lags: out
    assert streams.accept_now("p7") is True and streams.tick(5002) == []  # p6 waits until the leave commits
    view.in_sync()  # committed
    assert streams.tick(5003)[:1] == [AcceptSend("p6")]


def test_a_full_backlog_refuses_the_send_naming_the_backup_and_takes_nothing():
    view = View()
    streams = made(view, backlog_max_messages=2)
    synced(view, streams)
    for seq in (5, 6):
        streams.check_room("q", message(seq))
        streams.stored("q", message(seq), b"S%d" % seq, 2000)
    with pytest.raises(ResourceLimitExceeded) as raised:
        streams.check_room("q", message(7))
    assert "backup n1" in str(raised.value) and "replica_backlog_max_messages" in str(raised.value)


def test_a_restarted_owner_still_listed_in_sync_refuses_until_the_leave_is_committed():
    view = View()
    view.in_sync(B1, B2)  # from the owner's previous run
    streams = made(view)
    effects = streams.tick(1000)
    assert sorted((type(e).__name__, e.backup) for e in effects) == [
        ("ProposeReplicaOutOfSync", B1), ("ProposeReplicaOutOfSync", B2)]
    with pytest.raises(ResourceLimitExceeded) as raised:
        streams.check_room("q", message(5))
    assert "re-synchronising backup" in str(raised.value)
    view.in_sync()
    assert all(call.reset for call in calls(streams.tick(1001))) is True


def test_removes_follow_their_stores_and_unreplicated_queues_send_nothing():
    view = View()
    source = Source(factors={"q": 2, "plain": 1})
    streams = made(view, source)
    synced(view, streams)
    backup = backups_of(OWNER, "q", "g", MEMBERS, 2)[0]
    streams.stored("q", message(5), b"S5", 2000)
    streams.removed("q", 5, b"R5", 2000)
    streams.stored("plain", message(6), b"S6", 2000)
    streams.removed("plain", 6, b"R6", 2000)
    due = calls(streams.pump(2000))
    assert [(call.backup, [e.frame for e in call.call.entries]) for call in due] == [(backup, [b"S5", b"R5"])]


def test_an_epoch_change_refuses_every_waiting_accept():
    view = View()
    streams = made(view)
    synced(view, streams)
    streams.expect("p5", "q", 5)
    streams.stored("q", message(5), b"S5", 2000)
    streams.pump(2000)
    assert streams.accept_now("p5") is False
    view.in_sync(epoch=1)
    effects = streams.tick(2001)
    assert [type(e) for e in effects if type(e) is not ReplicaCallDue] == [Refuse]


@hypothesis_settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["send", "ack1", "ack2", "fail1", "out2", "in2", "tick", "durable"]),
                          st.integers(0, 3)), max_size=60))
def test_an_accept_is_released_only_after_its_journal_and_every_backup_in_sync_at_its_store(steps):
    view = View()
    streams = made(view)
    synced(view, streams)
    now = 2000
    in_flight: dict = {}  # backup -> ReplicaCallDue
    stored_at: dict = {}  # target -> {backup: repl_seq it needs} for backups listed at its store
    durable: set = set()
    accepted: list = []
    high: dict = {B1: 0, B2: 0}  # what each backup acknowledged (this incarnation)
    left: set = set()  # backups whose leave was committed after a target's store
    seq = 10

    def take(effects):
        for effect in effects:
            if type(effect) is ReplicaCallDue:
                in_flight[effect.backup] = effect
            elif type(effect) is AcceptSend:
                accepted.append(effect.incoming)

    for kind, amount in steps:
        now += amount
        if kind == "send":
            seq += 1
            target = f"p{seq}"
            try:
                streams.check_room("q", message(seq))
            except ResourceLimitExceeded:
                continue
            streams.expect(target, "q", seq)
            streams.stored("q", message(seq), b"S", now)
            listed = view.replicas.in_sync_of(OWNER)
            stored_at[target] = {b: streams.streams[b].channel.last_repl_seq for b in listed}
            take(streams.pump(now))
        elif kind in ("ack1", "ack2", "fail1"):
            backup = B1 if kind != "ack2" else B2
            call = in_flight.pop(backup, None)
            if call is not None:
                if kind == "fail1":
                    take(streams.answered(backup, call.call, None, "down", now))
                else:
                    high[backup] = call.call.entries[-1].repl_seq
                    take(streams.answered(backup, call.call, high[backup], "", now))
        elif kind == "out2":
            view.in_sync(B1)
            left.add(B2)
            take(streams.tick(now))
        elif kind == "in2":
            view.in_sync(B1, B2)
            take(streams.tick(now))
        elif kind == "tick":
            take(streams.tick(now))
        else:
            for target in sorted(set(stored_at) - durable):
                durable.add(target)
                if streams.accept_now(target):
                    accepted.append(target)
    assert len(accepted) == len(set(accepted))
    for target in accepted:
        assert target in durable
        for backup, repl_seq in stored_at[target].items():
            assert high[backup] >= repl_seq or backup in left, (target, backup)


def test_a_queue_not_held_yet_is_asked_again_once_it_exists():
    view, source = View(), Source(factors={})
    streams = made(view, source)
    assert streams.replicates("new") is False  # a send's check before the send creates the queue
    source.factors["new"] = 2
    assert streams.replicates("new") is True


def test_an_old_incarnations_answer_never_touches_the_new_ones_call():
    view = View()
    streams = made(view, backlog_max_messages=1)
    [first, _] = calls(streams.tick(1000))  # empty reset calls: nothing to copy
    streams.stored("q", message(5), b"S5", 1000)
    streams.stored("q", message(6), b"S6", 1000)  # the backlog overflows: the stream broke
    assert streams.streams[first.backup].broken
    due = [call for call in calls(streams.tick(1001)) if call.backup == first.backup]
    assert due and due[0].reset  # the new incarnation's reset, in flight
    assert streams.answered(first.backup, first.call, 0, "", 1002) == []
    assert streams.streams[first.backup].channel.in_flight is due[0].call


def test_a_backup_marked_down_is_not_proposed_in_sync_and_copied_afresh_at_its_return():
    view = View()
    streams = made(view, Source(messages={"q": {1: message(1)}}))
    synced(view, streams)
    view.members["down"] = {B1: 5000}  # promoted away (or failed over): raft dropped it from the set
    view.in_sync(B2)
    effects = streams.tick(6000)
    assert not [e for e in effects if type(e) is ProposeReplicaInSync]  # it would be caught up, idle: not proposed
    assert not [e for e in streams.tick(6000 + LAG_MS) if type(e) is ProposeReplicaInSync]
    view.members["down"] = {}  # back, perhaps with an empty disk: a reset and the copy again, then in sync
    back_ms = 6500 + LAG_MS
    effects = streams.tick(back_ms)
    [due] = calls(effects)
    assert due.backup == B1 and due.reset and [entry.queue for entry in due.call.entries] == ["q"]
    assert not [e for e in effects if type(e) is ProposeReplicaInSync]
    answer_all(streams, effects, back_ms)
    assert [(type(e), e.backup) for e in streams.tick(back_ms + 1)] == [(ProposeReplicaInSync, B1)]
