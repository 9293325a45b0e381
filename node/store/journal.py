"""The durable journal: one append-only file of records, one writer thread, group commit.

This is the journal callers use (node/runtime.py, the tools, the tests); the work is done in
node/store/: recovery.py replays the file at start, writer.py is the writer thread (batches, fsync,
failures, reads back), compaction.py rewrites the file, index.py is the index of live records,
reads.py reads records back through it, files.py holds the file names, modes and lock, failures.py
what the journal says when it cannot work. The names callers import from here are re-exported.

Threads:
- The engine loop thread calls declare/delete/store/remove/flush/read_*/wake_writer/backlog_bytes/
  stats. They encode into memory and never wait for I/O; flush takes a lock held only to append to a
  list.
- recover() and everything before start() run on the caller's thread, which owns the file until then;
  after start() the one writer thread owns it (node/store/writer.py) and calls on_durable, on_failed,
  on_bodies and on_records on its own thread: hand the result to the engine loop through the bridge,
  never touch engine loop state from the callback.

Rules:
- A unit is everything between two flush() calls; the writer takes all units queued since its last
  write as one batch (node/store/writer.py says how batches are written, synced and failed).
- The engine loop hands units over during its batch with wake=False and wakes the writer with
  `wake_writer` once its batch is done: a writer woken mid-batch only waits for the GIL, and each of
  the loop's proton calls (cffi releases the GIL around every one) would wake it again for nothing.
- A unit flushed with report=False is one nobody waits for (removals a consumer settled first): the
  writer reports it only inside the report of a later unit that was flushed with report=True, so at
  moderate rates, where each message makes batches of its own, its write costs the engine loop no
  wake-up. flush(report=True) with nothing pending after such a unit hands over an empty unit, so the
  ticket it returns is always reported.
- on_failed(ticket, failure) gets a JournalFailure (node/store/failures.py): what went wrong, where,
  how much was dropped, who must act; the adapters map it to their wire form.
- Paging (node/core/dispatch/paging.py): `read_bodies` hands the writer a list of (queue, seqs) whose bodies the
  engine loop wants back; on_bodies(queue, {seq: payload}) answers. It is only asked for STOREs already
  reported durable, so each is in the index; a seq that is not comes back as None. `read_records` is
  the same read, answered with whole Messages by on_records(queue, {seq: Message | None}).
  `read_records_after(queue, seq, count, max_bytes)` reads the next `count` live records above `seq`
  (node/store/reads.py): a cold tail (node/core/dispatch/cold.py) keeps no seqs, only how many of its messages
  are on disk, and those are always the queue's newest.
- A journal that was never started writes what is pending at close(), on the caller's thread.
"""

from __future__ import annotations

import os
import threading

from node.core.dispatch.message import Message
from node.store import records
from node.store.compaction import Compaction
from node.store.failures import DISK_FULL, WRITE_FAILED, JournalError, JournalFailure
from node.store.files import (COMPACT_SUFFIX, DIRECTORY_MODE, FILE_MODE, JOURNAL_FILE, LOCK_FILE,
                              fsync_directory, open_journal)
from node.store.recovery import BodilessBacklog, ColdBacklog, Recovery, refused, replay, settle_tail
from node.store.records import DECLARE, DELETE, REMOVE, STORE, TXN_BEGIN, TXN_COMMIT
from node.store.writer import AFTER, BODIES, RECORDS, Shared, Unit, Writer

__all__ = ["Journal", "JournalError", "JournalFailure", "DISK_FULL", "WRITE_FAILED", "Recovery", "ColdBacklog",
           "BodilessBacklog", "JOURNAL_FILE", "LOCK_FILE", "COMPACT_SUFFIX", "FILE_MODE", "DIRECTORY_MODE",
           "fsync_directory"]


