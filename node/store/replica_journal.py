"""A backup's replica journal of one owner (issue 28, docs/replication.md): the owner's journal records,
byte-identical, with the stream's mark (epoch, high water).

Owned by one thread, the replica writer's (node/store/replica_writer.py), or a test's: nothing here locks.

Rules:
- `<data_dir>/replicas/<owner>/` (the owner's node id, percent-quoted but for ':' '[' ']') is a journal
  directory as node/store/journal.py's: files.py's file names, lock and modes; recovery.py's replay and
  tail cut on open; writer.py's Writer, run on this thread without its own, for the write (fsynced, one
  RWF_DSYNC write where the kernel takes it), the cut after a failed write, and compaction.py's compaction.
- The mark is a DECLARE record of the reserved name MARK_NAME whose settings carry the owner, epoch and
  high water: the index keeps the last one live, compaction copies it, recovery hands it back. A batch's
  frames and its mark are one write, durable before `append` returns. A torn mark on reopen leaves the
  frames before it, whose resends (their ack was never sent) are harmless: a STORE of a seq already live
  replaces itself, a REMOVE of one gone is nothing.
- `append(epoch, records)`: an epoch older than the journal's is refused (StaleEpoch, both named); a newer
  one restarts the mark at 0. Records at or below the mark are resends, skipped; the first record above
  it must be mark + 1 and the rest follow without gaps (ReplicaGap names the one expected). Only whole
  STORE or REMOVE frames of the queue (and group) their entry names are taken (`replica_record`, which
  the servicer calls on every entry first): nothing of a batch with one bad record is written.
- Memory: the index of live records (node/store/spans.py, ~21 bytes a live record) and the mark. Reopen
  reads the file cold (recovery cold=True: no payload and no Message kept); `live` reads the frames of
  the queues asked for back through the index, LIVE_READ_RECORDS at a time, keeping only the groups asked.
- `live` returns what the owner's journal held for each group, in seq order (the owner's group order),
  delivery counts as stored; a promotion adds the one delivery a restart adds (docs/replication.md).
"""

from __future__ import annotations

import os
import urllib.parse
from typing import Iterable, NamedTuple

from node.core.dispatch.message import Message
from node.core.errors import GrouperError, InvalidField, ResourceLimitExceeded
from node.store import records
from node.store.compaction import Compaction
from node.store.failures import DISK_FULL
from node.store.files import JOURNAL_FILE, open_journal
from node.store.reads import read_frames
from node.store.records import DECLARE, REMOVE, STORE
from node.store.recovery import refused, replay, settle_tail
from node.store.writer import Shared, Unit, Writer

REPLICAS_DIRECTORY = "replicas"  # under the node's data_dir: one directory per owner
MARK_NAME = "\x00replica mark"  # the DECLARE holding (owner, epoch, high_water): a NUL name no queue has
LIVE_READ_RECORDS = 1024  # `live` reads a queue's live frames back this many at a time
COMPACT_MIN_BYTES_DEFAULT = 64 << 20  # as the node's journal_compact_min_bytes


class StaleEpoch(GrouperError):
    """A batch of an older owner epoch than the replica journal's (FAILED_PRECONDITION)."""

    fault = "source"


class ReplicaGap(GrouperError):
    """A batch whose first new repl_seq is not the mark + 1: taking it would lose the gap (FAILED_PRECONDITION)."""

    fault = "source"


class ReplicaWriteFailed(GrouperError):
    """The backup's disk refused a batch; nothing of it was taken and the owner resends (UNAVAILABLE)."""

    fault = "node"
    retriable = True


class ReplicaRecord(NamedTuple):
    repl_seq: int
    queue: str
    group_id: str | None
    frame: bytes
    kind: int  # STORE or REMOVE, read from the frame
    seq: int  # the owner's message seq, read from the frame


