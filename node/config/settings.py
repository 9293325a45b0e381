"""NodeConfig: the node's one configuration object, a frozen dataclass of every setting.

Rules:
- Every field has a default, a unit in its name where it has one, and a comment; later sources win
  (node/config/loading.py: defaults, a TOML file, environment, then flags).
- `validate()` runs the cross-field checks of node/config/rules.py and returns the config itself; a bad
  value raises `InvalidConfig` naming it.
- Plain data: reading it does no I/O; the methods only derive paths and lists from the fields.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from node.core.replication.channel import BACKLOG_MAX_BYTES, BACKLOG_MAX_MESSAGES, LAG_MS
from node.core.replication.streams import CATCH_UP_MAX_BYTES_PER_S
from handler.leader_duties import GROUP_TIMEOUT_MS_DEFAULT, REPLICA_FAILOVER_MS_DEFAULT, REPLICATION_FACTOR_DEFAULT
from handler.placement import PLACEMENT_BALANCED
from node.config import rules
from node.core.cluster.owner_lease import REPLICA_LEASE_MS_DEFAULT
from node.core.dispatch.address_settings import AddressSettings
from node.core.dispatch.settings import QueueSettings


@dataclass(frozen=True)
class NodeConfig:
    host: str = "127.0.0.1"  # address the AMQP and admin listeners bind
    amqp_port: int = 5672  # AMQP 1.0 listener; 0 picks a free port
    admin_port: int = 5673  # gRPC admin listener; 0 picks a free port
    http_port: int = 5675  # HTTP /healthz, /readyz and /metrics; 0 picks a free port; see HTTP_PORT_OFFSET
    data_dir: str = "./data"  # journal directory
    # refuse to start unless data_dir exists on a file system of its own (a mounted volume), so a
    # container never keeps its journal on a layer that vanishes with it; the image turns this on
    require_data_volume: bool = False
    auto_create: bool = True  # create a queue when a client attaches to an unknown address
    default_group: str = ""  # node-wide name of the default group of shared queues ("" = qpid.no-group)
    journal_fsync: bool = True  # fsync each journal batch before confirming producers
    journal_compact_min_bytes: int = 64 << 20  # journal size below which compaction is never tried
    # bytes of message bodies all durable queues together keep in RAM; past it the bodies of journalled
    # messages live only in the journal, read back ahead of dispatch (README "Paging"); 0 = no node budget
    message_memory_max_bytes: int = 256 << 20
    # bytes of queued messages' records (seq, group, flags; node/core/dispatch/cold.py counts each message as 160 and
    # each group as 256) all durable queues together keep in RAM; past it a queue's newest messages wait
    # in the journal as 8-byte seqs, read back whole as consumers near them (README "Paging"); 0 = no
    # budget
    record_memory_max_bytes: int = 64 << 20
    connections_max: int = 512  # open AMQP connections; more are refused with a condition
    link_unsettled_max: int = 1000  # unsettled deliveries per consumer link (caps granted credit)
    producer_credit_window: int = 500  # credit granted to each producer link, topped up as it drains
    admin_timeout_ms: int = 5000  # deadline of an admin call waiting for the engine loop
    # ---- security (README "Security") ----
    users_file: str = ""  # user database (JSON, `grouper user`); "" = <data_dir>/users.json; none: anonymous only
    allow_anonymous: bool = False  # anonymous clients on a non-loopback host, or beside a user database
    sasl_plain_on_loopback: bool = False  # SASL PLAIN without TLS, for clients connecting from a loopback address
    handshake_timeout_ms: int = 10_000  # from accepting a socket to the client's AMQP open (TLS, SASL included)
    sasl_frame_max_bytes: int = 4096  # largest SASL frame read before authentication
    connections_per_address_max: int = 256  # open AMQP connections from one source address (half of connections_max)
    # fewest characters of a new password (`grouper user add`/`passwd`, GROUPER_DEFAULT_PASSWORD); logins only compare
    password_chars_min: int = 12
    tls_cert_file: str = ""  # PEM certificate chain; with tls_key_file, AMQP over TLS is served on amqps_port
    tls_key_file: str = ""  # PEM private key of tls_cert_file
    tls_ca_file: str = ""  # PEM CAs whose client certificates are accepted (SASL EXTERNAL); "" = none asked for
    amqps_port: int = 5671  # AMQP over TLS listener (with tls_cert_file); 0 picks a free port
    # admin gRPC port and HTTP port; admin TLS is never inherited from tls_* (give the same paths to share)
    admin_tls_cert_file: str = ""  # PEM certificate chain; with admin_tls_key_file the admin port speaks TLS only
    admin_tls_key_file: str = ""  # PEM private key of admin_tls_cert_file
    admin_tls_ca_file: str = ""  # PEM CAs: every admin client must show a certificate they signed (CN = user)
    metrics_auth: str = "open"  # /metrics: "open", or "basic" (HTTP basic auth, a user with manage on '#')
    http_tls_cert_file: str = ""  # PEM certificate chain; with http_tls_key_file the HTTP port speaks HTTPS only
    http_tls_key_file: str = ""  # PEM private key of http_tls_cert_file
    # more names the HTTP port answers to, comma-separated, besides IP addresses, localhost, host,
    # advertise_host and the machine's name ("*": any; README "Health and metrics", node/http_port/hosts.py)
    http_allowed_hosts: str = ""
    # ---- delivery traces of queues with trace = true (README "Auditing deliveries") ----
    trace_dir: str = ""  # where the trace files go; "" = <data_dir>/traces
    trace_file_max_bytes: int = 64 << 20  # a trace file is closed and a new one begun past this size
    trace_max_bytes: int = 1 << 30  # trace files kept in all; past it the oldest are deleted
    # ---- cluster (leave peers empty for a single node) ----
    peers: str = ""  # comma-separated raft addresses HOST:PORT of the cluster's nodes (this one may be listed too)
    raft_port: int = 5674  # raft (grouping handler) listener of this node
    advertise_host: str = ""  # host other nodes reach this one by ("" = host); with raft_port, the node id
    join: bool = False  # not a founding member: ask the members in peers to add this node, then serve
    join_timeout_ms: int = 60_000  # give up joining (exit non-zero) when no member adds this node within this
    handler_timeout_ms: int = 5000  # a group's route not decided within this is a refused send
    # a route no node used, held messages of or had an owner of for this long is expired by the leader,
    # freeing its routes_max slot (thirty minutes: handler/leader_duties.py says why); 0 = never
    group_timeout_ms: int = GROUP_TIMEOUT_MS_DEFAULT
    forward_timeout_ms: int = 5000  # deadline of one forwarded batch to its owner node
    owner_failover_ms: int = 0  # a member unreachable this long loses its groups to live nodes; 0 = never (order first)
    # ---- replicated messages (issue 28, docs/replication.md) ----
    # an owner unreachable this long has its groups promoted to their in-sync backups; 0 = never. Only
    # backups the owner declared in sync are promoted, so without replica streams nothing changes
    replica_failover_ms: int = REPLICA_FAILOVER_MS_DEFAULT
    # copies of a durable queue's message, its owner's included, for queues whose settings give none (1..5)
    replication_factor: int = REPLICATION_FACTOR_DEFAULT
    # a group whose node has had no consumer on its queue this long moves, with its queued messages and
    # in order, to a node that has some; 0 = never (a group stays where it was first placed). Every node
    # of a cluster must have the same value
    route_follow_ms: int = 0
    # where a new group goes (README "Placement of new groups"): "balanced", the node whose consumers of
    # the queue hold the fewest groups per consumer (this node on a near tie), or "local", this node
    # whenever it has a consumer of the queue. Each claim carries its proposer's mode through the raft
    # log, so replicas always agree; nodes with different modes only place their own groups differently
    placement: str = PLACEMENT_BALANCED
    election_timeout_min_ms: int = 200  # raft: a follower hearing no leader for this long (randomised
    election_timeout_max_ms: int = 500  # up to the max) starts an election
    routes_max: int = 1_000_000  # routes (queue, group) the cluster holds; more are refused
    # payload bytes this node holds in its outbound store for one owner node (accepted, not yet taken by
    # it: a dead owner's backlog); past it, sends for that owner are refused; 0 = no bound
    outbound_max_bytes: int = 1 << 30
    # the same for every owner together (the store's share of this node's disk); 0 = no bound
    outbound_total_max_bytes: int = 4 << 30
    # messages this node holds in its outbound store for one owner node: each keeps a record in memory
    # (~30 bytes with its body paged: docs/benchmarks.md, "Outbound channel records in arrays"); past it,
    # sends for that owner are refused; 0 = no bound
    outbound_max_messages: int = 1_000_000
    # payload bytes of one owner's backlog kept in memory, given to its forwarder and not acknowledged;
    # the rest of a durable backlog is only in the journal, read back in order (node/core/cluster/outbound.py);
    # 0 = no bound (all of it in memory)
    outbound_memory_max_bytes: int = 32 << 20
    # ---- replica streams, the owner's side (issue 28 phase 3, node/core/replication/streams.py) ----
    replica_lag_ms: int = LAG_MS  # a backup not acknowledging for this long leaves the in-sync set
    replica_backlog_max_bytes: int = BACKLOG_MAX_BYTES  # entries waiting for one backup; full: sends refused
    replica_backlog_max_messages: int = BACKLOG_MAX_MESSAGES
    replica_catch_up_max_bytes_per_s: int = CATCH_UP_MAX_BYTES_PER_S  # a backup's catch-up copy, paced
    # ---- the owner's lease (issue 28, node/core/cluster/owner_lease.py) ----
    # a node that has not heard from the raft leader this long delivers nothing of its replicated queues and
    # refuses their sends until it does: it stops before the leader may promote its groups (replica_failover_ms;
    # both are intervals on one member's monotonic clock, Raft's leader lease, section 6.4). Half of the
    # default replica_failover_ms; validate() checks it fits below it with the raft fallback and a margin
    replica_lease_ms: int = REPLICA_LEASE_MS_DEFAULT
    # ---- between nodes (README "Security": Between nodes) ----
    cluster_tls_cert_file: str = ""  # PEM node certificate (serverAuth+clientAuth) signed by cluster_tls_ca_file
    cluster_tls_key_file: str = ""  # PEM private key of cluster_tls_cert_file
    cluster_tls_ca_file: str = ""  # PEM cluster CA: a peer must show a node certificate it signed
    cluster_tls_server_name: str = ""  # name every peer's certificate must carry, checked instead of the host dialled
    peer_port: int = 5676  # forwarding listener with mutual TLS (with cluster TLS; else on admin_port); 0 = any
    raft_secret_file: str = ""  # raft secrets, one a line: the first encrypts raft traffic, every one is accepted
    allow_insecure_cluster: bool = False  # a cluster node may run without a raft secret (and cluster TLS): logged loudly
    allow_loose_secret_files: bool = False  # a node with users on a non-loopback host may start with a secret file
    # that other local users can read (logged as a warning; node/file_modes.py)
    queues: tuple = field(default_factory=tuple)  # QueueSettings declared at start
    template: dict = field(default_factory=dict)  # settings of auto-created queues no address setting gives
    address_settings: tuple = field(default_factory=tuple)  # [[address-setting]] tables (dicts with match)
    multicast_addresses: tuple = field(default_factory=tuple)  # names of [[address]] tables (their queues: queues)

    def validate(self) -> "NodeConfig":
        rules.check(self)
        return self

    @property
    def node_id(self) -> str:
        return f"{self.advertise_host or self.host}:{self.raft_port}"

    def trace_path(self) -> str:
        return self.trace_dir or os.path.join(self.data_dir, "traces")

    def users_path(self) -> str:
        return self.users_file or os.path.join(self.data_dir, "users.json")

    def peer_list(self) -> list[str]:
        """The other nodes' raft addresses; empty: a single node, no cluster."""
        peers = [peer.strip() for peer in self.peers.split(",") if peer.strip()]
        return sorted({peer for peer in peers if peer != self.node_id})

    def template_settings(self) -> QueueSettings:
        return QueueSettings.from_dict({"name": "template", **self.template}, where="template")

    def auto_create_settings(self) -> AddressSettings:
        return AddressSettings.from_config(self.address_settings, self.template)
