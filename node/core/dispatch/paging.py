"""Which message bodies of one durable queue are in memory: the paging index. Pure: no I/O, no clock.

The queue keeps every message's record (seq, group, size_bytes); the Pager decides whose `payload`
stays. Its rules:
- Only a body whose STORE is on disk (JOURNALLED, set by the adapter once the journal reported it
  durable) is paged out: the journal is then where it lives, and the writer thread reads it back by
  queue and seq. A send whose write failed is never JOURNALLED, so it stays in memory.
- Page-out takes the newest resident bodies first, the tails of the groups' backlogs, farthest from
  dispatch, until the bodies it may page ("pageable": available, resident, not read back) fit the budget.
- Dispatch never hands out a message without its body (the queue checks PAGED at every head). A group
  whose next messages are paged asks for up to READ_AHEAD_MESSAGES of them (one `PageIn` effect per
  queue call) and waits; nothing of it is skipped, and other groups go on. It asks only once dispatch
  meets it for a consumer that could take it (its consumer has credit, or it has no consumer and some
  consumer has): a group whose consumer grants no credit reads nothing ahead. After each delivery from a
  group, its body halfway through the window is checked, so a group being consumed asks ahead of need.
- Read-ahead is bounded per queue: bodies asked for or read back and not yet delivered stay within
  READ_AHEAD_BYTES_MAX (one message may pass it, so a body larger than the bound still comes back).
  Groups that find no room wait for it in the order they asked.
- A body read back, or returned by its consumer (a release), is FETCHED: it counts in read-ahead, not in
  the budget, and is not paged out again before it is delivered, so nothing is read twice.
- A group the cluster holds to hand over keeps its bodies, and asks for those paged before the hold
  (`want_whole`) past READ_AHEAD_MESSAGES but within the read-ahead bytes: it leaves this node a window at
  a time (Queue.hand_over_group). So that other groups' read-ahead cannot stall a move for good, such a
  group gets one body even when the room is full, once nothing of it is asked for or back untaken.
- A body a browser needs comes back pageable, not FETCHED: browsing a paged queue must not fill the
  read-ahead room the groups' consumers need.
- A non-durable (TRANSIENT) message is in no journal: it is never paged, and counted nowhere here (as
  a non-durable queue's messages are not): it stays in memory until it leaves, bounded by the queue's depth
  limits, and the budgets page the durable bodies around it.
Known limit of this first increment: bodies read back for a group keep their room until delivered, so
consumers that took credit back after their groups' bodies were asked for can hold the read-ahead room
and make other groups wait for it (never out of order, never lost).
"""

from __future__ import annotations

from collections import deque

from node.core.effects import PageIn
from node.core.dispatch.message import (AVAILABLE, FETCHED, JOURNALLED, PAGED, REMOVED, REQUESTED, STATE_MASK,
                                       TRANSIENT, Message)

READ_AHEAD_MESSAGES = 32  # messages from a group's head whose bodies are asked for together
READ_AHEAD_BYTES_MAX = 4 << 20  # bodies per queue asked for or read back and not yet delivered
PAGE_OUT_SCAN_MAX = 4096  # unjournalled bodies page-out steps over at the newest end before it stops
# The pageable list keeps messages in admission order and drops the stale ones (delivered, removed, paged
# since) when page-out meets them; a queue under its budget never pages out, so the list is also swept
# whenever it has doubled in entries since its last sweep (at least PAGEABLE_SWEEP_MIN), or its stale
# entries' bodies pass both the pageable bytes and PAGEABLE_SWEEP_MIN_BYTES: stale entries hold their
# bodies, and unswept they would keep every message the queue ever had in memory (a few large ones are
# as costly as many small ones, so bytes count as well as entries)
PAGEABLE_SWEEP_MIN = 1024
PAGEABLE_SWEEP_MIN_BYTES = 1 << 20


