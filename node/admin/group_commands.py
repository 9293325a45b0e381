"""`grouper groups` and `grouper group reset|purge|move`: a queue's message groups, over the admin API.

Rules (node/admin/commands.py's, for the group commands):
- Each command is one `AdminClient` call and a few printed lines; the node does the work and the
  validation. `groups` also asks each node holding owners for its consumers' client/link labels, as
  the console names them; a node that does not answer leaves its consumers shown by id.
"""

from __future__ import annotations

import json

from node.admin.arguments import positive_int
from node.admin.client import AdminClient, AdminError
from node.admin.command_output import count, table


def register_groups(subparsers, command) -> None:
    """`grouper groups`; `command(parent, name, action, help_text)` adds one sub-command that runs
    `action(client, args)`."""
    groups = command(subparsers, "groups", _groups, "list a queue's message groups")
    groups.add_argument("queue", metavar="QUEUE")
    groups.add_argument("--json", action="store_true",
                        help="print a JSON list of {group, messages, acquired, consumer, label, node}")


def register(subparsers, command) -> None:
    """`grouper group reset|purge|move`, as register_groups."""
    group = subparsers.add_parser("group", help="reset, purge or move a message group")
    group_commands = group.add_subparsers(dest="group_command", required=True, metavar="{reset,purge,move}")
    reset = command(group_commands, "reset", _group_reset,
                    "free one group (or every group) of a queue from its owner")
    reset.add_argument("queue", metavar="QUEUE")
    reset.add_argument("group", metavar="GROUP", nargs="?", help="omit to reset every group")
    purge = command(group_commands, "purge", _group_purge,
                    "delete a group's available messages (acquired ones stay with their consumer)")
    purge.add_argument("queue", metavar="QUEUE")
    purge.add_argument("group", metavar="GROUP")
    purge.add_argument("--count", type=positive_int, metavar="N", help="at most N from the group's head")
    move = command(group_commands, "move", _group_move,
                   "move a group's available messages to another queue (acquired ones stay)")
    move.add_argument("queue", metavar="QUEUE")
    move.add_argument("group", metavar="GROUP")
    move.add_argument("destination", metavar="DEST")
    move.add_argument("--count", type=positive_int, metavar="N", help="at most N from the group's head")


def _groups(client: AdminClient, args) -> None:
    rows = client.list_groups(args.queue)
    labels = _consumer_labels(client, args.queue, {r["node"] for r in rows if r["consumer"] is not None})
    for row in rows:
        row["label"] = labels.get((row["node"], row["consumer"]), "")
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    clustered = any(r["node"] for r in rows)
    print(table(("GROUP", "MESSAGES", "ACQUIRED", "CONSUMER", "CLIENT/LINK") + (("NODE",) if clustered else ()),
                 [(r["group"], r["messages"], r["acquired"], "-" if r["consumer"] is None else r["consumer"],
                   r["label"] or "-") + ((r["node"],) if clustered else ()) for r in rows]))


def _consumer_labels(client: AdminClient, queue: str, nodes: set[str]) -> dict[tuple[str, str], str]:
    """{(node, consumer id): "client/link"}, as the console's Consumers view names them (`receive`
    prints the same); a node that does not answer leaves its consumers shown by id alone."""
    labels = {}
    for node in sorted(nodes):
        try:
            page = client.group_page(queue, page_size=1, node=node)
        except AdminError:
            continue
        labels.update(((node, row["consumer"]), row["label"]) for row in page["consumers"])
    return labels


def _group_reset(client: AdminClient, args) -> None:
    freed = client.reset_groups(args.queue, args.group)
    if args.group is None:
        print(f"reset {count(freed, 'owned group')} of queue {args.queue}")
    elif freed:
        print(f"reset group {args.group} of queue {args.queue}: its owner is released")
    else:
        print(f"group {args.group} of queue {args.queue} had no owner; nothing to reset")


def _group_purge(client: AdminClient, args) -> None:
    purged = client.purge_group(args.queue, args.group, args.count)
    print(f"purged {count(purged, 'message')} from group {args.group} of queue {args.queue}")


def _group_move(client: AdminClient, args) -> None:
    moved = client.move_group(args.queue, args.group, args.destination, args.count)
    print(f"moved {count(moved, 'message')} from group {args.group} of queue {args.queue} "
          f"to queue {args.destination}")
