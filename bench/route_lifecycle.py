"""Routes on a real 3-node cluster: the memory of a million live routes, and groups that come and go.

    python -m bench.route_lifecycle live  [--routes 1000000]
    python -m bench.route_lifecycle churn [--groups 5000000] [--rate-per-s 5000] [--group-timeout-ms 15000]
    python -m bench.route_lifecycle render

What: issue 14's two route targets, measured on `grouper node` processes on 127.0.0.1 (bench/cluster_nodes.py's
Cluster: each node runs its raft member as a child process, `python -m handler.member`):
- live: N distinct groups, one message each, sent through all 3 nodes as fast as they take them; once
  every node's `grouper_routes` (/metrics) is N, the resident set (VmRSS) and peak (VmHWM) of each
  node process and of its member process, from /proc/PID/status. Target: node + member at most 300 MB
  each node with 1,000,000 live routes.
- churn: distinct groups sent at a fixed rate over time with a short group timeout, so the leader's
  reaper expires the idle ones while new ones arrive; every node's route count and resident sets are
  sampled every SAMPLE_INTERVAL_S. Target: 5,000,000 groups with at most 100,000 live at once, every
  new group accepted (refusals 0) and memory flat (growth between the first and last quarter).
How: the lean producer (bench/lean.py) on each node sends groups of its own (`n<node>-<number>`, one
message per group, 100-byte bodies); one consumer per node accepts every delivery at once. The queue
is non-durable with group_policy "shared": a shared group has an owner only while a consumer holds
an unsettled message of it, so once accepted the group has no messages and no owner anywhere, its
route is idle and may expire (exclusive groups keep their owner while the consumer stays attached,
and a route with an owner never expires), and no journal write stands between a send and its route.
The nodes batch each engine turn's new groups into one raft claim. In `live` the default group
timeout (30 minutes) keeps every route live for the measurement.
Why: the route table lives in every node twice (the member's replicated table and the node's
router); bench/route_memory.py measures each copy alone, in-process; this is the whole node.
Writes bench/results/route-lifecycle-<mode>-<count>.json and the section SECTION_HEADING of
docs/benchmarks.md from every such file (`render` rewrites it from them). A benchmark, not a test:
it reports what it saw and asserts nothing.
"""

from __future__ import annotations

import argparse
import datetime
import json
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from bench import clients, peers
from bench.cluster_nodes import Cluster, NodeProcess
from bench.distinct_groups import PREFETCH, consume, produce
from bench.machine import load_1m, machine_facts
from bench.report_file import commit, write_section
from bench.route_lifecycle_report import SECTION_HEADING, mb, render_section

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = REPO_ROOT / "bench" / "results"
DEFAULT_OUT = REPO_ROOT / "docs" / "benchmarks.md"
QUEUE = "routes"
NODES = 3
SAMPLE_INTERVAL_S = 5.0
METRICS_TIMEOUT_S = 10.0
LIVE_WAIT_S = 600.0  # after the producers finish, for every node to know every route
SETTLE_S = 60.0  # live: sampling goes on this long once every node knows every route
RSS_TARGET_BYTES = 300 * 1000 * 1000  # issue 14: each node's resident set with 1,000,000 live routes
LIVE_GROUPS_TARGET = 100_000  # issue 14: live at once while 5,000,000 distinct groups go by
ROUTES_MAX_DEFAULT = 1_000_000  # node setting routes_max's default (node/config/settings.py)


# ---- what the nodes show ----------------------------------------------------------------------

def status_bytes(pid: int) -> dict:
    try:
        values = peers.resident_bytes(pid)
    except OSError:  # the process ended meanwhile: no figures
        values = {}
    return {"rss_bytes": values.get("VmRSS"), "hwm_bytes": values.get("VmHWM")}


