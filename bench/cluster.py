"""Cluster rows for the benchmark: what forwarding costs, how fast a route is decided, and how long
the loss of the raft leader or of a group's owner stops traffic.

    python -m bench.cluster [--messages N] [--json PATH] [--out PATH] [--render-only]

One run starts real `grouper node` processes on 127.0.0.1 with fresh data dirs in a temporary
directory: a single node for the baseline, then a 3-node cluster (`--raft-port P --peers a,b,c`),
and measures, on durable exclusive-group queues:
1. throughput and broker CPU per message: (a) one node; (b1) 3 nodes, consumers on every node;
   (b2) 3 nodes, consumers only on nodes 2 and 3, so every message is forwarded;
2. route-decision latency (first message of a brand-new group) and forwarded against local latency;
3. leader kill: kill -9 the raft leader under light load, time to the next accepted new group;
4. owner kill: kill -9 the node owning busy groups, restart it, time to their next delivery.
Then it profiles the forwarding node and an owner under (b2) with py-spy (not measured).

It writes the section "## Cluster (3 nodes)" of docs/benchmarks.md (the rest of the file is kept)
and the raw numbers to bench/results/cluster-last-run.json. A benchmark, not a test: it reports
numbers and asserts nothing. Before each measured phase it waits, within a bounded budget, for the
1-minute load average to fall below LOAD_QUIET_BELOW, and records the load at each phase's start and
end. This module owns the cluster, its phases and their report; lean.py moves the messages of the
throughput rows (the same producer and consumers as bench/run.py); the probe clients here send one
message at a time and record each outcome.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import multiprocessing
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from array import array
from dataclasses import dataclass
from pathlib import Path

from proton import Message
from proton.handlers import MessagingHandler
from proton.reactor import Container

from bench import clients, lean, peers
from bench.report_file import commit, write_section
from node.tools.progress import Progress

REPO_ROOT = peers.REPO_ROOT
DEFAULT_OUT = REPO_ROOT / "docs" / "benchmarks.md"
DEFAULT_JSON = REPO_ROOT / "bench" / "results" / "cluster-last-run.json"
SECTION_HEADING = "## Cluster (3 nodes)"
HOST = "127.0.0.1"

# ---- limits and workload (units last) ---------------------------------------------------------
NODE_READY_TIMEOUT_S = 60.0  # a node prints "ready"
CLUSTER_WAIT_S = 30.0  # leader elected, members connected, consumer counts known
CLI_TIMEOUT_S = 15.0  # one `grouper cluster status` call
STATUS_POLL_INTERVAL_S = 0.1
LOAD_QUIET_BELOW = 1.0  # 1-minute load average under which a phase starts
LOAD_WAIT_BUDGET_S = 300.0  # all the waits for a quiet machine together, in one run
LOAD_WAIT_PHASE_MAX_S = 120.0  # one phase's wait
LOAD_POLL_INTERVAL_S = 2.0
GROUPS = 1000
# messages of the decision-ceiling row (c): at most this many routes it creates (routes_max is 1,000,000)
CEILING_MESSAGES_MAX = 100_000
PREFETCH = 100
# Every row has 4 consumers that receive, like bench/run.py: broker CPU per message grows with the
# number of consumer connections sharing a flow (measured here: 2 instead of 4 consumers on one node
# took ~100 µs/msg less), so the rows compare like with like.
CONSUMERS = 4
SINGLE_LAYOUT = {0: CONSUMERS}
LOCAL_LAYOUT = {0: CONSUMERS, 1: CONSUMERS // 2, 2: CONSUMERS // 2}  # (b1): consumers on every node
REMOTE_LAYOUT = {1: CONSUMERS // 2, 2: CONSUMERS // 2}  # (b2): every message forwarded
WARMUP_MESSAGES = 2000
PROBE_NEW_GROUPS = 200  # route decisions timed per producer node
PROBE_EXISTING_MESSAGES = 300  # messages to groups that already have a route, for forwarded vs local
PROBE_INTERVAL_S = 0.02  # one probe message every 20 ms: an idle cluster, not a loaded one
KILL_REPEATS = 5
# half load for the decision-latency phase: half of row (b1)'s throughput in the same run, or this
# when (b1) did not run (half of b1's 17,908 msgs/s on 2026-11-23)
HALF_LOAD_DEFAULT_PER_S = 9_000
BACKGROUND_GROUPS = 1000
BACKGROUND_S = 60.0  # the background producers' plan lasts this long at their rate; stopped when the phase ends
STABILITY_S = 600.0  # the full-load run in which no raft election may happen
DECISION_BUCKET_METRIC = "grouper_raft_decision_latency_seconds_bucket"
# the raft part alone, as the node's raft member times it (claim received -> route applied there)
MEMBER_DECISION_BUCKET_METRIC = "grouper_raft_member_decision_latency_seconds_bucket"
DECISION_TARGET_MS = 5.0
LEADER_PROBE_INTERVAL_S = 0.005  # light load during the leader kill: a new group every 5 ms
STEADY_BEFORE_KILL_S = 1.0
RECOVERY_WAIT_S = 20.0  # longest wait for traffic to resume after a kill
OWNER_GROUPS = 20  # busy groups on the owner that is killed
OWNER_PROBE_INTERVAL_S = 0.003  # ~330 msgs/s over those groups
DRAIN_WAIT_S = 15.0  # after the producer stops, for the consumers to receive every accepted message
SETTLE_WAIT_S = 10.0  # a stopping probe producer waits this long for outcomes of what it sent
RECONNECT_INTERVAL_S = 0.05  # a probe consumer redials a killed node this often
TIMER_INTERVAL_S = 0.05
PROFILE_DURATION_S = 10
IDLE_MEASURE_S = 5.0  # CPU of idle nodes (raft heartbeats, timers), the cluster's fixed cost
PHASES = ("single", "flows", "latency", "leader", "owner", "profile", "stability", "placement")
PROFILE_MESSAGES_MIN = 30_000  # enough for the producer to outlast the profile

QUEUES = ("warmup", "a", "b1", "b2", "latency", "background", "leader", "owner", "profile", "stability")

ACCEPTED, REJECTED, RELEASED, MODIFIED = 1, 2, 3, 4


PROGRESS: Progress | None = None  # main's bar over the phases, which log's lines must not tear


def log(text: str) -> None:
    line = f"{time.strftime('%H:%M:%S')} {text}"
    if PROGRESS is not None:
        PROGRESS.say(line)
    else:
        print(line, flush=True)


def phase_done(phases: set[str], name: str) -> None:
    """Count phase `name` on the bar, if it was one asked for."""
    if PROGRESS is not None and name in phases:
        PROGRESS.advance()


def load_1m() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def steal_jiffies() -> tuple[int, int]:
    """(steal, total) CPU jiffies of the machine from /proc/stat: steal is time the hypervisor gave
    this VM's virtual CPUs to someone else, which the load average does not show."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return values[7], sum(values)


def steal_pct(before: tuple[int, int]) -> float:
    steal, total = steal_jiffies()
    return round((steal - before[0]) / max(1, total - before[1]) * 100, 1)


# ---- nodes ------------------------------------------------------------------------------------

def node_command() -> list[str]:
    script = shutil.which("grouper")
    return [script, "node"] if script else [sys.executable, "-m", "node.cli", "node"]


def cli_command() -> list[str]:
    return [sys.executable, "-m", "node.cli"]


