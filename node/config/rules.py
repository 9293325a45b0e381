"""The cross-field checks of NodeConfig, one function per subject, run in a fixed order by `check`.

Rules:
- Each check raises `InvalidConfig(key, problem)` naming the setting at fault and what to do; the first
  failing check wins, so the order of `CHECKS` is part of the behaviour (a config wrong in two ways
  always reports the same one). Error texts are word for word what operators and tests read.
- Reads the config only: no I/O, no changes (the config is frozen).
- Named limits live here, each with its unit.
"""

from __future__ import annotations

from handler.leader_duties import GROUP_TIMEOUT_MS_DEFAULT
from handler.placement import PLACEMENTS
from node.core.errors import InvalidConfig
from node.core.cluster.owner_lease import check_lease, leader_fallback_ms
from node.core.replication.assignment import check_replication_factor
from node.http_port.hosts import parse_names

ROUTE_FOLLOW_MIN_MS = 1000  # the shortest route_follow_ms other than 0
TRACE_FILE_MIN_BYTES = 1024  # the smallest trace_file_max_bytes: a file holds a few lines at least
PASSWORD_CHARS_MAX = 1024  # node/scram_keys.py's PASSWORD_LENGTH_MAX_CHARS: a longer minimum could never be met
CONNECTIONS_MAX_CEILING = 900  # each connection is a file descriptor; many systems cap a process at 1024 by default


def check(config) -> None:
    """Every check of `config` (a NodeConfig), in order; raises InvalidConfig at the first that fails."""
    for check_subject in CHECKS:
        check_subject(config)


def _check_limits(config) -> None:
    """Ports, connection counts and the per-link, per-call and per-login bounds."""
    for key in ("amqp_port", "admin_port", "raft_port", "http_port", "amqps_port", "peer_port"):
        if not 0 <= getattr(config, key) <= 65535:
            raise InvalidConfig(key, "must be a TCP port number 0..65535")
    if not 1 <= config.connections_max <= CONNECTIONS_MAX_CEILING:
        raise InvalidConfig("connections_max", f"must be 1..{CONNECTIONS_MAX_CEILING}")
    for key in ("link_unsettled_max", "producer_credit_window", "admin_timeout_ms", "handler_timeout_ms",
                "forward_timeout_ms", "election_timeout_min_ms", "routes_max", "join_timeout_ms",
                "handshake_timeout_ms", "connections_per_address_max"):
        if getattr(config, key) < 1:
            raise InvalidConfig(key, "must be >= 1")
    if not 1 <= config.password_chars_min <= PASSWORD_CHARS_MAX:
        raise InvalidConfig("password_chars_min", f"must be 1..{PASSWORD_CHARS_MAX} characters (12 or more is "
                                                  f"advised)")
    if not 512 <= config.sasl_frame_max_bytes <= 65536:
        raise InvalidConfig("sasl_frame_max_bytes", "must be 512..65536 (AMQP's SASL frames may be 512 bytes)")


def _check_amqp_tls(config) -> None:
    """AMQP over TLS: a certificate and its key together; client certificates need TLS."""
    if bool(config.tls_cert_file) != bool(config.tls_key_file):
        raise InvalidConfig("tls_cert_file" if not config.tls_cert_file else "tls_key_file",
                            "TLS needs both tls_cert_file and tls_key_file")
    if config.tls_ca_file and not config.tls_cert_file:
        raise InvalidConfig("tls_ca_file", "client certificates need TLS: set tls_cert_file and tls_key_file")


