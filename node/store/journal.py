"""The durable journal: one append-only file of records, one writer thread, group commit.

Owns `<directory>/journal.dat`, `<directory>/journal.lock` (held while open so two nodes never share
a directory) and, during compaction, `<directory>/journal.dat.compact`.

Threads:
- The engine loop thread calls declare/delete/store/remove/flush/backlog_bytes/stats. They encode into
  memory and never wait for I/O; flush takes a lock held only to append to a list.
- After start() the one writer thread owns the file descriptor and the index of live records (a
  node/store/spans.py Spans per queue: seq -> offset and length, ~21 bytes a live record). It
  writes, fsyncs, compacts, and calls on_durable / on_failed (on its own thread: hand the result to
  the engine loop through the bridge, never touch engine loop state from the callback).

Rules:
- A unit is everything between two flush() calls. The writer takes all units queued since its last
  write as one batch: one write, one fsync, one on_durable(highest ticket).
- Where the kernel takes it (Linux), that write and fsync are one system call, a write with RWF_DSYNC
  (on disk when it returns, as fdatasync promises: the data and the file size): the writer thread
  then takes the GIL back once per batch instead of twice, and each time it waits for the engine
  loop's batch to end. Elsewhere, or if the file system refuses the flag, a write then an fsync.
  `fsyncs` and the fsync latency count and time the synced write.
- The engine loop hands units over during its batch with wake=False and wakes the writer with
  `wake_writer` once its batch is done: a writer woken mid-batch only waits for the GIL, and each of
  the loop's proton calls (cffi releases the GIL around every one) would wake it again for nothing.
- A unit flushed with report=False is one nobody waits for (removals a consumer settled first): the
  writer reports it only inside the report of a later unit that was flushed with report=True, so at
  moderate rates, where each message makes batches of its own, its write costs the engine loop no
  wake-up. flush(report=True) with nothing pending after such a unit hands over an empty unit, so the
  ticket it returns is always reported.
- on_durable(t) means every unit with a ticket <= t is on disk, except the units already reported to
  on_failed. A failed batch is reported ticket by ticket before any later on_durable, its records are
  dropped (not retried) and it is cut off the file so the next batch starts at a frame boundary.
- Compaction writes only live records to a new file and fsyncs it before the rename, even with
  fsync=False: renaming an unsynced file can lose everything on power loss, not just the last batch.
- Paging (node/core/paging.py): `read_bodies` hands the writer a list of (queue, seqs) whose bodies the
  engine loop wants back. The writer reads them between batches, through its own index (so a compaction
  that moved them is no matter), a run of adjacent frames in one read, and calls on_bodies(queue,
  {seq: payload}) on its thread. It is only asked for STOREs already reported durable, so each is in the
  index; a seq that is not (the queue was deleted or the message removed meanwhile) comes back as None.
  A read the disk refuses stops the writer like any other I/O it cannot survive: flush() fails from
  then on and the node must be restarted; nothing is lost, the records are on disk.
  `read_records` is the same read, answered with whole Messages (payload included) by on_records(queue,
  {seq: Message | None}). `read_records_after(queue, seq, count, max_bytes)` reads the next `count` live
  records above `seq` the same way (the index says which), stopping once their bodies reach `max_bytes`:
  a cold tail (node/core/cold.py) keeps no seqs, only how many of its messages are on disk, and those are
  always the queue's newest.
- `recover(bodies_max_bytes)` keeps bodies only up to that many bytes of live messages, in file order
  (the oldest first), while it reads: later ones come back as records with a None payload, read back
  when dispatch reaches them, so recovering a backlog larger than memory needs no more than its records.
- `recover(bodiless_prefix=P)` makes no Message for the STOREs of names starting with P either: while it
  reads it keeps each one's (group id, payload length) by seq, and Recovery.messages[name] is a
  BodilessBacklog of three parallel arrays in seq order (the cluster's outbound store needs nothing
  more of a message whose body it reads back when its owner takes it; a Message each would cost a
  million-entry backlog ~110 bytes an entry more while it recovers). Its bodies are read back by
  `read_records`, as paged ones are.
- `recover(cold=True)` makes no Message for the STOREs of queues not named with a leading NUL (the
  cluster's own records stay whole): Recovery.cold[queue] is a ColdBacklog of the live seqs, ascending,
  and the sum of their payload lengths. The scan decodes only each STORE's header (records.store_header:
  no group id is decoded, a million groups cost nothing) and keeps the length of each record's group id
  in the index while it reads, so a REMOVE, a re-STORE or a DELETE undoes its share of the payload bytes
  (a frame's length less its headers, queue name and group id); the lengths are dropped once it is done.
  Every other rule of recovery is the same.
- Recovery trusts nothing after the first bad frame: it cuts the file there with a warning and goes on.
  A whole frame in a format this build does not read (node/store/records.py) is no bad frame: the node
  refuses to start, naming the file and the versions, and cuts nothing.
- A new file, and every compacted one, starts with the FORMAT marker of records.FORMAT_VERSION.
"""

