"""`grouper up`, the README's main job: a local cluster in one command, stopped by Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

from proton import Message

from tests.integration.cli import grouper
from tests.integration.grouper_up import GrouperUp, descendants, free_base_port, wait_gone
from tests.integration.harness import REPO

START_WAIT_S = 60.0


def test_up_starts_three_nodes_prints_the_leader_serves_and_stops_on_ctrl_c(tmp_path):
    base = free_base_port()
    process = subprocess.Popen([sys.executable, "-m", "node.cli", "up", "--nodes", "3", "--data-dir",
                                str(tmp_path / "cluster"), "--base-port", str(base)],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def read():
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("ready"):
                ready.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(START_WAIT_S), "\n".join(lines)
        assert [line.split(":")[0] for line in lines if line.startswith("node") and " amqp " in line] == \
            ["node0", "node1", "node2"]
        users_file = tmp_path / "cluster" / "users.json"  # one file for every node, absent: open
        for index in range(3):
            assert f"node{index} security: open: no user database at {users_file}, every client is anonymous and " \
                   f"may do everything" in lines
            assert f"node{index} cluster security: forwarding signed with a key from the raft secret (on the admin " \
                   f"port); raft encrypted (1 secret accepted)" in lines
        assert oct((tmp_path / "cluster" / "raft.secret").stat().st_mode & 0o777) == oct(0o600)
        leader = next(line for line in lines if line.startswith("leader: ")).split(": ", 1)[1]
        assert leader in {f"127.0.0.1:{base + 10 * i + 2}" for i in range(3)}
        status = subprocess.run([sys.executable, "-m", "node.cli", "cluster", "status", "--json", "--node",
                                 f"127.0.0.1:{base + 11}"], cwd=REPO, capture_output=True, text=True, timeout=30)
        members = json.loads(status.stdout)["members"]
        assert [m["amqp_address"] for m in members] == [f"127.0.0.1:{base + 10 * i}" for i in range(3)]

        from proton.utils import BlockingConnection
        producer = BlockingConnection(f"amqp://127.0.0.1:{base + 10}", timeout=10)
        consumer = BlockingConnection(f"amqp://127.0.0.1:{base + 20}", timeout=10)
        receiver = consumer.create_receiver("work", name="c", credit=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # until the route table knows node2's consumer
            status = subprocess.run([sys.executable, "-m", "node.cli", "cluster", "status", "--json", "--node",
                                     f"127.0.0.1:{base + 1}"], cwd=REPO, capture_output=True, text=True, timeout=30)
            if json.loads(status.stdout)["members"][2]["consumers"].get("work"):
                break
        sender = producer.create_sender("work", name="p")
        message = Message(body="hello")
        message.group_id = "g"
        sender.send(message)
        got = receiver.receive(timeout=max(1.0, deadline - time.monotonic()))
        receiver.accept()
        assert got.body == "hello"
        producer.close()
        consumer.close()
    finally:
        process.send_signal(signal.SIGINT)
        code = process.wait(60)
    assert code == 0, "\n".join(lines)
    assert lines[-2:] == ["stopping", "stopped"]
    assert all((tmp_path / "cluster" / f"node{i}.log").exists() for i in range(3))
    for index in range(3):  # a node does not ask its own admin port whether the cluster knows it
        assert "could not ask" not in (tmp_path / "cluster" / f"node{index}.log").read_text()


def test_help_names_every_port_of_a_node():
    result = grouper("up", "--help")
    assert result.returncode == 0
    assert "base+10i (AMQP), +1 (admin), +2 (raft), +3 (HTTP)" in " ".join(result.stdout.split())


def test_a_sigint_after_the_reader_of_its_output_has_gone_stops_every_node(tmp_path):
    """`grouper up | head -1`, then Ctrl-C: the failed writes do not skip the shutdown."""
    read_end, write_end = os.pipe()
    up = GrouperUp(tmp_path / "cluster")
    try:
        up.start(stdout=write_end)
        os.close(write_end)
        assert os.read(read_end, 4096).startswith(b"starting 3 nodes")
        os.close(read_end)  # the reader goes: every later write of grouper up fails
        tree = up.wait_nodes_ready()
        code = up.stop()
        assert wait_gone(tree) == [], f"left running after grouper up stopped: {tree}"
        assert code == 0, up.process.stderr.read()
    finally:
        up.kill_tree()


def test_no_node_outlives_a_grouper_up_killed_with_sigkill(tmp_path):
    up = GrouperUp(tmp_path / "cluster").start()
    try:
        tree = descendants(up.process.pid)
        assert len(tree) == 6  # three nodes and their raft members
        up.process.kill()
        up.process.wait()
        left = wait_gone(tree)
        assert left == [], f"left running after grouper up was killed: {[(pid, process_line(pid)) for pid in left]}"
    finally:
        up.kill_tree()


def test_a_second_grouper_up_on_the_same_ports_says_why_its_node_did_not_start(tmp_path):
    first = GrouperUp(tmp_path / "first", nodes=1).start()
    try:
        second = subprocess.run([sys.executable, "-m", "node.cli", "up", "--nodes", "1", "--data-dir",
                                 str(tmp_path / "second"), "--base-port", str(first.base_port)], cwd=REPO,
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 1
        assert f"node0 did not start: it exited with status 1; the end of {tmp_path / 'second' / 'node0.log'}:" \
               in second.stderr
        assert f"cannot listen for AMQP on 127.0.0.1:{first.base_port}" in second.stderr, second.stderr
    finally:
        first.kill_tree()


def process_line(pid: int) -> str:
    """What a leftover process is and where it stands, for the failure's message."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            command = file.read().replace(b"\0", b" ").decode(errors="replace")[:160]
        with open(f"/proc/{pid}/status") as file:
            fields = dict(line.split(":", 1) for line in file if ":" in line)
        return f"{command} | state {fields.get('State', '?').strip()}, ppid {fields.get('PPid', '?').strip()}"
    except OSError as error:
        return f"unreadable: {error}"
