"""Who may forward (issue 26, finding 2): the cluster credential without TLS, the extended key usage a
caller's certificate must name with it, and the raft membership a batch's source must have.

The credential is an HMAC keyed from the raft secret (node/peer/signature.py); these tests sign and
verify batches in memory, and drive the servicer with a stand-in context. No clock, no sockets.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import ipaddress

import grpc
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from node import certs
from node.core.errors import InvalidConfig
from node.peer.cluster_secrets import ClusterTls
from node.peer.members import ADMITTED, MembersOnly, RaftMembers, SignedByMember
from node.peer.node_certificate import node_usages, read_tls_material
from node.peer.service import PeerServicer, bind_peer_listener
from node.peer.signature import CREDENTIAL_HEADER, Signer, Verifier, batch_digest
from proto import peer_pb2, peer_pb2_grpc

SECRET = "first-raft-secret-0123456789"
NEXT_SECRET = "next-raft-secret-0123456789"
SOURCE, OWNER = "127.0.0.1:5001", "127.0.0.1:5002"


def batch(source: str = SOURCE, seq: int = 7, queue: str = "orders", group: str = "g",
          payload: bytes = b"body", seq_bound: int = 100) -> peer_pb2.ForwardBatch:
    made = peer_pb2.ForwardBatch(source_node=source, format_version=1, seq_bound=seq_bound)
    made.messages.add(forward_seq=seq, queue=queue, has_group=True, group_id=group, payload=payload)
    return made


def signed(signer: Signer, forwarded: peer_pb2.ForwardBatch, destination: str = OWNER) -> dict[str, str]:
    return dict(signer.metadata(forwarded, destination))


# ---- the credential --------------------------------------------------------------------------------

def test_a_batch_signed_with_the_clusters_secret_verifies():
    assert Verifier([SECRET], OWNER).refusal(batch(), signed(Signer([SECRET]), batch())) == ""


def test_a_batch_without_a_credential_is_refused_saying_what_to_give_the_node():
    reason = Verifier([SECRET], OWNER).refusal(batch(), {})
    assert "carries no forwarding credential" in reason and "raft_secret_file" in reason


def test_a_batch_signed_with_another_secret_is_refused():
    reason = Verifier([SECRET], OWNER).refusal(batch(), signed(Signer([NEXT_SECRET]), batch()))
    assert "does not verify with this node's raft secrets" in reason


@pytest.mark.parametrize("altered", [
    dict(source="127.0.0.1:5003"), dict(seq=10**18), dict(queue="other"), dict(group="h"), dict(payload=b"forged"),
    dict(seq_bound=10**18 + 1)])
def test_a_captured_credential_does_not_verify_for_any_other_batch(altered):
    credential = signed(Signer([SECRET]), batch())
    assert "does not verify" in Verifier([SECRET], OWNER).refusal(batch(**altered), credential)


def test_a_captured_credential_does_not_verify_at_another_owner():
    credential = signed(Signer([SECRET]), batch(), destination=OWNER)
    assert "does not verify" in Verifier([SECRET], "127.0.0.1:5009").refusal(batch(), credential)


@pytest.mark.parametrize("credential", ["", "v1:", "v1:zz", "v1:" + "00" * 32, "v2:" + "00" * 32])
def test_a_malformed_credential_is_refused(credential):
    assert Verifier([SECRET], OWNER).refusal(batch(), {CREDENTIAL_HEADER: credential}) != ""


def test_a_secret_is_rotated_member_by_member_the_first_signs_and_every_one_verifies():
    old_node, rotated_node = Signer([SECRET]), Signer([NEXT_SECRET, SECRET])
    both = Verifier([NEXT_SECRET, SECRET], OWNER)
    assert both.refusal(batch(), signed(old_node, batch())) == ""  # not rotated yet: still accepted
    assert both.refusal(batch(), signed(rotated_node, batch())) == ""
    assert Verifier([SECRET], OWNER).refusal(batch(), signed(rotated_node, batch())) != ""  # signs with the new one


def test_the_key_is_derived_from_the_secret_not_the_secret_itself():
    raw = hmac.new(SECRET.encode(), batch_digest(batch(), OWNER), hashlib.sha256).hexdigest()
    assert Verifier([SECRET], OWNER).refusal(batch(), {CREDENTIAL_HEADER: f"v1:{raw}"}) != ""


# ---- the raft membership ---------------------------------------------------------------------------

class Clock:
    def __init__(self):
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def test_only_a_raft_member_may_be_a_batchs_source_and_a_joined_node_is_let_in_on_the_next_read():
    membership = [SOURCE, OWNER]
    reads = []
    clock = Clock()
    members = RaftMembers(lambda: reads.append(1) or list(membership), clock)
    assert members.refusal(SOURCE) == ADMITTED
    code, reason = members.refusal("127.0.0.1:5003")
    assert code is grpc.StatusCode.PERMISSION_DENIED and "not a member of the raft cluster" in reason
    membership.append("127.0.0.1:5003")  # joined
    assert members.refusal("127.0.0.1:5003")[0] is grpc.StatusCode.PERMISSION_DENIED  # read again only after a pause
    clock.now_s += 1.0
    assert members.refusal("127.0.0.1:5003") == ADMITTED
    assert len(reads) == 2


def test_a_removed_member_is_refused_once_the_membership_is_read_again():
    membership = [SOURCE, OWNER]
    clock = Clock()
    members = RaftMembers(lambda: list(membership), clock)
    assert members.refusal(SOURCE) == ADMITTED
    membership.remove(SOURCE)
    clock.now_s += 10.0
    assert members.refusal(SOURCE)[0] is grpc.StatusCode.PERMISSION_DENIED


def test_before_the_raft_member_answers_every_source_is_refused_retriably():
    def unavailable():
        raise TimeoutError("no raft status")
    assert RaftMembers(lambda: None).refusal(SOURCE)[0] is grpc.StatusCode.UNAVAILABLE
    assert RaftMembers(unavailable).refusal(SOURCE)[0] is grpc.StatusCode.UNAVAILABLE


class Context:
    def __init__(self, metadata=(), auth=None, peer="ipv4:127.0.0.1:40000"):
        self._metadata, self._auth, self._peer = tuple(metadata), auth or {}, peer
        self.aborted = None

    def invocation_metadata(self):
        return self._metadata

    def auth_context(self):
        return self._auth

    def peer(self):
        return self._peer

    def time_remaining(self):
        return None

    def abort(self, code, details):
        self.aborted = (code, details)
        raise grpc.RpcError(details)


def test_without_tls_a_signed_batch_from_a_member_is_taken_and_anything_else_refused(caplog):
    taken = []
    check = SignedByMember(Verifier([SECRET], OWNER), RaftMembers(lambda: [SOURCE, OWNER]))
    servicer = PeerServicer(lambda source, entries, timeout_ms, *bounds: taken.append((source, entries)) or 7,
                            check=check)
    signer = Signer([SECRET])
    assert servicer.Forward(batch(), Context(signer.metadata(batch(), OWNER))).high_water == 7
    stranger = batch(source="127.0.0.1:5003")
    for forwarded, metadata, code in ((batch(), (), grpc.StatusCode.UNAUTHENTICATED),
                                      (batch(), (), grpc.StatusCode.UNAUTHENTICATED),
                                      (stranger, signer.metadata(stranger, OWNER), grpc.StatusCode.PERMISSION_DENIED)):
        context = Context(metadata)
        with pytest.raises(grpc.RpcError):
            servicer.Forward(forwarded, context)
        assert context.aborted[0] is code
    assert [source for source, _ in taken] == [SOURCE]
    logged = [r.getMessage() for r in caplog.records if "forwarding from 127.0.0.1 refused" in r.getMessage()]
    assert len(logged) == 2  # once per source and reason
    assert servicer.refused_counts["caller"] == 3


# ---- the certificate's extended key usage --------------------------------------------------------

def test_a_certificate_without_an_extended_key_usage_names_no_usage(tmp_path):
    certs.make_ca(tmp_path)
    leaf = leaf_without_extended_key_usage(tmp_path, "node0")
    assert node_usages(leaf) == set()
    certs.make_leaf(tmp_path, "node1", ips=["127.0.0.1"])
    assert node_usages(x509.load_pem_x509_certificate((tmp_path / "node1.pem").read_bytes())) == \
        {"serverAuth", "clientAuth"}


def test_a_node_refuses_to_start_with_a_certificate_without_an_extended_key_usage(tmp_path):
    certs.make_ca(tmp_path)
    leaf_without_extended_key_usage(tmp_path, "node0")
    with pytest.raises(InvalidConfig) as raised:
        read_tls_material(str(tmp_path / "node0.pem"), str(tmp_path / "node0-key.pem"), str(tmp_path / "ca.pem"),
                          now=datetime.datetime.now(datetime.timezone.utc))
    assert "lacks extended key usage clientAuth, serverAuth" in str(raised.value)


def test_a_caller_whose_certificate_names_no_extended_key_usage_may_not_forward(tmp_path):
    certs.make_ca(tmp_path)
    leaf_without_extended_key_usage(tmp_path, "node0")
    pem = (tmp_path / "node0.pem").read_bytes()
    auth = {"transport_security_type": [b"ssl"], "x509_pem_cert": [pem], "x509_common_name": [b"node0"]}
    code, reason = MembersOnly()(Context(auth=auth), batch())
    assert code is grpc.StatusCode.PERMISSION_DENIED and "lacks clientAuth, serverAuth" in reason


def test_over_mutual_tls_the_source_must_also_be_a_raft_member(tmp_path):
    certs.make_ca(tmp_path)
    certs.make_leaf(tmp_path, "node0", ips=["127.0.0.1"])
    pem = (tmp_path / "node0.pem").read_bytes()
    auth = {"transport_security_type": [b"ssl"], "x509_pem_cert": [pem], "x509_common_name": [b"node0"]}
    check = MembersOnly(members=RaftMembers(lambda: [SOURCE, OWNER]))
    assert check(Context(auth=auth), batch()) == ADMITTED
    code, reason = check(Context(auth=auth), batch(source="127.0.0.1:5003"))  # its host, but no member
    assert code is grpc.StatusCode.PERMISSION_DENIED and "not a member of the raft cluster" in reason


def leaf_without_extended_key_usage(directory, name: str) -> x509.Certificate:
    """A certificate the cluster CA signed, naming 127.0.0.1, with no extended key usage extension."""
    ca_certificate, ca_key = certs.load_ca(directory)
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    certificate = (x509.CertificateBuilder()
                   .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
                   .issuer_name(ca_certificate.subject).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(now - datetime.timedelta(minutes=5))
                   .not_valid_after(now + datetime.timedelta(days=1))
                   .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                                  critical=False)
                   .sign(ca_key, hashes.SHA256()))
    (directory / f"{name}.pem").write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    (directory / f"{name}-key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    return certificate


def test_over_real_mutual_tls_a_certificate_without_extended_key_usage_is_refused(tmp_path):
    certs.make_ca(tmp_path)
    certs.make_leaf(tmp_path, "node1", dns=["localhost"], ips=["127.0.0.1"])
    leaf_without_extended_key_usage(tmp_path, "node0")
    taken = []
    server, port = bind_peer_listener(
        "127.0.0.1", 0, lambda *args: taken.append(args) or 1,
        ClusterTls(*(str(tmp_path / name) for name in ("node1.pem", "node1-key.pem", "ca.pem"))),
        members=RaftMembers(lambda: ["127.0.0.1:5001", "127.0.0.1:5002"]))
    server.start()
    try:
        credentials = grpc.ssl_channel_credentials((tmp_path / "ca.pem").read_bytes(),
                                                   (tmp_path / "node0-key.pem").read_bytes(),
                                                   (tmp_path / "node0.pem").read_bytes())
        with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
            with pytest.raises(grpc.RpcError) as raised:
                peer_pb2_grpc.PeerServiceStub(channel).Forward(batch(), timeout=10)
    finally:
        server.stop(None).wait(10)
    assert raised.value.code() is grpc.StatusCode.PERMISSION_DENIED and "lacks clientAuth" in raised.value.details()
    assert taken == []


def test_while_the_raft_member_does_not_answer_it_is_asked_at_most_once_per_pause():
    asked = []
    clock = Clock()
    members = RaftMembers(lambda: asked.append(1) and None, clock)
    for _ in range(5):
        assert members.refusal(SOURCE)[0] is grpc.StatusCode.UNAVAILABLE
    clock.now_s += 1.0
    assert members.refusal(SOURCE)[0] is grpc.StatusCode.UNAVAILABLE
    assert len(asked) == 2
