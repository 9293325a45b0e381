"""Issue 14's bounded forwarding backlogs: what a dead owner's backlog costs the node that holds it, in
memory, with its bodies all in memory (`outbound_memory_max_bytes = 0`, the behaviour before paging)
and under the default budget (32 MiB per owner), and how fast each drains once the owner is back.

    python3 -m bench.outbound_memory [--messages N] [--groups G] [--body-bytes B] [--budgets 0,33554432]
    python3 -m bench.outbound_memory render      # the section again from results/outbound-memory-*.json

One run per budget, each on a fresh 3-node cluster (bench/cluster_nodes.py's `Cluster`: real `grouper node`
processes on 127.0.0.1, fresh data dirs), one durable queue with exclusive groups:
1. a lean consumer on node 1 alone, so new groups are placed there; node 0's lean producer sends 20
   messages per group for G groups, and the consumer receives them: node 1 owns the G groups. The
   consumer leaves and node 1 is killed (SIGKILL); routes stay (owner_failover_ms 0, the default).
2. node 0 is sampled (VmRSS, VmHWM from /proc; its forward backlog figures for node 1 from /metrics),
   then the producer sends N messages of B bytes to those groups on node 0. Every one must be accepted
   (outbound_max_bytes and outbound_total_max_bytes are raised to hold them) and be in node 0's backlog
   for node 1; node 0 is sampled again after a settle.
3. node 0 is killed (SIGKILL) and started again; once its backlog for node 1 is whole again (N messages,
   N journalled) and after a settle, it is sampled: VmHWM is the recovery's peak.
4. node 1 is started again and a lean consumer attaches there; the drain is timed from node 1's "ready"
   to the consumer's last delivery (and to node 0's backlog reaching 0). The consumer checks that
   every message arrives once and in its group's order (the producer's per-group sequence numbers).
Per-message resident bytes = (node 0's VmRSS after the sends - before) / N. The issue's target: the
paged drain at least 0.7x the in-memory drain, both in the same run. The machine is shared (2 cores,
other engineers' tests, a nemesis campaign): every sample carries the 1-minute load average, and the
drain also reports node CPU seconds, which the neighbours change less than wall time.

A benchmark, not a test: it reports and asserts nothing. It prints the run's JSON, writes
results/outbound-memory-<N>[-<tag>].json and rewrites only the section SECTION_HEADING of docs/benchmarks.md,
rendered from every results/outbound-memory-*.json.
"""

from __future__ import annotations

import sys
import time
import urllib.request
from pathlib import Path

from bench import clients, peers
from bench.budget_runs import QUEUE, BudgetRuns, Clients, budget_runs_main, order_check, wait_progress
from bench.cluster_nodes import Cluster, NodeProcess
from bench.machine import load_1m
from bench.report_file import copied_text

SECTION_HEADING = "## Forwarding backlogs: a dead owner's backlog in memory"
HOST = "127.0.0.1"
MB = 1_000_000
MIB = 1 << 20
DEFAULT_MESSAGES = 200_000
DEFAULT_GROUPS = 100
DEFAULT_BODY_BYTES = 1000
DEFAULT_BUDGETS = (0, 32 << 20)  # before (no bound: every body in memory), after (the node's default)
WARM_MESSAGES_PER_GROUP = 20  # the placing sends: enough that the seeded plan names every group
PREFETCH = 100
DRAIN_RATIO_MIN = 0.7  # issue 14: paged drain rate over in-memory drain rate
SETTLE_S = 5.0  # after a phase, before a sample: the journal writer and the allocator are done
METRICS_TIMEOUT_S = 10.0
PLACE_SEED, BACKLOG_SEED = 1, 2  # the placing sends and the backlog are different seeded plans