def _check_admin_and_http_ports(config) -> None:
    """TLS of the admin and HTTP ports, who may read /metrics, and the names the HTTP port answers."""
    for prefix, port in (("admin_tls", "admin port"), ("http_tls", "HTTP port")):
        cert, key = getattr(config, f"{prefix}_cert_file"), getattr(config, f"{prefix}_key_file")
        if bool(cert) != bool(key):
            raise InvalidConfig(f"{prefix}_key_file" if cert else f"{prefix}_cert_file",
                                f"TLS on the {port} needs both {prefix}_cert_file and {prefix}_key_file")
    if config.admin_tls_ca_file and not config.admin_tls_cert_file:
        raise InvalidConfig("admin_tls_ca_file", "client certificates need admin TLS: set admin_tls_cert_file "
                                                 "and admin_tls_key_file")
    if config.admin_tls_cert_file and config.peer_list() and not config.cluster_tls_cert_file:
        raise InvalidConfig("admin_tls_cert_file", "in a cluster, admin TLS needs cluster TLS (cluster_tls_*): "
                                                   "without it the other members forward messages to the admin "
                                                   "port in plaintext")
    if config.metrics_auth not in ("open", "basic"):
        raise InvalidConfig("metrics_auth", f"expected open or basic, got {config.metrics_auth!r}")
    try:
        parse_names(config.http_allowed_hosts)
    except ValueError as error:
        raise InvalidConfig("http_allowed_hosts", str(error)) from None


def _check_cluster_tls(config) -> None:
    """TLS between nodes: all three files or none."""
    cluster_tls = [key for key in ("cluster_tls_cert_file", "cluster_tls_key_file", "cluster_tls_ca_file")
                   if getattr(config, key)]
    if cluster_tls and len(cluster_tls) < 3:
        raise InvalidConfig(next(key for key in ("cluster_tls_cert_file", "cluster_tls_key_file",
                                                 "cluster_tls_ca_file") if key not in cluster_tls),
                            "cluster TLS needs cluster_tls_cert_file, cluster_tls_key_file and cluster_tls_ca_file")
    if config.cluster_tls_server_name and not cluster_tls:
        raise InvalidConfig("cluster_tls_server_name", "is checked in peers' certificates: set cluster TLS too")


def _check_memory(config) -> None:
    """The journal's and the RAM budgets in bytes (0 = none)."""
    if config.journal_compact_min_bytes < 0:
        raise InvalidConfig("journal_compact_min_bytes", "must be >= 0")
    if config.message_memory_max_bytes < 0:
        raise InvalidConfig("message_memory_max_bytes", "must be >= 0 bytes (0 = no node-wide budget)")
    if config.record_memory_max_bytes < 0:
        raise InvalidConfig("record_memory_max_bytes", "must be >= 0 bytes (0 = every record stays in memory)")


def _check_routes_and_outbound(config) -> None:
    """Route expiry, owner failover and the outbound store's bounds."""
    if config.group_timeout_ms < 0:
        raise InvalidConfig("group_timeout_ms", f"must be >= 0 (0 = routes never expire and a cluster that saw "
                            f"routes_max groups takes no new one; default {GROUP_TIMEOUT_MS_DEFAULT})")
    if config.owner_failover_ms < 0:
        raise InvalidConfig("owner_failover_ms", "must be >= 0 (0 = a dead owner keeps its groups)")
    if config.replica_failover_ms < 0:
        raise InvalidConfig("replica_failover_ms", "must be >= 0 ms (0 = a dead owner's groups are never promoted "
                                                   "to their backups; default 3000)")
    try:
        check_replication_factor(config.replication_factor)
    except ValueError as error:
        raise InvalidConfig("replication_factor", f"{error}: the cluster default for queues that set none") from None
    lease_problem = check_lease(config.replica_lease_ms, config.replica_failover_ms,
                                leader_fallback_ms(config.election_timeout_max_ms))  # issue 28: the owner's lease
    if lease_problem is not None:
        raise InvalidConfig("replica_lease_ms", lease_problem)
    for key, unit in (("replica_lag_ms", "ms"), ("replica_backlog_max_bytes", "bytes"),  # issue 28 phase 3
                      ("replica_backlog_max_messages", "messages"), ("replica_catch_up_max_bytes_per_s", "bytes/s")):
        if getattr(config, key) < 1:
            raise InvalidConfig(key, f"must be >= 1 {unit}")
    for key in ("outbound_max_bytes", "outbound_total_max_bytes", "outbound_memory_max_bytes"):
        if getattr(config, key) < 0:
            raise InvalidConfig(key, "must be >= 0 bytes (0 = the outbound store has no such bound)")
    if config.outbound_max_messages < 0:
        raise InvalidConfig("outbound_max_messages", "must be >= 0 messages (0 = no bound)")
    if 0 < config.outbound_total_max_bytes < config.outbound_max_bytes:
        raise InvalidConfig("outbound_total_max_bytes", f"{config.outbound_total_max_bytes} bytes is less than "
                            f"outbound_max_bytes ({config.outbound_max_bytes} bytes), the bound for one owner: "
                            f"raise it, or lower outbound_max_bytes")


