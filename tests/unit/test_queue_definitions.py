"""Cluster-wide queue definitions: examples of each command, then replicas replaying random logs.

The hypothesis test plays raft as test_route_table does: two replicas apply the same log, each with
its own unpickled copy of the arguments, one restored from a pickled snapshot part-way, and must
answer and end alike; a naive model says what every answer must be.
"""

from __future__ import annotations

import pickle

from hypothesis import given, settings
from hypothesis import strategies as st

from handler.queue_definitions import DELETED_NAMES_MAX, QueueDefinitions
from node.core.cluster.feed import (ADDED, CONFLICT, DELETED, FIXED_FIELDS, MALFORMED, NOT_FOUND, UNCHANGED,
                                    UPDATABLE_FIELDS, UPDATED)
from node.core.cluster.feed import UPDATE_REFUSED as REFUSED
from node.core.dispatch.settings import QueueSettings


def values(name: str = "orders", **fields) -> dict:
    return QueueSettings(name=name, **fields).to_dict()


def test_every_setting_is_either_updatable_or_fixed():
    # to_dict leaves out an empty address, a zero memory budget, trace off, no group lease, the reset rebalance
    # mode and no de-duplication (records older nodes read)
    assert set(values(address="prices", memory_max_bytes=1, trace=True, group_lease_ms=1, group_rebalance=True,
                      group_rebalance_mode="incremental", dedup=True, dedup_window_messages=1,
                      dedup_window_ms=1)) == UPDATABLE_FIELDS | FIXED_FIELDS
    assert not UPDATABLE_FIELDS & FIXED_FIELDS


def test_a_new_queue_is_added_and_the_same_add_again_answers_unchanged():
    definitions = QueueDefinitions()
    assert definitions.define(values()) == (ADDED, values())
    assert definitions.define(values()) == (UNCHANGED, values())
    assert definitions.revision == 1


def test_an_add_with_other_settings_answers_conflict_with_the_definition_held():
    definitions = QueueDefinitions()
    definitions.define(values(group_buckets=16))
    assert definitions.define(values(group_buckets=32)) == (CONFLICT, values(group_buckets=16))
    assert definitions.definitions["orders"]["group_buckets"] == 16


def test_a_seed_never_overrides_a_definition_nor_brings_back_a_deleted_queue():
    definitions = QueueDefinitions()
    definitions.define(values(depth_max_messages=5))
    assert definitions.define(values(depth_max_messages=9), seed=True) == (UNCHANGED, values(depth_max_messages=5))
    definitions.delete("orders", definitions.revision)
    assert definitions.define(values(), seed=True) == (UNCHANGED, None)
    assert "orders" not in definitions.definitions
    assert definitions.define(values())[0] == ADDED  # an explicit add defines it again
    assert "orders" not in definitions.deleted


def test_a_seed_defines_an_unknown_queue():
    definitions = QueueDefinitions()
    assert definitions.define(values("jobs"), seed=True) == (ADDED, values("jobs"))


def test_update_changes_only_fields_a_live_queue_can_take():
    definitions = QueueDefinitions()
    definitions.define(values())
    outcome, merged = definitions.update("orders", {"depth_max_messages": 7, "delivery_count_max": 3})
    assert outcome == UPDATED and merged == values(depth_max_messages=7, delivery_count_max=3)
    assert definitions.update("orders", {"depth_max_messages": 7}) == (UNCHANGED, merged)


def test_update_of_a_grouping_field_is_refused_naming_it():
    definitions = QueueDefinitions()
    definitions.define(values())
    assert definitions.update("orders", {"group_buckets": 8, "durable": False, "groups_max": 3}) == \
        (REFUSED, ["durable", "group_buckets"])
    assert definitions.definitions["orders"] == values()
    # the same value as held is no change
    assert definitions.update("orders", {"group_buckets": -1})[0] == UNCHANGED


def test_update_of_an_unknown_queue_is_not_found():
    assert QueueDefinitions().update("nope", {"groups_max": 1}) == (NOT_FOUND, None)


def test_delete_removes_the_definition_and_a_retry_changes_nothing():
    definitions = QueueDefinitions()
    definitions.define(values())
    seen = definitions.revision
    assert definitions.delete("orders", seen) == (DELETED, values())
    revision = definitions.revision
    assert definitions.delete("orders", seen) == (DELETED, None)  # the retry of an unknown outcome
    assert definitions.revision == revision


def test_delete_of_an_undefined_queue_still_tells_the_nodes():
    definitions = QueueDefinitions()
    assert definitions.delete("auto", 0) == (NOT_FOUND, None)
    assert definitions.deleted == {"auto": 1}


def test_deleted_names_are_bounded_oldest_first():
    definitions = QueueDefinitions()
    for number in range(DELETED_NAMES_MAX + 2):
        definitions.delete(f"q{number}", definitions.revision)
    assert len(definitions.deleted) == DELETED_NAMES_MAX
    assert "q0" not in definitions.deleted and "q1" not in definitions.deleted


def test_malformed_input_changes_nothing_and_never_raises():
    definitions = QueueDefinitions()
    for bad in (None, [], {"name": ""}, {"name": 3}, {"name": "q", "x": [1]}, {"name": "q", 1: 2}):
        assert definitions.define(bad) == (MALFORMED, None)
    assert definitions.define(values(), seed="yes") == (MALFORMED, None)
    assert definitions.update("q", None) == (MALFORMED, None)
    assert definitions.update(None, {}) == (MALFORMED, None)
    assert definitions.delete("q", None) == (MALFORMED, None)
    assert definitions.delete("", 0) == (MALFORMED, None)
    assert definitions.revision == 0 and not definitions.definitions


