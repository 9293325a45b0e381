"""The raft command forget_node (ver=4): a member removed from the raft cluster forgotten by the route table.

A mixin of RouteTableReplica (handler/replicated.py, which is at its size bound; its header's rules hold
here: runs on pysyncobj's tick thread only, reports what changed through the replica's feed in log order).
pysyncobj finds replicated methods by dir(), inherited ones included, and numbers them by (ver, name):
ver=4 is after every older command, so journals written before it replay unchanged, and a member
proposes it only once setCodeVersion enabled 4 (handler/code_versions.py FORGET_CODE_VERSION).
The rule is handler/member_removal.py's. The feed says everything the command may have touched: the
removed routes (ROUTES with None), the moves (MOVES_ALL), the replica sets (REPLICAS) and, last, the
members without the node, from which every node learns it is gone (what their outbound stores hold for
it still waits there: docs/reliability.md finding 11, the half still open).
"""

from __future__ import annotations

from pysyncobj import replicated

from handler.member_removal import forget_node
from node.core.cluster.feed import MOVES_ALL


class RemovalCommands:
    @replicated(ver=4)
    def forget_node(self, node):
        """Returns how many routes of `node` were dropped (0 for a retry)."""
        dropped = self._removed(forget_node(self.table, node))
        self._on_applied(MOVES_ALL, self.table.moves_all(), None)
        self._publish_replicas()
        self._publish_members()
        return dropped
