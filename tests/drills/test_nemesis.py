"""A few nemesis rounds of each kind (tests/drills/nemesis.py) on every CI run; the long campaign is run by hand.

Each kind gets its own cluster and ROUNDS_PER_KIND rounds with faults held HOLD_S (shorter than the long
campaign's 2-10 s, so the file stays within a few minutes). The round seeds start at a random base unless
GROUPER_NEMESIS_SEED is set; a failure names each failed round's seed and how to replay it.

Partitions need iptables (with the cgroup and connmark matches) and a cgroup v2 hierarchy, the full disk
a tmpfs mount; without them the kind is skipped with the reason, unless GROUPER_FAULTS_REQUIRED=1 (.ci/run
sets it after installing iptables), where a missing piece fails the test instead of hiding it
(tests/integration/faults.py).
"""

from __future__ import annotations

import os
import random

import pytest

from tests.drills import nemesis
from tests.integration.faults import cannot_run, tmpfs_unavailable

ROUNDS_PER_KIND = 2
HOLD_S = (2.0, 5.0)
BASE_SEED = int(os.environ.get("GROUPER_NEMESIS_SEED", random.randrange(1 << 31)))


def unavailable(kind: str) -> str | None:
    if kind == "partition":
        return nemesis.partition_unavailable()
    if kind == "disk":
        return tmpfs_unavailable()
    return None  # kill and pause signal our own children


@pytest.mark.parametrize("kind", nemesis.KINDS)
def test_a_few_rounds_of_one_fault_each_lose_reorder_and_split_nothing_and_leave_equal_route_tables(kind, tmp_path):
    reason = unavailable(kind)
    if reason:
        cannot_run(f"{kind} rounds", reason)
    seeds = [BASE_SEED + nemesis.KINDS.index(kind) * ROUNDS_PER_KIND + number for number in range(ROUNDS_PER_KIND)]
    with nemesis.Campaign(tmp_path, (kind,), HOLD_S) as campaign:
        results = [campaign.play(kind, seed) for seed in seeds]
    for result in results:
        print(result.describe())
    failed = [result for result in results if not result.ok]
    assert not failed, "\n".join(
        f"{result.describe()}\n  replay: python -m tests.drills.nemesis --kinds {kind} --seed {result.seed} "
        f"--rounds 1 --hold-s {HOLD_S[0]:g},{HOLD_S[1]:g} (logs under {tmp_path})" for result in failed)
    # every round carried load and saw a new group routed after its heal
    assert all(result.accepted > 0 and result.heal_to_new_group_ms is not None for result in results), \
        [result.describe() for result in results]


def _write_lines(path, lines) -> None:
    import json
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))


def test_late_deliveries_are_judged_against_the_round_that_sent_them_reading_its_logs_once(tmp_path, monkeypatch):
    """A delivery in round 2 of round 1's messages: legal when round 1 never confirmed it gone, a duplicate
    when a consumer of round 1 had a confirmed acceptance, unexpected when round 1 never sent it; and round
    1's logs are read once however many late deliveries there are (a long outage makes thousands)."""
    def send(sequence, outcome="accepted"):
        return {"kind": "send", "producer": "r1-p0", "node": "n", "queue": "q", "group": "g", "sequence": sequence,
                "sent_ms": sequence, "settled_ms": sequence, "outcome": outcome, "condition": None}

    def delivery(sequence, consumer, at_ms, confirmed=True):
        return {"kind": "delivery", "consumer": consumer, "node": "n", "queue": "q", "group": "g",
                "producer": "r1-p0", "sequence": sequence, "received_ms": at_ms, "settled_ms": at_ms,
                "confirmed_ms": at_ms if confirmed else None, "delivery_count": 0, "outcome": "accepted",
                "settle_confirmed": confirmed}

    first = tmp_path / "round001-kill-7"
    first.mkdir()
    _write_lines(first / "r1-p0.jsonl", [send(1), send(2), send(3)])
    # 1 confirmed gone, 2 accepted without confirmation (legal to see again), 3 never delivered in round 1
    _write_lines(first / "r1-c0.jsonl", [delivery(1, "r1-c0", 10), delivery(2, "r1-c0", 11, confirmed=False)])
    second = tmp_path / "round002-pause-8"
    second.mkdir()
    _write_lines(second / "r2-c0.jsonl", [delivery(1, "r2-c0", 100), delivery(2, "r2-c0", 101),
                                          delivery(3, "r2-c0", 102), delivery(9, "r2-c0", 103)])
    reads = []
    real_round_lines = nemesis.round_lines
    monkeypatch.setattr(nemesis, "round_lines", lambda logs: reads.append(logs.name) or real_round_lines(logs))
    result = nemesis.RoundResult("pause", 8, 2)
    nemesis.judge(result, second)
    assert (result.late_redeliveries, result.late_duplicates, result.unexpected) == (2, 1, 1)
    assert "late duplicate: r1-p0/g#1" in result.checker
    assert reads == ["round002-pause-8", "round001-kill-7"]
