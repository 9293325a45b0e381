"""The durable journal: record codecs, recovery, torn tails, group commit, compaction, full disks, kill -9."""

from __future__ import annotations

import copy
import errno
import logging
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings as hypothesis_settings, strategies as st

from node.amqp.conditions import INTERNAL_ERROR, RESOURCE_LIMIT, journal_failure_condition as failure_condition
from node.core.dispatch.message import Message
from node.core.dispatch.settings import QueueSettings
from node.store import records, scanner
from node.store.failures import DISK_FULL, WRITE_FAILED, JournalFailure
from node.store.journal import COMPACT_SUFFIX, JOURNAL_FILE, Journal, JournalError

REPO_ROOT = Path(__file__).resolve().parents[2]
WAIT_S = 10


def queue_settings(name: str, **changes) -> dict:
    return QueueSettings(name=name, **changes).to_dict()


def message(seq: int, payload: bytes | None = None, group_id: str | None = "g", **fields) -> Message:
    return Message(payload if payload is not None else b"m%d" % seq, group_id, seq=seq, **fields)


def fields_of(m: Message) -> tuple:
    return (m.seq, m.group_id, m.payload, m.expires_at_ms, m.closes_group, m.delivery_count,
            m.enqueued_at_ms)


def state_of(recovery) -> tuple:
    return ([q["name"] for q in recovery.queues], recovery.queues,
            {queue: [fields_of(m) for m in ms] for queue, ms in recovery.messages.items()})


class Callbacks:
    """Collects the writer thread's reports; tests wait on them with a deadline, never a sleep."""

    def __init__(self):
        self.changed = threading.Condition()
        self.durable: list[int] = []
        self.failed: list[tuple[int, str]] = []

    def on_durable(self, ticket: int) -> None:
        with self.changed:
            self.durable.append(ticket)
            self.changed.notify_all()

    def on_failed(self, ticket: int, error: str) -> None:
        with self.changed:
            self.failed.append((ticket, error))
            self.changed.notify_all()

    def wait_reported(self, ticket: int) -> None:
        with self.changed:
            reported = self.changed.wait_for(
                lambda: (self.durable and self.durable[-1] >= ticket)
                or any(t == ticket for t, _ in self.failed), timeout=WAIT_S)
        assert reported, f"ticket {ticket} neither durable nor failed within {WAIT_S} s"


def started(directory, **options) -> tuple[Journal, Callbacks]:
    journal = Journal(directory, **options)
    journal.recover()
    callbacks = Callbacks()
    journal.start(callbacks.on_durable, callbacks.on_failed)
    return journal, callbacks


def recovered(directory, **options):
    journal = Journal(directory, **options)
    try:
        return journal.recover()
    finally:
        journal.close()


def write_and_close(directory, actions, **options) -> None:
    journal, callbacks = started(directory, **options)
    for action in actions:
        action(journal)
    callbacks.wait_reported(journal.flush())
    journal.close()


# ---- records ----------------------------------------------------------------------------------

def test_every_record_kind_round_trips_through_its_frame():
    settings = queue_settings("orders", group_policy="shared", depth_max_messages=7)
    stored = Message(b"\x00payload\xff", "g\u00e9", expires_at_ms=123, closes_group=True,
                     delivery_count=4, enqueued_at_ms=99, seq=2**40)
    frames = (records.encode_declare(settings) + records.encode_delete("orders")
              + records.encode_store("orders", stored) + records.encode_remove("orders", 2**40))

    decoded = list(scanner.scan(frames))

    assert [kind for _, kind, _ in decoded] == [records.DECLARE, records.DELETE, records.STORE,
                                                records.REMOVE]
    assert decoded[0][2] == settings
    assert decoded[1][2] == "orders"
    assert decoded[2][2].queue == "orders"
    assert fields_of(decoded[2][2].message) == fields_of(stored)
    assert decoded[3][2] == records.RemoveRecord("orders", 2**40)
    assert decoded[0][0] == 0 and decoded[1][0] == len(records.encode_declare(settings))


def test_a_missing_group_id_and_an_empty_one_stay_different():
    frames = records.encode_store("q", message(1, group_id=None)) + records.encode_store("q", message(2, group_id=""))
    assert [r.message.group_id for _, _, r in scanner.scan(frames)] == [None, ""]


@hypothesis_settings(max_examples=200, deadline=None)
@given(queue=st.text(min_size=1, max_size=20), group_id=st.none() | st.text(max_size=30),
       payload=st.binary(max_size=300), seq=st.integers(0, 2**64 - 1),
       expires_at_ms=st.integers(0, 2**64 - 1), closes_group=st.booleans(),
       delivery_count=st.integers(0, 2**32 - 1), enqueued_at_ms=st.integers(0, 2**64 - 1))
def test_any_store_record_decodes_to_the_message_it_encoded(queue, group_id, payload, seq, expires_at_ms,
                                                           closes_group, delivery_count, enqueued_at_ms):
    original = Message(payload, group_id, expires_at_ms=expires_at_ms, closes_group=closes_group,
                       delivery_count=delivery_count, enqueued_at_ms=enqueued_at_ms, seq=seq)
    scan = scanner.scan(records.encode_store(queue, original))
    [(_, _, record)] = list(scan)
    assert record.queue == queue and fields_of(record.message) == fields_of(original)
    assert scan.stop_reason is None


def test_scan_stops_at_a_zero_filled_tail_and_reports_the_good_length():
    good = records.encode_remove("q", 1)
    scan = scanner.scan(good + bytes(64))
    assert len(list(scan)) == 1
    assert scan.end_offset == len(good)
    assert "impossible body length 0" in scan.stop_reason


# ---- recovery ---------------------------------------------------------------------------------

