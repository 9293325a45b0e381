"""Joining a running cluster, and refusing to rejoin one with a lost raft state under an old identity.

Rules:
- A member is asked through its admin API at the host of its raft address and at this node's own
  admin port: every node of one deployment (a StatefulSet, a compose file) uses the same ports.
- Joining is idempotent: a node the member already counts in its raft membership (a joined node
  that restarted) is not added twice. Members are tried in turn, with a pause between rounds,
  until one adds this node or `join_timeout_ms` passes; then the node refuses to start, naming the
  last answer it got, rather than serve outside the cluster.
- A node whose raft state is missing (no raft journal, meta or dump in its raft dir: a fresh or
  replaced volume) asks the other members, before its raft member starts, whether the cluster
  already knows it: a raft member that registered its addresses in the route table, so it ran
  before. If one says so, the node refuses to start and prints the steps that make it a new member:
  with an empty log under its old identity it could vote a second time in a term it already voted
  in, which breaks raft's safety. A member that does not answer (down, starting, or its admin API
  wants credentials) proves nothing: a founding member's first start must not wait for the others.
- Runs on the main thread before the node reports ready; it only talks gRPC to other nodes.
"""

from __future__ import annotations

import logging
import os
import time

from node.admin.client import AdminClient, AdminError
from node.core.errors import GrouperError

log = logging.getLogger("grouper.membership")

JOIN_CALL_TIMEOUT_MS = 5000  # one admin call to a member
JOIN_ROUND_PAUSE_S = 1.0  # between rounds over all members
IDENTITY_CALL_TIMEOUT_MS = 2000  # one admin call asking a member whether it knows this node
RAFT_STATE_FILES = ("raft.journal", "raft.journal.meta", "raft.dump")  # handler/service.py names them


def join(node_id: str, members: list[str], admin_port: int, timeout_ms: int) -> str:
    """Have one of `members` (raft addresses) add `node_id`; returns the member that did (or knew it)."""
    if not members:
        raise GrouperError("--join needs --peers naming at least one member of the cluster to ask")
    deadline = time.monotonic() + timeout_ms / 1000
    last = "no member answered"
    while True:
        for member in members:
            address = _admin_address(member, admin_port)
            try:
                with AdminClient(address, timeout_ms=JOIN_CALL_TIMEOUT_MS) as client:
                    status = client.cluster_status(local_only=True)
                    if not status["clustered"]:
                        last = f"{address} runs alone (no --peers): it cannot add members"
                        continue
                    if any(row["node"] == node_id and row.get("raft_member") for row in status["members"]):
                        log.info("already a member of the cluster (asked %s)", address)
                        return member
                    client.add_member(node_id)
                    log.info("joined the cluster: %s added %s", address, node_id)
                    return member
            except AdminError as error:
                last = f"{address}: {error.message}"
        if time.monotonic() >= deadline:
            raise GrouperError(f"could not join the cluster within {timeout_ms} ms (join_timeout_ms); last answer: "
                               f"{last}. Are the members in --peers up, and do they use admin port {admin_port}?")
        log.info("not joined yet (%s); trying again", last)
        time.sleep(JOIN_ROUND_PAUSE_S)


def refuse_lost_identity(node_id: str, members: list[str], admin_port: int, raft_dir: str) -> None:
    """Raise if this node's raft state is missing but a member knows it as one that ran before."""
    if any(os.path.exists(os.path.join(raft_dir, name)) for name in RAFT_STATE_FILES):
        return
    for member in members:
        if member == node_id:
            continue
        address = _admin_address(member, admin_port)
        try:
            with AdminClient(address, timeout_ms=IDENTITY_CALL_TIMEOUT_MS) as client:
                status = client.cluster_status(local_only=True)
        except AdminError as error:
            log.info("could not ask %s whether the cluster knows %s (%s); starting as a founding member",
                     address, node_id, error.message)
            continue
        known = [row for row in status["members"] if row["node"] == node_id and row.get("raft_member")
                 and row.get("amqp_address")]
        if known:
            raise GrouperError(
                f"this node's raft state is missing ({raft_dir} holds no raft journal), but the cluster knows "
                f"{node_id} as a member that ran before (registered with AMQP address "
                f"{known[0]['amqp_address']}, according to {address}). Rejoining with an empty raft log under "
                f"its old identity could vote twice in one term and break the cluster's agreement. To make it "
                f"a new member: run `grouper cluster remove-node {node_id} --node {address}`, then start this "
                f"node again with --join")


def _admin_address(member: str, admin_port: int) -> str:
    """Where a member's admin API is asked: the host of its raft address, this node's admin port."""
    return f"{member.rpartition(':')[0]}:{admin_port}"
