"""Forwarding end to end in one process: Forwarder -> real gRPC on 127.0.0.1 -> PeerServicer -> a fake
owner that dedupes by forward_seq the way the reactor must. Waits are bounded waits on conditions the
fake and the callbacks notify; the only clock readings check that backoff really waited."""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from concurrent import futures

import grpc
import pytest

from node.core.errors import (AlreadyExists, GrouperError, InvalidField, NotAllowed, NotFound,
                              ResourceLimitExceeded)
from node.peer.forwarder import Entry, Forwarder, Forwarders
from node.peer.service import (SERVER_OPTIONS, STATUS_BY_ERROR, TIMEOUT_MS_DEFAULT, PeerServicer, add_peer_service,
                               status_for)
from proto import peer_pb2, peer_pb2_grpc

WAIT_S = 5.0  # longest any single wait in this file may take before the test fails
FAST_RETRY = {"retry_min_ms": 10, "retry_max_ms": 50}


def entry(seq: int, group: str | None = "g", payload: bytes | None = None) -> Entry:
    return Entry(forward_seq=seq, queue="q", group_id=group, payload=payload or f"m{seq}".encode(),
                 expires_at_ms=0, closes_group=False, enqueued_at_ms=1000 + seq)


def entries(first: int, last: int) -> list[Entry]:
    return [entry(seq) for seq in range(first, last + 1)]


class FakeOwner:
    """The owner's handler: takes entries above its high water for the source, in order, as durable.

    `script` holds one action per call, in order: ("before", fn) runs fn(entries) before anything is
    taken (it may block or raise), ("after", fn) after the batch is durable, so raising there is an
    ack lost on the way back. `accept_max` takes at most that many new entries per call: a partial ack.
    """

    def __init__(self, accept_max: int | None = None):
        self.changed = threading.Condition()
        self.batches: list[list[int]] = []
        self.timeouts_ms: list[int] = []
        self.call_times: list[float] = []
        self.durable: list[Entry] = []
        self.high_water: dict[str, int] = {}
        self.duplicates = 0
        self.accept_max = accept_max
        self.script: deque = deque()

    def handle(self, source_node: str, batch: list[Entry], timeout_ms: int, seq_bound: int = 0,
               disputed_high_water: int = 0) -> int:
        with self.changed:
            self.batches.append([e.forward_seq for e in batch])
            self.timeouts_ms.append(timeout_ms)
            self.call_times.append(time.monotonic())
            when, action = self.script.popleft() if self.script else (None, None)
            self.changed.notify_all()
        if when == "before":
            action(batch)
        with self.changed:
            high_water = self.high_water.get(source_node, 0)
            taken = 0
            for item in batch:
                if item.forward_seq <= high_water:
                    self.duplicates += 1
                    continue
                if self.accept_max is not None and taken == self.accept_max:
                    break
                self.durable.append(item)
                high_water = item.forward_seq
                taken += 1
            self.high_water[source_node] = high_water
            self.changed.notify_all()
        if when == "after":
            action(batch)
        return high_water

    def wait_for(self, predicate) -> None:
        with self.changed:
            assert self.changed.wait_for(predicate, WAIT_S), "the owner never reached the expected state"

    def durable_seqs(self) -> list[int]:
        return [e.forward_seq for e in self.durable]


def raise_(error: BaseException):
    def action(_batch):
        raise error
    return action


class OwnerServer:
    def __init__(self, handle, port: int = 0):
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="test-peer"),
                                  options=[*SERVER_OPTIONS, ("grpc.so_reuseport", 0)])
        add_peer_service(self.server, handle)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        assert self.port, f"cannot listen on 127.0.0.1:{port}"
        self.server.start()
        self.address = f"127.0.0.1:{self.port}"

    def stop(self) -> None:
        self.server.stop(None).wait(WAIT_S)


class Acks:
    """on_acked and on_state for a Forwarder, recorded, with a condition to wait on."""

    def __init__(self):
        self.changed = threading.Condition()
        self.values: list[int] = []
        self.states: list[tuple[bool, str]] = []

    def on_acked(self, high_water: int) -> None:
        with self.changed:
            self.values.append(high_water)
            self.changed.notify_all()

    def on_state(self, connected: bool, reason: str) -> None:
        with self.changed:
            self.states.append((connected, reason))
            self.changed.notify_all()

    def wait_for_high_water(self, seq: int) -> None:
        with self.changed:
            assert self.changed.wait_for(lambda: self.values and self.values[-1] >= seq, WAIT_S), \
                f"acks reached only {self.values[-1:]} waiting for {seq}"


