"""Soak: one node under clients that come and go for a long time; its memory and engine objects must stay flat.

    python3 -m bench.soak [--duration-s 1800] [--work-dir DIR] [--seed 1] [--no-report | --render-only]

The node frees proton's C objects itself (links, sessions, transports, connections), so a leak is
ours to find. For `duration_s` one node (a `grouper node` process) serves:
- a steady grouped load (tests/drills/load.py: producers and settle-second consumers, checked logs);
- episodes, each a client subprocess of this file, started one after another per role:
  `killed`    a producer and a consumer on one connection, ended with kill -9 at a seeded moment;
  `detach`    links ended with a detach that does not close them (closed=false), attached again;
  `large`     1 MB bodies over a connection whose max-frame-size is 16 KiB (multi-frame transfers);
  `heartbeat` a connection with an idle timeout that stays idle longer than it, and must survive.
SAMPLE_COUNT times over the run it samples the node's resident set size (/proc/PID/status) and the
engine object counts (/metrics). At the end it stops every client, waits for the engine objects to
return to the idle baseline (zero), and judges the logs with tests/drills/checker.py (nothing
accepted lost, group order kept, exclusive holds).

Rules:
- Episodes pre-log what a kill -9 could leave unknown: a send as "timeout" before it leaves (the
  node's acceptance, logged later, wins), a delivery as an unconfirmed acceptance before the accept
  leaves. So a killed client's logs never claim more than the node may have done.
- Each episode logs to files of its own (episodes/NAME.sends.jsonl, .deliveries.jsonl). A kill -9 can
  tear a line in the middle of a write that crosses a page of the file, and only a file's last line
  may be torn: the next episode's lines would follow it if they shared a file.
- The run's checks are counts and ceilings with generous slack, never times: RSS growth over the
  second half below RSS_GROWTH_MAX_BYTES, engine objects back to zero, every episode that was not
  killed exiting 0, the node alive and its log free of tracebacks, the checker's verdict ok.
- `run_soak(...)` returns a `SoakResult`; `write_report` replaces the "## Soak" section of
  docs/benchmarks.md (the rest of the file is kept). tests/drills/test_soak.py runs a short soak.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
QUEUE = "soak"  # the steady load and the killed and detach episodes
LARGE_QUEUE = "soak-large"
IDLE_QUEUE = "soak-idle"
GROUPS = [f"g{index}" for index in range(16)]
SAMPLE_COUNT = 60  # samples over a run (at least one every SAMPLE_INTERVAL_MIN_S)
SAMPLE_INTERVAL_MIN_S = 1.0
RSS_GROWTH_MAX_BYTES = 48 << 20  # max RSS of the second half over max RSS of the first half
BASELINE_WAIT_S = 30.0  # bound of the wait for the engine objects to return to zero after clients leave
EPISODE_TIMEOUT_S = 60.0  # an episode that has not ended by then failed (it is killed)
KILL_AFTER_MIN_S, KILL_AFTER_MAX_S = 0.5, 3.0  # when a `killed` episode dies, seeded
LARGE_BODY_BYTES = 1 << 20
LARGE_MESSAGES = 3  # per `large` episode
SMALL_FRAME_BYTES = 16 << 10  # max-frame-size of the `large` episode's connection
IDLE_TIMEOUT_S = 1.0  # the `heartbeat` episode's idle timeout ...
IDLE_FOR_S = 3.0  # ... and how long it stays idle: longer, so only the node's heartbeats keep it open
STEADY_PRODUCERS, STEADY_CONSUMERS = 2, 3
STEADY_IN_FLIGHT_MAX = 2  # a few hundred to a thousand messages/s, so the logs stay small
# the consumers' prefetch: they must outpace the producers, or a backlog builds up (a 30 min run with
# 2 consumers of credit 10 ended 150k messages behind), and RSS measures the backlog, not leaks
STEADY_CONSUMER_CREDIT = 100
ROLES = ("killed", "detach", "large", "heartbeat")


def now_ms() -> int:
    return time.time_ns() // 1_000_000


# ---- the episodes: client subprocesses -----------------------------------------------------------

def _episode_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m bench.soak episode")
    parser.add_argument("role", choices=ROLES)
    parser.add_argument("--url", required=True)
    parser.add_argument("--name", required=True)
    parser.add_argument("--send-log", required=True)
    parser.add_argument("--delivery-log", required=True)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    from proton.reactor import Container

    handler = _EPISODES[args.role](args)
    Container(handler).run()
    if handler.failure:
        print(f"{args.role} {args.name}: {handler.failure}", file=sys.stderr)
        return 1
    return 0


def _episode_classes():
    """The episode handlers, built on first use so the orchestrator never imports proton's reactor."""
    from proton import Delivery, Message
    from proton.handlers import MessagingHandler

    outcomes = {Delivery.ACCEPTED: "accepted", Delivery.REJECTED: "rejected", Delivery.RELEASED: "released",
                Delivery.MODIFIED: "modified"}

    class Episode(MessagingHandler):
        """Logs in the checker's format; a send and a delivery are logged before they can be lost."""

        def __init__(self, args, **options):
            super().__init__(prefetch=0, auto_accept=False, auto_settle=True)
            self.args = args
            self.name = args.name
            self.rng = random.Random(args.seed)
            self.failure = ""
            self.sends = open(args.send_log, "a", buffering=1)
            self.deliveries = open(args.delivery_log, "a", buffering=1)
            self.next_sequence: dict[str, int] = {}
            self.in_flight: dict = {}  # delivery tag -> send record
            self.connection = None
            self.options = options

        def on_start(self, event):
            self.container = event.container
            self.connection = event.container.connect(self.args.url, reconnect=False, **self.options)
            self.begin(event.container)

        def fail(self, reason: str) -> None:
            if not self.failure:
                self.failure = reason
            if self.connection is not None:
                self.connection.close()

        def on_transport_error(self, event):
            condition = event.transport.condition
            self.fail(f"transport error: {condition.name if condition else '?'}: "
                      f"{condition.description if condition else ''}")

        def on_connection_error(self, event):
            self.fail(f"connection closed by the node: {event.connection.remote_condition}")

        def on_link_error(self, event):
            self.fail(f"link {event.link.name} closed by the node: {event.link.remote_condition}")

        def send(self, link, queue: str, group: str, body_bytes: int = 64) -> None:
            sequence = self.next_sequence.get(group, 0) + 1
            self.next_sequence[group] = sequence
            record = {"kind": "send", "producer": self.name, "node": self.args.url, "queue": queue, "group": group,
                      "sequence": sequence, "sent_ms": now_ms()}
            self.sends.write(json.dumps({**record, "settled_ms": record["sent_ms"], "outcome": "timeout",
                                         "condition": "not settled before the client ended"}) + "\n")
            message = Message(body=f"{self.name} {group} {sequence} ".ljust(body_bytes, "."), durable=True,
                              properties={"producer": self.name, "sequence": sequence})
            message.group_id = group
            delivery = link.send(message)
            self.in_flight[delivery.tag] = record

        def on_settled(self, event):
            record = self.in_flight.pop(event.delivery.tag, None)
            if record is None:
                return
            condition = event.delivery.remote.condition
            self.sends.write(json.dumps({**record, "settled_ms": now_ms(),
                                         "outcome": outcomes.get(event.delivery.remote_state, "unknown"),
                                         "condition": condition.name if condition else None}) + "\n")
            self.sent_settled(event)

        def sent_settled(self, event) -> None:
            pass

        def log_accept(self, event, queue: str) -> None:
            """An acceptance the node may or may not see (the accept leaves after this line)."""
            message = event.message
            properties = message.properties or {}
            at_ms = now_ms()
            self.deliveries.write(json.dumps({
                "kind": "delivery", "consumer": self.name, "node": self.args.url, "queue": queue,
                "group": message.group_id, "producer": properties.get("producer"),
                "sequence": properties.get("sequence"), "received_ms": at_ms, "settled_ms": at_ms,
                "confirmed_ms": None, "delivery_count": message.delivery_count, "outcome": "accepted",
                "settle_confirmed": False}) + "\n")
            self.accept(event.delivery)

        def finish(self) -> None:
            if self.connection is not None:
                self.connection.close()

    class Killed(Episode):
        """Sends and receives on QUEUE until the orchestrator kills it with SIGKILL."""

        IN_FLIGHT_MAX = 2
        CREDIT = 10

        def begin(self, container):
            self.sender = container.create_sender(self.connection, QUEUE, name=f"{self.name}-out")
            self.receiver = container.create_receiver(self.connection, QUEUE, name=f"{self.name}-in")
            self.receiver.flow(self.CREDIT)

        def on_sendable(self, event):
            self.send_some()

        def sent_settled(self, event):
            self.send_some()

        def send_some(self):
            while self.sender.credit > 0 and len(self.in_flight) < self.IN_FLIGHT_MAX:
                self.send(self.sender, QUEUE, self.rng.choice(GROUPS))

        def on_message(self, event):
            self.log_accept(event, QUEUE)
            event.link.flow(1)

    class Detach(Episode):
        """Suspends its links (detach, closed=false) and attaches them again a few times, then closes."""

        ROUNDS = 3
        MESSAGES_PER_ROUND = 4
        ROUND_WAIT_S = 1.0  # a round ends when it has its messages or after this long

        def begin(self, container):
            self.round = 0
            self.start_round()

        def start_round(self):
            self.round += 1
            self.received = 0
            self.receiver = self.container.create_receiver(self.connection, QUEUE, name=f"{self.name}-in")
            self.receiver.flow(self.MESSAGES_PER_ROUND)
            self.sender = self.container.create_sender(self.connection, QUEUE, name=f"{self.name}-out")
            self.to_send = self.MESSAGES_PER_ROUND
            self.round_timer = self.container.schedule(self.ROUND_WAIT_S, self)

        def on_sendable(self, event):
            while event.link == self.sender and self.to_send > 0 and self.sender.credit > 0:
                self.to_send -= 1
                self.send(self.sender, QUEUE, self.rng.choice(GROUPS))

        def on_message(self, event):
            if event.link != self.receiver or self.round_timer is None:
                return  # arrived after this side's detach: the node releases it
            self.log_accept(event, QUEUE)
            self.received += 1
            if self.received >= self.MESSAGES_PER_ROUND:
                self.end_round()

        def on_timer_task(self, event):
            self.end_round()

        def end_round(self):
            if self.round_timer is None:
                return
            self.round_timer.cancel()
            self.round_timer = None
            self.receiver.detach()  # closed=false: a suspended link, which the node ends at once
            self.sender.detach()
            self.detached = 0

        def on_link_remote_detach(self, event):
            self.detached += 1
            if self.detached < 2:
                return
            if self.round < self.ROUNDS:
                self.start_round()
            else:
                self.finish()

    class Large(Episode):
        """Sends LARGE_MESSAGES bodies of LARGE_BODY_BYTES and receives as many, over small frames."""

        def __init__(self, args):
            super().__init__(args, max_frame_size=SMALL_FRAME_BYTES)

        def begin(self, container):
            self.group = f"L{self.rng.randrange(4)}"
            self.to_send = LARGE_MESSAGES
            self.received = 0
            self.sender = container.create_sender(self.connection, LARGE_QUEUE, name=f"{self.name}-out")
            self.receiver = container.create_receiver(self.connection, LARGE_QUEUE, name=f"{self.name}-in")
            self.receiver.flow(1)

        def on_sendable(self, event):
            while event.link == self.sender and self.to_send > 0 and self.sender.credit > 0:
                self.to_send -= 1
                self.send(self.sender, LARGE_QUEUE, self.group, LARGE_BODY_BYTES)

        def on_message(self, event):
            if len(event.message.body) != LARGE_BODY_BYTES:
                self.fail(f"a body of {len(event.message.body)} bytes arrived, {LARGE_BODY_BYTES} were sent")
                return
            self.log_accept(event, LARGE_QUEUE)
            self.received += 1
            if self.received >= LARGE_MESSAGES:
                self.finish()
            else:
                event.link.flow(1)

    class Heartbeat(Episode):
        """Idle longer than its idle timeout; the node's empty frames must keep it open. Then one round trip."""

        def __init__(self, args):
            super().__init__(args, heartbeat=IDLE_TIMEOUT_S)

        def begin(self, container):
            self.receiver = container.create_receiver(self.connection, IDLE_QUEUE, name=f"{self.name}-in")
            self.receiver.flow(1)
            self.sender = None
            container.schedule(IDLE_FOR_S, self)

        def on_timer_task(self, event):
            if self.failure:
                return
            self.sender = self.container.create_sender(self.connection, IDLE_QUEUE, name=f"{self.name}-out")

        def on_sendable(self, event):
            if event.link == self.sender and not self.in_flight and not self.next_sequence:
                self.send(self.sender, IDLE_QUEUE, self.name)

        def on_message(self, event):
            self.log_accept(event, IDLE_QUEUE)
            self.finish()

    return {"killed": Killed, "detach": Detach, "large": Large, "heartbeat": Heartbeat}


