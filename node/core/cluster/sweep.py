"""Sweeps: the old owner reads its queue's cold tail (node/core/dispatch/cold.py: its newest messages, their groups
unknown until read back) through for the groups moving away, and hands over what it finds of them.

Rules:
- A sweep starts once a moving group has nothing warm or in flight here; it reads the tail in seq order
  (SWEEP_BATCH_RECORDS at a time, fewer past cold.py's byte bound; its own reads) and hands over the
  records of the groups the pass began with, as a handover does (new forward seqs, the outbound STOREs
  before the queue's REMOVEs, one journal batch, a failed write stops the node); the rest stay cold.
- The queue reads nothing back for dispatch while a sweep is out, nor until the REMOVEs of what it took
  are on disk (Swept), so no record is read twice.
- A group is swept (no longer busy here for its cold tail) only once a whole pass met all of it: a pass
  ending while a message of its group is still on its way to disk goes again.
- Imports context.py and forwarding.py of this package; handover.py drives it.
"""

from __future__ import annotations

import dataclasses

from node.core.cluster.context import Context, MustAgree, moved_copy
from node.core.cluster.forwarding import Forwarding
from node.core.dispatch.cold import read_missing
from node.core.effects import AfterFlush, ReadRecords
from node.core.dispatch.message import REMOVED, STATE_MASK

SWEEP_BATCH_RECORDS = 1024  # cold records a sweep reads back at once (bodies included)


@dataclasses.dataclass(slots=True)
class Sweep:
    """One pass of a cold tail, oldest first: it hands over the records of `keys` (moving away, with
    nothing warm or in flight here when it began), the others left cold."""
    keys: set
    after_seq: int  # the next read starts above it
    asked: int = 0  # records the read out now asked for


class Swept:
    """Cold records a sweep handed over, their REMOVEs in this journal batch."""

    __slots__ = ("sweeps", "queue_name", "seqs")

    def __init__(self, sweeps: Sweeps, queue_name: str, seqs: tuple):
        self.sweeps = sweeps
        self.queue_name = queue_name
        self.seqs = seqs

    def flushed(self, reason: str | None, now_ms: int, effects: list) -> None:
        # a failed write stopped the node (its MustAgree says why)
        sweeps, queue_name = self.sweeps, self.queue_name
        removing = sweeps.removing.get(queue_name, set())
        removing.difference_update(self.seqs)
        if not removing:
            sweeps.removing.pop(queue_name, None)
            sweeps.thaw(queue_name)


