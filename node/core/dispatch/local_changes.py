"""What this node did on its clients' behalf that the rest of a cluster must hear of. Pure, no I/O.

Rules:
- Recorded only in a cluster: the cluster protocol gives the broker one (`Broker.local`); a node
  alone keeps None and records nothing.
- `made`: queues made here on a client's behalf (auto-created by an attach, a send or a dead letter;
  a subscription an attach made), as (settings, temporary subscription), for the cluster to define on
  every node (node/core/cluster/definitions.py). `ended`: subscription queues deleted here because
  their link ended, for the cluster to delete on every node. `entered`: (queue, route key) of every
  group this node itself put messages in (an admin move, a dead letter, a reroute): those came by no
  route, and the cluster gives their group one (node/core/cluster/routes.py).
- Taken, never emptied by hand: `take_queues` drains `made` and `ended` (queue definitions take them at
  a tick or a batch's end), `take_entered` drains `entered` (routes take it at a batch's end); the two
  are taken apart because they are taken at different times.
"""

from __future__ import annotations


class LocalChanges:
    __slots__ = ("made", "ended", "entered")

    def __init__(self):
        self.made: list = []  # (QueueSettings, temporary subscription)
        self.ended: list[str] = []
        self.entered: set[tuple[str, str]] = set()

    def __bool__(self) -> bool:
        return bool(self.made or self.ended or self.entered)

    def take_queues(self) -> tuple[list, list[str]]:
        """The queues made and ended since the last call, as (made, ended)."""
        made, ended = self.made, self.ended
        self.made, self.ended = [], []
        return made, ended

    def take_entered(self) -> set[tuple[str, str]]:
        """The (queue, route key) given messages by this node itself since the last call."""
        entered, self.entered = self.entered, set()
        return entered

    def unmake(self, settings) -> None:
        """A queue auto-created for a send that was refused is gone again: nothing to define."""
        self.made = [made for made in self.made if made[0] is not settings]
