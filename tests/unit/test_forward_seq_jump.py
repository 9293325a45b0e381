"""A forward seq that jumps ahead is refused and logged, never silently absorbed (issue 26, finding 2).

Legitimate forward seqs reach an owner with gaps of any size (they are the source's node seqs, shared
by its local messages and every owner; a restart skips to the next reservation), so no gap is a
fault. What a source can never do is give a seq at or above its own next node seq, its `seq_bound`:
a batch doing so is refused. An owner whose mark for a source is at or above the source's bound
took seqs the source never gave (a forged batch): it answers that mark, the source disputes it in
its next batch, and the owner sets the mark back, so the source's messages all arrive. A late copy
of an old batch, whose old bound is below the mark too, disputes nothing and stays a resend (the
simulation found that case). The owner's side is the pure core, driven here with integers; the
source's, its forwarder against an owner's servicer on 127.0.0.1, with bounded waits.
"""

from __future__ import annotations

import threading
import time
from concurrent import futures

import grpc
import pytest

from node.core.dispatch.broker import Broker
from node.core.cluster import MARK_PREFIX, ClusterProtocol
from node.core.effects import AfterFlush, Declared, Reply, Stored
from node.core.cluster.outbound import Entry
from node.core.dispatch.settings import QueueSettings
from node.peer.forwarder import Forwarder
from node.peer.forward_batch import FORWARD_SEQ_LIMIT, SeqJump, entries_from_pb
from node.peer.members import RaftMembers, SignedByMember, open_to_all
from node.peer.service import SERVER_OPTIONS, PeerServicer, add_peer_service
from node.peer.signature import Signer, Verifier
from proto import peer_pb2
from tests.unit.test_forward_credential import Context  # a stand-in for grpc.ServicerContext

REAL, OWNER = "n1", "n2"
SECRET = "unit-forward-secret-0123456789"
WAIT_S = 10.0  # longest a wait for a call may take before the test fails


def owner() -> ClusterProtocol:
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    cluster = ClusterProtocol(OWNER, broker, handler_timeout_ms=1000, routes_max=10, seq_reserve_block=100)
    cluster.ready(0)
    return cluster


def entries(*seqs: int, body: str = "m") -> list[Entry]:
    return [Entry(seq, "q", "g", f"{body}{seq}".encode(), 0, False, 5) for seq in seqs]


def take(cluster: ClusterProtocol, source: str, batch: list[Entry], seq_bound: int, now_ms: int = 10,
         disputed: int = 0) -> int:
    """The batch in, its journal write done; the owner's answer (its high water for `source`). What it
    enqueued is added to `cluster.taken_bodies`."""
    effects = cluster.forward_received(source, batch, "call", now_ms, seq_bound, disputed)
    bodies = {entry.forward_seq: entry.payload for entry in batch}
    cluster.__dict__.setdefault("taken_bodies", []).extend(
        bodies[effect.origin[1]] for effect in effects if type(effect) is Stored)  # the broker's STOREs
    [reply] = cluster.flushed(effects[-1].what, None, now_ms)
    assert reply.error is None, reply.error
    return reply.high_water


def queued(cluster: ClusterProtocol) -> list[bytes]:
    return cluster.__dict__.get("taken_bodies", [])


# ---- the batch's own bound -----------------------------------------------------------------------

def pb(*seqs: int, seq_bound: int = 0, source: str = REAL) -> peer_pb2.ForwardBatch:
    batch = peer_pb2.ForwardBatch(source_node=source, seq_bound=seq_bound)
    for seq in seqs:
        batch.messages.add(forward_seq=seq, queue="q", has_group=True, group_id="g", payload=b"m")
    return batch


@pytest.mark.parametrize("seqs, seq_bound", [((5, 9), 9), ((5, 10**18), 100), ((FORWARD_SEQ_LIMIT,), 0)])
def test_a_batch_whose_seq_jumps_ahead_of_every_seq_its_source_gave_is_refused(seqs, seq_bound):
    with pytest.raises(SeqJump) as raised:
        entries_from_pb(pb(*seqs, seq_bound=seq_bound))
    assert "jumps ahead of" in raised.value.description and "unchanged" in raised.value.description


@pytest.mark.parametrize("seqs, seq_bound", [((5, 9), 10), ((5, 10**9), 10**9 + 1), ((FORWARD_SEQ_LIMIT - 1,), 0)])
def test_a_batch_below_its_bound_has_any_gaps_it_likes(seqs, seq_bound):
    assert [entry.forward_seq for entry in entries_from_pb(pb(*seqs, seq_bound=seq_bound))] == list(seqs)