def test_recovery_returns_live_messages_per_queue_in_seq_order_without_removed_ones(tmp_path):
    def actions(journal):
        journal.declare(queue_settings("a"))
        journal.declare(queue_settings("b", durable=True, group_policy="none"))
        for seq in range(1, 11):
            journal.store("a" if seq % 2 else "b", message(seq, closes_group=seq == 9, enqueued_at_ms=seq))
        journal.remove("a", 3)
        journal.remove("b", 4)
        journal.remove("a", 999)  # unknown seq: ignored

    write_and_close(tmp_path, [actions])
    recovery = recovered(tmp_path)

    assert [q["name"] for q in recovery.queues] == ["a", "b"]
    assert recovery.queues[1] == queue_settings("b", group_policy="none")
    assert [m.seq for m in recovery.messages["a"]] == [1, 5, 7, 9]
    assert [m.seq for m in recovery.messages["b"]] == [2, 6, 8, 10]
    assert fields_of(recovery.messages["a"][3]) == fields_of(message(9, closes_group=True, enqueued_at_ms=9))
    assert recovery.cut_bytes == 0


def test_delete_drops_the_queue_and_a_redeclare_starts_it_empty_with_new_settings(tmp_path):
    def actions(journal):
        journal.declare(queue_settings("a"))
        journal.declare(queue_settings("z"))
        journal.store("a", message(1))
        journal.delete("a")
        journal.declare(queue_settings("a", group_policy="shared"))
        journal.store("a", message(2))

    write_and_close(tmp_path, [actions])
    recovery = recovered(tmp_path)

    assert [q["name"] for q in recovery.queues] == ["z", "a"]
    assert recovery.queues[1]["group_policy"] == "shared"
    assert [m.seq for m in recovery.messages["a"]] == [2]


def test_a_redeclare_replaces_the_settings_and_keeps_the_messages(tmp_path):
    def actions(journal):
        journal.declare(queue_settings("a"))
        journal.store("a", message(1))
        journal.declare(queue_settings("a", depth_max_messages=5))

    write_and_close(tmp_path, [actions])
    recovery = recovered(tmp_path)

    assert recovery.queues == [queue_settings("a", depth_max_messages=5)]
    assert [m.seq for m in recovery.messages["a"]] == [1]


def test_messages_of_a_queue_never_declared_are_still_recovered(tmp_path):
    write_and_close(tmp_path, [lambda j: j.store("auto", message(1))])
    recovery = recovered(tmp_path)
    assert recovery.queues == []
    assert [m.seq for m in recovery.messages["auto"]] == [1]


def test_a_torn_last_frame_is_cut_at_every_byte_offset(tmp_path, caplog):
    write_and_close(tmp_path / "whole", [lambda j: j.declare(queue_settings("q")),
                                         lambda j: j.store("q", message(1)),
                                         lambda j: j.store("q", message(2, payload=b"x" * 40))])
    whole = (tmp_path / "whole" / JOURNAL_FILE).read_bytes()
    last_frame_offset = len(whole) - len(records.encode_store("q", message(2, payload=b"x" * 40)))

    for cut_at in range(last_frame_offset, len(whole)):
        directory = tmp_path / f"cut{cut_at}"
        directory.mkdir()
        (directory / JOURNAL_FILE).write_bytes(whole[:cut_at])
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="node.store.journal"):
            recovery = recovered(directory)

        assert [m.seq for m in recovery.messages["q"]] == [1]
        assert recovery.cut_bytes == cut_at - last_frame_offset
        assert (directory / JOURNAL_FILE).stat().st_size == last_frame_offset
        if cut_at > last_frame_offset:
            [warning] = caplog.records
            assert str(directory / JOURNAL_FILE) in warning.getMessage()
            assert f"offset {last_frame_offset}" in warning.getMessage()
            assert f"cutting {cut_at - last_frame_offset} bytes" in warning.getMessage()
        else:
            assert not caplog.records


def test_a_corrupt_crc_in_the_middle_stops_recovery_at_that_frame_with_a_warning(tmp_path, caplog):
    write_and_close(tmp_path, [lambda j, s=seq: j.store("q", message(s)) for seq in range(1, 6)])
    path = tmp_path / JOURNAL_FILE
    data = bytearray(path.read_bytes())
    frame_bytes = len(records.encode_store("q", message(1)))
    marker_bytes = len(records.encode_format())
    data[marker_bytes + 2 * frame_bytes + 20] ^= 0x01  # a bit flip inside the third frame's body
    path.write_bytes(bytes(data))

    with caplog.at_level(logging.WARNING, logger="node.store.journal"):
        recovery = recovered(tmp_path)

    assert [m.seq for m in recovery.messages["q"]] == [1, 2]
    assert path.stat().st_size == marker_bytes + 2 * frame_bytes
    [warning] = caplog.records
    assert "crc mismatch" in warning.getMessage()
    assert f"offset {marker_bytes + 2 * frame_bytes}" in warning.getMessage()
    assert f"cutting {3 * frame_bytes} bytes" in warning.getMessage()
    assert [m.seq for m in recovered(tmp_path).messages["q"]] == [1, 2]  # once cut, stays quiet


def test_a_leftover_compaction_file_is_discarded_and_the_journal_kept(tmp_path):
    write_and_close(tmp_path, [lambda j: j.store("q", message(1))])
    (tmp_path / (JOURNAL_FILE + COMPACT_SUFFIX)).write_bytes(b"half a compaction")
    assert [m.seq for m in recovered(tmp_path).messages["q"]] == [1]
    assert not (tmp_path / (JOURNAL_FILE + COMPACT_SUFFIX)).exists()


# ---- directories ------------------------------------------------------------------------------

def test_a_missing_directory_is_created(tmp_path):
    assert recovered(tmp_path / "new" / "dir").messages == {}
    assert (tmp_path / "new" / "dir" / JOURNAL_FILE).exists()


def test_an_unusable_directory_is_refused_naming_the_path(tmp_path):
    (tmp_path / "afile").write_text("not a directory")
    directory = tmp_path / "afile" / "sub"
    with pytest.raises(JournalError) as raised:
        Journal(directory).recover()
    assert str(directory) in str(raised.value)
    assert "data_dir" in str(raised.value)


def test_a_second_journal_on_the_same_directory_is_refused(tmp_path):
    first = Journal(tmp_path)
    first.recover()
    with pytest.raises(JournalError, match="in use by another process"):
        Journal(tmp_path).recover()
    first.close()
    recovered(tmp_path)  # released on close


