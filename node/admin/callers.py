"""Who calls the admin API or the HTTP port: credentials in a call, their check, and what a caller may see.

Rules:
- No gRPC, HTTP or sockets here, and no clock: time is `now_ms`, an argument. Passwords are checked
  by the `Verifier` passed in (`node.security.Security`); the adapters (`node.admin.service`,
  `node.http_port.server`) hand over the header and the verified certificate name they received, from their
  pool threads, so the cache takes a lock (held for dict operations only, never for a derivation).
- A node without a users file is open: every caller is `anonymous` with every permission, and
  credentials are not looked at, as before security existed.
- With a users file every call needs an identity: `authorization: Basic base64(user:password)` (RFC
  7617; gRPC metadata or the HTTP header), or else a client certificate the admin TLS CA verified,
  whose subject CN is the user. Credentials given win over the certificate. `allow_anonymous` is for
  AMQP clients only: the management API never takes anonymous callers beside a users file.
- Successful password checks are remembered for VERIFIED_TTL_MS, at most VERIFIED_MAX entries, keyed
  by an HMAC of user and password under a key of this process (never the password itself), and only
  for the users file they were checked against: a CLI command's several calls pay PBKDF2 once, and a
  changed password or a deleted user is refused from the file's next reload on. Failures are never
  remembered: each one costs the caller a full derivation.
- Refusals (`Unauthenticated`) say that the caller is at fault and what to give instead.
- Failed password checks are throttled by node.core.access.failed_logins (one rule with the AMQP gate):
  per source address, per user name and per pair of both, from failure number
  FAILURES_BEFORE_THROTTLE + 1 of a streak (failures less than FAILURE_WINDOW_MS apart) a call with
  credentials that a held key applies to is refused unchecked until THROTTLE_DELAY_MIN_MS after the
  failure, doubled per further failure up to THROTTLE_DELAY_MAX_MS. An attempt refused that way
  counts as a failure too, so guessing in parallel or without pause only keeps the guesser out
  longer: it is checked again only after a whole delay without attempts. Refusing rather than
  holding an answer back spends neither a pool thread nor a PBKDF2 derivation on a guesser. A
  success (a password this node verified within VERIFIED_TTL_MS still succeeds while held) resets
  no count but trusts its (address, user) pair, which its address's and user's holds then spare
  (failed_logins says why); callers with no source address (tests of the API alone) are not
  throttled. Memory: at most THROTTLE_KEYS_MAX entries in each of the throttle's four tables (about
  200 bytes each, ~8 MB in all).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import os
import threading
from dataclasses import dataclass
from typing import Protocol

from node.core.access.roles import ANONYMOUS, Access, Permission
from node.core.access.failed_logins import FailedLogins
from node.core.errors import GrouperError, InvalidConfig, Unauthorized

AUTHORIZATION_KEY = "authorization"  # gRPC metadata key (lower case, as gRPC requires); HTTP's header name
BASIC_SCHEME = "Basic"
HEADER_LENGTH_MAX_CHARS = 4096  # a longer authorization value is refused unread (names and passwords are shorter)
VERIFIED_TTL_MS = 60_000  # how long a successful password check is remembered
VERIFIED_MAX = 1000  # password checks remembered at once; the oldest goes first
EVERY_QUEUE = "#"  # cluster-wide methods and /metrics need `manage` on this pattern
FAILURES_BEFORE_THROTTLE = 3  # failed password checks in a row from one address before the throttle starts
THROTTLE_DELAY_MIN_MS = 250  # the first throttled failure holds its address back this long, doubling after
THROTTLE_DELAY_MAX_MS = 10_000  # at most this long after each failure
FAILURE_WINDOW_MS = 60_000  # failures further apart than this start a new streak
THROTTLE_KEYS_MAX = 10_000  # addresses, user names, pairs with a failure streak and trusted pairs: each at most this
CREDENTIALS_HINT = ("give --user NAME and a password (--password-stdin, $GROUPER_PASSWORD or the prompt), "
                    "or a client certificate with --cert and --key")


class Unauthenticated(GrouperError):
    """No usable identity: credentials missing, malformed or wrong. The caller must give valid ones."""

    fault = "client"


class Verifier(Protocol):
    database: object  # the users file in force; None: an open node
    login_throttle: "LoginThrottle"  # optional: shared by every Authenticator of one node

    def verify_plain(self, user: str, password: str) -> bool: ...


@dataclass(frozen=True)
class Caller:
    user: str
    # what the node passes on when it asks the other members on this caller's behalf: its own credentials
    forwarded: tuple[tuple[str, str], ...] = ()
    by_certificate: bool = False


OPEN_CALLER = Caller(ANONYMOUS)


# ---- the header ------------------------------------------------------------------------------

def basic_value(user: str, password: str) -> str:
    if ":" in user:
        raise InvalidConfig("--user", f"{user!r} holds a ':', which Basic credentials cannot carry in a user name")
    return f"{BASIC_SCHEME} " + base64.b64encode(f"{user}:{password}".encode()).decode("ascii")


def basic_metadata(user: str, password: str) -> tuple[tuple[str, str], ...]:
    return ((AUTHORIZATION_KEY, basic_value(user, password)),)


def parse_basic(value: str) -> tuple[str, str]:
    """(user, password) from `Basic base64(user:password)`; Unauthenticated saying what is wrong otherwise."""
    if len(value) > HEADER_LENGTH_MAX_CHARS:
        raise Unauthenticated(f"the authorization value is longer than {HEADER_LENGTH_MAX_CHARS} characters; "
                              f"expected '{BASIC_SCHEME} base64(user:password)'")
    scheme, _, encoded = value.strip().partition(" ")
    if scheme.lower() != BASIC_SCHEME.lower():
        raise Unauthenticated(f"the authorization scheme {scheme[:20]!r} is not supported; expected "
                              f"'{BASIC_SCHEME} base64(user:password)'")
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        raise Unauthenticated(f"the {BASIC_SCHEME} credentials are not base64 of UTF-8 'user:password'") from None
    user, separator, password = decoded.partition(":")
    if not separator or not user:
        raise Unauthenticated(f"the {BASIC_SCHEME} credentials hold no 'user:password' pair")
    return user, password


def authorization_of(metadata) -> str | None:
    """The one authorization value of a call's metadata ((key, value) pairs), or None without one."""
    values = [value for key, value in metadata if key.lower() == AUTHORIZATION_KEY]
    if len(values) > 1:
        raise Unauthenticated(f"the call carries {len(values)} authorization values; send one")
    if values and not isinstance(values[0], str):
        raise Unauthenticated("the authorization value is binary; send 'Basic base64(user:password)' as text")
    return values[0] if values else None


