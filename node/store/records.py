"""Journal records: framing and codecs, bytes in and records out; node/store/scanner.py reads a
journal's frames back with these.

Pure: no threads and no files.
Format (little-endian throughout; kinds are never renumbered, a changed layout gets a new kind):

    frame  = u32 body_length | u32 crc32(body) | body            body_length >= 1
    body   = u8 kind | fields
    DECLARE  1: utf-8 JSON object of QueueSettings.to_dict() (has a "name" string)
    DELETE   2: utf-8 queue name
    STORE    3: u8 flags | u16 queue_length | u16 group_length | u64 seq | u64 expires_at_ms
                | u32 delivery_count | u64 enqueued_at_ms | queue | group_id | payload (the rest)
                flags: bit 0 group_id present (so "" and None differ), bit 1 closes_group
    REMOVE   4: u16 queue_length | u64 seq | queue
    TXN_BEGIN  5: u32 record_count     (issue 31; builds reading version 2 know it) the next record_count frames are one transaction's
                                       commit: recovery keeps them only if TXN_COMMIT follows them
    TXN_COMMIT 6: (nothing)            (issue 31) the commit record closing that batch

Format version: a file's first frame may be a FORMAT marker, a DELETE whose name is FORMAT_MARKER_PREFIX
and the version in decimal. Only the frame at offset 0 is read as one (a queue of that odd name deleted
later is just a delete); a file without it is version 1, as every file before versions was. It is a
DELETE so the release before versions reads it as the delete of a queue it never had and keeps the
data (a rollback by one step). A version this build does not read, or a record kind it does not know
in a frame whose crc holds (a newer build wrote it, not a torn write), is refused by name, never
cut as corruption and never misread.

Rules:
- `encode_store` is on the hot path (one call per durable message): one pack, one crc over the
  payload in place, one join; no intermediate copy of the payload.
- `store_header` is on recovery's hot path when a backlog is left cold (one call per STORE of ten
  million): the fixed fields and the queue name (decoded once per scan); the group id is not decoded.
"""

from __future__ import annotations

import json
import struct
import zlib
from typing import NamedTuple

from node.core.errors import ResourceLimitExceeded
from node.core.dispatch.message import Message

DECLARE = 1
DELETE = 2
STORE = 3
REMOVE = 4
TXN_BEGIN = 5  # format version 2 (issue 31): a transaction's commit batch, node/store/recovery.py `committed`
TXN_COMMIT = 6
STORE_HEADER = -STORE  # no kind in a file: what a scan with store_headers yields for a STORE (node/store/scanner.py)

FRAME_HEADER_BYTES = 8
RECORD_BODY_MAX_BYTES = 1 << 30  # larger claimed lengths are corruption; larger messages are refused

FRAME = struct.Struct("<II")  # body_length, crc32(body)
_STORE = struct.Struct("<BBHHQQIQ")  # kind, flags, queue_length, group_length, seq, expires, count, enqueued
_STORE_HEAD = struct.Struct("<BBHHQ")  # the fields of _STORE that a header-only read needs
STORE_HEAD_BYTES = _STORE.size  # a STORE body's fixed fields, before its queue name, group id and payload
_REMOVE = struct.Struct("<BHQ")  # kind, queue_length, seq
_GROUP_PRESENT = 1
_CLOSES_GROUP = 2

# what this build writes. Version 2 names the TXN_BEGIN and TXN_COMMIT kinds (issue 31), yet files are still
# marked 1: a build before transactions refuses by name the first TXN record it meets (an unknown kind whose
# crc holds), so marking every new file 2 would only stop a rollback by one release on a node that never used
# a transaction (compaction makes new files).
FORMAT_VERSION = 1
FORMAT_VERSIONS_READ = (1, 2)  # what this build reads; a newer build keeps reading the one before it
_TXN_BEGIN = struct.Struct("<BI")  # kind, record_count
FORMAT_MARKER_PREFIX = "\x00grouper journal format "


class NewerFormat(Exception):
    """A frame that is whole but written in a format this build does not read."""


class StoreRecord(NamedTuple):
    queue: str
    message: Message


class RemoveRecord(NamedTuple):
    queue: str
    seq: int


# ---- encoding ---------------------------------------------------------------------------------

def _frame(body: bytes) -> bytes:
    return FRAME.pack(len(body), zlib.crc32(body)) + body


def encode_declare(settings: dict) -> bytes:
    if not isinstance(settings.get("name"), str):
        raise ValueError(f"queue settings to journal need a string 'name', got {settings!r}")
    return _frame(bytes((DECLARE,)) + json.dumps(settings, separators=(",", ":")).encode())


