"""`grouper user` and `grouper role`: edit the users file offline; no node is needed or called.

Rules:
- Each command loads the file, makes one change through `node.users.UserDatabase`, saves it
  atomically and says what changed and which nodes read that file (`reader_note`): a running node
  reloads the file it was started with, never another; nothing here talks to a node. A file
  mounted from a Secret is read-only: edit a copy, then update the Secret.
- `--data-dir DIR` names DIR/users.json: the file of `grouper node --data-dir DIR` and of every node
  of `grouper up --data-dir DIR`. With neither flag, beside a `grouper up` cluster in its default
  directory, the command warns that the cluster reads another file.
- A password never comes from the command line (it would show in `ps` and in shell history): one
  line on stdin with `--password-stdin`, or a terminal prompt asked twice. It has at least
  password_chars_min characters, the node's setting, read as the node reads it (`--config FILE`'s
  [node] table, then GROUPER_PASSWORD_CHARS_MIN); a shorter one changes nothing.
- Listings show names and roles, never keys.
- `user add` and `role set` create the file when there is none; the others need one.
- Exit status as `node.exit_codes`, in one table: 0 done; 1 the file's state refused the change (a user
  that exists, a role in use, a missing file) or the file could not be read or written; 2 bad
  usage or a malformed file.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys

from node import config
from node.admin.arguments import password_from_stdin
from node.admin.command_output import table
from node.core.access.roles import ADMINISTRATOR, ADMINISTRATOR_GRANTS, ANONYMOUS, Grant, Permission
from node.core.errors import AlreadyExists, InvalidConfig, NotAllowed, NotFound
from node.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from node.scram_keys import ITERATIONS_DEFAULT, ITERATIONS_MAX, ITERATIONS_MIN
from node.users import UserDatabase
from node.users_file import FILE_NAME, validate_name

DATA_DIR_DEFAULT = "./data"  # as `grouper node`
UP_DATA_DIR_DEFAULT = "./data/cluster"  # as `grouper up` (node/up.py)
UP_MARKER = "node0"  # a directory `grouper up` made holds node0/, node1/, ... beside users.json

# First match wins.
EXIT_BY_ERROR: tuple[tuple[type[BaseException], int], ...] = (
    (InvalidConfig, EXIT_USAGE),
    (NotFound, EXIT_FAILED),
    (AlreadyExists, EXIT_FAILED),
    (NotAllowed, EXIT_FAILED),
    (OSError, EXIT_FAILED),
)


# ---- argument types (argparse names the flag when one of these raises) -----------------------

def _allow(text: str) -> Grant:
    permissions, separator, pattern = text.partition(":")
    if not separator:
        raise argparse.ArgumentTypeError(f"expected PERMISSIONS:PATTERN such as send,consume:orders.*, got {text!r}")
    names = frozenset(name.strip() for name in permissions.split(","))
    try:
        return Grant(names, (pattern,))
    except InvalidConfig as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _iterations(text: str) -> int:
    if not text.isdigit() or not ITERATIONS_MIN <= int(text) <= ITERATIONS_MAX:
        raise argparse.ArgumentTypeError(f"expected an integer {ITERATIONS_MIN}..{ITERATIONS_MAX}, got {text!r}")
    return int(text)


# ---- wiring ----------------------------------------------------------------------------------

def register(subparsers) -> None:
    location = argparse.ArgumentParser(add_help=False)
    where = location.add_mutually_exclusive_group()
    where.add_argument("--users-file", metavar="PATH", help=f"the users file (default DATA_DIR/{FILE_NAME})")
    where.add_argument("--data-dir", metavar="DIR", default=DATA_DIR_DEFAULT,
                       help=f"the node's data directory; the file is DIR/{FILE_NAME} (default {DATA_DIR_DEFAULT})")
    password = argparse.ArgumentParser(add_help=False)
    password.add_argument("--password-stdin", action="store_true",
                          help="read the password from one line of stdin (default: ask twice on the terminal)")
    password.add_argument("--iterations", type=_iterations, default=ITERATIONS_DEFAULT, metavar="N",
                          help=f"PBKDF2 rounds of the stored SCRAM keys (default {ITERATIONS_DEFAULT})")
    password.add_argument("--config", metavar="FILE",
                          help="the node's config file, for its password_chars_min (default 12; the environment's "
                               "GROUPER_PASSWORD_CHARS_MIN wins over it)")

    def command(parent, name: str, action, help_text: str, *parents, creates: bool = False):
        parser = parent.add_parser(name, parents=[location, *parents], help=help_text, description=help_text)
        parser.set_defaults(run=lambda args: _run(action, args, creates))
        return parser

    user = subparsers.add_parser("user", help="add, delete or list the users of the users file (offline)")
    users = user.add_subparsers(dest="user_command", required=True, metavar="{add,delete,list,passwd,roles}")
    add = command(users, "add", _user_add, "add a user (creates the users file if there is none)", password,
                  creates=True)
    add.add_argument("name", metavar="NAME")
    add.add_argument("--role", action="append", default=[], metavar="ROLE",
                     help=f"give the user this role; repeatable (default none; {ADMINISTRATOR} is built in)")
    command(users, "delete", _user_delete, "delete a user").add_argument("name", metavar="NAME")
    command(users, "passwd", _user_passwd, "set a user's password", password).add_argument("name", metavar="NAME")
    roles = command(users, "roles", _user_roles,
                    f"replace a user's roles ({ANONYMOUS}: the roles of clients that do not log in)")
    roles.add_argument("name", metavar="NAME")
    roles.add_argument("--role", action="append", default=[], metavar="ROLE", help="repeatable; none = no roles")
    command(users, "list", _user_list, "list users and their roles").add_argument(
        "--json", action="store_true", help="print JSON: {users: {name: roles}, anonymous_roles}")

    role = subparsers.add_parser("role", help="define, delete or list the roles of the users file (offline)")
    role_commands = role.add_subparsers(dest="role_command", required=True, metavar="{set,delete,list}")
    set_ = command(role_commands, "set", _role_set,
                   "define or replace a role (creates the users file if there is none)", creates=True)
    set_.add_argument("name", metavar="NAME")
    set_.add_argument("--allow", action="append", required=True, type=_allow, metavar="PERMISSIONS:PATTERN",
                      help=f"e.g. send,consume:orders.* (permissions: {', '.join(p.value for p in Permission)}; "
                           f"pattern words: '*' one, '#' zero or more); repeatable")
    command(role_commands, "delete", _role_delete, "delete a role no user has").add_argument("name", metavar="NAME")
    command(role_commands, "list", _role_list, "list roles and their grants").add_argument(
        "--json", action="store_true", help="print JSON: {name: [{permissions, queues}]}")


def users_path(args: argparse.Namespace) -> str:
    return args.users_file or os.path.join(args.data_dir, FILE_NAME)


def _run(action, args: argparse.Namespace, creates: bool) -> int:
    path = users_path(args)
    command = f"grouper {args.command} {args.user_command if args.command == 'user' else args.role_command}"
    if not creates and not os.path.exists(path):
        print(f"{command}: there is no users file at {path}; give --users-file or --data-dir, or create it "
              f"with `grouper user add NAME --role {ADMINISTRATOR}`", file=sys.stderr)
        return EXIT_FAILED
    try:
        database = UserDatabase.load(path) if os.path.exists(path) else UserDatabase()
        change = action(database, args)
        if change:
            database.save(path)
            print(f"{change} in {path}; {reader_note(args, path)}")
            if args.users_file is None and args.data_dir == DATA_DIR_DEFAULT and \
                    os.path.isdir(os.path.join(UP_DATA_DIR_DEFAULT, UP_MARKER)):
                print(f"{command}: note: the `grouper up` cluster in {UP_DATA_DIR_DEFAULT} does not read {path}; "
                      f"for its nodes give --data-dir {UP_DATA_DIR_DEFAULT}", file=sys.stderr)
        return EXIT_OK
    except BrokenPipeError:  # our stdout's reader went away, not a users-file fault: the CLI exits 141 quietly
        raise
    except tuple(error_type for error_type, _ in EXIT_BY_ERROR) as error:
        exit_code = next(code for error_type, code in EXIT_BY_ERROR if isinstance(error, error_type))
        print(f"{command}: {_describe(error, path)}", file=sys.stderr)
        return exit_code


def reader_note(args: argparse.Namespace, path: str) -> str:
    """Which nodes read `path` and so pick the change up while they run; never more than that."""
    if args.users_file:
        return f"nodes started with --users-file {args.users_file} pick the change up while they run"
    if os.path.isdir(os.path.join(args.data_dir, UP_MARKER)):
        return (f"the nodes of `grouper up --data-dir {args.data_dir}` read it and pick the change up while they "
                f"run")
    return (f"a node started with --data-dir {args.data_dir} (and no --users-file), or with --users-file {path}, "
            f"reads it and picks the change up while it runs")


def _describe(error: BaseException, path: str) -> str:
    if isinstance(error, InvalidConfig):
        return f"bad input: {error}"
    if isinstance(error, OSError):
        return (f"cannot read or write {path}: {error.strerror or error}; a file mounted from a Kubernetes "
                f"Secret is read-only: change a copy and update the Secret")
    return str(error)


def _read_password(name: str, args: argparse.Namespace) -> str:
    if args.password_stdin:
        return password_from_stdin()
    if not sys.stdin.isatty():
        raise InvalidConfig("password", "no terminal to ask on; pipe the password in with --password-stdin")
    first = getpass.getpass(f"password for {name}: ")
    if first != getpass.getpass(f"password for {name} again: "):
        raise InvalidConfig("password", "the two entries differ; nothing was changed")
    return first


# ---- commands: each returns what it changed, or None when it changed nothing -----------------

def _password_chars_min(args) -> int:
    return config.load(args.config, os.environ).password_chars_min


def _user_add(database: UserDatabase, args) -> str:
    chars_min = _password_chars_min(args)
    database.add_user(args.name, _password_if_new(database, args), args.role, iterations=args.iterations,
                      password_chars_min=chars_min)
    return f"added user {args.name} with roles {_names(tuple(sorted(set(args.role))))}"


def _password_if_new(database: UserDatabase, args) -> str:
    # ask for no password for a user that cannot be added anyway
    validate_name(args.name, "NAME")
    if args.name in dict(database.users()):
        raise AlreadyExists(f"user {args.name!r} exists already; "
                            f"`grouper user passwd {args.name}` changes its password")
    unknown = sorted(set(args.role) - set(database.roles()) - {ADMINISTRATOR})
    if unknown:
        raise InvalidConfig("--role", f"unknown role {unknown[0]!r}; `grouper role list` shows the roles")
    return _read_password(args.name, args)


def _user_delete(database: UserDatabase, args) -> str:
    database.delete_user(args.name)
    return f"deleted user {args.name}"


def _user_passwd(database: UserDatabase, args) -> str:
    if args.name not in dict(database.users()):  # ask for no password for a user that is not there
        raise NotFound(f"there is no user {args.name!r}; `grouper user list` shows the users")
    chars_min = _password_chars_min(args)
    database.set_password(args.name, _read_password(args.name, args), iterations=args.iterations,
                          password_chars_min=chars_min)
    return f"set the password of user {args.name}"


def _user_roles(database: UserDatabase, args) -> str:
    database.set_roles(args.name, args.role)
    who = "anonymous clients" if args.name == ANONYMOUS else f"user {args.name}"
    return f"set the roles of {who} to {_names(tuple(sorted(set(args.role))))}"


def _user_list(database: UserDatabase, args) -> None:
    if args.json:
        print(json.dumps({"users": {name: list(roles) for name, roles in database.users()},
                          "anonymous_roles": list(database.anonymous_roles)}, indent=2))
        return
    rows = [(name, _names(roles)) for name, roles in database.users()]
    rows.append((f"({ANONYMOUS})", _names(database.anonymous_roles)))
    print(table(("USER", "ROLES"), rows))


def _role_set(database: UserDatabase, args) -> str:
    merged: dict[frozenset, list[str]] = {}  # one grant per permission set, its patterns in flag order
    for grant in args.allow:
        patterns = merged.setdefault(grant.permissions, [])
        patterns.extend(queue for queue in grant.queues if queue not in patterns)
    database.set_role(args.name, [Grant(permissions, tuple(queues)) for permissions, queues in merged.items()])
    return f"set role {args.name}: {_grants(database.roles()[args.name])}"


def _role_delete(database: UserDatabase, args) -> str:
    database.delete_role(args.name)
    return f"deleted role {args.name}"


def _role_list(database: UserDatabase, args) -> None:
    every_role = {ADMINISTRATOR: ADMINISTRATOR_GRANTS, **database.roles()}
    if args.json:
        print(json.dumps({name: [{"permissions": sorted(p.value for p in grant.permissions),
                                  "queues": list(grant.queues)} for grant in grants]
                          for name, grants in every_role.items()}, indent=2))
        return
    print(table(("ROLE", "GRANTS"), [(name + (" (built in)" if name == ADMINISTRATOR else ""), _grants(grants))
                                      for name, grants in every_role.items()]))


# ---- output ------------------------------------------------------------------------------------

def _names(names: tuple[str, ...]) -> str:
    return ", ".join(names) if names else "(none)"


def _grants(grants) -> str:
    return "  ".join(f"{','.join(sorted(p.value for p in grant.permissions))}:{queue}"
                     for grant in grants for queue in grant.queues)