class Journal:
    def __init__(self, directory, *, fsync: bool = True, compact_min_bytes: int = 64 << 20,
                 pending_bytes_max: int = 64 << 20):
        self.directory = os.fspath(directory)
        self.path = os.path.join(self.directory, JOURNAL_FILE)
        self.fsync = fsync  # False: written and handed to the OS, but a power loss can lose the tail
        self.compact_min_bytes = compact_min_bytes  # file size below which compaction is never tried
        self.pending_bytes_max = pending_bytes_max  # backlog above which the runtime withholds credit
        # engine-loop-owned
        self._pending: list = []
        self._pending_bytes = 0
        self._ticket = 0
        self._last_unit_reported = True  # the unit of _ticket was flushed with report=True
        self._wake_due = False  # units were handed over with wake=False since the last wake_writer
        self._closed = False
        self._shared = Shared()  # handed-over units and reads, the writer's figures: under its condition
        # the file, its index and the writer's state: the caller's until start(), then the writer thread's
        self._writer: Writer | None = None
        self._lock_fd: int | None = None
        self._thread: threading.Thread | None = None

    # ---- lifecycle ---------------------------------------------------------------------------

    def recover(self, bodies_max_bytes: int = 0, cold: bool = False, bodiless_prefix: str = "") -> Recovery:
        """Replay the file (node/store/recovery.py). `bodies_max_bytes` > 0: keep bodies of at most that
        many bytes of live messages (the oldest first); the others come back with a None payload.
        `cold`: the queues not named with a leading NUL come back as Recovery.cold, not as messages.
        `bodiless_prefix`: names starting with it come back as a BodilessBacklog, whatever the budget
        (the cluster's outbound store reads their bodies back as its owners take them)."""
        if self._writer is not None and self._writer.fd is not None:
            raise RuntimeError("Journal.recover() is called once, before start()")
        fd, self._lock_fd = open_journal(self.directory, self.path)
        self._writer = writer = Writer(self.path, fd, self._shared,
                                       Compaction(self.path, self.directory, self.compact_min_bytes), self.fsync)
        recovery, scan = replay(self.path, writer.index, bodies_max_bytes, cold, bodiless_prefix)
        if scan.refusal is not None:
            self.close()
            raise refused(self.path, scan)
        writer.end, recovery.cut_bytes = settle_tail(fd, self.path, self.directory, scan)
        writer.publish_file_stats()
        return recovery

    def start(self, on_durable, on_failed, on_bodies=None, on_records=None) -> None:
        """on_durable(ticket: int), on_failed(ticket: int, failure: JournalFailure), on_bodies(queue: str,
        bodies: dict[int, bytes | None]) and on_records(queue: str, records: dict[int, Message | None])
        run on the writer thread."""
        writer = self._writer
        if writer is None or writer.fd is None:
            raise RuntimeError("call Journal.recover() before start()")
        if self._thread is not None:
            raise RuntimeError("Journal.start() was already called")
        writer.on_durable, writer.on_failed = on_durable, on_failed
        writer.on_bodies, writer.on_records = on_bodies, on_records
        self._thread = threading.Thread(target=writer.run, name="journal-writer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Write what is pending, stop the writer, release the directory. Idempotent."""
        if self._closed:
            return
        writer, shared = self._writer, self._shared
        if writer is not None and writer.fd is not None and shared.fatal is None:
            self.flush()
        self._closed = True
        if self._thread is not None:
            with shared.wake:
                shared.closing = True
                shared.wake.notify()
            self._thread.join()
        elif shared.units:  # never started: write synchronously, nobody to call back
            writer.on_durable = writer.on_failed = lambda *args: None
            writer.write_batch(shared.units)
            shared.units = []
        for fd in (writer.fd if writer is not None else None, self._lock_fd):
            if fd is not None:
                os.close(fd)
        if writer is not None:
            writer.fd = None
        self._lock_fd = None

    # ---- hot path (engine loop thread) -----------------------------------------------------------

    def declare(self, settings: dict) -> None:
        self._append(DECLARE, settings["name"], records.encode_declare(settings))

    def delete(self, queue: str) -> None:
        self._append(DELETE, queue, records.encode_delete(queue))

    def store(self, queue: str, message: Message) -> bytes:
        """The frame is returned for the replica streams (issue 28), byte-identical to what is written."""
        frame = records.encode_store(queue, message)
        self._append(STORE, (queue, message.seq), frame)
        return frame

    def remove(self, queue: str, seq: int) -> bytes:
        frame = records.encode_remove(queue, seq)
        self._append(REMOVE, (queue, seq), frame)
        return frame

    def transaction_begin(self) -> tuple[int, int]:
        """Mark the start of a transaction's commit (issue 31); hand the mark to transaction_end once its
        records are appended: recovery keeps all of them or none (node/store/recovery.py `committed`)."""
        return self._ticket, len(self._pending)

    def transaction_end(self, mark: tuple[int, int]) -> None:
        ticket, start = mark
        if ticket != self._ticket:
            raise AssertionError("the journal was flushed inside a transaction's commit; its records would be split")
        count = len(self._pending) - start
        if count < 2:
            return  # one frame is kept whole or not at all already
        begin = records.encode_transaction_begin(count)
        self._pending.insert(start, (TXN_BEGIN, None, begin))
        self._pending_bytes += len(begin)
        self._append(TXN_COMMIT, None, records.encode_transaction_commit())

    def _append(self, kind: int, key, frame: bytes) -> None:
        if self._closed:
            raise JournalError(f"journal {self.path} is closed; nothing more can be written to it")
        self._pending.append((kind, key, frame))
        self._pending_bytes += len(frame)

    def flush(self, report: bool = True, wake: bool = True) -> int:
        """Hand the pending records to the writer as one unit; return its ticket (0: nothing ever).
        `report` False: nobody waits for this unit, on_durable may skip it (see the header).
        `wake` False: the writer is woken by the next `wake_writer` (see the header)."""
        shared = self._shared
        if shared.fatal is not None:
            raise JournalError(f"journal writer of {self.path} stopped: {shared.fatal}; restart the node")
        if not self._pending and (self._last_unit_reported or not report):
            return self._ticket
        self._ticket += 1
        self._last_unit_reported = report
        unit = Unit(self._ticket, self._pending, self._pending_bytes, report)
        self._pending = []
        self._pending_bytes = 0
        with shared.wake:
            shared.units.append(unit)
            shared.handed_over_bytes += unit.size_bytes
            if wake:
                shared.wake.notify()
            else:
                self._wake_due = True
        return unit.ticket

    def read_bodies(self, queue: str, seqs: tuple) -> None:
        """Ask the writer for these bodies of `queue` (engine loop thread); on_bodies answers."""
        self._ask(BODIES, queue, seqs)

    def read_records(self, queue: str, seqs: tuple) -> None:
        """Ask the writer for these whole records of `queue` (engine loop thread); on_records answers."""
        self._ask(RECORDS, queue, seqs)

    def read_records_after(self, queue: str, after_seq: int, count: int, max_bytes: int) -> None:
        """Ask the writer for the next `count` live records of `queue` above seq `after_seq`, whole
        (engine loop thread), stopping once their bodies reach `max_bytes`; on_records answers with
        those it read."""
        self._ask(AFTER, queue, (after_seq, count, max_bytes))

    def read_records_after_now(self, queue: str, after_seq: int, count: int, max_bytes: int) -> dict:
        """Before start(), on the caller's thread: what read_records_after's on_records would get (a node
        reads its cold tails' oldest back before it serves)."""
        if self._thread is not None:
            raise RuntimeError("Journal.read_records_after_now() is for the caller before start()")
        return self._writer.read_after(queue, after_seq, count, max_bytes)

    def _ask(self, kind: int, queue: str, what: tuple) -> None:
        if self._closed:
            return
        with self._shared.wake:
            self._shared.reads.append((kind, queue, what))
            self._shared.wake.notify()

    def wake_writer(self) -> None:
        """Wake the writer for the units flushed with wake=False (engine loop thread)."""
        if self._wake_due:
            self._wake_due = False
            with self._shared.wake:
                self._shared.wake.notify()

    def pending_bytes(self) -> int:
        """Encoded bytes not yet handed to the writer (the next flush's unit)."""
        return self._pending_bytes

    def backlog_bytes(self) -> int:
        """Encoded bytes accepted but not yet written (pending plus handed over)."""
        return self._pending_bytes + self._shared.handed_over_bytes

    def backlog_full(self) -> bool:
        """True while producers should get no more credit: nothing here refuses a record."""
        return self.backlog_bytes() >= self.pending_bytes_max

    def stats(self) -> dict:
        with self._shared.wake:
            snapshot = dict(self._shared.stats)
            snapshot["fsync_latency"] = self._shared.fsync_latency.snapshot()
        snapshot["backlog_bytes"] = self.backlog_bytes()
        return snapshot
