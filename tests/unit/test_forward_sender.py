"""The forwarding channel's state machine (node/core/cluster/forward_sender.py), pure: time is an argument."""

from __future__ import annotations

import pytest

from node.core.cluster.forward_sender import ENTRY_OVERHEAD_BYTES, ForwardSender
from node.core.cluster.outbound import Entry


def entry(seq: int, payload: bytes = b"m") -> Entry:
    return Entry(forward_seq=seq, queue="q", group_id="g", payload=payload, expires_at_ms=0, closes_group=False,
                 enqueued_at_ms=0)


def entries(first: int, last: int) -> list[Entry]:
    return [entry(seq) for seq in range(first, last + 1)]


def seqs(call) -> list[int]:
    return [item.forward_seq for item in call.entries]


def test_a_call_carries_the_oldest_entries_up_to_the_message_limit_and_only_one_is_in_flight():
    sender = ForwardSender(batch_messages_max=3)
    sender.submit(entries(1, 5))
    call = sender.take_call(0)
    assert seqs(call) == [1, 2, 3]
    assert sender.take_call(0) is None


def test_a_call_stops_at_the_byte_limit_but_always_carries_one_entry():
    size_bytes = len(b"x" * 100) + len("q") + len("g") + ENTRY_OVERHEAD_BYTES
    sender = ForwardSender(batch_bytes_max=2 * size_bytes)
    sender.submit([entry(seq, b"x" * 100) for seq in (1, 2, 3)])
    assert seqs(sender.take_call(0)) == [1, 2]
    big = ForwardSender(batch_bytes_max=10)
    big.submit([entry(1, b"x" * 100), entry(2)])
    assert seqs(big.take_call(0)) == [1]


def test_an_ack_drops_entries_up_to_the_high_water_and_the_rest_goes_next_oldest_first():
    sender = ForwardSender(batch_messages_max=4)
    sender.submit(entries(1, 6))
    outcome = sender.answered(sender.take_call(0), 2, 0)  # a partial ack
    assert outcome.acked_high_water == 2 and outcome.failure == "" and outcome.connected_before is None
    assert seqs(sender.take_call(0)) == [3, 4, 5, 6]


def test_each_ack_reports_its_new_high_water_once():
    sender = ForwardSender()
    sender.submit(entries(1, 2))
    assert sender.answered(sender.take_call(0), 2, 0).acked_high_water == 2
    sender.submit(entries(3, 4))
    assert sender.answered(sender.take_call(0), 4, 0).acked_high_water == 4
    assert sender.high_water == 4 and not sender.pending


def test_failures_back_off_doubling_to_the_maximum_and_an_ack_ends_the_backoff():
    sender = ForwardSender(retry_min_ms=100, retry_max_ms=300)
    sender.submit(entries(1, 1))
    now_ms = 0
    delays = []
    for _ in range(4):
        outcome = sender.failed(sender.take_call(now_ms), "UNAVAILABLE", now_ms)
        assert outcome.failure == "UNAVAILABLE"
        delays.append(sender.retry_at_ms - now_ms)
        assert sender.take_call(sender.retry_at_ms - 1) is None  # still backing off
        now_ms = sender.retry_at_ms
    assert delays == [100, 200, 300, 300]
    assert sender.failed_attempts == 4 and sender.failing_since_ms == 0
    outcome = sender.answered(sender.take_call(now_ms), 1, now_ms)
    assert outcome.connected_before is False and sender.connected is True
    sender.submit(entries(2, 2))
    assert sender.take_call(now_ms) is not None  # no backoff left


def test_an_answer_that_took_nothing_is_a_failure():
    sender = ForwardSender()
    sender.submit(entries(5, 6))
    outcome = sender.answered(sender.take_call(0), 4, 0)
    assert "took none" in outcome.failure and outcome.acked_high_water == 0
    assert len(sender.pending) == 2 and sender.retry_at_ms == 100


def test_an_answer_at_or_above_the_bound_is_disputed_until_one_below_it_comes():
    sender = ForwardSender()
    sender.submit(entries(1, 2), seq_bound=10)
    call = sender.take_call(0)
    assert call.seq_bound == 10 and call.disputed_high_water == 0
    outcome = sender.answered(call, 12, 0)
    assert outcome.disputed and outcome.acked_high_water == 0 and len(sender.pending) == 2
    call = sender.take_call(sender.retry_at_ms)
    assert call.disputed_high_water == 12
    assert sender.answered(call, 2, sender.retry_at_ms).acked_high_water == 2
    sender.submit(entries(3, 3), seq_bound=10)
    assert sender.take_call(sender.retry_at_ms).disputed_high_water == 0


def test_a_bound_the_entries_break_is_not_said():
    sender = ForwardSender()
    sender.submit(entries(1, 3), seq_bound=3)
    assert sender.take_call(0).seq_bound == 0


def test_the_answer_of_a_call_given_up_on_is_ignored():
    sender = ForwardSender()
    sender.submit(entries(1, 1))
    call = sender.take_call(0)
    sender.failed(call, "deadline", 0)
    assert sender.answered(call, 1, 5) is None and len(sender.pending) == 1


def test_seqs_must_increase_and_nothing_is_taken_when_they_do_not():
    sender = ForwardSender()
    sender.submit(entries(1, 2))
    with pytest.raises(ValueError, match="forward_seq must increase: 2 after 2"):
        sender.submit(entries(2, 3))
    assert len(sender.pending) == 2


@pytest.mark.parametrize("options", [{"batch_messages_max": 0}, {"batch_bytes_max": 0},
                                     {"retry_min_ms": 0}, {"retry_min_ms": 20, "retry_max_ms": 10}])
def test_limits_out_of_range_are_refused(options):
    with pytest.raises(ValueError):
        ForwardSender(**options)