class _LazyEpisodes(dict):
    def __missing__(self, role):
        self.update(_episode_classes())
        return self[role]


_EPISODES = _LazyEpisodes()


# ---- the orchestrator ----------------------------------------------------------------------------

@dataclass
class Sample:
    at_s: float  # since the start of the run
    rss_bytes: int
    connections: int
    links: int
    unsettled_deliveries: int
    depth_messages: int = 0  # on every queue: a backlog shows in RSS too


@dataclass
class SoakResult:
    duration_s: float
    seed: int
    date_utc: str = ""  # when the run began, "YYYY-MM-DD HH:MM"
    revision: str = ""  # the node's source: `git describe` of this checkout, or what the caller says
    samples: list = field(default_factory=list)  # Sample
    episodes: dict = field(default_factory=dict)  # role -> {"ended": n, "killed": n, "failed": n}
    episode_failures: list = field(default_factory=list)  # the first few failures' stderr
    baseline_after: dict = field(default_factory=dict)  # engine objects once every client left
    rss_after_bytes: int = 0
    node_alive: bool = False
    node_exit: int | None = None  # the node's exit status when it ended before the run did (-15: SIGTERM)
    node_tracebacks: int = 0
    checker_summary: str = ""
    checker_ok: bool = False
    sends: int = 0  # distinct messages sent (an episode logs a send twice: before it leaves, and its outcome)
    accepted: int = 0  # distinct messages the node accepted
    delivered: int = 0
    redeliveries: int = 0
    messages_per_s: float = 0.0

    def series(self, key: str) -> tuple[int, int, int]:
        values = [getattr(sample, key) for sample in self.samples]
        return (values[0], max(values), values[-1]) if values else (0, 0, 0)

    @property
    def rss_growth_bytes(self) -> int:
        """Max RSS of the second half of the run over max RSS of the first half: a leak shows as growth."""
        half = len(self.samples) // 2
        first, second = self.samples[:half], self.samples[half:]
        if not first or not second:
            return 0
        return max(s.rss_bytes for s in second) - max(s.rss_bytes for s in first)

    def problems(self) -> list[str]:
        """What failed, in words; empty when the soak passed."""
        found = []
        if not self.node_alive:
            found.append(f"the node process ended before the run did (exit status {self.node_exit})")
        if self.node_tracebacks:
            found.append(f"the node logged {self.node_tracebacks} tracebacks")
        if self.rss_growth_bytes > RSS_GROWTH_MAX_BYTES:
            found.append(f"RSS grew {self.rss_growth_bytes / 2**20:.1f} MiB in the second half "
                         f"(ceiling {RSS_GROWTH_MAX_BYTES >> 20} MiB)")
        if any(self.baseline_after.get(key) != 0 for key in ("connections", "links", "unsettled_deliveries")):
            found.append(f"engine objects did not return to zero after the clients left: {self.baseline_after}")
        failed = sum(counts["failed"] for counts in self.episodes.values())
        if failed:
            found.append(f"{failed} episodes failed: {self.episode_failures[:3]}")
        for role in ROLES:
            counts = self.episodes.get(role, {})
            if not counts.get("killed" if role == "killed" else "ended"):
                found.append(f"no {role} episode ran its course")
        if not self.checker_ok:
            found.append(f"the checker found violations: {self.checker_summary}")
        return found


