"""The raft member runs in a child process of the node (handler/member.py) and lives and dies with it.

What is promised:
- the node's raft member is a separate process, its child, whose command line carries no secret;
- it ignores the signals a terminal or a supervisor sends to the node's process group (SIGINT,
  SIGTERM, SIGHUP): only the node stops it, in order, when it stops;
- kill -9 of the node ends the member too, and its raft port is free for the node's restart;
- if the member dies while the node runs, the node stops at once with status 70 and says why, and a
  restart serves again;
- when the leader's process dies, its followers see its connection close and elect at once instead
  of waiting out their election timeout (how fast: bench/cluster.py's leader-kill phase);
- it runs under the real-time round-robin policy where the node may set it (root here), and says so;
  without CAP_SYS_NICE it says what it runs at instead.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.cluster import Cluster
from tests.integration.clients import Client, group_message, queue_toml
from tests.integration.harness import REPO, alive, member_children, wait_until

WAIT_S = 20.0  # bound of every wait for a process to appear or go


def gone(pid: int) -> bool:
    return not alive(pid)  # a zombie has ended; its parent (the killed node) will never reap it


def port_free(port: int) -> bool:
    probe = socket.socket()
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        probe.close()


@pytest.fixture
def cluster(tmp_path):
    cluster = Cluster(tmp_path, size=3, config_text=queue_toml("jobs", durable=True))
    try:
        yield cluster.start()
    finally:  # a start that failed half way leaves nodes running too
        cluster.kill_all()


def member_of(node) -> int:
    found = member_children(node.process.pid)
    assert len(found) == 1, f"expected one child process (the raft member) of the node, found {found}"
    return found[0]


def test_the_member_is_a_child_without_secrets_on_its_command_line_and_ignores_signals_to_the_group(cluster):
    node = cluster.nodes[0]
    member = member_of(node)
    argv = Path(f"/proc/{member}/cmdline").read_bytes().split(b"\0")
    # only its channel's descriptor and its node's pid
    assert argv[1:-1] == [b"-m", b"handler.member", argv[3], str(node.process.pid).encode()], argv
    assert argv[3].isdigit() and argv[-1] == b"", argv
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        os.kill(member, signum)
    with Client(node) as client:  # raft still decides routes: a new group is accepted
        client.producer("jobs").send(group_message("g1", 1))
    assert not gone(member)
    assert node.stop() == 0, "\n".join(node.output)
    wait_until(lambda: gone(member), "the member ended with the node's orderly stop")


def test_kill_9_of_the_node_ends_its_member_and_frees_the_raft_port_for_the_restart(cluster):
    node = cluster.nodes[0]
    member = member_of(node)
    node.kill()
    wait_until(lambda: gone(member), "the member ended after kill -9 of its node")
    wait_until(lambda: port_free(cluster.raft_ports[0]), "the raft port is free")
    node.start()
    cluster.wait_leader()
    with Client(node) as client:
        client.producer("jobs").send(group_message("g1", 1))


def test_the_members_death_stops_the_node_with_status_70_saying_why_and_a_restart_serves_again(cluster):
    node = cluster.nodes[0]
    member = member_of(node)
    os.kill(member, signal.SIGKILL)
    assert node.process.wait(WAIT_S) == 70
    assert any("raft member process ended" in line for line in node.output), "\n".join(node.output[-20:])
    node.start()
    cluster.wait_leader()
    with Client(node) as client:
        client.producer("jobs").send(group_message("g1", 1))


def test_the_followers_of_a_killed_leader_elect_as_soon_as_its_connection_closes(cluster):
    leader = cluster.wait_leader()
    cluster.nodes[leader].kill()
    cluster.wait_leader(excluding=cluster.node_ids[leader])
    followers = [node for index, node in enumerate(cluster.nodes) if index != leader]
    said = [line for node in followers for line in node.output
            if f"raft leader {cluster.node_ids[leader]} closed its connection: electing a new one" in line]
    assert said, "no follower elected on the closed connection:\n" + "\n".join(
        line for node in followers for line in node.output[-15:])


def test_the_member_runs_real_time_where_it_may_and_says_so(cluster):
    assert os.geteuid() == 0, "the test suite runs as root (CI does): a node may then set real-time scheduling"
    for node in cluster.nodes:
        member = member_of(node)
        assert os.sched_getscheduler(member) == os.SCHED_RR
        assert any(f"raft member process {member} runs at real-time (SCHED_RR 1)" in line for line in node.output)


def test_without_cap_sys_nice_the_member_says_what_it_runs_at_instead():
    # setpriv drops CAP_SYS_NICE from a root process, as a container's default capabilities do
    result = subprocess.run(["setpriv", "--bounding-set", "-sys_nice", "--inh-caps", "-sys_nice", sys.executable,
                             "-c", "from handler.member_priority import raise_priority; print(raise_priority())"],
                            cwd=REPO, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("the node's priority (real-time scheduling and nice -10 need CAP_SYS_NICE"), \
        result.stdout
