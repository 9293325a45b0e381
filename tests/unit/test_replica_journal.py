"""A backup's replica journal (issue 28, node/store/replica_journal.py) and its writer thread
(node/store/replica_writer.py): the owner's frames appended byte-identical and synced with the mark,
read back on reopen, live messages per group in order, torn tails, malformed frames, stale epochs and gaps
refused, resends skipped, compaction, and the writer's bound on what waits for the disk."""

from __future__ import annotations

import os
import tempfile
import threading

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from node.core.dispatch.message import Message
from node.core.errors import InvalidField, ResourceLimitExceeded
from node.store import records
from node.store.files import JOURNAL_FILE
from node.store.replica_journal import (MARK_NAME, ReplicaGap, ReplicaJournal, StaleEpoch, owners_in,
                                        replica_directory, replica_record)
from node.store.replica_writer import ReplicasUnavailable, ReplicaWriter

OWNER = "127.0.0.1:7001"
WAIT_MS = 10_000  # the writer thread's answers in these tests come at once; this only bounds a hang


def store(seq: int, group: str | None = "g", queue: str = "orders", payload: bytes | None = None, **fields) -> bytes:
    body = payload if payload is not None else b"m%d" % seq
    return records.encode_store(queue, Message(body, group, seq=seq, **fields))


def remove(seq: int, queue: str = "orders") -> bytes:
    return records.encode_remove(queue, seq)


def entry(repl_seq: int, frame: bytes, group: str | None = "g", queue: str = "orders"):
    return replica_record(f"entries[{repl_seq}] (repl_seq {repl_seq})", repl_seq, queue, group, frame)


def batch(first_repl_seq: int, *frames_and_groups):
    """entries numbered from first_repl_seq: each a frame, or (frame, group)."""
    made = []
    for offset, item in enumerate(frames_and_groups):
        frame, group = item if isinstance(item, tuple) else (item, "g")
        made.append(entry(first_repl_seq + offset, frame, group))
    return made


def opened(tmp_path, **options) -> ReplicaJournal:
    return ReplicaJournal(str(tmp_path), OWNER, **options).open()


def seqs(live: dict) -> dict:
    return {key: [message.seq for message in messages] for key, messages in live.items()}


# ---- the journal ---------------------------------------------------------------------------------

def test_frames_are_appended_byte_identical_and_synced_with_the_mark(tmp_path):
    journal = opened(tmp_path)
    frames = [store(1), store(2, group="h"), remove(1)]
    assert journal.append(3, batch(1, frames[0], (frames[1], "h"), frames[2])) == 3
    data = open(os.path.join(journal.directory, JOURNAL_FILE), "rb").read()
    assert b"".join(frames) in data  # the owner's bytes, in order, untouched
    assert journal._writer.shared.stats["fsyncs"] == 1  # one synced write per batch: frames and mark together
    assert (journal.epoch, journal.high_water) == (3, 3)
    journal.close()
    assert owners_in(str(tmp_path)) == [OWNER]
    assert replica_directory(str(tmp_path), OWNER).endswith(os.path.join("replicas", OWNER))


def test_reopen_reads_back_the_mark_and_live_lists_each_groups_messages_in_order(tmp_path):
    journal = opened(tmp_path)
    journal.append(2, batch(1, store(1), (store(2, group="h"), "h"), store(3), (store(4, group=None), None)))
    journal.append(2, batch(5, remove(1), store(5), (store(6, group="h"), "h"), (remove(2), "h")))
    journal.close()
    again = opened(tmp_path)
    assert (again.epoch, again.high_water) == (2, 8)
    live = again.live([("orders", "g"), ("orders", "h"), ("orders", None), ("other", "g")])
    assert seqs(live) == {("orders", "g"): [3, 5], ("orders", "h"): [6], ("orders", None): [4], ("other", "g"): []}
    assert live[("orders", "g")][0].payload == b"m3"
    assert again.stats()["live_records"] == 4
    again.close()


def test_a_restored_message_replaces_its_store_and_keeps_its_place(tmp_path):
    journal = opened(tmp_path)
    journal.append(1, batch(1, store(1), store(2), store(1, delivery_count=2)))  # a release, counted
    assert [(m.seq, m.delivery_count) for m in journal.live([("orders", "g")])[("orders", "g")]] == [(1, 2), (2, 0)]
    journal.close()


def test_resends_at_or_below_the_mark_are_skipped_without_a_write(tmp_path):
    journal = opened(tmp_path)
    journal.append(1, batch(1, store(1), store(2)))
    size = journal.stats()["file_bytes"]
    assert journal.append(1, batch(1, store(1), store(2))) == 2
    assert journal.stats()["file_bytes"] == size
    assert journal.append(1, batch(2, store(2), store(3))) == 3  # partly a resend: only 3 is new
    assert seqs(journal.live([("orders", "g")])) == {("orders", "g"): [1, 2, 3]}
    journal.close()


