"""`grouper audit LOGS... [--sends FILES...] [--json OUT] [--text OUT] [--png OUT]`: the delivery audit job.

This module must stay light: `grouper` builds its parser from it on every call, so pyspark is only
imported once the audit runs (`grouper node` never loads Spark). Exit status: 0 every invariant
holds, 1 one is broken, 2 bad usage or unreadable logs.
"""

from __future__ import annotations

import argparse
import re
import sys

EXIT_OK = 0
EXIT_BROKEN = 1
EXIT_USAGE = 2
DRIVER_MEMORY_PATTERN = re.compile(r"^[1-9][0-9]*[mg]$")


def add_command(subparsers) -> None:
    parser = subparsers.add_parser(
        "audit", help="judge drill delivery logs on Spark: loss, duplicates, order, exclusivity, spread, latency",
        description="Runs a Spark job (local mode) over JSON-lines delivery logs (and, optionally, the "
                    "producers' send logs) and reports per queue. Exit 0 ok, 1 an invariant is broken, 2 bad input.")
    parser.add_argument("logs", nargs="+", metavar="LOGS",
                        help="consumer logs: JSON-lines files, or directories of *.jsonl files")
    parser.add_argument("--sends", nargs="+", default=[], metavar="FILES",
                        help="producer send logs; without them lost and refused messages are not judged")
    parser.add_argument("--json", metavar="OUT", help="write the JSON report here")
    parser.add_argument("--text", metavar="OUT", help="write the text summary here (it is printed anyway)")
    parser.add_argument("--png", metavar="OUT", help="write the per-consumer load and latency chart here")
    parser.add_argument("--driver-memory", default="4g", metavar="SIZE",
                        help="Spark driver heap, e.g. 4g or 512m (default 4g); local mode runs the job in it")
    parser.set_defaults(run=run_command)


def run_command(args: argparse.Namespace) -> int:
    if not DRIVER_MEMORY_PATTERN.match(args.driver_memory):
        print(f"grouper audit: --driver-memory {args.driver_memory!r} is not a size like 4g or 512m", file=sys.stderr)
        return EXIT_USAGE
    from pipeline import audit, audit_report
    try:
        files = audit.LogFiles.of(args.logs, args.sends)
    except audit.AuditInputError as error:
        print(f"grouper audit: {error}", file=sys.stderr)
        return EXIT_USAGE
    try:
        report = audit.run(files.log_paths, files.send_paths, json_path=args.json, text_path=args.text,
                           png_path=args.png, driver_memory=args.driver_memory)
    except audit.AuditInputError as error:
        print(f"grouper audit: cannot judge the logs: {error}", file=sys.stderr)
        return EXIT_USAGE
    print(audit_report.summary(report))
    return EXIT_OK if report["ok"] else EXIT_BROKEN