def member_pid(node_pid: int) -> int | None:
    """The node's raft member: its child running handler.member."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent == node_pid and b"handler.member" in (entry / "cmdline").read_bytes():
                return int(entry.name)
        except (OSError, ValueError, IndexError):
            continue
    return None


def routes_known(node: NodeProcess) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{node.http_port}/metrics", timeout=METRICS_TIMEOUT_S) as reply:
            for line in reply.read().decode().splitlines():
                if line.startswith("grouper_routes "):
                    return int(float(line.split()[1]))
    except OSError:
        return None
    return None


def sample(nodes: list[NodeProcess], members: list[int | None], started: float, counts) -> dict:
    row = {"t_s": round(time.monotonic() - started, 1), "load_1m": load_1m(), "nodes": []}
    for node, member in zip(nodes, members):
        node_memory, member_memory = status_bytes(node.pid), status_bytes(member) if member else {}
        row["nodes"].append({"routes": routes_known(node), "node": node_memory, "member": member_memory})
    row["sent"] = sum(counts[slot * 3] for slot in range(NODES))
    row["accepted"] = sum(counts[slot * 3 + 1] for slot in range(NODES))
    row["refused"] = sum(counts[slot * 3 + 2] for slot in range(NODES))
    return row


def log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", flush=True)


# ---- one run ----------------------------------------------------------------------------------

def write_config(path: Path, routes_max: int) -> None:
    path.write_text(f"[node]\nroutes_max = {routes_max}\n\n[[queue]]\nname = \"{QUEUE}\"\n"
                    f"group_policy = \"shared\"\ndurable = false\n")


def run(mode: str, groups: int, rate_per_s: int, group_timeout_ms: int, settle_s: float, work_dir: Path) -> dict:
    routes_max = max(ROUTES_MAX_DEFAULT, groups) if mode == "live" else ROUTES_MAX_DEFAULT
    config_path = work_dir / "queues.toml"
    write_config(config_path, routes_max)
    args = ("--group-timeout-ms", str(group_timeout_ms)) if group_timeout_ms else ()
    context = multiprocessing.get_context("fork")
    cluster = Cluster(work_dir, config_path, size=NODES, args=args)
    report = {"mode": mode, "groups": groups, "rate_per_s": rate_per_s, "group_timeout_ms": group_timeout_ms,
              "routes_max": routes_max, "date": datetime.datetime.now(datetime.timezone.utc).strftime(
                  "%Y-%m-%d %H:%M UTC"), "commit": commit(), "machine": machine_facts(), "work_dir": str(work_dir)}
    processes, stop, go = [], context.Event(), context.Event()
    counts, received = context.RawArray("q", NODES * 3), context.RawArray("q", NODES)
    try:
        cluster.start()
        members = [member_pid(node.pid) for node in cluster.nodes]
        log(f"cluster ready; members {members}; load {load_1m():.2f}")
        started = time.monotonic()
        report["at_rest"] = sample(cluster.nodes, members, started, counts)
        addresses = tuple((QUEUE,) for _ in range(NODES))
        readies = [context.Event() for _ in range(NODES)]
        for index, node in enumerate(cluster.nodes):
            target = peers.Target("amqp", node.url, QUEUE, addresses)
            processes.append(context.Process(target=consume, name=f"consumer-node{index + 1}",
                                             args=(target, index, readies[index], stop, received)))
        share = [groups // NODES + (1 if index < groups % NODES else 0) for index in range(NODES)]
        for index, node in enumerate(cluster.nodes):
            target = peers.Target("amqp", node.url, QUEUE, addresses)
            workload = clients.Workload(messages=share[index], groups=1, prefetch=PREFETCH, durable=False,
                                        consumers=NODES, rate_per_s=rate_per_s // NODES)
            processes.append(context.Process(target=produce, name=f"producer-node{index + 1}",
                                             args=(target, workload, f"n{index + 1}-", counts, index, go,
                                                   str(work_dir / f"producer{index}.pickle"))))
        for process in processes:
            process.start()
        for ready in readies:
            if not ready.wait(clients.READY_TIMEOUT_S):
                raise RuntimeError(f"a consumer did not attach within {clients.READY_TIMEOUT_S} s")
        report["load_start"] = load_1m()
        started = time.monotonic()
        go.set()
        samples = [sample(cluster.nodes, members, started, counts)]
        producers = [process for process in processes if process.name.startswith("producer")]
        wait_deadline = settle_deadline = None
        while True:
            time.sleep(SAMPLE_INTERVAL_S)
            row = sample(cluster.nodes, members, started, counts)
            samples.append(row)
            routes = [node["routes"] for node in row["nodes"]]
            log(f"t={row['t_s']:.0f}s sent {row['sent']} accepted {row['accepted']} refused {row['refused']} "
                f"routes {routes} node+member MB "
                f"{[mb((n['node']['rss_bytes'] or 0) + (n['member'].get('rss_bytes') or 0)) for n in row['nodes']]} "
                f"load {row['load_1m']}")
            if any(process.is_alive() for process in producers):
                continue
            if mode == "churn":
                break
            wait_deadline = wait_deadline or time.monotonic() + LIVE_WAIT_S
            if settle_deadline is None and (all(count == row["accepted"] for count in routes)
                                            or time.monotonic() > wait_deadline):
                # the member compacts its raft log into a snapshot (a forked child) some time after
                # the routes: the figure that counts is the one after it, so sampling goes on a while
                report["all_known_sample"] = len(samples) - 1
                settle_deadline = time.monotonic() + settle_s
            if settle_deadline is not None and time.monotonic() >= settle_deadline:
                break
        report["duration_s"] = round(time.monotonic() - started, 1)
        report["load_end"] = load_1m()
        report["received"] = sum(received)
        report["producers"] = [clients._load(work_dir / f"producer{index}.pickle") for index in range(NODES)]
        report["samples"] = samples
        report["summary"] = summarize(mode, samples, report)
    finally:
        go.set()
        stop.set()
        for process in processes:
            process.join(clients.JOIN_TIMEOUT_S)
            if process.is_alive():
                process.terminate()
                process.join(5)
        cluster.stop()
    return report


def summarize(mode: str, samples: list[dict], report: dict) -> dict:
    last = samples[-1]
    refused = sum(p["rejected"] + p["released"] for p in report["producers"] if p)
    accepted = sum(p["accepted"] for p in report["producers"] if p)
    errors = [p["error"] for p in report["producers"] if p and p["error"]]
    per_node = []
    for index, node in enumerate(last["nodes"]):
        node_rss, member_rss = node["node"]["rss_bytes"] or 0, node["member"].get("rss_bytes") or 0
        per_node.append({"node": index + 1, "routes": node["routes"], "node_rss_bytes": node_rss,
                         "node_hwm_bytes": node["node"]["hwm_bytes"], "member_rss_bytes": member_rss,
                         "member_hwm_bytes": node["member"].get("hwm_bytes"),
                         "together_rss_bytes": node_rss + member_rss})
    summary = {"accepted": accepted, "refused": refused, "errors": errors, "per_node": per_node,
               "max_routes": max((n["routes"] or 0) for row in samples for n in row["nodes"]),
               "duration_s": report["duration_s"], "groups_per_s": groups_per_s(report["producers"], accepted)}
    if mode == "live":
        known = samples[report.get("all_known_sample", len(samples) - 1)]
        summary["together_rss_bytes_when_all_known"] = [
            (n["node"]["rss_bytes"] or 0) + (n["member"].get("rss_bytes") or 0) for n in known["nodes"]]
        summary["settled_s"] = round(last["t_s"] - known["t_s"], 1)
        summary["every_node_knows_every_route"] = all(n["routes"] == accepted for n in per_node)
        summary["max_together_rss_bytes"] = max(n["together_rss_bytes"] for n in per_node)
        summary["within_target"] = summary["max_together_rss_bytes"] <= RSS_TARGET_BYTES
        return summary
    # flat: every node's node+member resident set, mean over the first and over the last quarter
    quarter = max(1, len(samples) // 4)

    def together(row, index):
        node = row["nodes"][index]
        return (node["node"]["rss_bytes"] or 0) + (node["member"].get("rss_bytes") or 0)

    summary["growth_first_to_last_quarter_bytes"] = [
        round(sum(together(r, i) for r in samples[-quarter:]) / quarter
              - sum(together(r, i) for r in samples[1:1 + quarter]) / quarter) for i in range(NODES)]
    middle = samples[len(samples) // 2]
    summary["rss_together_bytes"] = {"start": [together(samples[1], i) for i in range(NODES)],
                                     "mid": [together(middle, i) for i in range(NODES)],
                                     "end": [together(last, i) for i in range(NODES)]}
    summary["live_within_target"] = summary["max_routes"] <= LIVE_GROUPS_TARGET
    return summary


def groups_per_s(producers: list, accepted: int) -> int | None:
    """Accepted groups over the producers' sending time (first send to last, all of them together)."""
    firsts = [p["first_send_ns"] for p in producers if p and p.get("first_send_ns")]
    lasts = [p["last_send_ns"] for p in producers if p and p.get("last_send_ns")]
    if not firsts or not lasts or max(lasts) <= min(firsts):
        return None
    return round(accepted / ((max(lasts) - min(firsts)) / 1e9))