@pytest.fixture
def cleanup():
    """Closes every forwarder and stops every server a test registers, even when it fails."""
    items: list = []
    yield items.append
    for item in reversed(items):
        item.close() if isinstance(item, (Forwarder, Forwarders)) else item.stop()


def start_forwarder(cleanup, resolve_address, acks: Acks, **options) -> Forwarder:
    forwarder = Forwarder("x", "a", resolve_address, acks.on_acked, on_state=acks.on_state, **options)
    cleanup(forwarder)
    return forwarder


def start_owner(cleanup, owner: FakeOwner, port: int = 0) -> OwnerServer:
    server = OwnerServer(owner.handle, port)
    cleanup(server)
    return server


# ---- forwarding ------------------------------------------------------------------------------


def test_entries_arrive_in_order_in_batches_of_at_most_batch_messages_max(cleanup):
    owner, acks = FakeOwner(), Acks()
    server = start_owner(cleanup, owner)
    forwarder = start_forwarder(cleanup, lambda: server.address, acks, batch_messages_max=4)
    sent = entries(1, 10)
    forwarder.submit(sent)
    acks.wait_for_high_water(10)
    assert owner.batches == [[1, 2, 3, 4], [5, 6, 7, 8], [9, 10]]
    assert owner.durable == sent
    assert acks.values == [4, 8, 10]
    assert forwarder.pending_count == 0
    assert acks.states == [(True, f"forwarding to {server.address}")]


def test_every_field_survives_the_wire_and_an_empty_group_is_not_ungrouped(cleanup):
    owner, acks = FakeOwner(), Acks()
    server = start_owner(cleanup, owner)
    forwarder = start_forwarder(cleanup, lambda: server.address, acks)
    sent = [entry(1, group=None), entry(2, group=""), entry(3, group="g\u00e9", payload=b"\x00\xff" * 50),
            Entry(4, "other", "g", b"body", expires_at_ms=2**40, closes_group=True, enqueued_at_ms=7)]
    forwarder.submit(sent)
    acks.wait_for_high_water(4)
    assert owner.durable == sent
    assert [e.group_id for e in owner.durable[:2]] == [None, ""]


def test_a_slow_handler_makes_later_submits_batch_together(cleanup):
    owner, acks = FakeOwner(), Acks()
    release = threading.Event()
    owner.script.append(("before", lambda _batch: release.wait(WAIT_S)))
    server = start_owner(cleanup, owner)
    forwarder = start_forwarder(cleanup, lambda: server.address, acks)
    forwarder.submit([entry(1)])
    owner.wait_for(lambda: owner.batches)
    for seq in range(2, 7):
        forwarder.submit([entry(seq)])  # one call in flight, so these wait and go as one batch
    assert forwarder.pending_count == 6
    release.set()
    acks.wait_for_high_water(6)
    assert owner.batches == [[1], [2, 3, 4, 5, 6]]
    assert owner.durable_seqs() == [1, 2, 3, 4, 5, 6]


def test_a_batch_stops_at_batch_bytes_max_but_always_carries_one_entry(cleanup):
    owner, acks = FakeOwner(), Acks()
    server = start_owner(cleanup, owner)
    forwarder = start_forwarder(cleanup, lambda: server.address, acks, batch_bytes_max=1000)
    big = 5000  # larger than the whole batch limit: it still goes, alone
    forwarder.submit([entry(1, payload=b"a" * 400), entry(2, payload=b"b" * 400), entry(3, payload=b"c" * big),
                      entry(4, payload=b"d" * 100), entry(5, payload=b"e" * 100)])
    acks.wait_for_high_water(5)
    assert owner.batches == [[1, 2], [3], [4, 5]]


def test_a_partial_ack_resends_the_rest_in_order_and_acks_only_increase(cleanup):
    owner, acks = FakeOwner(accept_max=2), Acks()
    server = start_owner(cleanup, owner)
    forwarder = start_forwarder(cleanup, lambda: server.address, acks, batch_messages_max=5)
    forwarder.submit(entries(1, 7))
    acks.wait_for_high_water(7)
    assert owner.batches == [[1, 2, 3, 4, 5], [3, 4, 5, 6, 7], [5, 6, 7], [7]]
    assert owner.durable_seqs() == [1, 2, 3, 4, 5, 6, 7]
    assert owner.duplicates == 0
    assert acks.values == [2, 4, 6, 7]