def _revision() -> str:
    try:
        described = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True,
                                   text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return described.stdout.strip() or "unknown (not a git checkout)"


def load_result(path: Path) -> SoakResult:
    values = json.loads(Path(path).read_text())
    values.pop("problems", None)
    samples = [Sample(**sample) for sample in values.pop("samples")]
    return SoakResult(**values, samples=samples)


def _send_identities(paths) -> tuple[int, int]:
    """(messages sent, messages accepted), each message once however many lines it has."""
    from tests.drills.checker import identity, load_jsonl

    outcomes: dict = {}
    for line in load_jsonl(paths):
        key = identity(line)
        if outcomes.get(key) != "accepted":
            outcomes[key] = line["outcome"]
    return len(outcomes), sum(1 for outcome in outcomes.values() if outcome == "accepted")


def _metrics(http_address: str) -> dict[str, float]:
    with urllib.request.urlopen(f"http://{http_address}/metrics", timeout=10) as response:
        text = response.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith(("grouper_engine_", "grouper_process_", "grouper_queue_depth_messages{")):
            name, value = line.rsplit(" ", 1)
            values[name] = float(value)
    return values


def _rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


def _sample(node, started_s: float) -> Sample:
    values = _metrics(node.http_address)
    return Sample(round(time.monotonic() - started_s, 1), _rss_bytes(node.process.pid),
                  int(values["grouper_engine_connections"]), int(values["grouper_engine_links"]),
                  int(values["grouper_engine_unsettled_deliveries"]),
                  int(sum(value for name, value in values.items() if name.startswith("grouper_queue_depth_messages{"))))


