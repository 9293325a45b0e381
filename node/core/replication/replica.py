"""A backup's bookkeeping for one owner: which of the owner's messages it holds live, per (queue, group),
in order, and how far the owner's stream got (docs/replication.md, "What a backup holds").

Rules:
- Pure: no threads, files or clock. The adapter parses each entry's frame header into a ReplicaChange
  (repl_seq, queue, group id, kind, msg_seq), writes the frames to the replica journal, and applies
  the changes here; the journal holds the bodies, this ledger only the order and what is live.
- Epoch fencing: `apply` refuses (StaleEpoch, nothing applied) a batch of an older epoch than the
  ledger's, which is the highest the owner streamed with or the raft table said (`fence`). A newer
  epoch starts the stream again: the high water goes back to 0, the live messages stay (they are the
  owner's queue state, which a new epoch does not undo).
- De-duplication: entries at or below the high water are skipped, so resends are harmless; entries
  apply in repl_seq order only while they follow the high water without a hole: at a gap the rest of
  the batch is left for a resend, and the high water returned says where to resume.
- A STORE of a message not live adds it at the end of its group; a STORE of one already live is the
  owner re-storing it (a release raising its delivery count, in the journal): it keeps its place. A
  REMOVE of a message not live is a resend of one applied already: nothing. So replaying any suffix of
  the stream the ledger already applied ends in the owner's state.
- `promote(groups)` hands back the groups' live messages in order and forgets them (this node now owns
  them); `drop(groups)` forgets them (they moved to another owner's backups).
- A malformed batch (an unknown kind, repl_seqs not increasing) is refused with ValueError naming the
  entry, and nothing of it is applied.
"""

from __future__ import annotations

from typing import NamedTuple

from node.core.errors import GrouperError

STORE = 3  # node/store/records.py's kind numbers: the adapter passes a frame's kind byte through
REMOVE = 4


class ReplicaChange(NamedTuple):
    repl_seq: int
    queue: str
    group_id: str | None  # None: ungrouped
    kind: int  # STORE or REMOVE
    msg_seq: int  # the owner's journal seq of the message


class StaleEpoch(GrouperError):
    """A batch from an owner whose epoch the cluster moved past: the caller must stop serving."""

    fault = "client"  # the calling owner, serving with an epoch the raft log ended

    def __init__(self, owner: str, epoch: int, current_epoch: int):
        super().__init__(f"refused a replication batch of {owner}'s epoch {epoch}: the epoch is {current_epoch} "
                         f"now, so {owner} no longer owns those groups; it must stop serving them and catch up "
                         f"as a replica")
        self.owner = owner
        self.epoch = epoch
        self.current_epoch = current_epoch


class ReplicaLedger:
    def __init__(self, owner: str, epoch: int = 0, high_water: int = 0):
        self.owner = owner
        self.epoch = epoch  # the highest epoch streamed with or fenced
        self.high_water = high_water  # the highest repl_seq of `epoch` applied
        self._groups: dict[tuple, dict[int, None]] = {}  # (queue, group id) -> live msg_seqs in order
        self._group_of: dict[tuple, str | None] = {}  # (queue, msg_seq) -> its group id, for REMOVE

    @property
    def messages_count(self) -> int:
        return len(self._group_of)

    @property
    def groups_count(self) -> int:
        return len(self._groups)

    def messages_by_queue(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for (queue, _), seqs in self._groups.items():
            counts[queue] = counts.get(queue, 0) + len(seqs)
        return counts

    def live(self, queue: str, group_id: str | None) -> list[int]:
        return list(self._groups.get((queue, group_id), ()))

    def groups(self) -> list[tuple]:
        return list(self._groups)

    def fence(self, epoch: int) -> bool:
        """The raft table says the owner's epoch is `epoch`: refuse older batches from now on. True when
        that moved the ledger's epoch."""
        if epoch <= self.epoch:
            return False
        self.epoch = epoch
        self.high_water = 0
        return True

    def apply(self, epoch: int, changes: list) -> int:
        """Apply a batch of the owner's stream; the high water after it (what the backup acknowledges)."""
        if epoch < self.epoch:
            raise StaleEpoch(self.owner, epoch, self.epoch)
        previous = 0
        for index, change in enumerate(changes):
            if change.kind not in (STORE, REMOVE):
                raise ValueError(f"entry {index} (repl_seq {change.repl_seq}) of {self.owner}'s batch has kind "
                                 f"{change.kind}, neither STORE ({STORE}) nor REMOVE ({REMOVE}); nothing applied")
            if change.repl_seq <= previous:
                raise ValueError(f"entry {index} of {self.owner}'s batch has repl_seq {change.repl_seq} after "
                                 f"{previous}: repl_seqs must increase; nothing applied")
            previous = change.repl_seq
        self.fence(epoch)
        for change in changes:
            if change.repl_seq <= self.high_water:
                continue
            if change.repl_seq != self.high_water + 1:
                break  # a hole: the owner resends from the high water
            if change.kind == STORE:
                self._store(change.queue, change.group_id, change.msg_seq)
            else:
                self._remove(change.queue, change.msg_seq)
            self.high_water = change.repl_seq
        return self.high_water

    def _store(self, queue: str, group_id: str | None, msg_seq: int) -> None:
        key = (queue, msg_seq)
        if key in self._group_of:
            if self._group_of[key] == group_id:
                return  # a re-store: it keeps its place
            self._remove(queue, msg_seq)
        self._group_of[key] = group_id
        self._groups.setdefault((queue, group_id), {})[msg_seq] = None

    def _remove(self, queue: str, msg_seq: int) -> None:
        key = (queue, msg_seq)
        if key not in self._group_of:
            return
        group = (queue, self._group_of.pop(key))
        seqs = self._groups[group]
        del seqs[msg_seq]
        if not seqs:
            del self._groups[group]

    def promote(self, groups) -> dict[tuple, list[int]]:
        """The live msg_seqs of each of `groups` ((queue, group id) pairs) that has any, in order; the
        ledger forgets them."""
        promoted = {}
        for group in groups:
            seqs = self._forget(group)
            if seqs:
                promoted[group] = seqs
        return promoted

    def drop(self, groups) -> int:
        """Forget `groups`; how many live messages went with them."""
        return sum(len(self._forget(group)) for group in groups)

    def _forget(self, group: tuple) -> list[int]:
        seqs = self._groups.pop(group, None)
        if not seqs:
            return []
        queue = group[0]
        for msg_seq in seqs:
            del self._group_of[(queue, msg_seq)]
        return list(seqs)
