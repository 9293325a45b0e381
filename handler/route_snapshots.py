"""The route table's older snapshot formats, read back: a member upgraded in place restores its old snapshot.

Owns the readers of snapshot format versions 1 to 3 (handler/replicated.py lists the versions; the
current one, 4, is RouteTable.state() and RouteTable.from_state()). Versions before 4 had no owner
epochs and no in-sync backups: they restore with none (every epoch 0, every set empty), which is what
a table that never promoted holds. Each builds the table the way a
replica applying the log would: routes added in sorted order, so every replica restoring the same
snapshot packs and numbers them alike. A damaged snapshot raises KeyError, TypeError or ValueError, which
handler/replicated.py turns into a refusal by name.
Never imports pysyncobj, threading, time, random, socket, grpc or proton.
"""

from __future__ import annotations

from handler.packed_routes import TOUCHED_MS_MAX, PackedRoutes
from handler.route_table import RouteTable
from node.core.group_map import GroupMap


def _without_replica_sets(state: dict) -> dict:
    """A state of versions 2 and 3 with the epochs and sets they restore: none (new dicts each time)."""
    return {**state, "epochs": {}, "in_sync": {}}


def from_state_v3(state: dict) -> RouteTable:
    """Format version 3: as 4, without "epochs" and "in_sync"."""
    return RouteTable.from_state(_without_replica_sets(state))


def from_state_v2(state: dict) -> RouteTable:
    """Format version 2: as 3, but routes {queue: {group: packed}}."""
    return RouteTable.from_state(_without_replica_sets(state),
                                 read_groups=lambda groups: GroupMap.from_items(sorted(groups.items())))


def from_state_v1(state: dict) -> RouteTable:
    """Format version 1: the table's attributes with routes {(queue, group): [node, touched_ms]}."""
    table = RouteTable(state["routes_max"])
    for name in ("consumers", "nodes", "down", "moves", "revision"):
        setattr(table, name, state[name])
    store = table.store = PackedRoutes(route_counts=state["route_counts"])
    for (queue, group), (node, touched_ms) in sorted(state["routes"].items()):
        groups = store.routes.get(queue)
        if groups is None:
            groups = store.routes[queue] = GroupMap()
        groups[group] = store.pack(node, min(max(touched_ms, 0), TOUCHED_MS_MAX))
    store.derive()
    return table
