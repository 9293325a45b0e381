"""The backup's Replicate servicer (issue 28): who may replicate (the replication credential, which is no
forwarding credential and the other way round; the owner a raft member and, over mutual TLS, the host its
certificate names), the batch's shape and frames, and every refusal's status code. Stand-in contexts and
handlers, a real replica writer on tmp_path where the journal answers; one real mutual-TLS listener."""

from __future__ import annotations

import hashlib
import hmac

import grpc
import pytest

from node import certs
from node.core.errors import ResourceLimitExceeded
from node.peer.cluster_secrets import ClusterTls
from node.peer.members import RaftMembers, SignedByMember
from node.peer.replica_batch import batch_to_pb, records_from_pb
from node.peer.service import PeerServicer, bind_peer_listener
from node.peer.signature import (CREDENTIAL_HEADER, FORWARDING, REPLICATION, Signer, Verifier, batch_digest,
                                 derive_key)
from node.store import records
from node.store.replica_writer import ReplicasUnavailable, ReplicaWriter
from node.core.dispatch.message import Message
from proto import peer_pb2, peer_pb2_grpc
from tests.unit.test_forward_credential import Context, batch as forward_batch

SECRET = "first-raft-secret-0123456789"
OWNER, BACKUP = "127.0.0.1:5001", "127.0.0.1:5002"


def frame(seq: int, group: str = "g") -> bytes:
    return records.encode_store("orders", Message(b"m%d" % seq, group, seq=seq))


def replica_batch(owner: str = OWNER, epoch: int = 1, first: int = 1, count: int = 2,
                  frames=None) -> peer_pb2.ReplicaBatch:
    frames = frames or [frame(first + n) for n in range(count)]
    return batch_to_pb(owner, epoch, [(first + n, "orders", "g", made) for n, made in enumerate(frames)])


class Handler:
    def __init__(self, answer=(2, 1)):
        self.answer, self.calls = answer, []

    def __call__(self, owner, epoch, batch, timeout_ms):
        self.calls.append((owner, epoch, [record.repl_seq for record in batch]))
        if isinstance(self.answer, BaseException):
            raise self.answer
        return self.answer


def servicer(handler, members=(OWNER, BACKUP)) -> PeerServicer:
    check = SignedByMember(Verifier([SECRET], BACKUP, REPLICATION), RaftMembers(lambda: list(members)))
    forward_check = SignedByMember(Verifier([SECRET], BACKUP), RaftMembers(lambda: list(members)))
    return PeerServicer(lambda *args: 9, check=forward_check, handle_replicate=handler, replicate_check=check)


def signed(batch, kind=REPLICATION, destination: str = BACKUP):
    return Signer([SECRET], kind).metadata(batch, destination)


def refused(call, request, metadata) -> tuple:
    context = Context(metadata)
    with pytest.raises(grpc.RpcError):
        call(request, context)
    return context.aborted


def test_a_signed_batch_from_its_owner_is_handed_to_the_writer_and_acknowledged():
    handler = Handler((2, 1))
    ack = servicer(handler).Replicate(replica_batch(), Context(signed(replica_batch())))
    assert (ack.high_water, ack.epoch) == (2, 1)
    assert handler.calls == [(OWNER, 1, [1, 2])]


def test_a_reset_batch_reaches_the_writer_as_a_reset_and_the_writer_drops_the_old_incarnation(tmp_path):
    calls = []
    servicer(lambda owner, epoch, batch, timeout_ms, reset=False: calls.append(reset) or (1, 1)).Replicate(
        batch_to_pb(OWNER, 1, [(1, "orders", "g", frame(7))], reset=True),
        Context(signed(batch_to_pb(OWNER, 1, [(1, "orders", "g", frame(7))], reset=True))))
    assert calls == [True]  # and a batch without the flag calls the writer as before (the test above)
    writer = ReplicaWriter(str(tmp_path), BACKUP)
    writer.start()
    try:
        old = records_from_pb(replica_batch(count=3))
        assert writer.submit(OWNER, 1, old, 5000) == (3, 1)
        assert writer.submit(OWNER, 1, records_from_pb(replica_batch(first=1, count=1, frames=[frame(9)])),
                             5000, reset=True) == (1, 1)
        assert [m.seq for m in writer.live(OWNER, [("orders", "g")], 5000)[("orders", "g")]] == [9]
    finally:
        writer.close()