class Pager:
    __slots__ = ("queue_name", "budget_bytes", "pageable_bytes", "fetched_bytes", "requested_bytes",
                 "paged_bytes", "_pageable", "_requested", "_browse_seqs", "_wanting", "_wanting_set",
                 "_whole", "read_ahead_bytes_max", "page_ins", "page_outs", "_sweep_at",
                 "_listed_bytes")

    def __init__(self, queue_name: str, budget_bytes: int = 0, read_ahead_bytes_max: int = READ_AHEAD_BYTES_MAX):
        self.queue_name = queue_name
        self.budget_bytes = budget_bytes  # 0: no budget of the queue's own (the node's may still page it)
        self.read_ahead_bytes_max = read_ahead_bytes_max
        self.pageable_bytes = 0  # available, resident, not FETCHED: what page-out may take
        self.fetched_bytes = 0  # read back or returned, not yet delivered
        self.requested_bytes = 0  # asked for, not yet back
        self.paged_bytes = 0  # available, body only in the journal
        self._pageable: deque[Message] = deque()  # admission order; stale entries dropped when met or swept
        self._sweep_at = PAGEABLE_SWEEP_MIN  # the list's length at which it is swept of stale entries
        self._listed_bytes = 0  # bodies of the list's entries, stale ones included
        self._requested: dict[int, Message] = {}  # seq -> message whose body is asked for
        self._browse_seqs: set[int] = set()  # of those, asked for by a browser only
        self._wanting: deque = deque()  # groups (None: the ungrouped lane) waiting to ask, in order
        self._wanting_set: set = set()
        self._whole: set = set()  # groups asking past READ_AHEAD_MESSAGES (a hand-over)
        self.page_ins = 0  # bodies read back, ever
        self.page_outs = 0  # bodies paged out, ever

    # ---- the queue's events --------------------------------------------------------------------

    def admitted(self, message: Message) -> None:
        if message.flags & TRANSIENT:
            return  # in no journal: never paged, counted nowhere here (see the header)
        if message.payload is None:  # recovered as a record only
            message.flags |= PAGED | JOURNALLED
            self.paged_bytes += message.size_bytes
        else:
            self.pageable_bytes += message.size_bytes
            self._list(message)

    def _list(self, message: Message) -> None:
        pageable = self._pageable
        pageable.append(message)
        self._listed_bytes += message.size_bytes
        stale_bytes = self._listed_bytes - self.pageable_bytes
        if len(pageable) >= self._sweep_at or stale_bytes > max(PAGEABLE_SWEEP_MIN_BYTES, self.pageable_bytes):
            # amortized: a sweep follows a doubling of the entries, or as many stale bytes as live ones
            self._pageable = pageable = deque(listed for listed in pageable if _pageable(listed))
            self._sweep_at = max(PAGEABLE_SWEEP_MIN, 2 * len(pageable))
            self._listed_bytes = sum(listed.size_bytes for listed in pageable)

    def delivered(self, message: Message) -> None:
        """`message` leaves the available ones for a consumer; its body is resident (the queue checked)."""
        flags = message.flags
        if flags & FETCHED:
            message.flags = flags & ~FETCHED
            self.fetched_bytes -= message.size_bytes
        elif not flags & TRANSIENT:
            self.pageable_bytes -= message.size_bytes

    def returned(self, message: Message) -> None:
        """A delivered message is available again, near its group's head: kept for its redelivery."""
        if message.flags & TRANSIENT:
            return
        message.flags |= FETCHED
        self.fetched_bytes += message.size_bytes

    def removed(self, message: Message) -> None:
        """Called before the queue marks `message` REMOVED."""
        flags = message.flags
        if flags & STATE_MASK != AVAILABLE or flags & TRANSIENT:
            return  # acquired, or non-durable: counted nowhere here
        if flags & PAGED:
            self.paged_bytes -= message.size_bytes
        elif flags & FETCHED:
            message.flags = flags & ~FETCHED
            self.fetched_bytes -= message.size_bytes
        else:
            self.pageable_bytes -= message.size_bytes

    def clear(self) -> None:
        self.pageable_bytes = self.fetched_bytes = self.paged_bytes = self.requested_bytes = 0
        self._pageable.clear()
        self._sweep_at = PAGEABLE_SWEEP_MIN
        self._listed_bytes = 0
        self._requested.clear()
        self._browse_seqs.clear()
        self._wanting.clear()
        self._wanting_set.clear()
        self._whole.clear()

    # ---- page-out ------------------------------------------------------------------------------

    def page_out(self, target_bytes: int, held_keys=()) -> int:
        """Page out the newest journalled bodies until pageable bytes are at most `target_bytes`;
        returns the bytes paged out. Groups in `held_keys` (held by the cluster for a hand-over) keep
        their bodies: they leave this node whole, forwarded from memory."""
        pageable = self._pageable
        aside: list[Message] = []
        freed = 0
        while self.pageable_bytes > target_bytes and pageable and len(aside) < PAGE_OUT_SCAN_MAX:
            message = pageable.pop()
            self._listed_bytes -= message.size_bytes
            if not _pageable(message):
                continue  # stale: delivered, removed, paged or read back since it was listed
            flags = message.flags
            if not flags & JOURNALLED or (held_keys and message.group is not None
                                          and message.group.key in held_keys):
                aside.append(message)  # its write is not reported yet (or failed), or its group is held
                continue
            message.payload = None
            message.flags = flags | PAGED
            self.pageable_bytes -= message.size_bytes
            self.paged_bytes += message.size_bytes
            freed += message.size_bytes
            self.page_outs += 1
        if aside:
            aside.reverse()
            pageable.extend(aside)
            self._listed_bytes += sum(message.size_bytes for message in aside)
        return freed

    # ---- page-in -------------------------------------------------------------------------------

    def want(self, group) -> None:
        """`group` (None: the ungrouped lane) has paged bodies near its head: ask when there is room."""
        if group not in self._wanting_set:
            self._wanting_set.add(group)
            self._wanting.append(group)

    def want_whole(self, group) -> None:
        self._whole.add(group)
        self.want(group)

    def want_browse(self, message: Message, effects: list) -> None:
        if message.flags & REQUESTED:
            return
        self._ask(message)
        self._browse_seqs.add(message.seq)
        effects.append(PageIn(self.queue_name, (message.seq,)))

    def ask(self, lanes, effects: list) -> None:
        """Ask for the bodies of the waiting groups while there is room. `lanes(group)` gives a
        group's messages in seq order, or None when the group is gone."""
        seqs: list[int] = []
        wanting = self._wanting
        while wanting:
            group = wanting[0]
            lane = lanes(group)
            whole = group in self._whole
            finished = True
            if lane is not None:
                counted = 0
                coming = False  # a body of the group is asked for or back and not taken yet
                for message in lane:
                    flags = message.flags
                    if flags & STATE_MASK != AVAILABLE:
                        continue
                    counted += 1
                    if counted > READ_AHEAD_MESSAGES and not whole:
                        break
                    if flags & PAGED and flags & REQUESTED:
                        self._browse_seqs.discard(message.seq)  # a group's now: it comes back FETCHED
                        coming = True
                    elif flags & PAGED:
                        if (self.fetched_bytes + self.requested_bytes >= self.read_ahead_bytes_max
                                and (coming or not whole)):
                            finished = False
                            break
                        self._ask(message)
                        seqs.append(message.seq)
                        coming = True
                    elif flags & FETCHED:
                        coming = True
            if not finished:
                break
            wanting.popleft()
            self._wanting_set.discard(group)
            self._whole.discard(group)
        if seqs:
            effects.append(PageIn(self.queue_name, tuple(seqs)))

    def _ask(self, message: Message) -> None:
        message.flags |= REQUESTED
        self._requested[message.seq] = message
        self.requested_bytes += message.size_bytes

    def arrived(self, seq: int, payload: bytes | None) -> Message | None:
        """A body read back: the message it made resident, or None (gone meanwhile, or not asked for).
        A None payload (the journal has no such record) leaves the message paged and returns it."""
        message = self._requested.pop(seq, None)
        if message is None:
            return None
        self.requested_bytes -= message.size_bytes
        message.flags &= ~REQUESTED
        browse = seq in self._browse_seqs
        if browse:
            self._browse_seqs.discard(seq)
        if message.flags & STATE_MASK == REMOVED or payload is None:
            return message if payload is None and message.flags & STATE_MASK != REMOVED else None
        message.payload = payload
        self.paged_bytes -= message.size_bytes
        self.page_ins += 1
        if browse:
            message.flags &= ~PAGED
            self.pageable_bytes += message.size_bytes
            self._list(message)
        else:
            message.flags = message.flags & ~PAGED | FETCHED
            self.fetched_bytes += message.size_bytes
        return message

    @property
    def waiting(self) -> bool:
        return bool(self._wanting)


def _pageable(message: Message) -> bool:
    """Available, resident and not read back: what page-out may take (else a stale list entry)."""
    return message.flags & (STATE_MASK | PAGED | FETCHED) == AVAILABLE
