"""The cluster protocol of one node, by example: the effects each input asks for, with time as integers.

The seeded simulation (tests/sim) runs the same class across a whole cluster with faults; these
examples pin single decisions. Last, the layout rule: the pure cores import no thread, socket,
clock, gRPC, proton or pysyncobj.
"""

from __future__ import annotations

import ast
import pathlib

from node.core.dispatch.broker import Broker
from node.core.cluster import MARK_PREFIX, SEQ_RESERVATION, ClusterProtocol
from node.core.cluster.feed import MOVES, REFUSED, ROUTES
from node.core.cluster.outbound import Entry, outbound_name
from node.core.effects import (AcceptWhenStored, AfterFlush, Declared, Deliver, EnqueueLocal, ProposeClaim, ProposeTouch,
                               Refuse, Register, Removed, Reply, ReportConsumers, StopNode, Stored, SubmitForward)
from node.core.errors import HandlerUnavailable, ResourceLimitExceeded
from node.core.dispatch.message import Message, Outcome
from node.core.dispatch.settings import QueueSettings

HANDLER_TIMEOUT_MS = 300
REPO = pathlib.Path(__file__).resolve().parents[2]


def protocol(node_id: str = "n1", **settings) -> ClusterProtocol:
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    cluster = ClusterProtocol(node_id, broker, handler_timeout_ms=HANDLER_TIMEOUT_MS, routes_max=10,
                              seq_reserve_block=100, **settings)
    cluster.ready(0)
    return cluster


def arrive(cluster: ClusterProtocol, incoming: str, group: str = "g", now_ms: int = 0) -> list:
    return cluster.arrive(incoming, "q", group, Message(incoming.encode(), group), True, False, now_ms)


def routed(cluster: ClusterProtocol, owner: str, group: str = "g", now_ms: int = 0) -> list:
    return cluster.applied(ROUTES, [("q", group, owner)], now_ms, now_ms)


def of(kind, effects: list) -> list:
    return [effect for effect in effects if type(effect) is kind]


def test_a_message_of_a_group_without_a_route_waits_and_its_claim_is_proposed_at_the_end_of_the_batch():
    cluster = protocol()
    assert arrive(cluster, "m1") == []
    assert cluster.quiesced(5) == [ProposeClaim([("q", "g")], 5)]
    assert cluster.quiesced(6) == []  # proposed once


def test_a_decided_route_to_this_node_enqueues_the_waiting_messages_here_in_arrival_order():
    cluster = protocol()
    arrive(cluster, "m1")
    arrive(cluster, "m2")
    effects = routed(cluster, "n1", now_ms=10)
    assert [(type(effect), effect.incoming) for effect in effects] == [(EnqueueLocal, "m1"), (EnqueueLocal, "m2")]


def test_a_message_for_another_owner_is_journalled_in_its_outbound_channel_and_accepted_once_stored():
    cluster = protocol()
    routed(cluster, "n2")
    effects = arrive(cluster, "m1")
    assert [type(effect) for effect in effects] == [Declared, Stored, AcceptWhenStored]
    assert effects[0].values["name"] == SEQ_RESERVATION  # its seq is reserved in the same batch
    assert effects[1].queue == outbound_name("n2", "q")
    assert effects[2] == AcceptWhenStored("m1", True, False)


def test_a_forward_leaves_only_once_its_batch_is_on_disk():
    cluster = protocol()
    routed(cluster, "n2")
    arrive(cluster, "m1")
    [after_flush] = cluster.quiesced(0)
    assert type(after_flush) is AfterFlush
    [submit] = cluster.flushed(after_flush.what, None, 1)
    assert type(submit) is SubmitForward and submit.owner == "n2"
    assert [entry.payload for entry in submit.entries] == [b"m1"]


def test_a_batch_whose_journal_write_failed_is_never_forwarded():
    cluster = protocol()
    routed(cluster, "n2")
    arrive(cluster, "m1")
    [after_flush] = cluster.quiesced(0)
    assert cluster.flushed(after_flush.what, "disk full", 1) == []
    assert cluster.outbound.depths() == {}
    assert cluster.counts["forwards_forgotten"] == 1


