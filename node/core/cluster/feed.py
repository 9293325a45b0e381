"""The raft feed's vocabulary: the words the raft member (handler/) and the cluster protocol both speak.

Owns, as plain constants and pure functions, what crosses from the replicated tables to a node:
- the kinds of the applied-command feed a replica reports to its node after each command it applied
  (handler/replicated.py sends them, node/core/cluster/ reads them), with their payloads;
- a queue definition command's outcomes (handler/queue_definitions.py answers them, the proposer reads
  them) and the definitions' change rules (which fields a live queue takes, what a definition holds
  beside its settings).
Rules:
- The values are stored (in raft logs, snapshots and the member channel) and never change
  (docs/glossary.md); a new kind or outcome is a new name with a new value.
- A leaf: imports nothing of `handler` (the arrow points handler -> node.core) and nothing of the rest of
  the cluster package, so the raft member process loads this module alone (node/core/cluster/__init__.py
  imports the protocol lazily). Never imports pysyncobj, threading, time, socket, grpc or proton.
"""

from __future__ import annotations

# ---- the applied-command feed: its kinds and their payloads ------------------------------------------

ROUTES = "routes"  # [(queue, group, node or None)], None = route removed; at_ms: their refresh time
REFUSED = "refused"  # [(queue, group)] refused by the table (routes_max reached)
SNAPSHOT = "snapshot"  # every route [(queue, group, node, touched_ms)], replacing all known before
MEMBERS = "members"  # {"nodes": ..., "consumers": ..., "down": ...}, copies
MOVES = "moves"  # [(queue, group, from_node, to_node, waiting)] moves begun or cleared; waiting () = ended
MOVES_ALL = "moves_all"  # every move in progress, same shape, replacing all known before (after SNAPSHOT)
QUEUES = "queues"  # [(revision, name, settings dict or None)], None = deleted cluster-wide
# after a snapshot: (revision, {name: settings dict}, {deleted name: revision of its deletion}), all known
QUEUES_ALL = "queues_all"
# the owner epochs and in-sync backups (handler/replica_sets.py), after any change and after a snapshot:
# {"epochs": {node: epoch}, "in_sync": {owner: [backup, ...]}}, copies, replacing all known before
REPLICAS = "replicas"

# ---- a queue definition command's outcomes (handler/queue_definitions.py says when each is given) -----

ADDED = "added"
UNCHANGED = "unchanged"
CONFLICT = "conflict"
UPDATED = "updated"
UPDATE_REFUSED = "refused"  # an update that would change FIXED_FIELDS (queue_definitions.py names it REFUSED)
NOT_FOUND = "not_found"
DELETED = "deleted"
MALFORMED = "malformed"

# ---- the definitions' change rules ---------------------------------------------------------------------

# read by the queue at each use, so a live queue takes a new value at once (a lower depth limit only
# refuses new sends; messages held stay)
UPDATABLE_FIELDS = frozenset({
    "group_first_key", "group_rebalance", "group_rebalance_pause_dispatch", "consumers_before_dispatch",
    "time_before_dispatch_ms", "depth_max_messages", "depth_max_bytes", "memory_max_bytes", "groups_max",
    "group_id_length_max_chars", "delivery_count_max", "redelivery_delay_ms", "redelivery_delay_multiplier",
    "redelivery_delay_max_ms", "dead_letter_queue", "dead_letter_queue_auto_create", "trace",
    "group_lease_ms",  # issue 30: read at each tick (node/core/dispatch/queue_leases.py)
    "group_rebalance_mode",  # issue 30: read at each join (node/core/dispatch/queue_rebalance.py)
    "dedup", "dedup_window_messages", "dedup_window_ms",  # issue 31: dispatch/dedup.py reads them at each send
})
# decide a message's group (policy, header, default group, buckets) or whether it is journalled
FIXED_FIELDS = frozenset({"name", "group_policy", "group_header", "default_group", "group_buckets", "durable",
                          "address"})  # a queue changes address only by being deleted and added again

# node id of a temporary subscription's link (handler/queue_definitions.py's header); not a setting
TEMPORARY_OF = "temporary_of"


def settings_values(values: dict) -> dict:
    """A definition's settings alone, as QueueSettings.from_dict takes them."""
    if TEMPORARY_OF not in values:
        return values
    return {key: value for key, value in values.items() if key != TEMPORARY_OF}


def fixed_changes(current: dict, changes: dict) -> list[str]:
    """The fields `changes` would change that a live queue cannot take, sorted."""
    return sorted(key for key, value in changes.items() if key not in UPDATABLE_FIELDS and current.get(key) != value)
