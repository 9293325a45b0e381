"""`grouper up`: a local cluster of N nodes on one host, in one command, stopped by Ctrl-C.

Each node is a `grouper node` child process with its own data directory under --data-dir and its own
log file beside it. Node i listens on base+10*i (AMQP), base+10*i+1 (admin and peer gRPC),
base+10*i+2 (raft) and base+10*i+3 (HTTP). The parent prints every node's addresses, security lines
and the leader, then waits; on SIGINT or SIGTERM it stops the nodes with SIGTERM (a clean stop),
killing any that outlive STOP_WAIT_S.

Rules:
- Every node gets the same raft secret, DATA_DIR/raft.secret (made on first use, 0600 from its
  creation, reused after): no raft port of the cluster unpickles a stranger's bytes.
- Every node reads the same users file, DATA_DIR/users.json unless --users-file names another:
  absent, the cluster is open; `grouper user add ... --data-dir DATA_DIR` secures every running node.
- No node outlives this process: the children stop first whatever happens to the output (a write
  to a closed pipe is dropped, never skips the shutdown), and each child gets SIGTERM from the
  kernel when this process dies, even by SIGKILL (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import ctypes
import os
import secrets
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
RAFT_SECRET_FILE = "raft.secret"  # under --data-dir, shared by every node
USERS_FILE = "users.json"  # under --data-dir, shared by every node unless --users-file
RAFT_SECRET_BYTES = 32  # of randomness, written url-safe base64 (43 characters)
REASON_LINES_MAX = 5  # of a node's log quoted when it did not start
PR_SET_PDEATHSIG = 1  # prctl(2): a signal for this process when its parent dies


def add_command(subparsers) -> None:
    parser = subparsers.add_parser("up", help="run a local cluster of nodes on one host until Ctrl-C")
    parser.add_argument("--nodes", type=int, default=3, help=f"how many nodes, 1..{NODES_MAX} (default 3)")
    parser.add_argument("--data-dir", default="./data/cluster",
                        help=f"directory holding node0, node1, ..., their logs, the nodes' {RAFT_SECRET_FILE} and "
                             f"{USERS_FILE} (default ./data/cluster)")
    parser.add_argument("--base-port", type=int, default=5672,
                        help="node i uses base+10i (AMQP), +1 (admin), +2 (raft), +3 (HTTP); default 5672")
    parser.add_argument("--host", default="127.0.0.1", help="address every node binds (default 127.0.0.1)")
    parser.add_argument("--config", metavar="FILE", help="TOML config given to every node (queues, template)")
    parser.add_argument("--group-timeout-ms", type=int, metavar="MS", help="passed to every node")
    parser.add_argument("--handler-timeout-ms", type=int, metavar="MS", help="passed to every node")
    parser.add_argument("--users-file", metavar="FILE",
                        help=f"the user database every node reads (default DATA_DIR/{USERS_FILE}); while it is "
                             f"absent the nodes are open to anonymous clients, once `grouper user add` writes it "
                             f"they are secured")
    parser.add_argument("--allow-anonymous", action="store_true", help="passed to every node (needed on a "
                                                                       "non-loopback --host without users)")
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
    users_file = os.path.abspath(args.users_file) if args.users_file else os.path.join(data_dir, USERS_FILE)
    raft = [f"{args.host}:{args.base_port + PORT_STRIDE * i + 2}" for i in range(args.nodes)]
    secret_file = raft_secret_file(data_dir) if args.nodes > 1 else ""
    nodes = [_NodeChild(i, args, data_dir, raft if args.nodes > 1 else [], users_file, secret_file)
             for i in range(args.nodes)]
    stop = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: stop.set())
    say(f"starting {args.nodes} nodes; data and logs under {data_dir}")
    try:
        for node in nodes:
            node.start()
        for node in nodes:  # after every fork: a child's preexec_fn runs while no other thread of ours does
            node.start_reading()
        deadline = time.monotonic() + START_WAIT_S
        for node in nodes:
            if not node.wait_ready(deadline, stop):
                if not stop.is_set():
                    say(f"grouper up: node{node.index} did not start: {node.reason()}", sys.stderr)
                return 1
        for node in nodes:
            say(f"node{node.index}: amqp {node.amqp}  admin {node.admin}  http {node.http}"
                + (f"  raft {raft[node.index]}" if raft else ""))
        for node in nodes:
            say(f"node{node.index} security: {node.security}")
            if node.cluster_security:
                say(f"node{node.index} cluster security: {node.cluster_security}")
        if raft:
            leader = _wait_leader(nodes[0].http, stop)
            say(f"leader: {leader or '(none yet; see grouper cluster status)'}")
        say("ready; Ctrl-C stops the cluster")
        while not stop.wait(0.5):
            for node in nodes:
                node.report_exit()
        return 0
    finally:
        for node in nodes:  # before any output: a write that fails must not leave a node running
            node.terminate()
        say("stopping")
        for node in nodes:
            node.wait_stopped()
        say("stopped")


def say(text: str, stream=None) -> None:
    """One line to stdout (or `stream`); a reader that has gone (a closed pipe, a dead supervisor) costs
    the line only: the stream is pointed at /dev/null so neither later lines nor the exit flush fail."""
    stream = stream or sys.stdout
    try:
        stream.write(text + "\n")
        stream.flush()
    except (BrokenPipeError, OSError, ValueError):
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        except (OSError, ValueError):
            pass


def raft_secret_file(data_dir: str) -> str:
    """DATA_DIR/raft.secret: made 0600 from the start (never briefly readable by others), kept after."""
    path = os.path.join(data_dir, RAFT_SECRET_FILE)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path
    with os.fdopen(descriptor, "w") as file:
        file.write(secrets.token_urlsafe(RAFT_SECRET_BYTES) + "\n")
    return path


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


def _die_with_parent(parent_pid: int):
    """A preexec_fn: the kernel sends this child SIGTERM (a node's clean stop) when `grouper up` dies."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, in the parent, not after fork
    except (OSError, AttributeError):
        return None  # not Linux: Ctrl-C and SIGTERM still stop the nodes

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)
    return preexec


