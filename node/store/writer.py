"""The journal's writer thread: group commit, fsync, failed batches, reads and compaction between batches.

Owns the journal's file descriptor, the end of its last good frame and the index of live records
(node/store/index.py): the journal's caller until Journal.start(), then the one writer thread. `Shared`
is what the engine loop and the writer both touch, only under its condition.

Rules:
- The writer takes all units queued since its last write as one batch: one write, one fsync, one
  on_durable(highest ticket), the latter only if some unit of the batch was flushed with report=True.
- Where the kernel takes it (Linux), that write and fsync are one system call, a write with RWF_DSYNC
  (on disk when it returns, as fdatasync promises: the data and the file size): the writer thread
  then takes the GIL back once per batch instead of twice, and each time it waits for the engine
  loop's batch to end. Elsewhere, or if the file system refuses the flag, a write then an fsync.
  `fsyncs` and the fsync latency count and time the synced write.
- on_durable(t) means every unit with a ticket <= t is on disk, except the units already reported to
  on_failed. A failed batch is reported ticket by ticket, each with the same JournalFailure
  (node/store/failures.py), before any later on_durable; its records are dropped (not retried) and it
  is cut off the file so the next batch starts at a frame boundary.
- Between batches the writer answers the reads the engine loop asked for (node/store/reads.py) and
  compacts when due (node/store/compaction.py). A read the disk refuses stops the writer like any
  other I/O it cannot survive: flush() fails from then on and the node must be restarted; nothing is
  lost, the records are on disk.
- Callbacks run on this thread: hand the result to the engine loop through the bridge, never touch
  engine loop state. A callback that raises is logged and the writer goes on; anything else that
  raises here is a bug: logged, `Shared.fatal` set, the thread stops.
"""

from __future__ import annotations

import errno
import logging
import os
import threading
import time

from node.core.tally import LatencyTally
from node.store import records
from node.store.compaction import Compaction
from node.store.failures import JournalFailure
from node.store.files import write_all, write_all_synced
from node.store.index import LiveIndex
from node.store.reads import read_after, read_frames

log = logging.getLogger("node.store.journal")  # the journal's one logger, whichever module speaks

WRITE_CHUNK_BYTES = 4 << 20  # a batch is joined and written in pieces of about this size
# what the engine loop asks the writer to read back: bodies, whole records by seq, the next records after a seq
BODIES, RECORDS, AFTER = range(3)


class Unit:
    __slots__ = ("ticket", "entries", "size_bytes", "report")

    def __init__(self, ticket: int, entries: list, size_bytes: int, report: bool):
        self.ticket = ticket
        self.entries = entries  # (kind, key, frame): key is a queue name or (queue, seq)
        self.size_bytes = size_bytes
        self.report = report  # someone waits for it: on_durable once it is on disk


class Shared:
    """What the engine loop hands the writer and the writer's figures: touched only under `wake`."""

    def __init__(self):
        self.wake = threading.Condition()
        self.units: list[Unit] = []
        self.reads: list[tuple[int, str, tuple]] = []  # (BODIES/RECORDS/AFTER, queue, what) the loop wants
        self.handed_over_bytes = 0
        self.closing = False
        self.fatal: str | None = None  # why the writer stopped (a bug); written once, read without the lock
        self.stats = {"file_bytes": 0, "live_bytes": 0, "batches_written": 0, "records_written": 0,
                      "bytes_written": 0, "fsyncs": 0, "last_fsync_latency_us": 0,
                      "failed_batches": 0, "compactions": 0}
        self.fsync_latency = LatencyTally()

    def take(self) -> tuple[list[Unit], list] | None:
        """Wait for units or reads; None once closing with nothing left."""
        with self.wake:
            while not self.units and not self.reads and not self.closing:
                self.wake.wait()
            units, self.units = self.units, []
            reads, self.reads = self.reads, []
        return (units, reads) if units or reads else None

    def count(self, counter: str, amount: int) -> None:
        with self.wake:
            self.stats[counter] = self.stats.get(counter, 0) + amount


