"""Settlement: what a consumer's outcome does to a delivered message, poison messages and dead letters.
Pure: time is `now_ms`.

Rules this module keeps:
- accepted: the message is gone. rejected: it is dead-lettered if `dead_letter_refusal` (the broker)
  says a dead-letter queue can take it, else dropped (a `Dropped` effect says why): redelivering it
  would only be refused again.
- released, or modified without delivery-failed: it goes back to its original place in its group.
- A failed delivery (modified with delivery-failed, or unsettled at its consumer's detach) counts in
  `delivery_count`. It comes back after `redelivery_delay_for_ms`; while it waits at its group's head
  the group is in no heap (node/core/dispatch/queue_groups.py), so no later message of the group overtakes it.
  At `delivery_count_max` it is dead-lettered if the broker says a dead-letter queue can take it, else
  it stays (a `Kept` effect says so once) and is retried at every failure.
- A group's consumer lets it go once nothing of it is acquired, for the shared policy or a held group.
"""

from __future__ import annotations

import heapq

from node.core.effects import Delayed, Dropped, Kept
from node.core.dispatch.message import AVAILABLE, Message, Outcome
from node.core.dispatch.queue_groups import GroupTable
from node.core.dispatch.queue_lanes import PAUSED, Group
from node.core.dispatch.queue_store import MessageStore
from node.core.dispatch.settings import QueueSettings


class Settlement:
    __slots__ = ("settings", "groups", "store", "dead_letter_refusal")

    def __init__(self, settings: QueueSettings, groups: GroupTable, store: MessageStore):
        self.settings = settings
        self.groups = groups
        self.store = store
        # the broker's answer to "can this message be dead-lettered now?": None yes, else why not
        self.dead_letter_refusal = _no_refusal

    def settle_one(self, message: Message, outcome: Outcome, delivery_failed: bool, now_ms: int,
                   effects: list, dead: list) -> Group | None:
        """Apply one outcome to an acquired message; appends (message, reason) to `dead` for each one to
        dead-letter; returns its group, for after_settle once the caller settled all it settles."""
        store = self.store
        store.acquired_messages -= 1
        group = message.group
        if group is not None:
            group.acquired -= 1
        if outcome is Outcome.ACCEPTED:
            store.remove(message, effects)
        elif outcome is Outcome.REJECTED:
            refusal = self.dead_letter_refusal(message)
            store.remove(message, effects)
            if refusal is None:
                dead.append((message, "rejected"))
            else:  # the consumer refused it for good: redelivering it would only be refused again
                effects.append(Dropped(self.settings.name, message.seq, f"rejected; {refusal}"))
        else:
            failed = outcome is Outcome.MODIFIED and delivery_failed
            if failed:
                message.delivery_count += 1
            if not self._poisoned(message, effects, dead):
                self._come_back(message, group, failed, now_ms, effects)
        return group

    def _poisoned(self, message: Message, effects: list, dead: list) -> bool:
        """At delivery_count_max a message is dead-lettered (True) when the broker says it can be."""
        limit = self.settings.delivery_count_max
        if limit and message.delivery_count >= limit:
            refusal = self.dead_letter_refusal(message)
            if refusal is None:
                self.store.remove(message, effects)
                dead.append((message, f"delivery_count_max={limit} reached"))
                return True
            if message.delivery_count == limit:  # said once: it stays, and is retried at every failure
                effects.append(Kept(self.settings.name, message.seq,
                                    f"delivery_count_max={limit} reached; {refusal}"))
        return False

    def _come_back(self, message: Message, group: Group | None, failed: bool, now_ms: int,
                   effects: list) -> None:
        """A released or failed delivery returns to its place, after its redelivery delay if it failed."""
        if message.expires_at_ms and message.expires_at_ms <= now_ms:
            # tick() spent its expiry entry while it was acquired: drop it here, not in its group
            self.store.remove(message, effects)
            effects.append(Dropped(self.settings.name, message.seq, "ttl expired"))
            return
        message.state = AVAILABLE
        if self.store.pager is not None:
            self.store.pager.returned(message)
        delay_ms = self.settings.redelivery_delay_for_ms(message.delivery_count) if failed else 0
        if delay_ms:
            message.available_at_ms = now_ms + delay_ms
            heapq.heappush(self.store.delayed, (message.available_at_ms, message.seq, message))
            effects.append(Delayed(self.settings.name, message.seq, message.available_at_ms))
        self.groups.make_available(message, None if group is None else group.key, returning=True)

    def after_settle(self, group: Group) -> None:
        if group.acquired == 0:
            if group.consumer is not None and (group.placed is PAUSED or self.settings.group_policy == "shared"):
                group.consumer.unassign(group)
            if group.placed is PAUSED:
                group.placed = None
        self.groups.place_or_forget(group)


def _no_refusal(message: Message) -> None:
    return None  # a queue on its own hands every dead letter to its caller