def test_the_servicer_refuses_a_jump_with_invalid_argument_logs_it_once_per_source_and_counts_it(caplog):
    handled = []
    servicer = PeerServicer(lambda *args: handled.append(args) or 1)
    for peer in ("ipv4:10.0.0.9:1000", "ipv4:10.0.0.9:1001"):
        context = Context(peer=peer)
        with pytest.raises(grpc.RpcError):
            servicer.Forward(pb(5, 10**18, seq_bound=100), context)
        assert context.aborted[0] is grpc.StatusCode.INVALID_ARGUMENT and "jumps ahead" in context.aborted[1]
    assert handled == []
    logged = [r.getMessage() for r in caplog.records if "forwarding from 10.0.0.9 refused" in r.getMessage()]
    assert len(logged) == 1 and "claiming node 'n1'" in logged[0]
    assert servicer.refused_counts["seq_jump"] == 2


# ---- the owner's mark ----------------------------------------------------------------------------

def test_gaps_resends_and_a_sources_restart_take_every_message_once_and_set_nothing_back():
    cluster = owner()
    assert take(cluster, REAL, entries(3, 4), seq_bound=5) == 4
    assert take(cluster, REAL, entries(900, 901), seq_bound=1000) == 901  # a gap: local traffic at the source
    assert take(cluster, REAL, entries(900, 901), seq_bound=1000) == 901  # a resend after a lost ack
    assert take(cluster, REAL, entries(901, 1100), seq_bound=1101) == 1100  # partly a resend
    # the source restarted: it resends what its journal held and goes on above its next reservation
    assert take(cluster, REAL, entries(1100, 5000), seq_bound=5001) == 5000
    assert queued(cluster) == [b"m3", b"m4", b"m900", b"m901", b"m1100", b"m5000"]
    assert cluster.counts["forward_marks_set_back"] == 0 and cluster.counts["resends_skipped"] == 4


def test_after_a_forged_batch_with_a_huge_seq_the_real_sources_messages_all_arrive_and_it_is_logged(caplog):
    cluster = owner()
    assert take(cluster, REAL, entries(3, 4), seq_bound=5) == 4
    # without credentials (a node with no raft secret) a stranger can claim to be n1; its batch says
    # nothing false about itself
    assert take(cluster, REAL, entries(10**18, body="forged"), seq_bound=10**18 + 1) == 10**18
    # n1's next batch is answered with that mark, above n1's bound: n1 keeps it and disputes the mark
    assert take(cluster, REAL, entries(6, 8), seq_bound=10) == 10**18
    assert take(cluster, REAL, entries(6, 8), seq_bound=10, disputed=10**18) == 8
    for batch, seq_bound in ((entries(9), 11), (entries(12, 13), 14)):
        assert take(cluster, REAL, batch, seq_bound) == batch[-1].forward_seq
    assert queued(cluster) == [b"m3", b"m4", b"forged1000000000000000000", b"m6", b"m8", b"m9", b"m12", b"m13"]
    assert cluster.counts["forward_marks_set_back"] == 1 and cluster.counts["resends_skipped"] == 2
    [logged] = [r.getMessage() for r in caplog.records if "never gave a forward seq" in r.getMessage()]
    assert "at or above 10" in logged and f"mark for it is {10**18}" in logged and "set back to 5" in logged


def test_the_set_back_mark_is_journalled_so_a_restarted_owner_keeps_it():
    cluster = owner()
    take(cluster, REAL, entries(10**18), seq_bound=10**18 + 1)
    effects = cluster.forward_received(REAL, entries(6), "call", 10, 7, 10**18)
    assert [type(effect) for effect in effects] == [Stored, Declared, AfterFlush]
    assert effects[1].values == {"name": MARK_PREFIX + REAL, "high_water": 6}
    assert cluster.flushed(effects[-1].what, None, 11) == [Reply("call", 6, None)]
    restarted = owner()
    restarted.recover_declaration(effects[1].values)
    assert restarted.inbound.high_water[REAL] == 6


def test_a_source_that_reused_seqs_after_a_restart_is_taken_not_skipped_as_resends():
    # a node without its journal (journalled=False, or a lost one) counts from 1 again when restarted
    cluster = owner()
    assert take(cluster, REAL, entries(40, 41), seq_bound=42) == 41
    assert take(cluster, REAL, entries(1, 2), seq_bound=3) == 41  # answered as resends: the source disputes it
    assert take(cluster, REAL, entries(1, 2), seq_bound=3, disputed=41) == 2
    assert queued(cluster) == [b"m40", b"m41", b"m1", b"m2"]