# ---- checking --------------------------------------------------------------------------------

class VerifiedCache:
    """Successful (user, password) checks, remembered for `ttl_ms` and for one users file."""

    def __init__(self, ttl_ms: int = VERIFIED_TTL_MS, entries_max: int = VERIFIED_MAX, key: bytes | None = None):
        if ttl_ms < 1 or entries_max < 1:
            raise ValueError(f"ttl_ms and entries_max must be >= 1, got {ttl_ms} and {entries_max}")
        self._ttl_ms = ttl_ms
        self._entries_max = entries_max
        self._key = key if key is not None else os.urandom(32)
        self._lock = threading.Lock()
        self._database = None
        self._verified_until_ms: dict[bytes, int] = {}  # insertion order: the oldest first

    def _digest(self, user: str, password: str) -> bytes:
        return hmac.new(self._key, f"{user}\x00{password}".encode("utf-8", "surrogatepass"), hashlib.sha256).digest()

    def verified(self, database, user: str, password: str, now_ms: int) -> bool:
        digest = self._digest(user, password)
        with self._lock:
            if database is not self._database:
                return False
            until_ms = self._verified_until_ms.get(digest)
        return until_ms is not None and now_ms < until_ms

    def remember(self, database, user: str, password: str, now_ms: int) -> None:
        digest = self._digest(user, password)
        with self._lock:
            if database is not self._database:  # another users file: nothing checked against the old one holds
                self._database = database
                self._verified_until_ms.clear()
            self._verified_until_ms.pop(digest, None)
            while len(self._verified_until_ms) >= self._entries_max:
                del self._verified_until_ms[next(iter(self._verified_until_ms))]
            self._verified_until_ms[digest] = now_ms + self._ttl_ms

    def __len__(self) -> int:
        return len(self._verified_until_ms)


