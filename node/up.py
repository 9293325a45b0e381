"""`grouper up`: a local cluster of N nodes on one host, in one command, stopped by Ctrl-C.

Each node is a `grouper node` child process with its own data directory under --data-dir and its own
log file beside it. Node i listens on base+10*i (AMQP), base+10*i+1 (admin and peer gRPC) and
base+10*i+2 (raft). The parent prints every node's addresses and the leader, then waits; on SIGINT
or SIGTERM it stops the nodes with SIGTERM (a clean stop), killing any that outlive STOP_WAIT_S.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

NODES_MAX = 9  # ports are spaced by 10 per node from the base port
START_WAIT_S = 60.0  # for every node to print "ready"
LEADER_WAIT_S = 30.0  # for the raft cluster to elect a leader
STOP_WAIT_S = 15.0
PORT_STRIDE = 10


def add_command(subparsers) -> None:
    parser = subparsers.add_parser("up", help="run a local cluster of nodes on one host until Ctrl-C")
    parser.add_argument("--nodes", type=int, default=3, help=f"how many nodes, 1..{NODES_MAX} (default 3)")
    parser.add_argument("--data-dir", default="./data/cluster",
                        help="directory holding node0, node1, ... and their logs (default ./data/cluster)")
    parser.add_argument("--base-port", type=int, default=5672,
                        help="node i uses base+10i (AMQP), +1 (admin), +2 (raft); default 5672")
    parser.add_argument("--host", default="127.0.0.1", help="address every node binds (default 127.0.0.1)")
    parser.add_argument("--config", metavar="FILE", help="TOML config given to every node (queues, template)")
    parser.add_argument("--group-timeout-ms", type=int, metavar="MS", help="passed to every node")
    parser.add_argument("--handler-timeout-ms", type=int, metavar="MS", help="passed to every node")
    parser.add_argument("--users-file", metavar="FILE", help="one user database for every node (grouper user); "
                                                             "without it the nodes are open to anonymous clients")
    parser.add_argument("--allow-anonymous", action="store_true", help="passed to every node (needed on a "
                                                                       "non-loopback --host without --users-file)")
    parser.set_defaults(run=run)


def run(args) -> int:
    if not 1 <= args.nodes <= NODES_MAX:
        print(f"grouper up: --nodes must be 1..{NODES_MAX}, got {args.nodes}", file=sys.stderr)
        return 2
    top_port = args.base_port + PORT_STRIDE * (args.nodes - 1) + 3
    if not 1 <= args.base_port or top_port > 65535:
        print(f"grouper up: --base-port {args.base_port} leaves no room for {args.nodes} nodes (ports up to "
              f"{top_port})", file=sys.stderr)
        return 2
    data_dir = os.path.abspath(args.data_dir)
    os.makedirs(data_dir, exist_ok=True)
    raft = [f"{args.host}:{args.base_port + PORT_STRIDE * i + 2}" for i in range(args.nodes)]
    nodes = [_NodeChild(i, args, data_dir, raft if args.nodes > 1 else []) for i in range(args.nodes)]
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    print(f"starting {args.nodes} nodes; data and logs under {data_dir}", flush=True)
    try:
        for node in nodes:
            node.start()
        deadline = time.monotonic() + START_WAIT_S
        for node in nodes:
            if not node.wait_ready(deadline, stop):
                print(f"grouper up: node{node.index} did not start; see {node.log_path}", file=sys.stderr)
                return 1
        for node in nodes:
            print(f"node{node.index}: amqp {node.amqp}  admin {node.admin}  http {node.http}"
                  + (f"  raft {raft[node.index]}" if raft else ""), flush=True)
        print(f"security: {nodes[0].security}", flush=True)
        if raft:
            leader = _wait_leader(nodes[0].http, stop)
            print(f"leader: {leader or '(none yet; see grouper cluster status)'}", flush=True)
        print("ready; Ctrl-C stops the cluster", flush=True)
        while not stop.wait(0.5):
            for node in nodes:
                node.report_exit()
        return 0
    finally:
        print("stopping", flush=True)
        for node in nodes:
            node.terminate()
        for node in nodes:
            node.wait_stopped()
        print("stopped", flush=True)


def _wait_leader(http_address: str, stop: threading.Event) -> str:
    """The raft leader from a node's /metrics: open on every node by default, where the admin API of a
    node with users would ask for credentials `grouper up` does not have."""
    import urllib.request

    deadline = time.monotonic() + LEADER_WAIT_S
    while time.monotonic() < deadline and not stop.is_set():
        try:
            with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=2) as response:
                text = response.read().decode()
        except OSError:
            text = ""
        for line in text.splitlines():
            if line.startswith('grouper_raft_leader{leader="') and not line.endswith(" 0.0"):
                leader = line.split('"', 2)[1]
                if leader:
                    return leader
        stop.wait(0.2)
    return ""


class _NodeChild:
    def __init__(self, index: int, args, data_dir: str, raft: list[str]):
        self.index = index
        base = args.base_port + PORT_STRIDE * index
        self.log_path = os.path.join(data_dir, f"node{index}.log")
        self.command = [sys.executable, "-m", "node.cli", "node", "--host", args.host,
                        "--amqp-port", str(base), "--admin-port", str(base + 1), "--http-port", str(base + 3),
                        "--data-dir", os.path.join(data_dir, f"node{index}")]
        if args.config:
            self.command += ["--config", args.config]
        if raft:
            self.command += ["--raft-port", str(base + 2), "--peers", ",".join(raft)]
        for flag in ("group_timeout_ms", "handler_timeout_ms", "users_file"):
            value = getattr(args, flag)
            if value is not None:
                self.command += ["--" + flag.replace("_", "-"), str(value)]
        if args.allow_anonymous:
            self.command.append("--allow-anonymous")
        self.process: subprocess.Popen | None = None
        self.amqp = self.admin = self.http = self.security = ""
        self._ready = threading.Event()
        self._exit_reported = False

    def start(self) -> None:
        log_file = open(self.log_path, "ab")
        # a session of its own: Ctrl-C reaches only this parent, which stops the nodes in order
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=log_file, text=True,
                                        start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        log_file.close()
        threading.Thread(target=self._read, name=f"node{self.index}-stdout", daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            line = line.strip()
            if line.startswith("amqp: "):
                self.amqp = line[len("amqp: "):]
            elif line.startswith("admin: "):
                self.admin = line[len("admin: "):]
            elif line.startswith("http: "):
                self.http = line[len("http: "):]
            elif line.startswith("security: "):
                self.security = line[len("security: "):]
            elif line == "ready":
                self._ready.set()

    def wait_ready(self, deadline: float, stop: threading.Event) -> bool:
        while time.monotonic() < deadline and not stop.is_set():
            if self._ready.wait(0.2):
                return True
            if self.process.poll() is not None:
                return False
        return False

    def report_exit(self) -> None:
        code = self.process.poll()
        if code is not None and not self._exit_reported:
            self._exit_reported = True
            print(f"node{self.index} exited with status {code}; see {self.log_path}", file=sys.stderr, flush=True)

    def terminate(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self) -> None:
        if self.process is None:
            return
        try:
            self.process.wait(STOP_WAIT_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
