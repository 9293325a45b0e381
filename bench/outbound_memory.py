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

import argparse
import dataclasses
import datetime
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench import clients, lean, peers
from bench.cluster_nodes import Cluster, NodeProcess
from bench.machine import load_1m
from bench.report_file import commit, write_section

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
SECTION_HEADING = "## Forwarding backlogs: a dead owner's backlog in memory"
RESULTS_DIR = BENCH_DIR / "results"
REPORT_PATH = REPO_ROOT / "docs" / "benchmarks.md"
QUEUE = "backlog"
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
STALL_TIMEOUT_S = 120.0  # a phase that makes no progress for this long fails the run
METRICS_TIMEOUT_S = 10.0
POLL_INTERVAL_S = 0.2
PLACE_SEED, BACKLOG_SEED = 1, 2  # the placing sends and the backlog are different seeded plans


def tree_changes() -> list[str]:
    """Files of node/ that differ from HEAD: the nodes run the working tree, which another engineer may be
    editing, so a run says when its numbers are not HEAD's."""
    status = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", "node"],
                            capture_output=True, text=True).stdout
    return [line[3:] for line in status.splitlines() if line.strip()]


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


def wait_progress(value, done, what: str, node: NodeProcess | None = None) -> None:
    """Poll value() until done(it); fail when it stops changing for STALL_TIMEOUT_S (or the node dies)."""
    last, last_change = None, time.monotonic()
    while True:
        current = value()
        if done(current):
            return
        if node is not None and not node.alive():
            raise RuntimeError(f"{what}: {node.name} exited: {node.log_tail()}")
        if current != last:
            last, last_change = current, time.monotonic()
        elif time.monotonic() - last_change > STALL_TIMEOUT_S:
            raise RuntimeError(f"{what}: stuck at {current} for {STALL_TIMEOUT_S:.0f} s")
        time.sleep(POLL_INTERVAL_S)


# ---- clients (bench/lean.py's, in forked processes) ---------------------------------------------

class Clients:
    def __init__(self, scratch_dir: Path):
        self.dir = scratch_dir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.context = multiprocessing.get_context("fork")

    def send(self, node: NodeProcess, workload: clients.Workload, name: str) -> dict:
        """Send the workload's plan on `node`; what the producer saw (sent, accepted, error...)."""
        result_path = str(self.dir / f"{name}.pickle")
        go = self.context.Event()
        target = peers.Target("amqp", node.url, QUEUE, ((QUEUE,),))
        process = self.context.Process(target=lean.producer, name=name, args=(target, workload, go, result_path))
        process.start()
        go.set()
        process.join()
        return clients._load(Path(result_path)) or {"error": f"{name} wrote no result", "accepted": 0}

    def consumer(self, node: NodeProcess, workload: clients.Workload, name: str):
        """A lean consumer on `node`; returns (ready, stop, progress, process, result_path)."""
        result_path = str(self.dir / f"{name}.pickle")
        ready, stop = self.context.Event(), self.context.Event()
        progress = self.context.RawArray("q", 1)
        target = peers.Target("amqp", node.url, QUEUE, ((QUEUE,),))
        process = self.context.Process(target=lean.consumers, name=name,
                                       args=(target, [0], workload, [ready], stop, progress, [result_path]))
        process.start()
        return ready, stop, progress, process, result_path


