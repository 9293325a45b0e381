"""The users file: users, their SCRAM-SHA-256 keys, roles and the anonymous roles, in one JSON file.

Decision: users and roles live in ONE JSON file, by default `<data-dir>/users.json`, that a
Kubernetes Secret can mount read-only and that every node of a cluster reads; nodes reload it when
it changes (`stamp` tells them it did). Not the raft store, because the first administrator must
exist before any cluster runs (nobody could log in to create it), and a Secret is how Kubernetes
operators already manage credentials. The price: a change made with `grouper user` on one node's
file reaches the others only through the Secret (or a copy), not through raft.

Rules:
- An adapter: file I/O only, no sockets, threads or clock. Decisions are `node.core.access`'s.
- Only SCRAM-derived keys are stored (salt, iterations, StoredKey, ServerKey), never a password;
  PLAIN logins are checked by deriving the key again with the stored salt and iterations.
- Loading validates everything; a bad file is an `InvalidConfig` naming the file and the key path
  (`users.json: users.bob.roles: unknown role 'x'`), so a node refuses it as a whole.
- Saving is atomic (a temporary file in the same directory, fsync, rename) and the file is 0600.
- A user the file does not have gets a decoy (node/user_decoys.py) from the file's `decoy_secret`.
- Passwords set through `add_user` and `set_password` (and so `grouper user` and the bootstrap) have
  at least `password_chars_min` characters (PASSWORD_CHARS_MIN_DEFAULT unless the node's setting
  says otherwise); a login's password is only compared, whatever its length.

Format (version 1):
  {"version": 1,
   "roles": {"orders-writer": [{"permissions": ["send"], "queues": ["orders.*"]}]},
   "anonymous_roles": [],
   "decoy_secret": "<base64 of 32 bytes>",
   "users": {"alice": {"roles": ["administrator"],
                       "scram_sha_256": {"salt": "<base64>", "iterations": 4096,
                                         "stored_key": "<base64>", "server_key": "<base64>"}}}}
"""

from __future__ import annotations

import base64
import binascii
import hmac
import json
import os
import tempfile
from dataclasses import dataclass
from typing import Iterable, Mapping

import scramp

from node import user_decoys
from node.config import files_stamp
from node.core.access import ADMINISTRATOR, ANONYMOUS, Access, Grant
from node.core.errors import AlreadyExists, InvalidConfig, NotAllowed, NotFound
from node.store.journal import fsync_directory

FILE_NAME = "users.json"  # in the data directory unless given otherwise
FORMAT_VERSION = 1
FILE_SIZE_MAX_BYTES = 16 << 20  # a users file larger than this is refused unread
NAME_LENGTH_MAX_CHARS = 255  # user and role names: 1..255 characters, no control characters
PASSWORD_LENGTH_MAX_CHARS = 1024  # passwords: 1..1024 characters (after SASLprep)
PASSWORD_CHARS_MIN_DEFAULT = 12  # a new password's fewest characters (node/config.py's password_chars_min default)
ITERATIONS_MIN = 4096  # PBKDF2 rounds; RFC 7677's minimum for SCRAM-SHA-256
ITERATIONS_DEFAULT = 4096
ITERATIONS_MAX = 10_000_000  # scramp's ceiling (a guard against a file that makes every login cost minutes)
SALT_LENGTH_MIN_BYTES = 12  # scramp refuses shorter salts
KEY_LENGTH_BYTES = 32  # SHA-256 digests
FILE_MODE = 0o600

DEFAULT_USER_ENV = "GROUPER_DEFAULT_USER"
DEFAULT_PASSWORD_ENV = "GROUPER_DEFAULT_PASSWORD"
DEFAULT_PASSWORD_FILE_ENV = "GROUPER_DEFAULT_PASSWORD_FILE"

_MECHANISM = scramp.ScramMechanism("SCRAM-SHA-256")
_TOP_KEYS = {"version", "roles", "anonymous_roles", "decoy_secret", "users"}
_USER_KEYS = {"roles", "scram_sha_256"}
_SCRAM_KEYS = {"salt", "iterations", "stored_key", "server_key"}
_GRANT_KEYS = {"permissions", "queues"}


@dataclass(frozen=True)
class Credentials:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


@dataclass(frozen=True)
class User:
    roles: tuple[str, ...]
    credentials: Credentials


