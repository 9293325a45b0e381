"""python-qpid-proton's container API in a process of its own, remote-controlled as rhea's js/remote.js is:
for the scenarios that must stop a client process (SIGSTOP) and see what it sees when it wakes.

Rules:
- Run as `python -m tests.interop.proton_remote URL`: commands come on stdin as JSON lines (client.py's
  verbs, carried out by proton_clients.ContainerClient), and every event is printed as one JSON line.
- `ProtonProcessClient` is the test's side: RheaClient's reader threads and verbs over this script; the
  `connect` command rhea needs is ignored here (the URL is the script's argument).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

from tests.interop.proton_clients import ContainerClient
from tests.interop.rhea_client import RheaClient

REPO = Path(__file__).resolve().parents[2]


class _Printing(ContainerClient):
    def record(self, event: dict) -> None:
        super().record(event)
        sys.stdout.write(json.dumps(event) + "\n")
        sys.stdout.flush()


def main(url: str) -> int:
    client = _Printing(url)
    for line in sys.stdin:
        command = json.loads(line)
        op = command.pop("op")
        if op != "connect":
            client._command(op, **command)
    client.close()
    return 0


class ProtonProcessClient(RheaClient):
    label = "proton process"

    def __init__(self, url: str):  # RheaClient's, with this script as the process
        super(RheaClient, self).__init__()
        self.stderr: list[str] = []
        self._process = subprocess.Popen([sys.executable, "-m", "tests.interop.proton_remote", url],
                                         cwd=REPO, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                         text=True, bufsize=1)
        threading.Thread(target=self._read_events, name="proton-stdout", daemon=True).start()
        threading.Thread(target=self._read_stderr, name="proton-stderr", daemon=True).start()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