class _Episodes:
    """Keeps one episode per role running, back to back; `killed` ones die by SIGKILL at a seeded time."""

    FAILURES_KEPT = 5

    def __init__(self, url: str, directory: Path, seed: int):
        self.url = url
        self.directory = directory
        self.rng = random.Random(seed)
        self.running: dict[str, tuple] = {}  # role -> (Popen, name, kill_at_s or None, started_s, stderr path)
        self.counts = {role: {"ended": 0, "killed": 0, "failed": 0} for role in ROLES}
        self.failures: list[str] = []
        self.started = 0
        self.send_paths: list[Path] = []  # one per episode: see the rules on torn lines
        self.delivery_paths: list[Path] = []

    def step(self, start: bool = True) -> None:
        now_s = time.monotonic()
        for role in ROLES:
            entry = self.running.get(role)
            if entry is not None:
                process, name, kill_at_s, started_s, stderr_path = entry
                if process.poll() is None:
                    if kill_at_s is not None and now_s >= kill_at_s:
                        process.send_signal(signal.SIGKILL)
                        process.wait(10)
                        self.counts[role]["killed"] += 1
                        del self.running[role]
                    elif now_s - started_s > EPISODE_TIMEOUT_S:
                        process.kill()
                        process.wait(10)
                        self._failed(role, name, f"did not end within {EPISODE_TIMEOUT_S} s", stderr_path)
                        del self.running[role]
                    continue
                if process.returncode == 0:
                    self.counts[role]["ended"] += 1
                else:
                    self._failed(role, name, f"exit {process.returncode}", stderr_path)
                del self.running[role]
            if start:
                self._start(role, now_s)

    def _failed(self, role: str, name: str, what: str, stderr_path: Path) -> None:
        self.counts[role]["failed"] += 1
        if len(self.failures) < self.FAILURES_KEPT:
            self.failures.append(f"{name}: {what}: {stderr_path.read_text()[-500:].strip()}")

    def _start(self, role: str, now_s: float) -> None:
        self.started += 1
        name = f"{role[0]}{self.started}"
        logs = self.directory / "episodes"
        logs.mkdir(exist_ok=True)
        stderr_path = logs / f"{name}.stderr"
        send_path, delivery_path = logs / f"{name}.sends.jsonl", logs / f"{name}.deliveries.jsonl"
        for path in (send_path, delivery_path):
            path.touch()  # an episode killed before it opens them still has (empty) logs
        self.send_paths.append(send_path)
        self.delivery_paths.append(delivery_path)
        with open(stderr_path, "w") as stderr:
            process = subprocess.Popen(
                [sys.executable, "-m", "bench.soak", "episode", role, "--url", self.url, "--name", name,
                 "--send-log", str(send_path), "--delivery-log", str(delivery_path),
                 "--seed", str(self.rng.randrange(1 << 30))],
                cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr, stdin=subprocess.DEVNULL)
        kill_at_s = now_s + self.rng.uniform(KILL_AFTER_MIN_S, KILL_AFTER_MAX_S) if role == "killed" else None
        self.running[role] = (process, name, kill_at_s, now_s, stderr_path)

    def stop(self) -> None:
        """Kill the `killed` episode (it pre-logs, so its logs stay consistent) and let the others end:
        a `large` or `heartbeat` episode killed midway would leave its own messages on its queue."""
        entry = self.running.pop("killed", None)
        if entry is not None and entry[0].poll() is None:
            entry[0].send_signal(signal.SIGKILL)
            entry[0].wait(10)
            self.counts["killed"]["killed"] += 1
        while self.running:
            self.step(start=False)
            time.sleep(0.05)


