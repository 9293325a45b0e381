"""The failed-login throttle's rule (node/core/access/failed_logins.py): keys, holds, what a success clears,
trust, and the memory bound. Time is an argument; nothing sleeps."""

from __future__ import annotations

from node.core.access.failed_logins import DELAY_MAX_MS, DELAY_MIN_MS, FAILURE_WINDOW_MS, FailedLogins


def fail(throttle: FailedLogins, address: str, user: str, times: int, now_ms: int = 0) -> None:
    for _ in range(times):
        throttle.failed(address, user, now_ms)


def test_three_failures_hold_nothing_the_fourth_holds_the_address_the_user_and_the_pair():
    throttle = FailedLogins()
    fail(throttle, "10.0.0.1", "admin", 3)
    assert throttle.held("10.0.0.1", "admin", 0) == (0, "")
    throttle.failed("10.0.0.1", "admin", 0)
    assert throttle.held("10.0.0.1", "bob", 1) == (DELAY_MIN_MS - 1, "address")
    assert throttle.held("10.0.0.2", "admin", 1) == (DELAY_MIN_MS - 1, "user")
    assert throttle.held("10.0.0.1", "admin", 1) == (DELAY_MIN_MS - 1, "address")  # all three: the address named
    assert throttle.held("10.0.0.2", "bob", 1) == (0, "")
    assert throttle.held("10.0.0.1", "admin", DELAY_MIN_MS) == (0, "")


def test_the_hold_doubles_per_failure_up_to_its_maximum_and_a_quiet_window_ends_the_streak():
    throttle = FailedLogins()
    fail(throttle, "a", "u", 4)
    assert throttle.held("a", "u", 0)[0] == DELAY_MIN_MS
    throttle.failed("a", "u", 0)
    assert throttle.held("a", "u", 0)[0] == 2 * DELAY_MIN_MS
    fail(throttle, "a", "u", 20)
    assert throttle.held("a", "u", 0)[0] == DELAY_MAX_MS
    assert throttle.held("a", "u", FAILURE_WINDOW_MS) == (0, "")
    throttle.failed("a", "u", FAILURE_WINDOW_MS)  # a new streak: one failure
    assert throttle.held("a", "u", FAILURE_WINDOW_MS) == (0, "")


def test_a_refused_attempt_counts_for_the_keys_that_held_it_only():
    throttle = FailedLogins()
    fail(throttle, "10.0.0.1", "admin", 4)
    assert throttle.refuse_if_held("10.0.0.2", "admin", 1) == (2 * DELAY_MIN_MS, "user")
    assert throttle.held("10.0.0.2", "bob", 1) == (0, "")  # the refused address gained no streak
    assert throttle.refuse_if_held("10.0.0.3", "carol", 1) == (0, "")


def test_one_accounts_successes_reset_neither_the_address_nor_another_users_count():
    # issue 26 finding 5: guesses at admin interleaved with logins of one's own account
    throttle = FailedLogins()
    for now_ms in range(10):
        throttle.succeeded("10.0.0.9", "mallory", now_ms)
        throttle.failed("10.0.0.9", "admin", now_ms)
    assert throttle.held("10.0.0.9", "admin", 10)[1] in ("address", "user", "pair")
    assert throttle.held("10.0.0.9", "anyone", 10)[1] == "address"
    assert throttle.held("10.0.0.8", "admin", 10)[1] == "user"
    assert throttle.held("10.0.0.9", "mallory", 10) == (0, "")  # the trusted pair gets in


def test_a_success_clears_no_count_and_trusts_its_pair_while_others_guess():
    throttle = FailedLogins(trust_ms=1000)
    fail(throttle, "10.0.0.1", "app", 3)
    throttle.succeeded("10.0.0.1", "app", 0)  # mistyped three times, then right
    throttle.failed("10.0.0.1", "app", 1)  # the pair's streak goes on: held
    assert throttle.held("10.0.0.1", "app", 1) == (DELAY_MIN_MS, "pair")
    assert throttle.held("10.0.0.1", "app", 1 + DELAY_MIN_MS) == (0, "")
    fail(throttle, "10.0.0.66", "app", 10, now_ms=300)  # someone guesses app's password from elsewhere
    fail(throttle, "10.0.0.1", "admin", 10, now_ms=300)  # and admin's from app's host
    assert throttle.held("10.0.0.1", "app", 301) == (0, "")  # trusted: only its own count holds it
    assert throttle.held("10.0.0.2", "app", 301)[1] == "user"
    assert throttle.held("10.0.0.1", "admin", 301)[1] == "address"
    assert throttle.held("10.0.0.1", "app", 1001)[0] > 0  # trust lapsed: the address and user holds apply


def test_an_unknown_user_name_counts_as_a_known_one_does():
    throttle = FailedLogins()
    fail(throttle, "a", "admin", 4)
    fail(throttle, "b", "no-such-user", 4)
    assert throttle.held("c", "admin", 0) == throttle.held("c", "no-such-user", 0)


def test_memory_is_bounded_per_table_and_the_least_recently_failed_goes_first():
    throttle = FailedLogins(addresses_max=5, users_max=5, pairs_max=5, trusted_max=5)
    for number in range(100):
        throttle.failed(f"10.0.{number}.1", "x" * 10_000 + str(number), now_ms=number)
        throttle.succeeded(f"10.0.{number}.2", f"user{number}", now_ms=number)
    assert throttle.stats() == {"addresses": 5, "users": 5, "pairs": 5, "trusted": 5}
    fail(throttle, "10.0.99.1", "y", 4, now_ms=100)
    assert throttle.held("10.0.99.1", "z", 100)[1] == "address"


def test_ended_streaks_are_forgotten_as_failures_come():
    throttle = FailedLogins()
    fail(throttle, "a", "u", 2)
    throttle.failed("b", "v", FAILURE_WINDOW_MS)
    assert throttle.stats()["addresses"] == 1 and throttle.stats()["users"] == 1