# ---- the report -------------------------------------------------------------------------------

def result_path(mode: str, groups: int) -> Path:
    return RESULTS_DIR / f"route-lifecycle-{mode}-{groups}.json"


def render(out: Path) -> None:
    reports = [json.loads(path.read_text()) for path in sorted(RESULTS_DIR.glob("route-lifecycle-*.json"))]
    write_section(out, SECTION_HEADING, render_section(reports))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("mode", choices=("live", "churn", "render"))
    parser.add_argument("--routes", type=int, default=1_000_000, help="live: distinct groups sent (default 1000000)")
    parser.add_argument("--groups", type=int, default=5_000_000, help="churn: distinct groups sent (default 5000000)")
    parser.add_argument("--rate-per-s", type=int, default=5000,
                        help="churn: new groups per second, all nodes together (default 5000; live: as fast as taken)")
    parser.add_argument("--group-timeout-ms", type=int, default=15_000,
                        help="churn: the nodes' group_timeout_ms (default 15000); live keeps the node default")
    parser.add_argument("--settle-s", type=float, default=SETTLE_S,
                        help=f"live: sampling goes on this long once every node knows every route (default {SETTLE_S:g})")
    parser.add_argument("--work-dir", type=Path, help="node data and logs (default: a new temporary directory)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="markdown file whose section is written")
    args = parser.parse_args(argv)
    if args.mode == "render":
        render(args.out)
        return 0
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="grouper-route-lifecycle-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    if args.mode == "live":
        groups, rate_per_s, group_timeout_ms = args.routes, 0, 0
    else:
        groups, rate_per_s, group_timeout_ms = args.groups, args.rate_per_s, args.group_timeout_ms
    log(f"{args.mode}: {groups} groups; work dir {work_dir}; load {load_1m():.2f}; pid {os.getpid()}")
    report = run(args.mode, groups, rate_per_s, group_timeout_ms, args.settle_s, work_dir)
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = result_path(args.mode, groups)
    path.write_text(json.dumps(report, indent=1) + "\n")
    render(args.out)
    log(f"summary {json.dumps(report['summary'])}; wrote {path} and {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
