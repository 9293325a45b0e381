"""Producer de-duplication per queue (issue 31): a resend within the queue's window is accepted, not queued again.

As ActiveMQ Artemis's duplicate detection (`_AMQ_DUPL_ID`) and SQS FIFO's deduplication id do it.
Rules:
- Only queues with `settings.dedup` come here (Broker.enqueue branches on that setting alone: a queue
  without it pays nothing more). A message's key is read by the adapter's reader (`id_of(payload)`,
  node.amqp.message_fields.dedup_id): the application property `_AMQ_DUPL_ID` when present (Artemis's
  name), else the properties section's message-id; a message with neither is queued normally.
- A window per queue remembers the keys of the messages it queued, in arrival order, at most
  `dedup_window_messages` of them and each for `dedup_window_ms` (0: until the count pushes it out).
  Ages are checked on arrival (and at recovery), not by a timer: a mark past its age is forgotten
  before the next arrival is judged. O(1) per message: a dict for lookups, a deque for the order; a
  mark forgotten early (a take-back) leaves its deque entry behind, passed over when it reaches the front.
  Memory is bounded by `dedup_window_messages`: ~240 bytes an id of 16 characters (1,000,000: 225 MiB).
- A duplicate raises `Duplicate` (no GrouperError: it is no refusal). Its callers (the node shell, the
  cluster owner and its parking) answer the producer `accepted` once what is journalled so far is on
  disk, and queue nothing. `dropped_total[queue]` counts them (queue stats, /metrics).
- Marks survive restarts as their own journal records, with no new record kind: the mark of a message
  of a durable queue is a STORE under the reserved name DEDUP_PREFIX + queue (payload: the key in UTF-8,
  seq: the message's, enqueued_at_ms: when it was marked), journalled right after the message's own
  STORE, and a REMOVE when it leaves the window. Why not rebuild the window from the queue's STOREs at
  recovery: the marks must outlive their messages (a resend after the first copy was consumed is still a
  duplicate), so removed messages would need a mark record anyway; and a cold or paged recovery does
  not read the bodies the keys are in. One small record per message on a dedup queue, none elsewhere.
  A torn write can leave a message without its mark (a resend is then queued again: at least once),
  never a mark without its message (which would drop a message its producer was never told about).
- A non-durable queue's marks live in memory only: a restart forgets them, as it forgets its messages.
- A send taken back (its journal write failed) loses its mark too, so its producer's resend is queued.
- Pure: no I/O, no clock; callers pass `now_ms`.
"""

from __future__ import annotations

from collections import deque

from node.core.dispatch.message import Message
from node.core.effects import Removed, Stored
from node.core.errors import InvalidField

DEDUP_PREFIX = "\x00dedup\x00"  # journal name of a queue's de-duplication marks: prefix, queue
DEDUP_ID_LENGTH_MAX_CHARS = 1024  # longer ids are refused (amqp:invalid-field): a window holds them all


class Duplicate(Exception):
    """The message is a resend of one the queue took within its window: accept it, queue nothing."""

    def __init__(self, queue: str, key: str):
        super().__init__(f"queue {queue!r} took a message with id {key!r} already")
        self.queue = queue
        self.key = key


class Window:
    """One queue's remembered ids: key -> seq of the message it marked; the order, oldest first, with the times."""

    __slots__ = ("marks", "order", "messages_max", "window_ms")

    def __init__(self, messages_max: int, window_ms: int):
        self.marks: dict[str, int] = {}
        self.order: deque = deque()  # (key, seq, marked_at_ms), in the order marked
        self.messages_max = messages_max
        self.window_ms = window_ms  # 0: no age limit

    def __len__(self) -> int:
        return len(self.marks)

    def __contains__(self, key: str) -> bool:
        return key in self.marks

    def expire(self, now_ms: int, room: int = 0) -> list[int]:
        """Forget the marks past their age, and the oldest beyond `messages_max - room`; their seqs."""
        marks, order, window_ms = self.marks, self.order, self.window_ms
        keep = self.messages_max - room
        evicted: list[int] = []
        while order:
            key, seq, at_ms = order[0]
            if marks.get(key) != seq:  # forgotten early (a take-back)
                order.popleft()
                continue
            if len(marks) <= keep and not (window_ms and at_ms + window_ms <= now_ms):
                break
            order.popleft()
            del marks[key]
            evicted.append(seq)
        return evicted

    def mark(self, key: str, seq: int, at_ms: int) -> None:
        self.marks[key] = seq
        self.order.append((key, seq, at_ms))

    def forget(self, key: str, seq: int) -> bool:
        if self.marks.get(key) != seq:
            return False
        del self.marks[key]
        return True


