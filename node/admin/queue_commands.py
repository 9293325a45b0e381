"""`grouper queue add|update|delete|purge|reroute|list`: a node's queues, over the admin API.

Rules (node/admin/commands.py's, for the queue commands):
- Each command is one `AdminClient` call (a listing: node/admin/queue_listing.py) and a few printed
  lines; the node does the work and the validation, except that `queue add` checks its flags first.
- A command the node did only in part (a reroute whose destination filled up, a listing a member did
  not answer) prints what it did and raises `Stayed`, saying what stayed and why.
"""

from __future__ import annotations

import dataclasses
import json
import time

from node.admin.arguments import positive_int
from node.admin.client import AdminClient
from node.admin.command_output import Stayed, count, table
from node.admin.queue_flags import add_queue_flags, queue_changes_from_args, queue_settings_from_args
from node.admin.queue_listing import depth_by_node, gather
from node.core.errors import InvalidConfig


def register(subparsers, command) -> None:
    """`command(parent, name, action, help_text)` adds one sub-command that runs `action(client, args)`."""
    queue = subparsers.add_parser("queue", help="add, update, delete, purge, reroute or list queues (in a cluster: "
                                                "on every node)")
    queue_commands = queue.add_subparsers(dest="queue_command", required=True,
                                          metavar="{add,update,delete,purge,reroute,list}")
    add = command(queue_commands, "add", _queue_add, "declare a queue (in a cluster: on every node)")
    add.add_argument("name", metavar="NAME")
    add_queue_flags(add)
    add.add_argument("--address", metavar="ADDRESS",
                     help="make the queue a subscription of multicast ADDRESS: it gets a copy of every message "
                          "sent there (the address becomes multicast if it is not yet)")
    update = command(queue_commands, "update", _queue_update,
                     "change settings of a queue (in a cluster: on every node); only limits, dispatch and "
                     "dead-letter settings can change on a live queue, not how messages are grouped or durability")
    update.add_argument("name", metavar="NAME")
    add_queue_flags(update)
    delete = command(queue_commands, "delete", _queue_delete,
                     "delete a queue and its messages (in a cluster: on every node at once, refused while any "
                     "node holds messages of it unless --force)")
    delete.add_argument("name", metavar="NAME")
    delete.add_argument("--force", action="store_true",
                        help="in a cluster: delete even if nodes hold messages of the queue, dropping them")
    command(queue_commands, "purge", _queue_purge,
            "delete the available messages of every group of a queue (in a cluster: on every node); "
            "messages delivered and not yet settled stay with their consumers, and so do messages in no "
            "group").add_argument("name", metavar="NAME")
    reroute = command(queue_commands, "reroute", _queue_reroute,
                      "move available messages of a queue (all, the first N, or one group's) to another queue or "
                      "a multicast address, each group in order, routed as sends there are (in a cluster: from "
                      "every node); groups with deliveries unsettled stay whole")
    reroute.add_argument("name", metavar="QUEUE")
    reroute.add_argument("--to", required=True, metavar="ADDRESS", dest="destination",
                         help="the queue or multicast address to move them to; it must exist")
    reroute.add_argument("--group", metavar="GROUP", help="only this group's messages")
    reroute.add_argument("--count", type=positive_int, metavar="N",
                         help="at most N: the first in queue order (with --group: from the group's head)")
    queue_list = command(queue_commands, "list", _queue_list,
                         "list queues with depth, consumers and group counts (in a cluster: summed over every "
                         "node, each node's depth shown; a node that does not answer is named and the exit "
                         "status is 1)")
    queue_list.add_argument("--json", action="store_true", help="print a JSON list (in a cluster: each queue's "
                                                                 "sums, and its stats per node under 'nodes')")
    queue_list.add_argument("--local", action="store_true",
                            help="the queues of the node asked only, as it holds them, without asking the others")


def _queue_add(client: AdminClient, args) -> None:
    settings = queue_settings_from_args(args.name, args)  # bad flags fail here, before any call
    if args.address is not None:
        try:
            settings = dataclasses.replace(settings, address=args.address).validate()
        except InvalidConfig as error:
            raise InvalidConfig("--address", str(error).split(": ", 1)[1]) from None
    client.add_queue(settings)
    print(f"added queue {settings.name} (group policy {settings.group_policy}"
          f"{f', subscribes to {settings.address}' if settings.address else ''})")


def _queue_update(client: AdminClient, args) -> None:
    changes = queue_changes_from_args(args)  # the node checks the values and which may change
    client.update_queue(args.name, changes)
    print(f"updated queue {args.name}: " + (", ".join(f"{key}={value}" for key, value in sorted(changes.items()))
                                            or "nothing given"))


def _queue_delete(client: AdminClient, args) -> None:
    client.delete_queue(args.name, force=args.force)
    print(f"deleted queue {args.name}")


def _queue_purge(client: AdminClient, args) -> None:
    purged, left = client.purge_queue(args.name)
    print(f"purged {count(purged, 'message')} from queue {args.name}"
          + (f"; {count(left, 'message')} arrived while it ran and stay{'s' if left == 1 else ''}" if left else ""))


def _queue_reroute(client: AdminClient, args) -> None:
    moved, stayed, reason = client.reroute_queue(args.name, args.destination, args.group, args.count)
    what = f"group {args.group} of queue {args.name}" if args.group is not None else f"queue {args.name}"
    print(f"rerouted {count(moved, 'message')} from {what} to {args.destination}")
    if stayed:
        raise Stayed(f"{count(stayed, 'message')} stayed in queue {args.name}: {reason}")


def _queue_list(client: AdminClient, args) -> None:
    """Cluster-wide where it can be, else naming the node listed (node/admin/queue_listing.py)."""
    listing = gather(client, args.local)
    if args.json:
        print(json.dumps(listing.queues, indent=2))
    else:
        print(_queue_table(listing.queues, by_node=listing.clustered))
        print(f"({listing.whose})")
    if listing.missing:
        raise Stayed("not listed: " + "; ".join(f"the queues of {node} ({why})" for node, why in listing.missing))


def _queue_table(queues: list[dict], by_node: bool = False, now_ms: int | None = None) -> str:
    # issue 30, group signals: RUNNABLE (no consumer, next message ready), BLOCKED (next message waits) and
    # the age of the oldest message waiting at a group's head ("-": none), on this machine's clock
    now_ms = int(time.time() * 1000) if now_ms is None else now_ms
    headers = ("QUEUE", "DEPTH", "ACQUIRED", "CONSUMERS", "GROUPS", "OWNED", "RUNNABLE", "BLOCKED", "OLDEST HEAD")
    return table(headers + (("DEPTH BY NODE",) if by_node else ()),
                  [(q["name"], q["depth_messages"], q["acquired_messages"], q["consumers"], q["groups"],
                    q["owned_groups"], q.get("runnable_groups", 0), q.get("blocked_groups", 0),
                    _head_age(q.get("oldest_head_enqueued_at_ms", 0), now_ms))
                   + ((depth_by_node(q),) if by_node else ()) for q in queues])


def _head_age(enqueued_at_ms: int, now_ms: int) -> str:
    return f"{max(0, now_ms - enqueued_at_ms) / 1000:.1f}s" if enqueued_at_ms else "-"
