"""Journal recovery: one pass over the file at start-up rebuilds the live queues, their messages and
the index of live records (node/store/index.py).

Runs on the journal's caller's thread, once, before the writer starts (Journal.recover).

Rules:
- `bodies_max_bytes` keeps bodies only up to that many bytes of live messages, in file order (the
  oldest first), while it reads: later ones come back as records with a None payload, read back when
  dispatch reaches them, so recovering a backlog larger than memory needs no more than its records.
  The cluster's own records (names starting with NUL: messages to forward) always keep theirs.
- `bodiless_prefix=P` makes no Message for the STOREs of names starting with P either: while it reads
  it keeps each one's (group id, payload length) by seq, and Recovery.messages[name] is a
  BodilessBacklog of three parallel arrays in seq order (the cluster's outbound store needs nothing
  more of a message whose body it reads back when its owner takes it; a Message each would cost a
  million-entry backlog ~110 bytes an entry more while it recovers). Its bodies are read back by
  `read_records`, as paged ones are.
- `cold=True` makes no Message for the STOREs of queues not named with a leading NUL (the cluster's own
  records stay whole): Recovery.cold[queue] is a ColdBacklog of the live seqs, ascending, and the sum
  of their payload lengths. The scan decodes only each STORE's header (records.store_header: no group
  id is decoded, a million groups cost nothing) and keeps the length of each record's group id in the
  index while it reads, so a REMOVE, a re-STORE or a DELETE undoes its share of the payload bytes (a
  frame's length less its headers, queue name and group id); the lengths are dropped once it is done.
  Every other rule of recovery is the same.
- Recovery trusts nothing after the first bad frame: it cuts the file there with a warning and goes on.
  A whole frame in a format this build does not read (node/store/records.py) is no bad frame: the node
  refuses to start, naming the file and the versions, and cuts nothing.
- A new (empty) file gets the FORMAT marker of records.FORMAT_VERSION, synced before anything else.
- A transaction's commit batch (TXN_BEGIN, its records, TXN_COMMIT; issue 31) is applied only once its
  commit record is read (`committed`): a batch the file ends in, or a bad frame cuts, is dropped whole
  and the file is cut at its TXN_BEGIN, so a crash mid-commit recovers to all or nothing. A batch that
  does not add up (a TXN_BEGIN inside a batch, a TXN_COMMIT with none open, more records than counted) is
  corruption: the file is cut at its start.
"""

from __future__ import annotations

import logging
import os
from array import array
from dataclasses import dataclass, field

from node.core.dispatch.message import Message
from node.store import records
from node.store.failures import JournalError
from node.store.files import COPY_CHUNK_BYTES, write_all
from node.store.index import LiveIndex
from node.store.records import DECLARE, REMOVE, STORE, STORE_HEADER, TXN_BEGIN, TXN_COMMIT
from node.store.scanner import Scan

log = logging.getLogger("node.store.journal")  # the journal's one logger, whichever module speaks


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


def replay(path: str, index: LiveIndex, bodies_max_bytes: int, cold: bool,
           bodiless_prefix: str) -> tuple[Recovery, Scan]:
    """Read the journal at `path` into `index` and a Recovery (its cut_bytes not known yet: see
    `settle_tail`). The scan tells where the good prefix ends and whether the format was refused."""
    replayed = _Replay(index, bodies_max_bytes, bodiless_prefix)
    with open(path, "rb", buffering=COPY_CHUNK_BYTES) as file:
        scan = Scan(file, store_headers=cold)
        replayed.run(scan)
    return replayed.recovery(cold), scan


def refused(path: str, scan: Scan) -> JournalError:
    return JournalError(f"journal {path} was written by a newer build of grouper: {scan.refusal}; run a "
                        f"build that reads it (upgrade one version step at a time), or move data_dir aside "
                        f"to start empty")


def settle_tail(fd: int, path: str, directory: str, scan: Scan) -> tuple[int, int]:
    """Give an empty file its format marker and cut a bad tail off: (the end of the good frames, the
    bytes cut)."""
    size_bytes = os.fstat(fd).st_size
    if size_bytes == 0:
        marker = records.encode_format()
        try:
            write_all(fd, marker, 0)
            os.fsync(fd)
        except OSError as error:
            raise JournalError(f"cannot write the format marker of {path}: {error}; "
                               f"free space or fix permissions on {directory}") from error
        scan.end_offset = size_bytes = len(marker)
    cut_bytes = size_bytes - scan.end_offset
    if cut_bytes:
        log.warning("journal %s: %s at offset %d; cutting %d bytes (file was %d bytes), "
                    "records from there on are lost", path, scan.stop_reason,
                    scan.end_offset, cut_bytes, size_bytes)
        try:
            os.ftruncate(fd, scan.end_offset)
            os.fsync(fd)
        except OSError as error:
            raise JournalError(f"cannot cut the damaged tail of {path}: {error}; "
                               f"free space or fix permissions on {directory}") from error
    return scan.end_offset, cut_bytes


