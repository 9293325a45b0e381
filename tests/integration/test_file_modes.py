"""Issue 26 finding 7, files: a real node's data directory is 0700 and every file it writes there 0600
(journal, lock, traces, raft journal and dump), `grouper up`'s directory and log files too, and a
secret file others can read is named at start (node/file_modes.py). Each data directory exists
beforehand, 0755, so the node meets a directory too open, as after an upgrade."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import threading

from proton import Delivery

from tests.integration.clients import queue_toml
from tests.integration.cluster import Cluster
from tests.integration.harness import REPO, ManualReceiver, NodeProcess, connect, grouped, send_outcome, wait_until
from tests.integration.test_up import START_WAIT_S, free_base_port

CONFIG = queue_toml("orders", trace=True)
MESSAGES = 20


def modes_open_to_others(directory) -> dict[str, str]:
    """Every path under `directory` (itself included) its group or others may use, with its mode."""
    found = {}
    for root, directories, files in os.walk(directory):
        for path in [root, *(os.path.join(root, name) for name in files)]:
            mode = stat.S_IMODE(os.lstat(path).st_mode)
            if mode & 0o077:
                found[os.path.relpath(path, directory)] = f"{mode:04o}"
    return found


def written_files(directory) -> set[str]:
    return {os.path.relpath(os.path.join(root, name), directory)
            for root, _, files in os.walk(directory) for name in files}


def send_and_take(node, count: int, taken: int) -> None:
    connection = connect(node)
    try:
        sender = connection.create_sender("orders")
        for index in range(count):
            message = grouped(f"m{index}", f"g{index % 4}")
            message.durable = True
            assert send_outcome(sender, message)[0] == Delivery.ACCEPTED
        if taken:
            for held in ManualReceiver(connection, "orders", "c0").fetch_many(taken):
                held.accept()
    finally:
        connection.close()


def test_a_node_keeps_its_data_directory_and_every_file_in_it_private(tmp_path):
    node = NodeProcess(tmp_path / "node", CONFIG)
    node.data_dir.chmod(0o755)  # as made under umask 022 (by an operator, or an older version)
    try:
        node.start()
        send_and_take(node, MESSAGES, MESSAGES // 2)
        wait_until(lambda: list((node.data_dir / "traces").glob("*.jsonl")), "the trace file")
        assert node.stop() == 0
    finally:
        node.kill()
    assert {"journal.dat", "journal.lock"} <= written_files(node.data_dir)
    assert any(name.startswith("traces/") for name in written_files(node.data_dir))
    assert modes_open_to_others(node.data_dir) == {}
    assert any("made it 0700" in line for line in node.output), node.output


def test_a_two_node_cluster_keeps_its_raft_files_private_and_names_a_readable_secret(tmp_path):
    secret = tmp_path / "raft.secret"
    secret.write_text("s" * 32 + "\n")
    secret.chmod(0o644)  # what `openssl rand -base64 32 > raft.secret` leaves under umask 022
    cluster = Cluster(tmp_path, 2, CONFIG, ("--raft-secret-file", str(secret)))
    for node in cluster.nodes:
        node.data_dir.chmod(0o755)
    try:
        cluster.start()
        for node in cluster.nodes:
            send_and_take(node, MESSAGES // 2, 0)  # a group may live on the other node
        for node in cluster.nodes:
            wait_until(lambda: list((node.data_dir / "traces").glob("*.jsonl")), "the trace file")
        for node in cluster.nodes:
            assert node.stop() == 0
    finally:
        cluster.kill_all()
    for node in cluster.nodes:
        assert {"journal.dat", "raft/raft.journal"} <= written_files(node.data_dir)
        assert modes_open_to_others(node.data_dir) == {}
        warning = [line for line in node.output if f"secret file {secret}" in line]
        assert warning and f"chmod 600 {secret}" in warning[0] and "every local user" in warning[0], node.output


def test_grouper_up_keeps_its_directory_and_log_files_private(tmp_path):
    base = free_base_port()
    process = subprocess.Popen([sys.executable, "-m", "node.cli", "up", "--nodes", "1", "--data-dir",
                                str(tmp_path / "cluster"), "--base-port", str(base)],
                               cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    ready = threading.Event()

    def read():
        for line in process.stdout:
            lines.append(line.rstrip("\n"))
            if line.startswith("node0:"):  # printed once the node is ready (a lone node waits 30 s for a leader
                ready.set()                 # before `ready`)

    threading.Thread(target=read, daemon=True).start()
    try:
        assert ready.wait(START_WAIT_S), "\n".join(lines)
    finally:
        process.send_signal(signal.SIGINT)
        process.wait(START_WAIT_S)
    assert {"node0.log", "node0/journal.dat"} <= written_files(tmp_path / "cluster")
    assert modes_open_to_others(tmp_path / "cluster") == {}


def test_the_raft_member_process_keeps_its_files_private_under_any_umask_of_its_node(tmp_path):
    """A node run inside another process (tests) does not pass runtime.run's umask: the member process
    is started with umask 0077 of its own."""
    from handler.member_process import MemberProcess
    from tests.integration.cluster import free_ports

    raft_dir = tmp_path / "raft"
    before = os.umask(0o022)
    try:
        member = MemberProcess(f"127.0.0.1:{free_ports(1)[0]}", [], str(raft_dir), on_applied=lambda *_: None,
                               on_ready=lambda: None, on_lost=lambda: None, election_timeout_min_ms=200,
                               election_timeout_max_ms=500, routes_max=1000, bind_host="127.0.0.1")
        try:
            wait_until(lambda: (raft_dir / "raft.journal").exists(), "the raft journal")
        finally:
            member.stop()
    finally:
        os.umask(before)
    assert modes_open_to_others(raft_dir) == {}


def test_a_node_with_users_on_a_routable_host_refuses_a_users_file_others_can_read(tmp_path):
    data_dir = tmp_path / "data"
    added = subprocess.run([sys.executable, "-m", "node.cli", "user", "add", "admin", "--role", "administrator",
                            "--password-stdin", "--data-dir", str(data_dir)], cwd=REPO, input="secret-password\n",
                           capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr
    users = data_dir / "users.json"
    users.chmod(0o644)  # as a copy made with the wrong umask would be
    started = subprocess.run([sys.executable, "-m", "node.cli", "node", "--host", "0.0.0.0", "--data-dir",
                              str(data_dir), "--amqp-port", "0", "--admin-port", "0", "--http-port", "0"],
                             cwd=REPO, capture_output=True, text=True, timeout=60)
    assert started.returncode == 1 and "ready" not in started.stdout, started.stdout + started.stderr
    assert "cannot start: 1 secret file(s) are open to other local users" in started.stderr, started.stderr
    assert f"chmod 600 {users}" in started.stderr and "allow_loose_secret_files" in started.stderr
