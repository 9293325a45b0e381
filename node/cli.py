"""The `grouper` command: `main(argv) -> int`, one sub-command per job.

`grouper node` runs a broker node in the foreground. The management sub-commands (`queue`,
`groups`, `group`) talk to a running node's admin API; they live in `node.admin.commands`.
Exit status: 0 success, 1 a failure reported by the node, 2 bad usage or configuration, 141 (as a
shell reports a command SIGPIPE ended) when stdout's reader went away (`grouper queue list | head -1`):
the command stops quietly, with no traceback. The codes are node/exit_codes.py's, which the
sub-commands import too (a leaf, so they never import this dispatcher back).
"""

from __future__ import annotations

import argparse
import os
import sys

from node.core.errors import InvalidConfig
from node.exit_codes import EXIT_BROKEN_PIPE, EXIT_OK, EXIT_USAGE


def _add_node_command(subparsers) -> None:
    parser = subparsers.add_parser("node", help="run one broker node in the foreground")
    _add_node_flags(parser)
    _add_security_flags(parser.add_argument_group("security (README: Security)"))
    _add_cluster_flags(parser.add_argument_group("cluster (leave --peers out for a single node)"))
    _add_between_nodes_flags(parser.add_argument_group("between nodes (README: Security, Between nodes)"))
    parser.set_defaults(run=_run_node)


def _add_node_flags(parser) -> None:
    parser.add_argument("--config", metavar="FILE",
                        help="TOML file with [node], [template], [[address-setting]] and [[queue]] tables")
    parser.add_argument("--host")
    parser.add_argument("--amqp-port", type=int)
    parser.add_argument("--admin-port", type=int)
    parser.add_argument("--http-port", type=int, help="HTTP /healthz, /readyz and /metrics (default 5675, or "
                                                         "--amqp-port + 3 when only that is given)")
    parser.add_argument("--data-dir")
    parser.add_argument("--no-auto-create", dest="auto_create", action="store_false", default=None,
                        help="refuse links to unknown queues with amqp:not-found")
    parser.add_argument("--default-group", help="node-wide name of the default group of shared queues")
    parser.add_argument("--no-fsync", dest="journal_fsync", action="store_false", default=None,
                        help="skip fsync of journal batches (faster, loses recent messages on power loss)")


def _add_security_flags(security) -> None:
    security.add_argument("--users-file", metavar="FILE", help="user database (default DATA_DIR/users.json); "
                                                                "without one, clients are anonymous")
    security.add_argument("--allow-anonymous", action="store_true", default=None,
                          help="let anonymous clients in on a non-loopback host, or beside a user database")
    security.add_argument("--sasl-plain-on-loopback", action="store_true", default=None,
                          help="offer SASL PLAIN without TLS to clients connecting from a loopback address")
    security.add_argument("--tls-cert-file", metavar="PEM", help="certificate chain: serve AMQP over TLS too")
    security.add_argument("--tls-key-file", metavar="PEM", help="private key of --tls-cert-file")
    security.add_argument("--tls-ca-file", metavar="PEM", help="CAs of client certificates (SASL EXTERNAL)")
    security.add_argument("--amqps-port", type=int, help="AMQP over TLS listener (default 5671)")
    security.add_argument("--admin-tls-cert-file", metavar="PEM", help="certificate chain: the admin port speaks TLS")
    security.add_argument("--admin-tls-key-file", metavar="PEM", help="private key of --admin-tls-cert-file")
    security.add_argument("--admin-tls-ca-file", metavar="PEM",
                          help="CAs of admin clients' certificates; every admin client must show one (CN = user)")
    security.add_argument("--metrics-auth", choices=["open", "basic"],
                          help="/metrics open (default), or HTTP basic auth by a user with manage on '#'")
    security.add_argument("--http-tls-cert-file", metavar="PEM", help="certificate chain: the HTTP port speaks HTTPS")
    security.add_argument("--http-tls-key-file", metavar="PEM", help="private key of --http-tls-cert-file")
    security.add_argument("--http-allowed-hosts", metavar="NAME,...",
                          help="more Host names the HTTP port answers to (besides IP addresses, localhost, --host, "
                               "--advertise-host and the machine's name; '*' any)")


