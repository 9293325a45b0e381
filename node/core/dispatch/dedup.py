"""Producer de-duplication per queue (issue 31): a resend within the queue's window is accepted, not queued again.

As ActiveMQ Artemis's duplicate detection (`_AMQ_DUPL_ID`) and SQS FIFO's deduplication id do it.
Rules:
- Only queues with `settings.dedup` come here (Broker.enqueue branches on that setting alone: a queue
  without it pays nothing more). A message's key is read by the adapter's reader (`id_of(payload)`,
  node.amqp.duplicate_ids.dedup_id): the application property `_AMQ_DUPL_ID` when present (Artemis's
  name), else the properties section's message-id; a message with neither is queued normally.
- A window per queue remembers the keys of the messages it queued, in arrival order, at most
  `dedup_window_messages` of them and each for `dedup_window_ms` (0: until the count pushes it out).
  Ages are checked on arrival (and at recovery), not by a timer: a mark past its age is forgotten
  before the next arrival is judged. O(1) per message: a dict for lookups, a deque for the order; a
  mark forgotten early (a take-back) leaves its deque entry behind, passed over when it reaches the front.
  Memory is bounded by `dedup_window_messages`: ~245 bytes an id of 16 characters (1,000,000: 233 MiB).
- A duplicate raises `Duplicate` (no GrouperError: it is no refusal). Its callers (the node shell, the
  cluster owner and its parking) answer the producer `accepted` once what is journalled so far is on
  disk, queue nothing, and carry out its `effects`. `dropped_total[queue]` counts them (queue stats,
  /metrics).
- In a cluster a group's owner de-duplicates (its broker takes the message, forwarded ones too). The
  windows are this node's: a group that moves to another owner leaves its marks here (README's limit).
- Marks survive restarts as their own journal records, with no new record kind: the marks a durable queue
  made in one batch are one STORE under the reserved name DEDUP_PREFIX + queue (seq: the batch's first
  marked message's; payload: each mark's seq, time and key, `encode_marks`), taken at the batch's end
  (`take_marks`, node/core/shell.py's end_batch) so it goes to disk in the unit of its messages' STOREs,
  after them; a REMOVE once every mark in it has left the window. Why not rebuild the window from the
  queue's STOREs at recovery: the marks must outlive their messages (a resend after the first copy was
  consumed is still a duplicate), so removed messages would need a mark record anyway; and a cold or
  paged recovery does not read the bodies the keys are in. Why a record per batch: one per message
  cost the node ~9 us per message (a record's encoding, crc and index), one per batch a fraction.
  A torn write can leave a message without its mark (a resend is then queued again: at least once),
  never a mark without its message (which would drop a message its producer was never told about).
- A non-durable queue's marks, and those of messages sent non-durable (TRANSIENT, not journalled), live in
  memory only: a restart forgets them, as it forgets those messages.
- A send taken back (its journal write failed) loses its mark too, so its producer's resend is queued.
  The room it leaves in a full window may, after a restart, hold a mark pushed out before (its record
  still live for its other marks): a restart never remembers fewer ids than the window held.
- Pure: no I/O, no clock; callers pass `now_ms`.
"""

from __future__ import annotations

import struct
from collections import deque

from node.core.dispatch.message import TRANSIENT, Message
from node.core.effects import Removed, Stored
from node.core.errors import InvalidField

DEDUP_PREFIX = "\x00dedup\x00"  # journal name of a queue's de-duplication marks: prefix, queue
DEDUP_ID_LENGTH_MAX_CHARS = 1024  # longer ids are refused (amqp:invalid-field): a window holds them all


class Duplicate(Exception):
    """The message is a resend of one the queue took within its window: accept it, queue nothing, carry out
    `effects` (the REMOVEs of records its arrival aged out)."""

    def __init__(self, queue: str, key: str, effects: list):
        super().__init__(f"queue {queue!r} took a message with id {key!r} already")
        self.queue = queue
        self.key = key
        self.effects = effects


