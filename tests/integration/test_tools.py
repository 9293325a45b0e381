"""`grouper send`, `receive`, `browse` and `perf` against real nodes, run as a newcomer runs them; and a
second node on one host given only its own AMQP and admin ports."""

from __future__ import annotations

import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from tests.integration.cli import CLI_TIMEOUT_S, grouper, grouper_ok, write_users_file
from tests.integration.cluster import Cluster
from tests.integration.harness import REPO

LINE = re.compile(r"group=(?P<group>\S+) seq=(?P<seq>\d+) id=(?P<id>\S+) delivery-count=(?P<count>\d+) "
                  r"consumer=(?P<consumer>\S+) body=")
WAIT_S = 30.0  # for a background command's line, or a node's "ready"


def messages(stdout: str) -> list[dict]:
    return [match.groupdict() for match in map(LINE.match, stdout.splitlines()) if match]


def by_group(lines: list[dict]) -> dict[str, list[int]]:
    groups: dict[str, list[int]] = {}
    for line in lines:
        groups.setdefault(line["group"], []).append(int(line["seq"]))
    return groups


class Background:
    """A grouper command left running; its stdout lines collected as they come."""

    def __init__(self, *args: str):
        self.process = subprocess.Popen([sys.executable, "-m", "node.cli", *args], cwd=REPO, text=True,
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.process.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, prefix: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not any(line.startswith(prefix) for line in self.lines):
            assert self.process.poll() is None or time.monotonic() < deadline, "\n".join(self.lines)
            assert time.monotonic() < deadline, f"no line starting {prefix!r} in {WAIT_S} s:\n" + "\n".join(self.lines)
            time.sleep(0.02)

    def stop(self, signum: int = signal.SIGINT) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signum)
        return self.process.wait(CLI_TIMEOUT_S)


def test_receive_prints_what_send_sent_each_group_in_sequence(node):
    sent = grouper_ok("send", "orders", "--create", "--group", "a", "--group", "b", "--count", "6", "--node",
                      node.amqp_address)
    assert "6 message(s) accepted" in sent

    received = grouper_ok("receive", "orders", "--count", "6", "--node", node.amqp_address)

    lines = messages(received)
    assert by_group(lines) == {"a": [1, 2, 3], "b": [1, 2, 3]}
    assert [line["id"] for line in lines if line["group"] == "a"] == ["a-1", "a-2", "a-3"]
    assert {line["count"] for line in lines} == {"0"}
    assert len({line["consumer"] for line in lines}) == 1
    assert grouper_ok("receive", "orders", "--timeout-s", "0.5", "--node", node.amqp_address).startswith(
        "0 message(s) received")


def test_browse_prints_the_messages_and_leaves_them_queued(node):
    grouper_ok("send", "orders", "--create", "--group", "a", "--count", "3", "--body", "hello", "--node",
               node.amqp_address)

    first = messages(grouper_ok("browse", "orders", "--node", node.amqp_address, "--timeout-s", "1"))
    second = messages(grouper_ok("browse", "orders", "--node", node.amqp_address, "--timeout-s", "1"))

    assert by_group(first) == by_group(second) == {"a": [1, 2, 3]}
    assert by_group(messages(grouper_ok("receive", "orders", "--count", "3", "--node", node.amqp_address))) == \
        {"a": [1, 2, 3]}


def test_a_group_held_by_one_receiver_reaches_no_other_until_it_lets_go(node):
    grouper_ok("send", "orders", "--create", "--group", "a", "--group", "b", "--count", "4",
               "--node", node.amqp_address)
    holder = Background("receive", "orders", "--count", "1", "--hold", "--node", node.amqp_address)
    try:
        holder.wait_for("holding 1 message(s) unsettled")
        assert by_group(messages("\n".join(holder.lines))) == {"a": [1]}

        other = messages(grouper_ok("receive", "orders", "--timeout-s", "1", "--node", node.amqp_address))
        assert by_group(other) == {"b": [1, 2]}
    finally:
        assert holder.stop(signal.SIGTERM) == 0

    after = messages(grouper_ok("receive", "orders", "--count", "2", "--node", node.amqp_address))
    assert [(line["group"], line["seq"], line["count"]) for line in after] == [("a", "1", "1"), ("a", "2", "0")]


