"""The machine a benchmark shares: its 1-minute load, its CPU steal, its facts (cores, CPU model),
and the gate that waits, within one budget for the whole run, for a quiet machine before each phase.
Reads /proc only; starts nothing."""

from __future__ import annotations

import os
import time
from pathlib import Path

from bench.phase_log import log


LOAD_QUIET_BELOW = 1.0  # 1-minute load average under which a phase starts
LOAD_WAIT_BUDGET_S = 300.0  # all the waits for a quiet machine together, in one run
LOAD_WAIT_PHASE_MAX_S = 120.0  # one phase's wait
LOAD_POLL_INTERVAL_S = 2.0


def load_1m() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def steal_jiffies() -> tuple[int, int]:
    """(steal, total) CPU jiffies of the machine from /proc/stat: steal is time the hypervisor gave
    this VM's virtual CPUs to someone else, which the load average does not show."""
    values = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return values[7], sum(values)


def steal_pct(before: tuple[int, int]) -> float:
    steal, total = steal_jiffies()
    return round((steal - before[0]) / max(1, total - before[1]) * 100, 1)


class LoadGate:
    """Waits before each phase until the load is low, within one budget for the whole run."""

    def __init__(self, budget_s: float = LOAD_WAIT_BUDGET_S):
        self.remaining_s = budget_s

    def wait(self, phase: str) -> dict:
        started = time.monotonic()
        limit_s = min(self.remaining_s, LOAD_WAIT_PHASE_MAX_S)
        while load_1m() >= LOAD_QUIET_BELOW and time.monotonic() - started < limit_s:
            time.sleep(LOAD_POLL_INTERVAL_S)
        waited_s = time.monotonic() - started
        self.remaining_s = max(0.0, self.remaining_s - waited_s)
        load = load_1m()
        log(f"[{phase}] load {load:.2f} after waiting {waited_s:.0f} s"
            + ("" if load < LOAD_QUIET_BELOW else " (not quiet: measuring anyway)"))
        return {"load_start": load, "waited_s": round(waited_s, 1), "quiet": load < LOAD_QUIET_BELOW}


def machine_facts() -> dict:
    facts = {"cores": str(len(os.sched_getaffinity(0)))}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            facts["cpu"] = line.split(":", 1)[1].strip()
            break
    return facts