def committed(scan: Scan):
    """(offset, length, kind, record) of the scan's frames recovery applies: a transaction's batch only
    once its TXN_COMMIT is read, its marks never. Cuts the scan short (its end_offset and stop_reason) at
    a batch with no commit record, or one that does not add up (see the header)."""
    batch: list | None = None
    begin_offset = expected = 0
    for offset, kind, record in scan:
        length = scan.end_offset - offset
        if kind == TXN_BEGIN:
            if batch is not None:
                _cut(scan, begin_offset, f"a transaction's batch at offset {begin_offset} holds another one")
                return
            batch, begin_offset, expected = [], offset, record
        elif kind == TXN_COMMIT:
            if batch is None or len(batch) != expected:
                where = begin_offset if batch is not None else offset
                _cut(scan, where, f"a commit record at offset {offset} closes "
                                  f"{'no batch' if batch is None else f'{len(batch)} of {expected} records'}")
                return
            yield from batch
            batch = None
        elif batch is not None:
            batch.append((offset, length, kind, record))
            if len(batch) > expected:
                _cut(scan, begin_offset, f"a transaction's batch at offset {begin_offset} has more than its "
                                         f"{expected} records before its commit record")
                return
        else:
            yield offset, length, kind, record
    if batch is not None and scan.refusal is None:
        _cut(scan, begin_offset, f"a transaction's batch at offset {begin_offset} has {len(batch)} of its "
                                 f"{expected} records and no commit record ({scan.stop_reason or 'the file ends'}): "
                                 f"none of it is kept")


def _cut(scan: Scan, offset: int, reason: str) -> None:
    scan.end_offset = offset
    scan.stop_reason = reason


class _Replay:
    """One pass over the frames: what is live goes into the index and into the Recovery's maps."""

    def __init__(self, index: LiveIndex, bodies_max_bytes: int, bodiless_prefix: str):
        self.index = index
        self.bodies_max_bytes = bodies_max_bytes
        self.bodiless_prefix = bodiless_prefix
        self.queues: dict[str, dict] = {}
        self.messages: dict[str, dict[int, Message]] = {}
        self.bodiless: dict[str, dict[int, tuple]] = {}  # bodiless_prefix names: seq -> (group id, payload length)
        self.kept_bytes = 0  # bodies kept of live messages, with bodies_max_bytes

    def run(self, scan: Scan) -> None:
        index, messages, bodiless = self.index, self.messages, self.bodiless
        bodies_max_bytes, bodiless_prefix = self.bodies_max_bytes, self.bodiless_prefix
        for offset, length, kind, record in committed(scan):
            if kind == STORE_HEADER:  # cold: the index and the record's group id length, nothing else
                queue, seq, group_bytes = record
                if queue not in index.stores:
                    messages.setdefault(queue, {})
                index.store_tagged(queue, seq, offset, length, group_bytes)
            elif kind == STORE:
                message = record.message
                index.store(record.queue, message.seq, offset, length)
                if bodiless_prefix and record.queue.startswith(bodiless_prefix):
                    bodiless.setdefault(record.queue, {})[message.seq] = (message.group_id, message.size_bytes)
                    continue
                # bodies of live messages in file order (seq order once compacted); the cluster's own
                # records (names starting with NUL: messages to forward) keep theirs, forwarded from memory
                if bodies_max_bytes and not record.queue.startswith("\x00"):
                    if self.kept_bytes + message.size_bytes > bodies_max_bytes:
                        message.payload = None
                    else:
                        self.kept_bytes += message.size_bytes
                messages.setdefault(record.queue, {})[message.seq] = message
            elif kind == REMOVE:
                self._remove(record.queue, record.seq)
            elif kind == DECLARE:
                self.queues[record["name"]] = record
                messages.setdefault(record["name"], {})
                index.declare(record["name"], offset, length)
            else:
                self.queues.pop(record, None)
                messages.pop(record, None)
                bodiless.pop(record, None)
                index.delete(record)

    def _remove(self, queue: str, seq: int) -> None:
        if queue in self.bodiless:
            self.bodiless[queue].pop(seq, None)
        gone = self.messages.get(queue, {}).pop(seq, None)
        if gone is not None and gone.payload is not None and self.bodies_max_bytes \
                and not queue.startswith("\x00"):
            self.kept_bytes -= gone.size_bytes
        self.index.remove(queue, seq)

    def recovery(self, cold: bool) -> Recovery:
        messages, bodiless = self.messages, self.bodiless
        cold_backlogs = {}
        if cold:
            for queue in [queue for queue in messages if not queue.startswith("\x00")]:
                del messages[queue]
                cold_backlogs[queue] = _cold_backlog(self.index, queue)
        recovered: dict = {queue: [by_seq[seq] for seq in sorted(by_seq)] for queue, by_seq in messages.items()}
        while bodiless:  # one name's map let go as its arrays are made
            queue, by_seq = bodiless.popitem()
            recovered[queue] = _bodiless_backlog(by_seq)
        return Recovery(list(self.queues.values()), recovered, 0, cold_backlogs)


def _cold_backlog(index: LiveIndex, queue: str) -> ColdBacklog:
    """What cold recovery tells of `queue`, from its index; the index then drops its group id lengths."""
    spans = index.stores.get(queue)
    if spans is None:
        return ColdBacklog(array("q"), 0)
    # a STORE frame is its headers, the queue name, the group id and the payload: take off the rest
    overhead_bytes = records.FRAME_HEADER_BYTES + records.STORE_HEAD_BYTES + len(queue.encode())
    size_bytes = spans.live_bytes - overhead_bytes * spans.live_count - spans.tag_sum()
    seqs = spans.live_seqs()
    spans.untag()
    return ColdBacklog(seqs, size_bytes)


def _bodiless_backlog(by_seq: dict[int, tuple]) -> BodilessBacklog:
    """What recover kept of a bodiless name (seq -> (group id, payload length)) as parallel arrays."""
    seqs = array("q", sorted(by_seq))
    return BodilessBacklog(seqs, [by_seq[seq][0] for seq in seqs], array("q", [by_seq[seq][1] for seq in seqs]))
