"""The users file's format: JSON read and validated into `Contents`, rendered back, written atomically.

Rules:
- File I/O and JSON only: no sockets, threads or clock. What the contents mean at run time (logins,
  decoys, changes, the access table) is node/users.py's.
- Reading validates everything; a bad file is an `InvalidConfig` naming the file and the key path
  (`users.json: users.bob.roles: unknown role 'x'`), so a node refuses it as a whole. A file over
  FILE_SIZE_MAX_BYTES is refused unread, and a key given twice in one object is refused.
- Writing is atomic (a temporary file in the same directory, fsync, rename, fsync of the directory)
  and the file is 0600 before its first byte is written.
- Only SCRAM-derived keys are in the file (node/scram_keys.py), never a password.

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
import json
import os
import tempfile
from dataclasses import dataclass

from node import user_decoys
from node.config import files_stamp
from node.core.access.roles import ADMINISTRATOR, ANONYMOUS, Grant
from node.core.errors import InvalidConfig
from node.scram_keys import ITERATIONS_MAX, ITERATIONS_MIN, KEY_LENGTH_BYTES, SALT_LENGTH_MIN_BYTES, ScramKeys
from node.store.journal import fsync_directory

FILE_NAME = "users.json"  # in the data directory unless given otherwise
FORMAT_VERSION = 1
FILE_SIZE_MAX_BYTES = 16 << 20  # a users file larger than this is refused unread
NAME_LENGTH_MAX_CHARS = 255  # user and role names: 1..255 characters, no control characters
FILE_MODE = 0o600

_TOP_KEYS = {"version", "roles", "anonymous_roles", "decoy_secret", "users"}
_USER_KEYS = {"roles", "scram_sha_256"}
_SCRAM_KEYS = {"salt", "iterations", "stored_key", "server_key"}
_GRANT_KEYS = {"permissions", "queues"}


@dataclass(frozen=True)
class User:
    roles: tuple[str, ...]
    keys: ScramKeys


@dataclass
class Contents:
    roles: dict[str, tuple[Grant, ...]]
    anonymous_roles: tuple[str, ...]
    users: dict[str, User]
    decoy_secret: bytes | None  # None: the file has none (derived from the users until saved)


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


def known_roles(names: object, key: str, bad, roles: dict) -> tuple[str, ...]:
    """`names` as a sorted tuple once each names ADMINISTRATOR or a role of `roles`; `bad(key, problem)`
    makes the error otherwise."""
    if not isinstance(names, list) or not all(isinstance(name, str) for name in names):
        raise bad(key, "must be a list of role names")
    for name in names:
        if name != ADMINISTRATOR and name not in roles:
            raise bad(key, f"unknown role {name!r}; `grouper role set {name} --allow PERMISSIONS:PATTERN` "
                           f"defines it")
    return tuple(sorted(set(names)))


def problem_of(error: InvalidConfig) -> str:
    """An InvalidConfig's description without its key, to name another key instead."""
    return error.description[len(error.key) + 2:]


def stamp(path: str) -> tuple[int, int, int] | None:
    """Changes whenever the file does; None if absent (node.config.files_stamp)."""
    return files_stamp((path,))[0]


# ---- reading ----------------------------------------------------------------------------------

def read(path: str) -> object:
    """The file's JSON, unvalidated (`parse` checks it)."""
    with open(path, "rb") as file:  # FileNotFoundError: the caller says how to make one
        raw = file.read(FILE_SIZE_MAX_BYTES + 1)
    if len(raw) > FILE_SIZE_MAX_BYTES:
        raise InvalidConfig(str(path), f"larger than {FILE_SIZE_MAX_BYTES} bytes")
    try:
        return json.loads(raw.decode("utf-8"), object_pairs_hook=_no_duplicate_keys)
    except (UnicodeDecodeError, ValueError) as error:
        raise InvalidConfig(str(path), f"not valid JSON: {error}") from None


def parse(data: object, source: str = FILE_NAME) -> Contents:
    def bad(key: str, problem: str) -> InvalidConfig:
        return InvalidConfig(f"{source}: {key}" if key else source, problem)

    top = _object(data, "", _TOP_KEYS, bad)
    if type(top.get("version")) is not int or top["version"] != FORMAT_VERSION:
        raise bad("version", f"must be {FORMAT_VERSION}, found {top.get('version')!r}")
    contents = Contents(_roles(top.get("roles", {}), bad), (), {}, None)
    contents.anonymous_roles = known_roles(top.get("anonymous_roles", []), "anonymous_roles", bad, contents.roles)
    if "decoy_secret" in top:
        contents.decoy_secret = _unb64(top["decoy_secret"], "decoy_secret", bad)
        if len(contents.decoy_secret) != user_decoys.SECRET_BYTES:
            raise bad("decoy_secret", f"must be {user_decoys.SECRET_BYTES} bytes")
    for name, entry in sorted(_object(top.get("users", {}), "users", None, bad).items()):
        key = f"users.{name}"
        if name_problem(name):
            raise bad(key, name_problem(name))
        if name == ANONYMOUS:
            raise bad(key, f"{ANONYMOUS!r} is reserved for clients that do not log in; use anonymous_roles")
        entry = _object(entry, key, _USER_KEYS, bad)
        roles = known_roles(entry.get("roles", []), f"{key}.roles", bad, contents.roles)
        if "scram_sha_256" not in entry:
            raise bad(f"{key}.scram_sha_256", "missing")
        contents.users[name] = User(roles, _keys(entry["scram_sha_256"], f"{key}.scram_sha_256", bad))
    return contents


def _roles(value: object, bad) -> dict[str, tuple[Grant, ...]]:
    roles = {}
    for name, grants in sorted(_object(value, "roles", None, bad).items()):
        key = f"roles.{name}"
        if name_problem(name):
            raise bad(key, name_problem(name))
        if name == ADMINISTRATOR:
            raise bad(key, "is built in (every permission on '#') and cannot be redefined")
        if not isinstance(grants, list) or not grants:
            raise bad(key, "must be a list of at least one grant")
        roles[name] = tuple(_grant(grant, f"{key}.{index}", bad) for index, grant in enumerate(grants))
    return roles


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
        raise bad(f"{key}.{error.key}", problem_of(error)) from None


def _keys(value: object, key: str, bad) -> ScramKeys:
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
    return ScramKeys(salt, iterations, keys["stored_key"], keys["server_key"])


def _unb64(text: object, key: str, bad) -> bytes:
    if not isinstance(text, str):
        raise bad(key, "must be a base64 string")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise bad(key, "not valid base64") from None


# ---- writing ----------------------------------------------------------------------------------

def render(contents: Contents) -> dict:
    return {
        "version": FORMAT_VERSION,
        "roles": {name: [{"permissions": sorted(p.value for p in grant.permissions), "queues": list(grant.queues)}
                         for grant in grants] for name, grants in sorted(contents.roles.items())},
        "anonymous_roles": list(contents.anonymous_roles),
        **({"decoy_secret": _b64(contents.decoy_secret)} if contents.decoy_secret is not None else {}),
        "users": {name: {"roles": list(user.roles), "scram_sha_256": {
            "salt": _b64(user.keys.salt), "iterations": user.keys.iterations,
            "stored_key": _b64(user.keys.stored_key), "server_key": _b64(user.keys.server_key)}}
            for name, user in sorted(contents.users.items())},
    }


def write(path: str, data: dict) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    text = json.dumps(data, indent=2) + "\n"
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


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