def order_check(record: dict, expected_per_group: dict[str, int]) -> dict:
    """Each group's messages must arrive as its plan numbered them, 0, 1, 2 ..., each once."""
    next_seq: dict[str, int] = {}
    out_of_order = duplicates = 0
    for group, seq in zip(record["groups"], record["seqs"]):
        expected = next_seq.get(group, 0)
        if seq == expected:
            next_seq[group] = expected + 1
        elif seq < expected:
            duplicates += 1
        else:
            out_of_order += 1
            next_seq[group] = seq + 1
    missing = sum(max(0, count - next_seq.get(group, 0)) for group, count in expected_per_group.items())
    return {"received": record["count"], "out_of_order": out_of_order, "duplicates": duplicates, "missing": missing,
            "error": record.get("error", "")}


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
    lines += ["", "Where node 0's bytes went (measured by hand on 2026-11-24: gdb on node 0 at `86e52a6`, tracemalloc "
              "on the outbound core alone at `86e52a6`, py-spy on node 0 at `ebd19fc`):",
              "- **A paged message still costs ~450 B of records.** After 200,000 sends under 32 MiB, glibc's "
              "`malloc_stats` showed 64 MB in use of 77 MB taken: of the ~125 MB of growth ~33 MB are the bodies held "
              "and ~90 MB records (Python objects and their tables). The 1,000,000 row grows about as much per message "
              "(432 B), so "
              "the budget bounds bodies, not records: the backlog still grows node memory in step with its length "
              "(the default outbound_max_bytes of 1 GiB per owner is ~1,000,000 such messages, ~0.45 GB of records; "
              "with 100-byte bodies ~10,000,000 messages, several GB). The outbound core's own share, in-process, is "
              "266 B per paged message: the channel's dict slot and (route key, journal name, size) tuple 116 B, a "
              "(queue, group) key tuple 56 B and a group id string 54 B per message, the seq int 32 B; at these "
              "commits each entry's journal name is also a string of its own (~60 B; `a2b4fa7` shares one per channel: "
              "~380 B and ~345 B per paged message there); the journal's index adds 20.5 B (node/store/spans.py).",
              "- **Until `a2b4fa7` a restart loaded every body, whatever the budget.** `Journal.recover` kept the bodies "
              "of outbound names and `recover_outbound` made an Entry of each before `Outbound.ready` paged them: the "
              "recovery's peak was the unbounded run's (VmHWM 434 MB at 200,000, 1,917 MB at 1,000,000, with either budget), and "
              "the freed bodies stayed in glibc's heap (273 MB taken, 63 MB in use; `malloc_trim(0)` through gdb took "
              "VmRSS from 428 to 224 MB), so after a restart the node stayed at the unbounded size. `a2b4fa7` (another "
              "engineer's, committed during these runs; the *uncommitted* rows ran on it in progress) recovers "
              "outbound messages without their bodies: the recovery's peak falls to 220 MB at 200,000 and 671 MB at "
              "1,000,000, still above the live state after the sends (188 and 456 MB): ~0.6 KB per message at its "
              "peak (by the code, recovery holds a bodiless Message and a sort tuple per message before the store "
              "takes them), "
              "and the node is left ~137 MB larger at 1,000,000 than before its restart.",
              "- **The drain is the owner's pace.** py-spy on node 0 during a paged drain (300,000 messages): its "
              "forwarder thread spends its time waiting for the owner's acknowledgements (`_blocking`), and the "
              "read-back (`Journal._read_frames`, `decode_body` on the journal thread) is ~2.5% of all threads' samples; the "
              "paged drain costs node 0 ~9 µs more CPU per message (20.5 s against 11.4 s at 1,000,000) but node 1, "
              "at ~40 µs per message, sets the rate."]
    lines += ["", "Each budget runs on its own fresh cluster, one after the other, so the two drains of a pair are "
              "minutes apart on a machine whose load moves with the neighbours; node CPU per message is the "
              "steadier comparison. The rows at `ebd19fc` and `a2b4fa7` ran from a `git archive` of that commit "
              "(PYTHONPATH on it), so no one's uncommitted edit of node/ could enter them."]
    # measured in-process by bench/outbound_records.py, not by this script's runs
    lines += ["",
              "**Smaller records, a lower recovery peak** (2026-11-24, tracemalloc on the pure cores alone, "
              "1,000,000 messages, each with its own group id string, route key tuple and size int, `python3 -m "
              "bench.outbound_records --per-group K`, before with `--root` on a `git archive` of `20aa88a`). An "
              "outbound entry's record now shares its group's route key tuple and group id string with the other "
              "entries of that group in the channel (kept per owner while any is there, dropped with the last), "
              "and `key_counts` is keyed per owner, so no (owner, key) tuple per group: **291.8 → 171.7 B per "
              "entry** with 100 messages per group, and **388.9 → 374.8 B** with one message per group (a map "
              "keyed by (owner, key) would have cost that case 42 B more than before). What is left per entry is "
              "the seq int, the size int, the record tuple and the channel's dict slot. `recover_outbound` merges "
              "the journal's per-name lists, already in seq order, with `heapq.merge` instead of sorting a tuple "
              "per message, and empties each list as it goes, so a bodiless Message is let go as its record is "
              "made: against an input of 238 MiB of bodiless Messages the **peak falls from 586 to 379 MiB** (one "
              "per group) **and from 494 to 238 MiB** (100 per group), leaving 365 and 173 MiB (379 and 287 "
              "before). Whole-node figures (the table above) were not rerun.",
              "",
              "**No Message per bodiless entry at recovery** (2026-11-24, the same bench and input, 1,000,000 "
              "entries, `python3 -m bench.outbound_records --messages 1000000 --per-group K [--journal DIR]`, before "
              "with `--root` on a `git archive` of `e9c43dd`). `Journal.recover(bodiless_prefix=...)` no longer "
              "returns a bodiless Message per outbound entry: while it scans it keeps each one's (group id, payload "
              "length) by seq, and it gives each outbound name to `recover_outbound` as three parallel arrays (seqs, "
              "group ids, sizes) in seq order, which `recover_outbound` cuts down 4,096 entries at a time as it makes "
              "the records. Its input falls **from 238 to 86 MiB** (the group id strings, which the records keep, and "
              "24 B of arrays per entry), and its peak **from 379 to 369 MiB** with one entry per group (365 MiB "
              "left either way) **and from 238 to 177 MiB** with 100 per group (173 left). From a real journal "
              "(`--journal`: 1,000,000 STOREs of 260-byte bodies, one per group, recovered as runtime does), "
              "`Journal.recover`'s peak falls **from 294 to 244 MiB** and what it hands over from 250 to 105 MiB, "
              "but the whole recovery's peak stays where it was (391 and 390 MiB): it is reached at the end, by the "
              "records and the journal's index, 378 and 386 MiB left. Those 8 MiB are no more memory: the seq and "
              "size ints, taken out of the arrays, are asked for as 32 bytes each where the decoder's were 28 "
              "(tracemalloc at 100,000 entries, by line), and pymalloc gives either 32.",
              "",
              "**Records in arrays** (2026-11-25, `c5d4826`; the same bench, before with `--root` on a `git "
              "archive` of `2467641`). A channel keeps its records as parallel arrays (forward seq, size, route key "
              "id, a flag byte) and its forwarder's line the paged seqs as arrays, not a dict of tuples and a deque "
              "of ints: **171.7 → 23.6 B per entry** with 100 messages per group and **374.8 → 262.8 B** with one "
              "per group (the group's key tuple, id string and dict entries are what is left), and the recovery of "
              "1,000,000 bodiless entries peaks at 87 MiB instead of 177 with 100 per group, leaving 33 MiB instead "
              "of 173. With bodies paged, 1,000 groups: 146.3 → 29.9 B per entry (`python3 -m bench.memory --only "
              "outbound_paged`, the section on queued messages above). The whole node (the table's row at "
              "`ab41801`, `--messages 1000000 --budgets 33554432`, one run at load 4-7): **98 B per message, 64 "
              "beyond the bodies held** (379 and 345 at `a2b4fa7`), and a restart's peak of **354 MB** (671), "
              "leaving 204 MB (593)."]
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True)
class BudgetRuns:
    """A benchmark that runs one scenario per budget, each on a fresh cluster, and renders its section
    from every results file: this script and bench/follow_moves.py."""
    module: str  # e.g. "bench.outbound_memory": runs as `python3 -m <module>`
    description: str
    results_prefix: str  # results/<prefix>-<messages>[-<tag>].json
    section_heading: str
    render: object  # render_section(reports) -> str
    run_budget: object  # run_budget(run_dir, budget, messages, groups, body_bytes) -> dict
    defaults: tuple  # (messages, groups, body_bytes, budgets)
    helps: tuple  # of --messages, --groups, --budgets

    def load_reports(self) -> list[dict]:
        """Every run's results file, in name order."""
        return [json.loads(path.read_text()) for path in sorted(RESULTS_DIR.glob(f"{self.results_prefix}-*.json"))]


