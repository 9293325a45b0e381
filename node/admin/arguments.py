"""What the management commands read besides their own flags: argument types, the node to call, and
the caller's credentials (flags, environment, a prompt).

Rules:
- Argument types raise argparse.ArgumentTypeError, so argparse names the flag; a bad environment
  variable raises InvalidConfig naming it.
- A password never comes from a flag (it would show in `ps`): `--password-stdin`, $GROUPER_PASSWORD or
  a terminal prompt; and it is never sent unencrypted to a node that is not on this host's loopback
  address.
- Reads flags, environment and stdin only: no node is called here.
"""

from __future__ import annotations

import argparse
import getpass
import os
import sys

from node.admin.client import DEFAULT_NODE_ADDRESS, TIMEOUT_MS_DEFAULT
from node.admin.callers import basic_metadata
from node.core.errors import InvalidConfig
from node.net import is_loopback_address

NODE_ENV = "GROUPER_NODE"
USER_ENV = "GROUPER_USER"
PASSWORD_ENV = "GROUPER_PASSWORD"
CA_ENV = "GROUPER_CA"
CERT_ENV = "GROUPER_CERT"
KEY_ENV = "GROUPER_KEY"


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


def connection_flags() -> argparse.ArgumentParser:
    """The parent parser of every command that calls a node: which node, the deadline, who calls."""
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
    return connection


def resolve_node(args: argparse.Namespace) -> str:
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


def client_options(args: argparse.Namespace, address: str) -> tuple[dict, str]:
    """AdminClient's credentials (TLS) and metadata (the user's password) from flags and environment,
    and which TLS that is ("", "server", "certificate") for the hints of `node.admin.commands._describe`."""
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
