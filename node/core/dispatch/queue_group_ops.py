"""What management and the cluster do to a queue's groups: reset their consumers, take messages (purge, move),
hold a group and hand it over to another node. Pure: time is `now_ms`.

Rules this module keeps:
- Acquired messages are never taken: they belong to a consumer until settled.
- A group's messages are taken from its head, in order, and only with their bodies in memory (`bodies`):
  paged ones further on are asked for a window at a time, never a whole backlog at once.
- A held group (GroupTable.hold, for the cluster) delivers nothing more; it is handed over only once
  nothing of it is in flight: a message delivered here must be settled (or released) before another
  node may deliver the next.
"""

from __future__ import annotations

from collections import deque

from node.core.dispatch.message import AVAILABLE, PAGED, STATE_MASK, Message
from node.core.dispatch.queue_dispatch import Dispatcher
from node.core.dispatch.queue_groups import GroupTable
from node.core.dispatch.queue_rebalance import rebalance_incremental
from node.core.dispatch.queue_store import MessageStore
from node.core.dispatch.settings import QueueSettings


class GroupOps:
    __slots__ = ("settings", "groups", "store", "dispatcher")

    def __init__(self, settings: QueueSettings, groups: GroupTable, store: MessageStore, dispatcher: Dispatcher):
        self.settings = settings
        self.groups = groups
        self.store = store
        self.dispatcher = dispatcher

    def reset_groups(self, group_key, now_ms: int, effects: list) -> int:
        """Free one group (or every group with None); in-flight groups are freed once settled."""
        groups = self.groups
        cold = self.store.cold
        if group_key is not None and cold is not None and cold.count \
                and groups.group_key_from_text(group_key) not in groups.groups:
            return 0  # perhaps a group of the cold tail's only: one without a consumer, or it would be known
        chosen = [groups.find(group_key)] if group_key is not None else list(groups.groups.values())
        count = groups.reset(chosen, pause=True)
        self.dispatcher.dispatch(now_ms, effects)
        return count

    def rebalance(self, newcomer) -> int:
        """group_rebalance: a consumer first granted credit. "reset" frees every group's consumer,
        "incremental" moves only the surplus (node/core/dispatch/queue_rebalance.py); returns groups moved."""
        pause = self.settings.group_rebalance_pause_dispatch
        if self.settings.group_rebalance_mode == "incremental":
            return rebalance_incremental(self.groups, self.dispatcher.consumers, newcomer, pause)
        return self.groups.reset(list(self.groups.groups.values()), pause)

    def next_free_group(self) -> str | None:
        """For a consumer asking for "the next free group" (issue 30, a null com.microsoft:session-filter): of
        the groups with a message available, no consumer and no consumer that chose them, the one whose head
        is oldest; None when there is none. One look at the unassigned heap and the stranded groups, at attach
        only. Bucket queues have no such group: a bucket is no group a client can name."""
        consumers = self.dispatcher.consumers
        chosen = {consumer.selector.group_id for consumer in consumers.by_id.values()
                  if consumer.selector is not None and not consumer.browse and consumer.selector.group_id is not None}
        best_seq, best_key = None, None
        for entry in self.groups.unassigned:
            group = entry[1]
            if group.placed is entry and type(group.key) is str and group.key not in chosen \
                    and (best_seq is None or entry[0] < best_seq):
                best_seq, best_key = entry[0], group.key
        stranded = consumers.selection.stranded if consumers.selection is not None else ()
        for group in stranded:
            head = group.head() if group.consumer is None and self.groups.groups.get(group.key) is group else None
            if head is not None and type(group.key) is str and group.key not in chosen \
                    and (best_seq is None or head.seq < best_seq):
                best_seq, best_key = head.seq, group.key
        return best_key

    def release_group(self, group_key, now_ms: int, effects: list) -> None:
        self.groups.release(group_key)
        self.dispatcher.dispatch(now_ms, effects)

    def take_group_messages(self, group_key, count: int | None, effects: list, bodies: bool = True,
                            bytes_max: int | None = None, whole: bool = False) -> list[Message]:
        """Remove up to `count` available messages from a group's head (all with None).

        Acquired messages are never taken: they belong to a consumer until settled. `bodies` False
        (a purge): paged-out messages are taken too; else only up to the first one (see group_head_messages,
        which also says `bytes_max` and `whole`)."""
        group = self.groups.find(group_key)
        taken = self.group_head_messages(group_key, count, bodies, bytes_max, whole)
        for message in taken:
            self.store.remove(message, effects)
        group.available_count -= len(taken)
        self.groups.place_or_forget(group)  # its head() drops the tombstones just made
        return taken

    def take_ungrouped_messages(self, count: int | None, effects: list) -> list[Message]:
        """Remove up to `count` available messages that are in no group (all with None), in queue order.

        Acquired ones are never taken. The lane keeps only what is still available, so a purge of a
        queue no consumer reads leaves no tombstones behind."""
        taken: list[Message] = []
        for message in self.groups.ungrouped:
            if count is not None and len(taken) >= count:
                break
            if message.flags & STATE_MASK == AVAILABLE:
                taken.append(message)
        for message in taken:
            self.store.remove(message, effects)
        if taken:
            self.groups.ungrouped = deque(message for message in self.groups.ungrouped
                                          if message.flags & STATE_MASK == AVAILABLE)
        return taken

    def group_head_messages(self, group_key, count: int | None, bodies: bool = True,
                            bytes_max: int | None = None, whole: bool = False) -> list[Message]:
        """The first `count` available messages of a group (all with None), left in place, and none past
        the one whose body reaches `bytes_max` (None: no bound). With `bodies` they end before the first
        one whose body is paged out, and the group's next bodies are asked for (a move copies bodies: the
        caller moves what it got; called again, the next window); `whole` asks past READ_AHEAD_MESSAGES
        (Pager.want_whole: a hand-over)."""
        group = self.groups.find(group_key)
        head: list[Message] = []
        head_bytes = 0
        for message in group.messages():
            if (count is not None and len(head) >= count) or (bytes_max is not None and head_bytes >= bytes_max):
                break
            if message.state == AVAILABLE:
                if bodies and message.flags & PAGED:
                    # the next window, within the read-ahead room: never a whole backlog
                    pager = self.store.pager
                    (pager.want_whole if whole else pager.want)(group)
                    break
                head.append(message)
                head_bytes += message.size_bytes
        return head

    def hand_over_group(self, group_key, effects: list, messages_max: int,
                        bytes_max: int) -> tuple[list[Message], bool]:
        """Remove a held group's next available messages, in order, for another node: at most
        `messages_max`, and none past the one whose body reaches `bytes_max`, all with their bodies in
        memory (paged ones further on are asked for, a window at a time: read them back whole and a
        large group would be in memory twice). Returns them and whether nothing of the group is left
        here, its consumer freed. Only once nothing of it is in flight: a message delivered here must be
        settled (or released) before another node may deliver the next."""
        group = self.groups.groups.get(group_key)
        if group is None:
            return [], True
        if group.acquired or group_key not in self.groups.held_keys:
            return [], False
        taken = self.take_group_messages(group_key, messages_max, effects, bytes_max=bytes_max, whole=True)
        for message in taken:
            message.handed_out = True  # a copy lives on at the new owner: a failed write cannot take it back
        if group.available_count:
            return taken, False  # held, so in no heap: the rest goes at the next call
        if group.consumer is not None:  # without one, take_group_messages forgot the group already
            group.consumer.unassign(group)
            self.groups.place_or_forget(group)  # idle now: forgotten
        return taken, True
