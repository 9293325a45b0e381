"""Durability: what waits for the journal is released by the report covering its batch, in order."""

from hypothesis import given
from hypothesis import strategies as st

from node.core.durability import CALL, CONSUMER, PRODUCER, Durability

RETRY_INTERVAL_MS = 1000


def test_a_waiter_is_released_when_its_batch_is_durable_and_not_before():
    durability = Durability(RETRY_INTERVAL_MS)
    durability.wait("send", PRODUCER)
    assert durability.batch_ended(1) == []
    assert durability.durable(0) == []
    assert durability.durable(1) == [("send", PRODUCER)]
    assert durability.durable(1) == []


def test_a_batch_is_waiting_from_its_first_waiter_until_it_ends():
    durability = Durability(RETRY_INTERVAL_MS)
    assert not durability.waiting  # the loop holds this batch's journal records back (loop.py)
    durability.wait("send", PRODUCER)
    assert durability.waiting
    durability.batch_ended(1)
    assert not durability.waiting


def test_without_a_journal_the_batch_is_released_at_its_end():
    durability = Durability(RETRY_INTERVAL_MS)
    durability.wait("send", PRODUCER)
    durability.wait("callback", CALL)
    assert durability.batch_ended(None) == [("send", PRODUCER), ("callback", CALL)]


def test_a_batch_whose_ticket_is_already_durable_is_released_at_its_end():
    durability = Durability(RETRY_INTERVAL_MS)
    durability.batch_ended(3)
    durability.durable(3)
    durability.wait("settlement", CONSUMER)  # nothing new journalled: the journal hands back ticket 3 again
    assert durability.batch_ended(3) == [("settlement", CONSUMER)]


def test_a_failed_write_releases_its_waiters_for_refusal_and_refuses_durable_sends_for_a_while():
    durability = Durability(RETRY_INTERVAL_MS)
    durability.wait("send", PRODUCER)
    durability.batch_ended(1)
    assert durability.failed(1, "disk full", now_ms=10_000) == [("send", PRODUCER, None)]
    assert durability.refusing(10_000 + RETRY_INTERVAL_MS - 1) == "disk full"
    assert durability.refusing(10_000 + RETRY_INTERVAL_MS) is None


def test_a_successful_write_ends_the_refusal_at_once():
    durability = Durability(RETRY_INTERVAL_MS)
    durability.failed(1, "disk full", now_ms=0)
    durability.durable(2)
    assert durability.refusing(1) is None


@given(st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=40))
def test_every_waiter_is_released_once_in_registration_order(steps):
    """Batches of 0-3 waiters end with increasing tickets; reports (durable or failed) come in ticket
    order, some batches covered by one report. Whatever the mix, each waiter comes out exactly once,
    in the order it waited, and only after a report covering its batch."""
    durability = Durability(RETRY_INTERVAL_MS)
    released, registered, ticket_of = [], [], {}
    next_waiter = 0
    for ticket, (waiters, report_now) in enumerate(steps, start=1):
        for _ in range(waiters):
            durability.wait(next_waiter, PRODUCER)
            registered.append(next_waiter)
            ticket_of[next_waiter] = ticket
            next_waiter += 1
        released += [target for target, _ in durability.batch_ended(ticket)]
        if report_now:
            report = durability.durable(ticket) if ticket % 2 else durability.failed(ticket, "x", ticket)
            assert all(ticket_of[waiter[0]] <= ticket for waiter in report)
            released += [waiter[0] for waiter in report]
    released += [target for target, _ in durability.durable(len(steps))]
    assert released == registered
