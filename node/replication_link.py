"""The owner's side of replication in a running node (issue 28): the adapter of the node shell's replica
streams (node/core/replication/streams.py).

Engine loop thread only, except the replicators' answers, which come through the bridge (as the
forwarders' acks and the journal's reports do). What it does, all translation:
- `attach` gives the node shell its ReplicaStreams (shell.replication) and adds its rows to the server's one
  effect table (node/amqp/executor.py): Stored and Removed journal the record as the executor's own rows
  do and hand the frame the journal encoded to the streams; ReplicaCallDue starts the backup's
  replicator (node/peer/replicator.py); the in-sync proposals go to the grouping handler.
- The streams' source: a queue's replication factor (its setting, else the node config's
  `replication_factor`; 1 for a non-durable queue), the node's queues, and the catch-up copy: STORE frames
  (node/store/records.py) of the live warm messages of a queue, read from its browse list. A message
  whose body is paged out, or a queue with a cold tail, makes the copy incomplete (streams.py says what
  that means).
- Nothing is attached on a node without a journal: its queues are not durable, and are not replicated.
"""

from __future__ import annotations

import bisect
import logging

from node.core.effects import Removed, Stored
from node.core.replication.streams import (CopyChunk, ProposeReplicaInSync, ProposeReplicaOutOfSync, ReplicaCallDue,
                                           ReplicaStreams)
from node.peer.cluster_secrets import read_raft_secrets
from node.peer.replicator import Replicators
from node.peer.signature import REPLICATION, Signer
from node.store import records

log = logging.getLogger("grouper.replication")


class QueueSource:
    """What the streams read of this node's queues (engine loop thread)."""

    def __init__(self, broker, replication_factor_default: int):
        self.broker = broker
        self.default = replication_factor_default

    def factor_of(self, queue: str) -> int:
        """0 for a queue this node does not hold (yet): the streams ask again."""
        held = self.broker.queues.get(queue)
        if held is None:
            return 0
        if not held.settings.durable:
            return 1
        return held.settings.replication_factor or self.default

    def queues(self) -> list:
        return list(self.broker.queues)

    def copy(self, queue: str, after_seq: int, bytes_max: int, wanted) -> CopyChunk:
        held = self.broker.queues.get(queue)
        if held is None:
            return CopyChunk([], after_seq, True, True)
        live = held.browse_available()  # every live warm message, in seq order
        complete = held.cold is None or held.cold.count == 0
        start = bisect.bisect_right(live, after_seq, key=lambda message: message.seq)
        entries: list = []
        last, size = after_seq, 0
        for message in live[start:]:
            last = message.seq
            if wanted(message.group_id):
                if message.payload is None:
                    complete = False  # paged out: not in memory to copy
                    continue
                frame = records.encode_store(queue, message)
                entries.append((message.group_id, message.seq, frame))
                size += len(frame)
                if size >= bytes_max:
                    return CopyChunk(entries, last, last == live[-1].seq, complete)
        return CopyChunk(entries, last, True, complete)


class ReplicationLink:
    def __init__(self, cluster_link):
        self.link = link = cluster_link
        config = link.config
        self.streams = ReplicaStreams(
            link.node_id, link.protocol, QueueSource(link.broker, config.replication_factor),
            backlog_max_bytes=config.replica_backlog_max_bytes, backlog_max_messages=config.replica_backlog_max_messages,
            lag_ms=config.replica_lag_ms, catch_up_max_bytes_per_s=config.replica_catch_up_max_bytes_per_s)
        self.replicators = Replicators(
            link.node_id, lambda backup: link.protocol.peer_addresses.get(backup),
            lambda backup, call, high_water, reason: link.bridge.post(
                lambda: self.answered(backup, call, high_water, reason)),
            call_timeout_ms=config.forward_timeout_ms, tls=link.peer_tls)
        if link.peer_tls is None and config.raft_secret_file:  # the replication credential, a key of its own
            self.replicators.signer = Signer(read_raft_secrets(config.raft_secret_file), REPLICATION)
        self.attached = False

    def attach(self, server) -> None:
        if self.link.journal is None:
            return
        self.server, self.journal, self.clock_ms = server, self.link.journal, self.link.clock_ms
        server.shell.replication = self.streams
        server.carry.update({Stored: self._store, Removed: self._remove, ReplicaCallDue: self._call,
                             ProposeReplicaInSync: self._in_sync, ProposeReplicaOutOfSync: self._out_of_sync})
        self.attached = True

    def tick(self, now_ms: int) -> None:
        if self.attached and self.link.protocol.registered:
            self.server.execute(self.streams.tick(now_ms))

    def answered(self, backup: str, call, high_water, reason: str) -> None:  # engine loop, through the bridge
        self.server.execute(self.streams.answered(backup, call, high_water, reason, self.clock_ms()))

    def close(self) -> None:
        self.replicators.close()

    # ---- the effect rows --------------------------------------------------------------------------

    def _store(self, effect: Stored) -> None:
        frame = self.journal.store(effect.queue, effect.message)
        streams = self.streams
        if streams.replicates(effect.queue):
            streams.stored(effect.queue, effect.message, frame, self.clock_ms())

    def _remove(self, effect: Removed) -> None:
        frame = self.journal.remove(effect.queue, effect.seq)
        streams = self.streams
        if streams.replicates(effect.queue):
            streams.removed(effect.queue, effect.seq, frame, self.clock_ms())

    def _call(self, effect: ReplicaCallDue) -> None:
        self.replicators.to(effect.backup).start(effect.call, effect.reset)

    def _in_sync(self, effect: ProposeReplicaInSync) -> None:
        log.info("backup %s holds a current copy of %s's replicated groups: proposing it in sync (epoch %d)",
                 effect.backup, self.link.node_id, effect.epoch)
        self.link.handler.replica_in_sync(effect.backup, effect.epoch, self._outcome("in sync", effect.backup))

    def _out_of_sync(self, effect: ProposeReplicaOutOfSync) -> None:
        log.warning("backup %s of %s is behind or restarting its stream: proposing it out of sync (epoch %d)",
                    effect.backup, self.link.node_id, effect.epoch)
        self.link.handler.replica_out_of_sync(self.link.node_id, effect.backup, effect.epoch,
                                              self._outcome("out of sync", effect.backup))

    @staticmethod
    def _outcome(what: str, backup: str):
        def done(reason, _result=None):  # the raft member channel's thread: only log
            if reason is not None:
                log.warning("proposing backup %s %s failed: %s; proposed again later", backup, what, reason)
        return done