class LoginThrottle:
    """Failed password checks by address and user (node.core.access.failed_logins), for pool threads."""

    def __init__(self):
        self._lock = threading.Lock()  # FailedLogins is plain, single-threaded code
        self._failed_logins = FailedLogins(
            failures_before_throttle=FAILURES_BEFORE_THROTTLE, delay_min_ms=THROTTLE_DELAY_MIN_MS,
            delay_max_ms=THROTTLE_DELAY_MAX_MS, failure_window_ms=FAILURE_WINDOW_MS, addresses_max=THROTTLE_KEYS_MAX,
            users_max=THROTTLE_KEYS_MAX, pairs_max=THROTTLE_KEYS_MAX, trusted_max=THROTTLE_KEYS_MAX)

    def refuse_if_held(self, source: str, user: str, now_ms: int) -> None:
        """Unauthenticated if an attempt for `user` from `source` is held back; the refusal counts as a failure."""
        if not source:
            return
        with self._lock:
            held_ms, by = self._failed_logins.refuse_if_held(source, user, now_ms)
        if held_ms > 0:
            who = {"address": f"from {source}", "user": f"for user {user!r}",
                   "pair": f"for user {user!r} from {source}"}[by]
            raise Unauthenticated(f"too many failed logins in a row {who}: credentials are not checked there for "
                                  f"another {held_ms} ms (after {FAILURES_BEFORE_THROTTLE} failures each one holds "
                                  f"back {THROTTLE_DELAY_MIN_MS} ms, doubling up to {THROTTLE_DELAY_MAX_MS} ms); "
                                  f"wait without retrying, then give the right password")

    def failed(self, source: str, user: str, now_ms: int) -> None:
        if source:
            with self._lock:
                self._failed_logins.failed(source, user, now_ms)

    def succeeded(self, source: str, user: str, now_ms: int) -> None:
        if source:
            with self._lock:
                self._failed_logins.succeeded(source, user, now_ms)

    def stats(self) -> dict:
        with self._lock:
            return self._failed_logins.stats()


class Authenticator:
    """Turns what a call carries into a `Caller`, or raises Unauthenticated. Called from gRPC and HTTP
    pool threads at once: it reads the verifier's database once per call and the cache is locked."""

    def __init__(self, verifier: Verifier | None, cache: VerifiedCache | None = None):
        self._verifier = verifier
        self._cache = cache if cache is not None else VerifiedCache()
        # one per node, shared by the admin port and /metrics (node.security.Security has it), so a
        # guesser gains nothing by switching ports
        self._throttle = getattr(verifier, "login_throttle", None) or LoginThrottle()

    @property
    def open(self) -> bool:
        return self._verifier is None or self._verifier.database is None

    def identify(self, authorization: str | None, certificate_user: str | None, now_ms: int,
                 source: str = "") -> Caller:
        """`source`: the caller's address, for the throttle ("" for none)."""
        if self.open:  # credentials given are not checked, only passed on to the other members
            return OPEN_CALLER if authorization is None else Caller(ANONYMOUS, ((AUTHORIZATION_KEY, authorization),))
        if authorization is not None:
            user, password = parse_basic(authorization)
            database = self._verifier.database
            if not self._cache.verified(database, user, password, now_ms):
                self._throttle.refuse_if_held(source, user, now_ms)
                if not self._verifier.verify_plain(user, password):
                    self._throttle.failed(source, user, now_ms)
                    raise Unauthenticated(f"user {user!r}: unknown user or wrong password; check --user and the "
                                          f"password, or have an administrator set it with "
                                          f"`grouper user passwd {user}`")
                self._cache.remember(database, user, password, now_ms)
            self._throttle.succeeded(source, user, now_ms)
            return Caller(user, forwarded=((AUTHORIZATION_KEY, authorization),))
        if certificate_user == ANONYMOUS:  # its roles are for clients that did not log in
            raise Unauthenticated(f"a client certificate named {ANONYMOUS!r} identifies nobody; {CREDENTIALS_HINT}")
        if certificate_user:
            return Caller(certificate_user, by_certificate=True)
        raise Unauthenticated(f"this node has a users file, so admin calls need credentials: {CREDENTIALS_HINT}")


# ---- deciding --------------------------------------------------------------------------------

def check_manage(access: Access, caller: Caller, queues) -> None:
    """`manage` on each queue named; Unauthorized (naming user, queue and the grant) otherwise."""
    for queue in queues:
        try:
            access.check(caller.user, Permission.MANAGE, queue)
        except Unauthorized as error:
            if queue != EVERY_QUEUE:
                raise
            raise Unauthorized(f"cluster status and membership changes need manage on every queue ('#'): "
                               f"{error.description}") from None


def may_see(access: Access, caller: Caller, queue: str) -> bool:
    """A queue's row in a listing: shown to whoever may manage or browse it (its depth is no secret to them)."""
    return (access.allows(caller.user, Permission.MANAGE, queue)
            or access.allows(caller.user, Permission.BROWSE, queue))
