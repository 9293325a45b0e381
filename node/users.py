"""The user database: users, their SCRAM-SHA-256 keys, roles and the anonymous roles, and what the
node asks of them (logins, decoys, the access table); kept in one JSON file (node/users_file.py).

Decision: users and roles live in ONE JSON file, by default `<data-dir>/users.json`, that a
Kubernetes Secret can mount read-only and that every node of a cluster reads; nodes reload it when
it changes (`users_file.stamp` tells them it did). Not the raft store, because the first administrator
must exist before any cluster runs (nobody could log in to create it), and a Secret is how Kubernetes
operators already manage credentials. The price: a change made with `grouper user` on one node's
file reaches the others only through the Secret (or a copy), not through raft.

Rules:
- An adapter: file I/O only (node/users_file.py's), no sockets, threads or clock. Decisions are
  `node.core.access.roles`'s.
- Only SCRAM-derived keys are stored (node/scram_keys.py), never a password; PLAIN logins are checked
  by deriving the key again with the stored salt and iterations.
- Loading validates everything (node/users_file.py), so a node refuses a bad file as a whole.
- A user the file does not have gets a decoy (node/user_decoys.py) from the file's `decoy_secret`.
- Passwords set through `add_user` and `set_password` (and so `grouper user` and the bootstrap) have
  at least `password_chars_min` characters (PASSWORD_CHARS_MIN_DEFAULT unless the node's setting
  says otherwise); a login's password is only compared, whatever its length.
"""

from __future__ import annotations

import hmac
import os
from typing import Iterable, Mapping

from node import user_decoys, users_file
from node.core.access.roles import ADMINISTRATOR, ANONYMOUS, Access, Grant
from node.core.errors import AlreadyExists, InvalidConfig, NotAllowed, NotFound
from node.scram_keys import (ITERATIONS_DEFAULT, PASSWORD_CHARS_MIN_DEFAULT, PASSWORD_LENGTH_MAX_CHARS,
                             check_new_password, derive)
from node.users_file import FILE_NAME, User, known_roles, problem_of, validate_name

DEFAULT_USER_ENV = "GROUPER_DEFAULT_USER"
DEFAULT_PASSWORD_ENV = "GROUPER_DEFAULT_PASSWORD"
DEFAULT_PASSWORD_FILE_ENV = "GROUPER_DEFAULT_PASSWORD_FILE"