class NodeProcess:
    """One `grouper node`; a restart reuses its data dir and its AMQP, admin and raft ports."""

    def __init__(self, name: str, work_dir: Path, config_path: Path, args: tuple = ()):
        self.name = name
        self.dir = work_dir / name
        self.dir.mkdir(parents=True, exist_ok=True)
        self.data_dir = self.dir / "data"
        self.log_path = self.dir / "node.log"
        self.config_path = config_path
        self.args = tuple(args)
        self.process: subprocess.Popen | None = None
        self.amqp_port = self.admin_port = self.http_port = 0

    @property
    def url(self) -> str:
        return f"amqp://{HOST}:{self.amqp_port}"

    @property
    def admin_address(self) -> str:
        return f"{HOST}:{self.admin_port}"

    def start(self) -> float:
        """Start and wait for "ready"; returns the seconds from the command to "ready"."""
        offset = self.log_path.stat().st_size if self.log_path.exists() else 0
        command = [*node_command(), "--config", str(self.config_path), "--data-dir", str(self.data_dir),
                      "--amqp-port", str(self.amqp_port), "--admin-port", str(self.admin_port),
                   "--http-port", str(self.http_port), *self.args]
        started = time.monotonic()
        with open(self.log_path, "ab") as output:
            self.process = subprocess.Popen(command, cwd=REPO_ROOT, stdout=output, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = started + NODE_READY_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}: {self.log_tail()}")
            lines = self._log_from(offset)
            for line in lines:
                if line.startswith("amqp: "):
                    self.amqp_port = int(line.rsplit(":", 1)[1])
                elif line.startswith("admin: "):
                    self.admin_port = int(line.rsplit(":", 1)[1])
                elif line.startswith("http: "):
                    self.http_port = int(line.rsplit(":", 1)[1])
            if "ready" in (line.strip() for line in lines):
                return time.monotonic() - started
            time.sleep(0.01)
        raise RuntimeError(f"{self.name}: no `ready` within {NODE_READY_TIMEOUT_S} s: {self.log_tail()}")

    def _log_from(self, offset: int) -> list[str]:
        with open(self.log_path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode(errors="replace").splitlines()

    def log_tail(self, lines: int = 5) -> str:
        return " | ".join(self._log_from(0)[-lines:])

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def cpu_seconds(self) -> float:
        """utime + stime of the node process and its raft member child (a process of its own)."""
        return peers.tree_cpu_seconds(self.process.pid)

    def kill(self) -> None:
        if self.alive():
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if not self.alive():
            return
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(15)
        except subprocess.TimeoutExpired:
            self.kill()

    def raft_decisions(self, metric: str = DECISION_BUCKET_METRIC) -> list[tuple[float, int]]:
        """A raft decision histogram of the node's /metrics: [(upper bound ms, cumulative count)]."""
        with urllib.request.urlopen(f"http://{HOST}:{self.http_port}/metrics", timeout=CLI_TIMEOUT_S) as reply:
            text = reply.read().decode()
        buckets = []
        for line in text.splitlines():
            if line.startswith(metric):
                bound = line.split('le="', 1)[1].split('"', 1)[0]
                buckets.append((float("inf") if bound == "+Inf" else float(bound) * 1000,
                                int(float(line.rsplit(" ", 1)[1]))))
        return buckets

    def cpu_wait_ns(self) -> int:
        """How long the node process's threads have waited, runnable, for a CPU (Linux schedstat)."""
        total = 0
        for task in Path(f"/proc/{self.pid}/task").iterdir():
            try:
                total += int((task / "schedstat").read_text().split()[1])
            except (OSError, IndexError, ValueError):
                pass  # a thread that ended meanwhile
        return total

    def cluster_status(self) -> dict | None:
        try:
            result = subprocess.run([*cli_command(), "cluster", "status", "--json", "--timeout-ms", "2000",
                                     "--node", self.admin_address], cwd=REPO_ROOT, capture_output=True,
                                    text=True, timeout=CLI_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None
        return json.loads(result.stdout) if result.returncode == 0 else None


def write_config(path: Path) -> None:
    tables = [f'[[queue]]\nname = "{name}"\ngroup_policy = "exclusive"\ndurable = true\n' for name in QUEUES]
    path.write_text("\n".join(tables))


class Cluster:
    def __init__(self, work_dir: Path, config_path: Path, size: int = 3, args: tuple = ()):
        raft_ports = [peers.free_port() for _ in range(size)]
        self.node_ids = [f"{HOST}:{port}" for port in raft_ports]
        peer_list = ",".join(self.node_ids)
        secret_file = work_dir / "raft.secret"  # every cluster node needs one (node/peer/credentials.py)
        if not secret_file.exists():
            with os.fdopen(os.open(secret_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as file:
                file.write(os.urandom(32).hex() + "\n")
        self.nodes = [NodeProcess(f"node{i + 1}", work_dir, config_path,
                                  ("--raft-port", str(port), "--peers", peer_list,
                                   "--raft-secret-file", str(secret_file), *args))
                      for i, port in enumerate(raft_ports)]

    def start(self) -> None:
        for node in self.nodes:
            node.start()
        self.wait_healthy()

    def stop(self) -> None:
        """Every node stopped (SIGTERM, SIGKILL past 15 s), and killed whatever stops the stopping: a
        benchmark's `finally` leaves no node behind."""
        try:
            for node in self.nodes:
                node.stop()
        finally:
            for node in self.nodes:
                node.kill()

    def status(self, via: int | None = None) -> dict | None:
        for index in ([via] if via is not None else range(len(self.nodes))):
            if self.nodes[index].alive():
                status = self.nodes[index].cluster_status()
                if status is not None:
                    return status
        return None

    def wait_for(self, predicate, what: str, via: int | None = None, timeout_s: float = CLUSTER_WAIT_S) -> dict:
        deadline = time.monotonic() + timeout_s
        status = None
        while time.monotonic() < deadline:
            status = self.status(via)
            if status is not None and predicate(status):
                return status
            time.sleep(STATUS_POLL_INTERVAL_S)
        raise RuntimeError(f"the cluster did not reach: {what} within {timeout_s} s; last status: {status}")

    def wait_healthy(self, via: int | None = None) -> dict:
        """A leader with a quorum, every member connected and registered, as seen from `via`."""
        return self.wait_for(lambda s: bool(s["leader"]) and s["has_quorum"]
                             and all(m["connected"] and m["amqp_address"] for m in s["members"]),
                             "a leader and every member connected", via)

    def leader(self) -> int:
        return self.node_ids.index(self.wait_healthy()["leader"])

    def wait_consumers(self, queue: str, counts: dict[int, int]) -> None:
        def known(status):
            by_node = {m["node"]: m["consumers"].get(queue, 0) for m in status["members"]}
            return all(by_node.get(self.node_ids[i], 0) == counts.get(i, 0) for i in range(len(self.nodes)))
        self.wait_for(known, f"consumers on {queue}: {counts}")

    def cpu_seconds(self) -> list[float]:
        return [node.cpu_seconds() for node in self.nodes]


# ---- waiting for a quiet machine --------------------------------------------------------------

class LoadGate:
    """Waits before each phase until the load is low, within one budget for the whole run."""

    def __init__(self, budget_s: float = LOAD_WAIT_BUDGET_S):
        self.remaining_s = budget_s

    def wait(self, phase: str) -> dict:
        started = time.monotonic()
        limit_s = min(self.remaining_s, LOAD_WAIT_PHASE_MAX_S)
        while load_1m() >= LOAD_QUIET_BELOW and time.monotonic() - started < limit_s:
            time.sleep(LOAD_POLL_INTERVAL_S)
        waited_s = time.monotonic() - started
        self.remaining_s = max(0.0, self.remaining_s - waited_s)
        load = load_1m()
        log(f"[{phase}] load {load:.2f} after waiting {waited_s:.0f} s"
            + ("" if load < LOAD_QUIET_BELOW else " (not quiet: measuring anyway)"))
        return {"load_start": load, "waited_s": round(waited_s, 1), "quiet": load < LOAD_QUIET_BELOW}


# ---- throughput rows: the clients of bench/clients.py, consumers placed per node ---------------

@dataclass(frozen=True)
class FlowRow:
    key: str
    label: str
    queue: str
    producer_node: int
    consumers_by_node: dict  # node index -> consumers there
    messages: int
    groups: int = GROUPS  # each message's group is drawn from this many (seeded, with replacement)


def measure_flow(nodes: list[NodeProcess], row: FlowRow, scratch_dir: Path, before_go=None, on_go=None) -> dict:
    """clients.measure with the producer on one node and each node's consumers on that node.

    One consumer process per consuming node (its consumers share it, one connection each)."""
    context = multiprocessing.get_context("fork")
    total = sum(row.consumers_by_node.values())
    workload = clients.Workload(messages=row.messages, groups=row.groups, prefetch=PREFETCH, durable=True,
                                consumers=total)
    scratch_dir.mkdir(parents=True, exist_ok=True)
    go, stop = context.Event(), context.Event()
    progress = context.RawArray("q", total)
    readies = [context.Event() for _ in range(total)]
    consumer_paths = [str(scratch_dir / f"consumer{index}.pickle") for index in range(total)]
    producer_path = scratch_dir / "producer.pickle"
    for path in [*consumer_paths, producer_path]:
        Path(path).unlink(missing_ok=True)
    addresses = tuple((row.queue,) for _ in range(total))
    processes, first = [], 0
    for node_index, count in sorted(row.consumers_by_node.items()):
        target = peers.Target("amqp", nodes[node_index].url, row.queue, addresses)
        indexes = list(range(first, first + count))
        first += count
        processes.append(context.Process(target=lean.consumers, name=f"bench-consumers-node{node_index + 1}",
                                         args=(target, indexes, workload, readies, stop, progress, consumer_paths)))
    producer_target = peers.Target("amqp", nodes[row.producer_node].url, row.queue, addresses)
    producer = context.Process(target=lean.producer, name="bench-producer",
                               args=(producer_target, workload, go, str(producer_path)))
    outcome = clients.RowOutcome()
    cpu_used = [0.0] * len(nodes)
    for process in processes:
        process.start()
    producer.start()
    try:
        deadline = time.monotonic() + clients.READY_TIMEOUT_S
        for ready in readies:
            if not ready.wait(max(0.0, deadline - time.monotonic())):
                outcome.errors.append(f"consumers did not attach within {clients.READY_TIMEOUT_S} s")
                break
        if not outcome.errors:
            if before_go is not None:
                before_go()
            time.sleep(0.2)
            cpu_before = [node.cpu_seconds() for node in nodes]
            go.set()
            if on_go is not None:
                on_go()
            clients._wait_for_all(workload.messages, progress, producer, outcome)
            cpu_used = [node.cpu_seconds() - before for node, before in zip(nodes, cpu_before)]
    finally:
        go.set()
        stop.set()
        for process in [*processes, producer]:
            process.join(clients.JOIN_TIMEOUT_S)
            if process.is_alive():
                process.terminate()
                process.join(5)
                outcome.errors.append(f"{process.name} did not finish; terminated")
    clients._summarize(outcome, workload, sum(cpu_used), clients._load(producer_path),
                       [clients._load(Path(path)) for path in consumer_paths])
    unique = max(outcome.unique, 1)
    # every group's first message waits for a route decision in the raft log; the row sends its
    # groups' first messages spread over the run, so decisions/s is the row's rate times their share
    distinct_groups = len(set(clients.plan(workload)[0]))
    decisions_per_s = round(outcome.throughput_per_s * distinct_groups / row.messages) if row.messages else 0
    return {"key": row.key, "label": row.label, "messages": row.messages, "groups": row.groups,
            "distinct_groups": distinct_groups, "decisions_per_s": decisions_per_s, "prefetch": PREFETCH,
            "durable": True, "producer_node": row.producer_node + 1,
            "consumers_by_node": {str(i + 1): n for i, n in sorted(row.consumers_by_node.items())},
            "node_cpu_us_per_msg": [round(used / unique * 1e6, 1) for used in cpu_used],
            **dataclasses.asdict(outcome)}


# ---- probe clients: one message at a time, every outcome recorded ------------------------------

def _dump(path: str, value: dict) -> None:
    with open(path, "wb") as handle:
        pickle.dump(value, handle, protocol=pickle.HIGHEST_PROTOCOL)


def _load(path) -> dict | None:
    try:
        with open(path, "rb") as handle:
            return pickle.load(handle)
    except (OSError, EOFError, pickle.UnpicklingError):
        return None


def probe_producer(url: str, queue: str, groups, interval_s: float, ready, go, stop, accepted_after,
                   result_path: str) -> None:
    """Send one message every `interval_s`: of groups[i] in turn, or (groups a str) of a brand-new
    group `<groups>-<i>` each time, until the list ends or `stop` is set. Records, per message, the
    send and settle times (CLOCK_MONOTONIC ns) and the outcome. `accepted_after` is a shared
    [since_ns, first_accept_ns, accepted_count]: the producer fills in the first acceptance of a
    message sent at or after since_ns, so the parent can tell when traffic resumed."""
    endless = isinstance(groups, str)
    sent_ns, settled_ns, states = array("q"), array("q"), array("b")
    body = b"x" * 100

    class Producer(MessagingHandler):
        def __init__(self):
            super().__init__(prefetch=0)
            self.sender = self.connection = None
            self.error = ""
            self.unsettled = 0
            self.stopping_since = 0.0

        def on_start(self, event):
            self.connection = event.container.connect(url, reconnect=False)
            self.sender = event.container.create_sender(self.connection, queue, name="probe-producer")
            event.container.schedule(TIMER_INTERVAL_S, self)

        def on_link_opened(self, event):
            ready.set()

        def on_timer_task(self, event):
            sending = go.is_set() and not stop.is_set() and (endless or len(sent_ns) < len(groups))
            if sending:
                if self.sender.credit > 0:
                    self._send_one()
                event.container.schedule(interval_s, self)
                return
            if not go.is_set():
                event.container.schedule(TIMER_INTERVAL_S, self)
                return
            if not self.stopping_since:
                self.stopping_since = time.monotonic()
            if self.unsettled and time.monotonic() - self.stopping_since < SETTLE_WAIT_S:
                event.container.schedule(TIMER_INTERVAL_S, self)
            else:
                self.connection.close()

        def _send_one(self):
            index = len(sent_ns)
            message = Message(body=body, durable=True)
            message.group_id = f"{groups}-{index}" if endless else groups[index]
            now = time.monotonic_ns()
            message.properties = {clients.SENT_KEY: now, clients.SEQ_KEY: index}
            self.sender.send(message, tag=str(index).encode())
            sent_ns.append(now)
            settled_ns.append(0)
            states.append(0)
            self.unsettled += 1

        def _settled(self, event, state):
            now = time.monotonic_ns()
            tag = event.delivery.tag
            index = int(tag.decode() if isinstance(tag, bytes) else tag)
            if states[index]:
                return
            settled_ns[index], states[index] = now, state
            self.unsettled -= 1
            if state == ACCEPTED:
                accepted_after[2] += 1
                if not accepted_after[1] and accepted_after[0] and sent_ns[index] >= accepted_after[0]:
                    accepted_after[1] = now

        def on_accepted(self, event):
            self._settled(event, ACCEPTED)

        def on_rejected(self, event):
            self._settled(event, REJECTED)

        def on_released(self, event):
            self._settled(event, RELEASED)

        def on_modified(self, event):
            self._settled(event, MODIFIED)

        def on_transport_error(self, event):
            self.error = str(event.transport.condition)

    producer = Producer()
    try:
        Container(producer).run()
    except Exception as error:  # recorded, not raised: a benchmark reports failures
        producer.error = f"{type(error).__name__}: {error}"
    _dump(result_path, {"sent_ns": list(sent_ns), "settled_ns": list(settled_ns), "states": list(states),
                        "error": producer.error})


def probe_consumer(url: str, queue: str, prefetch: int, ready, stop, watch, result_path: str) -> None:
    """One consumer that accepts everything, redials its node every RECONNECT_INTERVAL_S when the
    connection drops, and records each message (group, probe index, sent and received ns) and each
    attach and disconnect time. `watch` is a shared [since_ns, first receipt after since_ns, first
    receipt of a message sent after since_ns, receipts]: the parent sets since_ns and watches."""
    groups, indexes, sent, received = [], array("q"), array("q"), array("q")
    attached_ns, disconnected_ns, errors = [], [], []

    class Redial:
        def __init__(self, consumer):
            self.consumer = consumer

        def on_timer_task(self, event):
            self.consumer.redial_pending = False
            self.consumer.connect(event.container)

    class Consumer(MessagingHandler):
        def __init__(self):
            super().__init__(prefetch=0, auto_accept=False)
            self.connection = None
            self.redial_pending = False  # proton reports one drop as tail-closed, then closed

        def connect(self, container):
            if stop.is_set():
                return
            self.connection = container.connect(url, reconnect=False)
            receiver = container.create_receiver(self.connection, queue, name="probe-consumer")
            receiver.flow(prefetch)

        def on_start(self, event):
            self.connect(event.container)
            event.container.schedule(TIMER_INTERVAL_S, self)

        def on_link_opened(self, event):
            attached_ns.append(time.monotonic_ns())
            ready.set()

        def on_message(self, event):
            now = time.monotonic_ns()
            properties = event.message.properties or {}
            self.accept(event.delivery)
            event.receiver.flow(1)
            sent_ns = properties.get(clients.SENT_KEY, 0)
            groups.append(event.message.group_id)
            indexes.append(properties.get(clients.SEQ_KEY, -1))
            sent.append(sent_ns)
            received.append(now)
            watch[3] += 1
            since = watch[0]
            if since and now >= since:
                if not watch[1]:
                    watch[1] = now
                if not watch[2] and sent_ns >= since:
                    watch[2] = now

        def on_disconnected(self, event):
            if event.connection == self.connection and not self.redial_pending and not stop.is_set():
                disconnected_ns.append(time.monotonic_ns())
                self.redial_pending = True
                event.container.schedule(RECONNECT_INTERVAL_S, Redial(self))

        def on_transport_error(self, event):
            errors.append(str(event.transport.condition))

        def on_timer_task(self, event):
            if stop.is_set():
                if self.connection is not None:
                    self.connection.close()
            else:
                event.container.schedule(TIMER_INTERVAL_S, self)

    try:
        Container(Consumer()).run()
    except Exception as error:
        errors.append(f"{type(error).__name__}: {error}")
    _dump(result_path, {"groups": groups, "indexes": list(indexes), "sent_ns": list(sent),
                        "received_ns": list(received), "attached_ns": attached_ns,
                        "disconnected_ns": disconnected_ns, "errors": errors[-5:]})


class Probes:
    """Probe processes of one phase; `stop()` ends them and loads what each recorded."""

    def __init__(self, scratch_dir: Path):
        self.context = multiprocessing.get_context("fork")
        self.scratch_dir = scratch_dir
        scratch_dir.mkdir(parents=True, exist_ok=True)
        self.stop_event = self.context.Event()
        self.processes: list = []
        self.paths: dict[str, Path] = {}

    def consumer(self, name: str, node: NodeProcess, queue: str, prefetch: int = PREFETCH):
        """Returns (ready, watch); see probe_consumer."""
        ready = self.context.Event()
        watch = self.context.RawArray("q", 4)
        path = self.scratch_dir / f"{name}.pickle"
        path.unlink(missing_ok=True)
        process = self.context.Process(target=probe_consumer, name=name,
                                       args=(node.url, queue, prefetch, ready, self.stop_event, watch, str(path)))
        process.start()
        self.processes.append(process)
        self.paths[name] = path
        return ready, watch

    def producer(self, name: str, node: NodeProcess, queue: str, groups, interval_s: float):
        """Returns (go, stop, accepted_after, process); the producer connects at once and sends after go."""
        ready, go, stop = self.context.Event(), self.context.Event(), self.context.Event()
        accepted_after = self.context.RawArray("q", 3)
        path = self.scratch_dir / f"{name}.pickle"
        path.unlink(missing_ok=True)
        process = self.context.Process(target=probe_producer, name=name,
                                       args=(node.url, queue, groups, interval_s, ready, go, stop, accepted_after,
                                             str(path)))
        process.start()
        self.processes.append(process)
        self.paths[name] = path
        if not ready.wait(clients.READY_TIMEOUT_S):
            raise RuntimeError(f"probe producer {name} did not attach to {node.name}")
        return go, stop, accepted_after, process

    def finish_producer(self, name: str, stop, process, run_out_s: float = 0.0) -> dict:
        """Let a producer with a list run it out (up to `run_out_s`), then stop it and load its record."""
        process.join(run_out_s)
        stop.set()
        process.join(SETTLE_WAIT_S + clients.JOIN_TIMEOUT_S)
        if process.is_alive():
            process.terminate()
            process.join(5)
        return _load(self.paths[name]) or {"sent_ns": [], "settled_ns": [], "states": [], "error": "no result"}

    def finish(self) -> dict[str, dict]:
        self.stop_event.set()
        for process in self.processes:
            process.join(clients.JOIN_TIMEOUT_S)
            if process.is_alive():
                process.terminate()
                process.join(5)
        return {name: _load(path) for name, path in self.paths.items()}


class BackgroundLoad:
    """Grouped load through every node while a phase measures something else: one producer per node
    (the bench's lean client) at `rate_per_s` / 3 each (0: as fast as credit allows), one consumer per
    node, on `queue`. `received()` counts what the consumers took; leaving the block stops it all
    (the producers mid-plan: what they left unsent is not a loss)."""

    def __init__(self, nodes: list[NodeProcess], queue: str, rate_per_s: int, seconds: float, scratch_dir: Path):
        self.context = multiprocessing.get_context("fork")
        self.nodes, self.queue, self.scratch_dir = nodes, queue, scratch_dir
        per_node_per_s = rate_per_s // len(nodes)
        # unthrottled producers get a plan they cannot finish in `seconds` at any rate seen here
        messages = int(per_node_per_s * seconds) if per_node_per_s else int(20_000 * seconds)
        self.workloads = [clients.Workload(messages=messages, groups=BACKGROUND_GROUPS, prefetch=PREFETCH,
                                           durable=True, consumers=len(nodes), seed=index + 1,
                                           rate_per_s=per_node_per_s) for index in range(len(nodes))]
        self.progress = self.context.RawArray("q", len(nodes))
        self.stop = self.context.Event()
        self.go = self.context.Event()
        self.processes: list = []

    def __enter__(self) -> "BackgroundLoad":
        self.scratch_dir.mkdir(parents=True, exist_ok=True)
        count = len(self.nodes)
        addresses = tuple((self.queue,) for _ in range(count))
        readies = [self.context.Event() for _ in range(count)]
        paths = [str(self.scratch_dir / f"consumer{index}.pickle") for index in range(count)]
        for index, node in enumerate(self.nodes):
            target = peers.Target("amqp", node.url, self.queue, addresses)
            self._start(lean.consumers, f"background-consumer-node{index + 1}",
                        (target, [index], self.workloads[index], readies, self.stop, self.progress, paths))
        wait_ready([(ready, None) for ready in readies], "background load")
        for index, node in enumerate(self.nodes):
            target = peers.Target("amqp", node.url, self.queue, addresses)
            self._start(lean.producer, f"background-producer-node{index + 1}",
                        (target, self.workloads[index], self.go, str(self.scratch_dir / f"producer{index}.pickle")))
        self.go.set()
        return self

    def _start(self, target, name: str, args: tuple) -> None:
        process = self.context.Process(target=target, name=name, args=args)
        process.start()
        self.processes.append(process)

    def received(self) -> int:
        return sum(self.progress)

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for process in self.processes:
            if process.name.startswith("background-producer"):
                process.terminate()  # mid-plan, on purpose
        for process in self.processes:
            process.join(clients.JOIN_TIMEOUT_S)
            if process.is_alive():
                process.terminate()
                process.join(5)


def decision_delta(before: list, after: list) -> list[tuple[float, int]]:
    """Per-bucket counts (not cumulative) of the decisions between two readings of one node."""
    counts, previous = [], 0
    for (bound, total_after), (_, total_before) in zip(after, before):
        cumulative = total_after - total_before
        counts.append((bound, cumulative - previous))
        previous = cumulative
    return counts


def decision_summary(per_node: list[list[tuple[float, int]]]) -> dict:
    """Decisions of several nodes together: count, p50 and p99 interpolated within their buckets,
    and the share decided within DECISION_TARGET_MS (exact: it is a bucket bound)."""
    merged: dict[float, int] = {}
    for counts in per_node:
        for bound, count in counts:
            merged[bound] = merged.get(bound, 0) + count
    buckets = sorted(merged.items())
    total = sum(count for _, count in buckets)
    if not total:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "within_target_pct": None}

    def quantile(fraction: float) -> float:
        rank, seen, lower = fraction * total, 0, 0.0
        for bound, count in buckets:
            if count and seen + count >= rank:
                if bound == float("inf"):
                    return lower  # beyond the last bound: the bound is all that is known
                return lower + (bound - lower) * (rank - seen) / count
            seen += count
            lower = bound if bound != float("inf") else lower
        return lower

    within = sum(count for bound, count in buckets if bound <= DECISION_TARGET_MS)
    return {"count": total, "p50_ms": round(quantile(0.5), 2), "p99_ms": round(quantile(0.99), 2),
            "within_target_pct": round(within / total * 100, 2)}


def decision_readings(nodes: list[NodeProcess]) -> list:
    """Per node: its whole-decision and its member's raft-part histograms."""
    return [(node.raft_decisions(), node.raft_decisions(MEMBER_DECISION_BUCKET_METRIC)) for node in nodes]


def decisions_since(nodes: list[NodeProcess], before: list) -> dict:
    """decision_summary of the decisions the nodes timed since their readings `before` (decision_readings),
    with the raft part their members timed as "member"."""
    after = decision_readings(nodes)
    summary = decision_summary([decision_delta(earlier[0], now[0]) for earlier, now in zip(before, after)])
    summary["member"] = decision_summary([decision_delta(earlier[1], now[1]) for earlier, now in zip(before, after)])
    return summary


def wait_ready(readies, what: str) -> None:
    for ready, _ in readies:
        if not ready.wait(clients.READY_TIMEOUT_S):
            raise RuntimeError(f"{what}: a probe consumer did not attach within {clients.READY_TIMEOUT_S} s")


def percentiles_ms(values_ns) -> dict:
    values = sorted(values_ns)
    if not values:
        return {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}
    pick = lambda fraction: values[min(len(values) - 1, int(fraction * len(values)))] / 1e6  # noqa: E731
    return {"count": len(values), "p50_ms": round(pick(0.5), 2), "p99_ms": round(pick(0.99), 2),
            "max_ms": round(values[-1] / 1e6, 2)}


def wait_until(predicate, timeout_s: float, interval_s: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()


# ---- phases -----------------------------------------------------------------------------------

def phase(gate: LoadGate, name: str, run, cluster: "Cluster | None" = None) -> dict:
    """Wait for a quiet machine, run, record the load and (in a cluster) the raft elections the
    node logs show from the start of the wait to the end of the phase: a stable cluster has none
    but those the phase causes itself."""
    window_start_s = time.time()
    load = gate.wait(name)
    started, steal_before = time.monotonic(), steal_jiffies()
    try:
        result = run()
    except Exception as error:  # a failed phase is reported, the run goes on
        log(f"[{name}] FAILED: {type(error).__name__}: {error}")
        result = {"failed": f"{type(error).__name__}: {error}"}
    extra = {}
    if cluster is not None:
        extra["elections"] = sum(len(leader_since(node, window_start_s)) for node in cluster.nodes)
        if extra["elections"]:
            log(f"[{name}] {extra['elections']} raft leader elections during the phase (its wait included)")
    extra["steal_pct"] = steal_pct(steal_before)
    return {**result, "load_start": load["load_start"], "load_end": load_1m(), "load_waited_s": load["waited_s"],
            "load_quiet": load["quiet"], "phase_s": round(time.monotonic() - started, 1), **extra}


def flow_summary(result: dict) -> str:
    return (f"{result['throughput_per_s']:.0f} msgs/s, broker {result['broker_cpu_us_per_msg']:.0f} us/msg "
            f"(per node {result['node_cpu_us_per_msg']}), p50 {result['latency_p50_ms']:.0f} ms, "
            f"p99 {result['latency_p99_ms']:.0f} ms, lost {result['lost']}, dup {result['duplicates']}, "
            f"split {result['groups_split']} {result['errors'] or ''}")


def idle_cpu_pct(nodes: list[NodeProcess]) -> list[float]:
    """Percent of one core each node uses with no clients at all."""
    before = [node.cpu_seconds() for node in nodes]
    time.sleep(IDLE_MEASURE_S)
    return [round((node.cpu_seconds() - start) / IDLE_MEASURE_S * 100, 1) for node, start in zip(nodes, before)]


def run_single(work_dir: Path, config_path: Path, messages: int, gate: LoadGate, report: dict) -> dict:
    node = NodeProcess("single", work_dir, config_path)
    node.start()
    log(f"[single] node ready: {node.url}")
    try:
        report["idle_cpu_pct_single"] = idle_cpu_pct([node])[0]
        warm = measure_flow([node], FlowRow("warmup", "warm-up", "warmup", 0, SINGLE_LAYOUT,
                                            WARMUP_MESSAGES), work_dir / "rows" / "single-warmup")
        log(f"[single] warm-up: {warm['throughput_per_s']:.0f} msgs/s {warm['errors'] or ''}")
        row = FlowRow("a", "1 node, producer and 4 consumers on it", "a", 0, SINGLE_LAYOUT, messages)
        result = phase(gate, "a", lambda: measure_flow([node], row, work_dir / "rows" / "a"))
        log(f"[a] {flow_summary(result)}" if "failed" not in result else "[a] failed")
        return result
    finally:
        node.stop()


def run_flows(cluster: Cluster, work_dir: Path, messages: int, gate: LoadGate) -> list[dict]:
    nodes = cluster.nodes
    everywhere, remote = LOCAL_LAYOUT, REMOTE_LAYOUT
    warm = measure_flow(nodes, FlowRow("warmup", "warm-up", "warmup", 0, remote, WARMUP_MESSAGES),
                        work_dir / "rows" / "cluster-warmup",
                        before_go=lambda: cluster.wait_consumers("warmup", remote))
    log(f"[cluster] warm-up (forwarded): {warm['throughput_per_s']:.0f} msgs/s {warm['errors'] or ''}")
    rows = [FlowRow("b1", "3 nodes, producer on node 1; consumers: 4 on node 1, 2 on node 2, 2 on node 3 "
                    "(placement balanced: groups spread by groups per consumer, so about half are forwarded)",
                    "b1", 0, everywhere, messages),
            FlowRow("b2", "3 nodes, producer on node 1; consumers: 2 on node 2, 2 on node 3 (all forwarded)", "b2", 0,
                    remote, messages)]
    ceiling = min(messages, CEILING_MESSAGES_MAX)
    rows.append(FlowRow("c", f"decision ceiling: as (b1), but each message's group drawn from {ceiling:,} groups, "
                        "so most messages open a new group and wait for its route decision", "c", 0, everywhere,
                        ceiling, groups=ceiling))
    results = []
    for row in rows:
        result = phase(gate, row.key, lambda row=row: measure_flow(
            nodes, row, work_dir / "rows" / row.key,
            before_go=lambda: cluster.wait_consumers(row.queue, row.consumers_by_node)), cluster)
        if "failed" not in result:
            result["leader_node"] = cluster.leader() + 1
            result["routes_by_node"] = routes_by_node(cluster)  # where placement put the row's groups (all queues)
            log(f"[{row.key}] {flow_summary(result)}; leader node {result['leader_node']}")
        results.append(result)
    return results


def run_local_placement(work_dir: Path, config_path: Path, messages: int, gate: LoadGate) -> dict:
    """Row (b1) again on a fresh cluster whose nodes place new groups locally (`--placement local`),
    to set against balanced placement's (b1)."""
    cluster = Cluster(work_dir / "placement-local", config_path, args=("--placement", "local"))
    try:
        cluster.start()
        measure_flow(cluster.nodes, FlowRow("warmup", "warm-up", "warmup", 0, REMOTE_LAYOUT, WARMUP_MESSAGES),
                     work_dir / "rows" / "local-warmup",
                     before_go=lambda: cluster.wait_consumers("warmup", REMOTE_LAYOUT))
        row = FlowRow("b1-local", "as (b1), but every node started with `--placement local`", "b1", 0, LOCAL_LAYOUT,
                      messages)
        result = phase(gate, row.key, lambda: measure_flow(
            cluster.nodes, row, work_dir / "rows" / row.key,
            before_go=lambda: cluster.wait_consumers(row.queue, row.consumers_by_node)), cluster)
        if "failed" not in result:
            log(f"[{row.key}] {flow_summary(result)}")
        return result
    finally:
        cluster.stop()


def run_latency(cluster: Cluster, work_dir: Path, half_load_per_s: int) -> dict:
    """New-group decisions from every node, and forwarded against local messages from one, all under
    a background load of `half_load_per_s` through every node."""
    nodes = cluster.nodes
    leader = cluster.leader()
    followers = [i for i in range(3) if i != leader]
    with_consumers, without = followers[0], followers[1]
    consuming = sorted([leader, with_consumers])
    order = [with_consumers, without, leader]
    plans = {index: [f"n{index + 1}-{n}" for n in range(PROBE_NEW_GROUPS)] for index in order}
    probes = Probes(work_dir / "probes" / "latency")
    decisions, cpu_waits = {}, {}
    try:
        with BackgroundLoad(nodes, "background", half_load_per_s, BACKGROUND_S,
                            work_dir / "background" / "latency") as load:
            # the background's own groups are decided first, so the probes' decisions are the only new ones
            if not wait_until(lambda: load.received() >= 30 * BACKGROUND_GROUPS, BACKGROUND_S / 2, 0.1):
                raise RuntimeError(f"the background load did not reach {30 * BACKGROUND_GROUPS} messages "
                                   f"within {BACKGROUND_S / 2:.0f} s (received {load.received()})")
            wait_ready([probes.consumer(f"consumer-node{i + 1}", nodes[i], "latency") for i in consuming], "latency")
            cluster.wait_consumers("latency", {i: 1 for i in consuming})
            load_from, load_from_s = load.received(), time.monotonic()
            series = {}
            for index in order:
                name = f"new-groups-from-node{index + 1}"
                before = decision_readings(nodes)
                waited_before, waited_from_s = [node.cpu_wait_ns() for node in nodes], time.monotonic()
                go, stop, _, process = probes.producer(name, nodes[index], "latency", plans[index], PROBE_INTERVAL_S)
                go.set()
                series[index] = probes.finish_producer(name, stop, process, PROBE_NEW_GROUPS * PROBE_INTERVAL_S * 3)
                decisions[index] = decisions_since(nodes, before)
                elapsed_s = time.monotonic() - waited_from_s
                cpu_waits[index] = [round((node.cpu_wait_ns() - earlier) / 1e6 / elapsed_s)
                                    for node, earlier in zip(nodes, waited_before)]
            # every group above now has a route: send to them again from the follower with consumers
            known = [group for index in order for group in plans[index]]
            existing = known[::max(1, len(known) // PROBE_EXISTING_MESSAGES)][:PROBE_EXISTING_MESSAGES]
            before = decision_readings(nodes)
            go, stop, _, process = probes.producer("existing", nodes[with_consumers], "latency", existing,
                                                   PROBE_INTERVAL_S)
            go.set()
            existing_result = probes.finish_producer("existing", stop, process, len(existing) * PROBE_INTERVAL_S * 3)
            existing_decisions = decisions_since(nodes, before)["count"]
            time.sleep(1.0)  # the last forwarded probes reach their consumers
            background_per_s = round((load.received() - load_from) / (time.monotonic() - load_from_s))
    finally:
        received = probes.finish()
    # every message carries its send time, unique per message: the key of its first receipt
    receipts: dict[int, tuple[int, int]] = {}
    for index in consuming:
        record = received.get(f"consumer-node{index + 1}") or {"sent_ns": [], "received_ns": []}
        for sent_ns, at in zip(record["sent_ns"], record["received_ns"]):
            receipts.setdefault(sent_ns, (at, index))
    rows = []
    for index in order:
        sent = series[index]
        accept, deliver, placed_local, failed = [], [], 0, 0
        for sent_ns, settled_ns, state in zip(sent["sent_ns"], sent["settled_ns"], sent["states"]):
            if state != ACCEPTED:
                failed += 1
                continue
            accept.append(settled_ns - sent_ns)
            receipt = receipts.get(sent_ns)
            if receipt is not None:
                deliver.append(receipt[0] - sent_ns)
                placed_local += receipt[1] == index
        rows.append({"producer_node": index + 1, "is_leader": index == leader, "decision": decisions[index],
                     "cpu_wait_ms_per_s": cpu_waits[index],
                     "has_consumers": index in consuming, "sent": len(sent["sent_ns"]), "not_accepted": failed,
                     "received": len(deliver), "placed_on_producer_node": placed_local,
                     "accept": percentiles_ms(accept), "receive": percentiles_ms(deliver),
                     "error": sent.get("error", "")})
    # existing groups: local when the producer node's consumer received it, else forwarded
    times = {"local": ([], []), "forwarded": ([], [])}
    missing = 0
    for sent_ns, settled_ns, state in zip(existing_result["sent_ns"], existing_result["settled_ns"],
                                          existing_result["states"]):
        receipt = receipts.get(sent_ns)
        if receipt is None or state != ACCEPTED:
            missing += 1
            continue
        accept, receive = times["local" if receipt[1] == with_consumers else "forwarded"]
        accept.append(settled_ns - sent_ns)
        receive.append(receipt[0] - sent_ns)
    existing_row = {"producer_node": with_consumers + 1, "missing": missing}
    for kind, (accept, receive) in times.items():
        existing_row[f"{kind}_accept"] = percentiles_ms(accept)
        existing_row[f"{kind}_receive"] = percentiles_ms(receive)
    return {"leader_node": leader + 1, "consumer_nodes": [i + 1 for i in consuming], "new_groups": rows,
            "existing": existing_row, "existing_raft_decisions": existing_decisions,
            "half_load_per_s": half_load_per_s, "background_per_s": background_per_s}


def run_stability(cluster: Cluster, work_dir: Path, seconds: float) -> dict:
    """Full load through every node for `seconds`: how many raft elections and term changes happen
    with nobody killed (the target is none)."""
    terms_before = [(cluster.status(via=index) or {}).get("term") for index in range(3)]
    with BackgroundLoad(cluster.nodes, "stability", 0, seconds * 2, work_dir / "background" / "stability") as load:
        cpu_before = [node.cpu_seconds() for node in cluster.nodes]
        started_s, received_from = time.monotonic(), load.received()
        time.sleep(seconds)
        received = load.received() - received_from
        elapsed_s = time.monotonic() - started_s
        cpu_used = [node.cpu_seconds() - before for node, before in zip(cluster.nodes, cpu_before)]
    terms_after = [(cluster.status(via=index) or {}).get("term") for index in range(3)]
    return {"seconds": round(elapsed_s), "received": received, "throughput_per_s": round(received / elapsed_s),
            "node_cpu_pct": [round(used / elapsed_s * 100) for used in cpu_used],
            "terms_before": terms_before, "terms_after": terms_after}


def run_leader_kills(cluster: Cluster, work_dir: Path, repeats: int) -> dict:
    nodes = cluster.nodes
    probes = Probes(work_dir / "probes" / "leader")
    repetitions = []
    try:
        wait_ready([probes.consumer(f"consumer-node{i + 1}", nodes[i], "leader") for i in range(3)], "leader kill")
        cluster.wait_consumers("leader", {0: 1, 1: 1, 2: 1})
        for repeat in range(repeats):
            leader = cluster.leader()
            producer_node = next(i for i in range(3) if i != leader)
            name = f"producer-{repeat}"
            go, stop, accepted_after, process = probes.producer(name, nodes[producer_node], "leader",
                                                                f"k{repeat}", LEADER_PROBE_INTERVAL_S)
            go.set()
            time.sleep(STEADY_BEFORE_KILL_S)
            kill_wall_s, kill_ns = time.time(), time.monotonic_ns()
            accepted_after[0] = kill_ns
            nodes[leader].kill()
            resumed = wait_until(lambda: accepted_after[1] != 0, RECOVERY_WAIT_S, 0.005)
            time.sleep(0.5)
            sent = probes.finish_producer(name, stop, process)
            new_leader_status = cluster.status(producer_node)
            elected_s = [t for i in range(3) if i != leader for t in leader_since(nodes[i], kill_wall_s)]
            restart_ns = time.monotonic_ns()
            ready_s = nodes[leader].start()
            cluster.wait_healthy(via=leader)
            cluster.wait_healthy(via=producer_node)
            member_again_s = (time.monotonic_ns() - restart_ns) / 1e9
            cluster.wait_consumers("leader", {0: 1, 1: 1, 2: 1})
            repetitions.append(leader_kill_numbers(sent, kill_ns) | {"resumed_while_watching": resumed,
                "killed_node": leader + 1, "producer_node": producer_node + 1,
                "new_leader_node": (cluster.node_ids.index(new_leader_status["leader"]) + 1
                                    if new_leader_status and new_leader_status["leader"] else None),
                "kill_to_new_leader_ms": round((min(elected_s) - kill_wall_s) * 1000) if elected_s else None,
                "restart_to_ready_s": round(ready_s, 2), "restart_to_member_s": round(member_again_s, 2)})
            log(f"[leader kill {repeat + 1}] {repetitions[-1]}")
    finally:
        probes.finish()
    values = [r["kill_to_first_accept_ms"] for r in repetitions if r["kill_to_first_accept_ms"] is not None]
    return {"repetitions": repetitions, "worst_ms": max(values) if values else None,
            "median_ms": sorted(values)[len(values) // 2] if values else None}


LEADER_LOG_LINE = "this node is now the raft leader"


def leader_since(node: NodeProcess, since_s: float) -> list[float]:
    """Wall-clock times (from the node's log, millisecond resolution) it became leader after `since_s`."""
    times = []
    for line in node._log_from(0):
        if LEADER_LOG_LINE in line:
            try:
                stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            if stamp >= since_s:
                times.append(stamp)
    return times


def leader_kill_numbers(sent: dict, kill_ns: int) -> dict:
    """From the producer's record: when route decisions came back after the kill, and the stall."""
    rows = [(at, settled) for at, settled, state in zip(sent["sent_ns"], sent["settled_ns"], sent["states"])
            if state == ACCEPTED]
    after_kill = [settled for at, settled in rows if at >= kill_ns]
    before_kill = [settled for at, settled in rows if settled < kill_ns]
    first = min(after_kill) if after_kill else None
    ms = lambda value: round(value / 1e6, 1)  # noqa: E731
    return {"kill_to_first_accept_ms": ms(first - kill_ns) if first else None,
            "gap_between_accepts_ms": ms(min(settled for _, settled in rows if settled >= kill_ns) - max(before_kill))
            if first and before_kill else None,
            "longest_send_to_accept_ms": ms(max(settled - at for at, settled in rows)) if rows else None,
            "before_kill_accept": percentiles_ms([settled - at for at, settled in rows if settled < kill_ns]),
            "slow_sends": [(ms(at - kill_ns), ms(settled - at)) for at, settled in rows if settled - at > 20e6][:40],
            "sent": len(sent["sent_ns"]), "not_accepted": len(sent["sent_ns"]) - len(rows),
            "producer_error": sent.get("error", "")}


def run_owner_kills(cluster: Cluster, work_dir: Path, repeats: int) -> dict:
    nodes = cluster.nodes
    repetitions = []
    for repeat in range(repeats):
        leader = cluster.leader()
        followers = [i for i in range(3) if i != leader]
        owner, producer_node = followers[repeat % 2], followers[(repeat + 1) % 2]
        groups = [f"o{repeat}-{n}" for n in range(OWNER_GROUPS)]
        plan = groups * int(RECOVERY_WAIT_S * 3 / OWNER_PROBE_INTERVAL_S / OWNER_GROUPS)  # outlasts the repetition
        probes = Probes(work_dir / "probes" / f"owner{repeat}")
        try:
            ready, watch = probes.consumer("consumer", nodes[owner], "owner")
            wait_ready([(ready, watch)], "owner kill")
            cluster.wait_consumers("owner", {owner: 1})
            go, stop, accepted_after, process = probes.producer("producer", nodes[producer_node], "owner", plan,
                                                                OWNER_PROBE_INTERVAL_S)
            go.set()
            time.sleep(2.0)
            kill_ns = time.monotonic_ns()
            watch[0] = kill_ns
            nodes[owner].kill()
            restart_ns = time.monotonic_ns()
            ready_s = nodes[owner].start()
            ready_ns = restart_ns + int(ready_s * 1e9)
            resumed = wait_until(lambda: watch[2] != 0, RECOVERY_WAIT_S, 0.01)
            time.sleep(1.0)
            stop.set()
            # every accepted message reaches the consumer (redeliveries make the count an upper bound)
            sent = probes.finish_producer("producer", stop, process)
            accepted = sum(1 for state in sent["states"] if state == ACCEPTED)
            wait_until(lambda: watch[3] >= accepted, DRAIN_WAIT_S, 0.05)
            time.sleep(0.5)
        finally:
            received = probes.finish()
        consumer = received.get("consumer") or {"received_ns": [], "indexes": [], "sent_ns": [], "attached_ns": []}
        repetitions.append(owner_kill_numbers(consumer, sent, kill_ns, restart_ns, ready_ns, accepted) | {
            "owner_node": owner + 1, "producer_node": producer_node + 1, "leader_node": leader + 1,
            "resumed": resumed, "restart_to_ready_s": round(ready_s, 2)})
        log(f"[owner kill {repeat + 1}] {repetitions[-1]}")
        cluster.wait_healthy(via=owner)
    return {"repetitions": repetitions}


def owner_kill_numbers(consumer: dict, sent: dict, kill_ns: int, restart_ns: int, ready_ns: int, accepted: int) -> dict:
    received = list(zip(consumer["received_ns"], consumer["sent_ns"]))
    attached_after = [at for at in consumer["attached_ns"] if at > kill_ns]
    # what arrives on the old connection after the kill was sent before it: count from the re-attach
    reattached_ns = min(attached_after) if attached_after else None
    after = [at for at, _ in received if reattached_ns and at >= reattached_ns]
    outage = [at for at, sent_ns in received if reattached_ns and at >= reattached_ns and sent_ns >= kill_ns]
    accepted_sends = {at for at, state in zip(sent["sent_ns"], sent["states"]) if state == ACCEPTED}
    seen = [sent_ns for _, sent_ns in received]
    unique = set(seen)
    ms = lambda end, start: round((end - start) / 1e6, 1) if end else None  # noqa: E731
    first, first_outage = (min(after) if after else None), (min(outage) if outage else None)
    return {"restart_to_first_delivery_ms": ms(first, restart_ns), "kill_to_first_delivery_ms": ms(first, kill_ns),
            "restart_to_consumer_attached_ms": ms(reattached_ns, restart_ns),
            "ready_to_first_delivery_ms": ms(first, ready_ns),
            "restart_to_first_outage_message_ms": ms(first_outage, restart_ns),
            "ready_to_first_outage_message_ms": ms(first_outage, ready_ns),
            "kill_to_first_outage_message_ms": ms(first_outage, kill_ns),
            "sent": len(sent["sent_ns"]), "accepted": accepted,
            "sent_during_outage": sum(1 for at in sent["sent_ns"] if kill_ns <= at < ready_ns),
            "lost": len(accepted_sends - unique), "redelivered": len(seen) - len(unique),
            "producer_error": sent.get("error", ""), "consumer_errors": consumer.get("errors", [])}


# ---- profile (not measured) -------------------------------------------------------------------

def run_profile(cluster: Cluster, work_dir: Path, messages: int) -> dict:
    """py-spy on the forwarding node (1) and an owner (2) during a (b2) flow; the summary per node."""
    if not shutil.which("py-spy"):
        return {"failed": "py-spy is not installed"}
    nodes = cluster.nodes
    remote = REMOTE_LAYOUT
    out_dir = work_dir / "profile"
    out_dir.mkdir(parents=True, exist_ok=True)
    spies = []
    window_cpu: dict[str, list[float]] = {}

    def start_spies():
        window_cpu["start"] = cluster.cpu_seconds()
        threading.Timer(PROFILE_DURATION_S, lambda: window_cpu.setdefault("end", cluster.cpu_seconds())).start()
        for index, role in ((0, "forwarder"), (1, "owner")):
            path = out_dir / f"node{index + 1}-{role}.txt"
            spies.append((role, index, path, subprocess.Popen(
                ["py-spy", "record", "-p", str(nodes[index].pid), "-f", "raw", "--nonblocking", "--threads",
                 "-d", str(PROFILE_DURATION_S), "-o", str(path)],
                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))

    row = FlowRow("profile", "b2 under py-spy", "profile", 0, remote, max(messages, PROFILE_MESSAGES_MIN))
    flow = measure_flow(nodes, row, work_dir / "rows" / "profile",
                        before_go=lambda: cluster.wait_consumers("profile", remote), on_go=start_spies)
    summaries = {}
    for role, index, path, spy in spies:
        try:
            _, stderr = spy.communicate(timeout=PROFILE_DURATION_S + 30)
        except subprocess.TimeoutExpired:
            spy.kill()
            stderr = b"py-spy did not finish"
        cpu_s = (window_cpu["end"][index] - window_cpu["start"][index]) if "end" in window_cpu else None
        summaries[role] = summarize_profile(path) | {"node": index + 1, "raw": str(path),
                                                      "cpu_s_in_window": None if cpu_s is None else round(cpu_s, 2),
                                                      "py_spy_errors": stderr.decode(errors="replace")[-300:]
                                                      if spy.returncode else ""}
    return {"flow_throughput_per_s": round(flow["throughput_per_s"]), "node_cpu_us_per_msg": flow["node_cpu_us_per_msg"],
            **summaries}


# Samples whose innermost frame waits (for a socket, a condition, a reply, the disk) are not CPU.
PROFILE_WAITING = re.compile(
    r"^(?:[\w.]*\.)?(?:wait|poll|select|_blocking|_serve|sleep) \("
    r"|^_worker \(concurrent/futures/thread\.py:81\)")
def _fsync_lines() -> str:
    """Where the journal calls `os.fsync`, as regex alternatives `module.py:line`: a sample there waits for the disk."""
    places = []
    for module in ("writer", "compaction", "recovery"):  # the journal's modules that fsync (node/store/)
        try:
            source = (REPO_ROOT / "node" / "store" / f"{module}.py").read_text().splitlines()
        except OSError:
            continue
        places += [rf"{module}\.py:{number}" for number, line in enumerate(source, 1) if "os.fsync(" in line]
    return "|".join(places) or "0"


PROFILE_FSYNC = re.compile(rf"^[\w.]+ \(node/store/(?:{_fsync_lines()})\)")
# Where a busy sample's time goes: the innermost frame matching one of these, first match wins.
PROFILE_CATEGORIES = (
    ("journal (encode, write)", re.compile(r"node/store/")),
    ("peer forwarding: gRPC, protobuf, node/peer", re.compile(r"node/peer/|grpc/|_pb2|google/protobuf")),
    ("raft (pysyncobj, handler/)", re.compile(r"pysyncobj/|handler/")),
    ("cluster routing (node/cluster.py, core/routing.py)", re.compile(r"node/cluster\.py|node/core/routing\.py")),
    ("dispatch core (queue, broker)", re.compile(r"node/core/")),
    ("AMQP adapter (node/amqp/)", re.compile(r"node/amqp/")),
    ("proton event machinery and proton-c calls", re.compile(r"proton/|cproton")),
    ("admin service (cluster status polls)", re.compile(r"node/admin/")),
)
THREAD_NAMES = (
    (re.compile(r"_autoTickThread"), "raft tick (pysyncobj)"),
    (re.compile(r"_serve\)"), "gRPC server poller"),
    (re.compile(r"^forward-"), "forwarders (one per owner)"),
    (re.compile(r"ThreadPoolExecutor|^admin"), "gRPC handler pool (peer and admin calls)"),
)


def thread_name(frame: str) -> str:
    name = frame.split(": ", 1)[1].strip() if ": " in frame else frame
    return next((label for pattern, label in THREAD_NAMES if pattern.search(name)), name)


def summarize_profile(path: Path) -> dict:
    """Busy samples (not waiting) per thread and per part of the code, and the top busy leaf frames."""
    if not path.exists():
        return {"samples": 0}
    threads: dict[str, int] = {}
    categories: dict[str, int] = {}
    leaves: dict[str, int] = {}
    total = waiting = fsync = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        if PROFILE_FSYNC.search(frames[-1]):
            fsync += count
            continue
        if PROFILE_WAITING.search(frames[-1]):
            waiting += count
            continue
        thread = thread_name(frames[0])
        threads[thread] = threads.get(thread, 0) + count
        category = next((name for frame in reversed(frames[1:]) for name, pattern in PROFILE_CATEGORIES
                         if pattern.search(frame)), "other")
        categories[category] = categories.get(category, 0) + count
        leaf = re.sub(r":\d+\)", ")", frames[-1])
        leaves[leaf] = leaves.get(leaf, 0) + count
    busy = total - waiting - fsync

    def share(table):
        return {key: round(value / busy * 100, 1) for key, value in sorted(table.items(), key=lambda item: -item[1])}

    return {"samples": total, "busy_samples": busy, "waiting_pct": round(waiting / total * 100, 1) if total else 0,
            "fsync_pct": round(fsync / total * 100, 1) if total else 0,
            "threads_pct": share(threads) if busy else {}, "categories_pct": share(categories) if busy else {},
            "top_leaves_pct": dict(list(share(leaves).items())[:12]) if busy else {}}


# ---- the report -------------------------------------------------------------------------------

TARGETS = {
    "forwarding_cpu_ratio_max": 1.3,  # (b2) broker CPU per message / (a): issue "Ten times cheaper per message"
    "new_group_accept_p99_ms_max": 10.0,
    # issue "The cluster protocol as a pure core": at half load, and kill -9 to the next decision
    "decision_p99_ms_max": DECISION_TARGET_MS,
    "leader_kill_to_first_accept_ms_max": 500.0,
    "stability_elections_max": 0,
}


def _n(value, digits: int = 0) -> str:
    if value is None:
        return "—"
    return f"{value:,.{digits}f}"


STEAL_NOISY_PCT = 10.0  # a phase with more CPU steal than this ran on well under 2 cores


def _met(ok, *phases) -> str:
    verdict = "—" if ok is None else ("met" if ok else "**missed**")
    steal = max((result.get("steal_pct", 0) for result, _ in phases), default=0)
    unprovoked = sum(max(0, result.get("elections", 0) - caused) for result, caused in phases)
    caveats = ([f"up to {steal:.0f}% CPU steal"] if steal > STEAL_NOISY_PCT else []) + (
        [f"{unprovoked} unprovoked raft elections"] if unprovoked else [])
    if caveats and ok is not None:
        verdict += " (measured with " + " and ".join(caveats) + ": not a verdict)"
    return verdict


def target_results(report: dict) -> dict:
    flows = {row["key"]: row for row in report.get("flows", []) if "failed" not in row and row.get("unique")}
    ratio = None
    if "a" in flows and "b2" in flows and flows["a"]["broker_cpu_us_per_msg"]:
        ratio = flows["b2"]["broker_cpu_us_per_msg"] / flows["a"]["broker_cpu_us_per_msg"]
    latency = report.get("latency", {})
    p99s = [row["accept"]["p99_ms"] for row in latency.get("new_groups", []) if row["accept"]["p99_ms"] is not None]
    worst_p99 = max(p99s) if p99s else None
    decision_p99s = [row["decision"]["p99_ms"] for row in latency.get("new_groups", [])
                     if row.get("decision", {}).get("p99_ms") is not None]
    worst_decision = max(decision_p99s) if decision_p99s else None
    member_p99s = [row["decision"]["member"]["p99_ms"] for row in latency.get("new_groups", [])
                   if row.get("decision", {}).get("member", {}).get("p99_ms") is not None]
    worst_member = max(member_p99s) if member_p99s else None
    leader = report.get("leader_kill", {})
    kills = [r["kill_to_first_accept_ms"] for r in leader.get("repetitions", [])]
    worst_kill = None if not kills or None in kills else max(kills)
    placed = flows.get("b1")
    spread = placement_spread(placed) if placed and placed.get("groups_per_consumer") else None
    worst_spread = None if spread is None else spread["worst_pct"]
    stability = report.get("stability", {})
    elections = stability.get("elections") if "failed" not in stability else None
    return {
        "placement_worst_pct": None if worst_spread is None else round(worst_spread, 1),
        "placement_met": None if worst_spread is None else worst_spread <= PLACEMENT_EVEN_PCT,
        "decision_p99_ms_worst": worst_decision,
        "decision_p99_met": None if worst_decision is None else worst_decision <= TARGETS["decision_p99_ms_max"],
        "member_decision_p99_ms_worst": worst_member,
        "member_decision_p99_met": None if worst_member is None else worst_member <= TARGETS["decision_p99_ms_max"],
        "cached_route_raft_decisions": latency.get("existing_raft_decisions"),
        "stability_elections": elections,
        "stability_met": None if elections is None else elections <= TARGETS["stability_elections_max"],
        "forwarding_cpu_ratio": None if ratio is None else round(ratio, 2),
        "forwarding_cpu_ratio_met": None if ratio is None else ratio < TARGETS["forwarding_cpu_ratio_max"],
        "new_group_accept_p99_ms_worst": worst_p99,
        "new_group_accept_p99_met": None if worst_p99 is None else worst_p99 < TARGETS["new_group_accept_p99_ms_max"],
        "leader_kill_worst_ms": worst_kill,
        "leader_kill_met": (None if not kills else (worst_kill is not None
                                                     and worst_kill <= TARGETS["leader_kill_to_first_accept_ms_max"])),
    }


def render_section(report: dict) -> str:
    targets = report["targets"]
    flows = {row.get("key"): row for row in report.get("flows", [])}
    leader_kill = report.get("leader_kill", {})
    forwarding_phases = [(flows.get("a", {}), 0), (flows.get("b2", {}), 0)]
    latency_phases = [(report.get("latency", {}), 0)]
    leader_phases = [(leader_kill, len(leader_kill.get("repetitions", [])))]
    lines = [
        SECTION_HEADING,
        "",
        "Generated by `bench/cluster.py` (`python3 -m bench.cluster`); rerun it to refresh this section, or "
        "`python3 -m bench.cluster --render-only` to write it again from `bench/results/cluster-last-run.json` "
        "(for example after `bench/run.py` has rewritten this file).",
        "",
        f"- Date: {report['date']}; commit `{report['commit']}`; {report['messages']:,} messages per throughput row; "
        f"run took {report['duration_s']:.0f} s.",
        f"- Machine: {report['machine'].get('cpu', '?')}, {report['machine']['cores']} cores, shared with other "
        "engineers' test runs. Every node, client and the profiler run on these 2 cores: a 3-node cluster on one "
        "2-core host measures the cost of clustering, not its capacity.",
        f"- Load: before each phase the run waited (at most {LOAD_WAIT_PHASE_MAX_S:.0f} s per phase, "
        f"{LOAD_WAIT_BUDGET_S:.0f} s in all) for the 1-minute load average to fall below {LOAD_QUIET_BELOW}; "
        + load_note(report) + " *CPU steal* is the share of the machine's CPU time the hypervisor gave to other "
        "guests during the phase (from /proc/stat): this VM's 2 virtual cores are themselves shared, and a "
        "phase with steal ran on less than 2 cores.",
    ]
    if report.get("previous"):
        lines.append(f"- Variation: {variation_note(report)}")
    lines += ["", "### Targets", "",
              "| target | measured | |", "|---|---:|---|",
              f"| forwarding CPU overhead (b2 ÷ a broker CPU per message) under {TARGETS['forwarding_cpu_ratio_max']}x "
              f"| {_n(targets['forwarding_cpu_ratio'], 2)}x | {_met(targets['forwarding_cpu_ratio_met'], *forwarding_phases)} |",
              f"| new-group send to producer acceptance p99 at half load (decision, journal, forward) under "
              f"{TARGETS['new_group_accept_p99_ms_max']:.0f} ms, worst producer node "
              f"| {_n(targets['new_group_accept_p99_ms_worst'], 1)} ms "
              f"| {_met(targets['new_group_accept_p99_met'], *latency_phases)} |",
              f"| balanced placement: every consumer's groups within ±{PLACEMENT_EVEN_PCT:.0f}% of even, row (b1) "
              f"| {_n(targets.get('placement_worst_pct'), 1)}% | {_met(targets.get('placement_met'), (flows.get('b1', {}), 0))} |",
              f"| raft route decision p99 at half load (the node's claim to its route, from each node's "
              f"`grouper_raft_decision_latency_seconds`) at most {TARGETS['decision_p99_ms_max']:.0f} ms, worst producer node "
              f"| {_n(targets.get('decision_p99_ms_worst'), 2)} ms "
              f"| {_met(targets.get('decision_p99_met'), *latency_phases)} |",
              f"| the same decisions' raft part at most {TARGETS['decision_p99_ms_max']:.0f} ms p99 (the claim reaching "
              f"the node's raft member to the route applied there, from `grouper_raft_member_decision_latency_seconds`), "
              f"worst producer node | {_n(targets.get('member_decision_p99_ms_worst'), 2)} ms "
              f"| {_met(targets.get('member_decision_p99_met'), *latency_phases)} |",
              f"| raft decisions for messages to groups that already have a route "
              f"| {_n(targets.get('cached_route_raft_decisions'))} "
              f"| {_met(None if targets.get('cached_route_raft_decisions') is None else targets['cached_route_raft_decisions'] == 0)} |",
              f"| leader kill to the next accepted new group at most {TARGETS['leader_kill_to_first_accept_ms_max']:.0f} ms, "
              f"worst of {len(report.get('leader_kill', {}).get('repetitions', [])) or '—'} "
              f"| {_n(targets['leader_kill_worst_ms'])} ms | {_met(targets['leader_kill_met'], *leader_phases)} |",
              f"| raft elections in {_n(report.get('stability', {}).get('seconds'))} s of full load through all 3 "
              f"nodes, nobody killed: {TARGETS['stability_elections_max']} "
              f"| {_n(targets.get('stability_elections'))} | {_met(targets.get('stability_met'))} |",
              ""]
    lines += (render_flows(report) + render_latency(report) + render_leader(report) + render_owner(report)
              + render_stability(report))
    lines += render_profile(report)
    lines += ["", "### Analysis", ""] + breakdown_lines(report) + ["", ANALYSIS.strip(), "", "### Method", "",
                                                                  METHOD.strip(), ""]
    return "\n".join(lines)


def breakdown_lines(report: dict) -> list[str]:
    """The forwarding overhead split by node, computed from the rows (µs of broker CPU per message)."""
    flows = {row["key"]: row for row in report.get("flows", []) if "failed" not in row and row.get("unique")}
    if not {"a", "b1", "b2"} <= set(flows):
        return ["- (the throughput rows did not all run: no breakdown)"]
    a, b1, b2 = flows["a"], flows["b1"], flows["b2"]
    local_node, receiver, owners = b1["node_cpu_us_per_msg"][0], b2["node_cpu_us_per_msg"][0], sum(
        b2["node_cpu_us_per_msg"][1:])
    lines = [f"- Computed from the rows: (b2) costs {b2['broker_cpu_us_per_msg']:,.0f} µs/msg against "
             f"{a['broker_cpu_us_per_msg']:,.0f} for (a), {b2['broker_cpu_us_per_msg'] - a['broker_cpu_us_per_msg']:,.0f} "
             f"more. Node 1, which in (b2) only receives, stores in its outbound store and forwards, spends "
             f"{receiver:,.0f} µs/msg, {receiver / local_node:.0%} of what it spends in (b1) receiving and delivering "
             f"everything itself ({local_node:,.0f}); the two owners together spend {owners:,.0f} µs/msg "
             f"({owners / local_node:.0%} of it)."]
    idle = report.get("idle_cpu_pct_cluster")
    if idle and b2["throughput_per_s"]:
        fixed = (sum(idle) - report.get("idle_cpu_pct_single", 0)) / 100 / b2["throughput_per_s"] * 1e6
        lines.append(f"- The fixed cost of two more idle nodes (raft heartbeats, timers) is {fixed:,.0f} µs/msg at "
                     f"(b2)'s {b2['throughput_per_s']:,.0f} msgs/s; the rest is per message.")
    profile = report.get("profile", {})
    parts = []
    for role, label in (("forwarder", "node 1"), ("owner", "the owner")):
        categories = profile.get(role, {}).get("categories_pct", {})
        if categories:
            peer = sum(pct for name, pct in categories.items() if name.startswith(("peer forwarding", "cluster routing")))
            proton = sum(pct for name, pct in categories.items() if name.startswith(("proton", "AMQP adapter")))
            parts.append(f"on {label}, {peer:.0f}% of busy samples are in forwarding and routing code (gRPC, "
                         f"protobuf, node/peer, node/cluster.py) and {proton:.0f}% in proton and the AMQP adapter")
    if parts:
        lines.append("- From the profile: " + "; ".join(parts) + ".")
    return lines


def load_note(report: dict) -> str:
    phases = [(name, row) for name, row in phase_rows(report)]
    noisy = [f"{name} ({row['load_start']:.2f})" for name, row in phases if not row.get("load_quiet", True)]
    if not noisy:
        return "every phase started quiet."
    return ("these phases never got quiet and were measured anyway (load at start): " + ", ".join(noisy)
            + ". Per-phase loads are in the tables.")


def phase_rows(report: dict):
    for row in report.get("flows", []):
        yield row.get("key", "?"), row
    for key in ("latency", "leader_kill", "owner_kill", "stability"):
        if key in report:
            yield key, report[key]


def variation_note(report: dict) -> str:
    previous = report["previous"]
    parts = [f"against the previous run ({previous['date']}, commit `{previous['commit']}`):"]
    now = {row["key"]: row for row in report.get("flows", []) if row.get("unique")}
    for key, before in previous.get("flows", {}).items():
        if key in now and before.get("throughput_per_s"):
            parts.append(f"{key} {before['throughput_per_s']:,.0f} → {now[key]['throughput_per_s']:,.0f} msgs/s and "
                         f"{before['broker_cpu_us_per_msg']:,.0f} → {now[key]['broker_cpu_us_per_msg']:,.0f} µs/msg;")
    targets = report["targets"]
    before_targets = previous.get("targets", {})
    parts.append(f"forwarding ratio {_n(before_targets.get('forwarding_cpu_ratio'), 2)}x → "
                 f"{_n(targets['forwarding_cpu_ratio'], 2)}x; new-group p99 "
                 f"{_n(before_targets.get('new_group_accept_p99_ms_worst'), 1)} → "
                 f"{_n(targets['new_group_accept_p99_ms_worst'], 1)} ms; leader kill worst "
                 f"{_n(before_targets.get('leader_kill_worst_ms'))} → {_n(targets['leader_kill_worst_ms'])} ms.")
    return " ".join(parts)


def routes_by_node(cluster: Cluster) -> list:
    """Routes each node owns, in node order (every queue's: the rows' queues differ only by name)."""
    status = cluster.status() or {}
    owned = {member.get("node"): member.get("routes") for member in status.get("members", [])}
    return [owned.get(node_id) for node_id in cluster.node_ids]


def render_flows(report: dict) -> list[str]:
    lines = ["### 1. Throughput and broker CPU per message", "",
             f"{GROUPS:,} groups, prefetch {PREFETCH}, durable queue and messages, 1 producer (the `bench/run.py` "
             "client), consumers accept at once. Broker CPU = utime+stime of every node process and its raft "
             "member process ÷ messages; the "
             "per-node column shows where it went (node 1 receives from the producer).", "",
             "| row | msgs/s | broker CPU µs/msg | per node µs/msg (1 / 2 / 3) | ×(a) CPU | p50 ms | p99 ms "
             "| client CPU µs/msg | groups split | lost / dup | load start → end | CPU steal % | raft elections |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    flows = report.get("flows", [])
    base = next((row for row in flows if row.get("key") == "a" and row.get("unique")), None)
    for row in flows:
        label = f"({row.get('key')}) {row.get('label', '')}"
        if "failed" in row or not row.get("unique"):
            reason = row.get("failed") or "; ".join(row.get("errors", []))
            lines.append(f"| {label} | FAILED: {reason.replace('|', '/')[:200]} | | | | | | | | | | | |")
            continue
        ratio = row["broker_cpu_us_per_msg"] / base["broker_cpu_us_per_msg"] if base else None
        per_node = " / ".join(_n(value) for value in row["node_cpu_us_per_msg"])
        notes = f" ({'; '.join(row['errors'])[:120]})" if row["errors"] else ""
        if row.get("routes_by_node"):  # cumulative over the rows run so far: placement's spread
            notes += f" [routes per node so far: {' / '.join(str(count) for count in row['routes_by_node'])}]"
        lines.append(f"| {label}{notes} | {_n(row['throughput_per_s'])} | {_n(row['broker_cpu_us_per_msg'])} "
                     f"| {per_node} | {_n(ratio, 2)} | {_n(row['latency_p50_ms'], 1)} | {_n(row['latency_p99_ms'], 1)} "
                     f"| {_n(row['client_cpu_us_per_msg'])} | {row['groups_split']} / {row['groups_seen']} "
                     f"| {row['lost']} / {row['duplicates']} | {row['load_start']:.2f} → {row['load_end']:.2f} "
                     f"| {_n(row.get('steal_pct'), 1)} | {row.get('elections', '—')} |")
    lines += ["", "p50/p99 here are saturation latencies (the producer runs flat out, see the main table's "
              "method); idle latencies are in section 2."]
    lines += render_placement(flows)
    ceiling = next((row for row in flows if row.get("key") == "c" and row.get("unique")), None)
    if ceiling is not None:
        lines += ["", f"**Decision ceiling** (row c): {ceiling['decisions_per_s']:,} new-group route decisions per "
                  f"second through one raft group ({ceiling['distinct_groups']:,} distinct groups among "
                  f"{ceiling['messages']:,} messages at {_n(ceiling['throughput_per_s'])} msgs/s). Each engine "
                  "batch proposes the new groups it met as one raft entry, so decisions per entry grow with the "
                  "load."]
        lines += ["", "Above the decision ceiling (row c): what one raft group does, and routes sharded over several "
                  "raft groups, backed by the simulation: [docs/cluster-ceiling.md](cluster-ceiling.md)."]
    if "idle_cpu_pct_cluster" in report:
        idle = " / ".join(f"{pct:.1f}" for pct in report["idle_cpu_pct_cluster"])
        lines += ["", f"With no clients at all a cluster node uses {idle} % of a core (nodes 1 / 2 / 3: raft "
                  f"heartbeats, timers); the single node {report.get('idle_cpu_pct_single', 0):.1f} %. At the rows' "
                  "rates that fixed cost is part of each row's CPU per message."]
    lines.append("")
    return lines


def elections_note(result: dict, caused: int = 0) -> str:
    note = f"; CPU steal {result['steal_pct']:.1f}%" if "steal_pct" in result else ""
    if "elections" not in result:
        return note
    note += f"; raft leader elections in the node logs during the phase (its load wait included): {result['elections']}"
    if caused:
        note += f", {caused} of them expected (one per leader kill)"
    if result["elections"] > caused:
        note += " — **the leader changed without being killed: the numbers of this phase include that churn**"
    return note


def failed_line(result: dict) -> str:
    return f"FAILED: {str(result.get('failed', 'not run'))[:300]}\n"


def render_latency(report: dict) -> list[str]:
    latency = report.get("latency", {})
    lines = ["### 2. Route-decision and forwarding latency (half load)", ""]
    if "failed" in latency or not latency:
        return lines + [failed_line(latency)]
    lines += [f"Under a background load through all 3 nodes (one lean producer per node on its own queue, "
              f"{BACKGROUND_GROUPS:,} groups, durable, one consumer per node) asked for "
              f"{latency.get('half_load_per_s', 0):,} msgs/s (half of row b1's throughput) and measured at "
              f"{latency.get('background_per_s', 0):,} msgs/s during the probes. "
              f"One probe message every {PROBE_INTERVAL_S * 1000:.0f} ms. Consumers on nodes "
              f"{' and '.join(map(str, latency['consumer_nodes']))}; the raft leader is node {latency['leader_node']}. "
              f"Each producer node sends {PROBE_NEW_GROUPS} messages, each the first of a brand-new group: *accept* "
              "is send → producer acceptance (route decided in the raft log, message journalled here or in the "
              "outbound store), *receive* is send → consumer receipt, *decision* is the raft decision alone as "
              "the nodes time it (claim proposed → route known on the engine loop; p50 and p99 interpolated "
              f"within 0.5 ms buckets, the share within {DECISION_TARGET_MS:.0f} ms exact); *raft part* is the "
              "part of it the node's raft member times (claim received → route applied there: the raft round "
              "trip, without the node's engine loop on either side); *CPU wait* is how long the threads of each "
              "node process waited, runnable, for a core, per second of the probes (from /proc schedstat). Load "
              f"{latency['load_start']:.2f} → {latency['load_end']:.2f}{elections_note(latency)}.", "",
              "| producer node | role | placed on the producer's node | decision p50 ms | decision p99 ms "
              f"| decisions within {DECISION_TARGET_MS:.0f} ms | raft part p50 ms | raft part p99 ms "
              "| CPU wait ms/s, node 1 / 2 / 3 | accept p50 ms | accept p99 ms | accept max ms "
              "| receive p50 ms | receive p99 ms | not accepted |",
              "|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|"]
    for row in latency["new_groups"]:
        role = ("leader" if row["is_leader"] else "follower") + (", has consumers" if row["has_consumers"] else
                                                                  ", no consumers")
        decision = row.get("decision", {})
        member = decision.get("member", {})
        lines.append(f"| {row['producer_node']} | {role} | {row['placed_on_producer_node']} / {row['sent']} "
                     f"| {_n(decision.get('p50_ms'), 2)} | {_n(decision.get('p99_ms'), 2)} "
                     f"| {_n(decision.get('within_target_pct'), 1)}% of {decision.get('count', '—')} "
                     f"| {_n(member.get('p50_ms'), 2)} | {_n(member.get('p99_ms'), 2)} "
                     f"| {' / '.join(map(str, row.get('cpu_wait_ms_per_s') or ['—']))} "
                     f"| {_n(row['accept']['p50_ms'], 2)} | {_n(row['accept']['p99_ms'], 2)} "
                     f"| {_n(row['accept']['max_ms'], 2)} | {_n(row['receive']['p50_ms'], 2)} "
                     f"| {_n(row['receive']['p99_ms'], 2)} | {row['not_accepted']} |")
    existing = latency["existing"]
    lines += ["", f"Then node {existing['producer_node']} (a follower with consumers) sends "
              f"{PROBE_EXISTING_MESSAGES} messages to groups that already have a route: *local* ones are owned by "
              "its node, *forwarded* ones by another node (stored in the outbound store, forwarded over gRPC, "
              "stored again at the owner).", "",
              "| groups | messages | accept p50 ms | accept p99 ms | receive p50 ms | receive p99 ms | receive max ms |",
              "|---|---:|---:|---:|---:|---:|---:|"]
    for kind in ("local", "forwarded"):
        accept, receive = existing[f"{kind}_accept"], existing[f"{kind}_receive"]
        lines.append(f"| {kind} | {receive['count']} | {_n(accept['p50_ms'], 2)} | {_n(accept['p99_ms'], 2)} "
                     f"| {_n(receive['p50_ms'], 2)} | {_n(receive['p99_ms'], 2)} | {_n(receive['max_ms'], 2)} |")
    if existing["missing"]:
        lines.append(f"\n{existing['missing']} probe messages were not accepted or not received.")
    if latency.get("existing_raft_decisions") is not None:
        lines.append(f"\nRaft decisions the three nodes timed while those {PROBE_EXISTING_MESSAGES} messages to "
                     f"routed groups were sent: {latency['existing_raft_decisions']} (a cached route costs no raft "
                     "round trip).")
    return lines + [""]


PLACEMENT_EVEN_PCT = 20.0  # issue "A cluster people can run": groups per consumer within this of even


def placement_spread(row: dict) -> dict:
    """Groups per consumer by node (consumers numbered node by node, as measure_flow starts them) and
    the largest distance of any consumer from the even share, in percent."""
    counts = row.get("groups_per_consumer") or []
    by_node, first = [], 0
    for node in sorted(row.get("consumers_by_node", {}), key=int):
        count = row["consumers_by_node"][node]
        by_node.append(counts[first:first + count])
        first += count
    even = sum(counts) / len(counts) if counts else 0
    worst = max((abs(count - even) / even * 100 for count in counts), default=None) if even else None
    return {"by_node": by_node, "even": even, "worst_pct": worst}


def render_placement(flows: list) -> list[str]:
    rows = {row.get("key"): row for row in flows if row.get("unique") and row.get("groups_per_consumer")}
    if "b1" not in rows:
        return []
    lines = ["", "**Placement** (producer on node 1, consumers 4 / 2 / 2 on nodes 1 / 2 / 3): where the "
             f"{GROUPS:,} groups went, each counted at the consumer that received its first message; even is "
             f"{GROUPS / sum(rows['b1']['consumers_by_node'].values()):.0f} per consumer (target: every consumer "
             f"within ±{PLACEMENT_EVEN_PCT:.0f}%).", "",
             "| placement | groups per consumer, node 1 / node 2 / node 3 | worst consumer vs even | "
             "node CPU share 1 / 2 / 3 | msgs/s |", "|---|---|---:|---|---:|"]
    for key, name in (("b1", "balanced (default)"), ("b1-local", "local")):
        row = rows.get(key)
        if row is None:
            continue
        spread = placement_spread(row)
        cpu = row["node_cpu_us_per_msg"]
        share = " / ".join(f"{value / sum(cpu) * 100:.0f}%" for value in cpu) if sum(cpu) else "—"
        groups = " / ".join(" ".join(str(count) for count in node) for node in spread["by_node"])
        lines.append(f"| {name} | {groups} | {_n(spread['worst_pct'], 0)}% | {share} "
                     f"| {_n(row['throughput_per_s'])} |")
    return lines


def render_stability(report: dict) -> list[str]:
    stability = report.get("stability")
    if stability is None:
        return []
    lines = ["### 5. Leadership under full load", ""]
    if "failed" in stability:
        return lines + [failed_line(stability)]
    if stability.get("run"):  # measured by another run (`--phases stability`) and added to this report
        lines += [f"Measured in a run of its own ({stability['run']}).", ""]
    return lines + [
        f"One lean producer per node, as fast as credit allows, {BACKGROUND_GROUPS:,} groups, durable, one consumer "
        f"per node, for {stability['seconds']} s with nobody killed: {stability['received']:,} messages received "
        f"({stability['throughput_per_s']:,} msgs/s), node CPU {stability['node_cpu_pct']} % of a core (node and "
        f"raft member). Raft terms before → after: {stability['terms_before']} → {stability['terms_after']}"
        f"{elections_note(stability)}. Election timeout 200-500 ms. "
        f"Load {stability['load_start']:.2f} → {stability['load_end']:.2f}.", ""]


def render_leader(report: dict) -> list[str]:
    leader = report.get("leader_kill", {})
    lines = ["### 3. Leader kill", ""]
    if "failed" in leader or not leader:
        return lines + [failed_line(leader)]
    lines += [f"A producer on a surviving node sends a brand-new group every {LEADER_PROBE_INTERVAL_S * 1000:.0f} ms "
              "(so every message needs a route decision); consumers on all 3 nodes. After "
              f"{STEADY_BEFORE_KILL_S:.0f} s the raft leader is killed with SIGKILL. *Kill → first accept* is the time "
              "from the kill to the producer's first acceptance of a message sent after the kill; *kill → new leader* "
              "is read from the new leader's log line (wall clock, ms). The killed node is "
              "then restarted and the next repetition waits until it is a connected member again. Load "
              f"{leader['load_start']:.2f} → {leader['load_end']:.2f}"
              f"{elections_note(leader, len(leader['repetitions']))}.", "",
              "| # | killed (leader) | producer | new leader | kill → new leader ms | kill → first accept ms "
              "| last accept before → first after ms | longest send → accept ms | sent / not accepted "
              "| restart → ready s | restart → member s |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for number, row in enumerate(leader["repetitions"], 1):
        lines.append(f"| {number} | {row['killed_node']} | {row['producer_node']} | {row['new_leader_node'] or '—'} "
                     f"| {_n(row.get('kill_to_new_leader_ms'))} "
                     f"| {_n(row['kill_to_first_accept_ms'])} | {_n(row['gap_between_accepts_ms'])} "
                     f"| {_n(row['longest_send_to_accept_ms'])} | {row['sent']} / {row['not_accepted']} "
                     f"| {_n(row['restart_to_ready_s'], 2)} | {_n(row['restart_to_member_s'], 2)} |")
    return lines + [""]


def render_owner(report: dict) -> list[str]:
    owner = report.get("owner_kill", {})
    lines = ["### 4. Owner kill", ""]
    if "failed" in owner or not owner:
        return lines + [failed_line(owner)]
    lines += [f"{OWNER_GROUPS} busy groups live on a follower with the only consumer; a producer on another node "
              f"sends to them (~{1 / OWNER_PROBE_INTERVAL_S:.0f} msgs/s, all forwarded). After 2 s the owner is "
              "killed with SIGKILL and restarted at once (same data dir and ports); its consumer redials every "
              f"{RECONNECT_INTERVAL_S * 1000:.0f} ms. *First delivery* is the consumer's first receipt after the "
              "kill; *first outage message* is the first receipt of a message sent after the kill (held in the "
              "producer node's outbound store, forwarded when the owner is back). Load "
              f"{owner['load_start']:.2f} → {owner['load_end']:.2f}{elections_note(owner)}.", "",
              "| # | owner | producer | restart → ready ms | restart → consumer attached ms | restart → first delivery ms "
              "| kill → first delivery ms | restart → first outage message ms | ready → first outage message ms "
              "| kill → first outage message ms | sent during outage | lost | redelivered |",
              "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for number, row in enumerate(owner["repetitions"], 1):
        lines.append(f"| {number} | {row['owner_node']} | {row['producer_node']} | {_n(row['restart_to_ready_s'] * 1000)} "
                     f"| {_n(row['restart_to_consumer_attached_ms'])} | {_n(row['restart_to_first_delivery_ms'])} "
                     f"| {_n(row['kill_to_first_delivery_ms'])} | {_n(row['restart_to_first_outage_message_ms'])} "
                     f"| {_n(row.get('ready_to_first_outage_message_ms'))} "
                     f"| {_n(row['kill_to_first_outage_message_ms'])} | {row['sent_during_outage']} | {row['lost']} "
                     f"| {row['redelivered']} |")
    return lines + [""]


def render_profile(report: dict) -> list[str]:
    profile = report.get("profile", {})
    lines = ["### Where the CPU goes in (b2)", ""]
    if "failed" in profile or not profile:
        return lines + [f"Not profiled: {profile.get('failed', 'not run')}", ""]
    lines += [f"py-spy (`record -f raw --nonblocking --threads`, {PROFILE_DURATION_S} s at 100 Hz) on node 1 (receives "
              "every message and forwards it) and node 2 (an owner) during an extra, unmeasured (b2) flow "
              f"({profile['flow_throughput_per_s']:,} msgs/s under the profiler). Share of samples, each sample "
              "charged to the innermost frame in one of these parts of the code:", "",
              "| part | forwarding node % | owner % |", "|---|---:|---:|"]
    forwarder, owner = profile.get("forwarder", {}), profile.get("owner", {})
    names = list(dict.fromkeys([*forwarder.get("categories_pct", {}), *owner.get("categories_pct", {})]))
    for name in names:
        lines.append(f"| {name} | {_n(forwarder.get('categories_pct', {}).get(name), 1)} "
                     f"| {_n(owner.get('categories_pct', {}).get(name), 1)} |")
    lines += ["", "| thread | forwarding node % | owner % |", "|---|---:|---:|"]
    threads = list(dict.fromkeys([*forwarder.get("threads_pct", {}), *owner.get("threads_pct", {})]))[:8]
    for name in threads:
        lines.append(f"| {name} | {_n(forwarder.get('threads_pct', {}).get(name), 1)} "
                     f"| {_n(owner.get('threads_pct', {}).get(name), 1)} |")
    for role, summary in (("forwarding node", forwarder), ("owner", owner)):
        top = "; ".join(f"`{leaf}` {pct}%" for leaf, pct in list(summary.get("top_leaves_pct", {}).items())[:6])
        lines.append(f"\nTop leaf frames, {role}: {top}")
    return lines + [""]


ANALYSIS = """
Written from the run above (2026-11-24 07:33 UTC), a separate 10-minute full-load run at 07:01 and
per-group traces across the processes (node, raft member, leader); the bullets above are recomputed
on every run, these paragraphs are not.

- **The decision target is met by raft and missed by the busy node around it.** Idle, a node's
  claim reaches its route on the engine loop in 2.0 ms p50, 3.6 ms p99 (traced, 600 new groups).
  Under half load the nodes now time the decision in two parts (a latency phase run alone at
  12:54 UTC on 570bdf7, 9,000 msgs/s asked, load 0.9 → 5): the raft part, timed by each node's
  raft member from the claim's arrival to the route applied there, was 0.75-1.73 ms p50 and
  1.0-2.0 ms p99 on every producer node; the whole decision, from the engine loop's proposal to
  the route known on it, 1.8-3.2 ms p50 and 25-42 ms p99. The rest is the node's engine loop
  waiting for a core: over the probes each node process's threads spent 0.9-1.3 s per second
  runnable without running (/proc schedstat). Earlier traces removed the waits that were not the
  CPU's: the members run at real-time priority (at nice -10 their part was 21 ms p99), and the
  channel is read on the engine loop itself, not by a thread that waited for the loop's GIL.
  This layout on one 2-core VM (3 nodes, 3 members, 6 client processes) keeps both cores busy
  long before half of its throughput, because at moderate rates each message arrives in a
  wake-up of its own: the cluster spent ~470 µs of node CPU per message at 3,000 msgs/s against
  85-105 µs at full rate. Meeting 5 ms p99 end to end here needs that per-wake-up cost down (the
  line of issue "Ten times cheaper per message"), or nodes on cores of their own.
- **A cached route costs no raft round trip:** 0 decisions while 300 messages went to routed groups.
- **Leader kill -9 to the next accepted new group: 430, 88, 110, 62 and 57 ms.** A follower elects
  40-140 ms after its leader's connection closes. The one earlier kill over 0.5 s (620 ms) was a
  split round: a vote request from the other follower, whose log was behind, made pysyncobj forget
  the leader before the close reached this follower, so it waited out a whole election timeout. It
  now remembers the leader it followed. The 430 ms kill waited for a second round of the same kind
  of race (the new leader at 417 ms), within the target.
- **No leader change under full load.** 600 s of full load through all 3 nodes (4,841,844 messages,
  8,070 msgs/s, node CPU 31-32% of a core each) with other engineers' test runs on the same 2 cores
  (load average 2.3 at the start, 13.5 at the end): 0 elections, raft term 1 before and after on
  every node. Before the members ran in processes of their own the term went from 1 to 3 in 180 s
  of lighter load.
- **Placement spreads, and on one machine spreading costs.** Balanced placement put 131 groups on
  each consumer of node 1 and 119 on each of nodes 2 and 3 (4.8% from even); local placement put
  246-254 on each of node 1's and none elsewhere. On this one 2-core VM local is faster (21,506
  against 15,364 msgs/s): half of the balanced row's messages are forwarded, and the forward costs
  CPU on both nodes that three machines would have, one does not. Node 1's share of the cluster's
  CPU is 62% balanced against 98% local: on separate machines balanced is what lets nodes 2 and 3
  take their part.
- **Forwarding costs a second node's AMQP work.** (b2) costs 84 µs per message against 38 for one
  node: 39 on the receiving node and 22 on each owner. On both sides two thirds of the busy samples
  are the AMQP adapter (proton's engine and our loop), 5-6% gRPC and protobuf.
- **The decision ceiling** of one raft group is 6,784 new-group decisions per second (row c), with
  each engine batch's new groups proposed as one raft entry; docs/cluster-ceiling.md has the design
  beyond it (a handler sharded by group hash), backed by the sharded simulation.
- **Owner kill** is the restart (about 1 s to ready) plus the consumer's reconnect: 1.5 s from the
  kill to the first delivery, nothing lost.
"""

METHOD = """
- **Nodes.** `grouper node --raft-port P --peers a,b,c --amqp-port 0 --admin-port 0` with a fresh data dir
  per node in a temporary directory, every queue declared in one TOML file (`group_policy = "exclusive"`,
  `durable = true`), default settings otherwise (journal fsync on, election timeout 200-500 ms). The
  baseline (a) is a single node without `--peers`. A restart reuses the node's data dir and ports.
- **Throughput rows** use `bench/clients.py` unchanged: one producer process sending whenever it has
  credit, durable, 1,000 groups chosen at random (seeded); one consumer process per consuming node, one
  connection per consumer, prefetch 100 with one credit back per accept. Every row has 4 consumers that
  receive messages (broker CPU per message grows with the number of consumer connections a flow is
  spread over, so rows with different counts would not compare): (a) 4 on the node; (b1) 4 on node 1
  plus 2 idle ones on each other node; (b2) 2 on node 2 and 2 on node 3. Every row starts only once the route
  table knows each node's consumer count (so placement is what the policy says), after an unreported
  2,000-message warm-up per system. Broker CPU is read from `/proc/PID/stat` (utime+stime) of each node
  just before the producer starts and just after the last message is received.
- **Placement.** Balanced (the default): a new group goes to the node whose consumers on the queue
  hold the fewest groups per consumer, cluster-wide; the receiving node wins only a tie. So in (b1)
  about half the groups go to nodes 2 and 3 and their messages are forwarded; in (b2) node 1 has no
  consumers and every message is forwarded. The placement rows repeat (b1) on a second cluster whose
  nodes run `--placement local` (a new group stays on the receiving node while it has a consumer).
- **Raft members.** Each node's raft member is a child process (`handler/member.py`) at real-time
  round-robin priority (the benchmark runs as root); its CPU is counted in its node's column.
- **Half load** (section 2): a lean producer per node sending at a fixed rate to its own queue (half
  of row b1's throughput in all), 1,000 groups, and a lean consumer per node; the probes run on
  another queue meanwhile. Decisions are read from each node's
  `grouper_raft_decision_latency_seconds` histogram before and after each producer node's probes.
- **Leadership under full load** (section 5): the same three producers and consumers as fast as
  credit allows, for `--stability-s` seconds; elections are counted from the node logs, terms from
  `cluster status`.
- **Probe clients** (sections 2-4) are proton clients in this script: a producer that sends one
  durable message every interval from a timer and records send and settle times and outcomes per
  message; consumers that accept at once and redial a dropped node every 50 ms. All times are
  CLOCK_MONOTONIC, which every process on the machine shares.
- **Leader** is found with `python -m node.cli cluster status --json --node ADMIN`; "member again" is
  a status, from the restarted node and from a survivor, with a leader, a quorum and every member
  connected.
- **Load** is the 1-minute load average (`/proc/loadavg`) at the start and end of each phase; it counts
  runnable and I/O-waiting tasks of every user of the machine. **CPU steal** is the phase's share of
  `steal` in `/proc/stat`. **Raft elections** counts "this node is now the raft leader" lines in the
  node logs from the start of the phase's load wait to its end.
"""


# ---- the file ---------------------------------------------------------------------------------

def previous_summary(path: Path) -> dict | None:
    try:
        earlier = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return {"date": earlier.get("date"), "commit": earlier.get("commit"), "targets": earlier.get("targets", {}),
            "flows": {row["key"]: {"throughput_per_s": row.get("throughput_per_s"),
                                   "broker_cpu_us_per_msg": row.get("broker_cpu_us_per_msg")}
                      for row in earlier.get("flows", []) if row.get("unique")}}


def machine_facts() -> dict:
    facts = {"cores": str(len(os.sched_getaffinity(0)))}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            facts["cpu"] = line.split(":", 1)[1].strip()
            break
    return facts


def strip_bulky(result: dict) -> dict:
    return {key: value for key, value in result.items() if key != "per_consumer" or len(value) <= 12}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per throughput row (default 20000)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="raw results")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="markdown file whose cluster section is written")
    parser.add_argument("--repeats", type=int, default=KILL_REPEATS, help="leader and owner kills (default 5)")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated subset of {','.join(PHASES)} (default: all)")
    parser.add_argument("--load-wait-budget-s", type=float, default=LOAD_WAIT_BUDGET_S,
                        help=f"all waits for a quiet machine together (default {LOAD_WAIT_BUDGET_S:.0f}; 0: never wait)")
    parser.add_argument("--stability-s", type=float, default=STABILITY_S,
                        help=f"length of the full-load run that counts raft elections (default {STABILITY_S:.0f})")
    parser.add_argument("--work-dir", type=Path, help="node data and logs (default: a new temporary directory)")
    parser.add_argument("--render-only", action="store_true", help="run nothing: write the section from --json")
    args = parser.parse_args(argv)
    if args.render_only:
        write_section(args.out, SECTION_HEADING, render_section(json.loads(args.json.read_text())))
        print(f"wrote the cluster section of {args.out} from {args.json}")
        return 0

    phases = {name.strip() for name in args.phases.split(",") if name.strip()}
    if phases - set(PHASES):
        parser.error(f"unknown phase(s): {', '.join(sorted(phases - set(PHASES)))}")
    global PROGRESS
    with Progress(len(phases), "cluster bench", "phase") as PROGRESS:
        try:
            return run_phases(args, phases)
        finally:
            PROGRESS = None


def run_phases(args, phases: set[str]) -> int:
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="grouper-cluster-bench-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    config_path = work_dir / "queues.toml"
    write_config(config_path)
    log(f"work dir {work_dir}; {args.messages} messages per throughput row; load {load_1m():.2f}")
    started = time.monotonic()
    gate = LoadGate(args.load_wait_budget_s)
    report: dict = {"date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"), "commit": commit(),
                    "machine": machine_facts(), "messages": args.messages, "work_dir": str(work_dir)}
    report["flows"] = [run_single(work_dir, config_path, args.messages, gate, report)] if "single" in phases else []
    phase_done(phases, "single")
    cluster = Cluster(work_dir, config_path)
    try:
        cluster.start()
        log(f"[cluster] ready; leader node {cluster.leader() + 1}")
        report["idle_cpu_pct_cluster"] = idle_cpu_pct(cluster.nodes)
        log(f"[cluster] idle CPU per node: {report['idle_cpu_pct_cluster']} % of a core")
        if "flows" in phases:
            report["flows"] += run_flows(cluster, work_dir, args.messages, gate)
            phase_done(phases, "flows")
        if "latency" in phases:
            b1 = next((row for row in report["flows"] if row.get("key") == "b1" and row.get("throughput_per_s")), None)
            half_load = round(b1["throughput_per_s"] / 2) if b1 else HALF_LOAD_DEFAULT_PER_S
            report["latency"] = phase(gate, "latency", lambda: run_latency(cluster, work_dir, half_load), cluster)
            log(f"[latency] {json.dumps(report['latency'])}")
            phase_done(phases, "latency")
        if "leader" in phases:
            report["leader_kill"] = phase(gate, "leader kill",
                                          lambda: run_leader_kills(cluster, work_dir, args.repeats), cluster)
            phase_done(phases, "leader")
        if "owner" in phases:
            report["owner_kill"] = phase(gate, "owner kill", lambda: run_owner_kills(cluster, work_dir, args.repeats),
                                         cluster)
            phase_done(phases, "owner")
        if "stability" in phases:
            report["stability"] = phase(gate, "stability", lambda: run_stability(cluster, work_dir, args.stability_s),
                                        cluster)
            log(f"[stability] {json.dumps(report['stability'])}")
            phase_done(phases, "stability")
        if "profile" in phases:
            try:
                report["profile"] = run_profile(cluster, work_dir, args.messages)
            except Exception as error:
                report["profile"] = {"failed": f"{type(error).__name__}: {error}"}
            log(f"[profile] {json.dumps(report['profile'])[:2000]}")
            phase_done(phases, "profile")
    finally:
        cluster.stop()
    if "placement" in phases:
        report["flows"].append(run_local_placement(work_dir, config_path, args.messages, gate))
        phase_done(phases, "placement")
    report["flows"] = [strip_bulky(row) for row in report["flows"]]
    report["duration_s"] = round(time.monotonic() - started, 1)
    report["targets"] = target_results(report)
    report["previous"] = previous_summary(args.json)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1, default=str) + "\n")
    write_section(args.out, SECTION_HEADING, render_section(report))
    log(f"done in {report['duration_s']:.0f} s; targets {report['targets']}; wrote {args.out} and {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