class _NodeChild:
    def __init__(self, index: int, args, data_dir: str, raft: list[str], users_file: str, secret_file: str):
        self.index = index
        base = args.base_port + PORT_STRIDE * index
        self.log_path = os.path.join(data_dir, f"node{index}.log")
        self.command = [sys.executable, "-m", "node.cli", "node", "--host", args.host,
                        "--amqp-port", str(base), "--admin-port", str(base + 1), "--http-port", str(base + 3),
                        "--data-dir", os.path.join(data_dir, f"node{index}"), "--users-file", users_file]
        if args.config:
            self.command += ["--config", args.config]
        if raft:
            self.command += ["--raft-port", str(base + 2), "--peers", ",".join(raft),
                             "--raft-secret-file", secret_file]
        for flag in ("group_timeout_ms", "handler_timeout_ms"):
            value = getattr(args, flag)
            if value is not None:
                self.command += ["--" + flag.replace("_", "-"), str(value)]
        if args.allow_anonymous:
            self.command.append("--allow-anonymous")
        self.process: subprocess.Popen | None = None
        self.amqp = self.admin = self.http = self.security = self.cluster_security = ""
        self._ready = threading.Event()
        self._exit_reported = False
        self._log_offset = 0

    def start(self) -> None:
        with open(self.log_path, "ab") as log_file:
            self._log_offset = log_file.tell()
            # a session of its own: Ctrl-C reaches only this parent, which stops the nodes in order
            self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE, stderr=log_file, text=True,
                                            start_new_session=True, preexec_fn=_die_with_parent(os.getpid()),
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"})

    def start_reading(self) -> None:
        threading.Thread(target=self._read, name=f"node{self.index}-stdout", daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            line = line.strip()
            key, _, value = line.partition(": ")
            if key in ("amqp", "admin", "http", "security", "cluster security"):
                setattr(self, key.replace(" ", "_"), value)
            elif line == "ready":
                self._ready.set()

    def wait_ready(self, deadline: float, stop: threading.Event) -> bool:
        while time.monotonic() < deadline and not stop.is_set():
            if self._ready.wait(0.2):
                return True
            if self.process.poll() is not None:
                return False
        return False

    def reason(self) -> str:
        """Why the node did not start: the last lines it logged in this run, and where the rest is."""
        code = self.process.poll()
        try:
            with open(self.log_path, "rb") as log_file:
                log_file.seek(self._log_offset)
                lines = log_file.read().decode("utf-8", "replace").splitlines()
        except OSError:
            lines = []
        lines = [line for line in lines if line.strip()][-REASON_LINES_MAX:]
        status = f"it exited with status {code}" if code is not None else f"not ready within {START_WAIT_S:.0f} s"
        return "\n  ".join([f"{status}; the end of {self.log_path}:", *lines] if lines else
                           [f"{status}; {self.log_path} says nothing"])

    def report_exit(self) -> None:
        code = self.process.poll()
        if code is not None and not self._exit_reported:
            self._exit_reported = True
            say(f"node{self.index} exited with status {code}; see {self.log_path}", sys.stderr)

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
