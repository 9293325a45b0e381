"""Admission before authentication: connections per address, failure throttling, bounded memory.

The hypothesis test runs random opens, closes, failures, successes and quiet periods against a naive
model that keeps every failure time and never forgets anything.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from node.core.access.admission import Admission

LIMITS = dict(connections_per_address_max=2, failures_before_throttle=3, throttle_delay_min_ms=250,
              throttle_delay_max_ms=2_000, failure_window_ms=60_000)


def test_connections_from_one_address_are_capped_and_a_close_makes_room():
    admission = Admission(**LIMITS)
    assert admission.opened("10.0.0.1", 0) is None
    assert admission.opened("10.0.0.1", 0) is None
    refusal = admission.opened("10.0.0.1", 0)
    assert "connections_per_address_max" in refusal
    assert admission.opened("10.0.0.2", 0) is None  # another address is not affected
    admission.closed("10.0.0.1")
    assert admission.opened("10.0.0.1", 0) is None


def test_failures_are_free_until_the_throttle_then_the_delay_doubles_up_to_the_max():
    admission = Admission(**LIMITS)
    delays = []
    for attempt in range(8):
        admission.failed("10.0.0.1", attempt * 1_000)
        delays.append(admission.delay_ms("10.0.0.1", attempt * 1_000))
    assert delays == [0, 0, 0, 250, 500, 1_000, 2_000, 2_000]
    assert admission.delay_ms("10.0.0.2", 8_000) == 0


def test_a_quiet_window_ends_the_streak():
    admission = Admission(**LIMITS)
    for attempt in range(5):
        admission.failed("a", attempt)
    assert admission.delay_ms("a", 4) == 500
    assert admission.delay_ms("a", 4 + 60_000) == 0
    admission.failed("a", 4 + 60_000)
    assert admission.delay_ms("a", 4 + 60_000) == 0  # a new streak of one


def test_a_success_ends_the_streak():
    admission = Admission(**LIMITS)
    for attempt in range(5):
        admission.failed("a", attempt)
    admission.succeeded("a")
    admission.failed("a", 10)
    assert admission.delay_ms("a", 10) == 0


def test_an_address_with_nothing_open_and_a_quiet_streak_is_forgotten():
    admission = Admission(**LIMITS)
    admission.opened("a", 0)
    admission.closed("a")
    assert admission.stats()["addresses_tracked"] == 0  # no failures: forgotten at once
    admission.failed("b", 0)
    assert admission.stats()["addresses_tracked"] == 1
    admission.opened("c", 60_000)  # any call with a time after b's window forgets b
    assert admission.stats()["addresses_tracked"] == 1


def test_at_the_tracking_cap_the_longest_idle_address_is_forgotten_first():
    admission = Admission(**LIMITS, addresses_tracked_max=3)
    for address in ("a", "b", "c"):
        admission.failed(address, 0)
    admission.failed("a", 1)  # idle longest now: b, then c, then a
    admission.failed("d", 2)  # takes b's place
    for _ in range(3):
        admission.failed("b", 3)  # takes c's place, with a new streak
    assert admission.delay_ms("b", 3) == 0  # 3 failures: b's first was forgotten
    admission.failed("a", 3)
    admission.failed("a", 3)
    assert admission.delay_ms("a", 3) == 250  # 4 failures: a was remembered
    assert admission.stats()["addresses_tracked"] == 3


def test_when_every_tracked_address_has_a_connection_open_a_new_address_is_refused():
    admission = Admission(**LIMITS, addresses_tracked_max=2)
    assert admission.opened("a", 0) is None and admission.opened("b", 0) is None
    assert "addresses_tracked_max" in admission.opened("c", 0)
    admission.failed("c", 0)  # not tracked, not counted
    assert admission.stats()["addresses_tracked"] == 2
    admission.closed("a")
    assert admission.opened("c", 0) is None


def test_a_refusal_is_logged_once_per_address_and_reason_with_bounded_memory():
    admission = Admission(**LIMITS, refusals_remembered_max=2)
    assert admission.refusal_should_be_logged("a", "too many")
    assert not admission.refusal_should_be_logged("a", "too many")
    assert admission.refusal_should_be_logged("a", "other")
    assert admission.refusal_should_be_logged("b", "too many")
    assert admission.stats()["refusals_remembered"] == 2
    assert admission.refusal_should_be_logged("a", "too many")  # forgotten, the oldest, so logged again


def test_memory_stays_under_the_cap_under_a_flood_of_addresses():
    admission = Admission(**LIMITS, addresses_tracked_max=100, refusals_remembered_max=50)
    for number in range(10_000):
        address = f"10.{number // 65536}.{number // 256 % 256}.{number % 256}"
        admission.failed(address, number)
        admission.refusal_should_be_logged(address, "reason")
        stats = admission.stats()
        assert stats["addresses_tracked"] <= 100 and stats["refusals_remembered"] <= 50


# ---- against a model --------------------------------------------------------------------------


class Model:
    def __init__(self, limits: dict):
        self.limits = limits
        self.open: dict[str, int] = {}
        self.failures: dict[str, list[int]] = {}

    def opened(self, address: str) -> bool:
        if self.open.get(address, 0) >= self.limits["connections_per_address_max"]:
            return False
        self.open[address] = self.open.get(address, 0) + 1
        return True

    def failed(self, address: str, now_ms: int) -> None:
        times = self.failures.setdefault(address, [])
        if times and now_ms - times[-1] >= self.limits["failure_window_ms"]:
            times.clear()
        times.append(now_ms)

    def delay_ms(self, address: str, now_ms: int) -> int:
        times = self.failures.get(address, [])
        streak = len(times) if times and now_ms - times[-1] < self.limits["failure_window_ms"] else 0
        excess = streak - self.limits["failures_before_throttle"]
        if excess <= 0:
            return 0
        delay_ms = self.limits["throttle_delay_min_ms"] * 2 ** (excess - 1)
        return min(delay_ms, self.limits["throttle_delay_max_ms"])


ADDRESSES = ["a", "b", "c"]
OPERATIONS = st.lists(st.tuples(st.sampled_from(["open", "close", "fail", "succeed", "wait"]),
                                st.sampled_from(ADDRESSES), st.integers(0, 70_000)), max_size=60)


@settings(max_examples=300, deadline=None)
@given(OPERATIONS)
def test_admission_agrees_with_a_model_that_forgets_nothing(operations):
    admission, model, now_ms = Admission(**LIMITS), Model(LIMITS), 0
    for operation, address, wait_ms in operations:
        if operation == "open":
            assert (admission.opened(address, now_ms) is None) == model.opened(address)
        elif operation == "close" and model.open.get(address):
            admission.closed(address)
            model.open[address] -= 1
        elif operation == "fail":
            admission.failed(address, now_ms)
            model.failed(address, now_ms)
        elif operation == "succeed":
            admission.succeeded(address)
            model.failures.pop(address, None)
        elif operation == "wait":
            now_ms += wait_ms
        for each in ADDRESSES:
            assert admission.delay_ms(each, now_ms) == model.delay_ms(each, now_ms)
        tracked_max = sum(1 for each in ADDRESSES if model.open.get(each) or model.failures.get(each))
        assert admission.stats()["addresses_tracked"] <= tracked_max


def test_an_address_is_held_from_its_last_failure_for_the_delay_that_failure_asked_for():
    admission = Admission(**LIMITS)
    for now_ms in (0, 10, 20):  # within the free failures nothing is held
        admission.failed("10.0.0.1", now_ms)
        assert admission.held_ms("10.0.0.1", now_ms) == 0
    admission.failed("10.0.0.1", 100)  # the 4th: 250 ms from 100
    assert [admission.held_ms("10.0.0.1", now_ms) for now_ms in (100, 200, 349, 350, 10_000)] == [250, 150, 1, 0, 0]
    admission.failed("10.0.0.1", 400)  # the 5th: 500 ms from 400
    assert admission.held_ms("10.0.0.1", 400) == 500 and admission.held_ms("10.0.0.2", 400) == 0
    admission.succeeded("10.0.0.1")
    assert admission.held_ms("10.0.0.1", 401) == 0
    admission.failed("10.0.0.3", 0)
    for now_ms in (1, 2, 3, 4):
        admission.failed("10.0.0.3", now_ms)
    assert admission.held_ms("10.0.0.3", 60_004) == 0  # a quiet window ends the streak and its hold


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(0, 5_000)), max_size=40))
@settings(max_examples=200, deadline=None)
def test_held_is_never_longer_than_the_max_delay_and_ends_by_the_last_failure_plus_its_delay(failures):
    admission = Admission(**LIMITS)
    now_ms = 0
    for address, step_ms in failures:
        now_ms += step_ms
        admission.failed(address, now_ms)
        delay_ms = admission.delay_ms(address, now_ms)
        assert admission.held_ms(address, now_ms) == delay_ms <= LIMITS["throttle_delay_max_ms"]
        assert admission.held_ms(address, now_ms + delay_ms) == 0
