"""The node's one configuration object: built from defaults, a TOML file, environment, then flags.

Later sources win. Every field has a default, a unit in its name where it has one, and a comment.
Queue declarations live in the same TOML file as `[[queue]]` tables, and the settings of auto-created
queues in `[[address-setting]]` tables over one `[template]`, multicast addresses in `[[address]]`
tables with their subscription queues as `[[address.queue]]` (see README). A bad key or value
raises `InvalidConfig` naming it; `grouper node` turns that into a non-zero exit.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib
from dataclasses import dataclass, field

from handler.leader_duties import GROUP_TIMEOUT_MS_DEFAULT
from handler.placement import PLACEMENT_BALANCED, PLACEMENTS
from node.core.address_settings import AddressSettings
from node.core.errors import InvalidConfig
from node.core.settings import QueueSettings
from node.http_port.hosts import parse_names

ENV_PREFIX = "GROUPER_"
HTTP_PORT_OFFSET = 3  # http_port = amqp_port + 3 when only amqp_port is given: a second node on one host just works
ROUTE_FOLLOW_MIN_MS = 1000  # the shortest route_follow_ms other than 0
TRACE_FILE_MIN_BYTES = 1024  # the smallest trace_file_max_bytes: a file holds a few lines at least
PASSWORD_CHARS_MAX = 1024  # node/users.py's PASSWORD_LENGTH_MAX_CHARS: a longer minimum could never be met
CONNECTIONS_MAX_CEILING = 900  # each connection is a file descriptor; many systems cap a process at 1024 by default


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
    # bytes of queued messages' records (seq, group, flags; node/core/cold.py counts each message as 160 and
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
    # the rest of a durable backlog is only in the journal, read back in order (node/core/outbound.py);
    # 0 = no bound (all of it in memory)
    outbound_memory_max_bytes: int = 32 << 20
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
        for key in ("amqp_port", "admin_port", "raft_port", "http_port", "amqps_port", "peer_port"):
            if not 0 <= getattr(self, key) <= 65535:
                raise InvalidConfig(key, "must be a TCP port number 0..65535")
        if not 1 <= self.connections_max <= CONNECTIONS_MAX_CEILING:
            raise InvalidConfig("connections_max", f"must be 1..{CONNECTIONS_MAX_CEILING}")
        for key in ("link_unsettled_max", "producer_credit_window", "admin_timeout_ms", "handler_timeout_ms",
                    "forward_timeout_ms", "election_timeout_min_ms", "routes_max", "join_timeout_ms",
                    "handshake_timeout_ms", "connections_per_address_max"):
            if getattr(self, key) < 1:
                raise InvalidConfig(key, "must be >= 1")
        if not 1 <= self.password_chars_min <= PASSWORD_CHARS_MAX:
            raise InvalidConfig("password_chars_min", f"must be 1..{PASSWORD_CHARS_MAX} characters (12 or more is "
                                                      f"advised)")
        if not 512 <= self.sasl_frame_max_bytes <= 65536:
            raise InvalidConfig("sasl_frame_max_bytes", "must be 512..65536 (AMQP's SASL frames may be 512 bytes)")
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise InvalidConfig("tls_cert_file" if not self.tls_cert_file else "tls_key_file",
                                "TLS needs both tls_cert_file and tls_key_file")
        if self.tls_ca_file and not self.tls_cert_file:
            raise InvalidConfig("tls_ca_file", "client certificates need TLS: set tls_cert_file and tls_key_file")
        for prefix, port in (("admin_tls", "admin port"), ("http_tls", "HTTP port")):
            cert, key = getattr(self, f"{prefix}_cert_file"), getattr(self, f"{prefix}_key_file")
            if bool(cert) != bool(key):
                raise InvalidConfig(f"{prefix}_key_file" if cert else f"{prefix}_cert_file",
                                    f"TLS on the {port} needs both {prefix}_cert_file and {prefix}_key_file")
        if self.admin_tls_ca_file and not self.admin_tls_cert_file:
            raise InvalidConfig("admin_tls_ca_file", "client certificates need admin TLS: set admin_tls_cert_file "
                                                     "and admin_tls_key_file")
        if self.admin_tls_cert_file and self.peer_list() and not self.cluster_tls_cert_file:
            raise InvalidConfig("admin_tls_cert_file", "in a cluster, admin TLS needs cluster TLS (cluster_tls_*): "
                                                       "without it the other members forward messages to the admin "
                                                       "port in plaintext")
        if self.metrics_auth not in ("open", "basic"):
            raise InvalidConfig("metrics_auth", f"expected open or basic, got {self.metrics_auth!r}")
        try:
            parse_names(self.http_allowed_hosts)
        except ValueError as error:
            raise InvalidConfig("http_allowed_hosts", str(error)) from None
        cluster_tls = [key for key in ("cluster_tls_cert_file", "cluster_tls_key_file", "cluster_tls_ca_file")
                       if getattr(self, key)]
        if cluster_tls and len(cluster_tls) < 3:
            raise InvalidConfig(next(key for key in ("cluster_tls_cert_file", "cluster_tls_key_file",
                                                     "cluster_tls_ca_file") if key not in cluster_tls),
                                "cluster TLS needs cluster_tls_cert_file, cluster_tls_key_file and cluster_tls_ca_file")
        if self.cluster_tls_server_name and not cluster_tls:
            raise InvalidConfig("cluster_tls_server_name", "is checked in peers' certificates: set cluster TLS too")
        if self.journal_compact_min_bytes < 0:
            raise InvalidConfig("journal_compact_min_bytes", "must be >= 0")
        if self.message_memory_max_bytes < 0:
            raise InvalidConfig("message_memory_max_bytes", "must be >= 0 bytes (0 = no node-wide budget)")
        if self.record_memory_max_bytes < 0:
            raise InvalidConfig("record_memory_max_bytes", "must be >= 0 bytes (0 = every record stays in memory)")
        if self.group_timeout_ms < 0:
            raise InvalidConfig("group_timeout_ms", f"must be >= 0 (0 = routes never expire and a cluster that saw "
                                f"routes_max groups takes no new one; default {GROUP_TIMEOUT_MS_DEFAULT})")
        if self.owner_failover_ms < 0:
            raise InvalidConfig("owner_failover_ms", "must be >= 0 (0 = a dead owner keeps its groups)")
        for key in ("outbound_max_bytes", "outbound_total_max_bytes", "outbound_memory_max_bytes"):
            if getattr(self, key) < 0:
                raise InvalidConfig(key, "must be >= 0 bytes (0 = the outbound store has no such bound)")
        if self.outbound_max_messages < 0:
            raise InvalidConfig("outbound_max_messages", "must be >= 0 messages (0 = no bound)")
        if 0 < self.outbound_total_max_bytes < self.outbound_max_bytes:
            raise InvalidConfig("outbound_total_max_bytes", f"{self.outbound_total_max_bytes} bytes is less than "
                                f"outbound_max_bytes ({self.outbound_max_bytes} bytes), the bound for one owner: "
                                f"raise it, or lower outbound_max_bytes")
        if self.route_follow_ms and self.route_follow_ms < ROUTE_FOLLOW_MIN_MS:
            raise InvalidConfig("route_follow_ms", f"must be 0 (groups stay where they were placed) or at least "
                                f"{ROUTE_FOLLOW_MIN_MS}: consumer counts reach the raft log a tick or more late, "
                                f"and a shorter wait would move groups away from consumers that are reconnecting")
        if self.placement not in PLACEMENTS:
            raise InvalidConfig("placement", f"must be one of {', '.join(PLACEMENTS)}, got {self.placement!r}")
        if self.election_timeout_max_ms <= self.election_timeout_min_ms:
            raise InvalidConfig("election_timeout_max_ms", "must be greater than election_timeout_min_ms")
        for peer in self.peer_list():
            host, _, port = peer.rpartition(":")
            if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
                raise InvalidConfig("peers", f"{peer!r} is not HOST:PORT (a raft address)")
        if self.peer_list() and self.raft_port == 0:
            raise InvalidConfig("raft_port", "a cluster node needs a fixed raft port (the others dial it)")
        listed = {peer.strip() for peer in self.peers.split(",") if peer.strip()}
        if listed and not self.join and self.node_id not in listed:
            raise InvalidConfig("peers", f"this node is {self.node_id} (advertise_host or host, and raft_port) but "
                                f"--peers does not list it ({', '.join(sorted(listed))}): list every founding "
                                f"member including this one, fix --advertise-host/--raft-port, or pass --join "
                                f"to join a running cluster")
        if not self.data_dir:
            raise InvalidConfig("data_dir", "must name a directory")
        if self.trace_file_max_bytes < TRACE_FILE_MIN_BYTES:
            raise InvalidConfig("trace_file_max_bytes", f"must be at least {TRACE_FILE_MIN_BYTES} bytes")
        if self.trace_max_bytes < 2 * self.trace_file_max_bytes:
            raise InvalidConfig("trace_max_bytes", f"{self.trace_max_bytes} bytes keeps less than two trace files of "
                                f"trace_file_max_bytes ({self.trace_file_max_bytes}): raise it, or lower "
                                f"trace_file_max_bytes")
        names = [q.name for q in self.queues]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise InvalidConfig("queue.name", f"declared more than once: {', '.join(duplicates)}")
        clashes = sorted(set(names) & (set(self.multicast_addresses) | {q.address for q in self.queues}))
        if clashes:
            raise InvalidConfig("address.name", f"{clashes[0]!r} is both a multicast address and a queue: a name "
                                f"is one or the other; rename the queue and give it address = {clashes[0]!r}")
        for where, table in [("template", self.template)] + [
                (f"address-setting[{index}]", table) for index, table in enumerate(self.address_settings)]:
            if isinstance(table, dict) and "address" in table:
                raise InvalidConfig(f"{where}.address", "subscriptions are declared, not matched: put the queue "
                                    "under its [[address]] table")
        self.auto_create_settings()
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


_FIELDS = {f.name: f for f in dataclasses.fields(NodeConfig)}
_TABLES = ("queues", "template", "address_settings", "multicast_addresses")  # fields only a config file's tables give


def files_stamp(paths) -> tuple:
    """Changes whenever one of the files does (a Secret's update swaps a symlink, so the inode changes):
    per path (mtime_ns, size, inode), or None for a path that is empty or cannot be read."""
    stamps = []
    for path in paths:
        try:
            status = os.stat(path) if path else None
        except OSError:
            status = None
        stamps.append((status.st_mtime_ns, status.st_size, status.st_ino) if status else None)
    return tuple(stamps)


def _coerce(key: str, value, source: str, name: str = ""):
    """`name`: how the error names the setting, when not `source` + `key` (an environment variable's
    name is upper case: GROUPER_AMQP_PORT)."""
    name = name or f"{source}{key}"
    default = _FIELDS[key].default
    if isinstance(default, bool):
        if isinstance(value, str):
            lowered = value.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
        if isinstance(value, bool):
            return value
        raise InvalidConfig(name, f"expected true or false, got {value!r}")
    if isinstance(default, int):
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            return value
        raise InvalidConfig(name, f"expected an integer, got {value!r}")
    if not isinstance(value, str):
        raise InvalidConfig(name, f"expected a string, got {value!r}")
    return value


def load(config_file: str | None = None, environ: dict | None = None, overrides: dict | None = None) -> NodeConfig:
    values: dict = {}
    queues: list[QueueSettings] = []
    if config_file:
        try:
            with open(config_file, "rb") as handle:
                document = tomllib.load(handle)
        except OSError as error:
            raise InvalidConfig("config", f"cannot read {config_file}: {error.strerror}") from None
        except tomllib.TOMLDecodeError as error:
            raise InvalidConfig("config", f"{config_file} is not valid TOML: {error}") from None
        for key, value in document.get("node", {}).items():
            norm = key.replace("-", "_")
            if norm not in _FIELDS or norm in _TABLES:
                raise InvalidConfig(f"node.{key}", "unknown setting")
            values[norm] = _coerce(norm, value, "node.")
        for index, table in enumerate(document.get("queue", [])):
            if not isinstance(table, dict):
                raise InvalidConfig(f"queue[{index}]", "must be a table")
            queues.append(QueueSettings.from_dict(table, where=f"queue[{index}]"))
        template = document.get("template", {})
        if not isinstance(template, dict):
            raise InvalidConfig("template", "must be a table")
        values["template"] = template
        address_settings = document.get("address-setting", [])
        if not isinstance(address_settings, list):
            raise InvalidConfig("address-setting", "must be an array of tables: write [[address-setting]]")
        values["address_settings"] = tuple(address_settings)
        addresses, subscriptions = _addresses(document.get("address", []))
        values["multicast_addresses"] = addresses
        queues.extend(subscriptions)
        unknown = set(document) - {"node", "queue", "template", "address-setting", "address"}
        if unknown:
            raise InvalidConfig(sorted(unknown)[0], "unknown section")
    environ = os.environ if environ is None else environ
    for key in _FIELDS:
        env_key = ENV_PREFIX + key.upper()
        if key not in _TABLES and env_key in environ:
            values[key] = _coerce(key, environ[env_key], ENV_PREFIX, env_key)
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = _coerce(key, value, "--") if key not in _TABLES else value
    values["queues"] = tuple(queues) + tuple(values.get("queues", ()))
    if "amqp_port" in values and "http_port" not in values:
        amqp_port = values["amqp_port"]
        values["http_port"] = amqp_port + HTTP_PORT_OFFSET if amqp_port else 0
        if values["http_port"] > 65535:
            raise InvalidConfig("http_port", f"amqp_port {amqp_port} + {HTTP_PORT_OFFSET} is past 65535; give "
                                             f"--http-port")
    return NodeConfig(**values).validate()


ADDRESS_KEYS = ("name", "routing", "queue")  # the keys of an [[address]] table


def _addresses(tables) -> tuple[tuple, list[QueueSettings]]:
    """[[address]] tables, as Artemis's <address name="..."><multicast><queue name="..."/>: the multicast
    address names and their subscription queues (each a queue table bound to its address)."""
    if not isinstance(tables, list):
        raise InvalidConfig("address", "must be an array of tables: write [[address]]")
    names: list[str] = []
    queues: list[QueueSettings] = []
    for index, table in enumerate(tables):
        where = f"address[{index}]"
        if not isinstance(table, dict):
            raise InvalidConfig(where, "must be a table")
        unknown = sorted(set(table) - set(ADDRESS_KEYS))
        if unknown:
            raise InvalidConfig(f"{where}.{unknown[0]}", f"unknown key; an [[address]] has {', '.join(ADDRESS_KEYS)}")
        name = table.get("name")
        if not isinstance(name, str) or not name or len(name) > 255 or "::" in name \
                or any(ord(char) < 32 for char in name):
            raise InvalidConfig(f"{where}.name", "an address name is 1..255 characters, without '::' or control "
                                "characters")
        if name in names:
            raise InvalidConfig(f"{where}.name", f"{name!r} is declared by an earlier [[address]] table too")
        routing = table.get("routing", "multicast")
        if routing != "multicast":
            raise InvalidConfig(f"{where}.routing", f"{routing!r}: only multicast addresses are declared here; an "
                                "anycast address is a queue of its name: declare it as [[queue]]")
        subscriptions = table.get("queue", [])
        if not isinstance(subscriptions, list):
            raise InvalidConfig(f"{where}.queue", "must be an array of tables: write [[address.queue]]")
        for position, values in enumerate(subscriptions):
            queue_where = f"{where}.queue[{position}]"
            if not isinstance(values, dict):
                raise InvalidConfig(queue_where, "must be a table")
            if values.get("address", name) != name:
                raise InvalidConfig(f"{queue_where}.address", f"a queue under [[address]] {name!r} subscribes to it")
            queues.append(QueueSettings.from_dict({**values, "address": name}, where=queue_where))
        names.append(name)
    return tuple(names), queues