def run_soak(duration_s: float, work_dir: Path, seed: int = 1, progress=None) -> SoakResult:
    from tests.drills.checker import check_files
    from tests.drills.load import start_load
    from tests.integration.harness import NodeProcess

    work_dir = Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    result = SoakResult(duration_s=duration_s, seed=seed, revision=_revision(),
                        date_utc=f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M}")
    node = NodeProcess(work_dir / "node").start()
    sample_interval_s = max(SAMPLE_INTERVAL_MIN_S, duration_s / SAMPLE_COUNT)
    episodes = _Episodes(node.url, work_dir, seed)
    load = None
    try:
        started_s = time.monotonic()
        result.samples.append(_sample(node, started_s))
        load = start_load([(node.url, QUEUE, GROUPS)] * STEADY_PRODUCERS,
                          [(node.url, QUEUE, STEADY_CONSUMER_CREDIT)] * STEADY_CONSUMERS, work_dir / "steady",
                          in_flight_max=STEADY_IN_FLIGHT_MAX, seed=seed)
        next_sample_s = started_s + sample_interval_s
        while time.monotonic() - started_s < duration_s:
            episodes.step()
            if node.process.poll() is not None:
                break
            if time.monotonic() >= next_sample_s:
                next_sample_s += sample_interval_s
                try:
                    result.samples.append(_sample(node, started_s))
                except OSError:
                    if node.process.poll() is not None:
                        break  # the node died under the scrape: reported as such below
                    raise
                if progress is not None:
                    progress(result.samples[-1], episodes.counts)
            time.sleep(0.05)  # the orchestrator's poll period; nothing is judged by time
        result.node_exit = node.process.poll()
        if result.node_exit is not None:
            return result  # `finally` stops the clients; the logs of a dead node's run prove nothing
        episodes.stop()
        send_paths, delivery_paths = load.finish(quiet_s=2.0, timeout_s=120.0)
        load = None
        deadline_s = time.monotonic() + BASELINE_WAIT_S
        while node.process.poll() is None:
            sample = _sample(node, started_s)
            result.baseline_after = {"connections": sample.connections, "links": sample.links,
                                     "unsettled_deliveries": sample.unsettled_deliveries,
                                     "depth_messages": sample.depth_messages}
            result.rss_after_bytes = sample.rss_bytes
            if not any(result.baseline_after.values()) or time.monotonic() > deadline_s:
                break
            time.sleep(0.2)
        elapsed_s = time.monotonic() - started_s
        result.node_alive = node.process.poll() is None
        report = check_files([*send_paths, *episodes.send_paths],
                             [*delivery_paths, *episodes.delivery_paths])
        result.checker_ok, result.checker_summary = report.ok, report.summary()
        result.sends, result.accepted = _send_identities([*send_paths, *episodes.send_paths])
        result.delivered, result.redeliveries = report.delivered, report.redeliveries
        result.messages_per_s = round(report.accepted / elapsed_s, 1)
    finally:
        episodes.stop()
        if load is not None:
            load.__exit__(RuntimeError, None, None)
        result.episodes = episodes.counts
        result.episode_failures = episodes.failures
        if node.process.poll() is None:
            node.stop()
        result.node_tracebacks = sum(1 for line in node.output if line.startswith("Traceback"))
        (work_dir / "node.log").write_text("\n".join(node.output) + "\n")
    return result