class Sweeps:
    def __init__(self, context: Context, forwarding: Forwarding, owed: dict):
        self.context = context
        self.forwarding = forwarding
        self.owed = owed  # handover.py's: key -> the highest forward seq handed over or relayed
        self.sweeps: dict[str, Sweep] = {}  # queue -> the sweep reading it through now
        self.swept: set[tuple[str, str]] = set()  # keys whose cold messages a whole sweep handed over
        # queue -> seqs handed whose REMOVE is not on disk yet (the queue reads nothing back for dispatch)
        self.removing: dict[str, set[int]] = {}

    def pending(self, key: tuple[str, str]) -> bool:
        """The queue of group `key` (moving away) has a cold tail no whole sweep went through for it."""
        queue = self.context.broker.queues.get(key[0])
        return queue is not None and queue.cold is not None and bool(queue.cold.count) and key not in self.swept

    def start(self, held: set, effects: list) -> None:
        """A queue whose groups move away and has a cold tail is read through for them, once nothing of
        theirs is warm or in flight here (what a sweep hands over comes after that, in seq order)."""
        context = self.context
        me = context.node_id
        wanted: dict[str, set] = {}
        for key, (from_node, _, _) in context.moves.items():
            if from_node != me or key[0] in self.sweeps or not self.pending(key):
                continue
            if key in held and not context.warm_here(key):
                wanted.setdefault(key[0], set()).add(key)
        for name, keys in sorted(wanted.items()):
            cold = context.broker.queues[name].cold
            if cold.asked:
                continue  # its own read-back is out: the sweep starts at the next tick, above what it brings
            cold.frozen = True
            sweep = self.sweeps[name] = Sweep(keys, cold.after_seq)
            self._read_on(name, sweep, effects)
            context.counts["cold_sweeps"] += 1

    def _read_on(self, name: str, sweep: Sweep, effects: list) -> None:
        sweep.asked = SWEEP_BATCH_RECORDS
        effects.append(ReadRecords(name, sweep.after_seq, SWEEP_BATCH_RECORDS,
                                   self.context.broker.queues[name].cold.read_max_bytes))

    def thaw(self, name: str) -> None:
        """No sweep of the queue is out and the journal's index has lost what the last one took: the
        queue may read its cold tail back again."""
        if name not in self.sweeps and name not in self.removing:
            queue = self.context.broker.queues.get(name)
            if queue is not None and queue.cold is not None:
                queue.cold.frozen = False

    def cold_records(self, name: str, records: dict, now_ms: int) -> list | None:
        """The journal read back the next records of queue `name`'s cold tail (seq -> Message, None if
        it has none): a sweep's, whose effects are returned; None when the read was the queue's own."""
        sweep = self.sweeps.get(name)
        if sweep is None or not sweep.asked:
            return None
        asked, sweep.asked = sweep.asked, 0
        effects: list = []
        context = self.context
        queue = context.broker.queues.get(name)
        if queue is None or queue.cold is None or context.closed:
            del self.sweeps[name]  # deleted meanwhile (or stopping): nothing is left to sweep
            return effects
        seqs = sorted(seq for seq, message in records.items() if message is not None)
        self._hand_over(name, queue, sweep, records, seqs, now_ms, effects)
        if seqs:
            sweep.after_seq = seqs[-1]
        read_bytes = sum(records[seq].size_bytes for seq in seqs)
        if seqs and not read_missing(asked, len(seqs), read_bytes, queue.cold.read_max_bytes):
            self._read_on(name, sweep, effects)  # a whole batch, or one its byte bound cut short: more to read
            return effects
        # the tail's end: what the sweep did not meet of its groups is still on its way to disk, whole
        pending = {(name, queue.route_key(message.group_id)) for message in queue.cold.pending
                   if message.flags & STATE_MASK != REMOVED}
        for key in sweep.keys - pending:
            move = context.moves.get(key)
            if move is not None and move[0] == context.node_id:
                self.swept.add(key)
        del self.sweeps[name]
        self.thaw(name)
        return effects

    def _hand_over(self, name: str, queue, sweep: Sweep, records: dict, seqs: list, now_ms: int,
                   effects: list) -> None:
        context = self.context
        removing = self.removing.setdefault(name, set())
        removed: list = []
        taken = []
        for seq in seqs:
            message = records[seq]
            route_key = queue.route_key(message.group_id)
            key = (name, route_key)
            move = context.moves.get(key)
            if key not in sweep.keys or seq in removing or move is None or move[0] != context.node_id:
                continue  # not moving away, or no longer (its move ended): it stays cold here
            copy = moved_copy(message)
            self.forwarding.forward(move[1], name, route_key, copy, True, now_ms, effects)
            self.owed[key] = copy.seq
            queue.cold_taken(seq, message.size_bytes, removed)
            taken.append(seq)
            context.counts["cold_handed_over"] += 1
        if taken:
            removing.update(taken)
            context.broker_effects(removed, effects)  # the REMOVEs after the outbound STOREs: a torn tail duplicates
            effects.append(AfterFlush(MustAgree(context, f"handing {len(taken)} cold messages of queue {name!r} over")))
            effects.append(AfterFlush(Swept(self, name, tuple(taken))))
        elif not removing:
            del self.removing[name]