class UserDatabase:
    def __init__(self):
        self._roles: dict[str, tuple[Grant, ...]] = {}
        self._anonymous_roles: tuple[str, ...] = ()
        self._users: dict[str, User] = {}
        self._decoy_secret: bytes | None = None  # the file's; None: derived from the users until saved
        self._decoy_shape: tuple[int, int] | None = None  # (salt bytes, iterations), cached until users change

    # ---- reading and writing ----------------------------------------------------------------

    @classmethod
    def load(cls, path: str) -> "UserDatabase":
        try:
            data = users_file.read(path)
        except FileNotFoundError:
            raise InvalidConfig(str(path), "no users file here; `grouper user add NAME --role administrator` "
                                           f"creates it, or set {DEFAULT_USER_ENV} before the first start") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: object, source: str = FILE_NAME) -> "UserDatabase":
        contents = users_file.parse(data, source)
        database = cls()
        database._roles, database._anonymous_roles = contents.roles, contents.anonymous_roles
        database._users, database._decoy_secret = contents.users, contents.decoy_secret
        if database._decoy_secret is None and database._users:  # kept as it is, so decoys never change
            database._decoy_secret = database._derived_decoy_secret()
        return database

    def to_dict(self) -> dict:
        return users_file.render(users_file.Contents(self._roles, self._anonymous_roles, self._users,
                                                     self._decoy_secret))

    def save(self, path: str) -> None:
        if self._decoy_secret is None:
            self._decoy_secret = os.urandom(user_decoys.SECRET_BYTES)
        users_file.write(path, self.to_dict())

    # ---- users ---------------------------------------------------------------------------------

    def add_user(self, name: str, password: str, roles: Iterable[str] = (), *, iterations: int = ITERATIONS_DEFAULT,
                 password_chars_min: int = PASSWORD_CHARS_MIN_DEFAULT) -> None:
        validate_name(name, "user")
        if name == ANONYMOUS:
            raise InvalidConfig("user", f"{ANONYMOUS!r} is reserved for clients that do not log in; "
                                        f"give it roles with `grouper user roles {ANONYMOUS} --role ROLE`")
        if name in self._users:
            raise AlreadyExists(f"user {name!r} exists already; `grouper user passwd {name}` changes its password")
        roles = known_roles(list(roles), "role", _plain, self._roles)
        check_new_password(password, password_chars_min)
        self._users[name] = User(roles, derive(password, iterations))
        self._decoy_shape = None

    def delete_user(self, name: str) -> None:
        self._user(name)
        del self._users[name]
        self._decoy_shape = None

    def set_password(self, name: str, password: str, *, iterations: int = ITERATIONS_DEFAULT,
                     password_chars_min: int = PASSWORD_CHARS_MIN_DEFAULT) -> None:
        user = self._user(name)
        check_new_password(password, password_chars_min)
        self._users[name] = User(user.roles, derive(password, iterations))
        self._decoy_shape = None

    def set_roles(self, name: str, roles: Iterable[str]) -> None:
        """`name` ANONYMOUS sets the roles of clients that do not log in."""
        roles = known_roles(list(roles), "role", _plain, self._roles)
        if name == ANONYMOUS:
            self._anonymous_roles = roles
            return
        user = self._user(name)
        self._users[name] = User(roles, user.keys)

    def users(self) -> list[tuple[str, tuple[str, ...]]]:
        return [(name, user.roles) for name, user in sorted(self._users.items())]

    @property
    def anonymous_roles(self) -> tuple[str, ...]:
        return self._anonymous_roles

    # ---- roles ---------------------------------------------------------------------------------

    def set_role(self, name: str, grants: Iterable[Grant]) -> None:
        validate_name(name, "role")
        if name == ADMINISTRATOR:
            raise InvalidConfig("role", f"{ADMINISTRATOR!r} is built in (every permission on '#') "
                                        f"and cannot be changed")
        grants = tuple(grants)
        if not grants:
            raise InvalidConfig("role", f"role {name!r} needs at least one grant (--allow PERMISSIONS:PATTERN)")
        self._roles[name] = grants

    def delete_role(self, name: str) -> None:
        if name == ADMINISTRATOR:
            raise InvalidConfig("role", f"{ADMINISTRATOR!r} is built in and cannot be deleted")
        if name not in self._roles:
            raise NotFound(f"there is no role {name!r}; `grouper role list` shows the roles")
        holders = [user for user, record in sorted(self._users.items()) if name in record.roles]
        holders += [ANONYMOUS] if name in self._anonymous_roles else []
        if holders:
            raise NotAllowed(f"role {name!r} is still given to {', '.join(holders)}; give them other roles first "
                             f"with `grouper user roles NAME --role ROLE ...`")
        del self._roles[name]

    def roles(self) -> dict[str, tuple[Grant, ...]]:
        return dict(sorted(self._roles.items()))

    # ---- what the node asks --------------------------------------------------------------------

    def access(self) -> Access:
        user_roles = {name: user.roles for name, user in self._users.items()}
        user_roles[ANONYMOUS] = self._anonymous_roles
        return Access(self._roles, user_roles)

    def scram_auth_info(self, user: str) -> tuple[bytes, bytes, bytes, int] | None:
        """The tuple scramp's server `auth_fn` returns: (salt, stored_key, server_key, iteration_count)."""
        record = self._users.get(user)
        if record is None:
            return None
        keys = record.keys
        return keys.salt, keys.stored_key, keys.server_key, keys.iterations

    def scram_decoy(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        """What a user the file does not have is told (node/user_decoys.py), for any name."""
        secret = self._decoy_secret if self._decoy_secret is not None else self._derived_decoy_secret()
        if self._decoy_shape is None:
            self._decoy_shape = user_decoys.typical_shape(
                ((len(user.keys.salt), user.keys.iterations) for user in self._users.values()),
                ITERATIONS_DEFAULT)
        return user_decoys.decoy(secret, self._decoy_shape, user)

    def verify_plain(self, user: str, password: str) -> bool:
        record = self._users.get(user)
        decoy_salt, decoy_key, _, decoy_iterations = self.scram_decoy(user)  # for every user: the same work
        if record is None:  # derive all the same, so the time taken does not tell which users exist
            salt, iterations, expected = decoy_salt, decoy_iterations, decoy_key
        else:
            keys = record.keys
            salt, iterations, expected = keys.salt, keys.iterations, keys.stored_key
        try:
            stored_key = derive(password, iterations, salt).stored_key
        except InvalidConfig:  # empty, too long or not SASLprep-able: matches no stored key
            return False
        return hmac.compare_digest(stored_key, expected) and record is not None

    # ---- helpers -------------------------------------------------------------------------------

    def _derived_decoy_secret(self) -> bytes:
        return user_decoys.derived_secret((name, user.keys.salt, user.keys.stored_key,
                                           user.keys.server_key) for name, user in self._users.items())

    def _user(self, name: str) -> User:
        if name not in self._users:
            raise NotFound(f"there is no user {name!r}; `grouper user list` shows the users")
        return self._users[name]


def bootstrap(path: str, environ: Mapping[str, str],
              password_chars_min: int = PASSWORD_CHARS_MIN_DEFAULT) -> str | None:
    """The first administrator, from the environment, at first start only (like RabbitMQ's default user)."""
    if os.path.exists(path):
        return None
    name = environ.get(DEFAULT_USER_ENV, "")
    password_text = environ.get(DEFAULT_PASSWORD_ENV)
    password_file = environ.get(DEFAULT_PASSWORD_FILE_ENV)
    if not name:
        if password_text is not None or password_file is not None:
            raise InvalidConfig(DEFAULT_USER_ENV, "must be set too: a default password needs a default user name")
        return None
    if password_text is not None and password_file is not None:
        raise InvalidConfig(DEFAULT_PASSWORD_ENV,
                            f"set only one of {DEFAULT_PASSWORD_ENV} and {DEFAULT_PASSWORD_FILE_ENV}")
    if password_file is not None:
        try:
            with open(password_file, encoding="utf-8") as file:
                password_text = file.read(PASSWORD_LENGTH_MAX_CHARS + 3)
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidConfig(DEFAULT_PASSWORD_FILE_ENV, f"cannot read {password_file}: {error}") from None
        password_text = _strip_one_newline(password_text)
        variable = DEFAULT_PASSWORD_FILE_ENV
    else:
        variable = DEFAULT_PASSWORD_ENV
    if not password_text:
        raise InvalidConfig(variable, f"{DEFAULT_USER_ENV} is set to {name!r}, but there is no password: set "
                                      f"{DEFAULT_PASSWORD_ENV}, or {DEFAULT_PASSWORD_FILE_ENV} to a file holding it")
    database = UserDatabase()
    try:
        database.add_user(name, password_text, [ADMINISTRATOR], password_chars_min=password_chars_min)
    except InvalidConfig as error:
        culprit = DEFAULT_USER_ENV if error.key == "user" else variable
        raise InvalidConfig(culprit, problem_of(error)) from None
    database.save(path)
    return name


def _strip_one_newline(text: str) -> str:
    for ending in ("\r\n", "\n"):
        if text.endswith(ending):
            return text[:-len(ending)]
    return text


def _plain(key: str, problem: str) -> InvalidConfig:
    return InvalidConfig(key, problem)
