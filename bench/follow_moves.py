"""Issue 14's cold tails where groups follow their consumers: what moving a group's queued backlog to the
node its consumers went to costs the old node, with every record warm (`record_memory_max_bytes = 0`, the
behaviour before cold tails reached such nodes) and under a small record budget, where most of the backlog
is cold and is found by sweeps of the old node's cold tail (node/core/cluster/sweep.py, docs/cluster-protocol.md).

    python3 -m bench.follow_moves [--messages N] [--groups G] [--body-bytes B] [--budgets 0,1048576]
    python3 -m bench.follow_moves render         # the section again from results/follow-moves-*.json

One run per record budget, each on a fresh 3-node cluster (bench/cluster_nodes.py's `Cluster`: real `grouper node`
processes on 127.0.0.1, fresh data dirs, `route_follow_ms = 1000`), one durable queue with exclusive groups:
1. a lean consumer with no credit attaches on node 0 alone, so every new group is placed there and nothing
   is delivered; node 1's lean producer sends N messages of B bytes over G groups. Every one must be
   accepted and queued on node 0 (its queue depth on /metrics). After a settle node 0 is sampled: VmRSS,
   VmHWM (/proc), its queue's depth and cold messages, its move counters.
2. the consumer on node 0 leaves; once the cluster has seen it go and `route_follow_ms` has passed, node 0's
   VmHWM is reset (/proc/PID/clear_refs) and a lean consumer (prefetch 100) attaches on node 2. The move is
   timed from that attach to node 2's consumer's last delivery, once it has all N and node 0's depth is 0;
   the consumer checks every group's order and that nothing arrives twice. Node 0's VmHWM after the move is
   its peak during it; node 0's CPU seconds (node process and its raft member) over the move, and its
   `grouper_cold_sweeps_total` and `grouper_moved_messages_total{how}` are read from /metrics.
Both budgets run in the same invocation with the same N, so the ratio of their moves comes from one run. The
machine is shared (2 cores, other engineers' tests, nemesis campaigns): every sample carries the 1-minute
load average, and node 0's CPU seconds are the steadier comparison.

A benchmark, not a test: it reports and asserts nothing, but a run whose scenario did not happen (a send
refused, nothing cold under a non-zero budget, something cold with none, a message lost, repeated or out of
its group's order, a move that stalls) is a failed row and the script exits 1. It prints the run's JSON,
writes results/follow-moves-<N>[-<tag>].json and rewrites only the section SECTION_HEADING of
docs/benchmarks.md, rendered from every results/follow-moves-*.json.
"""

from __future__ import annotations

import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from bench import clients, peers
from bench.budget_runs import QUEUE, BudgetRuns, Clients, budget_runs_main, order_check, wait_progress
from bench.cluster_nodes import Cluster, NodeProcess
from bench.machine import load_1m
from bench.report_file import copied_text

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
SECTION_HEADING = "## Groups following their consumers: moving a cold backlog"
REPORT_PATH = REPO_ROOT / "docs" / "benchmarks.md"
HOST = "127.0.0.1"
MB = 1_000_000
MIB = 1 << 20
DEFAULT_MESSAGES = 200_000
DEFAULT_GROUPS = 100
DEFAULT_BODY_BYTES = 100
DEFAULT_BUDGETS = (0, 1 << 20)  # every record warm (before cold tails reached these nodes), then a small budget
ROUTE_FOLLOW_MS = 1000  # the smallest the node accepts
PREFETCH = 100
SETTLE_S = 5.0  # after a phase, before a sample: the journal writer and the allocator are done
METRICS_TIMEOUT_S = 10.0
METRICS_GIVE_UP_S = 120.0  # a node whose /metrics says 503 this long, asked every POLL_INTERVAL_S, fails the run
POLL_INTERVAL_S = 0.2
PROGRESS_LOG_INTERVAL_S = 30.0
DUPLICATE_WAIT_S = 1.0  # after the last expected delivery: a duplicate would arrive by now
SEED = 3
UNANSWERED: dict[str, int] = {}  # node name -> /metrics requests answered 503 (its engine loop too slow to answer)


