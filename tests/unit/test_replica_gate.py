"""What waits for backups (node/core/replication/gate.py), pure."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from node.core.replication.channel import ReplicaChannel
from node.core.replication.gate import ReplicaGate
from node.core.replication.replica import STORE, ReplicaChange, ReplicaLedger


def test_a_target_is_released_once_every_backup_it_waits_on_acknowledged_its_repl_seq():
    gate = ReplicaGate()
    assert gate.wait("send", {"n2": 3, "n3": 5}) is False
    assert gate.acked("n2", 3) == []  # n3 still holds it up
    assert gate.acked("n3", 4) == []
    assert gate.acked("n3", 5) == ["send"]
    assert gate.waiting_count == 0


def test_partial_acks_release_what_they_cover_in_registration_order():
    gate = ReplicaGate()
    for number in (1, 2, 3, 4):
        gate.wait(f"send{number}", {"n2": number})
    assert gate.acked("n2", 2) == ["send1", "send2"]
    assert gate.acked("n2", 4) == ["send3", "send4"]


def test_releases_come_in_registration_order_even_when_repl_seqs_do_not():
    gate = ReplicaGate()
    gate.wait("settle", {"n2": 7})
    gate.wait("send", {"n2": 6})
    assert gate.acked("n2", 7) == ["settle", "send"]


def test_a_slow_backup_holds_up_only_what_waits_on_it():
    gate = ReplicaGate()
    gate.wait("group a", {"n3": 1})
    gate.wait("group b", {"n2": 1})
    assert gate.acked("n2", 1) == ["group b"]
    assert gate.waiting_count == 1


def test_a_backup_that_left_the_in_sync_set_is_waited_for_no_more():
    gate = ReplicaGate()
    gate.wait("both", {"n2": 1, "n3": 1})
    gate.wait("n3 only", {"n3": 2})
    gate.wait("n2 only", {"n2": 2})
    assert gate.acked("n2", 1) == []
    assert gate.dropped("n3") == ["both", "n3 only"]
    assert gate.dropped("n3") == []
    assert gate.waiting_count == 1


def test_an_ack_that_came_before_the_registration_counts_and_so_does_no_backup_at_all():
    gate = ReplicaGate()
    assert gate.acked("n2", 5) == []
    assert gate.wait("send", {"n2": 5}) is True
    assert gate.wait("unreplicated", {}) is True
    assert gate.wait("later", {"n2": 6}) is False and gate.waiting_count == 1


def test_an_ack_below_the_backups_mark_changes_nothing():
    gate = ReplicaGate()
    gate.acked("n2", 5)
    gate.wait("send", {"n2": 6})
    assert gate.acked("n2", 3) == [] and gate.high_water_of("n2") == 5


def test_abandon_hands_back_every_waiting_target_in_order_and_forgets_the_marks():
    gate = ReplicaGate()
    gate.acked("n2", 9)
    gate.wait("first", {"n3": 1})
    gate.wait("second", {"n2": 10, "n3": 2})
    assert gate.abandon() == ["first", "second"]
    assert gate.waiting_count == 0 and gate.high_water_of("n2") == 0
    assert gate.wait("new epoch", {"n2": 1}) is False  # repl_seq 1 of the new epoch is not covered by 9
    assert gate.acked("n3", 5) == []


BACKUPS = ("n2", "n3", "n4")
events = st.lists(st.one_of(
    st.tuples(st.just("wait"), st.dictionaries(st.sampled_from(BACKUPS), st.integers(1, 12), max_size=3)),
    st.tuples(st.just("acked"), st.sampled_from(BACKUPS), st.integers(0, 12)),
    st.tuples(st.just("dropped"), st.sampled_from(BACKUPS))), max_size=40)


@settings(max_examples=300, deadline=None)
@given(events)
def test_the_gate_agrees_with_a_model_that_checks_every_waiter_after_every_event(steps):
    """The model keeps every waiter with what it still needs, and after each event releases, in
    registration order, each one whose every backup is past its repl_seq or dropped."""
    gate = ReplicaGate()
    marks = {backup: 0 for backup in BACKUPS}
    waiting: list[tuple[int, dict]] = []  # (target, needs) in registration order
    released_ever: list[int] = []
    for number, step in enumerate(steps):
        if step[0] == "wait":
            needs = dict(step[1])
            done = all(marks[backup] >= repl_seq for backup, repl_seq in needs.items())
            assert gate.wait(number, needs) is done
            if done:
                released_ever.append(number)
            else:
                waiting.append((number, needs))
            continue
        if step[0] == "acked":
            _, backup, high_water = step
            marks[backup] = max(marks[backup], high_water)
            released = gate.acked(backup, high_water)
        else:
            backup = step[1]
            for _, needs in waiting:
                needs.pop(backup, None)
            released = gate.dropped(backup)
        expected = [target for target, needs in waiting
                    if all(marks[name] >= repl_seq for name, repl_seq in needs.items())]
        assert released == expected
        waiting = [(target, needs) for target, needs in waiting if target not in expected]
        released_ever += released
        assert gate.waiting_count == len(waiting)
    assert len(released_ever) == len(set(released_ever))  # never twice
    assert gate.abandon() == [target for target, _ in waiting]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["send", "send", "call", "answer", "answer lost", "fail", "wait"]), max_size=60))
def test_joined_to_a_channel_and_a_ledger_a_send_is_released_only_once_the_backup_holds_it(steps):
    """The owner's channel, the backup's ledger and the gate, joined in memory (the adapters' part played
    here: a frame is just its kind and msg_seq), with lost answers, failures and backoff."""
    stream = ReplicaChannel("n1", "n2", batch_messages_max=3, retry_min_ms=10, retry_max_ms=40)
    ledger = ReplicaLedger("n1")
    gate = ReplicaGate()
    now_ms, call, sent, released = 0, None, [], []

    def deliver(call) -> int:
        changes = [ReplicaChange(entry.repl_seq, entry.queue, entry.group_id, STORE, int(entry.frame))
                   for entry in call.entries]
        return ledger.apply(call.epoch, changes)

    def heard(outcome) -> None:
        if outcome is not None and outcome.acked_high_water:
            released.extend(gate.acked("n2", outcome.acked_high_water))

    for step in steps + ["drain"] * 200:
        if step == "send":
            msg_seq = len(sent) + 1
            sent.append(msg_seq)
            repl_seq = stream.submit("q", "g", str(msg_seq).encode(), now_ms)
            assert gate.wait(msg_seq, {"n2": repl_seq}) is False
        elif step == "call" and call is None:
            call = stream.next_call(now_ms)
        elif step in ("answer", "answer lost", "fail", "drain") and call is not None:
            if step == "fail":
                heard(stream.failed(call, "UNAVAILABLE", now_ms))
            else:
                high_water = deliver(call)  # the backup took it, whether or not its answer comes back
                heard(stream.failed(call, "deadline", now_ms) if step == "answer lost"
                      else stream.acked(call, high_water, now_ms))
            call = None
        elif step == "drain":
            now_ms = max(now_ms, stream.retry_at_ms)
            call = stream.next_call(now_ms)
        else:
            now_ms += 5
        assert all(msg_seq in ledger.live("q", "g") for msg_seq in released)  # nothing accepted too early
    assert released == sent  # in the end every send is accepted, in order, once
    assert ledger.live("q", "g") == sent and gate.waiting_count == 0