# ---- the report ----------------------------------------------------------------------------------

def _mib(value: int) -> str:
    return f"{value / 2**20:.1f}"


def render(result: SoakResult, command: str) -> str:
    counts = result.episodes
    rss = result.series("rss_bytes")
    lines = [
        "## Soak",
        "",
        "Generated by `bench/soak.py`; rerun it to replace this section. One node, a steady grouped load "
        f"({STEADY_PRODUCERS} producers, {STEADY_CONSUMERS} settle-second consumers of credit "
        f"{STEADY_CONSUMER_CREDIT}, "
        f"{len(GROUPS)} groups) "
        "and episodes of clients that come and go, one after another per role: `killed` (a producer and a "
        f"consumer, kill -9 after {KILL_AFTER_MIN_S}-{KILL_AFTER_MAX_S} s), `detach` (links suspended with "
        f"detach closed=false and attached again), `large` ({LARGE_MESSAGES} x {LARGE_BODY_BYTES >> 20} MiB "
        f"bodies over a {SMALL_FRAME_BYTES >> 10} KiB max-frame-size), `heartbeat` (idle timeout "
        f"{IDLE_TIMEOUT_S:g} s, idle {IDLE_FOR_S:g} s, must stay connected).",
        "",
        f"- Date: {result.date_utc} UTC",
        f"- Command: `{command}`; Grouper git {result.revision}",
        f"- Machine: {os.cpu_count()} cores, Python {platform.python_version()}, Linux {platform.release()}; "
        "shared and noisy.",
        f"- Verdict: **{'passed' if not result.problems() else 'FAILED'}**"
        + ("" if not result.problems() else ": " + "; ".join(result.problems())),
        "",
        "| series (samples over the run) | first | max | last | after clients left |",
        "|---|---:|---:|---:|---:|",
        f"| node RSS MiB | {_mib(rss[0])} | {_mib(rss[1])} | {_mib(rss[2])} | {_mib(result.rss_after_bytes)} |",
    ]
    for key, label in (("connections", "engine connections"), ("links", "engine links"),
                       ("unsettled_deliveries", "unsettled deliveries"), ("depth_messages", "queued messages")):
        first, most, last = result.series(key)
        lines.append(f"| {label} | {first:,} | {most:,} | {last:,} | {result.baseline_after.get(key, '?')} |")
    lines += [
        "",
        f"- Duration {result.duration_s:g} s, {len(result.samples)} samples; RSS growth, second half's max over "
        f"the first half's: {_mib(result.rss_growth_bytes)} MiB (ceiling {RSS_GROWTH_MAX_BYTES >> 20} MiB).",
        "- Episodes: " + ", ".join(f"{role} {counts[role]['ended']} ended, {counts[role]['killed']} killed, "
                                   f"{counts[role]['failed']} failed" for role in ROLES if role in counts) + ".",
        f"- Messages: {result.sends:,} sends, {result.accepted:,} accepted ({result.messages_per_s:,} /s), "
        f"{result.delivered:,} accepted by a consumer, {result.redeliveries:,} redeliveries.",
        f"- Checker (tests/drills/checker.py, over log lines): "
        f"{result.checker_summary.splitlines()[0] if result.checker_summary else 'not run'}",
        f"- Node: {'alive' if result.node_alive else 'DIED'} at the end, {result.node_tracebacks} tracebacks "
        "in its log.",
        "",
        "RSS series (MiB, every sample): " + ", ".join(_mib(sample.rss_bytes) for sample in result.samples),
        "",
    ]
    return "\n".join(lines)