def log(text: str) -> None:
    print(f"[follow-moves {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def write_config(path: Path, record_memory_max_bytes: int) -> None:
    path.write_text(f"[node]\nroute_follow_ms = {ROUTE_FOLLOW_MS}\nrecord_memory_max_bytes = {record_memory_max_bytes}\n"
                    f"\n[[queue]]\nname = \"{QUEUE}\"\ngroup_policy = \"exclusive\"\ndurable = true\n"
                    "depth_max_messages = 0\ndepth_max_bytes = 0\n")


# ---- what node 0 shows ------------------------------------------------------------------------

def scrape(node: NodeProcess) -> str:
    """`node`'s /metrics page. A node whose engine loop does not answer in time says 503 (node/http_port/server.py):
    asked again until METRICS_GIVE_UP_S, and counted in UNANSWERED, which the report gives per phase."""
    deadline = time.monotonic() + METRICS_GIVE_UP_S
    while True:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{node.http_port}/metrics", timeout=METRICS_TIMEOUT_S) as reply:
                return reply.read().decode()
        except (urllib.error.HTTPError, TimeoutError) as error:
            if isinstance(error, urllib.error.HTTPError) and error.code != 503:
                raise
            UNANSWERED[node.name] = UNANSWERED.get(node.name, 0) + 1
            if time.monotonic() > deadline or not node.alive():
                raise RuntimeError(f"{node.name}'s /metrics unanswered for {METRICS_GIVE_UP_S:.0f} s: {error}")
            time.sleep(POLL_INTERVAL_S)


def metrics(node: NodeProcess) -> dict:
    """The figures of `node`'s /metrics this benchmark reads: its queue's gauges, sweeps, moves by how."""
    text = scrape(node)
    figures: dict = {"moved": {}}
    queue_label = f'queue="{QUEUE}"'
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name, value = line.rsplit(" ", 1)
        if name == f"grouper_queue_depth_messages{{{queue_label}}}":
            figures["depth_messages"] = int(float(value))
        elif name == f"grouper_queue_cold_messages{{{queue_label}}}":
            figures["cold_messages"] = int(float(value))
        elif name == "grouper_cold_sweeps_total":
            figures["cold_sweeps"] = int(float(value))
        elif name.startswith("grouper_moved_messages_total{"):
            figures["moved"][name.split('how="', 1)[1].split('"', 1)[0]] = int(float(value))
    return figures


def sample(node: NodeProcess) -> dict:
    memory = peers.resident_bytes(node.pid)
    return {"rss_bytes": memory["VmRSS"], "hwm_bytes": memory["VmHWM"], "cpu_s": round(node.cpu_seconds(), 1),
            **metrics(node), "load_1m": load_1m()}


def brief(figures: dict) -> str:
    return (f"RSS {figures['rss_bytes'] / MB:,.1f} MB, HWM {figures['hwm_bytes'] / MB:,.1f} MB, depth "
            f"{figures.get('depth_messages', 0):,}, cold {figures.get('cold_messages', 0):,}, sweeps "
            f"{figures.get('cold_sweeps', 0)}, moved {figures['moved']}, load {figures['load_1m']}")


def reset_peak(node: NodeProcess) -> None:
    """Make VmHWM start again from VmRSS (Linux: "5" to clear_refs), so its next reading is a phase's peak."""
    Path(f"/proc/{node.pid}/clear_refs").write_text("5")


# ---- one budget ---------------------------------------------------------------------------------

def run_budget(work_dir: Path, record_memory_max_bytes: int, messages: int, groups: int, body_bytes: int) -> dict:
    work_dir.mkdir(parents=True)
    config_path = work_dir / "grouper.toml"
    write_config(config_path, record_memory_max_bytes)
    cluster = Cluster(work_dir, config_path)
    old, producer_node, new = cluster.nodes
    helpers = Clients(work_dir / "clients")
    result: dict = {"record_memory_max_bytes": record_memory_max_bytes}
    try:
        cluster.start()
        workload = clients.Workload(messages=messages, groups=groups, prefetch=PREFETCH, durable=True, consumers=1,
                                    body_bytes=body_bytes, seed=SEED)
        holding = clients.Workload(messages=messages, groups=groups, prefetch=0, durable=True, consumers=1,
                                   body_bytes=body_bytes, seed=SEED)
        ready, stop, _, holder, holder_path = helpers.consumer(old, holding, "holding-consumer")
        if not ready.wait(clients.READY_TIMEOUT_S):
            raise RuntimeError("the consumer without credit on node 0 did not attach")
        cluster.wait_consumers(QUEUE, {0: 1})
        UNANSWERED.clear()
        result["before"] = sample(old)
        started = time.monotonic()
        sent = helpers.send(producer_node, workload, "producer")
        result["send_s"] = round(time.monotonic() - started, 1)
        result["accepted"] = sent["accepted"]
        if sent["accepted"] != messages:
            raise RuntimeError(f"{sent['accepted']:,} of {messages:,} sends accepted ({sent.get('rejected')} "
                               f"rejected, {sent.get('released')} released): {sent.get('error')}")
        wait_progress(lambda: metrics(old).get("depth_messages", 0), lambda depth: depth >= messages,
                      "node 0's queue holds every message", old)
        time.sleep(SETTLE_S)
        result["sent"] = sample(old)
        result["metrics_unanswered_sends"] = UNANSWERED.pop(old.name, 0)
        log(f"budget {record_memory_max_bytes:,} B: {messages:,} sent in {result['send_s']} s: {brief(result['sent'])}")
        if result["sent"]["depth_messages"] != messages:
            raise RuntimeError(f"node 0's depth is {result['sent']['depth_messages']:,} after {messages:,} accepted")
        cold = result["sent"].get("cold_messages", 0)
        if (cold == 0) == (record_memory_max_bytes > 0):
            raise RuntimeError(f"{cold:,} cold messages on node 0 under record_memory_max_bytes "
                               f"{record_memory_max_bytes:,}: not the scenario this measures")

        stop.set()
        holder.join(30)
        held = clients._load(Path(holder_path)) or {"count": -1, "error": "the holding consumer wrote no result"}
        if held["count"] != 0:
            raise RuntimeError(f"the consumer without credit received {held['count']} messages: {held.get('error')}")
        cluster.wait_consumers(QUEUE, {})
        time.sleep(ROUTE_FOLLOW_MS / 1000 + 0.5)  # node 0 has had no consumer that long: the attach starts the move
        result["left"] = sample(old)
        reset_peak(old)
        cpu_start_s = old.cpu_seconds()
        attach_start = time.monotonic()
        ready, stop, progress, process, result_path = helpers.consumer(new, workload, "following-consumer")
        if not ready.wait(clients.READY_TIMEOUT_S):
            raise RuntimeError("the consumer on node 2 did not attach")
        attach_ns = time.monotonic_ns()
        result["attach_s"] = round(time.monotonic() - attach_start, 2)
        emptied_s, peak_rss_bytes, next_log_s = None, 0, time.monotonic() + PROGRESS_LOG_INTERVAL_S

        def moving() -> tuple:
            """(delivered on node 2, node 0's depth, node 0's moved total, node 2's depth): node 2 delivers
            nothing of a group before its whole backlog arrived, so its deliveries alone would look stalled."""
            nonlocal emptied_s, peak_rss_bytes, next_log_s
            peak_rss_bytes = max(peak_rss_bytes, peers.resident_bytes(old.pid)["VmRSS"])
            at_old, at_new = metrics(old), metrics(new)
            depth = at_old.get("depth_messages", 0)
            if emptied_s is None and depth == 0:
                emptied_s = (time.monotonic_ns() - attach_ns) / 1e9
            state = (progress[0], depth, sum(at_old["moved"].values()), at_new.get("depth_messages", 0))
            if time.monotonic() >= next_log_s:
                next_log_s = time.monotonic() + PROGRESS_LOG_INTERVAL_S
                log(f"moving: delivered on node 2, node 0 depth, node 0 moved, node 2 depth = {state}; "
                    f"node 0 RSS {peak_rss_bytes / MB:,.0f} MB at most; load {load_1m()}")
            return state
        wait_progress(moving, lambda state: state[0] >= messages and state[1] == 0, "the move to node 2", old)
        cpu_s = old.cpu_seconds() - cpu_start_s
        unanswered = UNANSWERED.pop(old.name, 0)
        hwm_bytes = peers.resident_bytes(old.pid)["VmHWM"]
        time.sleep(DUPLICATE_WAIT_S)
        stop.set()
        process.join(60)
        record = clients._load(Path(result_path)) or {"count": 0, "groups": [], "seqs": [], "received_ns": [],
                                                       "error": "the consumer on node 2 wrote no result"}
        received_ns = record["received_ns"]
        expected: dict[str, int] = {}
        for group in clients.plan(workload)[0]:
            expected[group] = expected.get(group, 0) + 1
        result["move"] = {"first_delivery_s": round((min(received_ns) - attach_ns) / 1e9, 2) if len(received_ns) else None,
                          "last_delivery_s": round((max(received_ns) - attach_ns) / 1e9, 2) if len(received_ns) else None,
                          "emptied_s": round(emptied_s, 2), "old_cpu_s": round(cpu_s, 1),
                          "old_hwm_bytes": hwm_bytes, "old_peak_rss_bytes": peak_rss_bytes, "load_1m": load_1m(),
                          "metrics_unanswered": unanswered,
                          **order_check(record, expected)}
        result["move"]["move_s"] = max(result["move"]["last_delivery_s"] or 0, result["move"]["emptied_s"])
        result["after"] = sample(old)
        log(f"moved in {result['move']['move_s']} s: {result['move']}; node 0 after: {brief(result['after'])}")
        move = result["move"]
        if move["missing"] or move["out_of_order"] or move["duplicates"] or move["received"] != messages:
            raise RuntimeError(f"the move lost or reordered messages: {move}")
        if result["after"].get("depth_messages", 0) or result["after"].get("cold_messages", 0):
            raise RuntimeError(f"node 0 still holds messages after the move: {brief(result['after'])}")
    except (RuntimeError, OSError) as error:  # a failed run is a row that says so, not a traceback
        result["failed"] = str(error)
        log(f"budget {record_memory_max_bytes:,} B failed: {error}")
        for node in cluster.nodes:  # the evidence: each node's figures when it failed, beside its log
            if node.alive():
                try:
                    (node.dir / "metrics-at-failure.txt").write_text(scrape(node))
                except (RuntimeError, OSError) as problem:
                    log(f"{node.name}'s /metrics at the failure: {problem}")
    finally:
        for process in helpers.context.active_children():  # a client left running would hold up the exit
            process.terminate()
        cluster.stop()
    return result


# ---- the report -------------------------------------------------------------------------------

def render_section(reports: list[dict]) -> str:
    lines = [SECTION_HEADING, "",
             "Generated by `bench/follow_moves.py` (its header says how). 3 real nodes on 127.0.0.1 with "
             "`route_follow_ms = 1000`, a durable queue with exclusive groups. A consumer without credit on node 0 "
             "gets every group placed there; node 1's producer sends the messages, all queued on node 0. Then that "
             "consumer leaves and one (prefetch 100) attaches on node 2: the groups follow it with their backlog. "
             "*budget*: node 0's `record_memory_max_bytes` (0: every record warm, as these nodes ran before "
             "`d403ead`). Resident = node 0's VmRSS in MB (10^6 bytes), *HWM* its VmHWM; *cold*: node 0's cold "
             "messages after the sends. *Move*: from the attach on node 2 to its consumer's last delivery (with "
             "node 0's depth 0); in brackets to its first delivery and to node 0's depth first seen 0 (/metrics polled every 0.2 s); node 0's CPU seconds (node and its raft member) "
             "and its peak (VmHWM reset at the attach) over the move; *sweeps* and *moved* are node 0's "
             "`grouper_cold_sweeps_total` and `grouper_moved_messages_total{how}` after it; *503s*: node 0's /metrics answers 503 (its engine "
             "loop did not answer the scrape in time), polled every 0.2 s during the move. The machine has 2 cores "
             "shared with other engineers' work and nemesis campaigns: the load average is given per row.", "",
             "| messages × body B | groups | budget MiB | node 0 resident MB before → after sends (HWM) | cold "
             "| move s (first delivery, node 0 empty) | node 0 CPU s | node 0 peak MB in move | node 0 /metrics 503s in move | sweeps "
             "| moved by how | arrived "
             "| load | date, commit |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|---|"]
    verdicts = []
    for report in sorted(reports, key=lambda r: (r["messages"], r["date"])):
        moves = {}
        changed = sorted(set(report.get("uncommitted_node_files", []))
                         | set(report.get("uncommitted_node_files_at_end", [])))
        when = f"{report['date']}, `{report['commit']}`" + (f" + uncommitted {', '.join(changed)}" if changed else "")
        for result in report["results"]:
            head = (f"| {report['messages']:,} × {report['body_bytes']:,} | {report['groups']:,} "
                    f"| {result['record_memory_max_bytes'] / MIB:,.0f} ")
            if "failed" in result or "move" not in result:
                lines.append(head + f"| failed: {result.get('failed', 'no move')} | | | | | | | | | "
                             f"{report['load_start']} | {when} |")
                continue
            before, sent, move, after = result["before"], result["sent"], result["move"], result["after"]
            moves[result["record_memory_max_bytes"]] = move
            order = ("all, in order, once" if not (move["missing"] or move["out_of_order"] or move["duplicates"])
                     else f"missing {move['missing']}, out of order {move['out_of_order']}, "
                          f"duplicates {move['duplicates']}")
            moved = ", ".join(f"{how} {count:,}" for how, count in sorted(after["moved"].items()) if count)
            lines.append(head + f"| {before['rss_bytes'] / MB:,.1f} → {sent['rss_bytes'] / MB:,.1f} "
                         f"({sent['hwm_bytes'] / MB:,.1f}) | {sent.get('cold_messages', 0):,} "
                         f"| {move['move_s']} ({move['first_delivery_s']}, {move['emptied_s']}) | {move['old_cpu_s']} "
                         f"| {move['old_hwm_bytes'] / MB:,.1f} | {move.get('metrics_unanswered', 0)} | {after.get('cold_sweeps', 0)} | {moved} | {order} "
                         f"| {before['load_1m']} → {move['load_1m']} | {when} |")
        if 0 in moves and len(moves) > 1:
            budget = min(b for b in moves if b > 0)
            warm, cold = moves[0], moves[budget]
            command = report.get("command", f"python3 -m bench.follow_moves --messages {report['messages']}")
            verdicts.append(f"`{command}` ({report['date']}, `{report['commit']}`): the move with a cold tail "
                            f"({budget / MIB:,.0f} MiB) against all warm: **{cold['move_s'] / warm['move_s']:.2f}x** "
                            f"the time to the last delivery, {cold['emptied_s'] / warm['emptied_s']:.2f}x the time "
                            f"until node 0 is empty, {cold['first_delivery_s'] / warm['first_delivery_s']:.2f}x the "
                            f"time to the first delivery, {cold['old_cpu_s'] / max(warm['old_cpu_s'], 0.1):.2f}x "
                            f"node 0's CPU; node 0's peak in the move {cold['old_hwm_bytes'] / MB:,.0f} MB against "
                            f"{warm['old_hwm_bytes'] / MB:,.0f} MB")
    if verdicts:
        lines += [""] + [f"- {text}" for text in verdicts]
    lines += ["", copied_text("follow-moves-reading")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return budget_runs_main(BudgetRuns(
        "bench.follow_moves", __doc__.split("\n\n", 1)[0], "follow-moves", SECTION_HEADING, render_section,
        run_budget, (DEFAULT_MESSAGES, DEFAULT_GROUPS, DEFAULT_BODY_BYTES, DEFAULT_BUDGETS),
        ("messages queued on node 0", "groups placed on node 0, then moved",
         "the nodes' record_memory_max_bytes of each run, in bytes (0 = every record warm)")), argv)

if __name__ == "__main__":
    sys.exit(main())
