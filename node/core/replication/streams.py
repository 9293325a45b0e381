"""The owner's side of replication (issue 28, docs/replication.md): which backups get each journal record,
what a producer's accept waits for, the catch-up copies and the in-sync proposals. The node shell holds
one (node/core/shell.py `replication`), so the simulation can run it as the node does.

Rules:
- Pure: no threads, sockets or clock; time comes in as `now_ms`; it returns effects (below) and never calls
  its adapter (node/replication_link.py), which carries them out and tells it each call's answer.
- What is replicated: the STORE and REMOVE frames the node journals for a queue whose replication factor
  (`factor_of(queue)`: the queue's setting, else the cluster default; 1 for non-durable queues and the
  cluster's own NUL-named records) is above 1. Each goes to the stream of every backup of its group
  (assignment.backups_of over the REGISTERED members, cached per (queue, route key) until they change;
  UNGROUPED_ROUTE_KEY for ungrouped messages) whose incarnation sends it (stream.py: the copy's cursor).
  A queue with factor 1 costs one dict lookup per record.
- A producer's durable send is accepted once the owner's journal made it durable (the shell's Durability)
  AND every backup of its group that raft lists in sync (`view.in_sync_of(owner)`) acknowledged its STORE
  (ReplicaGate). A backup out of sync is not waited on; one that leaves the set while waited on is
  dropped from the gate when the leave is seen committed. Settlements (REMOVE) are streamed, not waited
  on, in this step.
- A send whose group has an in-sync backup with a full backlog is refused before it is enqueued
  (ResourceLimitExceeded naming the backup: amqp:resource-limit-exceeded). A backup out of sync whose
  backlog overflows breaks its stream instead (nothing is refused for a backup nobody waits on): a new
  incarnation copies afresh.
- In sync: a stream proposes replica_in_sync(backup, epoch) once caught up (stream.py), and
  replica_out_of_sync once its channel lags (ReplicaChannel.lagging) or broke while raft lists it in
  sync; a proposal not seen applied is made again after lag_ms; never while the backup is marked down.
- An owner whose epoch moved on (it was promoted away) abandons every waiting accept (refused: their
  messages may be on no backup) and starts new incarnations at the new epoch.
Effects out: AcceptSend / Refuse (node/core/effects.py), ReplicaCallDue, ProposeReplicaInSync,
ProposeReplicaOutOfSync.
"""

from __future__ import annotations

from node.core.effects import AcceptSend, Refuse
from node.core.errors import NotAllowed, ResourceLimitExceeded
from node.core.replication.assignment import UNGROUPED_ROUTE_KEY, backups_of
from node.core.replication.channel import (BACKLOG_MAX_BYTES, BACKLOG_MAX_MESSAGES, LAG_MS, ReplicaCall,
                                           ReplicaChannel, entry_size_bytes)
from node.core.replication.gate import ReplicaGate
from node.core.replication.stream import (COPYING, NEW, STREAMING, BackupStream, CopyChunk, ProposeReplicaInSync,
                                          ProposeReplicaOutOfSync, ReplicaCallDue)

__all__ = ["ReplicaStreams", "CopyChunk", "ProposeReplicaInSync", "ProposeReplicaOutOfSync", "ReplicaCallDue",
           "CATCH_UP_MAX_BYTES_PER_S"]

CATCH_UP_MAX_BYTES_PER_S = 32 << 20  # replica_catch_up_max_bytes_per_s, by default: a copy leaves room for traffic
STORE_FRAME_OVERHEAD_BYTES = 96  # a STORE frame's header and fields beyond the payload, for the room check


