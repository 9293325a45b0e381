"""Issue 14's paging targets on one real `grouper node`: its resident set under a large durable backlog,
and how fast a paged backlog drains next to one held in memory.

    python3 -m bench.paging recovered [--messages N] [--groups G] [--budget-bytes B]  # targets 1 and 2
    python3 -m bench.paging sent [--messages N] [--groups G] [--budget-bytes B]       # target 2, built by sends
    python3 -m bench.paging drain [--messages N] [--groups G] [--small-budget-bytes B] [--large-budget-bytes B]
    python3 -m bench.paging render                                                     # the section from results/

What and how:
- recovered: a journal of N durable 100-byte messages in G groups, none delivered, written with the node's
  own record encoders (bench/recovery.py's writer), then one `grouper node` recovers it under
  `message_memory_max_bytes` = B (default the node's 256 MiB). Once it is ready (its "ready" line; /readyz
  answers 200 from then on) and the queue's depth on /metrics is N, and again after a settle, the run reads
  the node's VmRSS and VmHWM from /proc and the queue's resident and paged bytes from /metrics. Issue 14:
  1,000,000 messages each in its own group at most 200 MB resident; 10,000,000 in 1,000 groups at most
  500 MB.
- sent: the same backlog built live by bench/lean.py's producer on an empty node (recovery and live
  sends page along different paths, so both are shown). Sends take this machine minutes per million.
- drain: the same recovered backlog drained twice by 4 lean consumers (bench/distinct_groups.py's
  counting consumers, prefetch 100), once under a budget that holds every body and once under a small
  one (default 8 MiB) that pages most of them; each drain is timed from the consumers' attach to the
  last delivery, and the node's CPU seconds are read over the same span. Target: paged rate at least
  0.7x the in-memory rate, both measured in the same run.
Why real nodes and /proc: the targets are about the node process as deployed (interpreter, engine,
journal writer thread, allocator), which bench/memory.py's in-process figures cannot show. Never a
test: the full sizes take minutes to write, recover and drain. Each run writes
results/paging-<mode>-<messages>.json; the section "Paging: node memory and paged drains" of
docs/benchmarks.md is rendered from all of them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from bench import clients, lean, peers, recovery
from bench.cluster_nodes import NodeProcess
from bench.distinct_groups import CountingConsumers
from bench.report_file import commit, write_section

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
SECTION_HEADING = "## Paging: node memory and paged drains"
RESULTS_DIR = BENCH_DIR / "results"
REPORT_PATH = REPO_ROOT / "docs" / "benchmarks.md"
QUEUE = recovery.QUEUE  # the queue the generated journal declares (durable, exclusive groups)
MB = 1_000_000  # the targets are in MB (10^6 bytes)
MIB = 1 << 20
RSS_TARGET_OWN_GROUPS_MB = 200  # issue 14: 1,000,000 messages, each in its own group
RSS_TARGET_SHARED_GROUPS_MB = 500  # issue 14: 10,000,000 messages in 1,000 groups
DRAIN_RATIO_MIN = 0.7  # issue 14: paged drain rate over in-memory drain rate
DEFAULT_BUDGET_BYTES = 256 << 20  # the node's message_memory_max_bytes default (node/config/settings.py)
DEFAULT_RECORD_BUDGET_BYTES = 64 << 20  # the node's record_memory_max_bytes default (node/config/settings.py)
SMALL_BUDGET_BYTES = 8 << 20
LARGE_BUDGET_BYTES = 4 << 30  # holds any backlog this script drains in memory
CONSUMERS = 4
PREFETCH = 100
SETTLE_S = 10.0  # after ready: the allocator and the pager have finished their work
READY_TIMEOUT_S = 3600.0  # a node not ready (or a backlog not built/drained) within this is a failure
STALL_TIMEOUT_S = 120.0  # a drain or build that makes no progress for this long is a failure
POLL_INTERVAL_S = 0.05


def log(text: str) -> None:
    print(f"[paging {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def load_1m() -> float:
    return round(os.getloadavg()[0], 2)


def metric(metrics: str, name: str) -> int | None:
    prefix = f'{name}{{queue="{QUEUE}"}} '
    for line in metrics.splitlines():
        if line.startswith(prefix):
            return int(float(line[len(prefix):]))
    return None


class Node(NodeProcess):
    """One `grouper node` on a data dir (a journal recovery.py wrote, or an empty one), with a config that
    sets the node's memory budgets; bench/cluster_nodes.py's node otherwise (output in node-<budget>/node.log)."""

    def __init__(self, data_dir: Path, budget_bytes: int, declare_queue: bool = False,
                 record_budget_bytes: int = DEFAULT_RECORD_BUDGET_BYTES):
        config_path = data_dir.parent / f"node-{budget_bytes}.toml"
        config = (f"[node]\nmessage_memory_max_bytes = {budget_bytes}\n"
                  f"record_memory_max_bytes = {record_budget_bytes}\n")
        if declare_queue:  # an empty data dir (`sent`): the queue a recovered journal declares, without depth limits
            config += (f"\n[[queue]]\nname = \"{QUEUE}\"\ndurable = true\ngroup_policy = \"exclusive\"\n"
                       "depth_max_messages = 0\ndepth_max_bytes = 0\ngroups_max = 0\n")
        config_path.write_text(config)
        super().__init__(f"node-{budget_bytes}", data_dir.parent, config_path, data_dir=data_dir,
                         start_timeout_s=READY_TIMEOUT_S)

    def sample(self) -> dict:
        metrics = recovery.http_get(self.http_port, "/metrics")[1]
        pid = self.process.pid
        memory = peers.resident_bytes(pid)
        return {"rss_mb": round(memory["VmRSS"] / MB, 1), "peak_rss_mb": round(memory["VmHWM"] / MB, 1),
                "node_cpu_s": round(recovery.cpu_seconds(pid), 1),
                "depth": metric(metrics, "grouper_queue_depth_messages"),
                "resident_body_mib": round((metric(metrics, "grouper_queue_resident_bytes") or 0) / MIB, 1),
                "paged_body_mib": round((metric(metrics, "grouper_queue_paged_bytes") or 0) / MIB, 1),
                "cold": metric(metrics, "grouper_queue_cold_messages"),
                "groups": metric(metrics, "grouper_queue_groups"), "load_1m": load_1m()}


def write_backlog(data_dir: Path, messages: int, groups: int) -> float:
    """recovery.py's journal writer; returns the journal's MiB."""
    shutil.rmtree(data_dir, ignore_errors=True)
    started = time.monotonic()
    journal_bytes = recovery.write_journal(data_dir, messages, groups, 100)
    log(f"wrote {journal_bytes / MIB:,.0f} MiB of journal ({messages:,} messages, {groups:,} groups) "
        f"in {time.monotonic() - started:.0f} s")
    return round(journal_bytes / MIB, 1)


def run_recovered(work_dir: Path, messages: int, groups: int, budget_bytes: int, record_budget_bytes: int) -> dict:
    result = {"journal_mib": write_backlog(work_dir / "data", messages, groups)}
    node = Node(work_dir / "data", budget_bytes, record_budget_bytes=record_budget_bytes)
    try:
        result["ready_s"] = round(node.start_timed(), 1)
        result["ready"] = node.sample()
        log(f"ready in {result['ready_s']} s: {result['ready']}")
        time.sleep(SETTLE_S)
        result["settled"] = node.sample()
        log(f"after {SETTLE_S:.0f} s: {result['settled']}")
        if result["settled"]["depth"] != messages:
            result["failed"] = f"the queue's depth was {result['settled']['depth']}, not {messages}"
    finally:
        node.stop()
    return result


def run_sent(work_dir: Path, messages: int, groups: int, budget_bytes: int, record_budget_bytes: int) -> dict:
    data_dir = work_dir / "data"
    shutil.rmtree(data_dir, ignore_errors=True)
    data_dir.mkdir(parents=True)
    node = Node(data_dir, budget_bytes, declare_queue=True, record_budget_bytes=record_budget_bytes)
    context = multiprocessing.get_context("fork")
    result: dict = {}
    producer = None
    try:
        node.start()
        result["at_rest"] = node.sample()
        target = peers.Target("amqp", node.url, QUEUE, ((QUEUE,),))
        workload = clients.Workload(messages=messages, groups=groups, prefetch=PREFETCH, durable=True, consumers=1)
        go = context.Event()
        producer = context.Process(target=lean.producer, name="producer",
                                   args=(target, workload, go, str(work_dir / "producer.pickle")))
        producer.start()
        started = time.monotonic()
        go.set()
        depth, last_depth, last_progress = 0, -1, time.monotonic()
        while depth != messages:
            time.sleep(1.0)
            depth = node.sample()["depth"] or 0
            if depth != last_depth:
                last_depth, last_progress = depth, time.monotonic()
            elif time.monotonic() - last_progress > STALL_TIMEOUT_S:
                raise RuntimeError(f"the backlog stopped growing at {depth:,} of {messages:,}; see {node.log_path}")
        result["build_s"] = round(time.monotonic() - started, 1)
        result["built"] = node.sample()
        log(f"{messages:,} sent in {result['build_s']} s: {result['built']}")
        time.sleep(SETTLE_S)
        result["settled"] = node.sample()
        log(f"after {SETTLE_S:.0f} s: {result['settled']}")
    finally:
        if producer is not None:
            producer.join(timeout=60)
            if producer.is_alive():
                producer.kill()
        node.stop()
    return result


def consume(target, ready, stop, received) -> None:
    """CONSUMERS counting consumers in one process; `received` holds each one's count."""
    group = CountingConsumers(target, list(range(CONSUMERS)), PREFETCH)
    lean._attach(group, {index: ready for index in range(CONSUMERS)}, clients.READY_TIMEOUT_S)
    while not stop.is_set():
        group.pass_once(lean.SELECT_TIMEOUT_S)
        for consumer in group.consumers:
            received[consumer.index] = consumer.count
    group.pump.close_all()


