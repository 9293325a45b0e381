"""`grouper audit` on the logs of a real drill: one node, grouped load, a consumer leaving mid-run.

The drill harness (tests/drills/load.py) writes the send, delivery and attach/detach logs; the audit
must pass them, agree with the checker's counts, and explain every group that moved to the other
consumer by the first one leaving.
"""

from __future__ import annotations

import json
import time

from node.cli import main
from tests.drills.checker import check_files
from tests.drills.load import start_load
from tests.integration.clients import queue_toml
from tests.integration.conftest import node_factory  # noqa: F401  (the real-node fixture)

QUEUE = "audited"
GROUPS = [f"g{index}" for index in range(10)]
PROGRESS_TIMEOUT_S = 20.0


def wait_for_accepted(load, count: int) -> None:
    deadline = time.monotonic() + PROGRESS_TIMEOUT_S
    while load.accepted() < count:
        assert time.monotonic() < deadline, f"only {load.accepted()} of {count} sends accepted in time"
        time.sleep(0.05)


def test_a_consumer_leaving_an_exclusive_queue_moves_its_groups_for_a_logged_reason(spark, node_factory, tmp_path):
    node = node_factory(queue_toml(QUEUE, group_policy="exclusive"))
    with start_load([(node.url, QUEUE, GROUPS)], [(node.url, QUEUE, 5), (node.url, QUEUE, 5)], tmp_path / "logs",
                    in_flight_max=20) as load:
        wait_for_accepted(load, 150)
        # the busier consumer leaves (the first to attach may well own every group); its groups move
        leaving = max(load.consumers, key=lambda consumer: consumer.received)
        leaving.stop()
        wait_for_accepted(load, load.accepted() + 150)

    out = tmp_path / "report.json"
    status = main(["audit", *map(str, [*load.delivery_paths, *load.event_paths]),
                   "--sends", *map(str, load.send_paths), "--json", str(out)])
    report = json.loads(out.read_text())
    checked = check_files(load.send_paths, load.delivery_paths)
    assert checked.ok, checked.summary()
    assert status == 0 and report["ok"], report["broken"]
    entry = report["queues"][0]
    assert (entry["queue"], entry["sent"]["lines"], entry["deliveries"], entry["delivered"]) == (
        QUEUE, checked.sends, checked.deliveries, checked.delivered)
    assert report["lines"]["attach"] >= 2 and report["lines"]["detach"] >= 1
    changes = entry["consumer_changes"]
    assert changes["changes"] >= 1, "no group moved off the consumer that left"
    assert set(changes["by_reason"]) == {"consumer_gone"}, changes
    assert {consumer["consumer"] for consumer in entry["per_consumer"]} == {"c0", "c1"}  # both received