class Dedup:
    """Every dedup queue's window, by queue name; the broker's collaborator (node/core/dispatch/broker.py)."""

    def __init__(self, id_of):
        self.id_of = id_of  # payload -> key str or None (the adapter's reader; None: no reader, nothing is a resend)
        self.windows: dict[str, Window] = {}
        self.dropped_total: dict[str, int] = {}

    def window(self, settings) -> Window:
        window = self.windows.get(settings.name)
        if window is None:
            window = self.windows[settings.name] = Window(settings.dedup_window_messages, settings.dedup_window_ms)
        else:  # the settings may have been redefined on a live queue
            window.messages_max, window.window_ms = settings.dedup_window_messages, settings.dedup_window_ms
        return window

    def key(self, settings, payload: bytes | None, now_ms: int, effects: list) -> str | None:
        """The message's key, or None (no id: queued normally). Raises Duplicate for a resend within the
        window, InvalidField for an id too long to remember; `effects` gets the Removed of aged-out marks."""
        if payload is None or self.id_of is None:
            return None
        key = self.id_of(payload)
        if not key:  # no id (an empty one is none either)
            return None
        if len(key) > DEDUP_ID_LENGTH_MAX_CHARS:
            raise InvalidField(f"de-duplication id of {len(key)} characters; queue {settings.name!r} remembers ids "
                               f"of at most {DEDUP_ID_LENGTH_MAX_CHARS}: send a shorter message-id or _AMQ_DUPL_ID")
        window = self.window(settings)
        self._evicted(settings, window.expire(now_ms), effects)
        if key in window.marks:
            self.dropped_total[settings.name] = self.dropped_total.get(settings.name, 0) + 1
            raise Duplicate(settings.name, key)
        return key

    def mark(self, settings, key: str, message: Message, now_ms: int, effects: list) -> None:
        """The message was queued: remember its key (journalled after its STORE, on a durable queue)."""
        window = self.window(settings)
        self._evicted(settings, window.expire(now_ms, room=1), effects)
        window.mark(key, message.seq, now_ms)
        if settings.durable:
            effects.append(Stored(DEDUP_PREFIX + settings.name, mark_record(key, message.seq, now_ms)))

    def forget(self, settings, message: Message, effects: list) -> None:
        """A send taken back: its mark goes too, so its producer's resend is queued."""
        window = self.windows.get(settings.name)
        key = self.id_of(message.payload) if window is not None and message.payload is not None else None
        if key is not None and window.forget(key, message.seq) and settings.durable:
            effects.append(Removed(DEDUP_PREFIX + settings.name, message.seq))

    def restore(self, settings, records: list[Message], now_ms: int) -> list:
        """Recovery: the queue's mark records, in seq order, back into its window; the Removed of those
        past the window now (their REMOVEs, journalled like any other)."""
        window = self.window(settings)
        for record in records:
            window.mark(bytes(record.payload).decode("utf-8"), record.seq, record.enqueued_at_ms)
        effects: list = []
        self._evicted(settings, window.expire(now_ms), effects)
        return effects

    def stats(self, stats: dict) -> dict:
        """A queue's stats with its count of resends not queued again."""
        stats["dedup_dropped_total"] = self.dropped_total.get(stats["name"], 0)
        return stats

    def drop(self, queue_name: str) -> None:
        self.windows.pop(queue_name, None)
        self.dropped_total.pop(queue_name, None)

    @staticmethod
    def _evicted(settings, seqs: list[int], effects: list) -> None:
        if seqs and settings.durable:
            name = DEDUP_PREFIX + settings.name
            effects += [Removed(name, seq) for seq in seqs]


def mark_record(key: str, seq: int, at_ms: int) -> Message:
    """The journal record of a mark: a STORE under DEDUP_PREFIX + queue (the header's rule)."""
    return Message(key.encode("utf-8"), None, enqueued_at_ms=at_ms, seq=seq)