def _check_raft(config) -> None:
    """Following consumers, placement, elections and the raft addresses of the cluster."""
    if config.route_follow_ms and config.route_follow_ms < ROUTE_FOLLOW_MIN_MS:
        raise InvalidConfig("route_follow_ms", f"must be 0 (groups stay where they were placed) or at least "
                            f"{ROUTE_FOLLOW_MIN_MS}: consumer counts reach the raft log a tick or more late, "
                            f"and a shorter wait would move groups away from consumers that are reconnecting")
    if config.placement not in PLACEMENTS:
        raise InvalidConfig("placement", f"must be one of {', '.join(PLACEMENTS)}, got {config.placement!r}")
    if config.election_timeout_max_ms <= config.election_timeout_min_ms:
        raise InvalidConfig("election_timeout_max_ms", "must be greater than election_timeout_min_ms")
    for peer in config.peer_list():
        host, _, port = peer.rpartition(":")
        if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise InvalidConfig("peers", f"{peer!r} is not HOST:PORT (a raft address)")
    if config.peer_list() and config.raft_port == 0:
        raise InvalidConfig("raft_port", "a cluster node needs a fixed raft port (the others dial it)")
    listed = {peer.strip() for peer in config.peers.split(",") if peer.strip()}
    if listed and not config.join and config.node_id not in listed:
        raise InvalidConfig("peers", f"this node is {config.node_id} (advertise_host or host, and raft_port) but "
                            f"--peers does not list it ({', '.join(sorted(listed))}): list every founding "
                            f"member including this one, fix --advertise-host/--raft-port, or pass --join "
                            f"to join a running cluster")


def _check_files(config) -> None:
    """The data directory and the bounds of delivery trace files."""
    if not config.data_dir:
        raise InvalidConfig("data_dir", "must name a directory")
    if config.trace_file_max_bytes < TRACE_FILE_MIN_BYTES:
        raise InvalidConfig("trace_file_max_bytes", f"must be at least {TRACE_FILE_MIN_BYTES} bytes")
    if config.trace_max_bytes < 2 * config.trace_file_max_bytes:
        raise InvalidConfig("trace_max_bytes", f"{config.trace_max_bytes} bytes keeps less than two trace files of "
                            f"trace_file_max_bytes ({config.trace_file_max_bytes}): raise it, or lower "
                            f"trace_file_max_bytes")


def _check_declarations(config) -> None:
    """The [[queue]], [[address]], [template] and [[address-setting]] tables together."""
    names = [q.name for q in config.queues]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise InvalidConfig("queue.name", f"declared more than once: {', '.join(duplicates)}")
    clashes = sorted(set(names) & (set(config.multicast_addresses) | {q.address for q in config.queues}))
    if clashes:
        raise InvalidConfig("address.name", f"{clashes[0]!r} is both a multicast address and a queue: a name "
                            f"is one or the other; rename the queue and give it address = {clashes[0]!r}")
    for where, table in [("template", config.template)] + [
            (f"address-setting[{index}]", table) for index, table in enumerate(config.address_settings)]:
        if isinstance(table, dict) and "address" in table:
            raise InvalidConfig(f"{where}.address", "subscriptions are declared, not matched: put the queue "
                                "under its [[address]] table")
    config.auto_create_settings()


CHECKS = (_check_limits, _check_amqp_tls, _check_admin_and_http_ports, _check_cluster_tls, _check_memory,
          _check_routes_and_outbound, _check_raft, _check_files, _check_declarations)