class ReplicaStreams:
    def __init__(self, owner: str, view, source, *,
                 backlog_max_bytes: int = BACKLOG_MAX_BYTES, backlog_max_messages: int = BACKLOG_MAX_MESSAGES,
                 lag_ms: int = LAG_MS, catch_up_max_bytes_per_s: int = CATCH_UP_MAX_BYTES_PER_S, **channel_options):
        if catch_up_max_bytes_per_s < 1:
            raise ValueError(f"replica_catch_up_max_bytes_per_s must be >= 1, got {catch_up_max_bytes_per_s}")
        self.owner = owner
        self.view = view  # .members {"nodes", "down"} and .replicas (node/core/cluster/replicas.py)
        self.source = source  # .factor_of(queue), .queues() (this node's), .copy(...) -> CopyChunk
        self.lag_ms = lag_ms
        self.catch_up_max_bytes_per_s = catch_up_max_bytes_per_s
        self._channel_options = dict(backlog_max_bytes=backlog_max_bytes, backlog_max_messages=backlog_max_messages,
                                     lag_ms=lag_ms, **channel_options)
        self.streams: dict[str, BackupStream] = {}
        self.gate = ReplicaGate()
        self.epoch = 0
        self._factors: dict[str, int] = {}  # queue -> replication factor
        self._backups: dict[tuple, tuple] = {}  # (queue, route key) -> its backups
        self._members: tuple = ()  # the registered members _backups was computed over
        self._route_keys: dict[tuple, str] = {}  # (queue, seq) -> route key of each replicated live message
        self._expected: dict = {}  # producer target -> (queue, seq) of its send, until its journal answered
        self._awaited: dict[tuple, dict] = {}  # (queue, seq) expected -> {in-sync backup: repl_seq}
        self._copy_at_ms = 0
        self._listed: tuple = ()  # raft's in-sync backups of this owner at the last tick

    # ---- the hot path ---------------------------------------------------------------------------

    def _factor(self, queue: str) -> int:
        factor = self._factors.get(queue)
        if factor is None:
            factor = 1 if queue[:1] == "\x00" else self.source.factor_of(queue)
            if factor:  # 0: no such queue yet (a send auto-creates it): asked again next time
                self._factors[queue] = factor
        return factor or 1

    def replicates(self, queue: str) -> bool:
        factor = self._factors.get(queue)
        return (factor if factor is not None else self._factor(queue)) > 1

    def backups(self, queue: str, route_key: str) -> tuple:
        key = (queue, route_key)
        backups = self._backups.get(key)
        if backups is None:
            backups = self._backups[key] = backups_of(self.owner, queue, route_key, self._members,
                                                      self._factor(queue))
        return backups

    def check_room(self, queue: str, message) -> None:
        """Before a send is enqueued: ResourceLimitExceeded naming the backup when an in-sync backup of its
        group has no room for it, or has no stream taking it yet (the owner restarted and raft still lists
        the backup in sync from before: accepting now would leave the message on no backup)."""
        if self._factor(queue) <= 1:
            return
        group_id = message.group_id
        in_sync = self.view.replicas.in_sync_of(self.owner)
        if not in_sync:
            return
        for backup in self.backups(queue, UNGROUPED_ROUTE_KEY if group_id is None else group_id):
            if backup not in in_sync:
                continue
            stream = self.streams.get(backup)
            if stream is None or stream.state == NEW or stream.broken:
                raise ResourceLimitExceeded(
                    f"{self.owner} is re-synchronising backup {backup} of queue {queue!r} (its stream restarts "
                    f"and the cluster still lists it in sync): send again shortly")
            channel = stream.channel
            size = entry_size_bytes(queue, group_id, b"") + message.size_bytes + STORE_FRAME_OVERHEAD_BYTES
            if len(channel.pending) >= channel.backlog_max_messages:
                limit = f"{len(channel.pending)} messages, replica_backlog_max_messages is {channel.backlog_max_messages}"
            elif channel.pending and channel.pending_bytes + size > channel.backlog_max_bytes:
                limit = (f"{channel.pending_bytes} bytes and this one is about {size}, replica_backlog_max_bytes is "
                         f"{channel.backlog_max_bytes} bytes")
            else:
                continue
            raise ResourceLimitExceeded(
                f"the replication backlog from {self.owner} to backup {backup} is full ({limit}): the backup is "
                f"slow or unreachable; send again later (after replica_lag_ms = {self.lag_ms} ms without an "
                f"acknowledgement the owner stops waiting for it)")

    def expect(self, target, queue: str, seq: int) -> None:
        """A producer's durable send of message `seq` waits for the journal: its accept may wait for backups."""
        if self._factor(queue) > 1:
            self._expected[target] = (queue, seq)
            self._awaited[(queue, seq)] = {}

    def stored(self, queue: str, message, frame: bytes, now_ms: int) -> None:
        """The journal took a STORE of `queue` (its `frame`): to the backups of its group."""
        if self._factor(queue) <= 1:
            return
        group_id, seq = message.group_id, message.seq
        route_key = UNGROUPED_ROUTE_KEY if group_id is None else group_id
        self._route_keys[(queue, seq)] = route_key
        awaited = self._awaited.get((queue, seq))
        in_sync = self.view.replicas.in_sync_of(self.owner) if awaited is not None else ()
        for backup in self.backups(queue, route_key):
            repl_seq = self._submit(backup, queue, group_id, seq, frame, now_ms)
            if repl_seq and backup in in_sync:
                awaited[self.streams[backup]] = repl_seq  # the gate counts per incarnation: its own numbers

    def removed(self, queue: str, seq: int, frame: bytes, now_ms: int) -> None:
        route_key = self._route_keys.pop((queue, seq), None)
        if route_key is None:
            return  # not replicated (or never copied: a stream whose copy reaches it will not find it)
        group_id = None if route_key == UNGROUPED_ROUTE_KEY else route_key
        for backup in self.backups(queue, route_key):
            self._submit(backup, queue, group_id, seq, frame, now_ms)

    def _submit(self, backup: str, queue: str, group_id, seq: int, frame: bytes, now_ms: int) -> int:
        stream = self.streams.get(backup)
        if stream is None or stream.broken or not stream.sends(queue, seq):
            return 0
        try:
            return stream.channel.submit(queue, group_id, frame, now_ms)
        except ResourceLimitExceeded as error:
            stream.broken = str(error)  # entries lost for this incarnation: a new one copies afresh
            return 0

    def accept_now(self, target) -> bool:
        """The journal made `target`'s send durable: True to accept it now, False while it waits for backups
        (an `acked` releases it)."""
        if not self._expected:
            return True
        key = self._expected.pop(target, None)
        if key is None:
            return True
        return self.gate.wait(target, self._awaited.pop(key, None) or {})

    def forget(self, target) -> None:
        """`target`'s send was refused (its journal batch failed): nothing waits for it."""
        key = self._expected.pop(target, None)
        if key is not None:
            self._awaited.pop(key, None)

    # ---- calls and their answers ----------------------------------------------------------------

    def pump(self, now_ms: int) -> list:
        """The calls that may start now, one per stream at most."""
        out: list = []
        for backup, stream in self.streams.items():
            channel = stream.channel
            if stream.state == NEW or channel.in_flight is not None or stream.reset_call is not None:
                continue
            call = channel.next_call(now_ms)
            if call is None and stream.reset_due and stream.state == STREAMING and not channel.backing_off(now_ms):
                call = channel.in_flight = ReplicaCall(channel.epoch, [])  # a reset with nothing to copy
            if call is not None:
                if stream.reset_due:
                    stream.reset_call = call
                out.append(ReplicaCallDue(backup, call, stream.reset_due))
        return out

    def answered(self, backup: str, call, high_water: int | None, reason: str, now_ms: int) -> list:
        """A call's end: `high_water` from the backup, or None and `reason` when it got no answer."""
        stream = self.streams.get(backup)
        if stream is None:
            return []
        channel = stream.channel
        if not call.entries and call is not channel.in_flight:
            return []  # an empty reset call of an incarnation replaced since
        if call is stream.reset_call:
            stream.reset_call = None
            if high_water is not None and (high_water >= 1 or not call.entries):
                stream.reset_due = False
        if not call.entries:  # the empty reset call
            channel.in_flight = None
            if high_water is None:
                channel.call_failed(now_ms)
            return self.pump(now_ms)
        outcome = (channel.acked(call, high_water, now_ms) if high_water is not None
                   else channel.failed(call, reason, now_ms))
        out: list = []
        if outcome is not None and outcome.acked_high_water:
            out += [AcceptSend(target) for target in self.gate.acked(stream, outcome.acked_high_water)]
        if outcome is not None and outcome.backup_ahead:
            stream.broken = outcome.failure
        return out + self.pump(now_ms)

    # ---- the clock: membership, epochs, copies, proposals ---------------------------------------

    def tick(self, now_ms: int) -> list:
        view = self.view
        members = tuple(sorted(view.members.get("nodes", {})))
        if members != self._members:
            self._members, self._backups = members, {}
        out: list = []
        epoch = view.replicas.epoch_of(self.owner)
        if epoch != self.epoch:
            out += self._new_epoch(epoch)
        in_sync = view.replicas.in_sync_of(self.owner)
        for backup in self._listed:
            if backup not in in_sync and backup in self.streams:  # its leave is committed: nobody waits for it
                out += [AcceptSend(target) for target in self.gate.dropped(self.streams[backup])]
        self._listed = in_sync
        if self.streams or self._replicates():  # a member registered since gets its stream too
            for backup in members:
                if backup != self.owner and backup not in self.streams:
                    self.streams[backup] = self._incarnation(backup)
        budget = self._copy_budget(now_ms)
        for backup, stream in list(self.streams.items()):
            if backup in view.members.get("down", {}) and backup not in in_sync:  # it may return with an empty
                stream.broken = stream.broken or f"backup {backup} marked down"  # disk: afresh at its return
            elif stream.broken and backup not in in_sync:  # listed, it is kept until its leave is committed
                stream = self.streams[backup] = self._incarnation(backup)
            out += self._step(stream, backup in in_sync, now_ms)
            if stream.state == COPYING and budget > 0:
                budget = self._copy(stream, budget, now_ms)
        return out + self.pump(now_ms)

    def _replicates(self) -> bool:
        return any(self._factor(queue) > 1 for queue in self.source.queues())

    def _incarnation(self, backup: str) -> BackupStream:
        return BackupStream(backup, ReplicaChannel(self.owner, backup, epoch=self.epoch, **self._channel_options))

    def _new_epoch(self, epoch: int) -> list:
        self.epoch = epoch
        error = NotAllowed(f"node {self.owner} no longer owns this group (its epoch moved to {epoch}): the send "
                           f"may be on no backup; send it again")
        out = [Refuse(target, error) for target in self.gate.abandon()]
        self.streams = {backup: self._incarnation(backup) for backup in self.streams}
        return out

    def _step(self, stream: BackupStream, listed: bool, now_ms: int) -> list:
        """Where the stream stands toward raft's in-sync set: the proposal due, if any."""
        if stream.proposed and now_ms - stream.proposed_at_ms >= self.lag_ms:
            stream.proposed = ""  # not seen applied in time: propose again
        if stream.state == NEW:
            if not listed:
                stream.start_copy(sorted(queue for queue in self.source.queues() if self._factor(queue) > 1))
                return []
            return self._propose(stream, "out", now_ms)
        if listed and (stream.channel.lagging(now_ms) or stream.broken):
            return self._propose(stream, "out", now_ms)
        if not listed and stream.caught_up() and not stream.channel.lagging(now_ms):
            return self._propose(stream, "in", now_ms)
        return []

    def _propose(self, stream: BackupStream, which: str, now_ms: int) -> list:
        if stream.proposed == which:
            return []
        stream.proposed, stream.proposed_at_ms = which, now_ms
        kind = ProposeReplicaInSync if which == "in" else ProposeReplicaOutOfSync
        return [kind(stream.backup, self.epoch)]

    def _copy_budget(self, now_ms: int) -> int:
        elapsed_ms = min(1000, max(0, now_ms - self._copy_at_ms))
        self._copy_at_ms = now_ms
        return self.catch_up_max_bytes_per_s * elapsed_ms // 1000

    def _copy(self, stream: BackupStream, budget: int, now_ms: int) -> int:
        return stream.copy(self.source, budget, self.backups, self._route_keys, now_ms)
