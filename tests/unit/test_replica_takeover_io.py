"""A takeover's reads and drops of a replica journal (issue 28): live_of reads every live message of the
queues asked for, in the owner's order, with payloads and delivery counts; discard removes what was taken
durably (a reopen no longer has it) without moving the stream's mark, and never touches a journal that a
newer epoch of the owner's stream has written since; the writer thread answers both without a waiter."""

from __future__ import annotations

import threading

from node.store.replica_journal import ReplicaJournal
from node.store.replica_writer import ReplicaWriter
from tests.unit.test_replica_journal import OWNER, batch, opened, remove, store

WAIT_S = 10  # bounds a hang only: the writer answers at once


def test_live_of_reads_each_queues_live_messages_in_order_and_discard_removes_them_durably(tmp_path):
    journal = opened(tmp_path)
    journal.append(3, batch(1, (store(1, "a"), "a"), (store(2, "b"), "b"), (store(3, "a", delivery_count=2), "a"), remove(1)))
    found = journal.live_of(["orders", "none"])
    assert [(m.seq, m.group_id, m.payload, m.delivery_count) for m in found["orders"]] == [
        (2, "b", b"m2", 0), (3, "a", b"m3", 2)]
    assert found["none"] == []
    assert journal.discard(3, [("orders", 3), ("orders", 1)]) == 1  # 1 was gone already
    assert (journal.epoch, journal.high_water) == (3, 4)  # the stream's mark is not the takeover's
    journal.close()
    again = ReplicaJournal(str(tmp_path), OWNER).open()
    assert [m.seq for m in again.live_of(["orders"])["orders"]] == [2]
    assert again.discard(2, [("orders", 2)]) == 0  # a newer stream (epoch 3) than what was taken: untouched
    assert [m.seq for m in again.live_of(["orders"])["orders"]] == [2]
    again.close()


def test_the_writer_answers_a_takeovers_read_and_drop_on_its_thread(tmp_path):
    writer = ReplicaWriter(str(tmp_path), "backup")
    writer.start()
    try:
        writer.submit(OWNER, 0, batch(1, (store(1, "a"), "a"), (store(2, "a"), "a")), 10_000)
        answers, done = [], threading.Event()

        def answer(result, error):
            answers.append((result, error, threading.current_thread().name))
            done.set()
        writer.live_of(OWNER, ["orders"], answer)
        assert done.wait(WAIT_S)
        result, error, thread = answers.pop()
        assert error is None and thread == "replica-writer" and [m.seq for m in result["orders"]] == [1, 2]
        done.clear()
        writer.discard(OWNER, 0, [("orders", 1), ("orders", 2)], answer)
        assert done.wait(WAIT_S) and answers.pop()[:2] == (2, None)
        done.clear()
        writer.live_of("127.0.0.1:9", ["orders"], answer)  # no journal of that owner: nothing to take
        assert done.wait(WAIT_S) and answers.pop()[:2] == ({"orders": []}, None)
    finally:
        writer.close()
    done.clear()
    writer.live_of(OWNER, ["orders"], answer)  # stopped: answered at once, with the reason
    assert answers.pop()[1] is not None


def test_a_takeovers_read_never_takes_from_a_stream_newer_than_the_epoch_taken(tmp_path):
    writer = ReplicaWriter(str(tmp_path), "backup")
    writer.start()
    try:
        writer.submit(OWNER, 2, batch(1, (store(1, "a"), "a")), 10_000)  # the old owner streams again, epoch 2
        answers, done = [], threading.Event()
        writer.live_of(OWNER, ["orders"], lambda result, error: (answers.append(result), done.set()), epoch_max=1)
        assert done.wait(WAIT_S) and answers == [{"orders": []}]
    finally:
        writer.close()
