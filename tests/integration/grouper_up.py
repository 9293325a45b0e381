"""`grouper up` as a real process for black-box tests: its output lines, its process tree, a bounded stop.

Every wait is bounded; the tree is read from /proc before the test acts, so a node that outlives
`grouper up` is found even after its parent is gone.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import zlib
from pathlib import Path

from tests.integration.harness import REPO, alive, member_children

START_WAIT_S = 60.0  # every node ready and a leader; about 25 s on a loaded 2-core machine
STOP_WAIT_S = 60.0
GONE_WAIT_S = 60.0  # for every process of the tree to be gone once `grouper up` stopped or died (each node
# stops cleanly on its SIGTERM: seconds, more on a loaded machine; 30 s was passed once under a full CI run's load)


def free_base_port(span: int = 30) -> int:
    """A base port with `span` free ports above it (checked by binding each)."""
    for _ in range(50):
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        base = probe.getsockname()[1]
        probe.close()
        if base + span > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + span):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no run of free ports found")


def descendants(pid: int) -> list[int]:
    """Every process below `pid` (its nodes and their raft members), from /proc."""
    found, frontier = [], [pid]
    while frontier:
        children = member_children(frontier.pop())
        found += children
        frontier += children
    return found


def wait_gone(pids: list[int], timeout_s: float = GONE_WAIT_S) -> list[int]:
    """The pids still alive after `timeout_s` (empty once every one is gone)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        left = [pid for pid in pids if alive(pid)]
        if not left:
            return []
        time.sleep(0.1)
    return [pid for pid in pids if alive(pid)]


class GrouperUp:
    """`grouper up --data-dir DIR --base-port BASE ARGS`; `start()` returns once it printed `ready`."""

    def __init__(self, data_dir: Path, nodes: int = 3, args: tuple = (), base_port: int | None = None):
        self.data_dir = Path(data_dir)
        self.nodes = nodes
        self.base_port = base_port or free_base_port()
        self.command = [sys.executable, "-m", "node.cli", "up", "--nodes", str(nodes), "--data-dir",
                        str(self.data_dir), "--base-port", str(self.base_port), *args]
        self.process: subprocess.Popen | None = None
        self.lines: list[str] = []
        self.tree: list[int] = []  # its nodes and their raft members, once they run
        self._ready = threading.Event()

    def amqp(self, index: int) -> str:
        return f"127.0.0.1:{self.base_port + 10 * index}"

    def admin(self, index: int) -> str:
        return f"127.0.0.1:{self.base_port + 10 * index + 1}"

    def raft_port(self, index: int) -> int:
        return self.base_port + 10 * index + 2

    def start(self, stdout=subprocess.PIPE) -> "GrouperUp":
        self.process = subprocess.Popen(self.command, cwd=REPO, stdout=stdout, stderr=subprocess.STDOUT
                                        if stdout == subprocess.PIPE else subprocess.PIPE, text=True)
        if stdout == subprocess.PIPE:
            threading.Thread(target=self._read, daemon=True).start()
            if not self._ready.wait(START_WAIT_S):
                self.stop()
                raise AssertionError("grouper up did not print ready:\n" + "\n".join(self.lines))
            self.tree = descendants(self.process.pid)
        return self

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("ready"):
                self._ready.set()

    def wait_nodes_ready(self, timeout_s: float = START_WAIT_S) -> list[int]:
        """With stdout elsewhere: until every node's HTTP port (opened last) answers; the process tree then."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if all(_accepts(self.base_port + 10 * i + 3) for i in range(self.nodes)) and \
                    len(descendants(self.process.pid)) >= 2 * self.nodes:  # every node and its raft member
                self.tree = descendants(self.process.pid)
                return self.tree
            time.sleep(0.2)
        raise AssertionError(f"the nodes of grouper up did not start within {timeout_s} s")

    def stop(self) -> int:
        """SIGINT, as Ctrl-C; SIGKILL past STOP_WAIT_S. Returns the exit status."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                return self.process.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
        return self.process.wait()

    def kill_tree(self) -> None:
        """After a test that failed: no process of this tree survives it."""
        pids = set(self.tree) | set(descendants(self.process.pid) if self.process.poll() is None else [])
        self.stop()
        for pid in sorted(pid for pid in pids if alive(pid)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _accepts(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


# ---- a stranger at a raft port ------------------------------------------------------------------

class _TouchOnUnpickle:
    """Unpickled, it runs `touch MARKER`: proof that a raft port ran a stranger's code."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def malicious_frame(marker: Path, key: str | None = None) -> bytes:
    """One pysyncobj frame (struct 'i' length, zlib(pickle)) whose unpickling touches `marker`;
    with `key`, encrypted as a member with that raft secret would (Fernet, pysyncobj's derivation)."""
    data = zlib.compress(pickle.dumps(_TouchOnUnpickle(marker)), 3)
    if key is not None:
        from pysyncobj.encryptor import getEncryptor
        data = getEncryptor(key).encrypt(data)
    return struct.pack("i", len(data)) + data


def send_to_raft_port(port: int, frame: bytes, timeout_s: float = 10.0) -> bytes:
    """Sends `frame` to 127.0.0.1:port; what came back before the node closed (or b'' on a reset)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
        sock.sendall(frame)
        try:
            return sock.recv(4096)
        except (ConnectionResetError, socket.timeout):
            return b""