def test_an_ack_that_takes_nothing_backs_off_instead_of_spinning(cleanup):
    owner, acks = FakeOwner(accept_max=0), Acks()
    server = start_owner(cleanup, owner)
    forwarder = start_forwarder(cleanup, lambda: server.address, acks, retry_min_ms=20, retry_max_ms=40)
    forwarder.submit(entries(1, 3))
    owner.wait_for(lambda: len(owner.batches) >= 3)
    owner.accept_max = None
    acks.wait_for_high_water(3)
    gaps_ms = [(later - earlier) * 1000 for earlier, later in zip(owner.call_times, owner.call_times[1:])]
    assert min(gaps_ms[:2]) >= 15
    assert acks.states[0][0] is False and "took none of the batch" in acks.states[0][1]
    assert acks.states[-1][0] is True


def test_a_peer_down_at_first_gets_everything_in_order_once_it_comes_up(cleanup, caplog):
    caplog.set_level(logging.DEBUG, logger="node.peer.forwarder")
    owner, acks = FakeOwner(), Acks()
    first = OwnerServer(owner.handle)  # only to learn a free port; nothing listens once it stops
    port = first.port
    first.stop()
    address: list[str | None] = [None]
    resolved = threading.Condition()
    resolve_calls = [0]

    def resolve():
        with resolved:
            resolve_calls[0] += 1
            resolved.notify_all()
            return address[0]

    def wait_for_resolve_calls(count: int) -> None:
        with resolved:
            assert resolved.wait_for(lambda: resolve_calls[0] >= count, WAIT_S)

    forwarder = start_forwarder(cleanup, resolve, acks, **FAST_RETRY)
    forwarder.submit(entries(1, 5))
    wait_for_resolve_calls(3)  # the address is not known yet
    address[0] = f"127.0.0.1:{port}"
    start = resolve_calls[0]
    wait_for_resolve_calls(start + 5)  # known, but nothing listens there
    forwarder.submit(entries(6, 10))
    assert forwarder.pending_count == 10
    start_owner(cleanup, owner, port)
    forwarder.submit(entries(11, 12))
    acks.wait_for_high_water(12)

    assert owner.durable_seqs() == list(range(1, 13))
    assert owner.duplicates == 0
    assert acks.states == [(False, "address unknown"), (True, f"forwarding to 127.0.0.1:{port}")]
    loud = [r for r in caplog.records if r.levelno >= logging.INFO]
    assert [r.levelname for r in loud] == ["WARNING", "INFO"], [r.getMessage() for r in loud]
    assert "stopped: address unknown" in loud[0].getMessage()
    assert "resumed after" in loud[1].getMessage()
    assert resolve_calls[0] >= 8  # many attempts, two log lines


def test_resource_limit_exceeded_is_retried_with_backoff_until_the_owner_accepts(cleanup):
    owner, acks = FakeOwner(), Acks()
    for _ in range(3):
        owner.script.append(("before", raise_(ResourceLimitExceeded("queue q is full"))))
    server = start_owner(cleanup, owner)
    forwarder = start_forwarder(cleanup, lambda: server.address, acks, retry_min_ms=20, retry_max_ms=1000)
    forwarder.submit(entries(1, 3))
    acks.wait_for_high_water(3)
    assert owner.batches == [[1, 2, 3]] * 4
    assert owner.durable_seqs() == [1, 2, 3]
    waited_ms = (owner.call_times[3] - owner.call_times[0]) * 1000
    assert waited_ms >= (20 + 40 + 80) * 0.9  # doubling backoff between the four attempts
    assert acks.states == [(False, "RESOURCE_EXHAUSTED: queue q is full"), (True, f"forwarding to {server.address}")]


def test_after_a_lost_ack_only_the_unacked_entries_are_resent_from_the_oldest(cleanup):
    owner, acks = FakeOwner(), Acks()
    server = start_owner(cleanup, owner)
    forwarder = start_forwarder(cleanup, lambda: server.address, acks, **FAST_RETRY)
    forwarder.submit(entries(1, 3))
    acks.wait_for_high_water(3)
    # the owner makes 4..6 durable, then its answer is lost: the forwarder cannot know they arrived
    owner.script.append(("after", raise_(TimeoutError("the node did not answer within 5000 ms"))))
    forwarder.submit(entries(4, 6))
    acks.wait_for_high_water(6)
    assert owner.batches == [[1, 2, 3], [4, 5, 6], [4, 5, 6]]
    assert owner.duplicates == 3
    assert owner.durable_seqs() == [1, 2, 3, 4, 5, 6]
    assert acks.values == [3, 6]


