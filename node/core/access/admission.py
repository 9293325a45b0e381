"""Limits on a source address before it has authenticated: connections open, and failed attempts.

Rules:
- Pure: no clock, socket or thread. Time arrives as `now_ms`; the adapter carries out the answers
  (refuses the socket, holds a failed outcome back `delay_ms`, logs a refusal or not).
- Connections open from one address are capped at `connections_per_address_max`.
- Failures from one address form a streak while each comes less than `failure_window_ms` after the
  one before; a quiet window ends it, and so does a success. From failure number
  `failures_before_throttle + 1` of a streak on, the outcome of each failed attempt is held back
  `throttle_delay_min_ms`, doubled per further failure, at most `throttle_delay_max_ms`.
- Memory is bounded. An address is tracked only while it has a connection open or a failure streak,
  and at most `addresses_tracked_max` addresses at once. At that cap a new address takes the place
  of the tracked address idle longest (none open: its throttle is forgotten early); if every tracked
  address has a connection open, the new address is refused. Refusals are logged once per
  (address, reason), remembering at most `refusals_remembered_max` pairs, the oldest forgotten first.
"""

from __future__ import annotations

from collections import OrderedDict


class _Address:
    __slots__ = ("open_count", "failure_count", "last_failure_ms")

    def __init__(self):
        self.open_count = 0
        self.failure_count = 0  # in the current streak
        self.last_failure_ms = 0


class Admission:
    def __init__(self, *, connections_per_address_max: int = 1_000, failures_before_throttle: int = 3,
                 throttle_delay_min_ms: int = 250, throttle_delay_max_ms: int = 10_000,
                 failure_window_ms: int = 60_000, addresses_tracked_max: int = 100_000,
                 refusals_remembered_max: int = 10_000):
        assert connections_per_address_max >= 1 and addresses_tracked_max >= 1 and refusals_remembered_max >= 1
        assert 0 <= throttle_delay_min_ms <= throttle_delay_max_ms and failure_window_ms > 0
        self.connections_per_address_max = connections_per_address_max
        self.failures_before_throttle = failures_before_throttle
        self.throttle_delay_min_ms = throttle_delay_min_ms
        self.throttle_delay_max_ms = throttle_delay_max_ms
        self.failure_window_ms = failure_window_ms
        self.addresses_tracked_max = addresses_tracked_max
        self.refusals_remembered_max = refusals_remembered_max
        self.too_many_connections = (f"{connections_per_address_max} connections are open from this address, "
                                     f"the limit (connections_per_address_max): the client must close some first")
        self.too_many_addresses = (f"the node tracks {addresses_tracked_max} source addresses, all with "
                                   f"connections open (addresses_tracked_max): new addresses wait until some close")
        self._addresses: dict[str, _Address] = {}
        self._idle: OrderedDict[str, None] = OrderedDict()  # none open: tracked for a streak; oldest first
        self._refusals_logged: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._latest_ms = 0  # the latest now_ms given, for the calls that take none

    def opened(self, address: str, now_ms: int) -> str | None:
        """None: admitted (call `closed` later). Otherwise why the connection is refused."""
        self._tick(now_ms)
        record = self._addresses.get(address) or self._track(address)
        if record is None:
            return self.too_many_addresses
        if record.open_count >= self.connections_per_address_max:
            return self.too_many_connections
        record.open_count += 1
        self._idle.pop(address, None)
        return None

    def closed(self, address: str) -> None:
        record = self._addresses.get(address)
        assert record is not None and record.open_count > 0, f"closed({address!r}) without opened"
        record.open_count -= 1
        if record.open_count == 0:
            self._idle[address] = None
            self._forget_if_quiet(address, record)

    def failed(self, address: str, now_ms: int) -> None:
        self._tick(now_ms)
        record = self._addresses.get(address) or self._track(address)
        if record is None:
            return  # every tracked address has a connection open: this failure goes uncounted
        if self._streak(record, now_ms) == 0:
            record.failure_count = 0
        record.failure_count += 1
        record.last_failure_ms = now_ms
        if record.open_count == 0:
            self._idle[address] = None
            self._idle.move_to_end(address)

    def succeeded(self, address: str) -> None:
        record = self._addresses.get(address)
        if record is not None:
            record.failure_count = 0
            self._forget_if_quiet(address, record)

    def delay_ms(self, address: str, now_ms: int) -> int:
        """How long to hold back the outcome of a failed attempt from `address` (after `failed`)."""
        record = self._addresses.get(address)
        excess = (self._streak(record, now_ms) if record else 0) - self.failures_before_throttle
        if excess <= 0:
            return 0
        return min(self.throttle_delay_max_ms, self.throttle_delay_min_ms << min(excess - 1, 62))

    def held_ms(self, address: str, now_ms: int) -> int:
        """How much longer an attempt from `address` is held back: the delay its last failure asked for
        (`delay_ms` at that failure), counted from that failure; 0 when not throttled. For adapters
        that refuse attempts unchecked while held rather than hold each answer back."""
        record = self._addresses.get(address)
        if record is None or self._streak(record, now_ms) == 0:
            return 0
        return max(0, record.last_failure_ms + self.delay_ms(address, record.last_failure_ms) - now_ms)

    def refusal_should_be_logged(self, address: str, reason: str) -> bool:
        key = (address, reason)
        if key in self._refusals_logged:
            return False
        self._refusals_logged[key] = None
        if len(self._refusals_logged) > self.refusals_remembered_max:
            self._refusals_logged.popitem(last=False)
        return True

    def stats(self) -> dict:
        return {"addresses_tracked": len(self._addresses), "addresses_idle": len(self._idle),
                "refusals_remembered": len(self._refusals_logged)}

    # ---- bookkeeping -------------------------------------------------------------------------

    def _streak(self, record: _Address, now_ms: int) -> int:
        quiet = now_ms - record.last_failure_ms >= self.failure_window_ms
        return 0 if quiet else record.failure_count

    def _tick(self, now_ms: int) -> None:
        """Forget idle addresses whose streak has ended, oldest first, while the oldest has."""
        self._latest_ms = max(self._latest_ms, now_ms)
        while self._idle:
            address = next(iter(self._idle))
            if self._streak(self._addresses[address], self._latest_ms):
                return
            del self._idle[address], self._addresses[address]

    def _forget_if_quiet(self, address: str, record: _Address) -> None:
        if record.open_count == 0 and self._streak(record, self._latest_ms) == 0:
            del self._addresses[address]
            self._idle.pop(address, None)

    def _track(self, address: str) -> _Address | None:
        if len(self._addresses) >= self.addresses_tracked_max:
            if not self._idle:
                return None
            forgotten, _ = self._idle.popitem(last=False)
            del self._addresses[forgotten]
        record = self._addresses[address] = _Address()
        return record