def log(text: str) -> None:
    print(f"[outbound-memory {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def write_config(path: Path, memory_max_bytes: int, backlog_bytes: int) -> None:
    outbound_max_bytes = max(1 << 30, 2 * backlog_bytes)  # holds the whole backlog: every send accepted
    path.write_text(f"[node]\noutbound_memory_max_bytes = {memory_max_bytes}\n"
                    f"outbound_max_bytes = {outbound_max_bytes}\noutbound_total_max_bytes = {outbound_max_bytes}\n\n"
                    f"[[queue]]\nname = \"{QUEUE}\"\ngroup_policy = \"exclusive\"\ndurable = true\n"
                    "depth_max_messages = 0\ndepth_max_bytes = 0\n")


# ---- what node 0 shows ------------------------------------------------------------------------

def backlog(node: NodeProcess, owner_id: str) -> dict:
    """grouper_forward_backlog_* of `node`'s /metrics for `owner_id`, by name suffix ({}: none)."""
    with urllib.request.urlopen(f"http://{HOST}:{node.http_port}/metrics", timeout=METRICS_TIMEOUT_S) as reply:
        text = reply.read().decode()
    prefix, label = "grouper_forward_backlog_", f'owner="{owner_id}"'
    return {line[len(prefix):].split("{", 1)[0]: int(float(line.rsplit(" ", 1)[1]))
            for line in text.splitlines() if line.startswith(prefix) and label in line}


def sample(node: NodeProcess, owner_id: str) -> dict:
    memory = peers.resident_bytes(node.pid)
    figures = backlog(node, owner_id)
    return {"rss_bytes": memory["VmRSS"], "hwm_bytes": memory["VmHWM"], "cpu_s": round(node.cpu_seconds(), 1),
            "messages": figures.get("messages", 0), "bytes": figures.get("bytes", 0),
            "memory_bytes": figures.get("memory_bytes", 0), "memory_messages": figures.get("memory_messages", 0),
            "journal_bytes": figures.get("journal_bytes", 0),
            "journal_messages": figures.get("journal_messages", 0), "load_1m": load_1m()}


def brief(figures: dict) -> str:
    return (f"RSS {figures['rss_bytes'] / MB:,.1f} MB, HWM {figures['hwm_bytes'] / MB:,.1f} MB, backlog "
            f"{figures['messages']:,} msgs / {figures['bytes'] / MIB:,.1f} MiB, in memory "
            f"{figures['memory_messages']:,} / {figures['memory_bytes'] / MIB:,.1f} MiB, journalled "
            f"{figures['journal_messages']:,}, load {figures['load_1m']}")


# ---- one budget ---------------------------------------------------------------------------------

def run_budget(work_dir: Path, memory_max_bytes: int, messages: int, groups: int, body_bytes: int) -> dict:
    work_dir.mkdir(parents=True)
    config_path = work_dir / "grouper.toml"
    write_config(config_path, memory_max_bytes, messages * body_bytes)
    cluster = Cluster(work_dir, config_path)
    source, owner = cluster.nodes[0], cluster.nodes[1]
    owner_id = cluster.node_ids[1]
    helpers = Clients(work_dir / "clients")
    result: dict = {"memory_max_bytes": memory_max_bytes}
    try:
        cluster.start()
        place = clients.Workload(messages=groups * WARM_MESSAGES_PER_GROUP, groups=groups, prefetch=PREFETCH,
                                 durable=True, consumers=1, body_bytes=body_bytes, seed=PLACE_SEED)
        ready, stop, progress, process, _ = helpers.consumer(owner, place, "place-consumer")
        if not ready.wait(clients.READY_TIMEOUT_S):
            raise RuntimeError("the placing consumer on node 1 did not attach")
        cluster.wait_consumers(QUEUE, {1: 1})
        placed = helpers.send(source, place, "place-producer")
        if placed["accepted"] != place.messages:
            raise RuntimeError(f"placing sends: {placed['accepted']} of {place.messages} accepted: {placed['error']}")
        wait_progress(lambda: progress[0], lambda count: count >= place.messages, "placing sends delivered on node 1")
        stop.set()
        process.join(30)
        owner.kill()
        log(f"budget {memory_max_bytes:,} B: {groups} groups placed on node 1, node 1 killed")

        time.sleep(SETTLE_S)
        result["before"] = sample(source, owner_id)
        log(f"before the sends: {brief(result['before'])}")
        workload = clients.Workload(messages=messages, groups=groups, prefetch=PREFETCH, durable=True, consumers=1,
                                    body_bytes=body_bytes, seed=BACKLOG_SEED)
        started = time.monotonic()
        sent = helpers.send(source, workload, "backlog-producer")
        result["send_s"] = round(time.monotonic() - started, 1)
        result["accepted"] = sent["accepted"]
        if sent["accepted"] != messages:
            raise RuntimeError(f"{sent['accepted']:,} of {messages:,} sends accepted ({sent['rejected']} rejected, "
                               f"{sent['released']} released): {sent['error']}")
        wait_progress(lambda: backlog(source, owner_id).get("journal_messages", 0),
                      lambda count: count >= messages, "node 0's backlog for node 1 journalled", source)
        time.sleep(SETTLE_S)
        result["sent"] = sample(source, owner_id)
        log(f"{messages:,} sent in {result['send_s']} s: {brief(result['sent'])}")

        source.kill()
        restarted = time.monotonic()
        result["restart_ready_s"] = round(source.start_timed(), 1)

        def whole(figures: dict) -> bool:
            return figures.get("messages") == messages and figures.get("journal_messages") == messages
        wait_progress(lambda: backlog(source, owner_id), whole, "node 0 recovers its backlog for node 1", source)
        result["recovered_s"] = round(time.monotonic() - restarted, 1)
        time.sleep(SETTLE_S)
        result["recovered"] = sample(source, owner_id)
        log(f"node 0 killed, restarted, backlog whole in {result['recovered_s']} s: {brief(result['recovered'])}")

        cpu_start_s = source.cpu_seconds()
        result["owner_ready_s"] = round(owner.start_timed(), 1)
        drain_start, drain_start_ns = time.monotonic(), time.monotonic_ns()  # the owner is ready: forwarding starts
        owner_cpu_start_s = owner.cpu_seconds()
        ready, stop, progress, process, result_path = helpers.consumer(owner, workload, "drain-consumer")
        if not ready.wait(clients.READY_TIMEOUT_S):
            raise RuntimeError("the draining consumer on node 1 did not attach")
        result["consumer_attach_s"] = round(time.monotonic() - drain_start, 2)
        forwarded_s, peak_rss_bytes = None, 0

        def delivered() -> int:
            nonlocal forwarded_s, peak_rss_bytes
            peak_rss_bytes = max(peak_rss_bytes, peers.resident_bytes(source.pid)["VmRSS"])
            if forwarded_s is None and not backlog(source, owner_id).get("messages"):
                forwarded_s = time.monotonic() - drain_start
            return progress[0]
        wait_progress(delivered, lambda count: count >= messages, "the drain on node 1", owner)
        time.sleep(1.0)  # a duplicate would arrive now
        stop.set()
        process.join(60)
        record = clients._load(Path(result_path)) or {"count": 0, "groups": [], "seqs": [], "received_ns": [],
                                                       "error": "the draining consumer wrote no result"}
        last_ns = max(record["received_ns"]) if len(record["received_ns"]) else 0
        drain_s = (last_ns - drain_start_ns) / 1e9  # the consumer's clock is this one (CLOCK_MONOTONIC)
        expected = {}
        for group in clients.plan(workload)[0]:
            expected[group] = expected.get(group, 0) + 1
        result["drain"] = {"drain_s": round(drain_s, 2), "msgs_per_s": round(messages / drain_s) if drain_s > 0 else None,
                           "forwarded_s": round(forwarded_s, 2) if forwarded_s is not None else None,
                           "source_cpu_s": round(source.cpu_seconds() - cpu_start_s, 1),
                           "owner_cpu_s": round(owner.cpu_seconds() - owner_cpu_start_s, 1),
                           "source_peak_rss_bytes": peak_rss_bytes, "load_1m": load_1m(),
                           **order_check(record, expected)}
        result["after"] = sample(source, owner_id)
        log(f"drained in {drain_s:.1f} s = {result['drain']['msgs_per_s']:,} msgs/s: {result['drain']}")
    except RuntimeError as error:  # a failed run is a row that says so, not a traceback
        result["failed"] = str(error)
        log(f"budget {memory_max_bytes:,} B failed: {error}")
    finally:
        cluster.stop()
    return result


# ---- the report -------------------------------------------------------------------------------

def render_section(reports: list[dict]) -> str:
    lines = [SECTION_HEADING, "",
             "Generated by `bench/outbound_memory.py` (its header says how). 3 real nodes on 127.0.0.1, a durable "
             "queue with exclusive groups; node 1 owns the groups and is killed, node 0 accepts the messages and "
             "holds them for node 1 (its forward backlog). *budget*: node 0's `outbound_memory_max_bytes` (0: no "
             "bound, every body in memory, as before paging). Resident = node 0's VmRSS, in MB (10^6 bytes); *per "
             "message* = (resident after the sends − before) / messages; *recovery*: node 0 killed (-9) and started "
             "again, seconds until its backlog is whole, then its resident set and VmHWM (the recovery's peak); *bodies held* = the backlog's bodies node 0 "
             "holds, from /metrics; *beyond the bodies held* = (resident growth − those bodies) / messages, what each "
             "paged message costs. Drain: node 1 started again with one consumer (prefetch 100), timed from node "
             "1's ready to the last delivery; node CPU = node 0 + node 1 over the drain. The machine has 2 cores "
             "shared with other engineers' work and a nemesis campaign: the load average is given per row.", "",
             "| messages × body B | groups | budget MiB | resident MB before → after sends "
             "| per message B: all / beyond the bodies held | bodies held MiB / msgs after sends "
             "| recovery: whole after s, resident MB, peak MB | bodies held MiB after recovery | drain msgs/s "
             "| forwarded s | node CPU s (0 + 1) | node 0 peak MB in drain | arrived | load | date, commit |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---|"]
    verdicts = []
    for report in sorted(reports, key=lambda r: (r["messages"], r["date"])):
        rates = {}
        for result in report["results"]:
            head = (f"| {report['messages']:,} × {report['body_bytes']:,} | {report['groups']:,} "
                    f"| {result['memory_max_bytes'] / MIB:,.0f} ")
            changed = sorted(set(report.get("uncommitted_node_files", []))
                             | set(report.get("uncommitted_node_files_at_end", [])))
            when = f"{report['date']}, `{report['commit']}`" + (
                f" + uncommitted {', '.join(changed)}" if changed else
                "" if "uncommitted_node_files" in report else " (tree not checked)")
            if "drain" not in result:
                lines.append(head + f"| failed: {result.get('failed', 'no drain')} | | | | | | | | | | "
                             f"{report['load_start']} | {when} |")
                continue
            before, sent, recovered, drain = result["before"], result["sent"], result["recovered"], result["drain"]
            rates[result["memory_max_bytes"]] = drain
            order = ("all, in order" if not (drain["missing"] or drain["out_of_order"] or drain["duplicates"])
                     else f"missing {drain['missing']}, out of order {drain['out_of_order']}, "
                          f"duplicates {drain['duplicates']}")
            growth_bytes = sent["rss_bytes"] - before["rss_bytes"]
            beyond = round((growth_bytes - sent["memory_bytes"]) / report["messages"])
            lines.append(head + f"| {before['rss_bytes'] / MB:,.1f} → {sent['rss_bytes'] / MB:,.1f} "
                         f"| {round(growth_bytes / report['messages']):,} / {beyond:,} "
                         f"| {sent['memory_bytes'] / MIB:,.1f} / {sent['memory_messages']:,} "
                         f"| {result['recovered_s']}, {recovered['rss_bytes'] / MB:,.1f}, "
                         f"{recovered['hwm_bytes'] / MB:,.1f} | {recovered['memory_bytes'] / MIB:,.1f} "
                         f"| {drain['msgs_per_s']:,} | {drain['forwarded_s']} "
                         f"| {drain['source_cpu_s']} + {drain['owner_cpu_s']} "
                         f"| {drain['source_peak_rss_bytes'] / MB:,.1f} | {order} "
                         f"| {before['load_1m']} → {drain['load_1m']} | {when} |")
        if 0 in rates and len(rates) > 1:
            paged_budget = max(rates)
            in_memory, paged = rates[0], rates[paged_budget]
            ratio = paged["msgs_per_s"] / in_memory["msgs_per_s"]
            cpu = lambda d: report["messages"] / (d["source_cpu_s"] + d["owner_cpu_s"])  # noqa: E731
            command = report.get("command", f"python3 -m bench.outbound_memory --messages {report['messages']}")
            verdicts.append(f"`{command}` ({report['date']}, `{report['commit']}`): paged ({paged_budget / MIB:,.0f} "
                            f"MiB) / in-memory drain = {ratio:.2f} by wall rate, {cpu(paged) / cpu(in_memory):.2f} "
                            f"by messages per node CPU second; target ≥ {DRAIN_RATIO_MIN}: "
                            f"{'**met**' if ratio >= DRAIN_RATIO_MIN else '**missed**'}")
    if verdicts:
        lines += [""] + [f"- {text}" for text in verdicts]
    lines += ["", copied_text("outbound-memory-analysis")]
    lines += ["", copied_text("outbound-memory-method")]
    lines += ["", copied_text("outbound-memory-records")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    return budget_runs_main(BudgetRuns(
        "bench.outbound_memory", __doc__.split("\n\n", 1)[0], "outbound-memory", SECTION_HEADING,
        render_section, run_budget, (DEFAULT_MESSAGES, DEFAULT_GROUPS, DEFAULT_BODY_BYTES, DEFAULT_BUDGETS),
        ("messages in the backlog", "groups node 1 owns",
         "node 0's outbound_memory_max_bytes of each run, in bytes (0 = no bound)")), argv)

if __name__ == "__main__":
    sys.exit(main())