def test_submit_refuses_a_forward_seq_that_does_not_increase(cleanup):
    forwarder = start_forwarder(cleanup, lambda: None, Acks(), **FAST_RETRY)
    forwarder.submit(entries(1, 2))
    with pytest.raises(ValueError, match="forward_seq must increase"):
        forwarder.submit([entry(2)])
    with pytest.raises(ValueError):
        forwarder.submit([entry(5), entry(4)])
    assert forwarder.pending_count == 2


# what "promptly" is measured against: a wait close must cut short, long enough that no loaded machine
# comes near half of it (these tests had a 0.5 s bound, which a loaded CI machine can miss)
BACKOFF_MS = 60_000


def test_close_returns_promptly_while_the_peer_is_down(cleanup):
    first = OwnerServer(FakeOwner().handle)
    first.stop()
    acks = Acks()
    forwarder = Forwarder("x", "a", lambda: first.address, acks.on_acked, on_state=acks.on_state,
                          retry_min_ms=BACKOFF_MS, retry_max_ms=2 * BACKOFF_MS)
    cleanup(forwarder)
    forwarder.submit(entries(1, 5))
    with acks.changed:
        assert acks.changed.wait_for(lambda: acks.states, WAIT_S)
    started = time.monotonic()
    forwarder.close()
    assert time.monotonic() - started < BACKOFF_MS / 2000  # it did not sit out the backoff
    assert not forwarder._thread.is_alive()


def test_close_cancels_a_call_the_owner_never_answers(cleanup):
    owner = FakeOwner()
    release = threading.Event()
    owner.script.append(("before", lambda _batch: release.wait(2 * BACKOFF_MS / 1000)))
    server = start_owner(cleanup, owner)
    acks = Acks()
    forwarder = Forwarder("x", "a", lambda: server.address, acks.on_acked, call_timeout_ms=4 * BACKOFF_MS)
    cleanup(forwarder)
    forwarder.submit(entries(1, 1))
    owner.wait_for(lambda: owner.batches)
    started = time.monotonic()
    forwarder.close()
    elapsed_s = time.monotonic() - started
    release.set()
    assert elapsed_s < BACKOFF_MS / 2000  # it neither waited for the owner's answer nor for the call's timeout
    assert not forwarder._thread.is_alive()


# ---- the servicer ----------------------------------------------------------------------------


class Retriable(GrouperError):
    retriable = True


@pytest.fixture
def stub(cleanup):
    """A raw stub to a servicer whose handler raises `raised[0]` when set, else returns the last seq."""
    raised: list = [None]
    seen: list = []

    def handle(source_node, batch, timeout_ms, seq_bound=0, disputed_high_water=0):
        seen.append((source_node, batch, timeout_ms))
        if raised[0] is not None:
            raise raised[0]
        return batch[-1].forward_seq

    server = OwnerServer(handle)
    cleanup(server)
    channel = grpc.insecure_channel(server.address)
    yield peer_pb2_grpc.PeerServiceStub(channel), raised, seen
    channel.close()


def forwarded(seq: int, **fields) -> peer_pb2.Forwarded:
    return peer_pb2.Forwarded(forward_seq=seq, queue="q", has_group=True, group_id="g", payload=b"m", **fields)


