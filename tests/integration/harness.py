"""Real `grouper node` processes on 127.0.0.1 for black-box tests, and small AMQP client helpers.

Every wait here is bounded; nothing sleeps to make time pass except where the broker's own clock
(TTL, delayed dispatch) is the thing under test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from proton import Message
from proton.utils import BlockingConnection

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 15.0


class NodeProcess:
    """One broker node process; `restart()` reuses its data directory and config."""

    def __init__(self, data_dir: Path, config_text: str = "", args: tuple = ()):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.data_dir.parent / f"{self.data_dir.name}.toml"
        self.config_path.write_text(textwrap.dedent(config_text))
        self.args = tuple(args)
        self.process: subprocess.Popen | None = None
        self.amqp_address = ""
        self.admin_address = ""
        self.output: list[str] = []
        self._amqp_port = 0
        self._admin_port = 0

    @property
    def url(self) -> str:
        return f"amqp://{self.amqp_address}"

    def start(self) -> "NodeProcess":
        command = [sys.executable, "-m", "node.cli", "node", "--config", str(self.config_path),
                   "--data-dir", str(self.data_dir), "--amqp-port", str(self._amqp_port),
                   "--admin-port", str(self._admin_port), *self.args]
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + START_TIMEOUT_S
        ready = threading.Event()

        def read():
            for line in self.process.stdout:
                self.output.append(line.rstrip("\n"))
                if line.startswith("amqp: "):
                    self.amqp_address = line.split(": ", 1)[1].strip()
                elif line.startswith("admin: "):
                    self.admin_address = line.split(": ", 1)[1].strip()
                elif line.strip() == "ready":
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        while not ready.is_set():
            if self.process.poll() is not None:
                raise RuntimeError(f"node exited with {self.process.returncode}:\n" + "\n".join(self.output))
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError("node did not become ready:\n" + "\n".join(self.output))
            ready.wait(0.05)
        # a restart keeps the same ports so clients and tests can reconnect to the same address
        self._amqp_port = int(self.amqp_address.rsplit(":", 1)[1])
        self._admin_port = int(self.admin_address.rsplit(":", 1)[1])
        return self

    def stop(self) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError("node did not stop on SIGTERM:\n" + "\n".join(self.output))

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(STOP_TIMEOUT_S)

    def restart(self) -> "NodeProcess":
        self.stop()
        return self.start()

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """Run a `grouper` management command against this node."""
        return subprocess.run([sys.executable, "-m", "node.cli", *args, "--node", self.admin_address],
                              cwd=REPO, capture_output=True, text=True, timeout=60)


def connect(node: NodeProcess, timeout_s: float = 10.0) -> BlockingConnection:
    return BlockingConnection(node.url, timeout=timeout_s)


def grouped(body, group: str | None = None, **properties) -> Message:
    message = Message(body=body, properties=properties or None)
    if group is not None:
        message.group_id = group
    return message