class Writer:
    def __init__(self, path: str, fd: int, shared: Shared, compaction: Compaction, fsync: bool):
        self.path = path
        self.fd: int | None = fd
        self.shared = shared
        self.compaction = compaction
        self.fsync = fsync  # False: written and handed to the OS, but a power loss can lose the tail
        self.index = LiveIndex()
        self.end = 0  # offset just past the last good frame; every write starts here
        # with fsync: write each batch with RWF_DSYNC, one system call instead of a write and an fsync
        self._synced_writes = fsync and hasattr(os, "RWF_DSYNC")
        self._tail_dirty = False  # a failed write may have left bytes after end
        self.on_durable = self.on_failed = self.on_bodies = self.on_records = None

    def run(self) -> None:
        try:
            self._maybe_compact()
            while (taken := self.shared.take()) is not None:
                units, reads = taken
                if units:
                    self.write_batch(units)
                for kind, queue, what in reads:
                    self._answer(kind, queue, what)
                self._maybe_compact()
        except BaseException as error:  # a bug: say so loudly, make flush() fail from now on
            log.exception("journal writer of %s stopped", self.path)
            self.shared.fatal = repr(error)
            raise

    def _answer(self, kind: int, queue: str, what: tuple) -> None:
        if kind == AFTER:
            self._call(self.on_records, queue, self.read_after(queue, *what))
        elif kind == RECORDS:
            self._call(self.on_records, queue, self._read(queue, what, records.store_message))
        else:
            self._call(self.on_bodies, queue, self._read(queue, what, records.store_payload))

    def write_batch(self, units: list[Unit]) -> None:
        start = self.end
        size_bytes = sum(unit.size_bytes for unit in units)
        fsync_ns = None
        try:
            if self._tail_dirty:
                os.ftruncate(self.fd, start)
                self._tail_dirty = False
            began_ns = time.perf_counter_ns()
            synced = self._write_frames(units, start)
            if self.fsync:
                if not synced:
                    os.fsync(self.fd)
                fsync_ns = time.perf_counter_ns() - began_ns
        except OSError as error:
            self._fail_batch(units, size_bytes, error)
            return
        offset = start
        count = 0
        for unit in units:
            for kind, key, frame in unit.entries:
                self.index.apply(kind, key, offset, len(frame))
                offset += len(frame)
            count += len(unit.entries)
        self.end = offset
        self._written(size_bytes, count, fsync_ns)
        if any(unit.report for unit in units):
            self._call(self.on_durable, units[-1].ticket)

    def _written(self, size_bytes: int, records_count: int, fsync_ns: int | None) -> None:
        shared = self.shared
        with shared.wake:
            shared.handed_over_bytes -= size_bytes
            stats = shared.stats
            stats["batches_written"] += 1
            stats["records_written"] += records_count
            stats["bytes_written"] += size_bytes
            if fsync_ns is not None:
                stats["fsyncs"] += 1
                stats["last_fsync_latency_us"] = fsync_ns // 1000
                shared.fsync_latency.observe(fsync_ns / 1e6)
            stats["file_bytes"] = self.end
            stats["live_bytes"] = self.index.live_bytes

    def _write_frames(self, units: list[Unit], offset: int) -> bool:
        """Write the units' frames from `offset`; True if the writes were synced (see the header)."""
        chunk: list[bytes] = []
        chunk_bytes = 0
        for unit in units:
            for entry in unit.entries:
                chunk.append(entry[2])
                chunk_bytes += len(entry[2])
                if chunk_bytes >= WRITE_CHUNK_BYTES:
                    offset = self._write_chunk(b"".join(chunk), offset)
                    chunk, chunk_bytes = [], 0
        if chunk:
            self._write_chunk(b"".join(chunk), offset)
        return self._synced_writes

    def _write_chunk(self, data: bytes, offset: int) -> int:
        if not self._synced_writes:
            return write_all(self.fd, data, offset)
        try:
            return write_all_synced(self.fd, data, offset)
        except OSError as error:
            if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            refusal = os.strerror(error.errno)
        # the kernel or file system refused the flag before writing anything: write, then fsync, from now on
        log.info("journal %s: synced writes (RWF_DSYNC) not supported here (%s); writing, then fsyncing",
                 self.path, refusal)
        self._synced_writes = False
        return write_all(self.fd, data, offset)

    def _fail_batch(self, units: list[Unit], size_bytes: int, error: OSError) -> None:
        self._tail_dirty = True
        try:
            os.ftruncate(self.fd, self.end)  # cutting frees space, so this works even on a full disk
            self._tail_dirty = False
        except OSError:
            pass  # tried again before the next batch, which fails too if it still cannot be done
        records_count = sum(len(unit.entries) for unit in units)
        failure = JournalFailure.of(error, self.path, records_count, size_bytes)
        log.error("%s (%d records, %d bytes dropped, tickets %d..%d)", failure, records_count,
                  size_bytes, units[0].ticket, units[-1].ticket)
        with self.shared.wake:
            self.shared.handed_over_bytes -= size_bytes
            self.shared.stats["failed_batches"] += 1
        for unit in units:
            self._call(self.on_failed, unit.ticket, failure)

    def _call(self, callback, *args) -> None:
        try:
            callback(*args)
        except Exception:  # the runtime's bug must not stop every later confirmation
            log.exception("journal callback %r%r raised", callback, args)

    # ---- reads through the index (node/store/reads.py) ---------------------------------------

    def _read(self, queue: str, seqs: tuple, decode) -> dict:
        values, frames_read = read_frames(self.fd, self.index, queue, seqs, decode)
        self.shared.count("bodies_read" if decode is records.store_payload else "records_read", frames_read)
        return values

    def read_after(self, queue: str, after_seq: int, count: int, max_bytes: int) -> dict:
        return read_after(self.index, queue, after_seq, count, max_bytes,
                          lambda queue, seqs: self._read(queue, seqs, records.store_message))

    # ---- compaction (node/store/compaction.py) -----------------------------------------------

    def compact_if_due(self) -> None:
        """For an owner that runs the writer without its thread (node/store/replica_journal.py)."""
        self._maybe_compact()

    def _maybe_compact(self) -> None:
        if not self.compaction.due(self.end, self.index.live_bytes):
            return
        compacted = self.compaction.run(self.fd, self.index, self.end)
        if compacted is None:
            return
        os.close(self.fd)
        self.fd, self.index, self.end = compacted
        self._tail_dirty = False
        with self.shared.wake:
            self.shared.stats["compactions"] += 1
        self.publish_file_stats()

    def publish_file_stats(self) -> None:
        with self.shared.wake:
            self.shared.stats["file_bytes"] = self.end
            self.shared.stats["live_bytes"] = self.index.live_bytes
