"""Cluster-wide queue definitions: the settings every node of a raft cluster gives each declared queue.

Owns, as replicated by the raft cluster beside the route table (handler/replicated.py), each declared
queue's settings (a plain dict, QueueSettings.to_dict's shape) and the names deleted since. Every node
applies the definitions to its own broker (node/core/cluster/definitions.py), so all nodes hold the same
settings, nodes that join later and nodes restarting included: they get them from the log or the
snapshot. The rules of a replicated command hold (see handler/route_table.py): deterministic, no
clock, plain data, never raising for input from the cluster (malformed input gets MALFORMED), and
compare-and-set meaning, so a retry after an unknown outcome answers as the first try did:
- `define(values, seed)`: a new name is defined (ADDED); the same settings again answer UNCHANGED;
  other settings answer CONFLICT with the definition held (delete first, or update what may change).
  `seed` is a config file's queue, proposed by each node as it starts: it defines a name only if no
  definition and no deletion of it is known, so the cluster's definition wins over any node's file
  and a queue deleted cluster-wide does not come back when a node with an old file restarts. An
  explicit define (queue add) of a deleted name defines it again.
- `update(name, changes)`: only UPDATABLE_FIELDS may change on a live queue; a change to any other
  field (FIXED_FIELDS: they decide which group a message belongs to, or whether it is journalled,
  so changing them under queued messages would split groups or lose durability) answers REFUSED
  with the fields named. Unknown name: NOT_FOUND.
- `delete(name, seen_revision)`: removes the definition (DELETED, or NOT_FOUND when there was none; the nodes drop
  the queue either way, since a queue auto-created on some nodes has no definition). Whether the
  queue may be deleted (its depth on every node) is the admin call's check before it proposes.
- Every change bumps `revision` and the feed carries it, so a node replaying the log after a
  restart can tell a deletion it applied already (journalled) from a new one.
Deleted names are remembered, at most DELETED_NAMES_MAX (the oldest forgotten first).
A definition may carry, beside the settings, TEMPORARY_OF: the node whose link a temporary subscription
queue serves (a `topic` attach that is not durable). The nodes delete it cluster-wide when that link
ends, when that node restarts (its links are gone), or when the owner-failover policy marks that node
down, so a subscription nobody can consume never collects copies for ever
(node/core/cluster/definitions.py). `settings_values` leaves the key out for QueueSettings.
Never imports pysyncobj, threading, time, random, socket, grpc or proton.
"""

from __future__ import annotations

# The outcomes and the change rules are the raft feed's vocabulary (node/core/cluster/feed.py), which the
# nodes read too
from node.core.cluster.feed import ADDED, CONFLICT, DELETED, MALFORMED, NOT_FOUND, UNCHANGED, UPDATED, fixed_changes
from node.core.cluster.feed import UPDATE_REFUSED as REFUSED

DELETED_NAMES_MAX = 10_000  # deleted names remembered so seeds do not bring them back


def _is_values(values) -> bool:
    """A settings dict of plain scalars with a str name (the proposer validated the values themselves)."""
    return (type(values) is dict and type(values.get("name")) is str and bool(values["name"])
            and all(type(key) is str and type(value) in (str, int, float, bool) for key, value in values.items()))


class QueueDefinitions:
    def __init__(self):
        self.definitions: dict[str, dict] = {}  # name -> settings dict
        self.deleted: dict[str, int] = {}  # name -> revision of its deletion
        self.revision = 0

    # ---- commands: replicated, so deterministic and never raising -----------------------------

    def define(self, values, seed: bool = False) -> tuple:
        """(outcome, the definition held afterwards or None)."""
        if not _is_values(values) or type(seed) is not bool:
            return (MALFORMED, None)
        name = values["name"]
        held = self.definitions.get(name)
        if held is not None:
            if seed or held == values:
                return (UNCHANGED, dict(held))
            return (CONFLICT, dict(held))
        if seed and name in self.deleted:
            return (UNCHANGED, None)
        self.deleted.pop(name, None)
        self.definitions[name] = dict(values)
        self.revision += 1
        return (ADDED, dict(values))

    def update(self, name, changes) -> tuple:
        """(outcome, the definition afterwards, or the refused fields for REFUSED)."""
        if type(name) is not str or not (type(changes) is dict and all(
                type(key) is str and type(value) in (str, int, float, bool) for key, value in changes.items())):
            return (MALFORMED, None)
        held = self.definitions.get(name)
        if held is None:
            return (NOT_FOUND, None)
        refused = fixed_changes(held, changes)
        if refused:
            return (REFUSED, refused)
        merged = {**held, **changes}
        if merged == held:
            return (UNCHANGED, dict(held))
        self.definitions[name] = merged
        self.revision += 1
        return (UPDATED, dict(merged))

    def delete(self, name, seen_revision: int) -> tuple:
        """(outcome, the definition removed or None). `seen_revision`: the revision the proposer knew;
        a deletion of `name` after it (this proposal's first try, or another's) answers DELETED again
        and changes nothing, so a retry never drops a queue made again since. Otherwise always a new
        revision: the nodes drop the queue even when it has no definition (auto-created)."""
        if type(name) is not str or not name or type(seen_revision) is not int:
            return (MALFORMED, None)
        if self.deleted.get(name, -1) > seen_revision:
            return (DELETED, None)
        held = self.definitions.pop(name, None)
        self.revision += 1
        self.deleted.pop(name, None)
        self.deleted[name] = self.revision  # reinserted: the dict keeps deletion order, oldest first
        while len(self.deleted) > DELETED_NAMES_MAX:
            del self.deleted[next(iter(self.deleted))]
        return (DELETED, held) if held is not None else (NOT_FOUND, None)

    # ---- reads --------------------------------------------------------------------------------

    def all(self) -> dict:
        return {name: dict(values) for name, values in sorted(self.definitions.items())}