def test_a_late_copy_of_an_old_batch_is_a_resend_though_its_old_bound_is_below_the_mark():
    # simulation seed 0: a duplicated call from n2 (bound 51) arrived after a later one had taken seqs to 56
    cluster = owner()
    assert take(cluster, REAL, entries(41, 50), seq_bound=51) == 50
    assert take(cluster, REAL, entries(54, 56), seq_bound=57) == 56
    assert take(cluster, REAL, entries(41, 50), seq_bound=51) == 56
    assert queued(cluster) == [b"m41", b"m50", b"m54", b"m56"]
    assert cluster.counts["forward_marks_set_back"] == 0


def test_a_dispute_of_a_mark_that_moved_on_or_that_the_bound_does_not_contradict_sets_nothing_back():
    cluster = owner()
    assert take(cluster, REAL, entries(10**18), seq_bound=10**18 + 1) == 10**18
    assert take(cluster, REAL, entries(6), seq_bound=10, disputed=10**17) == 10**18  # not the mark as it stands
    assert take(cluster, REAL, entries(10**18 + 5), seq_bound=10**18 + 6, disputed=10**18) == 10**18 + 5  # bound above
    assert cluster.counts["forward_marks_set_back"] == 0


def test_a_batch_without_a_bound_is_judged_as_before():  # a source from before the bound
    cluster = owner()
    assert take(cluster, REAL, entries(10**18), seq_bound=0) == 10**18
    assert take(cluster, REAL, entries(6), seq_bound=0) == 10**18
    assert cluster.counts["resends_skipped"] == 1 and cluster.counts["forward_marks_set_back"] == 0


# ---- the source's end: its forwarder -----------------------------------------------------------

class Owner:
    """An owner's servicer on 127.0.0.1, answering `answer(entries)` as its high water; it sees the
    bound and the credential each call came with."""

    def __init__(self, answer, check=None):
        self.changed = threading.Condition()
        self.calls: list[tuple[list[int], int]] = []
        self._answer = answer
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=[*SERVER_OPTIONS])
        add_peer_service(self.server, self.handle, check=check or open_to_all)
        self.address = f"127.0.0.1:{self.server.add_insecure_port('127.0.0.1:0')}"
        self.server.start()

    def handle(self, source, batch, timeout_ms, seq_bound, disputed_high_water):
        with self.changed:
            self.calls.append(([entry.forward_seq for entry in batch], seq_bound, disputed_high_water))
            self.changed.notify_all()
        return self._answer(batch)

    def wait(self, predicate, what: str) -> None:
        with self.changed:
            assert self.changed.wait_for(predicate, WAIT_S), f"not within {WAIT_S} s: {what}; calls {self.calls}"


def test_a_forwarder_sends_its_bound_signed_and_an_owner_of_the_cluster_takes_it():
    check = SignedByMember(Verifier([SECRET], OWNER), RaftMembers(lambda: [REAL, OWNER]))
    owner_ = Owner(lambda batch: batch[-1].forward_seq, check)
    acked = []
    forwarder = Forwarder(REAL, OWNER, lambda: owner_.address, acked.append, signer=Signer([SECRET]))
    try:
        forwarder.submit(entries(3, 4), seq_bound=10)
        owner_.wait(lambda: owner_.calls, "a call")
    finally:
        forwarder.close()
        owner_.server.stop(None).wait(WAIT_S)
    assert owner_.calls[0] == ([3, 4], 10, 0)


def test_an_ack_above_every_seq_the_source_gave_is_not_taken_and_disputed_until_the_owner_sets_it_back():
    marks = [10**18, 10**18, 4]  # an owner with a forged mark answers it until it is disputed

    def answer(batch):
        return marks.pop(0) if marks else 4
    owner_ = Owner(answer)
    acked, states = [], []
    forwarder = Forwarder(REAL, OWNER, lambda: owner_.address, acked.append,
                          on_state=lambda connected, reason: states.append((connected, reason)),
                          retry_min_ms=10, retry_max_ms=20)
    try:
        forwarder.submit(entries(3, 4), seq_bound=10)
        owner_.wait(lambda: len(owner_.calls) >= 3, "the batch sent again, disputed")
        deadline_s = time.monotonic() + WAIT_S
        while forwarder.pending_count and time.monotonic() < deadline_s:
            time.sleep(0.01)
    finally:
        forwarder.close()
        owner_.server.stop(None).wait(WAIT_S)
    assert [call[2] for call in owner_.calls[:3]] == [0, 10**18, 10**18]
    assert acked == [4] and forwarder.pending_count == 0
    assert states[0][0] is False and "never gave a forward seq at or above 10" in states[0][1]
