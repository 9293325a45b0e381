"""Failed logins: when a login attempt is refused unchecked, and how long a failed one's answer waits.

One rule for the AMQP gate (node/amqp/gate.py) and the admin port and /metrics
(node/admin/callers.py). Rules:
- Pure: no clock, socket or thread. Time arrives as `now_ms`; callers on several threads lock.
- A failure counts under three keys: the source address, the user name (whoever claims it, from
  anywhere; a name no user has counts exactly as one that exists, so the throttle tells nothing about
  which users exist) and the pair (address, user name). Per key, failures form a streak while each
  comes less than `failure_window_ms` after the one before. From failure number
  `failures_before_throttle + 1` of a streak on, the key is held `delay_min_ms` after that failure,
  doubled per further failure, at most `delay_max_ms`.
- An attempt is refused unchecked (no password work at all) while a key that applies to it is held,
  and that refusal counts as a failure of each key that held it: guessing in parallel or without
  pause only keeps the guesser out longer.
- A success resets no count. An address's count covers every user tried from it, so one account's
  success (the attacker's own) says nothing about guesses at the others (issue 26: with a success
  resetting it, 24 guesses went unthrottled); a user's count covers every address, so a success
  from one says nothing about guesses from another; and not even the pair's own count, because
  whoever shares that address (one host, NAT) and guesses that user's password would get a fresh
  streak at each of the real client's logins. Streaks end on their own after `failure_window_ms`
  without failures, which is all a user who mistyped waits for.
- A success makes its pair trusted for `trust_ms`: a trusted pair is held only by its own count,
  not by its address's or its user's. So a client that logged in before keeps getting in while
  someone guesses its user's password from elsewhere, or other users' from its address, and it
  lends nothing to guesses at any other user.
- Memory is bounded: at most `addresses_max` addresses, `users_max` user names, `pairs_max` pairs
  with a streak and `trusted_max` trusted pairs at once, each the least recently failed (or
  trusted) forgotten first. User names are kept as 16-byte digests, so a long name costs no more
  than a short one.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict

FAILURES_BEFORE_THROTTLE = 3  # failures in a row under one key before it is held
DELAY_MIN_MS = 250  # the first held failure holds its key this long, doubling per further failure
DELAY_MAX_MS = 10_000  # at most this long after each failure
FAILURE_WINDOW_MS = 60_000  # failures further apart than this start a new streak
TRUST_MS = 86_400_000  # a pair that succeeded is trusted this long after its latest success (a day)
KEYS_MAX = 10_000  # default bound of each table (addresses, users, pairs, trusted pairs): ~200 bytes an entry
USER_DIGEST_BYTES = 16  # a user name is kept as a BLAKE2b digest of this size


class _Streaks:
    """Failure streaks by key, the least recently failed first; at most `entries_max`."""

    def __init__(self, entries_max: int, window_ms: int):
        self.entries_max, self.window_ms = entries_max, window_ms
        self._entries: OrderedDict = OrderedDict()  # key -> [failures in the streak, last failure ms]

    def count(self, key, now_ms: int) -> tuple[int, int]:
        """(failures in the streak, last failure ms); (0, 0) without a streak."""
        entry = self._entries.get(key)
        if entry is None or now_ms - entry[1] >= self.window_ms:
            return 0, 0
        return entry[0], entry[1]

    def failed(self, key, now_ms: int) -> None:
        count, _ = self.count(key, now_ms)
        self._entries.pop(key, None)
        self._entries[key] = [count + 1, now_ms]
        while self._entries:  # the oldest ended streaks, and past the bound the oldest of all
            oldest = next(iter(self._entries.values()))
            if len(self._entries) <= self.entries_max and now_ms - oldest[1] < self.window_ms:
                break
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class FailedLogins:
    def __init__(self, *, failures_before_throttle: int = FAILURES_BEFORE_THROTTLE, delay_min_ms: int = DELAY_MIN_MS,
                 delay_max_ms: int = DELAY_MAX_MS, failure_window_ms: int = FAILURE_WINDOW_MS,
                 trust_ms: int = TRUST_MS, addresses_max: int = KEYS_MAX, users_max: int = KEYS_MAX,
                 pairs_max: int = KEYS_MAX, trusted_max: int = KEYS_MAX):
        assert 0 <= delay_min_ms <= delay_max_ms and failure_window_ms > 0 and trust_ms >= 0
        assert min(addresses_max, users_max, pairs_max, trusted_max) >= 1
        self.failures_before_throttle = failures_before_throttle
        self.delay_min_ms, self.delay_max_ms = delay_min_ms, delay_max_ms
        self.trust_ms = trust_ms
        self.trusted_max = trusted_max
        self._addresses = _Streaks(addresses_max, failure_window_ms)
        self._users = _Streaks(users_max, failure_window_ms)
        self._pairs = _Streaks(pairs_max, failure_window_ms)
        self._trusted: OrderedDict = OrderedDict()  # pair -> trusted until ms, the oldest success first

    # ---- the callers' questions and reports -------------------------------------------------------

    def held(self, address: str, user: str | None, now_ms: int) -> tuple[int, str]:
        """(ms the attempt is still held, which key holds it: "address", "user" or "pair"), or (0, "")."""
        longest_ms, by = 0, ""
        for kind, streaks, key in self._keys(address, user, now_ms):
            held_ms = self._held_ms(streaks, key, now_ms)
            if held_ms > longest_ms:
                longest_ms, by = held_ms, kind
        return longest_ms, by

    def refuse_if_held(self, address: str, user: str | None, now_ms: int) -> tuple[int, str]:
        """As `held`; a held attempt counts as a failure of each key holding it (the hold is then longer)."""
        holding = [(kind, streaks, key) for kind, streaks, key in self._keys(address, user, now_ms)
                   if self._held_ms(streaks, key, now_ms) > 0]
        for _, streaks, key in holding:
            streaks.failed(key, now_ms)
        return self.held(address, user, now_ms) if holding else (0, "")

    def failed(self, address: str, user: str | None, now_ms: int) -> None:
        """A failed check of credentials for `user` (None: no name was given) from `address`."""
        self._addresses.failed(address, now_ms)
        if user is not None:
            digest = _digest(user)
            self._users.failed(digest, now_ms)
            self._pairs.failed((address, digest), now_ms)

    def succeeded(self, address: str, user: str, now_ms: int) -> None:
        pair = (address, _digest(user))
        self._trusted.pop(pair, None)
        self._trusted[pair] = now_ms + self.trust_ms
        while len(self._trusted) > self.trusted_max:
            self._trusted.popitem(last=False)

    def stats(self) -> dict:
        return {"addresses": len(self._addresses), "users": len(self._users), "pairs": len(self._pairs),
                "trusted": len(self._trusted)}

    # ---- bookkeeping --------------------------------------------------------------------------

    def _keys(self, address: str, user: str | None, now_ms: int):
        if user is None:
            return [("address", self._addresses, address)]
        digest = _digest(user)
        pair = (address, digest)
        if self._trusted.get(pair, -1) > now_ms:
            return [("pair", self._pairs, pair)]
        return [("address", self._addresses, address), ("user", self._users, digest), ("pair", self._pairs, pair)]

    def _held_ms(self, streaks: _Streaks, key, now_ms: int) -> int:
        count, last_failure_ms = streaks.count(key, now_ms)
        excess = count - self.failures_before_throttle
        if excess <= 0:
            return 0
        delay_ms = min(self.delay_max_ms, self.delay_min_ms << min(excess - 1, 62))
        return max(0, last_failure_ms + delay_ms - now_ms)


def _digest(user: str) -> bytes:
    return hashlib.blake2b(user.encode("utf-8", "surrogatepass"), digest_size=USER_DIGEST_BYTES).digest()