class Window:
    """One queue's remembered ids: key -> seq of the message it marked; the order, oldest first, with the
    times and the journal record (seq; 0: none, a non-durable queue) of each; the live marks per record."""

    __slots__ = ("marks", "order", "messages_max", "window_ms", "live", "pending", "pending_record", "settings")

    def __init__(self, messages_max: int, window_ms: int):
        self.marks: dict[str, int] = {}
        self.order: deque = deque()  # (key, seq, marked_at_ms, record), in the order marked
        self.messages_max = messages_max
        self.window_ms = window_ms  # 0: no age limit
        self.live: dict[int, int] = {}  # record seq -> its marks still remembered, ascending
        self.pending: list[tuple] = []  # (key, seq, marked_at_ms) of the record not taken yet
        self.pending_record = 0  # its seq; 0: none
        self.settings = None  # the QueueSettings its limits came from

    def __len__(self) -> int:
        return len(self.marks)

    def __contains__(self, key: str) -> bool:
        return key in self.marks

    def expire(self, now_ms: int, room: int = 0) -> list[int]:
        """Forget the marks past their age, and the oldest beyond `messages_max - room`; the records
        (journalled) this left without a mark."""
        marks, order, window_ms = self.marks, self.order, self.window_ms
        keep = self.messages_max - room
        emptied: list[int] = []
        while order:
            key, seq, at_ms, record = order[0]
            if marks.get(key) != seq:  # forgotten early (a take-back), its record told then
                order.popleft()
                continue
            if len(marks) <= keep and not (window_ms and at_ms + window_ms <= now_ms):
                break
            order.popleft()
            del marks[key]
            if record:
                emptied += self._release(record)
        return emptied

    def mark(self, key: str, seq: int, at_ms: int, record: int) -> None:
        self.marks[key] = seq
        self.order.append((key, seq, at_ms, record))
        if record:
            self.live[record] = self.live.get(record, 0) + 1

    def forget(self, key: str, seq: int) -> list[int]:
        """Forget one mark; the record (journalled) this left without a mark. Looked for from the newest:
        a take-back's send is of the last batches (and a restore's older copy of a key is rare)."""
        if self.marks.get(key) != seq:
            return []
        del self.marks[key]
        record = next(entry[3] for entry in reversed(self.order) if entry[1] == seq)
        return self._release(record) if record else []

    def _release(self, record: int) -> list[int]:
        count = self.live[record] - 1
        if count:
            self.live[record] = count
            return []
        del self.live[record]
        return [] if record == self.pending_record else [record]  # a pending record is simply not written


