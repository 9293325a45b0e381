"""Placement: which node a new group's route names, and which nodes a queue's groups may follow to.

Owns the placement policy of the route table (handler/route_table.py), as a read-only view over the
table's consumer reports, route counts and down members, built for one command; it never changes them.
The claim carries its `placement`, which the proposer puts into the command itself: a mode read from each
replica's own settings could differ between replicas and split their tables, a mode in the log cannot.
- PLACEMENT_BALANCED: the node whose consumers on the queue hold the fewest groups per consumer,
  counting the new group (routes of the queue / its consumers there, cluster-wide, down nodes
  excluded); ties go to the smallest node name. The proposer's node saves a forwarding hop, so it
  keeps the group while its groups per consumer, counting the new one, are at most
  LOCAL_TOLERANCE_RATIO above the best node's: a tie within 10%, never a standing lead.
- PLACEMENT_LOCAL (the rule before placement was an argument, so the default for claims journalled
  then): the proposer's node whenever it has a consumer on the queue, else the node with consumers
  and the fewest routes of the queue.
- Either way, with no consumer on the queue anywhere: the proposer's node (messages wait where they
  were sent). A claim naming an unknown placement is malformed (the table checks PLACEMENTS).
- `members` (a claim's members_only, proposed once raft code version 4 is enabled: finding 11): only
  registered members count as consuming, so a node removed from the cluster (forget_node) is never
  chosen even if a late report of its consumers landed after its removal. None (claims journalled
  before, and follow_consumers): every node with a consumer report counts, as before.
Deterministic, as a replicated command must be: candidates in sorted order, exact Fractions (never a
float), no clock. Never imports pysyncobj, threading, time, random, socket, grpc or proton.
"""

from __future__ import annotations

from fractions import Fraction

PLACEMENT_BALANCED = "balanced"  # fewest groups per consumer cluster-wide; the proposer wins near-ties
PLACEMENT_LOCAL = "local"  # the proposer's node whenever it has consumers on the queue
PLACEMENTS = (PLACEMENT_BALANCED, PLACEMENT_LOCAL)
# balanced: the proposer's node keeps a new group while its groups per consumer (the new one counted)
# are at most this many times the best node's. Exact (a Fraction, not a float), the same on every replica
LOCAL_TOLERANCE_RATIO = Fraction(11, 10)


class Placement:
    def __init__(self, consumers: dict, route_counts: dict, down: dict, members: dict | None = None):
        self.consumers = consumers  # node -> queue -> consumers (the table's; read only)
        self.route_counts = route_counts  # (node, queue) -> routes
        self.down = down  # node -> when marked down
        self.members = members  # the registered members (the table's nodes), or None: see the header

    def serves(self, node: str, queue: str) -> bool:
        return node not in self.down and self.consumers.get(node, {}).get(queue, 0) > 0 and (
            self.members is None or node in self.members)

    def serving(self, queue: str) -> list[str]:
        """The nodes up with consumers on `queue`, sorted."""
        return sorted(node for node in self.consumers if self.serves(node, queue))

    def fewest_routes(self, nodes: list[str], queue: str) -> str:
        """Of `nodes` (not empty), the one with the fewest routes of `queue`; ties to the smallest name."""
        return min(nodes, key=lambda node: (self.route_counts.get((node, queue), 0), node))

    def choose(self, queue: str, proposer: str, placement: str = PLACEMENT_LOCAL) -> str:
        candidates = self.serving(queue)
        if not candidates:
            return proposer  # nobody consumes yet: messages wait where they were sent
        if placement == PLACEMENT_LOCAL:
            if self.serves(proposer, queue):
                return proposer  # keeps the group on the node its producer is on: no forwarding hop
            return self.fewest_routes(candidates, queue)
        best = min(candidates, key=lambda node: (self.groups_per_consumer_after(node, queue), node))
        if proposer != best and self.serves(proposer, queue) and \
                self.groups_per_consumer_after(proposer, queue) <= \
                self.groups_per_consumer_after(best, queue) * LOCAL_TOLERANCE_RATIO:
            return proposer  # near enough to the best: saving the forwarding hop is worth more
        return best

    def groups_per_consumer_after(self, node: str, queue: str) -> Fraction:
        """The groups of `queue` per consumer of it on `node` once one more group is placed there;
        counting the new group makes a node with more consumers the better choice at equal load."""
        return Fraction(self.route_counts.get((node, queue), 0) + 1, self.consumers[node][queue])