def replica_record(where: str, repl_seq: int, queue: str, group_id: str | None, frame: bytes) -> ReplicaRecord:
    """One replicated entry checked: a whole STORE or REMOVE frame (length, crc, kind) of `queue` (a STORE
    of `group_id` too). InvalidField naming `where` (e.g. "entries[3] (repl_seq 17)") otherwise."""
    try:
        kind, frame_queue, frame_group, seq = records.record_identity(frame)
    except (ValueError, UnicodeDecodeError) as error:
        raise InvalidField(f"{where}.frame: not a whole STORE or REMOVE journal record ({error}); the owner "
                           f"sends its journal's frames byte-identical") from None
    if queue.startswith("\x00"):
        raise InvalidField(f"{where}.queue: {queue!r} starts with NUL: the cluster's own records are not replicated")
    if frame_queue != queue:
        raise InvalidField(f"{where}: the entry names queue {queue!r} but its frame is of queue {frame_queue!r}")
    if kind == STORE and frame_group != group_id:
        raise InvalidField(f"{where}: the entry names group {group_id!r} but its STORE frame is of group "
                           f"{frame_group!r}")
    return ReplicaRecord(repl_seq, queue, group_id, bytes(frame), kind, seq)


def replica_directory(data_dir: str, owner: str) -> str:
    if not owner or owner.strip(".") == "":
        raise InvalidField(f"owner_node: {owner!r} is no node id")
    return os.path.join(data_dir, REPLICAS_DIRECTORY, urllib.parse.quote(owner, safe=":[]"))


def owners_in(data_dir: str) -> list[str]:
    """The owners whose replica journals are under `data_dir`, sorted."""
    try:
        names = os.listdir(os.path.join(data_dir, REPLICAS_DIRECTORY))
    except FileNotFoundError:
        return []
    return sorted(urllib.parse.unquote(name) for name in names)