def encode_format(version: int = FORMAT_VERSION) -> bytes:
    return encode_delete(f"{FORMAT_MARKER_PREFIX}{version}")


def format_version(body: bytes | memoryview) -> int | None:
    """The version a FORMAT marker's body names, None when the body is no marker."""
    prefix = FORMAT_MARKER_PREFIX.encode()
    if body[0] != DELETE or bytes(body[1:1 + len(prefix)]) != prefix:
        return None
    digits = bytes(body[1 + len(prefix):])
    if not digits.isdigit() or len(digits) > 9:
        raise ValueError(f"journal format marker with a version that is no number: {digits!r}")
    return int(digits)


def encode_delete(queue: str) -> bytes:
    return _frame(bytes((DELETE,)) + queue.encode())


def encode_store(queue: str, message: Message) -> bytes:
    queue_bytes = queue.encode()
    group_id = message.group_id
    if group_id is None:
        group_bytes = b""
        flags = 0
    else:
        group_bytes = group_id.encode()
        flags = _GROUP_PRESENT
    if message.closes_group:
        flags |= _CLOSES_GROUP
    head = _STORE.pack(STORE, flags, len(queue_bytes), len(group_bytes), message.seq,
                       message.expires_at_ms, message.delivery_count, message.enqueued_at_ms)
    head = head + queue_bytes + group_bytes
    payload = message.payload
    body_length = len(head) + len(payload)
    if body_length > RECORD_BODY_MAX_BYTES:
        raise ResourceLimitExceeded(f"message of {len(payload)} bytes is larger than the journal's "
                                    f"record limit of {RECORD_BODY_MAX_BYTES} bytes; send smaller messages")
    crc = zlib.crc32(payload, zlib.crc32(head))
    return b"".join((FRAME.pack(body_length, crc), head, payload))


def encode_transaction_begin(record_count: int) -> bytes:
    if record_count < 1:
        raise ValueError(f"a transaction's batch holds at least one record, not {record_count}")
    return _frame(_TXN_BEGIN.pack(TXN_BEGIN, record_count))


def encode_transaction_commit() -> bytes:
    return _frame(bytes((TXN_COMMIT,)))


def encode_remove(queue: str, seq: int) -> bytes:
    queue_bytes = queue.encode()
    return _frame(_REMOVE.pack(REMOVE, len(queue_bytes), seq) + queue_bytes)


# ---- decoding ---------------------------------------------------------------------------------

def decode_body(body: bytes | memoryview) -> tuple[int, object]:
    """Return (kind, record): DECLARE -> dict, DELETE -> str, STORE -> StoreRecord, REMOVE -> RemoveRecord,
    TXN_BEGIN -> its record count, TXN_COMMIT -> None.

    Raises ValueError (or struct.error) for a body this version cannot read.
    """
    kind = body[0]
    if kind == STORE:
        _, flags, queue_length, group_length, seq, expires_at_ms, delivery_count, enqueued_at_ms = \
            _STORE.unpack_from(body)
        start = _STORE.size
        group_start = start + queue_length
        payload_start = group_start + group_length
        if payload_start > len(body):
            raise ValueError(f"STORE names {queue_length}+{group_length} bytes but the body has {len(body)}")
        queue = str(body[start:group_start], "utf-8")
        group_id = str(body[group_start:payload_start], "utf-8") if flags & _GROUP_PRESENT else None
        message = Message(bytes(body[payload_start:]), group_id, expires_at_ms=expires_at_ms,
                          closes_group=bool(flags & _CLOSES_GROUP), delivery_count=delivery_count,
                          enqueued_at_ms=enqueued_at_ms, seq=seq)
        return kind, StoreRecord(queue, message)
    if kind == REMOVE:
        _, queue_length, seq = _REMOVE.unpack_from(body)
        if _REMOVE.size + queue_length != len(body):
            raise ValueError(f"REMOVE names {queue_length} queue bytes but the body has {len(body)}")
        return kind, RemoveRecord(str(body[_REMOVE.size:], "utf-8"), seq)
    if kind == DECLARE:
        settings = json.loads(bytes(body[1:]))
        if not isinstance(settings, dict) or not isinstance(settings.get("name"), str):
            raise ValueError("DECLARE is not a settings object with a string 'name'")
        return kind, settings
    if kind == DELETE:
        return kind, str(body[1:], "utf-8")
    if kind == TXN_BEGIN:
        _, record_count = _TXN_BEGIN.unpack(body)
        if record_count < 1:
            raise ValueError("TXN_BEGIN of no record")
        return kind, record_count
    if kind == TXN_COMMIT:
        if len(body) != 1:
            raise ValueError(f"TXN_COMMIT has {len(body) - 1} bytes after its kind, none expected")
        return kind, None
    raise NewerFormat(f"record kind {kind}, which this build does not know")


