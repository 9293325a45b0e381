"""The management sub-commands of `grouper`: `queue`, `groups` and `group`, over the admin API.

Rules:
- Each command is one `AdminClient` call and a few printed lines; the node does the work and the
  validation. Queue flags come from `node.cli` so `grouper node` config and `queue add` agree.
- Results go to stdout (tables, or JSON with `--json`); failures go to stderr, and the exit status
  says who can fix them, in one table: 1 the node refused (its message is quoted), 2 bad usage or
  a value the node rejected, 3 the node could not be reached, 4 the node did not accept the
  credentials or the user lacks the permission. A command the node did only in part (a reroute
  whose destination filled up) prints what it did and exits 1, saying on stderr what stayed and why.
- Who calls: `--user` (or $GROUPER_USER) with a password from `--password-stdin`, $GROUPER_PASSWORD
  or a terminal prompt, never from a flag (it would show in `ps`); TLS with `--ca`, and a client
  certificate with `--cert` and `--key` (or $GROUPER_CA, $GROUPER_CERT, $GROUPER_KEY). A password is
  never sent unencrypted to a node that is not on this host's loopback address.
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import os
import sys

from node.admin.client import (DEFAULT_NODE_ADDRESS, TIMEOUT_MS_DEFAULT, AccessDenied, AdminClient, AdminError,
                               InvalidRequest, NodeFailure, NodeUnreachable)
from node.admin.callers import basic_metadata
from node.admin.queue_listing import depth_by_node, gather
from node.cli import (EXIT_FAILED, EXIT_OK, EXIT_USAGE, add_queue_flags, queue_changes_from_args,
                      queue_settings_from_args)
from node.core.errors import InvalidConfig
from node.net import is_loopback_address

EXIT_UNREACHABLE = 3
EXIT_DENIED = 4
NODE_ENV = "GROUPER_NODE"
USER_ENV = "GROUPER_USER"
PASSWORD_ENV = "GROUPER_PASSWORD"
CA_ENV = "GROUPER_CA"
CERT_ENV = "GROUPER_CERT"
KEY_ENV = "GROUPER_KEY"

# First match wins.
EXIT_BY_ERROR: tuple[tuple[type[AdminError], int], ...] = (
    (AccessDenied, EXIT_DENIED),
    (NodeUnreachable, EXIT_UNREACHABLE),
    (InvalidRequest, EXIT_USAGE),
    (NodeFailure, EXIT_FAILED),
)


# ---- argument types (argparse names the flag when one of these raises) -----------------------

def node_address(text: str) -> str:
    host, separator, port = text.rpartition(":")
    if not separator or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT with a port 1..65535, got {text!r}")
    return text


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _resolve_node(args: argparse.Namespace) -> str:
    if args.node:
        return args.node
    from_env = os.environ.get(NODE_ENV)
    if not from_env:
        return DEFAULT_NODE_ADDRESS
    try:
        return node_address(from_env)
    except argparse.ArgumentTypeError as error:
        raise InvalidConfig(NODE_ENV, str(error)) from None


def password_from_stdin() -> str:
    """`--password-stdin`: one line, its newline dropped; never empty."""
    line = sys.stdin.readline()
    password = line[:-1] if line.endswith("\n") else line
    if not password:
        raise InvalidConfig("--password-stdin", "read an empty line; pipe in one line holding the password")
    return password


def _read_password(user: str, args: argparse.Namespace, address: str) -> str:
    if args.password_stdin:
        return password_from_stdin()
    if PASSWORD_ENV in os.environ:
        if not os.environ[PASSWORD_ENV]:
            raise InvalidConfig(PASSWORD_ENV, "is set but empty")
        return os.environ[PASSWORD_ENV]
    if not sys.stdin.isatty():
        raise InvalidConfig("--user", f"no password for {user}: pipe it in with --password-stdin, set "
                                      f"${PASSWORD_ENV}, or run on a terminal to be asked")
    return getpass.getpass(f"password for {user} at {address}: ")


def _client_options(args: argparse.Namespace, address: str) -> tuple[dict, str]:
    """AdminClient's credentials (TLS) and metadata (the user's password) from flags and environment,
    and which TLS that is ("", "server", "certificate") for the hints of `_describe`."""
    from node.admin.tls import channel_credentials

    def flag_or_environment(name: str, env: str) -> tuple[str, str]:  # (value, what to name in an error)
        if getattr(args, name) or not os.environ.get(env):
            return getattr(args, name) or "", f"--{name}"
        return os.environ[env], env

    (ca, cert, key), keys = zip(*(flag_or_environment(name, env)
                                  for name, env in (("ca", CA_ENV), ("cert", CERT_ENV), ("key", KEY_ENV))))
    tls = bool(ca or cert or key)
    options: dict = {"credentials": channel_credentials(ca, cert, key, keys=keys) if tls else None}
    tls_used = "certificate" if cert else ("server" if tls else "")
    user = args.user or os.environ.get(USER_ENV, "")
    if args.password_stdin and not user:
        raise InvalidConfig("--password-stdin", f"says whose password with --user NAME (or ${USER_ENV})")
    if user:
        if not tls and not is_loopback_address(address):
            raise InvalidConfig("--user", f"the password would cross the network to {address} unencrypted: give "
                                          f"--ca PEM to talk TLS to the node (its admin_tls_cert_file), or run the "
                                          f"command on the node's host against its loopback address")
        options["metadata"] = basic_metadata(user, _read_password(user, args, address))
    return options, tls_used


# ---- wiring ----------------------------------------------------------------------------------

def register(subparsers) -> None:
    connection = argparse.ArgumentParser(add_help=False)
    connection.add_argument("--node", metavar="HOST:PORT", type=node_address,
                            help=f"admin address of the node (default: ${NODE_ENV} or {DEFAULT_NODE_ADDRESS})")
    connection.add_argument("--timeout-ms", metavar="MS", type=positive_int, default=TIMEOUT_MS_DEFAULT,
                            help=f"deadline of the call (default {TIMEOUT_MS_DEFAULT})")
    who = connection.add_argument_group("credentials (README: Security)")
    who.add_argument("--user", metavar="NAME", help=f"log in as NAME (default ${USER_ENV}); the password comes "
                                                    f"from --password-stdin, ${PASSWORD_ENV} or a prompt")
    who.add_argument("--password-stdin", action="store_true", help="read the password from one line of stdin")
    who.add_argument("--ca", metavar="PEM", help=f"talk TLS, trusting these CAs (default ${CA_ENV})")
    who.add_argument("--cert", metavar="PEM", help=f"client certificate for TLS; its CN is the user unless --user "
                                                   f"is given (default ${CERT_ENV})")
    who.add_argument("--key", metavar="PEM", help=f"private key of --cert (default ${KEY_ENV})")

    def command(parent, name: str, action, help_text: str) -> argparse.ArgumentParser:
        parser = parent.add_parser(name, parents=[connection], help=help_text, description=help_text)
        parser.set_defaults(run=lambda args: _run(action, args))
        return parser

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

    groups = command(subparsers, "groups", _groups, "list a queue's message groups")
    groups.add_argument("queue", metavar="QUEUE")
    groups.add_argument("--json", action="store_true",
                        help="print a JSON list of {group, messages, acquired, consumer, label, node}")

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


class Stayed(Exception):
    """A command that did part of its work: what it did is printed, this says what it did not and why."""


def _run(action, args: argparse.Namespace) -> int:
    address = _resolve_node(args)
    options, tls = _client_options(args, address)  # bad flags fail here, before any call
    try:
        with AdminClient(address, args.timeout_ms, **options) as client:
            action(client, args)
            return EXIT_OK
    except Stayed as partial:
        print(f"grouper: {partial}", file=sys.stderr)
        return EXIT_FAILED
    except AdminError as error:
        exit_code = next(code for error_type, code in EXIT_BY_ERROR if isinstance(error, error_type))
        print(_describe(error, args.timeout_ms, tls), file=sys.stderr)
        return exit_code


def _describe(error: AdminError, timeout_ms: int, tls: str = "") -> str:
    """`tls`: "" plaintext, "server" TLS without a client certificate, "certificate" with one."""
    if isinstance(error, NodeUnreachable):
        what = (f"no answer from the node at {error.address} within {timeout_ms} ms"
                if error.status == "DEADLINE_EXCEEDED" else f"cannot reach the node at {error.address}")
        hint = ""
        if error.status == "UNAVAILABLE":
            hint = {"": "; if the node serves admin TLS, give --ca PEM (and --cert/--key when it asks for a "
                        "client certificate)",
                    "server": "; check that --ca trusts the node's certificate, and give --cert/--key if the node "
                              "asks for a client certificate",
                    "certificate": "; check that --ca, --cert and --key fit the node's admin TLS"}[tls]
        return (f"grouper: {what} ({error.status}: {error.message}); check that the node is running "
                f"and that --node or ${NODE_ENV} gives its admin address{hint}")
    if isinstance(error, AccessDenied) and error.status == "UNAUTHENTICATED":
        return f"grouper: the node at {error.address} did not accept the credentials ({error.status}): {error.message}"
    return f"grouper: the node at {error.address} refused ({error.status}): {error.message}"


# ---- commands --------------------------------------------------------------------------------

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
    print(f"purged {_count(purged, 'message')} from queue {args.name}"
          + (f"; {_count(left, 'message')} arrived while it ran and stay{'s' if left == 1 else ''}" if left else ""))


def _queue_reroute(client: AdminClient, args) -> None:
    moved, stayed, reason = client.reroute_queue(args.name, args.destination, args.group, args.count)
    what = f"group {args.group} of queue {args.name}" if args.group is not None else f"queue {args.name}"
    print(f"rerouted {_count(moved, 'message')} from {what} to {args.destination}")
    if stayed:
        raise Stayed(f"{_count(stayed, 'message')} stayed in queue {args.name}: {reason}")


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


def _queue_table(queues: list[dict], by_node: bool = False) -> str:
    headers = ("QUEUE", "DEPTH", "ACQUIRED", "CONSUMERS", "GROUPS", "OWNED")
    return _table(headers + (("DEPTH BY NODE",) if by_node else ()),
                  [(q["name"], q["depth_messages"], q["acquired_messages"], q["consumers"], q["groups"],
                    q["owned_groups"]) + ((depth_by_node(q),) if by_node else ()) for q in queues])


def _groups(client: AdminClient, args) -> None:
    rows = client.list_groups(args.queue)
    labels = _consumer_labels(client, args.queue, {r["node"] for r in rows if r["consumer"] is not None})
    for row in rows:
        row["label"] = labels.get((row["node"], row["consumer"]), "")
    if args.json:
        print(json.dumps(rows, indent=2))
        return
    clustered = any(r["node"] for r in rows)
    print(_table(("GROUP", "MESSAGES", "ACQUIRED", "CONSUMER", "CLIENT/LINK") + (("NODE",) if clustered else ()),
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


def _cluster_add(client: AdminClient, args) -> None:
    client.add_member(args.raft_address)
    print(f"added {args.raft_address} to the cluster")


def _cluster_remove(client: AdminClient, args) -> None:
    dropped = client.remove_member(args.raft_address)
    print(f"removed {args.raft_address} from the cluster; dropped {_count(dropped, 'route')} that named it")


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
    print(_table(("NODE", "ROLE", "RAFT", "AMQP", "ROUTES", "QUEUE DEPTHS"), rows))
    if status["moving"]:
        shown = status["moves"]
        print(f"\n{_count(status['moving'], 'group')} moving between nodes"
              + (f" (the first {len(shown)}):" if len(shown) < status["moving"] else ":"))
        print(_table(("QUEUE", "GROUP", "FROM", "TO", "WAITING FOR", f"AT {status['node']}"),
                     [(move["queue"], move["group"], move["from"], move["to"], ", ".join(move["waiting"]),
                       "; ".join(move["here"]) or "-") for move in shown]))


def _group_reset(client: AdminClient, args) -> None:
    freed = client.reset_groups(args.queue, args.group)
    if args.group is None:
        print(f"reset {_count(freed, 'owned group')} of queue {args.queue}")
    elif freed:
        print(f"reset group {args.group} of queue {args.queue}: its owner is released")
    else:
        print(f"group {args.group} of queue {args.queue} had no owner; nothing to reset")


def _group_purge(client: AdminClient, args) -> None:
    purged = client.purge_group(args.queue, args.group, args.count)
    print(f"purged {_count(purged, 'message')} from group {args.group} of queue {args.queue}")


def _group_move(client: AdminClient, args) -> None:
    moved = client.move_group(args.queue, args.group, args.destination, args.count)
    print(f"moved {_count(moved, 'message')} from group {args.group} of queue {args.queue} "
          f"to queue {args.destination}")


# ---- formatting ------------------------------------------------------------------------------

def _count(number: int, noun: str) -> str:
    return f"{number} {noun}" if number == 1 else f"{number} {noun}s"


def _table(headers: tuple, rows: list[tuple]) -> str:
    cells = [tuple(str(value) for value in row) for row in (headers, *rows)]
    widths = [max(len(row[column]) for row in cells) for column in range(len(headers))]
    return "\n".join("  ".join(value.ljust(width) for value, width in zip(row, widths)).rstrip()
                     for row in cells)
