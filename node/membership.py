"""Joining a running cluster: a node that is not a founding member asks a member to add it.

Rules:
- A member is asked through its admin API at the host of its raft address and at this node's own
  admin port: every node of one deployment (a StatefulSet, a compose file) uses the same ports.
- Joining is idempotent: a node the member already counts in its raft membership (a joined node
  that restarted) is not added twice. Members are tried in turn, with a pause between rounds,
  until one adds this node or `join_timeout_ms` passes; then the node refuses to start, naming the
  last answer it got, rather than serve outside the cluster.
- Runs on the main thread before the node reports ready; it only talks gRPC to other nodes.
"""

from __future__ import annotations

import logging
import time

from node.admin.client import AdminClient, AdminError
from node.core.errors import GrouperError

log = logging.getLogger("grouper.membership")

JOIN_CALL_TIMEOUT_MS = 5000  # one admin call to a member
JOIN_ROUND_PAUSE_S = 1.0  # between rounds over all members


def join(node_id: str, members: list[str], admin_port: int, timeout_ms: int) -> str:
    """Have one of `members` (raft addresses) add `node_id`; returns the member that did (or knew it)."""
    if not members:
        raise GrouperError("--join needs --peers naming at least one member of the cluster to ask")
    deadline = time.monotonic() + timeout_ms / 1000
    last = "no member answered"
    while True:
        for member in members:
            address = f"{member.rpartition(':')[0]}:{admin_port}"
            try:
                with AdminClient(address, timeout_ms=JOIN_CALL_TIMEOUT_MS) as client:
                    status = client.cluster_status()
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
