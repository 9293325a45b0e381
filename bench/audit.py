"""The delivery audit job at scale: generated logs of 1, 10 and 50 million deliveries, wall time and peak memory.

    python3 -m bench.audit [--sizes 1000000,10000000,50000000] [--work-dir /tmp/grouper-audit-bench]
                           [--driver-memory 8g] [--keep-logs] [--render-only]

For each size it generates a drill-like log set under the work directory (never in the repo), runs
`grouper audit` on it as a child process (the real command: local[*] Spark, the JVM and its Python
workers), samples the resident memory of the whole process tree from /proc every
MEMORY_SAMPLE_INTERVAL_S, and checks the audit found exactly the losses the generator planted. Then it
writes the section "## Audit job" of docs/benchmarks.md (the rest of the file is kept) and the numbers
to bench/results/audit-last-run.json (each size's entry is replaced, others are kept, so one size can
be rerun alone). A benchmark, not a test: it asserts nothing but the planted losses. The generated
logs, and the losses and consumer changes planted in them, are audit_logs.py's.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from bench.audit_logs import (CONSUMERS_PER_QUEUE, GROUPS, LOST_EVERY, SHIFTS, generate, planted_changes,
                              planted_losses)

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO_ROOT / "docs" / "benchmarks.md"
DEFAULT_JSON = REPO_ROOT / "bench" / "results" / "audit-last-run.json"
DEFAULT_WORK_DIR = Path("/tmp/grouper-audit-bench")
SECTION_HEADING = "## Audit job"
DEFAULT_SIZES = (1_000_000, 10_000_000, 50_000_000)

MEMORY_SAMPLE_INTERVAL_S = 0.5
AUDIT_TIMEOUT_S = 4 * 3600.0
FREE_DISK_MARGIN = 1.3  # the generated logs plus Spark's spill must fit with this much to spare
DELIVERY_LINE_BYTES = 250  # about, for the disk check
SEND_LINE_BYTES = 190


# ---- running the audit, with the memory of its process tree ----------------------------------------

def _tree_rss_bytes(root: int) -> int:
    children: dict[int, list[int]] = {}
    rss: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry.name}/stat").read_text()
            fields = stat[stat.rindex(")") + 2:].split()
            children.setdefault(int(fields[1]), []).append(int(entry.name))  # field 4: ppid
            rss[int(entry.name)] = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")  # field 24: rss in pages
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        total += rss.get(pid, 0)
        stack += children.get(pid, [])
    return total


def run_audit(directory: Path, driver_memory: str) -> dict:
    report_path = directory / "report.json"
    command = [sys.executable, "-m", "node.cli", "audit", str(directory / "events.jsonl"),
               *map(str, sorted(directory.glob("deliveries-*.jsonl"))),
               "--sends", *map(str, sorted(directory.glob("sends-*.jsonl"))),
               "--json", str(report_path), "--png", str(directory / "audit.png"), "--driver-memory", driver_memory]
    started = time.monotonic()
    peak_bytes = 0
    with open(directory / "audit.log", "w") as log:
        child = subprocess.Popen(command, cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT)
        while child.poll() is None:
            peak_bytes = max(peak_bytes, _tree_rss_bytes(child.pid))
            if time.monotonic() - started > AUDIT_TIMEOUT_S:
                child.kill()
                child.wait()
                break
            time.sleep(MEMORY_SAMPLE_INTERVAL_S)
    wall_s = time.monotonic() - started
    result = {"exit_status": child.returncode, "wall_s": round(wall_s, 1), "peak_rss_bytes": peak_bytes,
              "command": " ".join(command[1:])}
    if report_path.exists() and child.returncode in (0, 1):
        report = json.loads(report_path.read_text())
        totals = report["totals"]
        result.update(deliveries=totals["deliveries"], sent=totals["sent"], lost=totals["lost"],
                      consumer_changes=totals["consumer_changes"], broken=report["broken"],
                      reasons=sorted({reason for queue in report["queues"]
                                      for reason in queue["consumer_changes"]["by_reason"]}))
    else:
        result["log_tail"] = (directory / "audit.log").read_text()[-2000:]
    return result


# ---- the report section ----------------------------------------------------------------------------

def _gib(value: int) -> str:
    return f"{value / 2**30:.1f} GiB"


def _minutes(seconds) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f} min ({seconds:,.0f} s)"


def _count(value) -> str:
    return "-" if value is None else f"{value:,}"


def render(results: dict) -> str:
    lines = [
        SECTION_HEADING, "",
        "Generated by `bench/audit.py` (`python3 -m bench.audit`); `python3 -m bench.audit --render-only` writes it "
        "again from `bench/results/audit-last-run.json` (for example after `bench/run.py` has rewritten this file).",
        "",
        f"`grouper audit` (Spark {results.get('spark', '?')}, local[*], driver heap {results.get('driver_memory')}) "
        "over generated drill logs: send and delivery lines for every message (two files of each, one per "
        f"generator process) plus consumer attach/detach events; {GROUPS:,} groups, 2 queues, "
        f"{CONSUMERS_PER_QUEUE} consumers per queue, every group changing consumer "
        f"{SHIFTS} times (every consumer detaching and attaching again), one message in {LOST_EVERY:,} lost on "
        "purpose. Peak memory is the "
        f"largest sum of resident memory over the command's process tree (the Python driver, the JVM, its "
        f"Python workers), sampled every {MEMORY_SAMPLE_INTERVAL_S} s. Machine: {results.get('machine')}, "
        "shared with other engineers' runs (load average at start in the table).",
        "",
        "| deliveries | log lines | log size | audit wall time | peak memory (tree) | lost found / planted "
        "| consumer changes found / planted (all consumer_gone) | exit | load at start | date |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for size in sorted(results["sizes"], key=int):
        entry = results["sizes"][size]
        audit = entry.get("audit", {})
        found = audit.get("lost")
        lines.append(
            f"| {int(size):,} | {_count(entry.get('lines') or None)} | "
            f"{_gib(entry['bytes']) if entry.get('bytes') else '-'} | "
            f"{_minutes(audit.get('wall_s'))} | "
            f"{_gib(audit['peak_rss_bytes']) if audit.get('peak_rss_bytes') else '-'} | "
            f"{_count(found)} / {entry['planted_lost']:,} | "
            f"{_count(audit.get('consumer_changes'))} / {_count(planted_changes(int(size)))}"
            f"{' (yes)' if audit.get('reasons') == ['consumer_gone'] else ' (no)' if audit else ''} | "
            f"{audit.get('exit_status', '-')} | {entry.get('load_average_at_start', '-')} | {entry.get('date', '-')} |")
    notes = [entry["note"] for entry in results["sizes"].values() if entry.get("note")]
    lines += [""] + [f"- {note}" for note in notes]
    lines += [
        f"- Exit 1 is expected: the planted losses (one message in {LOST_EVERY:,}) break the `lost` invariant, "
        "and the audit must say so; the run checks it found exactly those, and exactly the planted consumer "
        "changes, each for its reason.",
        "- The job's plan: it reads the JSON once into Spark's cache, then shuffles the deliveries twice (by "
        "identity: duplicates, losses; by group, in time order: consumer changes and overlapping holds, the "
        "latter judged per run of one consumer's holds), the sends once (joined by identity), the identities "
        "once (order per producer stream), plus small aggregations; nothing but aggregates and examples "
        "reaches the driver.",
        "- Profiled with Spark's event log on 1 M deliveries: a distinct count of groups next to "
        "`percentile_approx` made Spark expand every delivery and keep a percentile sketch per consumer "
        "and group (49 s of 126 s); overlapping holds were judged per hold and other consumer (every "
        "delivery times the consumers of its group). Both were rewritten; the same 1 M audit took 771 s "
        "(load 10.5) before and 101-218 s after, at load 2-3: this VM's CPU steal varies (17 % on average "
        "over the day it was measured), so repeated runs differ by up to 2x.",
    ]
    return "\n".join(lines) + "\n"


def write_section(out: Path, section: str) -> None:
    """Replace this benchmark's section of `out`, or append it; the rest of the file is kept."""
    text = out.read_text() if out.exists() else ""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.strip() == SECTION_HEADING), None)
    if start is None:
        new = text.rstrip("\n") + ("\n\n" if text else "") + section
    else:
        end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
        new = "\n".join([*lines[:start], *section.rstrip("\n").splitlines(), *([""] if end < len(lines) else []),
                         *lines[end:]])
    out.write_text(new.rstrip("\n") + "\n")


