"""The owner's end of one replication stream (node/core/replication/channel.py), pure: time is an argument."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from node.core.errors import ResourceLimitExceeded
from node.core.replication.channel import ENTRY_OVERHEAD_BYTES, ReplicaChannel, entry_size_bytes


def channel(**options) -> ReplicaChannel:
    return ReplicaChannel("n1", "n2", **options)


def seqs(call) -> list[int]:
    return [entry.repl_seq for entry in call.entries]


def submit(stream: ReplicaChannel, count: int, now_ms: int = 0, frame: bytes = b"f") -> list[int]:
    return [stream.submit("q", "g", frame, now_ms) for _ in range(count)]


def test_submits_are_numbered_from_one_and_a_call_carries_the_oldest_up_to_the_message_limit():
    stream = channel(batch_messages_max=3)
    assert submit(stream, 5) == [1, 2, 3, 4, 5]
    call = stream.next_call(0)
    assert seqs(call) == [1, 2, 3] and call.epoch == 0
    assert stream.next_call(0) is None  # one call in flight
    assert call.entries[0].queue == "q" and call.entries[0].group_id == "g" and call.entries[0].frame == b"f"


def test_a_call_stops_at_the_byte_limit_but_always_carries_one_entry():
    size_bytes = entry_size_bytes("q", "g", b"x" * 100)
    assert size_bytes == 100 + 2 + ENTRY_OVERHEAD_BYTES
    stream = channel(batch_bytes_max=2 * size_bytes)
    submit(stream, 3, frame=b"x" * 100)
    assert seqs(stream.next_call(0)) == [1, 2]
    alone = channel(batch_bytes_max=10)
    submit(alone, 2, frame=b"x" * 100)
    assert seqs(alone.next_call(0)) == [1]


def test_a_partial_ack_drops_entries_up_to_the_high_water_and_the_rest_goes_next_oldest_first():
    stream = channel(batch_messages_max=4)
    submit(stream, 6)
    outcome = stream.acked(stream.next_call(0), 2, 0)
    assert outcome.acked_high_water == 2 and outcome.failure == "" and outcome.connected_before is None
    assert seqs(stream.next_call(0)) == [3, 4, 5, 6]
    assert stream.high_water == 2 and len(stream.pending) == 4


def test_an_ack_not_above_the_last_one_reports_no_new_high_water():
    stream = channel(batch_messages_max=2)
    submit(stream, 3)
    assert stream.acked(stream.next_call(0), 2, 0).acked_high_water == 2
    call = stream.next_call(0)
    assert seqs(call) == [3]
    outcome = stream.acked(call, 3, 0)
    assert outcome.acked_high_water == 3 and not stream.pending and stream.pending_bytes == 0


def test_the_full_backlog_by_messages_refuses_naming_the_backup_and_the_limit_with_its_unit_and_takes_nothing():
    stream = channel(backlog_max_messages=2)
    submit(stream, 2)
    with pytest.raises(ResourceLimitExceeded) as refused:
        stream.submit("q", "g", b"f", 0)
    assert "backup n2" in refused.value.description
    assert "replica_backlog_max_messages is 2 messages" in refused.value.description
    assert refused.value.retriable and len(stream.pending) == 2 and stream.last_repl_seq == 2
    stream.acked(stream.next_call(0), 1, 0)
    assert stream.submit("q", "g", b"f", 0) == 3  # room again once the backup acknowledged


def test_the_full_backlog_by_bytes_refuses_naming_the_backup_and_the_limit_with_its_unit():
    size_bytes = entry_size_bytes("q", "g", b"x" * 10)
    stream = channel(backlog_max_bytes=2 * size_bytes)
    submit(stream, 2, frame=b"x" * 10)
    with pytest.raises(ResourceLimitExceeded) as refused:
        stream.submit("q", "g", b"x", 0)
    assert "backup n2" in refused.value.description
    assert f"replica_backlog_max_bytes is {2 * size_bytes} bytes" in refused.value.description
    assert stream.pending_bytes == 2 * size_bytes


def test_one_frame_larger_than_the_byte_limit_fits_an_empty_backlog():
    stream = channel(backlog_max_bytes=10)
    assert stream.submit("q", None, b"x" * 100, 0) == 1
    with pytest.raises(ResourceLimitExceeded):
        stream.submit("q", None, b"x", 0)


def test_the_backup_lags_once_its_oldest_unacknowledged_entry_is_lag_ms_old_exactly():
    stream = channel(lag_ms=2000)
    assert not stream.lagging(10_000)  # nothing pending: nothing to lag on
    stream.submit("q", "g", b"f", 1000)
    stream.submit("q", "g", b"f", 2500)
    assert not stream.lagging(2999) and stream.oldest_pending_age_ms(2999) == 1999
    assert stream.lagging(3000)
    stream.acked(stream.next_call(3000), 1, 3000)  # the oldest is now the one submitted at 2500
    assert not stream.lagging(4499) and stream.lagging(4500)


def test_failures_back_off_doubling_to_the_maximum_and_an_ack_ends_the_backoff():
    stream = channel(retry_min_ms=100, retry_max_ms=300)
    submit(stream, 1)
    now_ms = 0
    delays = []
    for _ in range(4):
        outcome = stream.failed(stream.next_call(now_ms), "UNAVAILABLE", now_ms)
        assert outcome.failure == "UNAVAILABLE" and outcome.acked_high_water == 0
        delays.append(stream.retry_at_ms - now_ms)
        assert stream.next_call(stream.retry_at_ms - 1) is None  # still backing off
        now_ms = stream.retry_at_ms
    assert delays == [100, 200, 300, 300]
    assert stream.failed_attempts == 4 and stream.failing_since_ms == 0
    outcome = stream.acked(stream.next_call(now_ms), 1, now_ms)
    assert outcome.connected_before is False and stream.connected is True
    submit(stream, 1)
    assert stream.next_call(now_ms) is not None  # no backoff left


def test_an_answer_that_took_nothing_is_a_failure_and_the_entries_stay():
    stream = channel()
    submit(stream, 2)
    stream.acked(stream.next_call(0), 1, 0)
    outcome = stream.acked(stream.next_call(0), 1, 0)  # the batch starts at 2
    assert "took none" in outcome.failure and outcome.acked_high_water == 0
    assert len(stream.pending) == 1 and stream.retry_at_ms == 100


def test_an_answer_above_every_repl_seq_given_is_no_ack_and_says_the_backup_is_ahead():
    stream = channel()
    submit(stream, 2)
    outcome = stream.acked(stream.next_call(0), 7, 0)
    assert outcome.backup_ahead and outcome.acked_high_water == 0 and "never sent" in outcome.failure
    assert len(stream.pending) == 2 and stream.high_water == 0


def test_the_answer_of_a_call_given_up_on_is_ignored():
    stream = channel()
    submit(stream, 1)
    call = stream.next_call(0)
    stream.failed(call, "deadline", 0)
    assert stream.acked(call, 1, 5) is None and stream.failed(call, "late", 5) is None
    assert len(stream.pending) == 1


def test_a_reset_starts_a_newer_epoch_at_repl_seq_one_and_drops_the_old_epochs_entries():
    stream = channel()
    submit(stream, 3)
    call = stream.next_call(0)
    assert stream.reset(4) == 3
    assert stream.acked(call, 3, 0) is None  # the old epoch's call is over
    assert stream.submit("q", "g", b"f", 0) == 1
    new_call = stream.next_call(0)
    assert new_call.epoch == 4 and seqs(new_call) == [1]


def test_a_reset_to_the_same_or_an_older_epoch_is_refused_and_changes_nothing():
    stream = channel(epoch=3)
    submit(stream, 1)
    for epoch in (3, 2):
        with pytest.raises(ValueError, match="must start a newer one"):
            stream.reset(epoch)
    assert stream.epoch == 3 and len(stream.pending) == 1


@pytest.mark.parametrize("options", [{"backlog_max_bytes": 0}, {"backlog_max_messages": 0}, {"lag_ms": 0},
                                     {"batch_messages_max": 0}, {"retry_min_ms": 20, "retry_max_ms": 10}])
def test_limits_out_of_range_are_refused(options):
    with pytest.raises(ValueError):
        channel(**options)


class ChannelAgainstModel(RuleBasedStateMachine):
    """Random submits, calls, full/partial/empty/ahead answers, failures, late answers, time and resets,
    against a model: a list of the frames submitted in the epoch and the backup's high water."""

    @initialize(messages_max=st.integers(1, 6), bytes_max=st.integers(60, 400), batch_max=st.integers(1, 4))
    def start(self, messages_max, bytes_max, batch_max):
        self.stream = ReplicaChannel("n1", "n2", backlog_max_messages=messages_max, backlog_max_bytes=bytes_max,
                                     batch_messages_max=batch_max, lag_ms=50, retry_min_ms=10, retry_max_ms=40)
        self.now_ms = 0
        self.epoch = 0
        self.submitted: list[tuple[bytes, int]] = []  # this epoch's (frame, submitted_at_ms); repl_seq = index + 1
        self.backup_high_water = 0  # what the model's backup holds
        self.failures_in_a_row = 0
        self.call = None
        self.given_up = None

    def pending(self) -> list[int]:
        return list(range(self.stream.high_water + 1, len(self.submitted) + 1))

    @rule(size=st.integers(0, 120))
    def submit(self, size):
        frame = b"x" * size
        held = self.pending()
        held_bytes = sum(entry_size_bytes("q", "g", self.submitted[seq - 1][0]) for seq in held)
        full = len(held) >= self.stream.backlog_max_messages or \
            (held and held_bytes + entry_size_bytes("q", "g", frame) > self.stream.backlog_max_bytes)
        if full:
            with pytest.raises(ResourceLimitExceeded, match="backup n2"):
                self.stream.submit("q", "g", frame, self.now_ms)
        else:
            self.submitted.append((frame, self.now_ms))
            assert self.stream.submit("q", "g", frame, self.now_ms) == len(self.submitted)

    @rule()
    def take_call(self):
        call = self.stream.next_call(self.now_ms)
        if self.call is not None or not self.pending() or self.now_ms < self.stream.retry_at_ms:
            assert call is None
            return
        assert call is not None and call.epoch == self.epoch
        assert seqs(call) == self.pending()[:len(call.entries)]
        assert len(call.entries) <= self.stream.batch_messages_max
        sizes = [entry.size_bytes for entry in call.entries]
        assert len(sizes) == 1 or sum(sizes) <= self.stream.batch_bytes_max
        self.call = call

    @precondition(lambda self: self.call is not None)
    @rule(taken=st.integers(0, 4), ahead=st.booleans())
    def answer(self, taken, ahead):
        call, self.call = self.call, None
        first, last = call.entries[0].repl_seq, call.entries[-1].repl_seq
        if ahead:
            high_water = len(self.submitted) + 1 + taken
        else:  # the backup takes a prefix of the batch (maybe none), after what it holds
            self.backup_high_water = max(self.backup_high_water, min(last, first - 1 + taken))
            high_water = self.backup_high_water
        before = self.stream.high_water
        outcome = self.stream.acked(call, high_water, self.now_ms)
        if ahead or high_water < first:
            assert outcome.failure and outcome.backup_ahead == ahead and outcome.acked_high_water == 0
            self.failed_once()
        else:
            assert outcome.failure == "" and self.stream.high_water == high_water
            assert outcome.acked_high_water == (high_water if high_water > before else 0)
            self.failures_in_a_row = 0
            assert self.stream.retry_at_ms == 0

    @precondition(lambda self: self.call is not None)
    @rule(taken=st.integers(0, 4))
    def fail(self, taken):
        """No answer in time; the backup may have taken part of the batch all the same."""
        self.given_up, self.call = self.call, None
        first, last = self.given_up.entries[0].repl_seq, self.given_up.entries[-1].repl_seq
        self.backup_high_water = max(self.backup_high_water, min(last, first - 1 + taken))
        assert self.stream.failed(self.given_up, "deadline", self.now_ms).failure == "deadline"
        self.failed_once()

    def failed_once(self):
        self.failures_in_a_row += 1
        delay_ms = min(40, 10 * 2 ** (self.failures_in_a_row - 1))
        assert self.stream.retry_at_ms == self.now_ms + delay_ms

    @precondition(lambda self: self.given_up is not None)
    @rule(high_water=st.integers(0, 20))
    def late_answer(self, high_water):
        before = (list(self.stream.pending), self.stream.high_water, self.stream.retry_at_ms)
        assert self.stream.acked(self.given_up, high_water, self.now_ms) is None
        assert (list(self.stream.pending), self.stream.high_water, self.stream.retry_at_ms) == before

    @rule(elapsed_ms=st.integers(0, 60))
    def time_passes(self, elapsed_ms):
        self.now_ms += elapsed_ms

    @rule()
    def reset(self):
        self.epoch += 1
        held = len(self.pending())
        assert self.stream.reset(self.epoch) == held
        self.submitted, self.backup_high_water, self.call, self.given_up = [], 0, None, None

    @invariant()
    def pending_is_what_the_backup_did_not_acknowledge(self):
        if not hasattr(self, "stream"):
            return
        assert [entry.repl_seq for entry in self.stream.pending] == self.pending()
        assert [entry.frame for entry in self.stream.pending] == [self.submitted[seq - 1][0] for seq in self.pending()]
        assert self.stream.pending_bytes == sum(entry.size_bytes for entry in self.stream.pending)
        assert len(self.stream.pending) <= self.stream.backlog_max_messages
        assert len(self.stream.pending) <= 1 or self.stream.pending_bytes <= self.stream.backlog_max_bytes
        oldest = self.pending()[0] if self.pending() else None
        lagging = oldest is not None and self.now_ms - self.submitted[oldest - 1][1] >= 50
        assert self.stream.lagging(self.now_ms) == lagging


ChannelAgainstModel.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
test_the_channel_agrees_with_its_model = ChannelAgainstModel.TestCase