def test_an_acknowledgement_removes_the_forwarded_messages_from_the_outbound_store():
    cluster = protocol()
    routed(cluster, "n2")
    arrive(cluster, "m1")
    [after_flush] = cluster.quiesced(0)
    [submit] = cluster.flushed(after_flush.what, None, 1)
    seq = submit.entries[0].forward_seq
    assert cluster.acknowledged("n2", seq) == [Removed(outbound_name("n2", "q"), seq)]
    assert cluster.outbound.depths() == {}


def test_a_message_whose_route_is_not_decided_in_time_is_refused_as_the_handler_being_unavailable():
    cluster = protocol()
    arrive(cluster, "m1", now_ms=0)
    cluster.quiesced(0)
    assert of(Refuse, cluster.tick(HANDLER_TIMEOUT_MS - 1, {})) == []
    [refused] = of(Refuse, cluster.tick(HANDLER_TIMEOUT_MS, {}))
    assert refused.incoming == "m1" and isinstance(refused.error, HandlerUnavailable)
    assert "handler_timeout_ms" in refused.error.description


def test_a_group_the_table_refuses_refuses_its_waiting_messages_naming_routes_max():
    cluster = protocol()
    arrive(cluster, "m1")
    [refused] = cluster.applied(REFUSED, [("q", "g")], None, 1)
    assert refused.incoming == "m1" and isinstance(refused.error, ResourceLimitExceeded)
    assert "routes_max" in refused.error.description


def test_a_failed_claim_is_proposed_again_at_a_later_tick():
    cluster = protocol()
    arrive(cluster, "m1")
    [claim] = cluster.quiesced(0)
    cluster.claim_failed(claim.keys, "no leader")
    assert of(ProposeClaim, cluster.tick(10, {})) == [ProposeClaim([("q", "g")], 10)]


def test_ticks_report_consumer_counts_when_they_change_and_register_until_registered():
    cluster = protocol()
    first = cluster.tick(0, {"q": 1})
    assert of(ReportConsumers, first) == [ReportConsumers({"q": 1}, 0)] and of(Register, first) == [Register(0)]
    assert cluster.tick(10, {"q": 1}) == []
    cluster.registered_now()
    assert cluster.tick(2_000, {"q": 2}) == [ReportConsumers({"q": 2}, 2_000)]


def test_with_a_group_timeout_ticks_refresh_the_routes_this_node_used():
    cluster = protocol(group_timeout_ms=1000)
    routed(cluster, "n2", now_ms=0)
    arrive(cluster, "m1", now_ms=10)
    cluster.registered_now()
    touches = of(ProposeTouch, cluster.tick(20, {}))
    assert touches == [ProposeTouch([("q", "g", "n2")], 20)]


def test_while_a_queue_has_a_cold_tail_ticks_refresh_every_route_of_it_naming_this_node():
    # a cold message's group is unknown until it is read back (node/core/dispatch/cold.py): none of the groups
    # that may have one here may expire meanwhile, or a send elsewhere could place it on another node
    cluster = protocol(group_timeout_ms=1000)
    cluster.applied(ROUTES, [("q", "g1", "n1"), ("q", "g2", "n1"), ("q", "g3", "n2")], 0, 0)
    cluster.registered_now()
    assert of(ProposeTouch, cluster.tick(20, {})) == []
    cluster.broker.restore_cold("q", [7, 8], 200)
    touches = of(ProposeTouch, cluster.tick(1000, {}))
    assert touches == [ProposeTouch([("q", "g1", "n1"), ("q", "g2", "n1")], 1000)]


