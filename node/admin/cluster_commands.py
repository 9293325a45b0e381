"""`grouper cluster status|add-node|remove-node`: the raft cluster's members, leader and routes.

Rules (node/admin/commands.py's, for the cluster commands):
- Each command is one `AdminClient` call and a few printed lines; the node does the work and the
  validation (a membership change waits for its raft commit there).
- A single node answers that it is not clustered, and how to form a cluster.
"""

from __future__ import annotations

import json

from node.admin.arguments import node_address
from node.admin.client import AdminClient
from node.admin.command_output import count, table


def register(subparsers, command) -> None:
    """`command(parent, name, action, help_text)` adds one sub-command that runs `action(client, args)`."""
    cluster = subparsers.add_parser("cluster", help="the cluster's members, leader and routes")
    cluster_commands = cluster.add_subparsers(dest="cluster_command", required=True,
                                              metavar="{status,add-node,remove-node}")
    command(cluster_commands, "add-node", _cluster_add,
            "add a started node (its --peers naming every member and itself) to the raft cluster"
            ).add_argument("raft_address", metavar="HOST:RAFT_PORT", type=node_address)
    command(cluster_commands, "remove-node", _cluster_remove,
            "remove a node from the raft cluster; its routes are dropped so its groups are placed afresh"
            ).add_argument("raft_address", metavar="HOST:RAFT_PORT", type=node_address)
    command(cluster_commands, "status", _cluster_status,
            "members, raft leader and term, routes, and every member's queue depths"
            ).add_argument("--json", action="store_true", help="print the status as JSON")


def _cluster_add(client: AdminClient, args) -> None:
    client.add_member(args.raft_address)
    print(f"added {args.raft_address} to the cluster")


def _cluster_remove(client: AdminClient, args) -> None:
    dropped = client.remove_member(args.raft_address)
    print(f"removed {args.raft_address} from the cluster; dropped {count(dropped, 'route')} that named it")


def _cluster_status(client: AdminClient, args) -> None:
    status = client.cluster_status()
    if args.json:
        print(json.dumps(status, indent=2))
        return
    if not status["clustered"]:
        print("a single node: no peers, no grouping handler (start nodes with --peers to form a cluster)")
        return
    print(f"leader: {status['leader'] or '(none: no quorum)'}  term: {status['term']}  "
          f"routes: {status['routes']}  (answered by {status['node']})")
    if status["waiting_for_route"] or status["outbound"]:
        print(f"at {status['node']}: {status['waiting_for_route']} messages wait for a route; outbound "
              + (", ".join(f"{owner}: {depth} ({status['outbound_bytes'].get(owner, 0)} bytes)"
                           for owner, depth in status["outbound"].items()) or "empty"))
    rows = []
    for member in status["members"]:
        state = "down" if member["down"] else ("up" if member["connected"] else "unreachable")
        role = "leader" if member["node"] == status["leader"] else "member"
        depths = member["error"] or ", ".join(f"{q['name']}={q['depth_messages']}" for q in member["queues"]) or "-"
        rows.append((member["node"], role, state, member["amqp_address"] or "-", member["routes"], depths))
    print(table(("NODE", "ROLE", "RAFT", "AMQP", "ROUTES", "QUEUE DEPTHS"), rows))
    replicas = [(member["node"], member["epoch"], ", ".join(member["in_sync"]) or "-",
                 "under-replicated" if member["under_replicated"] else "ok")
                for member in status["members"] if member["routes"] or member["epoch"] or member["in_sync"]]
    if replicas:  # issue 28: a message of a durable queue on fewer disks than its replication factor asks
        print("\n" + table(("OWNER", "EPOCH", "IN-SYNC BACKUPS", "REPLICAS"), replicas))
    if status["moving"]:
        shown = status["moves"]
        print(f"\n{count(status['moving'], 'group')} moving between nodes"
              + (f" (the first {len(shown)}):" if len(shown) < status["moving"] else ":"))
        print(table(("QUEUE", "GROUP", "FROM", "TO", "WAITING FOR", f"AT {status['node']}"),
                     [(move["queue"], move["group"], move["from"], move["to"], ", ".join(move["waiting"]),
                       "; ".join(move["here"]) or "-") for move in shown]))
