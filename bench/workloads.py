"""The cluster benchmarks' loads: a throughput row (`FlowRow`, `measure_flow`: bench/clients.py's
measurement with the producer on one node and each node's consumers on that node) and a background
load through every node while a phase measures something else (`BackgroundLoad`). The messages move
in lean.py's client processes (forked); this module places them, waits for them and sums what they
recorded. It never judges a result: the report does."""

from __future__ import annotations

import dataclasses
import multiprocessing
import time
from dataclasses import dataclass
from pathlib import Path

from bench import clients, lean, peers
from bench.cluster_nodes import NodeProcess


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
BACKGROUND_GROUPS = 1000


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


def wait_ready(readies, what: str) -> None:
    for ready, _ in readies:
        if not ready.wait(clients.READY_TIMEOUT_S):
            raise RuntimeError(f"{what}: a probe consumer did not attach within {clients.READY_TIMEOUT_S} s")


def wait_until(predicate, timeout_s: float, interval_s: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