class Dedup:
    """Every dedup queue's window, by queue name; the broker's collaborator (node/core/dispatch/broker.py)."""

    def __init__(self, id_of):
        self.id_of = id_of  # payload -> key str or None (the adapter's reader; None: no reader, nothing is a resend)
        self.windows: dict[str, Window] = {}
        self.dropped_total: dict[str, int] = {}
        self.pending: dict[str, Window] = {}  # windows with marks not taken into a record yet

    def window(self, settings) -> Window:
        window = self.windows.get(settings.name)
        if window is None:
            window = self.windows[settings.name] = Window(settings.dedup_window_messages, settings.dedup_window_ms)
            window.settings = settings
        elif window.settings is not settings:  # redefined on a live queue
            window.messages_max, window.window_ms = settings.dedup_window_messages, settings.dedup_window_ms
            window.settings = settings
        return window

    def key(self, settings, payload: bytes | None, now_ms: int, effects: list) -> str | None:
        """The message's key, or None (no id: queued normally). Raises Duplicate for a resend within the
        window, InvalidField for an id too long to remember; `effects` gets the Removed of emptied records."""
        if payload is None or self.id_of is None:
            return None
        key = self.id_of(payload)
        if not key:  # no id (an empty one is none either)
            return None
        if len(key) > DEDUP_ID_LENGTH_MAX_CHARS:
            raise InvalidField(f"de-duplication id of {len(key)} characters; queue {settings.name!r} remembers ids "
                               f"of at most {DEDUP_ID_LENGTH_MAX_CHARS}: send a shorter message-id or _AMQ_DUPL_ID")
        window = self.window(settings)
        aged: list = []
        order, window_ms = window.order, window.window_ms
        if order and (window_ms and order[0][2] + window_ms <= now_ms or len(window.marks) > window.messages_max):
            _removed(settings, window.expire(now_ms), aged)
        if key in window.marks:
            self.dropped_total[settings.name] = self.dropped_total.get(settings.name, 0) + 1
            raise Duplicate(settings.name, key, aged)
        effects += aged
        return key

    def mark(self, settings, key: str, message: Message, now_ms: int, effects: list) -> None:
        """The message was queued: remember its key (in this batch's record, on a durable queue). `key`
        made its window and forgot the marks past their age."""
        window = self.windows[settings.name]
        if len(window.marks) >= window.messages_max:
            _removed(settings, window.expire(now_ms, room=1), effects)
        if not settings.durable or message.flags & TRANSIENT:  # not journalled (issue 29): nor is its mark
            window.mark(key, message.seq, now_ms, 0)
            return
        if not window.pending_record:
            window.pending_record = message.seq
            self.pending[settings.name] = window
        window.mark(key, message.seq, now_ms, window.pending_record)
        window.pending.append((key, message.seq, now_ms))

    def take_marks(self) -> list:
        """The end of a batch: each window's new marks still remembered, as one STORE per queue."""
        effects: list = []
        for name, window in self.pending.items():
            marks = window.marks
            kept = [mark for mark in window.pending if marks.get(mark[0]) == mark[1]]
            if kept:
                effects.append(Stored(DEDUP_PREFIX + name, Message(encode_marks(kept), None,
                                                                   seq=window.pending_record)))
            window.pending, window.pending_record = [], 0
        self.pending.clear()
        return effects

    def forget(self, settings, message: Message, effects: list) -> None:
        """A send taken back: its mark goes too, so its producer's resend is queued."""
        window = self.windows.get(settings.name)
        key = self.id_of(message.payload) if window is not None and message.payload is not None else None
        if key is not None:
            _removed(settings, window.forget(key, message.seq), effects)

    def restore(self, settings, records: list[Message], now_ms: int) -> list:
        """Recovery: the queue's mark records, in seq order, back into its window; the Removed of those
        past the window now (their REMOVEs, journalled like any other)."""
        window = self.window(settings)
        emptied: list[int] = []
        for record in records:
            for key, seq, at_ms in decode_marks(record.payload):
                if key in window.marks:  # marked again later: the older mark is gone
                    emptied += window.forget(key, window.marks[key])
                window.mark(key, seq, at_ms, record.seq)
        effects: list = []
        _removed(settings, emptied + window.expire(now_ms), effects)
        return effects

    def stats(self, stats: dict) -> dict:
        """A queue's stats with its count of resends not queued again."""
        stats["dedup_dropped_total"] = self.dropped_total.get(stats["name"], 0)
        return stats

    def drop(self, queue_name: str) -> None:
        self.windows.pop(queue_name, None)
        self.dropped_total.pop(queue_name, None)
        self.pending.pop(queue_name, None)


def _removed(settings, records: list[int], effects: list) -> None:
    if records:
        name = DEDUP_PREFIX + settings.name
        effects += [Removed(name, record) for record in records]


_MARK = struct.Struct("<QQH")  # seq, marked_at_ms, key length in bytes; then the key, UTF-8


def encode_marks(marks: list[tuple]) -> bytes:
    """A record's payload: each (key, seq, marked_at_ms) in order."""
    parts = []
    for key, seq, at_ms in marks:
        data = key.encode("utf-8")
        parts += (_MARK.pack(seq, at_ms, len(data)), data)
    return b"".join(parts)


def decode_marks(payload: bytes):
    position, end = 0, len(payload)
    while position < end:
        seq, at_ms, length = _MARK.unpack_from(payload, position)
        position += _MARK.size
        yield bytes(payload[position:position + length]).decode("utf-8"), seq, at_ms
        position += length
