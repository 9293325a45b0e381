"""The two targets of tests/integration/test_attacker_probes.py, as an attacker on their machine meets them.

- The quick start: `grouper up` with 3 nodes on free ports, open as the README's first command leaves
  it; `secure_quick_start` secures it while it runs, the README's way (`grouper user add admin --role
  administrator --password-stdin --data-dir DATA_DIR`), and adds mallory, an account of the attacker's
  own with a low-privilege role.
- A production-style cluster: 3 `grouper node`s on 127.0.0.1 with a users file (admin and mallory),
  cluster TLS from `grouper certs dev` (mallory gets a client certificate of the cluster's CA), a raft
  secret made 0600 by the README's command, PLAIN on loopback, and /metrics behind a login.

A `Target` is either, seen from outside: addresses by node index, and how to log in once it has users.
Every wait is bounded and polls.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from proton.utils import BlockingConnection

from node.admin.client import AdminClient
from node.admin.callers import basic_metadata, basic_value
from node.tools.handshake import authenticate, dialled
from tests.integration.cli import grouper_ok, write_users_file
from tests.integration.cluster import Cluster
from tests.integration.grouper_up import GrouperUp
from tests.integration.test_cluster_security import banner_value, secure

PASSWORD = "probe-admin-password"  # admin's, and mallory's
MALLORY_ROLE = ("mallory-only", "consume:mallory.#")  # mallory may consume from her own queues, nothing more
WAIT_S = 20.0  # bound of every wait for a target to reach a state
POLL_S = 0.1
CONNECT_TIMEOUT_S = 10.0
NODES = 3


@dataclass
class Target:
    """One cluster under probe: its addresses by node index, and how to log in once it has users."""
    name: str
    amqp: list[str]
    admin: list[str]
    http: list[str]
    raft_ports: list[int]
    node_ids: list[str]
    plain_on_loopback: bool  # whether PLAIN is offered without TLS (else the probes log in with SCRAM)
    secured: bool = False  # admin and mallory exist
    peer: list[str] = field(default_factory=list)  # the peer ports (cluster TLS), when it has them

    def admin_client(self, index: int) -> AdminClient:
        return AdminClient(self.admin[index], metadata=basic_metadata("admin", PASSWORD) if self.secured else ())

    def status(self, index: int = 0) -> dict:
        with self.admin_client(index) as admin:
            return admin.cluster_status()

    def wait_status(self, predicate, what: str, index: int = 0) -> dict:
        deadline = time.monotonic() + WAIT_S
        status = None
        while time.monotonic() < deadline:
            try:
                status = self.status(index)
            except Exception as error:  # a node still starting answers UNAVAILABLE
                status = {"error": str(error)}
            if "error" not in status and predicate(status):
                return status
            time.sleep(POLL_S)
        raise AssertionError(f"{self.name} did not reach: {what} within {WAIT_S} s; last status: {status}")

    def wait_leader(self, index: int = 0) -> dict:
        return self.wait_status(lambda s: s["leader"] and all(m["connected"] and m["amqp_address"]
                                                              for m in s["members"]),
                                "a leader and every member connected", index)

    def connect(self, index: int, user: str = "admin") -> BlockingConnection:
        """An AMQP connection to node `index`: anonymous while open, else logged in as `user` with
        SCRAM-SHA-256 (node/tools/handshake.py; pip's proton cannot) before proton takes the socket."""
        if not self.secured:
            return BlockingConnection(f"amqp://{self.amqp[index]}", timeout=CONNECT_TIMEOUT_S)
        host, port = self.amqp[index].rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S)
        try:
            authenticate(sock, user, PASSWORD)
            sock.setblocking(False)
            with dialled(sock):
                return BlockingConnection(f"amqp://{self.amqp[index]}", timeout=CONNECT_TIMEOUT_S,
                                          sasl_enabled=False)
        except Exception:
            sock.close()
            raise

    def http_headers(self, index: int = 0) -> dict:
        """What the console's own page sends: its Host, and a login once the target has users."""
        headers = {"Host": self.http[index]}
        if self.secured:
            headers["Authorization"] = basic_value("admin", PASSWORD)
        return headers