class ReplicaJournal:
    def __init__(self, data_dir: str, owner: str, *, fsync: bool = True,
                 compact_min_bytes: int = COMPACT_MIN_BYTES_DEFAULT):
        self.owner = owner
        self.directory = replica_directory(os.fspath(data_dir), owner)
        self.path = os.path.join(self.directory, JOURNAL_FILE)
        self.fsync = fsync  # False follows the node's journal_fsync: a power loss can lose the tail
        self.compact_min_bytes = compact_min_bytes
        self.epoch = 0  # the owner epoch of high_water
        self.high_water = 0  # the highest repl_seq of `epoch` on disk
        self.cut_bytes = 0  # torn or corrupt tail cut on open
        self._writer: Writer | None = None
        self._lock_fd: int | None = None
        self._ticket = 0
        self._failure = None  # the JournalFailure of the batch being written, if it failed

    def open(self) -> ReplicaJournal:
        """Lock the directory and read the journal back: the index and the mark. JournalError when the
        directory is in use, unwritable, or holds a newer build's format."""
        fd, self._lock_fd = open_journal(self.directory, self.path)
        self._writer = writer = Writer(self.path, fd, Shared(),
                                       Compaction(self.path, self.directory, self.compact_min_bytes), self.fsync)
        writer.on_durable = lambda ticket: None
        writer.on_failed = lambda ticket, failure: setattr(self, "_failure", failure)
        recovery, scan = replay(self.path, writer.index, 0, True, "")
        if scan.refusal is not None:
            self.close()
            raise refused(self.path, scan)
        writer.end, self.cut_bytes = settle_tail(fd, self.path, self.directory, scan)
        writer.publish_file_stats()
        for settings in recovery.queues:
            if settings["name"] == MARK_NAME:
                self.epoch, self.high_water = int(settings["epoch"]), int(settings["high_water"])
        return self

    def append(self, epoch: int, batch: Iterable[ReplicaRecord]) -> int:
        """Write the records above the mark and the new mark, durably; the new high water."""
        if epoch < self.epoch:
            raise StaleEpoch(f"replica batch from owner {self.owner!r} is of epoch {epoch}, older than epoch "
                             f"{self.epoch} this backup holds: that owner was replaced; it serves none of those "
                             f"groups and catches up as a replica")
        high_water = self.high_water if epoch == self.epoch else 0
        taken = [record for record in batch if record.repl_seq > high_water]
        for expected, record in enumerate(taken, high_water + 1):
            if record.repl_seq != expected:
                raise ReplicaGap(f"replica batch from owner {self.owner!r} (epoch {epoch}) jumps to repl_seq "
                                 f"{record.repl_seq}; this backup expects {expected} next: the entries between "
                                 f"were never taken here, so the owner must resend from {expected} (or copy its "
                                 f"groups afresh)")
        if not taken and epoch == self.epoch:
            return high_water  # resends only: nothing new to make durable
        new_high_water = taken[-1].repl_seq if taken else 0
        entries = [(record.kind, (record.queue, record.seq), record.frame) for record in taken]
        mark = {"name": MARK_NAME, "owner": self.owner, "epoch": epoch, "high_water": new_high_water}
        entries.append((DECLARE, MARK_NAME, records.encode_declare(mark)))
        self._write(entries)
        self.epoch, self.high_water = epoch, new_high_water
        self._writer.compact_if_due()
        return new_high_water

    def _write(self, entries: list) -> None:
        writer = self._writer
        size_bytes = sum(len(entry[2]) for entry in entries)
        self._ticket += 1
        with writer.shared.wake:  # the writer's figures count what it was handed, as the node journal's do
            writer.shared.handed_over_bytes += size_bytes
        self._failure = None
        writer.write_batch([Unit(self._ticket, entries, size_bytes, report=True)])
        failure = self._failure
        if failure is not None:
            if failure.kind == DISK_FULL:
                raise ResourceLimitExceeded(f"backup's replica journal of owner {self.owner!r}: {failure}")
            raise ReplicaWriteFailed(f"backup's replica journal of owner {self.owner!r}: {failure}")

    def live(self, groups: Iterable[tuple[str, str | None]]) -> dict[tuple[str, str | None], list[Message]]:
        """The live messages of each (queue, group id or None) asked for, in seq order, payloads included."""
        wanted: dict[str, set] = {}
        for queue, group_id in groups:
            wanted.setdefault(queue, set()).add(group_id)
        found: dict = {(queue, group_id): [] for queue, group_ids in wanted.items() for group_id in group_ids}
        writer = self._writer
        for queue, group_ids in wanted.items():
            spans = writer.index.stores.get(queue)
            seqs = spans.live_seqs() if spans is not None else ()
            for start in range(0, len(seqs), LIVE_READ_RECORDS):
                read, _ = read_frames(writer.fd, writer.index, queue, seqs[start:start + LIVE_READ_RECORDS],
                                      records.store_message)
                for seq in seqs[start:start + LIVE_READ_RECORDS]:
                    message = read[seq]
                    if message.group_id in group_ids:
                        found[(queue, message.group_id)].append(message)
        return found

    def live_of(self, queues: Iterable[str]) -> dict[str, list[Message]]:
        """Every live message of each queue asked for, in seq order, payloads included (a takeover's read)."""
        writer, found = self._writer, {}
        for queue in queues:
            spans = writer.index.stores.get(queue)
            seqs = spans.live_seqs() if spans is not None else ()
            messages = found[queue] = []
            for start in range(0, len(seqs), LIVE_READ_RECORDS):
                read, _ = read_frames(writer.fd, writer.index, queue, seqs[start:start + LIVE_READ_RECORDS],
                                      records.store_message)
                messages.extend(read[seq] for seq in seqs[start:start + LIVE_READ_RECORDS])
        return found

    def discard(self, epoch: int, seqs: Iterable[tuple[str, int]]) -> int:
        """REMOVE these (queue, owner seq) durably, the mark unchanged: a takeover made them this node's own
        (issue 28). Only while the journal holds `epoch` or older: a newer stream of that owner is not
        what was taken. Returns how many were live."""
        if self.epoch > epoch:
            return 0
        stores = self._writer.index.stores
        live: dict = {}
        entries = []
        for queue, seq in seqs:
            if queue not in live:
                spans = stores.get(queue)
                live[queue] = set(spans.live_seqs()) if spans is not None else set()
            if seq in live[queue]:
                entries.append((REMOVE, (queue, seq), records.encode_remove(queue, seq)))
        if entries:
            self._write(entries)
            self._writer.compact_if_due()
        return len(entries)

    def stats(self) -> dict:
        index = self._writer.index
        return {"owner": self.owner, "epoch": self.epoch, "high_water": self.high_water,
                "file_bytes": self._writer.end, "live_bytes": index.live_bytes,
                "live_records": sum(spans.live_count for spans in index.stores.values()),
                "compactions": self._writer.shared.stats["compactions"]}

    def close(self) -> None:
        writer, self._writer = self._writer, None
        for fd in (writer.fd if writer is not None else None, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._lock_fd = None