def test_a_restarted_owner_delivers_what_it_recovered_before_what_waited_for_its_replica():
    # nemesis run P, two owner kills (seeds 15016, 15040): a local producer's send waited for the replica;
    # ready() released it (an EnqueueLocal, carried out after) and then let go of the recovered group,
    # whose dispatch happened at once: the new message went on the wire ahead of the recovered one
    broker = Broker()
    broker.declare_queue(QueueSettings(name="q", durable=True))
    broker.restore("q", Message(b"recovered", "g", seq=5))
    cluster = ClusterProtocol("n1", broker, handler_timeout_ms=HANDLER_TIMEOUT_MS, seq_reserve_block=100)
    cluster.hold_recovered()
    broker.attach_consumer("q", "c", False, 0)
    assert of(Deliver, broker.set_credit("c", 5, 0)) == []  # held until the replica is current
    cluster.applied(ROUTES, [("q", "g", "n1")], 0, 0)
    assert cluster.arrive("incoming", "q", "g", Message(b"new", "g"), True, False, 1) == []  # waits for it
    delivered = []
    for effect in cluster.ready(2):
        if type(effect) is Deliver:  # the broker's, among the protocol's
            delivered.append(effect.message.payload)
        elif type(effect) is EnqueueLocal:
            enqueued = broker.enqueue(effect.queue, effect.message, effect.now_ms)
            delivered += [deliver.message.payload for deliver in of(Deliver, enqueued)]
    assert delivered == [b"recovered", b"new"]


def test_both_ends_of_a_move_refresh_its_route_and_other_members_do_not():
    # the table spares a moving group's route, but its touched time must be fresh when the move ends: a
    # move one end held up past the group timeout would otherwise leave it to the next reaper run
    moves = [("q", "g", "n1", "n2", ("n1", "n2", "n3"))]
    for node, touched in (("n1", True), ("n2", True), ("n3", False)):
        cluster = protocol(node, group_timeout_ms=1000, follows_consumers=True)
        cluster.applied(MOVES, moves, None, 0)
        cluster.applied(ROUTES, [("q", "g", "n2")], 0, 0)
        cluster.registered_now()
        touches = of(ProposeTouch, cluster.tick(1000, {}))
        assert touches == ([ProposeTouch([("q", "g", "n2")], 1000)] if touched else []), node


def test_an_owner_enqueues_a_forwarded_batch_skips_its_resend_and_replies_once_it_is_stored():
    owner = protocol("n2")
    entries = [Entry(7, "q", "g", b"m1", 0, False, 5), Entry(8, "q", "g", b"m2", 0, False, 5)]
    effects = owner.forward_received("n1", entries, "call-1", 10)
    # the queue the first one auto-created is declared first, then the broker's STOREs, then the mark
    assert [type(effect) for effect in effects] == [Declared, Stored, Stored, Declared, AfterFlush]
    assert effects[0].values["name"] == "q" and effects[1].queue == "q"
    assert [effect.origin for effect in effects[1:3]] == [("n1", 7), ("n1", 8)]
    assert effects[3].values == {"name": MARK_PREFIX + "n1", "high_water": 8}
    assert owner.flushed(effects[4].what, None, 11) == [Reply("call-1", 8, None)]
    resend = owner.forward_received("n1", entries, "call-2", 12)
    assert [type(effect) for effect in resend] == [AfterFlush]  # nothing enqueued again
    assert owner.counts["resends_skipped"] == 2


def test_an_owner_whose_journal_write_of_a_forwarded_batch_fails_refuses_it_and_stops():
    # the batch is in its broker (a consumer may have it already) but not on disk, and the source sends
    # it again: only a restart from the journal, which has neither the batch nor its mark, is right
    owner = protocol("n2")
    effects = owner.forward_received("n1", [Entry(7, "q", "g", b"m1", 0, False, 5)], "call-1", 10)
    reply, stop = owner.flushed(effects[-1].what, "disk full", 11)
    assert reply.reply_to == "call-1" and reply.high_water is None
    assert isinstance(reply.error, ResourceLimitExceeded) and "disk full" in reply.error.description
    assert type(stop) is StopNode and "n1" in stop.reason and "disk full" in stop.reason
    assert owner.closed and owner.quiesced(12) == [] and owner.tick(12, {"q": 1}) == []