def budget_runs_main(bench: BudgetRuns, argv: list[str] | None) -> int:
    def say(text: str) -> None:
        print(f"[{bench.results_prefix} {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)
    messages, groups, body_bytes, budgets = bench.defaults
    parser = argparse.ArgumentParser(description=bench.description)
    parser.add_argument("mode", nargs="?", choices=("run", "render"), default="run")
    parser.add_argument("--messages", type=int, default=messages, help=bench.helps[0])
    parser.add_argument("--groups", type=int, default=groups, help=bench.helps[1])
    parser.add_argument("--body-bytes", type=int, default=body_bytes, help="body of each message")
    parser.add_argument("--budgets", default=",".join(str(b) for b in budgets), help=bench.helps[2])
    parser.add_argument("--work-dir", type=Path, help="where data dirs and node logs go (default: a temporary dir, "
                        "removed after a run where nothing failed)")
    parser.add_argument("--tag", default="", help="appended to the results file's name, so a repeat is kept "
                        "beside the first run instead of replacing it")
    parser.add_argument("--out", type=Path, default=REPORT_PATH, help="markdown file whose section is written")
    args = parser.parse_args(argv)
    if args.mode == "render":
        write_section(args.out, bench.section_heading, bench.render(bench.load_reports()))
        return 0
    try:
        budgets = [int(text) for text in args.budgets.split(",")]
    except ValueError:
        parser.error(f"--budgets must be comma-separated byte counts, got {args.budgets!r}")
    if args.messages < 1 or args.groups < 1 or args.body_bytes < 1 or min(budgets) < 0:
        parser.error("--messages, --groups and --body-bytes must be at least 1, budgets at least 0 bytes")
    # cluster.py starts the `grouper` console script when there is one; an editable install made from
    # another checkout would import that checkout's node package (or none): the nodes run this one
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix=f"grouper-{bench.results_prefix}-"))
    say(f"work dir {work_dir}; load {load_1m()}")
    report = {"command": " ".join([f"python3 -m {bench.module}", *(argv if argv is not None else sys.argv[1:])]),
              "messages": args.messages, "groups": args.groups, "body_bytes": args.body_bytes,
              "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
              "commit": commit(), "uncommitted_node_files": tree_changes(), "load_start": load_1m(),
              "results": []}
    for budget in budgets:
        run_dir = work_dir / f"budget-{budget}"
        shutil.rmtree(run_dir, ignore_errors=True)
        report["results"].append(bench.run_budget(run_dir, budget, args.messages, args.groups, args.body_bytes))
    report["load_end"] = load_1m()
    report["uncommitted_node_files_at_end"] = tree_changes()
    print(json.dumps(report))
    RESULTS_DIR.mkdir(exist_ok=True)
    name = f"{bench.results_prefix}-{args.messages}{'-' + args.tag if args.tag else ''}.json"
    (RESULTS_DIR / name).write_text(json.dumps(report, indent=1) + "\n")
    write_section(args.out, bench.section_heading, bench.render(bench.load_reports()))
    failed = any("failed" in result for result in report["results"])
    if failed:
        say(f"a run failed: its data dirs and node logs are kept in {work_dir}")
    elif args.work_dir is None:
        shutil.rmtree(work_dir, ignore_errors=True)
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    return budget_runs_main(BudgetRuns(
        "bench.outbound_memory", __doc__.split("\n\n", 1)[0], "outbound-memory", SECTION_HEADING,
        render_section, run_budget, (DEFAULT_MESSAGES, DEFAULT_GROUPS, DEFAULT_BODY_BYTES, DEFAULT_BUDGETS),
        ("messages in the backlog", "groups node 1 owns",
         "node 0's outbound_memory_max_bytes of each run, in bytes (0 = no bound)")), argv)

if __name__ == "__main__":
    sys.exit(main())
