"""`grouper queue list` in a cluster: sums over the members, names each one's share and the silent ones
(node/admin/queue_listing.py)."""

from node.admin.queue_listing import answered_line, cluster_queues, depth_by_node


def _stats(name: str, depth: int, consumers: int = 0) -> dict:
    return {"name": name, "depth_messages": depth, "acquired_messages": 0, "consumers": consumers, "groups": depth,
            "owned_groups": 0}


def _member(node: str, queues: list, error: str = "") -> dict:
    return {"node": node, "queues": queues, "error": error}


STATUS = {"node": "n0:7000", "members": [
    _member("n1:7000", [_stats("trades", 3, consumers=1), _stats("orders", 1)]),
    _member("n0:7000", [_stats("trades", 0)]),
    _member("n2:7000", [], error="unreachable: connection refused"),
]}


def test_each_queue_is_summed_over_the_members_that_answered():
    queues, missing = cluster_queues(STATUS)

    assert [(q["name"], q["depth_messages"], q["consumers"]) for q in queues] == [("orders", 1, 0), ("trades", 3, 1)]
    assert depth_by_node(queues[1]) == "n0:7000=0, n1:7000=3"
    assert missing == [("n2:7000", "unreachable: connection refused")]


def test_a_member_that_did_not_answer_is_named_with_its_reason():
    _, missing = cluster_queues(STATUS)
    assert answered_line(STATUS, missing) == ("cluster-wide: 2 of 3 nodes answered (n0:7000, n1:7000; asked "
                                              "n0:7000); n2:7000 did not: unreachable: connection refused")