def test_two_failed_calls_of_one_journal_batch_stop_the_owner_once():
    owner = protocol("n2")
    first = owner.forward_received("n1", [Entry(7, "q", "g", b"m1", 0, False, 5)], "call-1", 10)
    second = owner.forward_received("n3", [Entry(4, "q", "h", b"m2", 0, False, 5)], "call-2", 10)
    assert [type(effect) for effect in owner.flushed(first[-1].what, "disk full", 11)] == [Reply, StopNode]
    assert [type(effect) for effect in owner.flushed(second[-1].what, "disk full", 11)] == [Reply]


def test_a_resend_alone_whose_journal_write_fails_is_refused_without_stopping_the_owner():
    owner = protocol("n2")
    entries = [Entry(7, "q", "g", b"m1", 0, False, 5)]
    first = owner.forward_received("n1", entries, "call-1", 10)
    assert owner.flushed(first[-1].what, None, 11) == [Reply("call-1", 7, None)]
    resend = owner.forward_received("n1", entries, "call-2", 12)  # all skipped: nothing new in memory
    [reply] = owner.flushed(resend[-1].what, "disk full", 13)
    assert reply.high_water is None and isinstance(reply.error, ResourceLimitExceeded)
    assert not owner.closed and owner.inbound.high_water["n1"] == 7


def test_a_restart_recovers_the_seq_reservation_and_the_sources_high_water():
    cluster = protocol()
    assert cluster.recover_declaration({"name": SEQ_RESERVATION, "reserved": 500})
    assert cluster.recover_declaration({"name": MARK_PREFIX + "n3", "high_water": 42})
    assert not cluster.recover_declaration({"name": "q"})
    assert cluster.broker.next_seq == 500 and cluster.inbound.high_water == {"n3": 42}


# ---- the layout: pure cores import nothing that blocks, threads or talks --------------------------

BANNED = {"threading", "time", "socket", "grpc", "proton", "pysyncobj", "asyncio", "random"}
PURE = ["node/core", "handler/route_table.py", "handler/leader_duties.py"]


def test_a_group_this_node_moves_messages_into_is_routed_here_at_once():
    cluster = protocol()
    cluster.broker.declare_queue(QueueSettings(name="dest", durable=True))
    routed(cluster, "n1")
    cluster.broker.enqueue("q", Message(b"m1", "g"), 0)  # the adapter's EnqueueLocal
    cluster.broker.enqueue("q", Message(b"m2", "taken"), 0)
    cluster.quiesced(1)

    assert cluster.broker.move_group("q", "g", "dest", None, 2)[0] == 1
    assert cluster.broker.move_group("q", "taken", "dest", None, 2)[0] == 1
    cluster.applied(ROUTES, [("dest", "taken", "n2")], 3, 3)  # this one lives elsewhere: left, logged

    assert of(ProposeTouch, cluster.quiesced(3)) == [ProposeTouch([("dest", "g", "n1")], 3)]
    assert of(ProposeTouch, cluster.quiesced(4)) == []  # once


def test_a_dead_letter_s_group_is_routed_to_the_node_that_dead_lettered_it():
    cluster = protocol()
    routed(cluster, "n1")
    broker = cluster.broker
    broker.enqueue("q", Message(b"m1", "g"), 0)  # the adapter's EnqueueLocal
    cluster.quiesced(1)
    broker.attach_consumer("q", 7, False, 1)
    [deliver] = [effect for effect in broker.set_credit(7, 1, 1) if type(effect).__name__ == "Deliver"]
    broker.settle(7, deliver.delivery_id, Outcome.REJECTED, 2)

    assert "q.DLQ" in broker.queues
    assert ProposeTouch([("q.DLQ", "g", "n1")], 3) in cluster.quiesced(3)


def test_the_pure_cores_import_no_thread_socket_clock_or_network_library():
    files = []
    for path in PURE:
        target = REPO / path
        files += sorted(target.rglob("*.py")) if target.is_dir() else [target]
    assert len(files) > 5
    for file in files:
        for node in ast.walk(ast.parse(file.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in BANNED, f"{file.relative_to(REPO)} imports {name}"