from __future__ import annotations

import errno
import fcntl
import heapq
import logging
import os
import threading
import time
from array import array
from dataclasses import dataclass, field

from node.core.errors import GrouperError
from node.core.message import Message
from node.core.tally import LatencyTally
from node.store import records
from node.store.records import DECLARE, DELETE, REMOVE, STORE, STORE_HEADER
from node.store.spans import Spans

log = logging.getLogger(__name__)

JOURNAL_FILE = "journal.dat"
LOCK_FILE = "journal.lock"
FILE_MODE = 0o600  # the journal, its lock and compaction files: the node's user only (node/file_modes.py)
DIRECTORY_MODE = 0o700  # a data directory the journal makes
COMPACT_SUFFIX = ".compact"
WRITE_CHUNK_BYTES = 4 << 20  # a batch is joined and written in pieces of about this size
COPY_CHUNK_BYTES = 1 << 20  # compaction reads and writes the old file in pieces of about this size
# what the engine loop asks the writer to read back: bodies, whole records by seq, the next records after a seq
_BODIES, _RECORDS, _AFTER = range(3)
DISK_FULL = "disk full"  # first words of an on_failed error caused by ENOSPC or EDQUOT


class JournalError(GrouperError):
    """The journal cannot be used: a directory or file problem the operator has to fix."""

    fault = "operator"


def failure_condition(error: str) -> str:
    """The AMQP condition for producers whose deliveries were in a batch reported to on_failed."""
    return "amqp:resource-limit-exceeded" if error.startswith(DISK_FULL) else "amqp:internal-error"


@dataclass
class Recovery:
    queues: list[dict] = field(default_factory=list)  # live settings dicts, in declaration order
    # per queue, in seq order; a name with recover's bodiless_prefix has a BodilessBacklog instead
    messages: dict[str, list[Message] | BodilessBacklog] = field(default_factory=dict)
    cut_bytes: int = 0  # bytes of torn or corrupt tail removed from the file
    cold: dict[str, ColdBacklog] = field(default_factory=dict)  # recover(cold=True): per queue


@dataclass
class ColdBacklog:
    """A queue's live records as cold recovery returns them: no Message, the rest is in the journal."""

    seqs: array  # array('q') of the live seqs, ascending
    size_bytes: int  # the sum of their payloads' lengths (each Message.size_bytes)


@dataclass
class BodilessBacklog:
    """The live STOREs of a name recovered with `bodiless_prefix`: no Message each, one slot per record
    in each of three parallel arrays, in seq order; the bodies are in the journal (read_records)."""

    seqs: array  # array('q'), ascending
    group_ids: list  # each one's group id: str, or None when ungrouped
    size_bytes: array  # array('q'): each one's payload length (Message.size_bytes)

    def __len__(self) -> int:
        return len(self.seqs)


def _bodiless_backlog(by_seq: dict[int, tuple]) -> BodilessBacklog:
    """What recover kept of a bodiless name (seq -> (group id, payload length)) as parallel arrays."""
    seqs = array("q", sorted(by_seq))
    return BodilessBacklog(seqs, [by_seq[seq][0] for seq in seqs], array("q", [by_seq[seq][1] for seq in seqs]))