def test_a_gap_after_the_mark_is_refused_and_nothing_of_the_batch_is_written(tmp_path):
    journal = opened(tmp_path)
    journal.append(1, batch(1, store(1)))
    size = journal.stats()["file_bytes"]
    with pytest.raises(ReplicaGap) as raised:
        journal.append(1, batch(3, store(3)))
    assert "expects 2 next" in str(raised.value)
    assert journal.stats()["file_bytes"] == size and journal.high_water == 1
    journal.close()


def test_an_older_epoch_is_refused_naming_both_and_a_newer_one_restarts_the_mark(tmp_path):
    journal = opened(tmp_path)
    journal.append(4, batch(1, store(1), store(2)))
    with pytest.raises(StaleEpoch) as raised:
        journal.append(3, batch(3, store(3)))
    assert "epoch 3" in str(raised.value) and "epoch 4" in str(raised.value)
    assert journal.append(5, batch(1, store(3))) == 1  # the promoted owner's stream starts at 1
    assert (journal.epoch, journal.high_water) == (5, 1)
    journal.close()
    again = opened(tmp_path)
    assert (again.epoch, again.high_water) == (5, 1)
    with pytest.raises(StaleEpoch):
        again.append(4, batch(3, store(4)))
    assert seqs(again.live([("orders", "g")])) == {("orders", "g"): [1, 2, 3]}
    again.close()


def test_a_reset_drops_the_owners_records_and_takes_repl_seq_from_1_again(tmp_path):
    # a restarted owner numbers from 1 in the same epoch: without the reset these entries would be skipped
    journal = opened(tmp_path)
    journal.append(2, batch(1, store(1), store(2), (store(3, group="h"), "h"), store(4)))
    assert journal.append(2, batch(1, store(2), store(5))) == 4  # a plain resend: skipped, the old state stays
    assert journal.append(2, batch(1, store(2), store(5)), reset=True) == 2
    assert seqs(journal.live([("orders", "g"), ("orders", "h")])) == {("orders", "g"): [2, 5], ("orders", "h"): []}
    assert journal.append(2, batch(3, remove(2))) == 3  # the new incarnation goes on from its own mark
    with pytest.raises(ReplicaGap):
        journal.append(2, batch(2, store(9)), reset=True)  # a reset stream starts at 1
    with pytest.raises(StaleEpoch):
        journal.append(1, batch(1, store(9)), reset=True)
    assert journal.append(2, [], reset=True) == 0  # an empty reset: the copy of an empty queue
    assert seqs(journal.live([("orders", "g")])) == {("orders", "g"): []}
    journal.append(2, batch(1, store(7)))
    journal.close()
    again = opened(tmp_path)
    assert (again.epoch, again.high_water) == (2, 1)
    assert seqs(again.live([("orders", "g"), ("orders", "h")])) == {("orders", "g"): [7], ("orders", "h"): []}
    again.close()


def test_a_torn_last_frame_is_cut_on_reopen_and_its_resend_is_taken_once(tmp_path):
    journal = opened(tmp_path)
    journal.append(1, batch(1, store(1)))
    journal.append(1, batch(2, store(2), store(3)))
    journal.close()
    path = os.path.join(replica_directory(str(tmp_path), OWNER), JOURNAL_FILE)
    os.truncate(path, os.path.getsize(path) - 5)  # the second batch's mark torn: its ack was never sent
    again = opened(tmp_path)
    assert again.cut_bytes > 0
    assert again.high_water == 1
    assert again.append(1, batch(2, store(2), store(3))) == 3  # the owner resends: taken, not doubled
    assert seqs(again.live([("orders", "g")])) == {("orders", "g"): [1, 2, 3]}
    again.close()


@pytest.mark.parametrize("frame, words", [
    (store(1)[:-1], "length field says"),  # cut short
    (store(1)[:8] + b"X" + store(1)[9:], "crc does not match"),
    (records.encode_declare({"name": "orders"}), "no STORE (3) or REMOVE (4)"),
    (records.encode_delete("orders"), "no STORE (3) or REMOVE (4)"),
    (b"\x01\x00", "at least 9 bytes"),
])
def test_a_frame_that_is_no_whole_store_or_remove_is_refused_naming_the_entry(frame, words):
    with pytest.raises(InvalidField) as raised:
        replica_record("entries[4] (repl_seq 9)", 9, "orders", "g", frame)
    assert str(raised.value).startswith("entries[4] (repl_seq 9).frame: not a whole STORE or REMOVE")
    assert words in str(raised.value)


