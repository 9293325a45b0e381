"""Benchmarks that run one scenario per budget, each on a fresh 3-node cluster, and render their section
of docs/benchmarks.md from every results file (bench/outbound_memory.py and bench/follow_moves.py):
the command line they share, their results files (results/<prefix>-<messages>[-<tag>].json, with the
node/ files that differed from HEAD at the start and the end of the run), and the clients and checks
of their scenarios: bench/lean.py's producer and consumer in forked processes, a wait that fails when
progress stalls, and the per-group order check. Runs no scenario itself."""

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
from pathlib import Path

from bench import clients, lean, peers
from bench.cluster_nodes import NodeProcess
from bench.machine import load_1m
from bench.report_file import commit, write_section

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
REPORT_PATH = REPO_ROOT / "docs" / "benchmarks.md"
QUEUE = "backlog"
STALL_TIMEOUT_S = 120.0  # a phase that makes no progress for this long fails the run
POLL_INTERVAL_S = 0.2


def tree_changes() -> list[str]:
    """Files of node/ that differ from HEAD: the nodes run the working tree, which another engineer may be
    editing, so a run says when its numbers are not HEAD's."""
    status = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--", "node"],
                            capture_output=True, text=True).stdout
    return [line[3:] for line in status.splitlines() if line.strip()]


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
    # the nodes and the client processes import this checkout's packages, whatever an editable install
    # made from another checkout would put first
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
