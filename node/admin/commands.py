"""The management sub-commands of `grouper`: `queue`, `groups`, `group` and `cluster`, over the admin API.

Rules:
- Each command is one `AdminClient` call and a few printed lines; the node does the work and the
  validation. Queue flags come from `node.admin.queue_flags` so `grouper node` config and `queue add` agree.
- Results go to stdout (tables, or JSON with `--json`); failures go to stderr, and the exit status
  says who can fix them, in one table: 1 the node refused (its message is quoted), 2 bad usage or
  a value the node rejected, 3 the node could not be reached, 4 the node did not accept the
  credentials or the user lacks the permission. A command the node did only in part (a reroute
  whose destination filled up) prints what it did and exits 1, saying on stderr what stayed and why.
- Who calls: `--user` (or $GROUPER_USER) with a password from `--password-stdin`, $GROUPER_PASSWORD
  or a terminal prompt, never from a flag (it would show in `ps`); TLS with `--ca`, and a client
  certificate with `--cert` and `--key` (or $GROUPER_CA, $GROUPER_CERT, $GROUPER_KEY). A password is
  never sent unencrypted to a node that is not on this host's loopback address (node/admin/arguments.py).
- This module wires and runs them: the commands of each subject live in queue_commands, group_commands
  and cluster_commands, each action `(client, args)`; what they print, in command_output.
"""

from __future__ import annotations

import argparse
import sys

from node.admin import cluster_commands, group_commands, queue_commands
from node.admin.arguments import NODE_ENV, client_options, connection_flags, resolve_node
from node.admin.client import AdminClient, AccessDenied, AdminError, InvalidRequest, NodeFailure, NodeUnreachable
from node.admin.command_output import Stayed
from node.exit_codes import EXIT_DENIED, EXIT_FAILED, EXIT_OK, EXIT_UNREACHABLE, EXIT_USAGE

# First match wins.
EXIT_BY_ERROR: tuple[tuple[type[AdminError], int], ...] = (
    (AccessDenied, EXIT_DENIED),
    (NodeUnreachable, EXIT_UNREACHABLE),
    (InvalidRequest, EXIT_USAGE),
    (NodeFailure, EXIT_FAILED),
)


# ---- wiring ----------------------------------------------------------------------------------

def register(subparsers) -> None:
    connection = connection_flags()

    def command(parent, name: str, action, help_text: str) -> argparse.ArgumentParser:
        parser = parent.add_parser(name, parents=[connection], help=help_text, description=help_text)
        parser.set_defaults(run=lambda args: _run(action, args))
        return parser

    queue_commands.register(subparsers, command)
    group_commands.register_groups(subparsers, command)
    cluster_commands.register(subparsers, command)
    group_commands.register(subparsers, command)


def _run(action, args: argparse.Namespace) -> int:
    address = resolve_node(args)
    options, tls = client_options(args, address)  # bad flags fail here, before any call
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
