"""A node launcher for tests (issue 28): runs `python -m node.cli ...` in this process (same pid, so kill -9
reaches the node) and lets a test make the node, as an owner, propose `replica_in_sync(backup, epoch)`
through its own grouping handler, before the owner's replica streams exist to do it themselves.

Used as NodeProcess.command_prefix = (sys.executable, this file): argv is then [python, "-m", "node.cli", ...].
The test writes "<backup> <epoch>" to <data_dir>/propose_in_sync; the node proposes it on its engine loop
and writes the handler's answer ("None True", reason and result) to <data_dir>/in_sync_answer.
"""

from __future__ import annotations

import os
import sys
import threading
import time

POLL_S = 0.05  # how often the request file is looked for


def _watch(node) -> None:
    request = os.path.join(node.config.data_dir, "propose_in_sync")
    answer = os.path.join(node.config.data_dir, "in_sync_answer")
    while not os.path.exists(request):
        time.sleep(POLL_S)
    backup, epoch = open(request).read().split()

    def on_result(reason, result=None):
        with open(answer + ".tmp", "w") as file:
            file.write(f"{reason} {result}")
        os.replace(answer + ".tmp", answer)
    node.bridge.post(lambda: node.handler.replica_in_sync(backup, int(epoch), on_result))


def main() -> int:
    from node import runtime
    from node.cli import main as cli_main
    start = runtime.Node.start

    def start_and_watch(self, *args, **kwargs):
        start(self, *args, **kwargs)
        threading.Thread(target=_watch, args=(self,), daemon=True).start()
    runtime.Node.start = start_and_watch
    return cli_main(sys.argv[sys.argv.index("node.cli") + 1:])  # the words after NodeProcess's prefix


if __name__ == "__main__":
    sys.exit(main())