def test_perf_against_one_node_counts_every_message_once_and_in_order(node):
    result = grouper("perf", "--node", node.amqp_address, "--messages", "2000", "--groups", "20", "--producers", "2",
                     "--consumers", "3", "--prefetch", "50", "--durable")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "sent 2000, accepted 2000, refused 0" in result.stdout
    assert "received 2000 in" in result.stdout
    assert "lost 0, duplicates 0, order violations 0" in result.stdout
    assert re.search(r"latency ms \(send to receive\): p50 [\d.]+ +p90 [\d.]+ +p99 [\d.]+", result.stdout)
    assert "\r" not in result.stdout  # no progress line when stdout is not a terminal


def test_perf_spreads_producers_and_consumers_over_the_node_list_at_a_rate(node_factory):
    first, second = node_factory(), node_factory()
    result = grouper("perf", "--nodes", f"{first.amqp_address},{second.amqp_address}", "--queue", "spread",
                     "--producers", "2", "--consumers", "2", "--groups", "4", "--rate", "400", "--duration-s", "1")

    # each node is its own single-node broker: a producer and a consumer on each, so all arrive
    assert result.returncode == 0, result.stdout + result.stderr
    sent = int(re.search(r"sent (\d+), accepted", result.stdout).group(1))
    assert 0 < sent <= 400 + 2
    assert f"received {sent} in" in result.stdout
    assert "lost 0, duplicates 0, order violations 0" in result.stdout


def test_perf_through_a_three_node_cluster_keeps_every_group_in_order(tmp_path):
    cluster = Cluster(tmp_path).start()
    try:
        nodes = ",".join(node.amqp_address for node in cluster.nodes)
        result = grouper("perf", "--nodes", nodes, "--producers", "3", "--consumers", "3", "--groups", "30",
                         "--messages", "3000")
    finally:
        cluster.kill_all()

    # producers on every node send groups owned anywhere: forwarded messages must keep their group's order
    assert result.returncode == 0, result.stdout + result.stderr
    assert "received 3000 in" in result.stdout
    assert "lost 0, duplicates 0, order violations 0" in result.stdout


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_every_command_names_a_node_that_is_not_listening():
    address = f"127.0.0.1:{_closed_port()}"
    for args in (("send", "q", "--group", "g"), ("receive", "q"), ("browse", "q"), ("perf", "--messages", "10")):
        result = grouper(*args, "--node", address)
        assert result.returncode == 1, result
        assert result.stderr.count("\n") == 1 and "no node listening at" in result.stderr, result.stderr
        assert address.split(":")[1] in result.stderr


def test_an_unknown_queue_is_named_when_the_node_creates_none(node_factory):
    node = node_factory("", "--no-auto-create")
    for args in (("send", "missing", "--group", "g"), ("receive", "missing"), ("browse", "missing")):
        result = grouper(*args, "--create", "--node", node.amqp_address)
        assert result.returncode == 1, result
        assert "queue 'missing' does not exist" in result.stderr and "grouper queue add missing" in result.stderr, \
            result.stderr
        assert result.stderr.count("\n") == 1
        uncreated = grouper(*args, "--node", node.amqp_address)  # without --create: no queue, whatever the node
        assert uncreated.returncode == 1 and "no queue 'missing' at" in uncreated.stderr, uncreated.stderr
    result = grouper("perf", "--queue", "missing", "--messages", "10", "--node", node.amqp_address)
    assert result.returncode == 1 and "not-found" in result.stderr, result.stderr


