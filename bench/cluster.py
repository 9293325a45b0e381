"""Cluster rows for the benchmark: what forwarding costs, how fast a route is decided, and how long
the loss of the raft leader or of a group's owner stops traffic.

    python -m bench.cluster [--messages N] [--json PATH] [--out PATH] [--render-only]

One run starts a single node, then a 3-node cluster, on 127.0.0.1 and runs the phases asked for
(PHASES) in order, each after a bounded wait for a quiet machine; what each phase measures and why
is in docs/benchmarks-method.md. This module owns the run: its options, the order of the phases, the
queues they use, and where the report goes (the section "## Cluster (3 nodes)" of docs/benchmarks.md
and bench/results/cluster-last-run.json). The phases, the clients, the readings and the report are
the modules it imports; it asserts nothing (a benchmark, not a test).
"""

from __future__ import annotations

import argparse
import datetime
import json
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench import phase_log
from bench.cluster_nodes import Cluster
from bench.cluster_phases import STABILITY_S, phase, run_flows, run_local_placement, run_single, run_stability
from bench.cluster_profile import run_profile
from bench.cluster_report import SECTION_HEADING, previous_summary, render_section, strip_bulky, target_results
from bench.decision_latency import HALF_LOAD_DEFAULT_PER_S, run_latency
from bench.failover import KILL_REPEATS, run_leader_kills, run_owner_kills
from bench.machine import LOAD_WAIT_BUDGET_S, LoadGate, load_1m, machine_facts
from bench.node_readings import idle_cpu_pct
from bench.phase_log import log, phase_done
from bench.report_file import commit, write_section
from node.tools.progress import Progress


REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "docs" / "benchmarks.md"
DEFAULT_JSON = REPO_ROOT / "bench" / "results" / "cluster-last-run.json"
PHASES = ("single", "flows", "latency", "leader", "owner", "profile", "stability", "placement")

QUEUES = ("warmup", "a", "b1", "b2", "latency", "background", "leader", "owner", "profile", "stability")


def write_config(path: Path) -> None:
    tables = [f'[[queue]]\nname = "{name}"\ngroup_policy = "exclusive"\ndurable = true\n' for name in QUEUES]
    path.write_text("\n".join(tables))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=20_000, help="messages per throughput row (default 20000)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="raw results")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="markdown file whose cluster section is written")
    parser.add_argument("--repeats", type=int, default=KILL_REPEATS, help="leader and owner kills (default 5)")
    parser.add_argument("--phases", default=",".join(PHASES),
                        help=f"comma-separated subset of {','.join(PHASES)} (default: all)")
    parser.add_argument("--load-wait-budget-s", type=float, default=LOAD_WAIT_BUDGET_S,
                        help=f"all waits for a quiet machine together (default {LOAD_WAIT_BUDGET_S:.0f}; 0: never wait)")
    parser.add_argument("--stability-s", type=float, default=STABILITY_S,
                        help=f"length of the full-load run that counts raft elections (default {STABILITY_S:.0f})")
    parser.add_argument("--work-dir", type=Path, help="node data and logs (default: a new temporary directory)")
    parser.add_argument("--render-only", action="store_true", help="run nothing: write the section from --json")
    args = parser.parse_args(argv)
    if args.render_only:
        write_section(args.out, SECTION_HEADING, render_section(json.loads(args.json.read_text())))
        print(f"wrote the cluster section of {args.out} from {args.json}")
        return 0

    phases = {name.strip() for name in args.phases.split(",") if name.strip()}
    if phases - set(PHASES):
        parser.error(f"unknown phase(s): {', '.join(sorted(phases - set(PHASES)))}")
    with Progress(len(phases), "cluster bench", "phase") as progress:
        phase_log.PROGRESS = progress
        try:
            return run_phases(args, phases)
        finally:
            phase_log.PROGRESS = None


def run_phases(args, phases: set[str]) -> int:
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="grouper-cluster-bench-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    config_path = work_dir / "queues.toml"
    write_config(config_path)
    log(f"work dir {work_dir}; {args.messages} messages per throughput row; load {load_1m():.2f}")
    started = time.monotonic()
    gate = LoadGate(args.load_wait_budget_s)
    report: dict = {"date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"), "commit": commit(),
                    "machine": machine_facts(), "messages": args.messages, "work_dir": str(work_dir)}
    report["flows"] = [run_single(work_dir, config_path, args.messages, gate, report)] if "single" in phases else []
    phase_done(phases, "single")
    cluster = Cluster(work_dir, config_path)
    try:
        cluster.start()
        run_on_cluster(cluster, args, phases, gate, work_dir, report)
    finally:
        cluster.stop()
    if "placement" in phases:
        report["flows"].append(run_local_placement(work_dir, config_path, args.messages, gate))
        phase_done(phases, "placement")
    report["flows"] = [strip_bulky(row) for row in report["flows"]]
    report["duration_s"] = round(time.monotonic() - started, 1)
    report["targets"] = target_results(report)
    report["previous"] = previous_summary(args.json)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1, default=str) + "\n")
    write_section(args.out, SECTION_HEADING, render_section(report))
    log(f"done in {report['duration_s']:.0f} s; targets {report['targets']}; wrote {args.out} and {args.json}")
    return 0


def run_on_cluster(cluster: Cluster, args, phases: set[str], gate: LoadGate, work_dir: Path, report: dict) -> None:
    """The phases asked for that share the started 3-node cluster, in order, their results into `report`."""
    log(f"[cluster] ready; leader node {cluster.leader() + 1}")
    report["idle_cpu_pct_cluster"] = idle_cpu_pct(cluster.nodes)
    log(f"[cluster] idle CPU per node: {report['idle_cpu_pct_cluster']} % of a core")
    if "flows" in phases:
        report["flows"] += run_flows(cluster, work_dir, args.messages, gate)
        phase_done(phases, "flows")
    if "latency" in phases:
        b1 = next((row for row in report["flows"] if row.get("key") == "b1" and row.get("throughput_per_s")), None)
        half_load = round(b1["throughput_per_s"] / 2) if b1 else HALF_LOAD_DEFAULT_PER_S
        report["latency"] = phase(gate, "latency", lambda: run_latency(cluster, work_dir, half_load), cluster)
        log(f"[latency] {json.dumps(report['latency'])}")
        phase_done(phases, "latency")
    if "leader" in phases:
        report["leader_kill"] = phase(gate, "leader kill",
                                      lambda: run_leader_kills(cluster, work_dir, args.repeats), cluster)
        phase_done(phases, "leader")
    if "owner" in phases:
        report["owner_kill"] = phase(gate, "owner kill", lambda: run_owner_kills(cluster, work_dir, args.repeats),
                                     cluster)
        phase_done(phases, "owner")
    if "stability" in phases:
        report["stability"] = phase(gate, "stability", lambda: run_stability(cluster, work_dir, args.stability_s),
                                    cluster)
        log(f"[stability] {json.dumps(report['stability'])}")
        phase_done(phases, "stability")
    if "profile" in phases:
        try:
            report["profile"] = run_profile(cluster, work_dir, args.messages)
        except Exception as error:
            report["profile"] = {"failed": f"{type(error).__name__}: {error}"}
        log(f"[profile] {json.dumps(report['profile'])[:2000]}")
        phase_done(phases, "profile")


if __name__ == "__main__":
    sys.exit(main())