def _add_cluster_flags(cluster) -> None:
    cluster.add_argument("--peers", metavar="HOST:PORT,...",
                         help="raft addresses of the cluster's nodes; this node's own may be listed too")
    cluster.add_argument("--raft-port", type=int, help="this node's raft listener (default 5674)")
    cluster.add_argument("--advertise-host", metavar="HOST",
                         help="host the other nodes reach this one by (default --host); a StatefulSet pod's DNS name")
    cluster.add_argument("--handler-timeout-ms", type=int, metavar="MS",
                         help="refuse a send whose group's route is not decided within this (default 5000)")
    cluster.add_argument("--group-timeout-ms", type=int, metavar="MS",
                         help="expire routes unused this long (default 0: never)")
    cluster.add_argument("--route-follow-ms", type=int, metavar="MS",
                         help="move a group, with its queued messages, to a node with consumers once its node has "
                              "had none on its queue this long (default 0: never; at least 1000)")
    cluster.add_argument("--placement", choices=["balanced", "local"],
                         help="where a new group goes: balanced (default), the node whose consumers of the queue "
                              "hold the fewest groups per consumer, this node on a near tie; local, this node "
                              "whenever it has a consumer of the queue")
    cluster.add_argument("--owner-failover-ms", type=int, metavar="MS",
                         help="move an unreachable node's groups to live nodes after this (default 0: never, "
                              "order first)")
    cluster.add_argument("--join", action="store_true", default=None,
                         help="this node is not a founding member: ask the members in --peers (at this node's "
                              "--admin-port) to add it to the cluster, then serve")


def _add_between_nodes_flags(between) -> None:
    between.add_argument("--cluster-tls-cert-file", metavar="PEM",
                         help="this node's certificate (serverAuth+clientAuth) signed by the cluster CA: "
                              "forwarding uses mutual TLS on --peer-port")
    between.add_argument("--cluster-tls-key-file", metavar="PEM", help="private key of --cluster-tls-cert-file")
    between.add_argument("--cluster-tls-ca-file", metavar="PEM", help="the cluster CA: peers must show a node "
                                                                      "certificate it signed")
    between.add_argument("--cluster-tls-server-name", metavar="NAME",
                         help="name every peer's certificate carries, checked instead of the host dialled")
    between.add_argument("--peer-port", type=int, metavar="PORT",
                         help="mutual-TLS forwarding listener (default 5676; 0 = any)")
    between.add_argument("--raft-secret-file", metavar="FILE",
                         help="raft secrets, one a line: the first encrypts raft traffic, every one is accepted")
    between.add_argument("--allow-insecure-cluster", action="store_true", default=None,
                         help="let a cluster node start without a raft secret (and, with users on a non-loopback "
                              "host, without cluster TLS): raft traffic is then unauthenticated")


NODE_FLAG_KEYS = ("host", "amqp_port", "admin_port", "http_port", "data_dir", "auto_create", "default_group", "journal_fsync",
                  "peers", "raft_port", "advertise_host", "handler_timeout_ms", "group_timeout_ms",
                  "owner_failover_ms", "route_follow_ms", "placement", "join", "users_file", "allow_anonymous", "sasl_plain_on_loopback",
                  "tls_cert_file", "tls_key_file", "tls_ca_file", "amqps_port", "admin_tls_cert_file",
                  "admin_tls_key_file", "admin_tls_ca_file", "metrics_auth", "http_tls_cert_file", "http_tls_key_file",
                  "http_allowed_hosts")

NODE_FLAG_KEYS += ("cluster_tls_cert_file", "cluster_tls_key_file", "cluster_tls_ca_file", "cluster_tls_server_name",
                   "peer_port", "raft_secret_file", "allow_insecure_cluster")


def _run_node(args) -> int:
    from node import config as config_module
    from node import runtime

    overrides = {key: getattr(args, key) for key in NODE_FLAG_KEYS}
    try:
        config = config_module.load(args.config, overrides=overrides)
    except InvalidConfig as error:
        print(f"grouper node: bad configuration: {error}", file=sys.stderr)
        return EXIT_USAGE
    return runtime.run(config)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="grouper", description="Grouper: a message-group broker")
    subparsers = parser.add_subparsers(dest="command", required=True)
    _add_node_command(subparsers)
    from node import up
    up.add_command(subparsers)
    from node.admin import commands  # here, not at the top: the sub-commands load only with the parser
    commands.register(subparsers)
    from node.admin import users_commands
    users_commands.register(subparsers)
    from node import certs_commands
    certs_commands.register(subparsers)
    from node.tools import messages, perf
    messages.register(subparsers)
    perf.register(subparsers)
    from pipeline import audit_command  # light: pyspark is imported only when `grouper audit` runs
    audit_command.add_command(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if args.command == "up":  # its data directory and the nodes' log files: their user's only (node/file_modes.py)
        from node.file_modes import keep_private
        keep_private()
    try:
        code = args.run(args)
        sys.stdout.flush()  # here, so a reader gone is noticed inside this try, not at interpreter exit
        return code
    except BrokenPipeError:
        _quiet_stdout()
        return EXIT_BROKEN_PIPE
    except InvalidConfig as error:
        print(f"grouper: bad input: {error}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_OK


def _quiet_stdout() -> None:
    """Point stdout at /dev/null: what Python still holds for it is then dropped at exit, not reported
    as a second BrokenPipeError."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):  # no file descriptor behind stdout (a test's stand-in): nothing to flush
        pass


if __name__ == "__main__":
    sys.exit(main())
