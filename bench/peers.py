"""What every broker a benchmark run measures shares: start, readiness, per-row setup, CPU accounting,
stop (`Peer`), where a row's clients send (`Target`), and the ports and /proc readings they use. The
brokers themselves are grouper_peers.py (Grouper, plain and secured) and other_brokers.py (RabbitMQ,
ActiveMQ).

Every broker is a subprocess this module starts, in its own session, with a private directory for
config, data and logs under the run's work directory; nothing here touches a system service, a
system-wide config or a port other than on 127.0.0.1. `cpu_seconds()` sums utime+stime (plus the
reaped children's times) over the broker's process tree from /proc, so a caller can charge broker
CPU to each message. A peer never decides what is measured: `run.py` drives rows, `clients.py`
moves messages.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 120  # a cold JVM or Erlang node on a busy 2-core machine can take a while
STOP_TIMEOUT_S = 30
HOST = "127.0.0.1"


class PeerFailed(Exception):
    """A broker did not start, answer or stop; the row or system is reported as failed."""


@dataclass(frozen=True)
class Target:
    """Where the clients of one row send and receive."""
    protocol: str  # "amqp" (lean.py, proton's C engine) or "stomp" (stomp.py)
    url: str  # amqp://user:pass@host:port, or host:port for STOMP
    send_address: str
    consumer_addresses: tuple  # one tuple of source addresses per consumer
    routing_subject: bool = False  # put the group id in the AMQP subject (RabbitMQ exchange routing key)
    sasl_mechs: str | None = None  # e.g. "PLAIN" for RabbitMQ; None lets proton choose
    user: str = ""  # SASL PLAIN user ("" = the url's, if any); wins over the url's
    password: str = ""  # the bench's own throwaway password (bench work dir), never a real one
    tls: bool = False  # TLS around the socket (Python ssl), the broker's certificate checked
    ca_file: str = ""  # PEM CAs for the broker's certificate; "" = the system's CAs


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _process_table() -> dict[int, tuple[int, float]]:
    """pid -> (ppid, cpu seconds incl. reaped children) for every live process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # fields after "(comm)", starting at state
        ppid = int(fields[1])
        utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
        table[int(entry)] = (ppid, (utime + stime + cutime + cstime) / CLOCK_TICKS_PER_S)
    return table


def resident_bytes(pid: int | str = "self", names: tuple = ("VmRSS", "VmHWM")) -> dict:
    """{name: bytes} of one process's memory fields in /proc/PID/status, by default VmRSS and VmHWM
    (OSError once it is gone)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in names:
            fields[name] = int(value.split()[0]) * 1024
    return fields


def tree_cpu_seconds(root_pid: int) -> float:
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0.0, [root_pid]
    while stack:
        pid = stack.pop()
        if pid in table:
            total += table[pid][1]
        stack.extend(children.get(pid, ()))
    return total


def _deb_version(package: str) -> str:
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "not installed"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


class Peer:
    """One broker process. Subclasses fill in start/prepare; the tree/stop logic is shared."""
    name = "peer"

    def __init__(self, work_dir: Path):
        self.dir = work_dir / self.name
        self.process: subprocess.Popen | None = None
        self.log_path = self.dir / "stdout.log"

    def versions(self) -> dict[str, str]:
        return {}

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.process.pid)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _spawn(self, argv: list[str], env: dict | None = None, cwd: Path | None = None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=env, cwd=cwd, start_new_session=True)
        log.close()

    def _wait_until(self, ready, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise PeerFailed(f"{self.name} exited with {self.process.returncode} before {what}; "
                                 f"see {self.log_path}: {self.log_tail()}")
            if ready():
                return
            time.sleep(0.25)
        raise PeerFailed(f"{self.name}: no {what} after {timeout_s} s; see {self.log_path}: {self.log_tail()}")

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def graceful_stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.alive():
            try:
                self.graceful_stop()
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except (subprocess.TimeoutExpired, OSError, subprocess.SubprocessError):
                pass
        # Whatever is left of the session we started (the broker and its helpers) goes too.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def prepare(self, row) -> Target:
        raise NotImplementedError

    def cleanup(self, row) -> None:
        pass