def name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not 1 <= len(name) <= NAME_LENGTH_MAX_CHARS:
        return f"a name must be 1..{NAME_LENGTH_MAX_CHARS} characters"
    if any(ord(char) < 32 or ord(char) == 127 for char in name):
        return f"the name {name!r} contains a control character"
    return None


def validate_name(name: str, key: str) -> str:
    problem = name_problem(name)
    if problem:
        raise InvalidConfig(key, problem)
    return name


def password_problem(password: str, chars_min: int) -> str | None:
    """Why a new password is refused, or None."""
    if isinstance(password, str) and 0 < len(password) < chars_min:
        return (f"has {len(password)} characters, fewer than the {chars_min} required (password_chars_min); "
                f"choose a longer one, such as a few random words")
    return None


def derive(password: str, iterations: int = ITERATIONS_DEFAULT, salt: bytes | None = None) -> Credentials:
    if not isinstance(password, str) or not password:
        raise InvalidConfig("password", "must not be empty")
    if len(password) > PASSWORD_LENGTH_MAX_CHARS:
        raise InvalidConfig("password", f"longer than {PASSWORD_LENGTH_MAX_CHARS} characters")
    if type(iterations) is not int or not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
        raise InvalidConfig("iterations", f"must be an integer {ITERATIONS_MIN}..{ITERATIONS_MAX}")
    try:
        salt, stored_key, server_key, iterations = _MECHANISM.make_auth_info(
            password, iteration_count=iterations, salt=salt)
    except scramp.ScramException as error:  # SASLprep refuses some characters
        raise InvalidConfig("password", f"cannot be used with SCRAM: {error.args[0]}") from None
    return Credentials(salt, iterations, stored_key, server_key)


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
            with open(path, "rb") as file:
                raw = file.read(FILE_SIZE_MAX_BYTES + 1)
        except FileNotFoundError:
            raise InvalidConfig(str(path), "no users file here; `grouper user add NAME --role administrator` "
                                           f"creates it, or set {DEFAULT_USER_ENV} before the first start") from None
        if len(raw) > FILE_SIZE_MAX_BYTES:
            raise InvalidConfig(str(path), f"larger than {FILE_SIZE_MAX_BYTES} bytes")
        try:
            data = json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
        except (UnicodeDecodeError, ValueError) as error:
            raise InvalidConfig(str(path), f"not valid JSON: {error}") from None
        return cls.from_dict(data, source=str(path))

    @classmethod
    def from_dict(cls, data: object, source: str = FILE_NAME) -> "UserDatabase":
        def bad(key: str, problem: str) -> InvalidConfig:
            return InvalidConfig(f"{source}: {key}" if key else source, problem)

        database = cls()
        top = _object(data, "", _TOP_KEYS, bad)
        if type(top.get("version")) is not int or top["version"] != FORMAT_VERSION:
            raise bad("version", f"must be {FORMAT_VERSION}, found {top.get('version')!r}")
        for name, grants in sorted(_object(top.get("roles", {}), "roles", None, bad).items()):
            key = f"roles.{name}"
            if name_problem(name):
                raise bad(key, name_problem(name))
            if name == ADMINISTRATOR:
                raise bad(key, "is built in (every permission on '#') and cannot be redefined")
            if not isinstance(grants, list) or not grants:
                raise bad(key, "must be a list of at least one grant")
            database._roles[name] = tuple(_grant(grant, f"{key}.{index}", bad) for index, grant in enumerate(grants))
        database._anonymous_roles = database._known_roles(top.get("anonymous_roles", []), "anonymous_roles", bad)
        if "decoy_secret" in top:
            database._decoy_secret = _unb64(top["decoy_secret"], "decoy_secret", bad)
            if len(database._decoy_secret) != user_decoys.SECRET_BYTES:
                raise bad("decoy_secret", f"must be {user_decoys.SECRET_BYTES} bytes")
        for name, entry in sorted(_object(top.get("users", {}), "users", None, bad).items()):
            key = f"users.{name}"
            if name_problem(name):
                raise bad(key, name_problem(name))
            if name == ANONYMOUS:
                raise bad(key, f"{ANONYMOUS!r} is reserved for clients that do not log in; use anonymous_roles")
            entry = _object(entry, key, _USER_KEYS, bad)
            roles = database._known_roles(entry.get("roles", []), f"{key}.roles", bad)
            if "scram_sha_256" not in entry:
                raise bad(f"{key}.scram_sha_256", "missing")
            database._users[name] = User(roles, _credentials(entry["scram_sha_256"], f"{key}.scram_sha_256", bad))
        if database._decoy_secret is None and database._users:  # kept as it is, so decoys never change
            database._decoy_secret = database._derived_decoy_secret()
        return database

    def to_dict(self) -> dict:
        return {
            "version": FORMAT_VERSION,
            "roles": {name: [{"permissions": sorted(p.value for p in grant.permissions), "queues": list(grant.queues)}
                             for grant in grants] for name, grants in sorted(self._roles.items())},
            "anonymous_roles": list(self._anonymous_roles),
            **({"decoy_secret": _b64(self._decoy_secret)} if self._decoy_secret is not None else {}),
            "users": {name: {"roles": list(user.roles), "scram_sha_256": {
                "salt": _b64(user.credentials.salt), "iterations": user.credentials.iterations,
                "stored_key": _b64(user.credentials.stored_key), "server_key": _b64(user.credentials.server_key)}}
                for name, user in sorted(self._users.items())},
        }

    def save(self, path: str) -> None:
        directory = os.path.dirname(os.path.abspath(path))
        os.makedirs(directory, exist_ok=True)
        if self._decoy_secret is None:
            self._decoy_secret = os.urandom(user_decoys.SECRET_BYTES)
        text = json.dumps(self.to_dict(), indent=2) + "\n"
        handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.", suffix=".tmp")
        try:
            os.fchmod(handle, FILE_MODE)
            with os.fdopen(handle, "w", encoding="utf-8") as file:
                file.write(text)
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, path)
        except BaseException:
            try:
                os.unlink(temporary)
            except FileNotFoundError:
                pass
            raise
        fsync_directory(directory)  # so the rename itself survives a power loss

    # ---- users ---------------------------------------------------------------------------------

    def add_user(self, name: str, password: str, roles: Iterable[str] = (), *, iterations: int = ITERATIONS_DEFAULT,
                 password_chars_min: int = PASSWORD_CHARS_MIN_DEFAULT) -> None:
        validate_name(name, "user")
        if name == ANONYMOUS:
            raise InvalidConfig("user", f"{ANONYMOUS!r} is reserved for clients that do not log in; "
                                        f"give it roles with `grouper user roles {ANONYMOUS} --role ROLE`")
        if name in self._users:
            raise AlreadyExists(f"user {name!r} exists already; `grouper user passwd {name}` changes its password")
        roles = self._known_roles(list(roles), "role", _plain)
        _check_new_password(password, password_chars_min)
        self._users[name] = User(roles, derive(password, iterations))
        self._decoy_shape = None

    def delete_user(self, name: str) -> None:
        self._user(name)
        del self._users[name]
        self._decoy_shape = None

    def set_password(self, name: str, password: str, *, iterations: int = ITERATIONS_DEFAULT,
                     password_chars_min: int = PASSWORD_CHARS_MIN_DEFAULT) -> None:
        user = self._user(name)
        _check_new_password(password, password_chars_min)
        self._users[name] = User(user.roles, derive(password, iterations))
        self._decoy_shape = None

    def set_roles(self, name: str, roles: Iterable[str]) -> None:
        """`name` ANONYMOUS sets the roles of clients that do not log in."""
        roles = self._known_roles(list(roles), "role", _plain)
        if name == ANONYMOUS:
            self._anonymous_roles = roles
            return
        user = self._user(name)
        self._users[name] = User(roles, user.credentials)

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
        credentials = record.credentials
        return credentials.salt, credentials.stored_key, credentials.server_key, credentials.iterations

    def scram_decoy(self, user: str) -> tuple[bytes, bytes, bytes, int]:
        """What a user the file does not have is told (node/user_decoys.py), for any name."""
        secret = self._decoy_secret if self._decoy_secret is not None else self._derived_decoy_secret()
        if self._decoy_shape is None:
            self._decoy_shape = user_decoys.typical_shape(
                ((len(user.credentials.salt), user.credentials.iterations) for user in self._users.values()),
                ITERATIONS_DEFAULT)
        return user_decoys.decoy(secret, self._decoy_shape, user)

    def verify_plain(self, user: str, password: str) -> bool:
        record = self._users.get(user)
        decoy_salt, decoy_key, _, decoy_iterations = self.scram_decoy(user)  # for every user: the same work
        if record is None:  # derive all the same, so the time taken does not tell which users exist
            salt, iterations, expected = decoy_salt, decoy_iterations, decoy_key
        else:
            credentials = record.credentials
            salt, iterations, expected = credentials.salt, credentials.iterations, credentials.stored_key
        try:
            stored_key = derive(password, iterations, salt).stored_key
        except InvalidConfig:  # empty, too long or not SASLprep-able: matches no stored key
            return False
        return hmac.compare_digest(stored_key, expected) and record is not None

    # ---- helpers -------------------------------------------------------------------------------

    def _derived_decoy_secret(self) -> bytes:
        return user_decoys.derived_secret((name, user.credentials.salt, user.credentials.stored_key,
                                           user.credentials.server_key) for name, user in self._users.items())

    def _user(self, name: str) -> User:
        if name not in self._users:
            raise NotFound(f"there is no user {name!r}; `grouper user list` shows the users")
        return self._users[name]

    def _known_roles(self, names: object, key: str, bad) -> tuple[str, ...]:
        if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
            raise bad(key, "must be a list of role names")
        for name in names:
            if name != ADMINISTRATOR and name not in self._roles:
                raise bad(key, f"unknown role {name!r}; `grouper role set {name} --allow PERMISSIONS:PATTERN` "
                               f"defines it")
        return tuple(sorted(set(names)))


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
        raise InvalidConfig(culprit, _problem(error)) from None
    database.save(path)
    return name