@pytest.mark.parametrize("queue, group, frame, words", [
    ("other", "g", store(1), "names queue 'other' but its frame is of queue 'orders'"),
    ("orders", "h", store(1), "names group 'h' but its STORE frame is of group 'g'"),
    ("orders", None, store(1), "names group None"),
    ("\x00outbound", "g", store(1, queue="\x00outbound"), "cluster's own records"),
])
def test_an_entry_whose_frame_is_of_another_queue_or_group_is_refused(queue, group, frame, words):
    with pytest.raises(InvalidField) as raised:
        replica_record("entries[0] (repl_seq 1)", 1, queue, group, frame)
    assert words in str(raised.value)


def test_a_remove_names_no_group_and_is_taken_for_any_group_of_its_queue():
    assert replica_record("entries[0]", 1, "orders", "h", remove(5)).seq == 5


def test_compaction_keeps_the_live_records_and_the_mark(tmp_path):
    journal = opened(tmp_path, compact_min_bytes=4096)
    for repl_seq in range(1, 200, 2):
        seq = (repl_seq + 1) // 2
        journal.append(1, batch(repl_seq, store(seq, payload=b"x" * 100), remove(seq)))
    journal.append(1, batch(201, store(500)))
    assert journal.stats()["compactions"] >= 1
    assert journal.stats()["file_bytes"] < 4096
    journal.close()
    again = opened(tmp_path)
    assert (again.epoch, again.high_water) == (1, 201)
    assert seqs(again.live([("orders", "g")])) == {("orders", "g"): [500]}
    again.close()


def test_the_mark_is_a_declare_no_queue_can_have():
    assert MARK_NAME.startswith("\x00")


# ---- the writer thread ---------------------------------------------------------------------------

def test_the_writer_thread_owns_every_owners_journal_and_reopens_them(tmp_path):
    writer = ReplicaWriter(str(tmp_path), "127.0.0.1:7002")
    writer.start()
    assert writer.submit(OWNER, 2, batch(1, store(1), store(2)), WAIT_MS) == (2, 2)
    assert writer.submit("127.0.0.1:7003", 1, batch(1, store(9)), WAIT_MS) == (1, 1)
    assert writer.submit(OWNER, 2, batch(1, store(1), store(2)), WAIT_MS) == (2, 2)  # a resend
    writer.close()
    with pytest.raises(ReplicasUnavailable):
        writer.submit(OWNER, 2, batch(3, store(3)), WAIT_MS)
    again = ReplicaWriter(str(tmp_path), "127.0.0.1:7002")
    again.start()
    assert [(s["owner"], s["high_water"]) for s in again.stats(WAIT_MS)] == [(OWNER, 2), ("127.0.0.1:7003", 1)]
    assert seqs(again.live(OWNER, [("orders", "g")], WAIT_MS)) == {("orders", "g"): [1, 2]}
    assert again.live("127.0.0.1:7009", [("orders", "g")], WAIT_MS) == {("orders", "g"): []}
    assert owners_in(str(tmp_path)) == [OWNER, "127.0.0.1:7003"]  # live() of an unknown owner made nothing
    with pytest.raises(StaleEpoch):
        again.submit(OWNER, 1, batch(3, store(3)), WAIT_MS)
    again.close()


def test_a_batch_older_than_its_owners_epoch_in_the_route_table_is_refused_before_the_journal(tmp_path):
    writer = ReplicaWriter(str(tmp_path), "127.0.0.1:7002")
    writer.start()
    try:
        assert writer.submit(OWNER, 1, batch(1, store(1)), WAIT_MS) == (1, 1)
        writer.know_epochs({OWNER: 2})  # the leader promoted another node for OWNER's groups
        with pytest.raises(StaleEpoch) as raised:
            writer.submit(OWNER, 1, batch(2, store(2)), WAIT_MS)
        assert "epoch 1" in str(raised.value) and "epoch 2 the route table gives it" in str(raised.value)
        assert writer.submit("127.0.0.1:7003", 1, batch(1, store(9)), WAIT_MS) == (1, 1)  # other owners unaffected
        assert seqs(writer.live(OWNER, [("orders", "g")], WAIT_MS)) == {("orders", "g"): [1]}
    finally:
        writer.close()