class _Unit:
    __slots__ = ("ticket", "entries", "size_bytes", "report")

    def __init__(self, ticket: int, entries: list, size_bytes: int, report: bool):
        self.ticket = ticket
        self.entries = entries  # (kind, key, frame): key is a queue name or (queue, seq)
        self.size_bytes = size_bytes
        self.report = report  # someone waits for it: on_durable once it is on disk


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
        # shared, under _wake
        self._wake = threading.Condition()
        self._units: list[_Unit] = []
        self._reads: list[tuple[int, str, tuple]] = []  # (_BODIES/_RECORDS/_AFTER, queue, what) the loop wants
        self._handed_over_bytes = 0
        self._closing = False
        self._fatal: str | None = None
        self._stats = {"file_bytes": 0, "live_bytes": 0, "batches_written": 0, "records_written": 0,
                       "bytes_written": 0, "fsyncs": 0, "last_fsync_latency_us": 0,
                       "failed_batches": 0, "compactions": 0}
        self._fsync_latency = LatencyTally()  # under _wake, like _stats
        # owned by whoever runs the file: the caller until start(), then the writer thread
        self._fd: int | None = None
        self._lock_fd: int | None = None
        self._end = 0  # offset just past the last good frame; every write starts here
        # with fsync: write each batch with RWF_DSYNC, one system call instead of a write and an fsync
        self._synced_writes = fsync and hasattr(os, "RWF_DSYNC")
        self._tail_dirty = False  # a failed write may have left bytes after _end
        self._declares: dict[str, tuple[int, int]] = {}  # queue -> (offset, length) of its live DECLARE
        self._stores: dict[str, Spans] = {}  # queue -> its live STOREs' seq -> (offset, length)
        self._live_bytes = 0
        self._compact_retry_at_bytes = 0
        self._thread: threading.Thread | None = None
        self._on_durable = None
        self._on_failed = None
        self._on_bodies = None
        self._on_records = None

    # ---- lifecycle ---------------------------------------------------------------------------

    def recover(self, bodies_max_bytes: int = 0, cold: bool = False, bodiless_prefix: str = "") -> Recovery:
        """Replay the file. `bodies_max_bytes` > 0: keep bodies of at most that many bytes of live
        messages (the oldest first); the others come back with a None payload. `cold`: the queues not
        named with a leading NUL come back as Recovery.cold, not as messages (see the header).
        `bodiless_prefix`: names starting with it come back as a BodilessBacklog, whatever the budget
        (the cluster's outbound store reads their bodies back as its owners take them)."""
        if self._fd is not None:
            raise RuntimeError("Journal.recover() is called once, before start()")
        self._open()
        queues: dict[str, dict] = {}
        messages: dict[str, dict[int, Message]] = {}
        bodiless: dict[str, dict[int, tuple]] = {}  # bodiless_prefix names: seq -> (group id, payload length)
        kept_bytes = 0  # bodies kept of live messages, with bodies_max_bytes
        stores = self._stores
        with open(self.path, "rb", buffering=COPY_CHUNK_BYTES) as file:
            scan = records.scan(file, store_headers=cold)
            for offset, kind, record in scan:
                length = scan.end_offset - offset
                if kind == STORE_HEADER:  # cold: the index and the record's group id length, nothing else
                    queue, seq, group_bytes = record
                    spans = stores.get(queue)
                    if spans is None:
                        spans = stores[queue] = Spans(tagged=True)
                        messages.setdefault(queue, {})
                    self._live_bytes += length - spans.add(seq, offset, length, group_bytes)
                elif kind == STORE:
                    message = record.message
                    self._index_store(record.queue, message.seq, offset, length)
                    if bodiless_prefix and record.queue.startswith(bodiless_prefix):
                        bodiless.setdefault(record.queue, {})[message.seq] = (message.group_id, message.size_bytes)
                        continue
                    # bodies of live messages in file order (seq order once compacted); the cluster's own
                    # records (names starting with NUL: messages to forward) keep theirs, forwarded from memory
                    if bodies_max_bytes and not record.queue.startswith("\x00"):
                        if kept_bytes + message.size_bytes > bodies_max_bytes:
                            message.payload = None
                        else:
                            kept_bytes += message.size_bytes
                    messages.setdefault(record.queue, {})[message.seq] = message
                elif kind == REMOVE:
                    if record.queue in bodiless:
                        bodiless[record.queue].pop(record.seq, None)
                    gone = messages.get(record.queue, {}).pop(record.seq, None)
                    if gone is not None and gone.payload is not None and bodies_max_bytes \
                            and not record.queue.startswith("\x00"):
                        kept_bytes -= gone.size_bytes
                    self._index_remove(record.queue, record.seq)
                elif kind == DECLARE:
                    queues[record["name"]] = record
                    messages.setdefault(record["name"], {})
                    self._index_declare(record["name"], offset, length)
                else:
                    queues.pop(record, None)
                    messages.pop(record, None)
                    bodiless.pop(record, None)
                    self._index_delete(record)
        cold_backlogs = {}
        if cold:
            for queue in [queue for queue in messages if not queue.startswith("\x00")]:
                del messages[queue]
                cold_backlogs[queue] = self._cold_backlog(queue)
        size_bytes = os.fstat(self._fd).st_size
        if scan.refusal is not None:
            self.close()
            raise JournalError(f"journal {self.path} was written by a newer build of grouper: "
                               f"{scan.refusal}; run a build that reads it (upgrade one version step "
                               f"at a time), or move data_dir aside to start empty")
        if size_bytes == 0:
            marker = records.encode_format()
            try:
                _write_all(self._fd, marker, 0)
                os.fsync(self._fd)
            except OSError as error:
                raise JournalError(f"cannot write the format marker of {self.path}: {error}; "
                                   f"free space or fix permissions on {self.directory}") from error
            scan.end_offset = size_bytes = len(marker)
        cut_bytes = size_bytes - scan.end_offset
        if cut_bytes:
            log.warning("journal %s: %s at offset %d; cutting %d bytes (file was %d bytes), "
                        "records from there on are lost", self.path, scan.stop_reason,
                        scan.end_offset, cut_bytes, size_bytes)
            try:
                os.ftruncate(self._fd, scan.end_offset)
                os.fsync(self._fd)
            except OSError as error:
                raise JournalError(f"cannot cut the damaged tail of {self.path}: {error}; "
                                   f"free space or fix permissions on {self.directory}") from error
        self._end = scan.end_offset
        self._publish_file_stats()
        recovered: dict = {queue: [by_seq[seq] for seq in sorted(by_seq)] for queue, by_seq in messages.items()}
        while bodiless:  # one name's map let go as its arrays are made
            queue, by_seq = bodiless.popitem()
            recovered[queue] = _bodiless_backlog(by_seq)
        return Recovery(list(queues.values()), recovered, cut_bytes, cold_backlogs)

    def _cold_backlog(self, queue: str) -> ColdBacklog:
        """What cold recovery tells of `queue`, from its index; the index then drops its group id lengths."""
        spans = self._stores.get(queue)
        if spans is None:
            return ColdBacklog(array("q"), 0)
        # a STORE frame is its headers, the queue name, the group id and the payload: take off the rest
        overhead_bytes = records.FRAME_HEADER_BYTES + records.STORE_HEAD_BYTES + len(queue.encode())
        size_bytes = spans.live_bytes - overhead_bytes * spans.live_count - spans.tag_sum()
        seqs = spans.live_seqs()
        spans.untag()
        return ColdBacklog(seqs, size_bytes)

    def start(self, on_durable, on_failed, on_bodies=None, on_records=None) -> None:
        """on_durable(ticket: int), on_failed(ticket: int, error: str), on_bodies(queue: str,
        bodies: dict[int, bytes | None]) and on_records(queue: str, records: dict[int, Message | None])
        run on the writer thread."""
        if self._fd is None:
            raise RuntimeError("call Journal.recover() before start()")
        if self._thread is not None:
            raise RuntimeError("Journal.start() was already called")
        self._on_durable = on_durable
        self._on_failed = on_failed
        self._on_bodies = on_bodies
        self._on_records = on_records
        self._thread = threading.Thread(target=self._run, name="journal-writer", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Write what is pending, stop the writer, release the directory. Idempotent."""
        if self._closed:
            return
        if self._fd is not None and self._fatal is None:
            self.flush()
        self._closed = True
        if self._thread is not None:
            with self._wake:
                self._closing = True
                self._wake.notify()
            self._thread.join()
        elif self._units:  # never started: write synchronously, nobody to call back
            self._on_durable = self._on_failed = lambda *args: None
            self._write_batch(self._units)
            self._units = []
        for fd in (self._fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._fd = self._lock_fd = None

    # ---- hot path (engine loop thread) -----------------------------------------------------------

    def declare(self, settings: dict) -> None:
        self._append(DECLARE, settings["name"], records.encode_declare(settings))

    def delete(self, queue: str) -> None:
        self._append(DELETE, queue, records.encode_delete(queue))

    def store(self, queue: str, message: Message) -> None:
        self._append(STORE, (queue, message.seq), records.encode_store(queue, message))

    def remove(self, queue: str, seq: int) -> None:
        self._append(REMOVE, (queue, seq), records.encode_remove(queue, seq))

    def _append(self, kind: int, key, frame: bytes) -> None:
        if self._closed:
            raise JournalError(f"journal {self.path} is closed; nothing more can be written to it")
        self._pending.append((kind, key, frame))
        self._pending_bytes += len(frame)

    def flush(self, report: bool = True, wake: bool = True) -> int:
        """Hand the pending records to the writer as one unit; return its ticket (0: nothing ever).
        `report` False: nobody waits for this unit, on_durable may skip it (see the header).
        `wake` False: the writer is woken by the next `wake_writer` (see the header)."""
        if self._fatal is not None:
            raise JournalError(f"journal writer of {self.path} stopped: {self._fatal}; restart the node")
        if not self._pending and (self._last_unit_reported or not report):
            return self._ticket
        self._ticket += 1
        self._last_unit_reported = report
        unit = _Unit(self._ticket, self._pending, self._pending_bytes, report)
        self._pending = []
        self._pending_bytes = 0
        with self._wake:
            self._units.append(unit)
            self._handed_over_bytes += unit.size_bytes
            if wake:
                self._wake.notify()
            else:
                self._wake_due = True
        return unit.ticket

    def read_bodies(self, queue: str, seqs: tuple) -> None:
        """Ask the writer for these bodies of `queue` (engine loop thread); on_bodies answers."""
        self._ask(_BODIES, queue, seqs)

    def read_records(self, queue: str, seqs: tuple) -> None:
        """Ask the writer for these whole records of `queue` (engine loop thread); on_records answers."""
        self._ask(_RECORDS, queue, seqs)

    def read_records_after(self, queue: str, after_seq: int, count: int, max_bytes: int) -> None:
        """Ask the writer for the next `count` live records of `queue` above seq `after_seq`, whole
        (engine loop thread), stopping once their bodies reach `max_bytes`; on_records answers with
        those it read."""
        self._ask(_AFTER, queue, (after_seq, count, max_bytes))

    def read_records_after_now(self, queue: str, after_seq: int, count: int, max_bytes: int) -> dict:
        """Before start(), on the caller's thread: what read_records_after's on_records would get (a node
        reads its cold tails' oldest back before it serves)."""
        if self._thread is not None:
            raise RuntimeError("Journal.read_records_after_now() is for the caller before start()")
        return self._read_after(queue, after_seq, count, max_bytes)

    def _read_after(self, queue: str, after_seq: int, count: int, max_bytes: int) -> dict:
        """The next `count` live records above `after_seq`, in seq order, stopping after the record whose
        body brings the bodies read to `max_bytes`: so fewer come back only past that bound or at the
        index's last record (node/core/cold.py's read_missing relies on it). Each pass reads no more
        frames than the bytes still wanted (a frame is never smaller than its body)."""
        spans = self._stores.get(queue)
        seqs = spans.seqs_after(after_seq, count) if spans is not None else []
        found: dict = {}
        body_bytes = start = 0
        while start < len(seqs) and body_bytes < max_bytes:
            end, frame_bytes = start, 0
            while end < len(seqs) and (end == start or body_bytes + frame_bytes < max_bytes):
                frame_bytes += spans.get(seqs[end])[1]
                end += 1
            read = self._read_frames(queue, seqs[start:end], records.store_message)
            found.update(read)
            body_bytes += sum(message.size_bytes for message in read.values() if message is not None)
            start = end
        return found

    def _ask(self, kind: int, queue: str, what: tuple) -> None:
        if self._closed:
            return
        with self._wake:
            self._reads.append((kind, queue, what))
            self._wake.notify()

    def wake_writer(self) -> None:
        """Wake the writer for the units flushed with wake=False (engine loop thread)."""
        if self._wake_due:
            self._wake_due = False
            with self._wake:
                self._wake.notify()

    def pending_bytes(self) -> int:
        """Encoded bytes not yet handed to the writer (the next flush's unit)."""
        return self._pending_bytes

    def backlog_bytes(self) -> int:
        """Encoded bytes accepted but not yet written (pending plus handed over)."""
        return self._pending_bytes + self._handed_over_bytes

    def backlog_full(self) -> bool:
        """True while producers should get no more credit: nothing here refuses a record."""
        return self.backlog_bytes() >= self.pending_bytes_max

    def stats(self) -> dict:
        with self._wake:
            snapshot = dict(self._stats)
            snapshot["fsync_latency"] = self._fsync_latency.snapshot()
        snapshot["backlog_bytes"] = self.backlog_bytes()
        return snapshot

    # ---- writer thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self._maybe_compact()
            while True:
                with self._wake:
                    while not self._units and not self._reads and not self._closing:
                        self._wake.wait()
                    units, self._units = self._units, []
                    reads, self._reads = self._reads, []
                if not units and not reads:
                    return
                if units:
                    self._write_batch(units)
                for kind, queue, what in reads:
                    if kind == _AFTER:
                        self._call(self._on_records, queue, self._read_after(queue, *what))
                    elif kind == _RECORDS:
                        self._call(self._on_records, queue, self._read_frames(queue, what, records.store_message))
                    else:
                        self._call(self._on_bodies, queue, self._read_frames(queue, what, records.store_payload))
                self._maybe_compact()
        except BaseException as error:  # a bug: say so loudly, make flush() fail from now on
            log.exception("journal writer of %s stopped", self.path)
            self._fatal = repr(error)
            raise

    def _write_batch(self, units: list[_Unit]) -> None:
        start = self._end
        size_bytes = sum(unit.size_bytes for unit in units)
        fsync_ns = None
        try:
            if self._tail_dirty:
                os.ftruncate(self._fd, start)
                self._tail_dirty = False
            began_ns = time.perf_counter_ns()
            synced = self._write_frames(units, start)
            if self.fsync:
                if not synced:
                    os.fsync(self._fd)
                fsync_ns = time.perf_counter_ns() - began_ns
        except OSError as error:
            self._fail_batch(units, size_bytes, error)
            return
        offset = start
        count = 0
        for unit in units:
            for kind, key, frame in unit.entries:
                self._index(kind, key, offset, len(frame))
                offset += len(frame)
            count += len(unit.entries)
        self._end = offset
        with self._wake:
            self._handed_over_bytes -= size_bytes
            stats = self._stats
            stats["batches_written"] += 1
            stats["records_written"] += count
            stats["bytes_written"] += size_bytes
            if fsync_ns is not None:
                stats["fsyncs"] += 1
                stats["last_fsync_latency_us"] = fsync_ns // 1000
                self._fsync_latency.observe(fsync_ns / 1e6)
            stats["file_bytes"] = self._end
            stats["live_bytes"] = self._live_bytes
        if any(unit.report for unit in units):
            self._call(self._on_durable, units[-1].ticket)

    def _write_frames(self, units: list[_Unit], offset: int) -> bool:
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
            return _write_all(self._fd, data, offset)
        try:
            return _write_all_synced(self._fd, data, offset)
        except OSError as error:
            if error.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
                raise
            refusal = os.strerror(error.errno)
        # the kernel or file system refused the flag before writing anything: write, then fsync, from now on
        log.info("journal %s: synced writes (RWF_DSYNC) not supported here (%s); writing, then fsyncing",
                 self.path, refusal)
        self._synced_writes = False
        return _write_all(self._fd, data, offset)

    def _fail_batch(self, units: list[_Unit], size_bytes: int, error: OSError) -> None:
        self._tail_dirty = True
        try:
            os.ftruncate(self._fd, self._end)  # cutting frees space, so this works even on a full disk
            self._tail_dirty = False
        except OSError:
            pass  # tried again before the next batch, which fails too if it still cannot be done
        if error.errno in (errno.ENOSPC, errno.EDQUOT):
            reason = f"{DISK_FULL}: no space left for journal {self.path}; free space on its volume"
        else:
            reason = f"journal {self.path} write failed: {error}; check the disk and the node's log"
        records_count = sum(len(unit.entries) for unit in units)
        log.error("%s (%d records, %d bytes dropped, tickets %d..%d)", reason, records_count,
                  size_bytes, units[0].ticket, units[-1].ticket)
        with self._wake:
            self._handed_over_bytes -= size_bytes
            self._stats["failed_batches"] += 1
        for unit in units:
            self._call(self._on_failed, unit.ticket, reason)

    def _call(self, callback, *args) -> None:
        try:
            callback(*args)
        except Exception:  # the runtime's bug must not stop every later confirmation
            log.exception("journal callback %r%r raised", callback, args)

    def _read_frames(self, queue: str, seqs: tuple, decode) -> dict:
        """decode(frame) -> (seq, value) by seq, read through the index: a run of adjacent frames in
        one pread; a seq not live in the index is None."""
        index = self._stores.get(queue)
        bodies: dict = {}
        spans = []
        for seq in seqs:
            span = index.get(seq) if index is not None else None
            if span is None:
                bodies[seq] = None
            else:
                spans.append((span[0], span[1], seq))
        spans.sort()
        index = 0
        while index < len(spans):
            run_start, run_end = spans[index][0], spans[index][0] + spans[index][1]
            last = index + 1
            while last < len(spans) and spans[last][0] == run_end and run_end - run_start < COPY_CHUNK_BYTES:
                run_end += spans[last][1]
                last += 1
            data = os.pread(self._fd, run_end - run_start, run_start)
            for offset, length, seq in spans[index:last]:
                start = offset - run_start
                read_seq, payload = decode(memoryview(data)[start:start + length])
                if read_seq != seq:
                    raise AssertionError(f"journal index of {queue!r} points seq {seq} at seq {read_seq}'s frame")
                bodies[seq] = payload
            index = last
        with self._wake:
            counter = "bodies_read" if decode is records.store_payload else "records_read"
            self._stats[counter] = self._stats.get(counter, 0) + len(spans)
        return bodies

    # ---- index of live records (caller before start, writer after) ---------------------------

    def _index(self, kind: int, key, offset: int, length: int) -> None:
        if kind == STORE:
            self._index_store(key[0], key[1], offset, length)
        elif kind == REMOVE:
            self._index_remove(key[0], key[1])
        elif kind == DECLARE:
            self._index_declare(key, offset, length)
        else:
            self._index_delete(key)

    def _index_store(self, queue: str, seq: int, offset: int, length: int) -> None:
        spans = self._stores.get(queue)
        if spans is None:
            spans = self._stores[queue] = Spans()
        self._live_bytes += length - spans.add(seq, offset, length)

    def _index_remove(self, queue: str, seq: int) -> None:
        spans = self._stores.get(queue)
        if spans is not None:
            self._live_bytes -= spans.remove(seq)

    def _index_declare(self, queue: str, offset: int, length: int) -> None:
        old = self._declares.get(queue)
        if old is not None:
            self._live_bytes -= old[1]
        self._declares[queue] = (offset, length)
        self._live_bytes += length

    def _index_delete(self, queue: str) -> None:
        old = self._declares.pop(queue, None)
        if old is not None:
            self._live_bytes -= old[1]
        spans = self._stores.pop(queue, None)
        if spans is not None:
            self._live_bytes -= spans.live_bytes

    # ---- compaction (writer thread) ----------------------------------------------------------

    def _maybe_compact(self) -> None:
        if self._end <= max(self.compact_min_bytes, 4 * self._live_bytes, self._compact_retry_at_bytes):
            return
        before_bytes = self._end
        temporary = self.path + COMPACT_SUFFIX
        began_ns = time.perf_counter_ns()
        try:
            fd, declares, stores, end = self._write_compacted(temporary)
        except OSError as error:
            # try again only once the file has grown by another compact_min_bytes (or doubled)
            self._compact_retry_at_bytes = self._end + max(self.compact_min_bytes, self._end)
            log.warning("journal %s: compaction failed (%s); still appending to the old file, next "
                        "try above %d bytes", self.path, error, self._compact_retry_at_bytes)
            _unlink_quietly(temporary)
            return
        os.close(self._fd)
        self._fd = fd
        self._declares, self._stores, self._end = declares, stores, end
        self._tail_dirty = False
        self._compact_retry_at_bytes = 0
        with self._wake:
            self._stats["compactions"] += 1
        self._publish_file_stats()
        log.info("journal %s compacted from %d to %d bytes in %d ms", self.path, before_bytes, end,
                 (time.perf_counter_ns() - began_ns) // 1_000_000)

    def _write_compacted(self, temporary: str):
        """Copy live frames into `temporary`, fsync it and rename it over the journal."""
        fd = os.open(temporary, os.O_RDWR | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            copier = _FrameCopier(self._fd, fd, _write_all(fd, records.encode_format(), 0))
            declares = {queue: copier.copy(offset, length)
                        for queue, (offset, length) in self._declares.items()}
            # every queue's records in one seq order, merged from each queue's ascending index
            live = heapq.merge(*(_tagged(queue, spans) for queue, spans in self._stores.items() if spans))
            stores: dict[str, Spans] = {}  # queues left empty are dropped here
            for seq, queue, offset, length in live:
                spans = stores.get(queue)
                if spans is None:
                    spans = stores[queue] = Spans()
                spans.add(seq, *copier.copy(offset, length))
            end = copier.finish()
            os.fsync(fd)
            os.replace(temporary, self.path)
        except BaseException:
            os.close(fd)
            raise
        try:  # the rename is done; from here the new file is the journal whatever happens
            fsync_directory(self.directory)
        except OSError as error:
            log.error("journal %s: fsync of directory %s after compaction failed (%s); a crash "
                      "before the next successful sync may bring back the old file", self.path,
                      self.directory, error)
        return fd, declares, stores, end

    # ---- files -------------------------------------------------------------------------------

    def _open(self) -> None:
        try:
            os.makedirs(self.directory, DIRECTORY_MODE, exist_ok=True)
            self._lock_fd = os.open(os.path.join(self.directory, LOCK_FILE), os.O_RDWR | os.O_CREAT, FILE_MODE)
        except OSError as error:
            raise JournalError(f"journal directory {self.directory} is not usable ({error.strerror}); "
                               f"point data_dir at a writable directory") from error
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise JournalError(f"journal directory {self.directory} is in use by another process; "
                               f"stop it or give this node its own data_dir") from error
        try:
            _unlink_quietly(self.path + COMPACT_SUFFIX)  # a compaction cut short: the old file is whole
            existed = os.path.exists(self.path)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, FILE_MODE)
            if not existed:
                try:
                    fsync_directory(self.directory)
                except OSError:
                    os.close(fd)
                    raise
            self._fd = fd
        except OSError as error:
            os.close(self._lock_fd)
            self._lock_fd = None
            raise JournalError(f"journal file {self.path} cannot be opened for writing "
                               f"({error.strerror}); fix its permissions or point data_dir elsewhere") from error

    def _publish_file_stats(self) -> None:
        with self._wake:
            self._stats["file_bytes"] = self._end
            self._stats["live_bytes"] = self._live_bytes


class _FrameCopier:
    """Copies frames from one file to the end of another, merging runs that are adjacent."""

    def __init__(self, source_fd: int, target_fd: int, start_offset: int):
        self._source = source_fd
        self._target = target_fd
        self._run_offset = 0
        self._run_bytes = 0
        self._written = start_offset  # the target offset of the next frame

    def copy(self, offset: int, length: int) -> tuple[int, int]:
        target_offset = self._written + self._run_bytes
        if self._run_bytes and offset == self._run_offset + self._run_bytes \
                and self._run_bytes < COPY_CHUNK_BYTES:
            self._run_bytes += length
        else:
            self._copy_run()
            self._run_offset, self._run_bytes = offset, length
        return target_offset, length

    def finish(self) -> int:
        self._copy_run()
        return self._written

    def _copy_run(self) -> None:
        if not self._run_bytes:
            return
        data = os.pread(self._source, self._run_bytes, self._run_offset)
        if len(data) != self._run_bytes:
            raise AssertionError(f"journal index points past the end of the file "
                                 f"({self._run_offset}+{self._run_bytes})")
        self._written = _write_all(self._target, data, self._written)
        self._run_bytes = 0


def _tagged(queue: str, spans: Spans):
    for seq, offset, length in spans:
        yield seq, queue, offset, length


def _write_all(fd: int, data: bytes, offset: int) -> int:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, offset)
        view = view[written:]
        offset += written
    return offset


def _write_all_synced(fd: int, data: bytes, offset: int) -> int:
    """`_write_all`, each write on disk when it returns (fdatasync's promise for the bytes written)."""
    view = memoryview(data)
    while view:
        written = os.pwritev(fd, [view], offset, os.RWF_DSYNC)
        view = view[written:]
        offset += written
    return offset


def fsync_directory(directory: str) -> None:
    """So a file created or renamed in `directory` survives a power loss."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