# ---- writer -----------------------------------------------------------------------------------

def test_tickets_increase_per_flush_and_an_empty_flush_repeats_the_last(tmp_path):
    journal, callbacks = started(tmp_path)
    assert journal.flush() == 0
    journal.store("q", message(1))
    assert journal.flush() == 1
    assert journal.flush() == 1
    journal.remove("q", 1)
    assert journal.flush() == 2
    callbacks.wait_reported(2)
    journal.close()
    assert callbacks.failed == []


def wait_written(journal: Journal, records_count: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while journal.stats()["records_written"] < records_count:
        assert time.monotonic() < deadline, f"{records_count} records not written within {WAIT_S} s"
        time.sleep(0.005)


def fail_syncs(monkeypatch) -> None:
    """Every sync fails: the fsync, and the synced write (RWF_DSYNC) that replaces write + fsync on Linux."""
    def sync_fails(*args):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", sync_fails)
    monkeypatch.setattr(os, "pwritev", sync_fails)


@pytest.mark.skipif(not hasattr(os, "RWF_DSYNC"), reason="no synced writes on this platform: write + fsync")
def test_a_batch_is_one_synced_write_without_a_separate_fsync(tmp_path, monkeypatch):
    journal, callbacks = started(tmp_path)
    calls: list[str] = []
    real_pwritev, real_fsync = os.pwritev, os.fsync
    monkeypatch.setattr(os, "pwritev", lambda *args: calls.append(f"pwritev {args[3] == os.RWF_DSYNC}")
                        or real_pwritev(*args))
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync") or real_fsync(fd))
    journal.store("q", message(1))
    callbacks.wait_reported(journal.flush())
    stats = journal.stats()
    monkeypatch.undo()
    journal.close()
    assert calls == ["pwritev True"]
    assert stats["fsyncs"] == stats["batches_written"] == 1
    assert [m.seq for m in recovered(tmp_path).messages["q"]] == [1]


def test_a_file_system_refusing_synced_writes_gets_a_write_and_an_fsync(tmp_path, monkeypatch, caplog):
    journal, callbacks = started(tmp_path)
    calls: list[str] = []
    real_fsync = os.fsync

    def refused(*args):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(os, "pwritev", refused)
    monkeypatch.setattr(os, "fsync", lambda fd: calls.append("fsync") or real_fsync(fd))
    with caplog.at_level(logging.INFO, logger="node.store.journal"):
        for seq in (1, 2):
            journal.store("q", message(seq))
            callbacks.wait_reported(journal.flush())
    monkeypatch.undo()
    journal.close()
    assert calls == ["fsync", "fsync"] and callbacks.failed == []
    assert sum("not supported" in record.getMessage() for record in caplog.records) == hasattr(os, "RWF_DSYNC")
    assert [m.seq for m in recovered(tmp_path).messages["q"]] == [1, 2]


def test_a_unit_nobody_waits_for_is_written_but_reported_only_with_a_later_one(tmp_path):
    journal, callbacks = started(tmp_path)
    journal.remove("q", 1)
    assert journal.flush(report=False) == 1
    wait_written(journal, 1)  # its own batch, so no later unit can carry it
    journal.store("q", message(2))
    assert journal.flush() == 2
    callbacks.wait_reported(2)
    journal.close()
    assert callbacks.durable == [2]


def test_a_reported_flush_of_nothing_after_an_unreported_unit_gets_a_ticket_of_its_own(tmp_path):
    journal, callbacks = started(tmp_path)
    journal.store("q", message(1))
    assert journal.flush(report=False) == 1
    assert journal.flush(report=False) == 1  # nothing new, nobody waits: no unit
    assert journal.flush() == 2  # someone waits for what is written so far: an empty unit reports it
    callbacks.wait_reported(2)
    assert journal.flush() == 2  # ticket 2 is reported already
    journal.close()
    assert callbacks.durable == [2]
    assert [m.seq for m in recovered(tmp_path).messages["q"]] == [1]


def test_a_unit_nobody_waits_for_is_still_reported_when_its_write_fails(tmp_path, monkeypatch):
    journal, callbacks = started(tmp_path)

    fail_syncs(monkeypatch)
    journal.remove("q", 1)
    callbacks.wait_reported(journal.flush(report=False))
    monkeypatch.undo()
    journal.close()
    assert [ticket for ticket, _ in callbacks.failed] == [1]


def test_units_handed_over_without_a_wake_are_written_once_the_writer_is_woken(tmp_path):
    journal, callbacks = started(tmp_path)
    for seq in (1, 2):
        journal.store("q", message(seq))
        journal.flush(wake=False)
    journal.wake_writer()
    callbacks.wait_reported(2)
    journal.close()
    assert [m.seq for m in recovered(tmp_path).messages["q"]] == [1, 2]


def test_backlog_counts_bytes_until_they_are_written(tmp_path):
    journal = Journal(tmp_path, pending_bytes_max=100)
    journal.recover()
    frame_bytes = len(records.encode_store("q", message(1, payload=b"x" * 100)))
    journal.store("q", message(1, payload=b"x" * 100))
    assert journal.backlog_bytes() == frame_bytes and journal.backlog_full()
    journal.flush()  # handed over, but no writer started yet
    assert journal.backlog_bytes() == frame_bytes
    callbacks = Callbacks()
    journal.start(callbacks.on_durable, callbacks.on_failed)
    callbacks.wait_reported(1)
    assert journal.backlog_bytes() == 0 and not journal.backlog_full()
    journal.close()


def test_many_flushes_while_the_writer_is_busy_share_one_write_and_fsync(tmp_path):
    release = threading.Event()
    journal = Journal(tmp_path, fsync=True)
    journal.recover()
    callbacks = Callbacks()

    def on_durable(ticket):
        release.wait(WAIT_S)  # holds the writer after its first batch, so the next 99 flushes queue up
        callbacks.on_durable(ticket)

    journal.start(on_durable, callbacks.on_failed)
    for seq in range(1, 101):
        journal.store("q", message(seq))
        journal.flush()
    release.set()
    callbacks.wait_reported(100)
    stats = journal.stats()
    journal.close()

    assert stats["records_written"] == 100
    assert stats["batches_written"] == stats["fsyncs"] <= 2
    assert callbacks.durable[-1] == 100 and len(callbacks.durable) <= 2
    assert [m.seq for m in recovered(tmp_path).messages["q"]] == list(range(1, 101))


def test_without_fsync_batches_are_written_but_never_synced(tmp_path):
    journal, callbacks = started(tmp_path, fsync=False)
    journal.store("q", message(1))
    callbacks.wait_reported(journal.flush())
    stats = journal.stats()
    journal.close()
    assert stats["fsyncs"] == 0 and stats["batches_written"] == 1
    assert stats["file_bytes"] == (tmp_path / JOURNAL_FILE).stat().st_size
    assert [m.seq for m in recovered(tmp_path).messages["q"]] == [1]


def test_close_writes_pending_records_and_is_idempotent(tmp_path):
    journal, _ = started(tmp_path)
    journal.store("q", message(1))  # never flushed by the caller
    journal.close()
    journal.close()
    with pytest.raises(JournalError, match="closed"):
        journal.store("q", message(2))
    unstarted = Journal(tmp_path / "unstarted")
    unstarted.recover()
    unstarted.store("q", message(3))
    unstarted.close()
    assert [m.seq for m in recovered(tmp_path).messages["q"]] == [1]
    assert [m.seq for m in recovered(tmp_path / "unstarted").messages["q"]] == [3]


def test_a_raising_callback_does_not_stop_later_confirmations(tmp_path, caplog):
    journal = Journal(tmp_path)
    journal.recover()
    callbacks = Callbacks()

    def on_durable(ticket):
        callbacks.on_durable(ticket)
        if ticket == 1:
            raise RuntimeError("runtime bug")

    journal.start(on_durable, callbacks.on_failed)
    journal.store("q", message(1))
    callbacks.wait_reported(journal.flush())
    journal.store("q", message(2))
    callbacks.wait_reported(journal.flush())
    journal.close()
    assert "runtime bug" in caplog.text


# ---- compaction -------------------------------------------------------------------------------

def test_compaction_shrinks_the_file_and_recovery_gives_the_same_state(tmp_path, caplog):
    journal, callbacks = started(tmp_path, compact_min_bytes=0)
    journal.declare(queue_settings("gone"))
    journal.declare(queue_settings("a"))
    journal.declare(queue_settings("b"))
    for seq in range(1, 201):
        journal.store(("a", "b", "gone")[seq % 3], message(seq, payload=b"p" * 50))
    journal.delete("gone")
    journal.declare(queue_settings("b", depth_max_messages=9))
    before_bytes = journal.backlog_bytes()
    for seq in range(1, 201):
        if seq % 10:
            journal.remove(("a", "b", "gone")[seq % 3], seq)
    with caplog.at_level(logging.INFO, logger="node.store.journal"):
        callbacks.wait_reported(journal.flush())
        journal.store("a", message(500))  # appended to the compacted file
        callbacks.wait_reported(journal.flush())
        stats = journal.stats()
        journal.close()

    assert stats["compactions"] >= 1
    assert stats["file_bytes"] < before_bytes / 4
    assert stats["file_bytes"] == (tmp_path / JOURNAL_FILE).stat().st_size
    assert "compacted from" in caplog.text
    recovery = recovered(tmp_path)
    assert [q["name"] for q in recovery.queues] == ["a", "b"]
    assert recovery.queues[1]["depth_max_messages"] == 9
    assert [m.seq for m in recovery.messages["a"]] == [30, 60, 90, 120, 150, 180, 500]
    assert [m.seq for m in recovery.messages["b"]] == [10, 40, 70, 100, 130, 160, 190]
    assert "gone" not in recovery.messages
    assert fields_of(recovery.messages["b"][0]) == fields_of(message(10, payload=b"p" * 50))


def test_recovery_after_compaction_equals_recovery_without_it(tmp_path):
    def actions(journal):
        journal.declare(queue_settings("a"))
        journal.declare(queue_settings("b"))
        for seq in range(1, 301):
            journal.store("ab"[seq % 2], message(seq, group_id=f"g{seq % 7}", expires_at_ms=seq * 3))
            if seq > 5 and seq % 4:
                journal.remove("ab"[(seq - 5) % 2], seq - 5)

    write_and_close(tmp_path / "plain", [actions])
    write_and_close(tmp_path / "compacted", [actions], compact_min_bytes=0)

    plain, compacted = recovered(tmp_path / "plain"), recovered(tmp_path / "compacted")
    assert state_of(compacted) == state_of(plain)
    assert (tmp_path / "compacted" / JOURNAL_FILE).stat().st_size \
        < (tmp_path / "plain" / JOURNAL_FILE).stat().st_size / 2


def test_compaction_waits_for_the_minimum_size(tmp_path):
    def actions(journal):
        for seq in range(1, 51):
            journal.store("q", message(seq))
            journal.remove("q", seq)

    write_and_close(tmp_path, [actions], compact_min_bytes=1 << 20)
    assert (tmp_path / JOURNAL_FILE).stat().st_size > 0  # all dead, but far below the minimum


# ---- full disk --------------------------------------------------------------------------------

def test_a_full_disk_fails_the_batch_and_later_batches_are_written(tmp_path, monkeypatch):
    journal, callbacks = started(tmp_path)
    journal.store("q", message(1))
    callbacks.wait_reported(journal.flush())
    size_before = (tmp_path / JOURNAL_FILE).stat().st_size
    real_pwrite = os.pwrite

    def pwrite_until_full(fd, data, offset):
        real_pwrite(fd, bytes(data[: len(data) // 2]), offset)  # a partial write, then the disk is full
        raise OSError(errno.ENOSPC, "No space left on device")

    def pwritev_until_full(fd, buffers, offset, flags=0):  # the synced write (RWF_DSYNC) of a batch
        return pwrite_until_full(fd, buffers[0], offset)

    monkeypatch.setattr(os, "pwrite", pwrite_until_full)
    monkeypatch.setattr(os, "pwritev", pwritev_until_full)
    journal.store("q", message(2))
    journal.remove("q", 1)
    failed_ticket = journal.flush()
    callbacks.wait_reported(failed_ticket)
    assert (tmp_path / JOURNAL_FILE).stat().st_size == size_before  # the partial batch was cut off
    monkeypatch.undo()

    journal.store("q", message(3))
    later_ticket = journal.flush()
    callbacks.wait_reported(later_ticket)
    stats = journal.stats()
    journal.close()

    [(ticket, error)] = callbacks.failed
    assert ticket == failed_ticket
    assert str(tmp_path / JOURNAL_FILE) in error
    assert failure_condition(error) == "amqp:resource-limit-exceeded"
    assert callbacks.durable == [1, later_ticket]
    assert stats["failed_batches"] == 1 and stats["backlog_bytes"] == 0
    assert [m.seq for m in recovered(tmp_path).messages["q"]] == [1, 3]


def test_a_failed_fsync_fails_every_ticket_of_its_batch(tmp_path, monkeypatch):
    holding, release = threading.Event(), threading.Event()
    journal = Journal(tmp_path)
    journal.recover()
    callbacks = Callbacks()

    def on_durable(ticket):
        holding.set()
        release.wait(WAIT_S)
        callbacks.on_durable(ticket)

    journal.start(on_durable, callbacks.on_failed)
    journal.store("q", message(1))
    journal.flush()
    assert holding.wait(WAIT_S)  # the writer holds in on_durable(1) while tickets 2 and 3 queue up

    journal.store("q", message(2))
    journal.flush()
    journal.store("q", message(3))
    journal.flush()
    fail_syncs(monkeypatch)
    release.set()
    callbacks.wait_reported(3)
    monkeypatch.undo()
    journal.store("q", message(4))
    callbacks.wait_reported(journal.flush())
    journal.close()

    assert [t for t, _ in callbacks.failed] == [2, 3]
    assert failure_condition(callbacks.failed[0][1]) == "amqp:internal-error"
    assert [m.seq for m in recovered(tmp_path).messages["q"]] == [1, 4]


def test_a_failed_batch_is_reported_as_data_what_where_how_much_and_who_must_act(tmp_path, monkeypatch):
    journal, callbacks = started(tmp_path)

    def disk_full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", disk_full)
    monkeypatch.setattr(os, "pwritev", disk_full)
    journal.store("q", message(1))
    journal.remove("q", 1)
    full_bytes = journal.pending_bytes()
    callbacks.wait_reported(journal.flush())
    monkeypatch.undo()
    fail_syncs(monkeypatch)
    journal.store("q", message(2))
    callbacks.wait_reported(journal.flush())
    monkeypatch.undo()
    journal.close()

    [(_, full), (_, broken)] = callbacks.failed
    assert (full.kind, full.path, full.records_count, full.size_bytes, full.fault) \
        == (DISK_FULL, str(tmp_path / JOURNAL_FILE), 2, full_bytes, "operator")
    assert full.startswith("disk full: ") and "free space" in full  # the words producers have always read
    assert broken.kind == WRITE_FAILED and broken.records_count == 1 and "Input/output error" in broken.error
    # the engine loop's one table maps the kind, not the words
    assert (failure_condition(full), failure_condition(broken)) == (RESOURCE_LIMIT, INTERNAL_ERROR)


def test_a_journal_failure_is_copied_and_pickled_with_its_fields():
    failure = JournalFailure.of(OSError(errno.ENOSPC, "No space left on device"), "/data/journal.dat", 3, 120)
    for again in (copy.copy(failure), copy.deepcopy(failure), pickle.loads(pickle.dumps(failure))):
        assert type(again) is JournalFailure and again == failure
        assert (again.kind, again.path, again.records_count, again.size_bytes) == (DISK_FULL, "/data/journal.dat", 3, 120)


# ---- kill -9 ----------------------------------------------------------------------------------

PRODUCER = textwrap.dedent("""
    import sys, time
    from node.core.dispatch.message import Message
    from node.store.journal import Journal
    journal = Journal(sys.argv[1])
    journal.recover()
    journal.start(lambda ticket: print(ticket, flush=True), lambda ticket, error: None)
    journal.declare({"name": "q"})
    ticket = 0
    while True:
        ticket += 1  # unit `ticket` stores seqs 50*(ticket-1)+1 .. 50*ticket
        for seq in range(50 * (ticket - 1) + 1, 50 * ticket + 1):
            journal.store("q", Message(b"m%d" % seq, "g", seq=seq))
        for seq in range(50 * (ticket - 2) + 1, 50 * (ticket - 1) + 1):
            if seq > 0 and seq % 5 == 0:
                journal.remove("q", seq)  # removes seqs of the previous unit
        assert journal.flush() == ticket
        while journal.backlog_bytes() > 256 << 10:
            time.sleep(0.001)
""")


def test_a_killed_process_keeps_every_confirmed_message_in_order_and_no_removed_one(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", PRODUCER, str(tmp_path)], cwd=REPO_ROOT,
                             env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    durable = 0
    deadline = time.monotonic() + WAIT_S
    try:
        for line in child.stdout:
            durable = max(durable, int(line))
            if durable >= 40 or time.monotonic() > deadline:
                break
    finally:
        os.kill(child.pid, signal.SIGKILL)
        rest, errors = child.communicate(timeout=WAIT_S)
    durable = max([durable] + [int(line) for line in rest.split()])
    assert durable >= 1, errors

    seqs = [m.seq for m in recovered(tmp_path).messages["q"]]

    assert seqs == sorted(seqs)
    present = set(seqs)
    for seq in range(1, 50 * durable + 1):
        unit = (seq - 1) // 50 + 1
        if seq % 5:
            assert seq in present, f"confirmed seq {seq} (ticket {unit} <= durable {durable}) lost"
        elif unit + 1 <= durable:
            assert seq not in present, f"seq {seq} removed in durable ticket {unit + 1} came back"
    assert [m.payload for m in recovered(tmp_path).messages["q"][:3]] == [b"m1", b"m2", b"m3"]


# ---- format versions ----------------------------------------------------------------------------

def test_a_new_journal_starts_with_the_format_marker_of_this_build(tmp_path):
    write_and_close(tmp_path, [lambda j: j.store("q", message(1))])
    data = (tmp_path / JOURNAL_FILE).read_bytes()
    assert data.startswith(records.encode_format(records.FORMAT_VERSION))
    scan = scanner.scan(data)
    assert [kind for _, kind, _ in scan] == [records.STORE]
    assert scan.format_version == records.FORMAT_VERSION and scan.refusal is None


def test_a_journal_without_a_marker_is_version_1_and_recovers_as_before(tmp_path):
    # what every node wrote before format versions: the upgrade path for an existing data dir
    (tmp_path / JOURNAL_FILE).write_bytes(records.encode_declare(queue_settings("q"))
                                          + records.encode_store("q", message(1)))
    recovery = recovered(tmp_path)
    assert [q["name"] for q in recovery.queues] == ["q"]
    assert [m.seq for m in recovery.messages["q"]] == [1]
    assert recovery.cut_bytes == 0
    assert scanner.scan((tmp_path / JOURNAL_FILE).read_bytes()).format_version == 1


def test_a_marker_after_the_first_frame_is_an_ordinary_delete(tmp_path):
    odd_name = records.FORMAT_MARKER_PREFIX + "7"
    data = records.encode_store("q", message(1)) + records.encode_delete(odd_name)
    assert [(kind, record) for _, kind, record in scanner.scan(data)][1] == (records.DELETE, odd_name)


def test_compaction_keeps_the_format_marker_first(tmp_path):
    journal, callbacks = started(tmp_path, compact_min_bytes=1)
    for seq in range(1, 40):
        journal.store("q", message(seq, payload=b"x" * 100))
        journal.remove("q", seq)
    callbacks.wait_reported(journal.flush())
    journal.close()
    assert journal.stats()["compactions"] >= 1
    assert (tmp_path / JOURNAL_FILE).read_bytes().startswith(records.encode_format())


@hypothesis_settings(max_examples=60, deadline=None)
@given(version=st.integers(min_value=0, max_value=999_999_999).filter(
    lambda v: v not in records.FORMAT_VERSIONS_READ))
def test_a_journal_of_a_version_this_build_does_not_read_is_refused_and_left_whole(tmp_path_factory, version):
    directory = tmp_path_factory.mktemp("newer")
    data = records.encode_format(version) + records.encode_store("q", message(1))
    (directory / JOURNAL_FILE).write_bytes(data)
    with pytest.raises(JournalError) as refused:
        recovered(directory)
    text = str(refused.value)
    assert str(directory / JOURNAL_FILE) in text and f"format version {version}" in text
    assert "reads journal format versions 1" in text and "one version step" in text
    assert (directory / JOURNAL_FILE).read_bytes() == data  # nothing cut


@hypothesis_settings(max_examples=60, deadline=None)
@given(kind=st.integers(min_value=0, max_value=255).filter(
    lambda k: k not in (records.DECLARE, records.DELETE, records.STORE, records.REMOVE, records.TXN_BEGIN,
                        records.TXN_COMMIT)),
    rest=st.binary(max_size=40), before=st.integers(min_value=0, max_value=3))
def test_a_whole_record_of_an_unknown_kind_is_refused_never_misread_or_cut(tmp_path_factory, kind, rest, before):
    directory = tmp_path_factory.mktemp("kind")
    data = records.encode_format() + b"".join(records.encode_store("q", message(seq))
                                              for seq in range(1, before + 1))
    body = bytes((kind,)) + rest
    data += records._frame(body)
    (directory / JOURNAL_FILE).write_bytes(data)
    with pytest.raises(JournalError, match=f"record kind {kind}, which this build does not know"):
        recovered(directory)
    assert (directory / JOURNAL_FILE).read_bytes() == data


# ---- paging: bodies read back, records-only recovery ---------------------------------------------

def test_bodies_are_read_back_by_seq_through_the_index_even_after_compaction(tmp_path):
    journal = Journal(tmp_path, compact_min_bytes=0)
    journal.recover()
    callbacks = Callbacks()
    answers: list = []
    answered = threading.Condition()

    def on_bodies(queue, bodies):
        with answered:
            answers.append((queue, bodies))
            answered.notify_all()

    journal.start(callbacks.on_durable, callbacks.on_failed, on_bodies)
    journal.declare(queue_settings("a"))
    for seq in range(1, 101):
        journal.store("a", message(seq, payload=b"%d" % seq * 20))
    for seq in range(1, 90):
        journal.remove("a", seq)  # most of the file is dead: the writer compacts it, moving every frame
    callbacks.wait_reported(journal.flush())
    callbacks.wait_reported(journal.flush(report=True))
    journal.read_bodies("a", (95, 91, 92, 3, 100))
    with answered:
        assert answered.wait_for(lambda: answers, timeout=WAIT_S)
    stats = journal.stats()
    journal.close()
    assert stats["compactions"] >= 1
    queue, bodies = answers[0]
    assert queue == "a"
    assert bodies == {seq: b"%d" % seq * 20 for seq in (95, 91, 92, 100)} | {3: None}  # 3 was removed


def test_recovery_keeps_bodies_up_to_its_budget_and_records_past_it(tmp_path):
    def fill(journal):
        journal.declare(queue_settings("a"))
        for seq in range(1, 11):
            journal.store("a", message(seq, payload=b"x" * 100))
        journal.remove("a", 2)  # read after the stores: it frees room only for records after it
        journal.store("a", message(11, payload=b"x" * 100))

    write_and_close(tmp_path, [fill])
    journal = Journal(tmp_path)
    try:
        recovery = journal.recover(bodies_max_bytes=500)
    finally:
        journal.close()
    kept = [(m.seq, m.payload is not None, m.size_bytes) for m in recovery.messages["a"]]
    assert kept == [(1, True, 100), (3, True, 100), (4, True, 100), (5, True, 100), (6, False, 100),
                    (7, False, 100), (8, False, 100), (9, False, 100), (10, False, 100), (11, True, 100)]


def test_recovery_leaves_the_bodies_of_names_with_the_bodiless_prefix_in_the_file_and_reads_them_back(tmp_path):
    outbound, gone, emptied = "\x00out\x00n2\x00a", "\x00out\x00n2\x00b", "\x00out\x00n3\x00a"
    parked = "\x00park\x00a"

    def fill(journal):
        journal.declare(queue_settings("a"))
        for seq in (1, 2, 3, 4):
            journal.store(outbound, message(seq, payload=b"o" * (50 + seq), group_id=f"g{seq}"))
            journal.store(parked, message(seq + 10, payload=b"p" * 50))
            journal.store("a", message(seq + 20, payload=b"q" * 50))
        journal.remove(outbound, 4)  # its group id and size go with it
        journal.store(gone, message(30, payload=b"o"))
        journal.delete(gone)  # a deleted name comes back not at all
        journal.store(emptied, message(31, payload=b"o"))
        journal.remove(emptied, 31)  # an emptied one comes back empty

    write_and_close(tmp_path, [fill])
    journal, answers = Journal(tmp_path), Answers()
    try:
        recovery = journal.recover(bodiless_prefix="\x00out\x00")
        journal.start(on_durable=lambda ticket: None, on_failed=lambda ticket, reason: None, on_records=answers)
        journal.read_records(outbound, (2, 3))
        [(name, records)] = answers.wait(1)
    finally:
        journal.close()
    backlog = recovery.messages[outbound]  # no Message each: parallel arrays in seq order
    assert (list(backlog.seqs), backlog.group_ids, list(backlog.size_bytes)) == ([1, 2, 3], ["g1", "g2", "g3"],
                                                                                  [51, 52, 53])
    assert gone not in recovery.messages and len(recovery.messages[emptied]) == 0
    assert all(m.payload is not None for m in recovery.messages[parked] + recovery.messages["a"])
    assert name == outbound and {seq: bytes(m.payload) for seq, m in records.items()} == {2: b"o" * 52, 3: b"o" * 53}


class Answers:
    """What on_records (or on_bodies) handed back, waited for with a deadline."""

    def __init__(self):
        self.changed = threading.Condition()
        self.got: list = []

    def __call__(self, queue, by_seq):
        with self.changed:
            self.got.append((queue, by_seq))
            self.changed.notify_all()

    def wait(self, count: int) -> list:
        with self.changed:
            assert self.changed.wait_for(lambda: len(self.got) >= count, timeout=WAIT_S), \
                f"{count} answers expected within {WAIT_S} s, got {len(self.got)}"
            return list(self.got)


def test_records_are_read_back_whole_by_seq_before_and_after_a_compaction(tmp_path):
    journal = Journal(tmp_path, compact_min_bytes=0)
    journal.recover()
    callbacks, answers = Callbacks(), Answers()
    journal.start(callbacks.on_durable, callbacks.on_failed, on_records=answers)
    journal.declare(queue_settings("a"))
    journal.declare(queue_settings("b"))
    sent = {seq: message(seq, payload=b"%d" % seq * 30, group_id=None if seq % 7 == 0 else f"g{seq % 3}",
                         expires_at_ms=seq * 11, closes_group=seq % 5 == 0, delivery_count=seq % 4,
                         enqueued_at_ms=1_000 + seq) for seq in range(1, 101)}
    for seq, sent_message in sent.items():
        journal.store("a", sent_message)
        journal.store("b", message(1_000 + seq))
    journal.remove("a", 50)
    callbacks.wait_reported(journal.flush())
    journal.read_records("a", (3, 4, 5, 50, 7, 1_000, 100))  # 50 removed, 1_000 is b's
    first = answers.wait(1)[0]
    for seq in range(1, 95):
        if seq != 50:
            journal.remove("a", seq)
        journal.remove("b", 1_000 + seq)  # most of the file is dead: the writer compacts it
    callbacks.wait_reported(journal.flush())
    callbacks.wait_reported(journal.flush(report=True))
    journal.read_records("a", (96, 95, 100, 94))
    second = answers.wait(2)[1]
    stats = journal.stats()
    journal.close()
    assert stats["compactions"] >= 1
    assert stats["records_read"] == 5 + 3
    assert first[0] == second[0] == "a"
    assert {seq: m and fields_of(m) for seq, m in first[1].items()} == \
        {seq: fields_of(sent[seq]) for seq in (3, 4, 5, 7, 100)} | {50: None, 1_000: None}
    assert {seq: m and fields_of(m) for seq, m in second[1].items()} == \
        {seq: fields_of(sent[seq]) for seq in (95, 96, 100)} | {94: None}


# ---- cold recovery ------------------------------------------------------------------------------

journal_steps = st.lists(st.one_of(
    st.tuples(st.just("store"), st.sampled_from(["a", "b", "\x00out", ""]), st.sampled_from([None, "", "g1", "gé"]),
              st.binary(max_size=40)),
    st.tuples(st.just("restore"), st.integers(0, 1_000), st.binary(max_size=40)),
    st.tuples(st.just("remove"), st.integers(0, 1_000)),
    st.tuples(st.just("declare"), st.sampled_from(["a", "b", "\x00out", "c"])),
    st.tuples(st.just("delete"), st.sampled_from(["a", "b", "\x00out", "c"])),
), max_size=80)


def journal_bytes(steps) -> bytes:
    """A journal file of these steps, written with the node's encoders (seqs ascend node-wide)."""
    frames = [records.encode_format()]
    seq = 0
    stored: list[tuple[str, Message]] = []
    for step in steps:
        if step[0] == "store":
            seq += 1
            stored.append((step[1], message(seq, payload=step[3], group_id=step[2])))
            frames.append(records.encode_store(*stored[-1]))
        elif step[0] == "restore" and stored:  # a STORE of a seq again (its delivery count, say)
            queue, old = stored[step[1] % len(stored)]
            frames.append(records.encode_store(queue, message(old.seq, payload=step[2], group_id=old.group_id,
                                                               delivery_count=old.delivery_count + 1)))
        elif step[0] == "remove" and stored:
            queue, old = stored[step[1] % len(stored)]
            frames.append(records.encode_remove(queue, old.seq))
        elif step[0] == "declare":
            frames.append(records.encode_declare(queue_settings(step[1])))
        elif step[0] == "delete":
            frames.append(records.encode_delete(step[1]))
    return b"".join(frames)


def cold_model(recovery) -> dict:
    """What recover(cold=True) must say of each queue, from a recovery that made every Message."""
    model = {}
    for queue, messages in recovery.messages.items():
        if not queue.startswith("\x00"):
            model[queue] = ([m.seq for m in messages], sum(m.size_bytes for m in messages))
    return model


@hypothesis_settings(max_examples=150, deadline=None)
@given(journal_steps, st.integers(0, 30))
def test_cold_recovery_tells_each_queue_what_a_full_recovery_of_the_same_file_holds(steps, torn_bytes):
    import tempfile
    data = journal_bytes(steps)
    data += records.encode_store("a", message(10**9, payload=b"torn"))[:torn_bytes]  # a torn tail, maybe
    with tempfile.TemporaryDirectory() as full_dir, tempfile.TemporaryDirectory() as cold_dir:
        (Path(full_dir) / JOURNAL_FILE).write_bytes(data)
        (Path(cold_dir) / JOURNAL_FILE).write_bytes(data)
        full = recovered(full_dir)
        journal = Journal(cold_dir)
        try:
            cold = journal.recover(cold=True)
            stats = journal.stats()
        finally:
            journal.close()
        full_journal = Journal(full_dir)
        try:
            full_journal.recover()
            full_stats = full_journal.stats()
        finally:
            full_journal.close()
    assert {queue: (list(b.seqs), b.size_bytes) for queue, b in cold.cold.items()} == cold_model(full)
    assert all(b.seqs.typecode == "q" for b in cold.cold.values())
    assert state_of(cold) == state_of(full)[:2] + ({queue: ms for queue, ms in state_of(full)[2].items()
                                                    if queue.startswith("\x00")},)
    assert cold.cut_bytes == full.cut_bytes
    assert stats["live_bytes"] == full_stats["live_bytes"]
    assert full.cold == {}


def test_after_cold_recovery_the_writer_reads_the_records_back_and_compacts_them(tmp_path):
    def fill(journal):
        journal.declare(queue_settings("a"))
        for seq in range(1, 201):
            journal.store("a", message(seq, payload=b"%d" % seq * 30, group_id=f"g{seq % 4}"))
            if seq <= 20:
                journal.store("\x00out", message(1_000 + seq))
        for seq in range(1, 171):
            journal.remove("a", seq)

    write_and_close(tmp_path, [fill])
    journal = Journal(tmp_path, compact_min_bytes=0)
    recovery = journal.recover(cold=True)
    assert list(recovery.cold["a"].seqs) == list(range(171, 201))
    assert recovery.cold["a"].size_bytes == sum(len(b"%d" % seq * 30) for seq in range(171, 201))
    assert [m.seq for m in recovery.messages["\x00out"]] == list(range(1_001, 1_021))
    callbacks, answers = Callbacks(), Answers()
    before_start = journal.read_records_after_now("a", 170, 2, 1 << 20)  # a cold tail's first read, before serving
    assert {seq: fields_of(m) for seq, m in before_start.items()} == {
        seq: fields_of(message(seq, payload=b"%d" % seq * 30, group_id=f"g{seq % 4}")) for seq in (171, 172)}
    journal.start(callbacks.on_durable, callbacks.on_failed, on_records=answers)  # compacts first
    journal.read_records("a", (171, 200, 170))
    journal.read_records_after("a", 195, 10, 1 << 20)  # the tail's next ones: only 5 are left
    got, after = answers.wait(2)
    stats = journal.stats()
    with pytest.raises(RuntimeError, match="before start"):
        journal.read_records_after_now("a", 170, 2, 1 << 20)
    journal.close()
    assert stats["compactions"] == 1
    assert {seq: m and fields_of(m) for seq, m in got[1].items()} == {
        171: fields_of(message(171, payload=b"171" * 30, group_id="g3")),
        200: fields_of(message(200, payload=b"200" * 30, group_id="g0")), 170: None}
    assert after[0] == "a" and sorted(after[1]) == [196, 197, 198, 199, 200]
    again = recovered(tmp_path)
    assert [m.seq for m in again.messages["a"]] == list(range(171, 201))


def test_a_read_of_the_next_records_stops_once_their_bodies_reach_its_byte_bound(tmp_path):
    # a cold tail of large messages: 1,024 records at once would be a GiB of 1 MiB bodies. The read stops
    # after the record whose body reaches the bound (one larger than the bound still comes whole), and only
    # then or at the last record, which node/core/dispatch/cold.py's read_missing relies on to tell a cut read from
    # records the journal lacks
    sizes = {seq: size for seq, size in zip(range(1, 11), (100, 300, 50, 5_000, 10, 10, 10, 700, 20, 30))}

    def fill(journal):
        journal.declare(queue_settings("a"))
        for seq, size in sizes.items():
            journal.store("a", message(seq, payload=bytes(size), group_id="g"))

    write_and_close(tmp_path, [fill])
    journal = Journal(tmp_path)
    journal.recover(cold=True)

    def read(after_seq, count, max_bytes):
        got = journal.read_records_after_now("a", after_seq, count, max_bytes)
        assert all(got[seq].size_bytes == sizes[seq] for seq in got)
        return sorted(got)

    assert read(0, 10, 400) == [1, 2]  # 100 + 300 reaches 400
    assert read(0, 10, 401) == [1, 2, 3]  # 450: the third reaches it
    assert read(3, 10, 10) == [4]  # 5,000 alone passes the bound: it still comes
    assert read(4, 10, 1 << 20) == [5, 6, 7, 8, 9, 10]  # under the bound: every record left
    assert read(4, 3, 1 << 20) == [5, 6, 7]  # the count still bounds it
    assert read(10, 10, 1) == []
