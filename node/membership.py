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
  A member on this node's own host is not asked: at this node's admin port it would be this node
  itself (`grouper up` gives each node of one host its own ports), which knows nothing yet.
- A secured cluster is asked as the management CLI asks it (`call_options`): over admin TLS when
  this node has it (trusting admin_tls_ca_file and cluster_tls_ca_file, showing this node's admin
  certificate when the members ask for one, checking cluster_tls_server_name if set), as the user
  $GROUPER_USER with the password $GROUPER_PASSWORD, the CLI's variables (a Kubernetes Secret sets
  them). A password never crosses the network unencrypted: without admin TLS the node refuses to
  start if a member to ask is not on a loopback address. Without a user the members see this
  node's admin certificate, if they ask for one, or no identity.
- Runs on the main thread before the node reports ready; it only talks gRPC to other nodes.
"""

from __future__ import annotations

import logging
import os
import time

from node.admin.client import AccessDenied, AdminClient, AdminError
from node.core.errors import GrouperError, InvalidConfig

log = logging.getLogger("grouper.membership")

JOIN_CALL_TIMEOUT_MS = 5000  # one admin call to a member
JOIN_ROUND_PAUSE_S = 1.0  # between rounds over all members
IDENTITY_CALL_TIMEOUT_MS = 2000  # one admin call asking a member whether it knows this node
RAFT_STATE_FILES = ("raft.journal", "raft.journal.meta", "raft.dump")  # handler/member_memory.py names them
USER_ENV = "GROUPER_USER"  # the management CLI's names (node/admin/commands.py)
PASSWORD_ENV = "GROUPER_PASSWORD"


def call_options(config, members: list[str], environ=None) -> dict:
    """AdminClient keywords for asking `members` (raft addresses) on this node's behalf."""
    from node.admin.callers import basic_metadata
    from node.admin.tls import peer_channel_credentials
    from node.net import is_loopback_address

    environ = os.environ if environ is None else environ
    credentials = peer_channel_credentials(config)
    options: dict = {"credentials": credentials}
    if credentials is not None and config.cluster_tls_server_name:
        options["server_name"] = config.cluster_tls_server_name
    user = environ.get(USER_ENV, "")
    if not user:
        if environ.get(PASSWORD_ENV):
            raise InvalidConfig(USER_ENV, f"must be set too: ${PASSWORD_ENV} is set but says nobody's password")
        return options
    password = environ.get(PASSWORD_ENV, "")
    if not password:
        raise InvalidConfig(PASSWORD_ENV, f"is empty or unset: ${USER_ENV} ({user}) needs a password to ask the "
                                          f"members")
    exposed = [member for member in members if not is_loopback_address(member)]
    if credentials is None and exposed:
        raise InvalidConfig(USER_ENV, f"the password of {user} would cross the network to {exposed[0]} "
                                      f"unencrypted: give this node admin TLS (admin_tls_cert_file and "
                                      f"admin_tls_key_file, with the cluster's CA in cluster_tls_ca_file)")
    options["metadata"] = basic_metadata(user, password)
    return options


def join(node_id: str, members: list[str], admin_port: int, timeout_ms: int, options: dict | None = None) -> str:
    """Have one of `members` (raft addresses) add `node_id`; returns the member that did (or knew it).
    `options`: `call_options`' AdminClient keywords."""
    if not members:
        raise GrouperError("--join needs --peers naming at least one member of the cluster to ask")
    deadline = time.monotonic() + timeout_ms / 1000
    last = "no member answered"
    while True:
        for member in members:
            address = _admin_address(member, admin_port)
            try:
                with AdminClient(address, timeout_ms=JOIN_CALL_TIMEOUT_MS, **(options or {})) as client:
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
            except AccessDenied as error:
                last = f"{address} refused this node ({error.message}); set ${USER_ENV} and ${PASSWORD_ENV} to a " \
                       f"user with manage on '#'"
            except AdminError as error:
                last = f"{address}: {error.message}"
        if time.monotonic() >= deadline:
            raise GrouperError(f"could not join the cluster within {timeout_ms} ms (join_timeout_ms); last answer: "
                               f"{last}. Are the members in --peers up, and do they use admin port {admin_port}?")
        log.info("not joined yet (%s); trying again", last)
        time.sleep(JOIN_ROUND_PAUSE_S)


def refuse_lost_identity(node_id: str, members: list[str], admin_port: int, raft_dir: str,
                         options: dict | None = None) -> None:
    """Raise if this node's raft state is missing but a member knows it as one that ran before.
    `options`: `call_options`' AdminClient keywords."""
    if any(os.path.exists(os.path.join(raft_dir, name)) for name in RAFT_STATE_FILES):
        return
    own_address = _admin_address(node_id, admin_port)
    for member in members:
        address = _admin_address(member, admin_port)
        if address == own_address:  # this node itself, or a member on its host with ports of its own
            continue
        try:
            with AdminClient(address, timeout_ms=IDENTITY_CALL_TIMEOUT_MS, **(options or {})) as client:
                status = client.cluster_status(local_only=True)
        except AccessDenied as error:
            log.warning("%s refused to say whether the cluster knows %s (%s): set $%s and $%s to a user with "
                        "manage on '#' so this check can run; starting as a founding member", address, node_id,
                        error.message, USER_ENV, PASSWORD_ENV)
            continue
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