def test_an_unsigned_batch_is_refused_as_unauthenticated():
    handler = Handler()
    code, reason = refused(servicer(handler).Replicate, replica_batch(), ())
    assert code is grpc.StatusCode.UNAUTHENTICATED and "carries no replication credential" in reason
    assert handler.calls == []


def test_a_forwarding_credential_is_refused_for_replicate():
    handler = Handler()
    batch = replica_batch()
    code, reason = refused(servicer(handler).Replicate, batch, signed(batch, FORWARDING))  # its own header
    assert code is grpc.StatusCode.UNAUTHENTICATED and "no replication credential" in reason
    # the forwarding key's HMAC over this very batch, in the replication header: the key differs
    mac = hmac.new(derive_key(SECRET, FORWARDING), batch_digest(batch, BACKUP, REPLICATION), hashlib.sha256)
    code, reason = refused(servicer(handler).Replicate, batch, ((REPLICATION.header, f"v1:{mac.hexdigest()}"),))
    assert code is grpc.StatusCode.UNAUTHENTICATED and "does not verify" in reason
    assert handler.calls == []


def test_a_replication_credential_is_refused_for_forward():
    forwarded = forward_batch(source=OWNER)
    code, reason = refused(servicer(Handler()).Forward, forwarded, signed(forwarded, REPLICATION))
    assert code is grpc.StatusCode.UNAUTHENTICATED and "no forwarding credential" in reason
    mac = hmac.new(derive_key(SECRET, REPLICATION), batch_digest(forwarded, BACKUP, FORWARDING), hashlib.sha256)
    code, reason = refused(servicer(Handler()).Forward, forwarded, ((CREDENTIAL_HEADER, f"v1:{mac.hexdigest()}"),))
    assert code is grpc.StatusCode.UNAUTHENTICATED and "does not verify" in reason
    assert servicer(Handler()).Forward(forwarded, Context(signed(forwarded, FORWARDING))).high_water == 9


def test_a_credential_covers_the_owner_and_epoch_so_a_captured_one_replays_nothing_else():
    metadata = signed(replica_batch())
    for altered in (replica_batch(owner=BACKUP), replica_batch(epoch=2), replica_batch(first=3)):
        assert refused(servicer(Handler()).Replicate, altered, metadata)[0] is grpc.StatusCode.UNAUTHENTICATED


def test_the_owner_must_be_a_raft_member():
    stranger = replica_batch(owner="127.0.0.1:5009")
    code, reason = refused(servicer(Handler()).Replicate, stranger, signed(stranger))
    assert code is grpc.StatusCode.PERMISSION_DENIED and "not a member of the raft cluster" in reason


@pytest.mark.parametrize("request_, status, words", [
    (replica_batch(frames=[frame(1), frame(2)[:-3]]), grpc.StatusCode.INVALID_ARGUMENT,
     "entries[1] (repl_seq 2).frame: not a whole STORE or REMOVE"),
    (replica_batch(frames=[frame(1), records.encode_declare({"name": "orders"})]), grpc.StatusCode.INVALID_ARGUMENT,
     "entries[1] (repl_seq 2).frame"),
    (replica_batch(frames=[frame(1, group="h")]), grpc.StatusCode.INVALID_ARGUMENT,
     "entries[0] (repl_seq 1): the entry names group 'g' but its STORE frame is of group 'h'"),
    (batch_to_pb(OWNER, 1, [(2, "orders", "g", frame(2)), (2, "orders", "g", frame(3))]),
     grpc.StatusCode.INVALID_ARGUMENT, "entries[1] (repl_seq 2).repl_seq: must increase (previous 2)"),
    (peer_pb2.ReplicaBatch(owner_node=OWNER, epoch=1, format_version=2), grpc.StatusCode.FAILED_PRECONDITION,
     "peer format version 2"),
])
def test_a_malformed_batch_is_refused_naming_the_entry_and_nothing_is_handed_on(request_, status, words):
    handler = Handler()
    code, reason = refused(servicer(handler).Replicate, request_, signed(request_))
    assert code is status and words in reason
    assert handler.calls == []


