"""The cluster credential of a forwarded batch without cluster TLS: an HMAC of it keyed from the raft secret.

Rules:
- Every member holds the raft secret file (up to RAFT_SECRETS_MAX secrets, node/peer/cluster_secrets.py):
  the first signs, every one verifies, so a secret is rotated member by member as raft's is.
- The key is not the secret: it is HMAC-SHA256(secret, KEY_LABEL), so the raft secret itself never
  keys anything but raft, and a credential made for forwarding is good for nothing else.
- A call carries, in gRPC metadata CREDENTIAL_HEADER, "v1:" and the hex HMAC-SHA256 over a digest of
  everything the owner acts on: the destination node (the owner's node id) and the whole batch (its
  source node, format version, seq bound, and per message its forward seq, queue, group, payload,
  expiry, close flag and enqueue time). So a captured call cannot be turned into another
  batch (another queue, group, body or seq), another source's, or a batch for another owner;
  replayed as it is, its seqs are at or below the owner's mark and are skipped as resends.
- Verification compares in constant time (hmac.compare_digest) against every accepted key; the digest
  is computed once. It costs one encoding and one SHA-256 pass over the batch's bytes, on each side:
  0.15-0.2 ms for 1,000 messages of 100 bytes, 1.6-1.8 ms for 1,000 of 1,000 bytes (timeit, 2 shared
  cores; parsing the same 100-byte batch into entries costs 0.77 ms).
- Replication (issue 28: an owner's Replicate calls to its backups) has a credential of its own,
  `REPLICATION`: its own metadata key, key label and digest label, and the batch's owner_node as the
  claimed caller, so a forwarding credential is refused for Replicate and a replication one for
  Forward. Every rule above holds for it (its digest covers the destination and the whole ReplicaBatch).
- Pure: hashing only, no grpc, no clock. The servicer's check and the forwarder call it.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import Iterable, Mapping, NamedTuple, Sequence

CREDENTIAL_HEADER = "x-grouper-forward-credential"  # gRPC metadata keys are lower case
CREDENTIAL_VERSION = "v1"
KEY_LABEL = b"grouper forwarding credential v1"  # fixed: changing it changes every key


class CredentialKind(NamedTuple):
    """What one kind of call is signed with; every field is fixed (changing one changes every credential)."""

    header: str  # the gRPC metadata key carrying it
    key_label: bytes  # the key is HMAC-SHA256(secret, key_label)
    digest_label: bytes  # what the batch digest starts with
    claimant: str  # the batch's field naming the node that calls
    what: str  # in refusals: "forwarding", "replication"


FORWARDING = CredentialKind(CREDENTIAL_HEADER, KEY_LABEL, b"grouper forward batch\x00", "source_node", "forwarding")
REPLICATION = CredentialKind("x-grouper-replica-credential", b"grouper replication credential v1",
                             b"grouper replica batch\x00", "owner_node", "replication")


def derive_key(secret: str, kind: CredentialKind = FORWARDING) -> bytes:
    return hmac.new(secret.encode("utf-8"), kind.key_label, hashlib.sha256).digest()


def batch_digest(batch, destination_node: str, kind: CredentialKind = FORWARDING) -> bytes:
    """SHA-256 over the batch's deterministic protobuf encoding (a peer_pb2.ForwardBatch or ReplicaBatch:
    no maps, so one encoding per content) and its destination, length-prefixed. ~6x cheaper than hashing
    field by field from Python (the encoder runs in C); a sender that encodes otherwise is refused, never
    misread."""
    destination = destination_node.encode("utf-8")
    digest = hashlib.sha256(kind.digest_label)
    digest.update(struct.pack("<I", len(destination)))
    digest.update(destination)
    digest.update(batch.SerializeToString(deterministic=True))
    return digest.digest()


class Signer:
    """The forwarder's end: signs with the first secret."""

    def __init__(self, secrets: Sequence[str], kind: CredentialKind = FORWARDING):
        if not secrets:
            raise ValueError("a signer needs at least one raft secret")
        self.kind = kind
        self._key = derive_key(secrets[0], kind)

    def credential(self, batch, destination_node: str) -> str:
        mac = hmac.new(self._key, batch_digest(batch, destination_node, self.kind), hashlib.sha256).hexdigest()
        return f"{CREDENTIAL_VERSION}:{mac}"

    def metadata(self, batch, destination_node: str) -> tuple[tuple[str, str]]:
        return ((self.kind.header, self.credential(batch, destination_node)),)


class Verifier:
    """The owner's end: a batch's credential must verify with one of the accepted secrets."""

    def __init__(self, secrets: Iterable[str], own_node: str, kind: CredentialKind = FORWARDING):
        self.kind = kind
        self._keys = tuple(derive_key(secret, kind) for secret in secrets)
        if not self._keys:
            raise ValueError("a verifier needs at least one raft secret")
        self.own_node = own_node

    def refusal(self, batch, metadata: Mapping[str, str]) -> str:
        """'' when the batch's credential verifies; else why not, for the caller and the log."""
        what = self.kind.what
        credential = metadata.get(self.kind.header, "")
        if not credential:
            return (f"the call carries no {what} credential: this cluster authenticates {what} with a key "
                    f"derived from its raft secret; give the node the cluster's raft_secret_file")
        version, _, mac_hex = credential.partition(":")
        if version != CREDENTIAL_VERSION:
            return (f"the {what} credential is of version {version!r}; this node reads {CREDENTIAL_VERSION!r}: "
                    f"upgrade the nodes one version step at a time")
        try:
            mac = bytes.fromhex(mac_hex)
        except ValueError:
            mac = b""
        digest = batch_digest(batch, self.own_node, self.kind)
        if not any(hmac.compare_digest(hmac.new(key, digest, hashlib.sha256).digest(), mac) for key in self._keys):
            return (f"the {what} credential does not verify with this node's raft secrets for a batch from "
                    f"{getattr(batch, self.kind.claimant)!r} to {self.own_node!r}: the caller has another raft "
                    f"secret (rotate by adding the new secret to every node's file first), the batch was altered "
                    f"on its way, or its credential is of another kind (each kind of call has its own key)")
        return ""