@pytest.mark.parametrize("error, code", [
    (ResourceLimitExceeded("queue q is full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (NotFound("no queue q"), grpc.StatusCode.NOT_FOUND),
    (InvalidField("group id too long"), grpc.StatusCode.INVALID_ARGUMENT),
    (TimeoutError("the node did not answer within 5000 ms"), grpc.StatusCode.DEADLINE_EXCEEDED),
    (AlreadyExists("not retriable"), grpc.StatusCode.FAILED_PRECONDITION),
    (NotAllowed("not retriable"), grpc.StatusCode.FAILED_PRECONDITION),
    (Retriable("try again"), grpc.StatusCode.UNAVAILABLE),
])
def test_the_servicer_maps_each_error_to_its_status(stub, error, code):
    call, raised, _ = stub
    raised[0] = error
    with pytest.raises(grpc.RpcError) as failure:
        call.Forward(peer_pb2.ForwardBatch(source_node="x", messages=[forwarded(1)]), timeout=WAIT_S)
    assert failure.value.code() is code
    assert failure.value.details() == str(error)
    assert status_for(error) is code


def test_an_unexpected_error_is_internal_and_logged(stub, caplog):
    call, raised, _ = stub
    raised[0] = RuntimeError("bug")
    with pytest.raises(grpc.RpcError) as failure:
        call.Forward(peer_pb2.ForwardBatch(source_node="x", messages=[forwarded(1)]), timeout=WAIT_S)
    assert failure.value.code() is grpc.StatusCode.INTERNAL
    assert "RuntimeError: bug" in failure.value.details()
    assert any("forward from 'x'" in r.getMessage() and r.exc_info for r in caplog.records)


def test_the_error_table_lists_subclasses_before_their_base():
    types = [row.error for row in STATUS_BY_ERROR]
    for index, error_type in enumerate(types):
        assert not any(issubclass(later, error_type) and later is not error_type for later in types[index + 1:])


@pytest.mark.parametrize("batch, field", [
    (peer_pb2.ForwardBatch(source_node="", messages=[forwarded(1)]), "source_node"),
    (peer_pb2.ForwardBatch(source_node="x", messages=[]), "messages"),
    (peer_pb2.ForwardBatch(source_node="x", messages=[forwarded(0)]), "messages[0].forward_seq"),
    (peer_pb2.ForwardBatch(source_node="x", messages=[forwarded(3), forwarded(2)]), "messages[1].forward_seq"),
    (peer_pb2.ForwardBatch(source_node="x", messages=[forwarded(1), forwarded(2), forwarded(2)]),
     "messages[2].forward_seq"),
])
def test_a_malformed_batch_is_invalid_argument_naming_the_field(stub, batch, field):
    call, _, seen = stub
    with pytest.raises(grpc.RpcError) as failure:
        call.Forward(batch, timeout=WAIT_S)
    assert failure.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    assert failure.value.details().startswith(f"{field}: ")
    assert seen == []


def test_the_handler_gets_ungrouped_as_none_and_waits_no_longer_than_the_caller(stub):
    call, _, seen = stub
    batch = peer_pb2.ForwardBatch(source_node="x", messages=[
        peer_pb2.Forwarded(forward_seq=7, queue="q", has_group=False, group_id="", payload=b"a"),
        peer_pb2.Forwarded(forward_seq=9, queue="q", has_group=True, group_id="", payload=b"b")])
    assert call.Forward(batch, timeout=2.0).high_water == 9
    source_node, received, timeout_ms = seen[0]
    assert source_node == "x"
    assert [(e.forward_seq, e.group_id) for e in received] == [(7, None), (9, "")]
    # the caller's 2 s deadline, not the servicer's 5000 ms; gRPC rounds the deadline it sends up (a
    # clean CI run saw 2008 ms), so only the servicer's own limit is a bound this test can hold
    assert timeout_ms < TIMEOUT_MS_DEFAULT


class _Context:
    def __init__(self, remaining_s):
        self.remaining_s = remaining_s

    def time_remaining(self):
        return self.remaining_s


@pytest.mark.parametrize("remaining_s, timeout_ms", [(None, 5000), (60.0, 5000), (5.0, 5000), (1.5, 1500),
                                                      (0.0004, 1)])
def test_the_handler_waits_until_the_sooner_of_the_callers_deadline_and_the_servicers_limit(remaining_s,
                                                                                             timeout_ms):
    servicer = PeerServicer(lambda *args: 0, timeout_ms=5000)
    assert servicer._timeout_for(_Context(remaining_s)) == timeout_ms


def test_a_nodes_forwarders_are_one_per_owner_and_tell_acks_by_owner(cleanup):
    owner, acks, destinations = FakeOwner(), Acks(), []

    def on_acked(destination: str, high_water: int) -> None:
        destinations.append(destination)
        acks.on_acked(high_water)
    server = start_owner(cleanup, owner)
    forwarders = Forwarders("x", lambda destination: server.address if destination == "a" else None, on_acked,
                            call_timeout_ms=1000)
    cleanup(forwarders)
    assert forwarders.to("a") is forwarders.to("a") and forwarders.to("b") is not forwarders.to("a")
    forwarders.to("a").submit(entries(1, 3))
    acks.wait_for_high_water(3)
    assert owner.durable == entries(1, 3) and destinations == ["a"] and acks.values == [3]
