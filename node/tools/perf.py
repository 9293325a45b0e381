"""`grouper perf`: a load generator that measures the broker, not itself, and checks what it got back.

Rules:
- This module is the command: its flags, the checked `PerfPlan` and the exit status. The run itself
  (one selectors loop on the lean engine client, node/client) is node/tools/perf_run.py's; the
  check and the report (`Ledger`: lost, duplicates, order violations) are node/tools/perf_ledger.py's.
- `grouper` builds its parser with this module, so proton's C engine is imported only when a run starts.
- On a terminal a progress line is redrawn every PROGRESS_INTERVAL_S (perf_run.py); elsewhere only the report.
  Exit status: 0 with nothing lost, duplicated or out of order and no refusals; 1 otherwise; 2 bad flags.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass

from node.core.errors import InvalidConfig
# proton's C engine (node.amqp.engine, node.client) is imported where a run needs it: `grouper` builds its
# parser with this module, and its other commands should not load the library
from node.exit_codes import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from node.tools.session import AMQP_NODE_DEFAULT, AMQP_NODE_ENV, node_url

MESSAGES_DEFAULT = 10_000  # without --messages and --duration-s
CONNECTIONS_MAX = 1000  # producers + consumers


@dataclass(frozen=True)
class PerfPlan:
    queue: str
    nodes: tuple  # AMQP URLs
    producers: int
    consumers: int
    groups: int
    prefetch: int
    durable: bool
    rate_per_s: int  # all producers together; 0: as fast as credit and window allow
    duration_s: float  # 0: until `messages`
    messages: int  # 0: until `duration_s`
    body_bytes: int

    def check(self) -> "PerfPlan":
        for key in ("producers", "consumers", "groups", "prefetch"):
            if getattr(self, key) < 1:
                raise InvalidConfig(f"--{key}", f"must be >= 1, got {getattr(self, key)}")
        if self.producers + self.consumers > CONNECTIONS_MAX:
            raise InvalidConfig("--producers", f"producers + consumers is at most {CONNECTIONS_MAX} (one connection "
                                               f"each)")
        if self.groups < self.producers:
            raise InvalidConfig("--groups", f"each producer owns its groups: give at least --producers "
                                            f"({self.producers}) groups, got {self.groups}")
        for key in ("rate_per_s", "duration_s", "messages", "body_bytes"):
            if getattr(self, key) < 0:
                raise InvalidConfig(f"--{key.replace('_per_s', '').replace('_', '-')}", "must not be negative")
        return self


# ---- flags -----------------------------------------------------------------------------------

def register(subparsers) -> None:
    from node.tools.messages import connection_flags

    parser = subparsers.add_parser("perf", parents=[connection_flags()], help="load generator: throughput, "
                                   "latency, per-group order", description="Send grouped messages through "
                                   "one or more nodes and consume them, then report throughput, latency "
                                   "percentiles, lost and duplicated messages and per-group order violations.")
    parser.add_argument("--queue", default="perf", help="queue to load (default perf)")
    parser.add_argument("--nodes", metavar="URL,...", help="AMQP addresses to spread producers and consumers "
                                                           "over (default --node, or the one default node)")
    parser.add_argument("--producers", type=int, default=1, metavar="N", help="connections sending (default 1)")
    parser.add_argument("--consumers", type=int, default=4, metavar="N", help="connections consuming (default 4)")
    parser.add_argument("--groups", type=int, default=100, metavar="N", help="distinct groups (default 100)")
    parser.add_argument("--prefetch", type=int, default=100, metavar="N", help="credit per consumer (default 100)")
    parser.add_argument("--durable", action="store_true",
                        help="send durable messages (AMQP header durable: a durable queue journals only those)")
    parser.add_argument("--rate", type=int, default=0, metavar="MSGS_PER_S",
                        help="messages per second over all producers (default 0: as fast as possible)")
    parser.add_argument("--duration-s", type=float, default=0.0, metavar="S", help="stop sending after S seconds")
    parser.add_argument("--messages", type=int, default=0, metavar="N",
                        help=f"messages in all (default {MESSAGES_DEFAULT} unless --duration-s is given)")
    parser.add_argument("--body-bytes", type=int, default=100, metavar="BYTES", help="body size (default 100)")
    parser.set_defaults(run=run)


def plan_from_args(args: argparse.Namespace) -> PerfPlan:
    given = args.nodes or args.node or os.environ.get(AMQP_NODE_ENV) or AMQP_NODE_DEFAULT
    nodes = []
    for text in given.split(","):
        scheme, host, port = node_url(text.strip())
        nodes.append(f"{scheme}://{host}:{port}")
    messages = args.messages or (0 if args.duration_s else MESSAGES_DEFAULT)
    return PerfPlan(queue=args.queue, nodes=tuple(nodes), producers=args.producers, consumers=args.consumers,
                    groups=args.groups, prefetch=args.prefetch, durable=args.durable, rate_per_s=args.rate,
                    duration_s=args.duration_s, messages=messages, body_bytes=args.body_bytes).check()


def run(args: argparse.Namespace) -> int:
    from node.client.endpoint import LeanError
    from node.tools.perf_run import Run

    try:
        plan = plan_from_args(args)
        target_options = _target_options(args, plan)
    except InvalidConfig as error:
        print(f"grouper perf: bad input: {error}", file=sys.stderr)
        return EXIT_USAGE
    interactive = sys.stdout.isatty()
    try:
        outcome = Run(plan, target_options).execute(interactive)
    except (LeanError, OSError) as error:
        print(f"grouper perf: {error}", file=sys.stderr)
        return EXIT_FAILED
    print(outcome.report(plan), flush=True)
    return EXIT_OK if outcome.clean else EXIT_FAILED


def _target_options(args: argparse.Namespace, plan: PerfPlan) -> dict:
    from node.tools.session import CA_ENV, USER_ENV, password_for

    ca = args.ca or os.environ.get(CA_ENV, "")
    user = args.user or os.environ.get(USER_ENV, "")
    options = {"tls": bool(ca) or plan.nodes[0].startswith("amqps:"), "ca_file": ca, "user": user, "password": ""}
    if user:
        options["password"] = password_for(user, args, plan.nodes[0])
    return options
