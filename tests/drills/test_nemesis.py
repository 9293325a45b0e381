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