# ---- replicas replaying one log ------------------------------------------------------------------

NAMES = st.sampled_from(["a", "b", "c"])
COMMANDS = st.one_of(
    st.tuples(st.just("define"), NAMES, st.sampled_from([-1, 0, 8]), st.sampled_from([1, 2]), st.booleans()),
    st.tuples(st.just("update"), NAMES, st.sampled_from(["groups_max", "group_buckets"]), st.sampled_from([-1, 0, 5])),
    st.tuples(st.just("delete"), NAMES, st.integers(min_value=-1, max_value=2)),
)


def run(definitions: QueueDefinitions, command: tuple):
    command = pickle.loads(pickle.dumps(command))  # each replica gets its own copy, as over the wire
    if command[0] == "define":
        _, name, buckets, depth, seed = command
        return definitions.define(values(name, group_buckets=buckets, depth_max_messages=depth), seed)
    if command[0] == "update":
        _, name, field, value = command
        return definitions.update(name, {field: value})
    _, name, behind = command  # the proposer saw a revision up to 2 behind the log's
    return definitions.delete(name, max(0, definitions.revision - behind))


class Model:
    """The rules in the plainest form: a dict of definitions and the revision of each name's deletion."""

    def __init__(self):
        self.held: dict = {}
        self.deleted: dict = {}
        self.revision = 0

    def run(self, command: tuple):
        if command[0] == "define":
            _, name, buckets, depth, seed = command
            wanted = values(name, group_buckets=buckets, depth_max_messages=depth)
            if name in self.held:
                return (UNCHANGED if seed or self.held[name] == wanted else CONFLICT, self.held[name])
            if seed and name in self.deleted:
                return (UNCHANGED, None)
            self.deleted.pop(name, None)
            self.held[name] = wanted
            self.revision += 1
            return (ADDED, wanted)
        if command[0] == "update":
            _, name, field, value = command
            if name not in self.held:
                return (NOT_FOUND, None)
            if field == "group_buckets" and self.held[name][field] != value:
                return (REFUSED, [field])
            if self.held[name][field] == value:
                return (UNCHANGED, self.held[name])
            self.held[name] = {**self.held[name], field: value}
            self.revision += 1
            return (UPDATED, self.held[name])
        _, name, behind = command
        seen = max(0, self.revision - behind)
        if self.deleted.get(name, -1) > seen:
            return (DELETED, None)
        old = self.held.pop(name, None)
        self.revision += 1
        self.deleted[name] = self.revision
        return (DELETED, old) if old is not None else (NOT_FOUND, None)


@settings(max_examples=200, deadline=None)
@given(st.lists(COMMANDS, max_size=40), st.integers(min_value=0, max_value=40))
def test_replicas_answer_and_end_alike_and_as_the_model_says(log: list, snapshot_at: int):
    first, second, model = QueueDefinitions(), QueueDefinitions(), Model()
    for index, command in enumerate(log):
        if index == snapshot_at:  # the second replica restarts from a snapshot here
            restored = QueueDefinitions()
            vars(restored).update(pickle.loads(pickle.dumps(dict(vars(second)))))
            second = restored
        expected = model.run(command)
        assert run(first, command) == expected
        assert run(second, command) == expected
    assert vars(first) == vars(second)
    assert first.definitions == model.held and first.deleted == model.deleted and first.revision == model.revision


# ---- the pysyncobj consumer: what the feed says and what a snapshot keeps ------------------------

def make_replica():
    from handler.replicated import RouteTableReplica

    heard = []
    return RouteTableReplica(lambda kind, payload, at_ms: heard.append((kind, payload)), routes_max=10), heard


def test_the_replica_feeds_each_change_with_its_revision_and_a_delete_drops_the_routes_first():
    from node.core.cluster.feed import QUEUES, ROUTES

    replica, heard = make_replica()
    assert replica.define_queue(values(), False, _doApply=True) == [ADDED, values()]
    assert heard == [(QUEUES, [(1, "orders", values())])]
    assert replica.define_queue(values(), False, _doApply=True) == [UNCHANGED, values()]
    assert replica.update_queue("orders", {"groups_max": 4}, _doApply=True)[0] == UPDATED
    replica.claim([["orders", "g"]], "n1", 10, _doApply=True)
    heard.clear()
    assert replica.delete_queue("orders", 2, _doApply=True) == [DELETED, values(groups_max=4), 1]
    assert heard == [(ROUTES, [("orders", "g", None)]), (QUEUES, [(3, "orders", None)])]
    heard.clear()
    assert replica.delete_queue("orders", 2, _doApply=True) == [DELETED, None, 0]  # the retry
    assert heard == []


def test_a_snapshot_keeps_the_definitions_and_an_old_snapshot_restores_none():
    from node.core.cluster.feed import QUEUES_ALL

    replica, _ = make_replica()
    replica.define_queue(values(), False, _doApply=True)
    replica.delete_queue("gone", 1, _doApply=True)
    data = pickle.loads(pickle.dumps(replica._serialize()))
    restored, heard = make_replica()
    restored._deserialize(data)
    assert vars(restored.queues) == vars(replica.queues)
    assert heard[-1] == (QUEUES_ALL, (2, {"orders": values()}, {"gone": 2}))
    old = {"route_table": data["route_table"]}  # written before definitions existed
    restored._deserialize(old)
    assert restored.queues.definitions == {} and restored.queues.revision == 0
