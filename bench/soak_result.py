"""What a soak run found: the node's samples over the run, the episodes' counts, the checker's verdict,
and `problems()`, the judgement in words. The run's checks are counts and ceilings with generous
slack, never times: RSS growth over the second half below RSS_GROWTH_MAX_BYTES, engine objects back
to zero, every episode that was not killed exiting 0, the node alive and its log free of
tracebacks, the checker's verdict ok. Plain data, saved as and loaded from JSON."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from bench.soak_episodes import ROLES

RSS_GROWTH_MAX_BYTES = 48 << 20  # max RSS of the second half over max RSS of the first half


@dataclass
class Sample:
    at_s: float  # since the start of the run
    rss_bytes: int
    connections: int
    links: int
    unsettled_deliveries: int
    depth_messages: int = 0  # on every queue: a backlog shows in RSS too


@dataclass
class SoakResult:
    duration_s: float
    seed: int
    date_utc: str = ""  # when the run began, "YYYY-MM-DD HH:MM"
    revision: str = ""  # the node's source: `git describe` of this checkout, or what the caller says
    samples: list = field(default_factory=list)  # Sample
    episodes: dict = field(default_factory=dict)  # role -> {"ended": n, "killed": n, "failed": n}
    episode_failures: list = field(default_factory=list)  # the first few failures' stderr
    baseline_after: dict = field(default_factory=dict)  # engine objects once every client left
    rss_after_bytes: int = 0
    node_alive: bool = False
    node_exit: int | None = None  # the node's exit status when it ended before the run did (-15: SIGTERM)
    node_tracebacks: int = 0
    checker_summary: str = ""
    checker_ok: bool = False
    sends: int = 0  # distinct messages sent (an episode logs a send twice: before it leaves, and its outcome)
    accepted: int = 0  # distinct messages the node accepted
    delivered: int = 0
    redeliveries: int = 0
    messages_per_s: float = 0.0

    def series(self, key: str) -> tuple[int, int, int]:
        values = [getattr(sample, key) for sample in self.samples]
        return (values[0], max(values), values[-1]) if values else (0, 0, 0)

    @property
    def rss_growth_bytes(self) -> int:
        """Max RSS of the second half of the run over max RSS of the first half: a leak shows as growth."""
        half = len(self.samples) // 2
        first, second = self.samples[:half], self.samples[half:]
        if not first or not second:
            return 0
        return max(s.rss_bytes for s in second) - max(s.rss_bytes for s in first)

    def problems(self) -> list[str]:
        """What failed, in words; empty when the soak passed."""
        found = []
        if not self.node_alive:
            found.append(f"the node process ended before the run did (exit status {self.node_exit})")
        if self.node_tracebacks:
            found.append(f"the node logged {self.node_tracebacks} tracebacks")
        if self.rss_growth_bytes > RSS_GROWTH_MAX_BYTES:
            found.append(f"RSS grew {self.rss_growth_bytes / 2**20:.1f} MiB in the second half "
                         f"(ceiling {RSS_GROWTH_MAX_BYTES >> 20} MiB)")
        if any(self.baseline_after.get(key) != 0 for key in ("connections", "links", "unsettled_deliveries")):
            found.append(f"engine objects did not return to zero after the clients left: {self.baseline_after}")
        failed = sum(counts["failed"] for counts in self.episodes.values())
        if failed:
            found.append(f"{failed} episodes failed: {self.episode_failures[:3]}")
        for role in ROLES:
            counts = self.episodes.get(role, {})
            if not counts.get("killed" if role == "killed" else "ended"):
                found.append(f"no {role} episode ran its course")
        if not self.checker_ok:
            found.append(f"the checker found violations: {self.checker_summary}")
        return found


def load_result(path: Path) -> SoakResult:
    values = json.loads(Path(path).read_text())
    values.pop("problems", None)
    samples = [Sample(**sample) for sample in values.pop("samples")]
    return SoakResult(**values, samples=samples)
