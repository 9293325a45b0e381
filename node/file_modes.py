"""File modes of a node's data and of the secrets it reads: private to their owner.

Rules:
- A node creates its files under umask 0077 (`keep_private`, the first thing `grouper node` and
  `grouper up` do): every file it or its raft member process writes (journals with their paged
  bodies, traces, the raft journal and dump, the users file, `grouper up`'s logs) is 0600 and every
  directory 0700, whatever the code that creates it asks for. The store asks for 0600 and 0700 too,
  so a node run inside another process (tests) is private as well.
- An existing data directory that its group or others may enter is tightened to 0700 at start and
  the change is logged; one this user does not own (a Kubernetes volume's root) is logged, not failed.
  Its files then need no tightening: nobody else can reach them.
- A secret file (the users file, every `*_key_file`, `*_secret_file`, `*_credential_file` and
  `*_password_file` setting, the first administrator's password file) must not be readable or
  writable by others nor writable by its group. Readable by its group only when another user owns
  it: that is how Kubernetes mounts a Secret (root-owned, group fsGroup, 0440 whatever defaultMode
  says) and how PostgreSQL accepts a root-owned key 0640; a file the node's own user owns needs no
  group and must be 0600 or tighter.
- A loose secret file is a warning naming the file and the `chmod 600` that fixes it; in production
  mode (a user database on a non-loopback host, the condition of node/peer/cluster_secrets.py's
  secure-by-default refusal) the node refuses to start, unless allow_loose_secret_files says so.
- `secret_file_problem`, `production_mode` and `secret_file_verdict` are pure; `secure_start` is the
  one adapter (umask, chmod, stat, log).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import stat

from node.core.errors import GrouperError
from node.net import is_loopback
from node.store.journal import DIRECTORY_MODE, FILE_MODE
from node.users import DEFAULT_PASSWORD_FILE_ENV, DEFAULT_USER_ENV

log = logging.getLogger("grouper.files")

PRIVATE_UMASK = 0o077  # new files 0600, new directories 0700
# config settings naming a secret file, by their names' ends: a new one is checked without a change here
SECRET_SETTING_SUFFIXES = ("_key_file", "_secret_file", "_credential_file", "_password_file")


@dataclasses.dataclass(frozen=True)
class SecretFile:
    setting: str  # the setting or environment variable that names it
    path: str
    mode: int  # st_mode's permission bits
    owned_by_node: bool  # owned by the node process's effective user


def keep_private() -> None:
    """Every file and directory this process (and its children) creates from now is its user's only."""
    os.umask(PRIVATE_UMASK)


def production_mode(users_database: bool, host: str) -> bool:
    return users_database and not is_loopback(host)


def secret_file_problem(mode: int, owned_by_node: bool) -> str | None:
    """What is wrong with a secret file's permission bits, or None."""
    if mode & stat.S_IRWXO:
        return "readable or writable by every local user"
    if mode & stat.S_IWGRP:
        return "writable by its group"
    if mode & (stat.S_IRGRP | stat.S_IXGRP) and owned_by_node:
        return "readable by its group"
    return None


def secret_file_verdict(files, production: bool, allow_loose: bool) -> tuple[list[str], str | None]:
    """(warnings, refusal or None) for the node's secret files (SecretFile each)."""
    warnings = []
    for file in files:
        problem = secret_file_problem(file.mode, file.owned_by_node)
        if problem:
            warnings.append(f"secret file {file.path} ({file.setting}) is {problem} (mode {file.mode:04o}): "
                            f"run `chmod 600 {file.path}` (a mounted Kubernetes Secret: defaultMode 0400)")
    if not warnings or not production or allow_loose:
        return warnings, None
    return warnings, (f"{len(warnings)} secret file(s) are open to other local users on a node with users on a "
                      f"non-loopback host: {'; '.join(warnings)}; or set allow_loose_secret_files = true "
                      f"(GROUPER_ALLOW_LOOSE_SECRET_FILES=true) to start anyway")


def secret_settings(config, environ) -> list[tuple[str, str]]:
    """(setting, path) of every secret file the node reads, set or not yet existing ones left out."""
    named = [(field.name, getattr(config, field.name)) for field in dataclasses.fields(config)
             if field.name.endswith(SECRET_SETTING_SUFFIXES)]
    named += [("users_file", config.users_path()), (DEFAULT_PASSWORD_FILE_ENV, environ.get(DEFAULT_PASSWORD_FILE_ENV))]
    return [(setting, path) for setting, path in named if path]


def secure_start(config, environ=None) -> None:
    """At a node's start, before it creates anything: umask, data directory, secret files.
    Raises GrouperError when production mode refuses a loose secret file."""
    environ = os.environ if environ is None else environ
    keep_private()
    _tighten_directory(config.data_dir)
    uid = os.geteuid()
    files = []
    for setting, path in secret_settings(config, environ):
        try:
            status = os.stat(path)
        except OSError:  # absent or unreadable: the code that reads it says so, with its own context
            continue
        files.append(SecretFile(setting, path, stat.S_IMODE(status.st_mode), status.st_uid == uid))
    users_database = os.path.exists(config.users_path()) or bool(environ.get(DEFAULT_USER_ENV))
    warnings, refusal = secret_file_verdict(files, production_mode(users_database, config.host),
                                            config.allow_loose_secret_files)
    for warning in warnings:
        log.warning("%s", warning)
    if refusal:
        raise GrouperError(refusal)


def _tighten_directory(path: str) -> None:
    try:
        status = os.stat(path)
    except OSError:
        return  # made later, under the umask (0700), or unusable, which the journal names when it opens it
    mode = stat.S_IMODE(status.st_mode)
    if not mode & (stat.S_IRWXG | stat.S_IRWXO):
        return
    try:
        os.chmod(path, mode & ~(stat.S_IRWXG | stat.S_IRWXO))
    except OSError as error:
        log.warning("data directory %s is mode %04o and cannot be made %04o (%s): its files are %04o, so "
                    "others may list their names but not read them", path, mode, DIRECTORY_MODE,
                    error.strerror, FILE_MODE)
        return
    log.info("data directory %s was mode %04o; made it %04o (its owner only)", path, mode,
             mode & ~(stat.S_IRWXG | stat.S_IRWXO))
