"""rhea (JavaScript, from npm) as an interop client: js/remote.js run by Node.js, one process per client.

Rules:
- The script is a remote control: commands go to its stdin as JSON lines, and every line it prints
  is one event of client.py's shape, recorded as it arrives by a reader thread.
- Anything the script writes to stderr is kept and shown when a wait fails.
- The process is ours to end: closing stdin asks it to close its connection and exit; it is killed
  if it has not exited within WAIT_S.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
from pathlib import Path

from tests.interop.client import WAIT_S, Client

JS_DIR = Path(__file__).resolve().parent / "js"
SCRIPT = JS_DIR / "remote.js"
NPM_INSTALL_TIMEOUT_S = 300.0  # npm ci of rhea and its two dependencies; about a second from a warm cache


def ensure_rhea_installed() -> str:
    """Install js/'s locked dependencies if node_modules is missing; returns the node executable.

    CI has Node.js and npm, so their absence fails the run rather than skipping it."""
    node = shutil.which("node")
    npm = shutil.which("npm")
    missing = [name for name, path in (("node", node), ("npm", npm)) if path is None]
    assert not missing, (f"the rhea interop tests need Node.js and npm on PATH ({' and '.join(missing)} not found); "
                         "install Node.js 20 or later")
    if not (JS_DIR / "node_modules" / "rhea").is_dir():
        result = subprocess.run([npm, "ci", "--no-audit", "--no-fund"], cwd=JS_DIR, capture_output=True, text=True,
                                timeout=NPM_INSTALL_TIMEOUT_S)
        assert result.returncode == 0, (f"npm ci in {JS_DIR} failed ({result.returncode}):\n"
                                        f"{result.stdout}\n{result.stderr}")
    return node


class RheaClient(Client):
    label = "rhea"

    def __init__(self, nodejs: str, host: str, port: int, username: str | None = None, password: str | None = None):
        super().__init__()
        self.stderr: list[str] = []
        self._process = subprocess.Popen([nodejs, str(SCRIPT)], cwd=JS_DIR, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        threading.Thread(target=self._read_events, name="rhea-stdout", daemon=True).start()
        threading.Thread(target=self._read_stderr, name="rhea-stderr", daemon=True).start()
        self._command("connect", host=host, port=port, username=username, password=password)

    def _read_events(self) -> None:
        for line in self._process.stdout:
            try:
                event = json.loads(line)
            except ValueError:
                event = {"event": "error", "text": f"not a JSON event: {line!r}"}
            self.record(event)

    def _read_stderr(self) -> None:
        for line in self._process.stderr:
            self.stderr.append(line.rstrip("\n"))

    def _command(self, op: str, **fields) -> None:
        self._process.stdin.write(json.dumps({"op": op, **fields}) + "\n")
        self._process.stdin.flush()

    def wait_for(self, found, what: str, timeout_s: float = WAIT_S):
        try:
            return super().wait_for(found, what, timeout_s)
        except AssertionError as error:
            raise AssertionError(f"{error}\nrhea's stderr:\n" + "\n".join(self.stderr)) from None

    def connection_outcome(self, timeout_s: float = WAIT_S) -> dict:
        """The node's answer to this client's connect: the opened event, or the error event of a refusal."""
        def found(events):
            return next((event for event in events if event["event"] in ("opened", "error")), None)
        with self._changed:
            if self._changed.wait_for(lambda: found(self.events), timeout_s):
                return found(self.events)
        raise AssertionError(f"rhea: neither opened nor refused within {timeout_s} s; events seen:\n"
                             + "\n".join(map(str, self.events)) + "\nrhea's stderr:\n" + "\n".join(self.stderr))

    def close(self) -> None:
        try:
            self._process.stdin.close()
            self._process.wait(WAIT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(WAIT_S)
            raise AssertionError("the rhea client did not exit after its stdin closed") from None