def test_refused_credentials_are_named_and_good_ones_work(node_factory, tmp_path):
    users = write_users_file(tmp_path / "users.json", {"reader": "consume:orders.#"},
                             {"alice": "administrator", "bob": "reader"}, "right-pass-phrase")
    node = node_factory("", "--users-file", str(users), "--sasl-plain-on-loopback")

    wrong = grouper("send", "q", "--group", "g", "--user", "alice", "--password-stdin", "--node", node.amqp_address,
                    stdin="wrong-pass\n")
    anonymous = grouper("receive", "q", "--node", node.amqp_address)

    assert wrong.returncode == 1 and "refused user 'alice'" in wrong.stderr, wrong.stderr
    assert anonymous.returncode == 1 and "does not let anonymous clients in" in anonymous.stderr, anonymous.stderr
    assert wrong.stderr.count("\n") == anonymous.stderr.count("\n") == 1
    grouper_ok("send", "q", "--create", "--group", "g", "--count", "2", "--user", "alice", "--node", node.amqp_address,
               env={"GROUPER_PASSWORD": "right-pass-phrase"})
    received = grouper_ok("receive", "q", "--count", "2", "--user", "alice", "--password-stdin",
                          "--node", node.amqp_address, stdin="right-pass-phrase\n")
    assert by_group(messages(received)) == {"g": [1, 2]}
    not_allowed = grouper("send", "q", "--group", "g", "--user", "bob", "--node", node.amqp_address,
                          env={"GROUPER_PASSWORD": "right-pass-phrase"})
    assert not_allowed.returncode == 1 and "refused access to 'q'" in not_allowed.stderr, not_allowed.stderr


# ---- the HTTP port of a second node on one host ------------------------------------------------

def _free_port_block() -> int:
    """An AMQP port P with P, P+1 (admin) and P+3 (HTTP, derived) free just now."""
    rng = random.Random()
    for _ in range(200):
        port = rng.randrange(20_000, 60_000, 10)
        try:
            for offset in (0, 1, 3):
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port + offset))
        except OSError:
            continue
        return port
    raise AssertionError("no free block of ports found")


def test_a_second_node_given_only_its_amqp_and_admin_ports_takes_http_on_amqp_plus_3(tmp_path):
    started: list[Background] = []
    try:
        for index in range(2):
            amqp_port = _free_port_block()
            node = Background("node", "--data-dir", str(tmp_path / f"n{index}"), "--amqp-port", str(amqp_port),
                              "--admin-port", str(amqp_port + 1))
            started.append(node)
            node.wait_for("ready")
            assert f"http: 127.0.0.1:{amqp_port + 3}" in node.lines, node.lines
    finally:
        for node in started:
            node.stop(signal.SIGTERM)


def test_send_receive_and_perf_talk_tls_with_a_ca_and_log_in(node_factory, tmp_path):
    from node import certs

    certs.make_ca(tmp_path)
    cert_file, key_file = certs.make_leaf(tmp_path, "localhost", ips=("127.0.0.1",))
    users = write_users_file(tmp_path / "users.json", {}, {"alice": "administrator"}, "right-pass-phrase")
    node = node_factory("", "--users-file", str(users), "--tls-cert-file", str(cert_file), "--tls-key-file",
                        str(key_file), "--amqps-port", "0")
    # the certificate's name: proton checks the host given against it
    address = "localhost:" + node.amqps_address.rsplit(":", 1)[1]
    login = ("--user", "alice", "--ca", str(tmp_path / certs.CA_CERT_FILE), "--node", address)
    password = {"GROUPER_PASSWORD": "right-pass-phrase"}

    grouper_ok("send", "q", "--create", "--group", "g", "--count", "2", *login, env=password)
    assert by_group(messages(grouper_ok("receive", "q", "--count", "2", *login, env=password))) == {"g": [1, 2]}
    result = grouper("perf", "--messages", "500", "--groups", "5", *login, env=password)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "lost 0, duplicates 0, order violations 0" in result.stdout