def drain_once(work_dir: Path, messages: int, groups: int, budget_bytes: int) -> dict:
    result = {"budget_bytes": budget_bytes, "journal_mib": write_backlog(work_dir / "data", messages, groups)}
    node = Node(work_dir / "data", budget_bytes)
    context = multiprocessing.get_context("fork")
    stop, ready, received = context.Event(), context.Event(), context.RawArray("q", CONSUMERS)
    consumer = None
    try:
        result["ready_s"] = round(node.start_timed(), 1)
        time.sleep(SETTLE_S)
        result["before"] = node.sample()
        log(f"budget {budget_bytes:,} B, before the drain: {result['before']}")
        if result["before"]["depth"] != messages:
            raise RuntimeError(f"the queue's depth was {result['before']['depth']}, not {messages}")
        addresses = tuple((QUEUE,) for _ in range(CONSUMERS))
        consumer = context.Process(target=consume, name="consumers",
                                   args=(peers.Target("amqp", node.url, QUEUE, addresses), ready, stop, received))
        consumer.start()
        if not ready.wait(clients.READY_TIMEOUT_S):
            raise RuntimeError(f"the consumers did not attach within {clients.READY_TIMEOUT_S} s")
        started, cpu_start_s = time.monotonic(), recovery.cpu_seconds(node.process.pid)
        peak_rss_mb, total, last_total, last_progress = 0.0, 0, -1, started
        while total < messages:
            time.sleep(POLL_INTERVAL_S)
            total = sum(received)
            now = time.monotonic()
            if total != last_total:
                last_total, last_progress = total, now
                peak_rss_mb = max(peak_rss_mb, peers.resident_bytes(node.process.pid)["VmRSS"] / MB)
            elif now - last_progress > STALL_TIMEOUT_S:
                raise RuntimeError(f"the drain stalled at {total:,} of {messages:,}; see {node.log_path}")
        drain_s = time.monotonic() - started
        cpu_s = recovery.cpu_seconds(node.process.pid) - cpu_start_s
        result.update({"drain_s": round(drain_s, 2), "received": total, "msgs_per_s": round(total / drain_s),
                       "node_cpu_s": round(cpu_s, 1), "msgs_per_node_cpu_s": round(total / cpu_s) if cpu_s else None,
                       "peak_rss_during_mb": round(peak_rss_mb, 1)})
        time.sleep(1.0)
        result["after"] = node.sample()
        log(f"budget {budget_bytes:,} B: {total:,} in {drain_s:.1f} s = {result['msgs_per_s']:,}/s; "
            f"after: {result['after']}")
        if result["after"]["depth"] != 0:
            result["failed"] = f"the queue's depth after the drain was {result['after']['depth']}, not 0"
    finally:
        stop.set()
        if consumer is not None:
            consumer.join(timeout=30)
            if consumer.is_alive():
                consumer.kill()
        node.stop()
    return result


