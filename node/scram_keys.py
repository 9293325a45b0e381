"""A user's SCRAM-SHA-256 keys (RFC 5802, RFC 7677): derived from a password and stored instead of it.

Rules:
- Pure: no files, sockets, threads or clock. node/users_file.py stores these keys; node/users.py
  derives them for a new password and again, with the stored salt and iterations, for a PLAIN login.
- Only the derived keys (salt, iterations, StoredKey, ServerKey) leave `derive`, never the password.
- A new password has at least `password_chars_min` characters (PASSWORD_CHARS_MIN_DEFAULT unless the
  node's setting says otherwise; `check_new_password`); a login's password is only compared, whatever
  its length.
- Failures are `InvalidConfig` keyed "password" or "iterations", saying what to change.
"""

from __future__ import annotations

from dataclasses import dataclass

import scramp

from node.core.errors import InvalidConfig

PASSWORD_LENGTH_MAX_CHARS = 1024  # passwords: 1..1024 characters (after SASLprep)
PASSWORD_CHARS_MIN_DEFAULT = 12  # a new password's fewest characters (node/config/settings.py's password_chars_min default)
ITERATIONS_MIN = 4096  # PBKDF2 rounds; RFC 7677's minimum for SCRAM-SHA-256
ITERATIONS_DEFAULT = 4096
ITERATIONS_MAX = 10_000_000  # scramp's ceiling (a guard against a file that makes every login cost minutes)
SALT_LENGTH_MIN_BYTES = 12  # scramp refuses shorter salts
KEY_LENGTH_BYTES = 32  # SHA-256 digests

_MECHANISM = scramp.ScramMechanism("SCRAM-SHA-256")


@dataclass(frozen=True)
class ScramKeys:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def password_problem(password: str, chars_min: int) -> str | None:
    """Why a new password is refused, or None."""
    if isinstance(password, str) and 0 < len(password) < chars_min:
        return (f"has {len(password)} characters, fewer than the {chars_min} required (password_chars_min); "
                f"choose a longer one, such as a few random words")
    return None


def check_new_password(password: str, chars_min: int) -> None:
    problem = password_problem(password, chars_min)
    if problem:
        raise InvalidConfig("password", problem)


def derive(password: str, iterations: int = ITERATIONS_DEFAULT, salt: bytes | None = None) -> ScramKeys:
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
    return ScramKeys(salt, iterations, stored_key, server_key)
