"""One soak run: a `grouper node` (the integration tests' harness) under a steady grouped load
(tests/drills/load.py) and episodes (soak_episodes.py) that come and go, one per role, back to back.
SAMPLE_COUNT times over the run it samples the node's resident set size (/proc/PID/status) and the
engine object counts (/metrics). At the end it stops every client, waits for the engine objects to
return to the idle baseline (zero), and judges the logs with tests/drills/checker.py (nothing
accepted lost, group order kept, exclusive holds). Returns a `SoakResult`; writes no report."""

from __future__ import annotations

import datetime
import random
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from bench.soak_episodes import EPISODE_TIMEOUT_S, GROUPS, KILL_AFTER_MAX_S, KILL_AFTER_MIN_S, QUEUE, ROLES
from bench.soak_result import Sample, SoakResult

REPO = Path(__file__).resolve().parent.parent
SAMPLE_COUNT = 60  # samples over a run (at least one every SAMPLE_INTERVAL_MIN_S)
SAMPLE_INTERVAL_MIN_S = 1.0
BASELINE_WAIT_S = 30.0  # bound of the wait for the engine objects to return to zero after clients leave
STEADY_PRODUCERS, STEADY_CONSUMERS = 2, 3
STEADY_IN_FLIGHT_MAX = 2  # a few hundred to a thousand messages/s, so the logs stay small
# the consumers' prefetch: they must outpace the producers, or a backlog builds up (a 30 min run with
# 2 consumers of credit 10 ended 150k messages behind), and RSS measures the backlog, not leaks
STEADY_CONSUMER_CREDIT = 100


def _revision() -> str:
    try:
        described = subprocess.run(["git", "-C", str(REPO), "describe", "--always", "--dirty"], capture_output=True,
                                   text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return described.stdout.strip() or "unknown (not a git checkout)"


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