def stamp(path: str) -> tuple[int, int, int] | None:
    """Changes whenever the file does; None if absent (node.config.files_stamp)."""
    return files_stamp((path,))[0]


def _check_new_password(password: str, chars_min: int) -> None:
    problem = password_problem(password, chars_min)
    if problem:
        raise InvalidConfig("password", problem)


def _strip_one_newline(text: str) -> str:
    for ending in ("\r\n", "\n"):
        if text.endswith(ending):
            return text[:-len(ending)]
    return text


def _problem(error: InvalidConfig) -> str:
    return error.description[len(error.key) + 2:]


def _plain(key: str, problem: str) -> InvalidConfig:
    return InvalidConfig(key, problem)


def _no_duplicate_keys(pairs: list[tuple[str, object]]) -> dict:
    result = {}
    for key, value in pairs:
        if key in result:
            raise ValueError(f"the key {key!r} appears twice in one object")
        result[key] = value
    return result


def _object(value: object, key: str, allowed: set[str] | None, bad) -> dict:
    if not isinstance(value, dict):
        raise bad(key, "must be a JSON object")
    if allowed is not None:
        unknown = sorted(set(value) - allowed)
        if unknown:
            raise bad(f"{key}.{unknown[0]}" if key else unknown[0],
                      f"unknown key; expected {', '.join(sorted(allowed))}")
    return value