def _machine() -> str:
    model = "?"
    try:
        model = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                     if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    memory_kib = int(next(line.split()[1] for line in Path("/proc/meminfo").read_text().splitlines()
                          if line.startswith("MemTotal")))
    return f"{model}, {os.cpu_count()} cores, {memory_kib / 2**20:.0f} GiB RAM"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default=",".join(map(str, DEFAULT_SIZES)), help="deliveries per run, comma-separated")
    parser.add_argument("--work-dir", type=Path, default=DEFAULT_WORK_DIR, help="where the logs go (not the repo)")
    parser.add_argument("--driver-memory", default="8g")
    parser.add_argument("--keep-logs", action="store_true", help="keep each size's logs after its run")
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument("--note", action="append", default=[], metavar="SIZE=TEXT",
                        help="record what happened to a size that was not measured (stopped, out of disk...)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    results = json.loads(args.json.read_text()) if args.json.exists() else {"sizes": {}}
    for note in args.note:
        size, _, text = note.partition("=")
        entry = results["sizes"].setdefault(str(int(size)), {"planted_lost": planted_losses(int(size))})
        entry["note"] = text
    if not args.render_only:
        import pyspark
        results.update(spark=pyspark.__version__, driver_memory=args.driver_memory, machine=_machine())
        for size in (int(value) for value in args.sizes.split(",")):
            directory = args.work_dir / f"{size}"
            need_bytes = size * (DELIVERY_LINE_BYTES + SEND_LINE_BYTES) * FREE_DISK_MARGIN
            free_bytes = shutil.disk_usage(args.work_dir.parent if not args.work_dir.exists() else args.work_dir).free
            entry = {"date": datetime.date.today().isoformat(), "planted_lost": planted_losses(size),
                     "load_average_at_start": round(os.getloadavg()[0], 1), "lines": 0, "bytes": 0}
            if free_bytes < need_bytes:
                entry["note"] = (f"{size:,} deliveries not run: about {_gib(int(need_bytes))} of disk needed, "
                                 f"{_gib(free_bytes)} free")
                results["sizes"][str(size)] = entry
                continue
            print(f"{size:,} deliveries: generating in {directory}", flush=True)
            entry.update(generate(directory, size))
            print(f"  {entry['lines']:,} lines, {_gib(entry['bytes'])} in {entry['generate_s']} s; auditing", flush=True)
            entry["audit"] = run_audit(directory, args.driver_memory)
            print(f"  {json.dumps(entry['audit'])}", flush=True)
            found = (entry["audit"].get("lost"), entry["audit"].get("consumer_changes"), entry["audit"].get("reasons"))
            planted = (entry["planted_lost"], planted_changes(size), ["consumer_gone"])
            if found != planted:
                entry["note"] = (f"{size:,}: the audit found (lost, consumer changes, reasons) {found}, the generator "
                                 f"planted {planted} (exit {entry['audit']['exit_status']})")
            results["sizes"][str(size)] = entry
            args.json.write_text(json.dumps(results, indent=2) + "\n")
            if not args.keep_logs:
                shutil.rmtree(directory)
    args.json.write_text(json.dumps(results, indent=2) + "\n")
    write_section(args.out, render(results))
    print(f"wrote {args.out} ({SECTION_HEADING}) and {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