def store_payload(frame: bytes | memoryview) -> tuple[int, bytes]:
    """(seq, payload) of one whole STORE frame read back for paging (node/store/reads.py).
    Raises ValueError for anything else: the journal's index pointed at the wrong bytes."""
    body = _store_body(frame)
    _, _, queue_length, group_length, seq, _, _, _ = _STORE.unpack_from(body)
    return seq, bytes(body[_STORE.size + queue_length + group_length:])


def store_message(frame: bytes | memoryview) -> tuple[int, Message]:
    """(seq, Message) of one whole STORE frame read back for paging, payload included; ValueError as
    store_payload."""
    message = decode_body(_store_body(frame))[1].message
    return message.seq, message


def _store_body(frame: bytes | memoryview) -> memoryview:
    if len(frame) < FRAME_HEADER_BYTES + _STORE.size:
        raise ValueError(f"a STORE frame is at least {FRAME_HEADER_BYTES + _STORE.size} bytes, got {len(frame)}")
    body_length, crc = FRAME.unpack_from(frame)
    body = memoryview(frame)[FRAME_HEADER_BYTES:]
    if body_length != len(body) or zlib.crc32(body) != crc or body[0] != STORE:
        raise ValueError("not a whole STORE frame (length, crc or kind differ)")
    return body


def record_identity(frame: bytes | memoryview) -> tuple[int, str, str | None, int]:
    """(kind, queue, group id or None, seq) of one whole STORE or REMOVE frame (a REMOVE names no group:
    None), read without copying its payload: a backup checks each frame its owner replicates
    (node/store/replica_journal.py). ValueError saying what is wrong with anything else."""
    if len(frame) < FRAME_HEADER_BYTES + 1:
        raise ValueError(f"a frame is at least {FRAME_HEADER_BYTES + 1} bytes, got {len(frame)}")
    body_length, crc = FRAME.unpack_from(frame)
    body = memoryview(frame)[FRAME_HEADER_BYTES:]
    if body_length != len(body):
        raise ValueError(f"the frame's length field says {body_length} body bytes, it has {len(body)}")
    if zlib.crc32(body) != crc:
        raise ValueError("the frame's crc does not match its body")
    kind = body[0]
    if kind == REMOVE:
        record = decode_body(body)[1]
        return kind, record.queue, None, record.seq
    if kind != STORE:
        raise ValueError(f"record kind {kind} is no STORE ({STORE}) or REMOVE ({REMOVE})")
    if len(body) < _STORE.size:
        raise ValueError(f"a STORE body is at least {_STORE.size} bytes, got {len(body)}")
    _, flags, queue_length, group_length, seq = _STORE_HEAD.unpack_from(body)
    group_start = _STORE.size + queue_length
    if group_start + group_length > len(body):
        raise ValueError(f"STORE names {queue_length}+{group_length} bytes but the body has {len(body)}")
    group_id = str(body[group_start:group_start + group_length], "utf-8") if flags & _GROUP_PRESENT else None
    return kind, str(body[_STORE.size:group_start], "utf-8"), group_id, seq


def store_header(buffer: bytes, start: int, length: int, names: dict) -> tuple[str, int, int] | None:
    """(queue, seq, bytes of the group id) of the STORE body at buffer[start:start + length], read
    without copying its payload, decoding its group id or making a Message; None for a queue whose name
    starts with NUL (the cluster's own, read whole). `names` caches decoded queue names by their bytes
    (a recovery's few queues are decoded once each, not once per record). ValueError as decode_body."""
    if length < _STORE.size:
        raise ValueError(f"a STORE body is at least {_STORE.size} bytes, got {length}")
    _, _, queue_length, group_length, seq = _STORE_HEAD.unpack_from(buffer, start)
    queue_start = start + _STORE.size
    group_start = queue_start + queue_length
    if group_start + group_length > start + length:
        raise ValueError(f"STORE names {queue_length}+{group_length} bytes but the body has {length}")
    if queue_length and buffer[queue_start] == 0:
        return None
    raw = buffer[queue_start:group_start]
    queue = names.get(raw)
    if queue is None:
        queue = names[raw] = str(raw, "utf-8")
    return queue, seq, group_length
