"""Decoys: what a login as a user the users file does not have is told and checked against.

Rules:
- Pure: no file, clock or randomness; node/users.py holds the secret and the users.
- A decoy is shaped like the file's users: the salt length and iteration count they have most often
  (ties to the larger; SALT_LENGTH_DEFAULT_BYTES and 4096 with no users), and its salt, StoredKey
  and ServerKey are HMAC-SHA-256s of the name under the file's `decoy_secret`. So every node reading
  the file gives a name the same decoy, every time: asking twice, or asking another node, tells
  nothing. No SCRAM proof or PLAIN password hashes to a decoy's StoredKey.
- The secret: 32 random bytes the users file keeps (`decoy_secret`), drawn when it is first written.
  A file written before that field existed gets, while it lacks one, `derived_secret` of its users'
  stored keys (as secret as the file, the same on every node), and its next save stores that very
  value, so no decoy changes when the field appears. A file with no users has nothing to hide: it
  gets a random one at its next save.
- Computing a decoy costs three HMACs; the callers compute one for known users too, so the time
  taken does not tell which users exist.
"""

from __future__ import annotations

import hashlib
import hmac

SECRET_BYTES = 32
SALT_LENGTH_DEFAULT_BYTES = 32  # what scramp draws for a new password
_DERIVED_SECRET_LABEL = b"grouper users.json decoy secret v1\x00"


def derived_secret(users) -> bytes:
    """From (name, salt, stored_key, server_key) of each user, in any order."""
    digest = hashlib.sha256(_DERIVED_SECRET_LABEL)
    for name, *keys in sorted(users):
        for part in (name.encode("utf-8", "surrogatepass"), *keys):
            digest.update(len(part).to_bytes(4, "big") + part)
    return digest.digest()


def typical_shape(shapes, iterations_default: int) -> tuple[int, int]:
    """(salt bytes, iterations) the users have most often, from one (salt bytes, iterations) per user."""
    counts: dict[tuple[int, int], int] = {}
    for shape in shapes:
        counts[shape] = counts.get(shape, 0) + 1
    if not counts:
        return SALT_LENGTH_DEFAULT_BYTES, iterations_default
    return max(counts, key=lambda shape: (counts[shape], shape))


def decoy(secret: bytes, shape: tuple[int, int], user: str) -> tuple[bytes, bytes, bytes, int]:
    """(salt, stored_key, server_key, iterations), as scramp's auth_fn returns a real user's."""
    salt_bytes, iterations = shape
    name = user.encode("utf-8", "surrogatepass")
    salt = hashlib.shake_256(hmac.new(secret, b"salt\x00" + name, hashlib.sha256).digest()).digest(salt_bytes)
    stored_key = hmac.new(secret, b"stored_key\x00" + name, hashlib.sha256).digest()
    server_key = hmac.new(secret, b"server_key\x00" + name, hashlib.sha256).digest()
    return salt, stored_key, server_key, iterations
