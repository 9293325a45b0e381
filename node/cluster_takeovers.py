"""A takeover's reads and drops of a replica journal (issue 28): node/core/cluster/takeovers.py's ReadReplica
and DropReplica effects, carried out on the replica writer's thread (node/store/replica_writer.py), their
answers handed to the engine loop through its one bridge and given back to the protocol's takeovers.

Rules:
- Engine loop thread, but the answers, which only post to the bridge (the writer thread never waits).
- A read that fails (the journal cannot be opened) is logged and tried again after READ_RETRY_MS: the groups
  stay held meanwhile; nothing is enqueued from a read that failed.
"""

from __future__ import annotations

import logging
import threading

from node.core.replication.takeover import DropReplica, ReadReplica

log = logging.getLogger("grouper.cluster")

READ_RETRY_MS = 1000  # a failed replica read is tried again this much later


class TakeoverLink:
    def __init__(self, link):
        self.link = link  # node/cluster.py's ClusterLink: its replicas (the writer), bridge and protocol

    def carry(self) -> dict:
        return {ReadReplica: self._read, DropReplica: self._drop}

    def _read(self, effect: ReadReplica) -> None:
        post = self.link.bridge.post
        self.link.replicas.live_of(effect.owner, effect.queues,
                                   lambda found, error: post(lambda: self._read_done(effect, found, error)),
                                   epoch_max=effect.epoch)

    def _read_done(self, effect: ReadReplica, found, error) -> None:
        link = self.link
        if error is not None:
            log.error("taking over the groups of %s: its replica journal could not be read (%s); trying again "
                      "in %d ms, the groups stay held", effect.owner, error, READ_RETRY_MS)
            timer = threading.Timer(READ_RETRY_MS / 1000, lambda: link.bridge.post(lambda: self._read(effect)))
            timer.daemon = True
            timer.start()
            return
        link.carry_out(link.protocol.takeovers.replica_read(effect.owner, found, link.clock_ms()))

    def _drop(self, effect: DropReplica) -> None:
        post = self.link.bridge.post
        self.link.replicas.discard(effect.owner, effect.epoch, effect.seqs,
                                   lambda count, error: post(lambda: self._dropped(effect, error)))

    def _dropped(self, effect: DropReplica, error) -> None:
        effects: list = []
        self.link.protocol.takeovers.replica_dropped(effect.owner, error, effects)
        if effects:
            self.link.carry_out(effects)