def write_report(markdown: str, path: Path) -> None:
    """Replace the "## Soak" section of `path` (up to the next "## " heading), or append it."""
    text = path.read_text() if path.exists() else ""
    pattern = re.compile(r"^## Soak\n.*?(?=^## |\Z)", re.M | re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: markdown + "\n", text, count=1)
    else:
        text = text.rstrip("\n") + "\n\n" + markdown
    path.write_text(text.rstrip("\n") + "\n")


def _command(duration_s: float) -> str:
    return "python3 -m bench.soak" + ("" if duration_s == 1800 else f" --duration-s {duration_s:g}")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["episode"]:
        return _episode_main(argv[1:])
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--duration-s", type=float, default=1800.0)
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a new temporary directory")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "soak-last-run.json")
    parser.add_argument("--no-report", action="store_true", help="print the section instead of writing it")
    parser.add_argument("--render-only", action="store_true", help="write the section from --json, run nothing")
    args = parser.parse_args(argv)
    if args.render_only:
        result = load_result(args.json)
        write_report(render(result, _command(result.duration_s)), args.out)
        return 1 if result.problems() else 0
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="grouper-soak-"))
    print(f"work dir: {work_dir}", flush=True)

    def progress(sample: Sample, counts: dict) -> None:
        print(f"{sample.at_s:8.1f} s  rss {_mib(sample.rss_bytes)} MiB  connections {sample.connections}  "
              f"links {sample.links}  unsettled {sample.unsettled_deliveries}  episodes "
              + " ".join(f"{role}={sum(counts[role].values())}" for role in ROLES), flush=True)

    result = run_soak(args.duration_s, work_dir, args.seed, progress)
    markdown = render(result, _command(args.duration_s))
    if args.no_report:
        print(markdown)
    else:
        write_report(markdown, args.out)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**asdict(result), "problems": result.problems()}, indent=1) + "\n")
        print(markdown)
    problems = result.problems()
    for problem in problems:
        print(f"FAILED: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
