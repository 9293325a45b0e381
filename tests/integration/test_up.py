"""`grouper up`, the README's main job: a local cluster in one command, stopped by Ctrl-C."""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import threading
import time

from proton import Message

from tests.integration.harness import REPO

START_WAIT_S = 60.0


def free_base_port(span: int = 30) -> int:
    """A base port with `span` free ports above it (checked by binding each)."""
    for _ in range(50):
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        base = probe.getsockname()[1]
        probe.close()
        if base + span > 65535:
            continue
        sockets = []
        try:
            for port in range(base, base + span):
                sock = socket.socket()
                sockets.append(sock)
                sock.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError("no run of free ports found")


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
        assert [line.split(":")[0] for line in lines if line.startswith("node")] == ["node0", "node1", "node2"]
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
