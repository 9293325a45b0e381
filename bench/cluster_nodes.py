"""The benchmarks' `grouper node` processes and clusters, on the integration tests' harness.

tests/integration/harness.py's `NodeProcess` and tests/integration/cluster.py's `Cluster` start, wait
for, restart and kill a node for the tests and the benchmarks alike; this module adds only what a
benchmark needs on top: a name and a directory per node under the run's work directory (its data
and, once it stops or is killed, its output in node.log), the seconds a start took, the CPU of a
node's process tree, consumer counts that hold on every node, and a cluster that is ready once every
member is connected. Stopping never raises: a benchmark's `finally` must leave no node behind and
still write its report. Runs on the benchmark's main thread only.
"""

from __future__ import annotations

import time
from pathlib import Path

from bench import peers
from bench.phase_log import log
from tests.integration import cluster as test_cluster
from tests.integration import harness

CLUSTER_WAIT_S = 30.0  # leader elected, members connected, consumer counts known


class NodeProcess(harness.NodeProcess):
    """One `grouper node` named `name`: its output in work_dir/name/node.log, its data in `data_dir`
    (default work_dir/name/data; a journal a benchmark wrote there is what it recovers), its config the
    text of `config_path` (none: the defaults); a restart reuses its data dir and its AMQP, admin and
    HTTP ports."""

    def __init__(self, name: str, work_dir: Path, config_path: Path | None = None, args: tuple = (), *,
                 data_dir: Path | None = None, start_timeout_s: float = harness.START_TIMEOUT_S):
        self.name = name
        self.dir = Path(work_dir) / name
        super().__init__(data_dir or self.dir / "data", Path(config_path).read_text() if config_path else "", args)
        self.start_timeout_s = start_timeout_s

    def start_timed(self) -> float:
        """Start and wait for "ready"; returns the seconds from the command to "ready"."""
        started = time.monotonic()
        self.start()
        return time.monotonic() - started

    @property
    def http_port(self) -> int:
        return int(self.http_address.rsplit(":", 1)[1])

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def cpu_seconds(self) -> float:
        """utime + stime of the node process and its raft member child (a process of its own)."""
        return peers.tree_cpu_seconds(self.process.pid)

    def log_tail(self, lines: int = 5) -> str:
        return " | ".join(self.output[-lines:])

    @property
    def log_path(self) -> Path:
        """Where the node's output is, once it has stopped or been killed."""
        return self.dir / "node.log"

    def stop(self) -> int | None:
        """SIGTERM, and SIGKILL past the harness's stop timeout; a stop that needed the kill is logged, not
        raised. Returns the exit status (None: killed)."""
        try:
            return super().stop()
        except RuntimeError as error:
            log(f"{self.name}: {str(error).splitlines()[0]}")
            return None
        finally:
            self.save_log()

    def kill(self) -> None:
        """SIGKILL, and wait for the raft member child too; one that outlives its node is logged, not raised."""
        try:
            super().kill()
        except AssertionError as error:
            log(f"{self.name}: {error}")
        finally:
            self.save_log()

    def save_log(self) -> None:
        """The node's output so far (every start's) into log_path, where a benchmark's work dir keeps it."""
        self.dir.mkdir(parents=True, exist_ok=True)
        self.log_path.write_text("".join(f"{line}\n" for line in self.output))


class Cluster(test_cluster.Cluster):
    """`size` benchmark nodes named node1, node2, ..., each with the queues of `config_path`, on raft ports
    the tests' harness picks."""

    def __init__(self, work_dir: Path, config_path: Path, size: int = 3, args: tuple = ()):
        self.config_path = Path(config_path)
        super().__init__(work_dir, size, self.config_path.read_text(), args)

    def make_node(self, index: int, directory: Path, config_text: str, args: tuple) -> NodeProcess:
        return NodeProcess(f"node{index + 1}", directory, self.config_path, args)

    def start(self) -> "Cluster":
        for node in self.nodes:
            node.start()
        self.wait_healthy()
        return self

    def stop(self) -> None:
        """Every node stopped (SIGTERM, SIGKILL past the harness's stop timeout); what failed is logged."""
        for node in self.nodes:
            node.stop()
            node.kill()

    def wait_healthy(self, via: int | None = None) -> dict:
        """A leader with a quorum, every member connected and registered, as seen from `via`."""
        return self.wait_for(lambda s: bool(s["leader"]) and s["has_quorum"]
                             and all(m["connected"] and m["amqp_address"] for m in s["members"]),
                             "a leader and every member connected", CLUSTER_WAIT_S, via)

    def leader(self) -> int:
        return self.index_of(self.wait_healthy()["leader"])

    def wait_consumers(self, queue: str, counts: dict[int, int], timeout_s: float = CLUSTER_WAIT_S) -> None:
        """Until the route table knows exactly `counts` consumers on `queue` per node index, and none on
        the nodes `counts` leaves out."""
        super().wait_consumers(queue, {index: counts.get(index, 0) for index in range(len(self.nodes))}, timeout_s)

    def cpu_seconds(self) -> list[float]:
        return [node.cpu_seconds() for node in self.nodes]
