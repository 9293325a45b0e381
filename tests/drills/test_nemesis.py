"""A few nemesis rounds of each kind (tests/drills/nemesis.py) on every CI run; the long campaign is run by hand.

Each kind gets its own cluster and ROUNDS_PER_KIND rounds with faults held HOLD_S (shorter than the long
campaign's 2-10 s, so the file stays within a few minutes). The round seeds start at a random base unless
GROUPER_NEMESIS_SEED is set; a failure names each failed round's seed and how to replay it.

The disk-loss kind (issue 28) is not among the rounds that must be clean until messages are replicated
(nemesis.LOSSY_UNTIL_REPLICATION): its one round here must be judged as losing the owner's messages.

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


# nemesis.CLEAN_KINDS: every kind but those that lose messages on today's code by design (disk-loss, until
# messages are replicated: issue 28); the disk-loss round is demanded to show its loss below instead
@pytest.mark.parametrize("kind", nemesis.CLEAN_KINDS)
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


FOLLOW_KINDS = ("kill", "pause")  # one round each, on one cluster: signals to our own children, needing no root
ROUTE_FOLLOW_MS = 1000


def test_rounds_whose_consumers_move_node_take_their_groups_and_backlogs_along_through_a_fault(tmp_path):
    """Follow mode: each round's consumers leave the groups' owner for another node around the fault (the
    seed picks when), the groups follow them with what they queued, and the checker finds nothing lost,
    reordered or held twice across the move."""
    seeds = [BASE_SEED + len(nemesis.KINDS) * ROUNDS_PER_KIND + number for number in range(len(FOLLOW_KINDS))]
    with nemesis.Campaign(tmp_path, FOLLOW_KINDS, HOLD_S, ROUTE_FOLLOW_MS) as campaign:
        results = [campaign.play(kind, seed) for kind, seed in zip(FOLLOW_KINDS, seeds)]
    for result in results:
        print(result.describe())
    failed = [result for result in results if not result.ok]
    assert not failed, "\n".join(
        f"{result.describe()}\n  replay: python -m tests.drills.nemesis --kinds {result.kind} --seed {result.seed} "
        f"--rounds 1 --hold-s {HOLD_S[0]:g},{HOLD_S[1]:g} --route-follow-ms {ROUTE_FOLLOW_MS} (logs under {tmp_path})"
        for result in failed)
    # every group of each round started at the old owner and was routed to the consumers' new node at
    # the end, and messages really went along (handed over, relayed or parked behind the move)
    assert all(result.groups_at_old_owner == result.groups_moved == nemesis.GROUPS_PER_ROUND
               and sum(result.moved_messages.values()) > 0 for result in results), \
        [result.describe() for result in results]


def test_the_follow_table_counts_moved_groups_sweeps_and_messages_per_kind_and_moment():
    def follow_round(kind, seed, when, moved, sweeps, messages):
        return {**nemesis.dataclasses.asdict(nemesis.RoundResult(kind, seed, 1)), "follow_ms": 1000,
                "follow_when": when, "groups_at_old_owner": 12, "groups_moved": moved, "cold_sweeps": sweeps,
                "moved_messages": messages, "digests_equal": True}
    results = [follow_round("kill", 1, "before", 12, 1, {"cold_handed_over": 5, "messages_relayed": 2}),
               follow_round("kill", 2, "before", 12, 0, {"cold_handed_over": 0, "messages_relayed": 3}),
               {**follow_round("pause", 3, "after", 0, 0, {}), "failure": "AssertionError: follow round: ..."},
               nemesis.dataclasses.asdict(nemesis.RoundResult("disk", 4, 1))]
    rows = nemesis.follow_table(results).splitlines()
    assert rows[0].endswith("| cold sweeps | cold handed over | messages relayed |")
    assert rows[2] == "| kill | before | 2 | 0 | 2 | 24 of 24 | 1 | 1 | 5 | 5 |"
    assert rows[3] == "| pause | after | 1 | 1 (3) | 0 | 0 of 12 | 0 | 0 | 0 | 0 |"
    assert len(rows) == 4
    assert nemesis.follow_table(results[3:]) == ""


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


def test_a_disk_loss_rounds_logs_are_judged_as_losing_messages_by_count_and_by_group(tmp_path):
    """The judge of every round on the logs of a disk-loss round: the owner's journal is gone, so accepted
    messages of its groups never arrive; the round fails, naming how many and of which groups."""
    def send(group, sequence):
        return {"kind": "send", "producer": "r1-p0", "node": "n", "queue": nemesis.QUEUE, "group": group,
                "sequence": sequence, "sent_ms": sequence, "settled_ms": sequence, "outcome": "accepted",
                "condition": None}

    def delivery(group, sequence):
        return {"kind": "delivery", "consumer": "r1-c0", "node": "n", "queue": nemesis.QUEUE, "group": group,
                "producer": "r1-p0", "sequence": sequence, "received_ms": 100 + sequence,
                "settled_ms": 101 + sequence, "confirmed_ms": 102 + sequence, "delivery_count": 0,
                "outcome": "accepted", "settle_confirmed": True}
    logs = tmp_path / "round001-disk-loss-5"
    logs.mkdir()
    _write_lines(logs / "r1-p0.jsonl", [send(group, sequence) for group in ("r1-g00", "r1-g01", "r1-g02")
                                        for sequence in range(1, 6)])
    # r1-g00 lost 3..5 with the disk, r1-g01 lost 5; r1-g02 lived elsewhere
    _write_lines(logs / "r1-c0.jsonl", [delivery("r1-g00", 1), delivery("r1-g00", 2),
                                        *(delivery("r1-g01", sequence) for sequence in range(1, 5)),
                                        *(delivery("r1-g02", sequence) for sequence in range(1, 6))])
    result = nemesis.RoundResult("disk-loss", 5, 1, digests_equal=True)
    nemesis.judge(result, logs)
    assert (result.accepted, result.lost) == (15, 4)
    assert result.lost_groups == {"r1-g00": 3, "r1-g01": 1}
    assert not result.ok
    assert "lost 4" in result.describe() and "lost by group {'r1-g00': 3, 'r1-g01': 1}" in result.describe()


def test_disk_loss_is_a_kind_of_the_campaign_but_not_yet_one_that_must_be_clean():
    # issue 28: remove it from LOSSY_UNTIL_REPLICATION once messages are replicated
    assert "disk-loss" in nemesis.KINDS
    assert nemesis.LOSSY_UNTIL_REPLICATION == ("disk-loss",)
    assert set(nemesis.CLEAN_KINDS) | set(nemesis.LOSSY_UNTIL_REPLICATION) == set(nemesis.KINDS)


def test_a_disk_loss_round_on_todays_code_loses_the_owners_messages_and_nothing_else_goes_wrong(tmp_path):
    """One disk-loss round (issue 28): the owner of the busy groups is killed under load, its data directory
    deleted, and it rejoins empty as a new member. Messages live only in their owner's journal today, so the
    round must be judged as losing messages, counted by group, among the busy groups; order, exclusivity,
    duplicates and the route tables must still hold. Once replication lands this test fails on purpose: then
    empty nemesis.LOSSY_UNTIL_REPLICATION, and the disk-loss kind joins the clean rounds above."""
    seed = BASE_SEED + len(nemesis.KINDS) * ROUNDS_PER_KIND + len(FOLLOW_KINDS)
    with nemesis.Campaign(tmp_path, ("disk-loss",), HOLD_S) as campaign:
        result = campaign.play("disk-loss", seed)
    print(result.describe())
    replay = (f"replay: python -m tests.drills.nemesis --kinds disk-loss --seed {seed} --rounds 1 "
              f"--hold-s {HOLD_S[0]:g},{HOLD_S[1]:g} (logs under {tmp_path})")
    assert not result.failure, f"{result.describe()}\n  {replay}"
    assert result.role == "owner" and result.rejoined_as and result.rejoined_as != result.victim, result.describe()
    assert result.lost > 0, f"the judge found no loss in a round whose owner lost its journal\n{result.describe()}"
    assert sum(result.lost_groups.values()) == result.lost, result.describe()
    busy = {f"r1-g{index:02d}" for index in range(nemesis.GROUPS_PER_ROUND)}
    assert busy & set(result.lost_groups), result.describe()
    assert set(result.lost_groups) <= busy | {group for group in result.lost_groups if group.startswith("r1-new")}
    assert not (result.order_violations or result.double_held or result.duplicates or result.refused_delivered
                or result.unexpected or result.late_duplicates), f"{result.describe()}\n  {replay}"
    assert result.digests_equal and result.heal_to_new_group_ms is not None, result.describe()