# ---- the quick start --------------------------------------------------------------------------

def quick_start_target(up: GrouperUp) -> Target:
    """The Target of a started `grouper up`, once it has a leader."""
    target = Target("quick_start", [up.amqp(i) for i in range(up.nodes)], [up.admin(i) for i in range(up.nodes)],
                    [f"127.0.0.1:{up.base_port + 10 * i + 3}" for i in range(up.nodes)],
                    [up.raft_port(i) for i in range(up.nodes)],
                    [f"127.0.0.1:{up.raft_port(i)}" for i in range(up.nodes)], plain_on_loopback=False)
    target.wait_leader()
    return target


def secure_quick_start(up: GrouperUp, target: Target) -> Target:
    """The README's way, while it runs: admin first, then mallory with her role; until every node read both."""
    data_dir = str(up.data_dir)
    grouper_ok("user", "add", "admin", "--role", "administrator", "--password-stdin", "--data-dir", data_dir,
               stdin=PASSWORD + "\n")
    grouper_ok("role", "set", MALLORY_ROLE[0], "--allow", MALLORY_ROLE[1], "--data-dir", data_dir)
    grouper_ok("user", "add", "mallory", "--role", MALLORY_ROLE[0], "--password-stdin", "--data-dir", data_dir,
               stdin=PASSWORD + "\n")
    wait_users_read(up, 2)
    target.secured = True
    return target


def wait_users_read(up: GrouperUp, users: int) -> None:
    """Until every node's log says it read a users file with `users` users (the last such line)."""
    said = re.compile(r"now secured \((\d+) users\)|users reloaded from .*: (\d+) users")
    logs = [up.data_dir / f"node{index}.log" for index in range(up.nodes)]
    deadline = time.monotonic() + WAIT_S

    def counts() -> list[int | None]:
        found = []
        for log in logs:
            matches = said.findall(log.read_text())
            found.append(int(matches[-1][0] or matches[-1][1]) if matches else None)
        return found

    while counts() != [users] * len(logs):
        if time.monotonic() > deadline:
            raise AssertionError(f"the nodes of grouper up did not read {users} users within {WAIT_S} s: {counts()}")
        time.sleep(POLL_S)


# ---- the production-style cluster -------------------------------------------------------------

@dataclass
class Production:
    cluster: Cluster
    cert_dir: Path  # `grouper certs dev`'s files: ca.pem, nodeN.pem, nodeN-key.pem, mallory.pem, mallory-key.pem
    secrets: Path  # users.json and raft.secret


def production_cluster(directory: Path) -> Production:
    """Made as the README's Security section says, not started yet."""
    cert_dir, secrets = directory / "certs", directory / "secrets"
    grouper_ok("certs", "dev", "--dir", str(cert_dir), "--nodes", ",".join(f"node{i}" for i in range(NODES)),
               "--client", "mallory")
    secrets.mkdir(mode=0o700)
    users = write_users_file(secrets / "users.json", dict([MALLORY_ROLE]),
                             {"admin": "administrator", "mallory": MALLORY_ROLE[0]}, PASSWORD)
    # README, Security: Between nodes
    subprocess.run(["sh", "-c", "(umask 077; openssl rand -base64 32 > raft.secret)"], cwd=secrets, check=True,
                   timeout=WAIT_S)
    cluster = Cluster(directory, NODES, '[node]\nmetrics_auth = "basic"\n')
    for index, node in enumerate(cluster.nodes):
        secure(node, index, cert_dir, secrets / "raft.secret")
        node.args += ("--users-file", str(users), "--sasl-plain-on-loopback")
    return Production(cluster, cert_dir, secrets)


def production_target(production: Production) -> Target:
    """Starts its nodes (not cluster.start(): its status calls carry no login); the Target once it has a leader."""
    nodes = production.cluster.nodes
    for node in nodes:
        node.start()
    target = Target("production", [node.amqp_address for node in nodes], [node.admin_address for node in nodes],
                    [node.http_address for node in nodes], list(production.cluster.raft_ports),
                    list(production.cluster.node_ids), plain_on_loopback=True, secured=True,
                    peer=[banner_value(node, "peer") for node in nodes])
    target.wait_leader()
    return target