def _grant(value: object, key: str, bad) -> Grant:
    entry = _object(value, key, _GRANT_KEYS, bad)
    for field in sorted(_GRANT_KEYS):
        items = entry.get(field)
        if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
            raise bad(f"{key}.{field}", "must be a list of strings")
    try:
        return Grant(frozenset(entry["permissions"]), tuple(entry["queues"]))
    except InvalidConfig as error:
        raise bad(f"{key}.{error.key}", _problem(error)) from None


def _credentials(value: object, key: str, bad) -> Credentials:
    entry = _object(value, key, _SCRAM_KEYS, bad)
    for field in sorted(_SCRAM_KEYS):
        if field not in entry:
            raise bad(f"{key}.{field}", "missing")
    iterations = entry["iterations"]
    if type(iterations) is not int or not ITERATIONS_MIN <= iterations <= ITERATIONS_MAX:
        raise bad(f"{key}.iterations", f"must be an integer {ITERATIONS_MIN}..{ITERATIONS_MAX}")
    salt = _unb64(entry["salt"], f"{key}.salt", bad)
    if len(salt) < SALT_LENGTH_MIN_BYTES:
        raise bad(f"{key}.salt", f"must be at least {SALT_LENGTH_MIN_BYTES} bytes")
    keys = {}
    for field in ("stored_key", "server_key"):
        keys[field] = _unb64(entry[field], f"{key}.{field}", bad)
        if len(keys[field]) != KEY_LENGTH_BYTES:
            raise bad(f"{key}.{field}", f"must be {KEY_LENGTH_BYTES} bytes (a SHA-256 digest)")
    return Credentials(salt, iterations, keys["stored_key"], keys["server_key"])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: object, key: str, bad) -> bytes:
    if not isinstance(text, str):
        raise bad(key, "must be a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise bad(key, "not valid base64") from None