@pytest.mark.parametrize("error, status", [
    (TimeoutError("not durable within 5000 ms"), grpc.StatusCode.DEADLINE_EXCEEDED),
    (ResourceLimitExceeded("backup full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (ReplicasUnavailable("stopping"), grpc.StatusCode.UNAVAILABLE),
    (KeyError("a bug"), grpc.StatusCode.INTERNAL),
])
def test_the_writers_failures_leave_as_status_codes(error, status):
    assert refused(servicer(Handler(error)).Replicate, replica_batch(), signed(replica_batch()))[0] is status


def test_an_older_epoch_and_a_gap_are_refused_by_the_journal_naming_what_it_holds(tmp_path):
    writer = ReplicaWriter(str(tmp_path), BACKUP)
    writer.start()
    try:
        served = servicer(writer.submit)
        newer = replica_batch(epoch=4)
        assert served.Replicate(newer, Context(signed(newer))).high_water == 2
        older = replica_batch(epoch=3, first=3)
        code, reason = refused(served.Replicate, older, signed(older))
        assert code is grpc.StatusCode.FAILED_PRECONDITION and "epoch 3" in reason and "epoch 4" in reason
        gap = replica_batch(epoch=4, first=5)
        code, reason = refused(served.Replicate, gap, signed(gap))
        assert code is grpc.StatusCode.FAILED_PRECONDITION and "expects 3 next" in reason
        resend = replica_batch(epoch=4)
        assert served.Replicate(resend, Context(signed(resend))).high_water == 2
    finally:
        writer.close()


def test_a_node_without_replicas_answers_unimplemented():
    plain = PeerServicer(lambda *args: 0)
    assert refused(plain.Replicate, replica_batch(), ())[0] is grpc.StatusCode.UNIMPLEMENTED


def test_over_real_mutual_tls_an_owner_replicates_only_as_itself(tmp_path):
    certs.make_ca(tmp_path)
    certs.make_leaf(tmp_path, "node1", dns=["localhost"], ips=["127.0.0.1"])
    certs.make_leaf(tmp_path, "node0", dns=["localhost"], ips=["127.0.0.1"])
    handler = Handler((2, 1))
    server, port = bind_peer_listener(
        "127.0.0.1", 0, lambda *args: 1,
        ClusterTls(*(str(tmp_path / name) for name in ("node1.pem", "node1-key.pem", "ca.pem"))),
        members=RaftMembers(lambda: [OWNER, BACKUP, "127.0.0.9:5001"]), handle_replicate=handler)
    server.start()
    try:
        credentials = grpc.ssl_channel_credentials((tmp_path / "ca.pem").read_bytes(),
                                                   (tmp_path / "node0-key.pem").read_bytes(),
                                                   (tmp_path / "node0.pem").read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            stub = peer_pb2_grpc.PeerServiceStub(channel)
            assert stub.Replicate(replica_batch(), timeout=10).high_water == 2
            with pytest.raises(grpc.RpcError) as raised:  # a member, but not the host node0's certificate names
                stub.Replicate(replica_batch(owner="127.0.0.9:5001"), timeout=10)
    finally:
        server.stop(None).wait(10)
    assert raised.value.code() is grpc.StatusCode.PERMISSION_DENIED and "127.0.0.9" in raised.value.details()
    assert handler.calls == [(OWNER, 1, [1, 2])]

