"""A queue's messages outside memory: bodies paged out (node/core/dispatch/paging.py) and the cold tail
(node/core/dispatch/cold.py), and what the journal's answers about them do to the queue. Pure: time is `now_ms`.

Rules this module keeps:
- Only journalled bodies are paged out, and never those of a group held for the cluster (it leaves the
  node whole, forwarded from memory). A body the journal does not have is dropped loudly (a broken journal).
- The cold tail is read back whole, oldest first, into the warm part; records the journal no longer
  has leave the depth with a `Dropped` effect that says how many.
- An answer to a read of a queue of the same name deleted since is ignored.
- Anything that needs every message of a group refuses while a cold tail exists (cold_refusal): which
  groups its messages belong to is not known until they are read back.
"""

from __future__ import annotations

from node.core.dispatch.cold import read_missing
from node.core.effects import Dropped, Removed
from node.core.errors import ResourceLimitExceeded
from node.core.dispatch.message import JOURNALLED
from node.core.dispatch.queue_dispatch import Dispatcher
from node.core.dispatch.queue_groups import GroupTable
from node.core.dispatch.queue_store import MessageStore
from node.core.dispatch.settings import QueueSettings


class Backlog:
    __slots__ = ("settings", "groups", "store", "dispatcher", "pager", "cold")

    def __init__(self, settings: QueueSettings, groups: GroupTable, store: MessageStore, dispatcher: Dispatcher):
        self.settings = settings
        self.groups = groups
        self.store = store
        self.dispatcher = dispatcher
        self.pager = store.pager
        self.cold = store.cold

    # ---- paging ------------------------------------------------------------------------------

    def page_out(self, target_bytes: int) -> int:
        """Page out journalled bodies until this queue's pageable bytes are at most `target_bytes`."""
        return 0 if self.pager is None else self.pager.page_out(target_bytes, self.groups.held_keys)

    def page_in(self, bodies: dict, now_ms: int, effects: list) -> None:
        """Bodies the journal read back (seq -> payload); a None payload is a body the journal does not
        have: the message is dropped, loudly (a broken journal, never a normal path)."""
        pager = self.pager
        if pager is None:
            return
        touched = []
        for seq, payload in bodies.items():
            message = pager.arrived(seq, payload)
            if message is None:
                continue
            if payload is None:
                self.store.take_available(message, effects)
                effects.append(Dropped(self.settings.name, seq, "its body is missing from the journal"))
                continue
            if message.group is not None:
                touched.append(message.group)
        groups = self.groups
        for group in touched:
            if groups.groups.get(group.key) is group and group.placed is None:
                groups.place_or_forget(group)
        self.dispatcher.dispatch(now_ms, effects)

    # ---- the cold tail -----------------------------------------------------------------------

    def restore_cold(self, count: int, after_seq: int, size_bytes: int) -> None:
        """Journal recovery: `count` live records above `after_seq` (newer than anything here), whose
        payloads are `size_bytes` in all, stay in the journal until dispatch nears them."""
        self.store.depth_messages += count
        self.store.depth_bytes += size_bytes
        self.cold.add_stored(count, after_seq, size_bytes)

    def cold_journalled(self, now_ms: int, effects: list) -> None:
        """Some STOREs were reported on disk: pending cold messages among them let go of their bodies."""
        cold = self.cold
        if cold is not None and cold.pending:
            cold.journalled()
            self.dispatcher.dispatch(now_ms, effects)

    def promote(self, records: dict, now_ms: int, effects: list) -> None:
        """Records the journal read back (seq -> Message) for the cold tail's last ReadRecords: the next
        ones after its `after_seq`. They join the warm part in seq order, and dispatch goes on with them."""
        cold = self.cold
        if cold is None or not cold.asked:
            return
        seqs = sorted(seq for seq, message in records.items() if message is not None)
        if len(seqs) > cold.asked or (seqs and seqs[0] <= cold.after_seq):
            return  # an answer to a read of a queue of the same name deleted since: not this tail's
        store = self.store
        back_bytes = 0
        for seq in seqs:
            message = records[seq]
            message.flags |= JOURNALLED
            back_bytes += message.size_bytes
            store.warm(message, self.groups.key_of(message.group_id))
        missing = read_missing(cold.asked, len(seqs), back_bytes, cold.read_max_bytes)
        if missing:  # their bytes leave the depth once known (ColdTail.promoted)
            store.depth_messages -= missing
            effects.append(Dropped(self.settings.name, cold.after_seq,
                                   f"{missing} cold records after this seq are missing from the journal"))
        store.depth_bytes -= cold.promoted(len(seqs), missing, seqs[-1] if seqs else None, back_bytes)
        self.dispatcher.dispatch(now_ms, effects)

    def cold_taken(self, seq: int, size_bytes: int, effects: list) -> None:
        """Stored cold record `seq` of `size_bytes` left for another node (the cluster's sweep read it
        back): only counted here, so the counts change and its REMOVE is due."""
        self.store.depth_messages -= 1
        self.store.depth_bytes -= size_bytes
        self.cold.taken(size_bytes)
        effects.append(Removed(self.settings.name, seq))

    def cold_refusal(self, what: str) -> None:
        """Raise when `what` needs every message of a group and this queue has a cold tail: which groups
        its messages belong to is not known until they are read back."""
        cold = self.cold
        if cold is not None and cold.count:
            raise ResourceLimitExceeded(
                f"{what}: queue {self.settings.name!r} holds {cold.count} messages past the node's "
                f"record_memory_max_bytes (only in the journal until consumers near them), and a group's "
                f"messages among them are not known here; retry once consumers have drained the queue "
                f"below that budget, purge the whole queue, or raise record_memory_max_bytes")

    def read_cold_for_purge(self, effects: list) -> bool:
        """A queue purge reached the cold tail: read its next records back (past the budget) so the
        purge takes them as warm ones. False when nothing is cold any more."""
        cold = self.cold
        if cold is None or not cold.count:
            return False
        self.dispatcher.read_cold(True, effects)
        return True
