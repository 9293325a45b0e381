"""Rolling upgrade drill: a 3-node cluster of the previous release upgraded to this one, node by node, under load.

The previous release is PREVIOUS_RELEASE, the last commit before format versions (a pinned hash: CI
runs on a full clone of main, so the history has it). Its tree is exported with `git archive` into the
test's directory and run from there (working directory and PYTHONPATH: `-m node.cli` and the raft
member both import from it, ahead of the installed package); its dependencies are this environment's,
so no network is needed.

The drill: the old cluster with the queue durable on every node, consumers on every node (so every
node owns groups), a producer on every node over the same groups; then, one node at a time, the
old node is stopped (SIGTERM, as Kubernetes stops a pod), started from this tree on the same data
directory and ports, and waited for until it is a member again with a leader and every member
registered (quorum), with load before, during and after each step. Then the checker judges every
log: no accepted message lost, no order violation, no group held by two consumers at once, no
duplicate among confirmed acceptances; and every refusal a producer saw carries one of the
conditions README documents for a node going away (ALLOWED_REFUSALS). Every wait is bounded and
polls; nothing asserts a duration.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from node.admin.client import API_VERSION_KEY
from proto import admin_pb2
from proto.admin_pb2_grpc import AdminServiceStub

from node.store import records
from node.store.journal import JOURNAL_FILE
from tests.drills.checker import load_jsonl
from tests.drills.test_cluster_drills import ADMIN_TIMEOUT_MS, GROUPS, LOAD_S, QUEUE, Drill, assert_ok
from tests.integration.cluster import Cluster
from tests.integration.clients import queue_toml
from tests.integration.harness import REPO

PREVIOUS_RELEASE = "b2ebdcb1b7ca0277d5ae23bd7e44e71d70689e3c"
# what a producer may hear while the node it sends through, or its group's owner, restarts: the
# grouping handler briefly without a leader or quorum, a link detached by the stopping node
ALLOWED_REFUSALS = {"grouper:grouping-handler-unavailable", "amqp:connection:forced", "amqp:resource-limit-exceeded"}


def export_previous_release(directory: Path) -> Path:
    tree = directory / "previous-release"
    tree.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS_RELEASE], capture_output=True,
                             timeout=60)
    if archive.returncode != 0:
        pytest.fail(f"cannot export the previous release {PREVIOUS_RELEASE} (a shallow clone? fetch the "
                    f"full history of main): {archive.stderr.decode(errors='replace')}")
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive.stdout, check=True, timeout=60)
    return tree


def run_previous_release(node, tree: Path) -> None:
    # env --chdir: `python -m` puts the working directory first on sys.path, ahead of PYTHONPATH
    node.command_prefix = ("env", f"--chdir={tree}")
    node.environment = {**os.environ, "PYTHONPATH": str(tree)}


def run_this_release(node) -> None:
    node.command_prefix = ()
    node.environment = None


@pytest.fixture
def old_cluster(tmp_path):
    tree = export_previous_release(tmp_path)
    cluster = Cluster(tmp_path, 3, queue_toml(QUEUE, durable=True))
    for node in cluster.nodes:
        run_previous_release(node, tree)
    cluster.previous_release = tree
    try:
        yield cluster.start()
    finally:  # a start that failed half way leaves nodes running too (a CI run left one behind)
        cluster.kill_all()
        for index, node in enumerate(cluster.nodes):
            (tmp_path / f"node{index}.log").write_text("\n".join(node.output) + "\n")


def admin_refusal(node, version: str) -> str | None:
    """The status name a node answers a ListQueues call speaking admin API `version` with (None: answered)."""
    with grpc.insecure_channel(node.admin_address) as channel:
        try:
            AdminServiceStub(channel).ListQueues(admin_pb2.ListQueuesRequest(), timeout=ADMIN_TIMEOUT_MS / 1000,
                                                 metadata=((API_VERSION_KEY, version),))
            return None
        except grpc.RpcError as error:
            return error.code().name


def previous_release_cli(node, tree: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "node.cli", *args, "--node", node.admin_address], cwd=tree,
                          env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True, text=True, timeout=60)


def refusal_conditions(drill: Drill) -> dict[str, int]:
    seen: dict[str, int] = {}
    for line in load_jsonl([producer.log_path for producer in drill.load.producers]):
        if line["outcome"] in ("rejected", "released", "modified"):
            seen[line["condition"]] = seen.get(line["condition"], 0) + 1
    return seen


def test_a_rolling_upgrade_one_node_at_a_time_under_grouped_load_loses_and_reorders_nothing(old_cluster, tmp_path):
    cluster = old_cluster
    drill = Drill("rolling_upgrade", cluster, tmp_path)
    with drill.load:
        drill.start_consumers({0: 1, 1: 1, 2: 1})
        drill.start_producers()
        drill.run_load(LOAD_S, list(drill.producers.values()), "on the previous release")
        for node in cluster.nodes:  # the previous release wrote them: journals without a format marker
            assert not (node.data_dir / JOURNAL_FILE).read_bytes().startswith(records.encode_format())
            assert admin_refusal(node, "99") is None  # it reads no version, so it refuses none
        upgraded = []
        for index in (2, 1, 0):  # as a StatefulSet rolls: the highest ordinal first
            node = cluster.nodes[index]
            assert node.stop() == 0, "\n".join(node.output[-30:])
            run_this_release(node)
            node.start()
            cluster.wait_for(lambda status: status["leader"] and len(status["members"]) == 3
                             and all(member["amqp_address"] for member in status["members"]),
                             f"node {index} a member again with a leader and quorum", via=index)
            upgraded.append(cluster.node_ids[index])
            # this release now: it refuses an admin API version it does not read, and still answers
            # the previous release's CLI (which sends no version)
            assert admin_refusal(node, "99") == "FAILED_PRECONDITION"
            old_cli = previous_release_cli(node, cluster.previous_release, "queue", "list")
            assert old_cli.returncode == 0 and QUEUE in old_cli.stdout, old_cli.stderr
            drill.run_load(LOAD_S / 2, list(drill.producers.values()), f"after upgrading node {index}")
        report = drill.check()
    refusals = refusal_conditions(drill)
    drill.summary.update({"previous_release": PREVIOUS_RELEASE, "upgraded_in_order": upgraded,
                          "refusal_conditions": refusals, "groups": len(GROUPS)})
    drill.write_summary()
    assert_ok(report)
    assert set(refusals) <= ALLOWED_REFUSALS, refusals
