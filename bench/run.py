"""Run the grouped workload against Grouper and its peers and write docs/benchmarks.md.

    python -m bench.run [--systems grouper,rabbitmq,activemq] [--messages N] [--quick]

The rows (matrix.py) run interleaved on every system (interleave.py, whose header says how and why);
the report (run_report.py) is rendered from the results alone. This module owns the options, the
results file and where the report goes; docs/benchmarks-method.md has the method and the analysis.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

from bench import peers, phase_log
from bench.interleave import run_interleaved
from bench.matrix import SYSTEMS, VARIANTS, WARMUP_MESSAGES, Row, matrix, paced_rows, security_rows
from bench.phase_log import log
from bench.report_file import write_keeping_others
from bench.run_report import client_versions, machine_facts, render
from node.tools.progress import Progress

REPO_ROOT = peers.REPO_ROOT
DEFAULT_OUT = REPO_ROOT / "docs" / "benchmarks.md"
DEFAULT_JSON = REPO_ROOT / "bench" / "results" / "last-run.json"


def options() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated: grouper,rabbitmq,activemq")
    parser.add_argument("--messages", type=int, default=20_000, help="messages per row (default 20000)")
    parser.add_argument("--quick", action="store_true", help="2000 messages per row, for a smoke run")
    parser.add_argument("--groups", default="4,1000")
    parser.add_argument("--prefetch", default="1,100")
    parser.add_argument("--durable", default="no,yes", help="no, yes, or no,yes")
    parser.add_argument("--paced", default="yes", help="yes: add the paced latency rows (1000 groups, prefetch "
                        "100, not durable, at half the system's own maximum rate)")
    parser.add_argument("--security", default="yes", help="yes: with grouper, add the security rows (a second "
                        "node with a users file, over TLS with SASL PLAIN; 1000 groups, prefetch 100)")
    parser.add_argument("--probe-groups", type=int, default=5000,
                        help="extra non-durable rows with this many groups, an ordering probe (0: none)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="markdown report")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, help="raw results")
    parser.add_argument("--work-dir", type=Path, help="broker data and logs (default: a temp dir)")
    parser.add_argument("--consumer-processes", type=int, default=1,
                        help="processes the 4 consumers are spread over (1: one process, 4 connections)")
    parser.add_argument("--render-only", action="store_true",
                        help="run nothing: rewrite --out from the results already in --json")
    parser.add_argument("--keep-other-systems", action="store_true",
                        help="keep rows of systems not run now from the --json file of an earlier run")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = options()
    args = parser.parse_args(argv)
    if args.render_only:
        write_keeping_others(args.out, render(json.loads(args.json.read_text())))
        print(f"wrote {args.out} from {args.json}")
        return 0
    systems = [s.strip() for s in args.systems.split(",") if s.strip()]
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown system(s): {', '.join(unknown)}")
    if args.security not in ("yes", "no"):
        parser.error("--security takes yes or no")
    command = "python -m bench.run " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    return run_table(args, systems, command)


def planned_rows(args, systems: list[str], messages: int) -> tuple[list[str], list[Row], list[Row], dict]:
    """(systems, with grouper-tls when it runs; the matrix's rows; the paced rows; warm-up messages by system)."""
    groups_list = [int(x) for x in args.groups.split(",")]
    prefetch_list = [int(x) for x in args.prefetch.split(",")]
    durable_list = [{"no": False, "yes": True}[x.strip()] for x in args.durable.split(",")]
    variants = [variant for system in systems for variant in VARIANTS[system]]
    rows = matrix(variants, messages, groups_list, prefetch_list, durable_list, args.probe_groups)
    if args.security == "yes" and "grouper" in systems:
        secured = security_rows(rows, messages)
        if secured:
            rows += secured
            systems = [*systems, "grouper-tls"]
    paced = paced_rows(variants, messages) if args.paced == "yes" else []
    warmup_messages = {system: 2000 if args.quick else count for system, count in WARMUP_MESSAGES.items()}
    return systems, rows, paced, warmup_messages


def run_table(args, systems: list[str], command: str) -> int:
    """Run the rows, then write the results file and the report."""
    messages = 2000 if args.quick else args.messages
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="grouper-bench-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    # SIGTERM unwinds like Ctrl-C, so every broker started so far is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
    log(f"work dir {work_dir}; {messages} messages per row")
    started = time.monotonic()
    versions = client_versions()
    systems, rows, paced, warmup_messages = planned_rows(args, systems, messages)
    total_messages = (sum(row.messages for row in rows + paced)
                      + sum(warmup_messages[system] for system in systems if system in warmup_messages))
    with Progress(total_messages, "bench", "msg") as progress:
        phase_log.PROGRESS = progress
        try:
            results, system_versions = run_interleaved(systems, rows, paced, warmup_messages, work_dir,
                                                       args.consumer_processes, log, progress)
        finally:
            phase_log.PROGRESS = None
    versions.update(system_versions)
    if args.keep_other_systems and args.json.exists():
        earlier = json.loads(args.json.read_text())
        kept = [r for r in earlier["results"] if r["system"] not in systems]
        results += kept
        for name, version in earlier["versions"].items():
            versions.setdefault(name, version)
        if kept:
            command += f" (rows of {', '.join(sorted({r['system'] for r in kept}))} kept from the run of {earlier['date']})"
    report = {
        "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z"),
        "command": command,
        "machine": machine_facts(),
        "versions": versions,
        "messages": messages,
        "body_bytes": 100,
        "consumer_processes": args.consumer_processes,
        "duration_s": round(time.monotonic() - started, 1),
        "results": results,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1, default=str) + "\n")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_keeping_others(args.out, render(report))
    log(f"done in {report['duration_s']:.0f} s; wrote {args.out} and {args.json}")
    return 0

if __name__ == "__main__":
    sys.exit(main())