def run_drain(work_dir: Path, messages: int, groups: int, large_budget_bytes: int, small_budget_bytes: int) -> dict:
    in_memory = drain_once(work_dir, messages, groups, large_budget_bytes)
    paged = drain_once(work_dir, messages, groups, small_budget_bytes)
    result = {"in_memory": in_memory, "paged": paged, "ratio": round(paged["msgs_per_s"] / in_memory["msgs_per_s"], 3)}
    if in_memory.get("msgs_per_node_cpu_s") and paged.get("msgs_per_node_cpu_s"):
        result["cpu_ratio"] = round(paged["msgs_per_node_cpu_s"] / in_memory["msgs_per_node_cpu_s"], 3)
    return result


# ---- the report -------------------------------------------------------------------------------

def verdict(met: bool) -> str:
    return "**met**" if met else "**missed**"


def render_section(reports: list[dict]) -> str:
    lines = [SECTION_HEADING, "",
             "Generated by `bench/paging.py` (its header says how). One `grouper node`, one durable queue with "
             "exclusive groups, 100-byte bodies. *recovered*: a journal written with the node's own record encoders, "
             "then recovered by the node under `message_memory_max_bytes`; *sent*: the backlog sent live by the lean "
             "producer. Resident = VmRSS of the node process, in MB (10^6 bytes, as the issue states its targets), "
             "once ready and again after a 10 s settle; peak = VmHWM. The machine has 2 cores shared with other "
             "engineers' work and a nemesis campaign: the load average is given for every row.", "",
             "| mode | messages | groups | bodies / records budget MiB | resident MB ready → settled "
             "| bytes per message | peak MB | bodies in RAM / paged MiB | cold messages | ready or build s | load "
             "| target | date, commit |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    memory = [r for r in reports if r["mode"] in ("recovered", "sent")]
    drains = [r for r in reports if r["mode"] == "drain"]
    for report in sorted(memory, key=lambda r: (r["mode"], r["messages"], r["groups"], -r["budget_bytes"])):
        result = report["result"]
        own_groups = report["groups"] >= report["messages"]
        target_mb = RSS_TARGET_OWN_GROUPS_MB if own_groups else RSS_TARGET_SHARED_GROUPS_MB
        full = 1_000_000 if own_groups else 10_000_000
        records = report.get("record_budget_bytes")  # absent: a run from before cold tails
        records_text = "none" if records is None else ("0" if not records else f"{records / MIB:,.0f}")
        head = (f"| {report['mode']} | {report['messages']:,} | {report['groups']:,} "
                f"| {report['budget_bytes'] / MIB:,.0f} / {records_text} ")
        if "failed" in result and "settled" not in result:
            lines.append(head + f"| failed: {result['failed']} | | | | | | {report['load_start']} | | "
                         f"{report['date']}, `{report['commit']}` |")
            continue
        first = result.get("ready") or result.get("built")
        settled = result["settled"]
        seconds = result.get("ready_s", result.get("build_s"))
        met = settled["rss_mb"] <= target_mb and "failed" not in result
        if report["messages"] < full:  # a smaller backlog is no verdict on the full one: project it instead
            projected_mb = settled["rss_mb"] * full / report["messages"]
            judged = f"≤ {target_mb} MB at {full:,}: scaled run, ~{projected_mb:,.0f} MB at its bytes per message"
        else:
            judged = f"≤ {target_mb} MB: {verdict(met)}"
        lines.append(head + f"| {first['rss_mb']:,.1f} → {settled['rss_mb']:,.1f} "
                     f"| {settled['rss_mb'] * MB / report['messages']:,.0f} | {settled['peak_rss_mb']:,.1f} "
                     f"| {settled['resident_body_mib']:,.1f} / {settled['paged_body_mib']:,.1f} "
                     f"| {settled.get('cold') or 0:,} | {seconds} "
                     f"| {report['load_start']} → {settled['load_1m']} | {judged} | {report['date']}, `{report['commit']}` |")
    if memory:
        lines += ["", "Bytes per message = settled resident set / messages, the node's ~80 MB at rest included. "
                  "*bodies / records budget*: `message_memory_max_bytes` / `record_memory_max_bytes` (none: a run "
                  "from before cold tails, when every queued message kept its record in memory). Where the bytes "
                  "went before: every queued message, paged or not, cost two Python records, the dispatch core's "
                  "(Message, seq, lane slot: ~163 B in 1,000 groups, ~427 B with a group of its own) and the "
                  "journal index's (a dict entry seq → (offset, length), ~166 B), so 10,000,000 messages were "
                  "~3.3 GB before any body. Now, past the record budget, a queue's newest messages are cold "
                  "(node/core/dispatch/cold.py): the core only counts them, and the journal's packed index "
                  "(node/store/spans.py) holds each in a 20.5-byte entry, everything else in the journal until "
                  "dispatch nears them; 10,000,000 such messages are ~205 MB, and the warm part stays within the budget "
                  "(64 MiB by default, ~400,000 messages in 1,000 groups, ~160,000 groups of their own). "
                  "A recovery reads only the STOREs' headers and leaves the backlog cold, then reads the "
                  "oldest records back up to the budget before the node serves."]
    if drains:
        lines += ["", "Paged drains: the same recovered backlog drained by 4 lean consumers (prefetch 100, one "
                  "process), once under a budget that holds every body and once under a small one. Rate = messages "
                  "/ (last delivery − consumers attached); node CPU is the node process's over the same span, which "
                  "the neighbours' load does not change as much as the wall time.", "",
                  "| messages | groups | budget MiB | paged MiB before | msgs/s | node CPU s | msgs per node CPU s "
                  "| peak resident MB | load | date, commit |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
        verdicts = []
        for report in sorted(drains, key=lambda r: (r["messages"], r["date"])):
            result = report["result"]
            if "failed" in result and "paged" not in result:
                lines.append(f"| {report['messages']:,} | {report['groups']:,} | failed: {result['failed']} "
                             f"| | | | | | {report['load_start']} | {report['date']}, `{report['commit']}` |")
                continue
            for key in ("in_memory", "paged"):
                row = result[key]
                lines.append(f"| {report['messages']:,} | {report['groups']:,} | {row['budget_bytes'] / MIB:,.0f} "
                             f"| {row['before']['paged_body_mib']:,.1f} | {row['msgs_per_s']:,} | {row['node_cpu_s']} "
                             f"| {row['msgs_per_node_cpu_s']:,} | {row['peak_rss_during_mb']:,.1f} "
                             f"| {row['before']['load_1m']} → {row['after']['load_1m']} "
                             f"| {report['date']}, `{report['commit']}` |")
            verdicts.append(f"{report['messages']:,} messages: paged / in-memory = {result['ratio']} by wall rate"
                            + (f", {result['cpu_ratio']} by node CPU" if "cpu_ratio" in result else "")
                            + f"; target ≥ {DRAIN_RATIO_MIN}: {verdict(result['ratio'] >= DRAIN_RATIO_MIN)}")
        lines += [""] + [f"- {text}" for text in verdicts]
        lines += ["", "The two drains of a pair run a minute or two apart on a machine whose load swings between 5 "
                  "and 15, so their wall rates move with the neighbours as much as with paging; messages per node "
                  "CPU second are the steadier comparison (the node's CPU over each drain includes its journal "
                  "thread's reads of paged bodies)."]
    return "\n".join(lines) + "\n"


def load_reports() -> list[dict]:
    return [json.loads(path.read_text()) for path in sorted(RESULTS_DIR.glob("paging-*.json"))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("mode", choices=("recovered", "sent", "drain", "render"))
    parser.add_argument("--messages", type=int, help="messages in the backlog (default: 1,000,000 for recovered "
                        "and sent, 500,000 for drain)")
    parser.add_argument("--groups", type=int, help="groups they are spread over (default: one per message for "
                        "recovered, 1,000 otherwise)")
    parser.add_argument("--budget-bytes", type=int, default=DEFAULT_BUDGET_BYTES,
                        help="the node's message_memory_max_bytes (recovered, sent; default 256 MiB)")
    parser.add_argument("--record-budget-bytes", type=int, default=DEFAULT_RECORD_BUDGET_BYTES,
                        help="the node's record_memory_max_bytes (recovered, sent; default 64 MiB; 0: every record "
                        "in memory, as before cold tails)")
    parser.add_argument("--small-budget-bytes", type=int, default=SMALL_BUDGET_BYTES, help="drain: the paged run's")
    parser.add_argument("--large-budget-bytes", type=int, default=LARGE_BUDGET_BYTES, help="drain: the in-memory run's")
    parser.add_argument("--work-dir", type=Path, help="where data dirs and node logs go (default: a temporary dir)")
    parser.add_argument("--tag", default="", help="appended to the results file's name, so a repeat is kept beside "
                        "the first run instead of replacing it")
    parser.add_argument("--out", type=Path, default=REPORT_PATH, help="markdown file whose section is written")
    args = parser.parse_args(argv)
    if args.mode == "render":
        write_section(args.out, SECTION_HEADING, render_section(load_reports()))
        return 0
    messages = args.messages or (500_000 if args.mode == "drain" else 1_000_000)
    groups = args.groups or (messages if args.mode == "recovered" else 1_000)
    if messages < 1 or groups < 1 or min(args.budget_bytes, args.small_budget_bytes, args.large_budget_bytes) < 0:
        parser.error("--messages and --groups must be at least 1, budgets at least 0 bytes")
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="grouper-paging-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    log(f"work dir {work_dir}; load {load_1m()}")
    report = {"mode": args.mode, "messages": messages, "groups": groups, "budget_bytes": args.budget_bytes,
              "record_budget_bytes": args.record_budget_bytes,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "commit": commit(), "load_start": load_1m()}
    try:
        if args.mode == "recovered":
            report["result"] = run_recovered(work_dir, messages, groups, args.budget_bytes, args.record_budget_bytes)
        elif args.mode == "sent":
            report["result"] = run_sent(work_dir, messages, groups, args.budget_bytes, args.record_budget_bytes)
        else:
            report["result"] = run_drain(work_dir, messages, groups, args.large_budget_bytes, args.small_budget_bytes)
    except RuntimeError as error:  # recorded as a failed row: a benchmark reports failures, not tracebacks
        report["result"] = {"failed": str(error)}
    report["load_end"] = load_1m()
    print(json.dumps(report))
    RESULTS_DIR.mkdir(exist_ok=True)
    suffix = f"-{groups}g" if args.mode != "drain" else ""
    if args.mode != "drain" and args.budget_bytes != DEFAULT_BUDGET_BYTES:
        suffix += f"-{args.budget_bytes}b"  # a run under another budget is a row of its own, not a replacement
    if args.tag:
        suffix += f"-{args.tag}"
    (RESULTS_DIR / f"paging-{args.mode}-{messages}{suffix}.json").write_text(json.dumps(report, indent=1) + "\n")
    write_section(args.out, SECTION_HEADING, render_section(load_reports()))
    if args.work_dir is None:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 1 if "failed" in report["result"] else 0


if __name__ == "__main__":
    sys.exit(main())