def test_what_waits_for_the_disk_is_bounded_and_a_slow_batch_times_out(tmp_path, monkeypatch):
    release = threading.Event()
    appending = threading.Event()
    real_append = ReplicaJournal.append

    def slow_append(journal, epoch, entries):
        appending.set()
        release.wait()
        return real_append(journal, epoch, entries)

    monkeypatch.setattr(ReplicaJournal, "append", slow_append)
    writer = ReplicaWriter(str(tmp_path), "127.0.0.1:7002", queued_bytes_max=100)
    writer.start()
    answers = []
    first = threading.Thread(target=lambda: answers.append(writer.submit(OWNER, 1, batch(1, store(1)), WAIT_MS)))
    first.start()
    assert appending.wait(WAIT_MS / 1000)
    with pytest.raises(TimeoutError) as raised:  # queued behind the blocked batch: not durable in time
        writer.submit(OWNER, 1, batch(2, store(2)), 1)
    assert "resend it" in str(raised.value)
    with pytest.raises(ResourceLimitExceeded) as refused:  # the queued one holds the bound's bytes
        writer.submit(OWNER, 1, batch(2, store(2, payload=b"y" * 100)), WAIT_MS)
    assert "backup 127.0.0.1:7002" in str(refused.value) and "limit 100 bytes" in str(refused.value)
    release.set()
    first.join()
    assert answers == [(1, 1)]
    assert writer.submit(OWNER, 1, batch(2, store(2), store(3)), WAIT_MS) == (3, 1)  # the timed-out one was written
    writer.close()


def test_a_write_the_disk_refuses_takes_nothing_and_the_resend_is_taken_after(tmp_path, monkeypatch):
    import errno
    from node.store import writer as writer_module
    journal = opened(tmp_path)
    journal.append(1, batch(1, store(1)))
    size = journal.stats()["file_bytes"]

    def full(fd, data, offset):
        os.pwrite(fd, bytes(data)[:5], offset)  # a torn start, as a full disk leaves
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(writer_module, "write_all_synced", full)
    monkeypatch.setattr(writer_module, "write_all", full)
    with pytest.raises(ResourceLimitExceeded) as raised:
        journal.append(1, batch(2, store(2)))
    assert "disk full" in str(raised.value) and OWNER in str(raised.value)
    assert journal.high_water == 1 and journal.stats()["file_bytes"] == size
    monkeypatch.undo()
    assert journal.append(1, batch(2, store(2))) == 2
    journal.close()
    again = opened(tmp_path)
    assert again.cut_bytes == 0 and again.high_water == 2
    assert seqs(again.live([("orders", "g")])) == {("orders", "g"): [1, 2]}
    again.close()


# a change of the owner's: ("store", group) a new message, ("remove", k) the k-th live one, ("restore", k) it
# stored again with its delivery count raised (a release); then how many of them a batch carries, resent or not
CHANGES = st.lists(st.one_of(st.tuples(st.just("store"), st.sampled_from(["g", "h", None])),
                             st.tuples(st.sampled_from(["remove", "restore"]), st.integers(0, 20))), max_size=30)


@hypothesis_settings(max_examples=40, deadline=None)
@given(changes=CHANGES, batch_sizes=st.lists(st.integers(1, 5), min_size=1, max_size=10),
       resend=st.lists(st.booleans(), min_size=1, max_size=10), reopen_every=st.integers(1, 4))
def test_after_any_stores_removes_resends_and_reopens_live_is_the_owners_live_messages(
        changes, batch_sizes, resend, reopen_every):
    live_model: dict[int, tuple] = {}  # seq -> (group, delivery count), what the owner's journal holds
    stream = []  # (repl_seq, frame, group)
    next_seq = 1
    for change in changes:
        if change[0] == "store":
            live_model[next_seq] = (change[1], 0)
            stream.append((len(stream) + 1, store(next_seq, group=change[1]), change[1]))
            next_seq += 1
        elif live_model:
            seq = sorted(live_model)[change[1] % len(live_model)]
            group, count = live_model[seq]
            if change[0] == "remove":
                del live_model[seq]
                frame = remove(seq)
            else:
                live_model[seq] = (group, count + 1)
                frame = store(seq, group=group, delivery_count=count + 1)
            stream.append((len(stream) + 1, frame, group))
    with tempfile.TemporaryDirectory() as directory:
        journal = ReplicaJournal(directory, OWNER, fsync=False).open()
        sent = 0
        for number in range(len(stream)):
            if sent >= len(stream):
                break
            size = batch_sizes[number % len(batch_sizes)]
            start = max(0, sent - 2) if resend[number % len(resend)] else sent  # resend a little of the last
            records_ = [entry(repl_seq, frame, group) for repl_seq, frame, group in stream[start:sent + size]]
            sent = journal.append(7, records_)
            if number % reopen_every == 0:
                journal.close()
                journal = ReplicaJournal(directory, OWNER, fsync=False).open()
        assert journal.high_water == len(stream)
        live = journal.live([("orders", group) for group in ("g", "h", None)])
        journal.close()
    expected = {("orders", group): [(seq, count) for seq, (g, count) in sorted(live_model.items()) if g == group]
                for group in ("g", "h", None)}
    assert {key: [(m.seq, m.delivery_count) for m in messages] for key, messages in live.items()} == expected
