"""Black-box tests of the top-level docker-compose.yml on a real Docker engine.

The cluster is the compose file itself, started with `docker-compose up -d` under a project name of
its own, with the host ports, the image and the queue definitions passed in through the variables
the file documents. Clients run on the host and reach the nodes through the ports published on
127.0.0.1, as a user's would. The cluster is the file's secured one: deploy/docker/dev_secrets.py
makes its certificates and passwords in the test's directory, AMQP clients log in as the bootstrapped
administrator over amqps (PLAIN) and the admin API is called over TLS with the same credentials. The load is tests/drills/load.py's producers and consumers; the
verdict is tests/drills/checker.py's (nothing accepted lost, no duplicate among confirmed
acceptances, per-group order, one consumer per group at a time).

Rules:
- One cluster per module (bringing it up costs ~25 s); each test leaves it with all three nodes
  healthy. `docker-compose down -v` runs in the finalizer whatever happened, after the nodes' logs
  are saved next to the test's files.
- Every wait is bounded and polls the admin API, the docker engine or the clients' counters.
- Traffic goes only to 127.0.0.1, the containers, and a network namespace made here to stand in for
  "the outside".
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest
from proton import ConnectionException, SSLDomain
from proton.utils import BlockingConnection
from prometheus_client.parser import text_string_to_metric_families

from node.admin.client import AccessDenied, AdminClient, AdminError
from node.admin.callers import basic_metadata
from tests.deploy.conftest import REPO
from tests.deploy.readme_compose import client_commands, client_urls, with_ports
from tests.drills.checker import Report, check_files
from tests.drills.load import GroupedProducer, Load, LoggingConsumer, now_ms, wait_accepted
from tests.integration.cluster import free_ports, in_transit

COMPOSE_FILE = REPO / "docker-compose.yml"
DEV_SECRETS = REPO / "deploy" / "docker" / "dev_secrets.py"
ADMIN_USER = "admin"  # GROUPER_DEFAULT_USER in the compose file
CERTIFICATE_NAME = "localhost"  # in every node certificate dev_secrets.py makes; the hosts dial 127.0.0.1
SERVICES = ("node0", "node1", "node2")
RAFT_PORT = 5674
QUEUE = "compose-drill"
# Each test has groups of its own: routes outlive a test (they are never expired here), so a group an
# earlier test placed on some node would stay there, consumers or not.
def groups(prefix: str, count: int = 12) -> list[str]:
    return [f"{prefix}-g{index:02d}" for index in range(count)]


PROBE_GROUPS = [f"new{index:06d}" for index in range(100_000)]  # a new group with every probe send
IN_FLIGHT_MAX = 5
CONSUMER_CREDIT = 20
RECONNECT_DELAY_MAX_S = 0.25
COMPOSE_TIMEOUT_S = 180  # `up -d` waits for three healthy nodes; `down -v` stops them
PROGRESS_TIMEOUT_S = 20.0  # bound of every wait for the load to move on
SETTLE_TIMEOUT_S = 30.0  # bound of the wait for outbound stores and queues to empty
HEALTHY_TIMEOUT_S = 60.0  # a restarted container's health check passing again
# a cluster-wide admin answer waits up to 3 s (the node's PEER_CALL_TIMEOUT_MS) on a member whose
# container is gone: its address then drops packets rather than refusing them
ADMIN_TIMEOUT_MS = 6000
HTTP_TIMEOUT_S = 2.0
NEW_GROUP_AFTER_LEADER_KILL_BOUND_S = 10.0  # raft elects in ~1 s; containers on 2 busy cores are slower
OUTSIDE_CONNECT_TIMEOUT_S = 1.5  # the control's connect over a local veth takes milliseconds
LOAD_BEFORE_KILL_ACCEPTS = 30  # per producer, before the kill

CONFIG_TOML = f"""
[[queue]]
name = "{QUEUE}"
group_policy = "exclusive"
durable = true
"""

# run inside a container: connect to HOST:PORT, print "reached" or "unreachable: why"
CONNECT_PROBE = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])).close()
    print("reached")
except OSError as error:
    print(f"unreachable: {error}")
"""


def compose_command() -> list[str]:
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    pytest.fail("neither docker-compose nor the docker compose plugin is installed; run "
                "`bash deploy/docker/engine.sh` as root (it installs docker-compose)", pytrace=False)


class ComposeCluster:
    """The compose project: its containers, its host ports and the nodes' admin API."""

    def __init__(self, docker_client, image: str, directory: Path):
        self.docker = docker_client
        self.directory = directory
        self.project = f"grouper-test-{uuid.uuid4().hex[:10]}"
        ports = free_ports(4 * len(SERVICES))
        self.amqp_ports = ports[0:3]
        self.admin_ports = ports[3:6]
        self.http_ports = ports[6:9]
        self.amqps_ports = ports[9:12]
        self.secrets = directory / "build" / "compose-secrets"  # where the README's commands, run here, read them
        made = subprocess.run([sys.executable, str(DEV_SECRETS), "--dir", str(self.secrets)], capture_output=True,
                              text=True, timeout=60)
        assert made.returncode == 0, f"{DEV_SECRETS} failed: {made.stdout}{made.stderr}"
        self.password = (self.secrets / "admin.password").read_text().strip()
        config_file = directory / "grouper.toml"
        config_file.write_text(CONFIG_TOML)
        config_file.chmod(0o644)  # read by uid 10001 inside the containers
        self.environment = {**os.environ, "GROUPER_IMAGE": image, "GROUPER_CONFIG_FILE": str(config_file),
                            "GROUPER_SECRETS_DIR": str(self.secrets)}
        for index in range(len(SERVICES)):
            self.environment[f"GROUPER_NODE{index}_AMQPS_PORT"] = str(self.amqps_ports[index])
            self.environment[f"GROUPER_NODE{index}_AMQP_PORT"] = str(self.amqp_ports[index])
            self.environment[f"GROUPER_NODE{index}_ADMIN_PORT"] = str(self.admin_ports[index])
            self.environment[f"GROUPER_NODE{index}_HTTP_PORT"] = str(self.http_ports[index])
        self.timings: dict = {}

    def compose(self, *args: str, timeout_s: float = COMPOSE_TIMEOUT_S) -> str:
        command = [*compose_command(), "-p", self.project, "-f", str(COMPOSE_FILE), *args]
        try:
            result = subprocess.run(command, cwd=REPO, env=self.environment, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"{' '.join(command)} did not finish within {timeout_s} s") from None
        assert result.returncode == 0, f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout}"
        return result.stdout

    def up(self) -> None:
        started_s = time.monotonic()
        self.compose("up", "-d")
        self.timings["up_ms"] = round((time.monotonic() - started_s) * 1000)

    def save_logs_and_down(self) -> None:
        try:
            (self.directory / "compose.log").write_text(self.compose("logs", "--no-color", timeout_s=60))
        finally:
            started_s = time.monotonic()
            self.compose("down", "-v", "--remove-orphans")
            self.timings["down_ms"] = round((time.monotonic() - started_s) * 1000)
            print(f"\ncompose project {self.project}: {self.timings}; logs in {self.directory / 'compose.log'}")

    # ---- containers ----------------------------------------------------------------------------

    def container(self, index: int):
        found = self.docker.containers.list(all=True, filters={"label": [
            f"com.docker.compose.project={self.project}", f"com.docker.compose.service={SERVICES[index]}"]})
        assert len(found) == 1, f"expected one container of {SERVICES[index]}, found {found}"
        return found[0]

    def health(self, index: int) -> str:
        state = self.container(index).attrs["State"]
        return state.get("Health", {}).get("Status", "none") if state["Running"] else state["Status"]

    def wait_healthy(self, index: int) -> None:
        deadline = time.monotonic() + HEALTHY_TIMEOUT_S
        while (health := self.health(index)) != "healthy":
            assert time.monotonic() < deadline, f"{SERVICES[index]} not healthy within {HEALTHY_TIMEOUT_S} s: " \
                                                f"{health}; {self.container(index).attrs['State'].get('Health')}"
            time.sleep(0.2)

    def run_in(self, index: int, *command: str) -> str:
        exit_code, output = self.container(index).exec_run(list(command))
        assert exit_code == 0, f"{command} in {SERVICES[index]} exited {exit_code}: {output.decode()}"
        return output.decode()

    # ---- the nodes -----------------------------------------------------------------------------

    def url(self, index: int) -> str:
        return f"amqps://{ADMIN_USER}:{self.password}@127.0.0.1:{self.amqps_ports[index]}"

    def secure(self, client) -> None:
        """TLS for a load client (GroupedProducer, LoggingConsumer) before its start: trust the
        development CA, check the node's certificate names `localhost`."""
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_trusted_ca_db(str(self.secrets / "ca.pem"))
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
        client.client.connect_options = {"ssl_domain": domain, "sni": CERTIFICATE_NAME}

    def published(self) -> dict[tuple[str, int], int]:
        """This project's host ports by (kind, node index), the kinds of readme_compose.DEFAULT_PORTS."""
        return {(kind, index): ports[index] for kind, ports in (
            ("amqps", self.amqps_ports), ("amqp", self.amqp_ports), ("admin", self.admin_ports),
            ("http", self.http_ports)) for index in range(len(SERVICES))}

    def admin(self, index: int) -> AdminClient:
        """The node's admin API over TLS, as the administrator."""
        credentials = grpc.ssl_channel_credentials(root_certificates=(self.secrets / "ca.pem").read_bytes())
        return AdminClient(f"127.0.0.1:{self.admin_ports[index]}", timeout_ms=ADMIN_TIMEOUT_MS,
                           credentials=credentials, metadata=basic_metadata(ADMIN_USER, self.password))

    def status(self, index: int) -> dict | None:
        try:
            with self.admin(index) as client:
                return client.cluster_status()
        except AdminError:
            return None

    def leader_seen_by(self, index: int) -> str:
        """The leader node `index` knows, from its /metrics (local: it never waits on another member);
        "" if none or if it does not answer."""
        url = f"http://127.0.0.1:{self.http_ports[index]}/metrics"
        try:
            with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
                text = response.read().decode()
        except OSError:
            return ""
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "grouper_raft_leader" and sample.value == 1:
                    return sample.labels.get("leader", "")
        return ""

    def leader(self, among: list[int] | None = None, excluding: int | None = None) -> int:
        """The index of the raft leader named by one of `among` (every node by default), once it is
        not `excluding`."""
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        last = {}
        while time.monotonic() < deadline:
            for index in among if among is not None else range(len(SERVICES)):
                leader = last[SERVICES[index]] = self.leader_seen_by(index)
                if leader and service_index(leader) != excluding:
                    return service_index(leader)
            time.sleep(0.05)
        raise AssertionError(f"no raft leader (other than {excluding}) within {PROGRESS_TIMEOUT_S} s; last: {last}")


    def wait_rejoined(self, index: int) -> None:
        """Until node `index` knows a leader with a majority, and the leader (wherever leadership has
        moved meanwhile) sees it connected and not down."""
        node_id = f"{SERVICES[index]}:{RAFT_PORT}"
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        while True:
            own = self.status(index)
            leader = service_index(own["leader"]) if own and own["has_quorum"] and own["leader"] else None
            seen = {member["node"]: member for member in (self.status(leader) or {}).get("members", [])} \
                if leader is not None else {}
            if node_id in seen and seen[node_id]["connected"] and not seen[node_id]["down"]:
                return
            assert time.monotonic() < deadline, f"{node_id} has not rejoined within {PROGRESS_TIMEOUT_S} s: its " \
                                                f"status {own}; the leader's view of it {seen.get(node_id)}"
            time.sleep(0.2)


def service_index(node_id: str) -> int:
    """"node1:5674" -> 1: the compose service names are the nodes' advertise hosts."""
    host, _, port = node_id.rpartition(":")
    assert host in SERVICES and port == str(RAFT_PORT), f"unexpected node id {node_id!r}"
    return SERVICES.index(host)


@pytest.fixture(scope="module")
def compose_cluster(docker_client, grouper_image, tmp_path_factory):
    cluster = ComposeCluster(docker_client, grouper_image, tmp_path_factory.mktemp("compose"))
    try:
        cluster.up()
        yield cluster
    finally:
        cluster.save_logs_and_down()


# ---- load helpers --------------------------------------------------------------------------------

class Traffic:
    """Producers and consumers of one test against the compose cluster, and the checker's verdict."""

    def __init__(self, cluster: ComposeCluster, directory: Path):
        self.cluster = cluster
        self.logs = directory / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.load = Load([], [])
        self.producers: dict[int, GroupedProducer] = {}

    def consumers(self, placement: dict[int, int]) -> None:
        for index, count in sorted(placement.items()):
            for _ in range(count):
                name = f"c{len(self.load.consumers)}-node{index}"
                consumer = LoggingConsumer(self.cluster.url(index), QUEUE, self.logs / f"{name}.jsonl", name=name,
                                           credit=CONSUMER_CREDIT, reconnect_delay_max_s=RECONNECT_DELAY_MAX_S)
                self.cluster.secure(consumer)
                consumer.start()
                self.load.consumers.append(consumer)
        self.wait_consumers(placement)

    def wait_consumers(self, placement: dict[int, int]) -> None:
        """Until each node reports its consumers on QUEUE, so the first groups are placed with them."""
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        while True:
            seen = {}
            for index in placement:
                status = self.cluster.status(index) or {"members": []}
                mine = [member for member in status["members"] if member["node"] == status.get("node")]
                seen[index] = sum(queue["consumers"] for member in mine for queue in member["queues"]
                                  if queue["name"] == QUEUE)
            if all(seen[index] >= count for index, count in placement.items()):
                return
            assert time.monotonic() < deadline, f"consumers not attached within {PROGRESS_TIMEOUT_S} s: {seen}"
            time.sleep(0.1)

    def producer(self, index: int, name: str, groups: list[str], in_flight_max: int = IN_FLIGHT_MAX) -> GroupedProducer:
        producer = GroupedProducer(self.cluster.url(index), QUEUE, groups, self.logs / f"{name}.jsonl", name=name,
                                   in_flight_max=in_flight_max, reconnect_delay_max_s=RECONNECT_DELAY_MAX_S)
        self.cluster.secure(producer)
        producer.start()
        self.load.producers.append(producer)
        return producer

    def producers_on_every_node(self, groups: list[str]) -> None:
        for index in range(len(SERVICES)):
            self.producers[index] = self.producer(index, f"p{index}", groups)

    def wait_accepted(self, producers: list[GroupedProducer], more: int, what: str) -> None:
        wait_accepted(producers, more, PROGRESS_TIMEOUT_S, what)

    def check(self) -> Report:
        """Stop the producers, wait until no node holds anything in transit, drain, judge the logs."""
        for producer in self.load.producers:
            producer.stop()
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        while left := in_transit([self.cluster.status(index) for index in range(len(SERVICES))]):
            assert time.monotonic() < deadline, f"still in transit after {SETTLE_TIMEOUT_S} s: {left}"
            time.sleep(0.2)
        self.load.finish(quiet_s=0.5, timeout_s=PROGRESS_TIMEOUT_S)
        return check_files(self.load.send_paths, self.load.delivery_paths)


def assert_ok(report: Report) -> None:
    assert report.ok, report.summary()  # "lost" covers every accepted send never delivered
    assert report.accepted > 0 and report.delivered > 0, report.summary()


# ---- an "outside" for the isolation test ---------------------------------------------------------

class Outside:
    """A network namespace joined to the host by a veth pair, with a TCP listener: it stands in for
    the world beyond the host. Like a real remote host it knows no route back to Docker's private
    subnets, so it answers a container only if the host masqueraded the container's packets."""

    def __init__(self):
        token = f"{os.getpid() % 100000}"
        self.namespace = f"grouper-outside-{token}"
        self.host_link, self.inner_link = f"gouth{token}", f"goutn{token}"
        base = 4 * (os.getpid() % 64)  # a /30 of TEST-NET-2 (198.51.100.0/24): never a real address
        self.host_address, self.address = f"198.51.100.{base + 1}", f"198.51.100.{base + 2}"
        self.port = 8099
        self.listener: subprocess.Popen | None = None

    def __enter__(self) -> "Outside":
        if os.geteuid() != 0 or shutil.which("ip") is None:
            pytest.fail("the isolation test builds a network namespace: it needs root and iproute2 (`ip`)",
                        pytrace=False)
        self.__exit__()  # what a killed earlier run of this process id may have left
        steps = [["ip", "netns", "add", self.namespace],
                 ["ip", "link", "add", self.host_link, "type", "veth", "peer", "name", self.inner_link],
                 ["ip", "link", "set", self.inner_link, "netns", self.namespace],
                 ["ip", "addr", "add", f"{self.host_address}/30", "dev", self.host_link],
                 ["ip", "link", "set", self.host_link, "up"],
                 ["ip", "netns", "exec", self.namespace, "ip", "addr", "add", f"{self.address}/30", "dev",
                  self.inner_link],
                 ["ip", "netns", "exec", self.namespace, "ip", "link", "set", self.inner_link, "up"]]
        try:
            for step in steps:
                result = subprocess.run(step, capture_output=True, text=True, timeout=10)
                assert result.returncode == 0, f"{' '.join(step)}: {result.stderr}"
            listen = (f"import socket; s = socket.create_server(({self.address!r}, {self.port})); "
                      "[s.accept()[0].close() for _ in iter(int, 1)]")
            self.listener = subprocess.Popen(["ip", "netns", "exec", self.namespace, "python3", "-c", listen])
            reached = probe_from_host(self.address, self.port)
            assert reached == "reached", f"the outside listener does not answer the host: {reached}"
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc_info) -> None:
        if self.listener is not None:
            self.listener.kill()
            self.listener.wait(10)
        subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, timeout=10)
        subprocess.run(["ip", "link", "del", self.host_link], capture_output=True, timeout=10)


def probe_from_host(address: str, port: int) -> str:
    deadline = time.monotonic() + 5.0  # the listener's start
    while True:
        result = subprocess.run(["python3", "-c", CONNECT_PROBE, address, str(port), "1"], capture_output=True,
                                text=True, timeout=10)
        if result.stdout.strip() == "reached" or time.monotonic() > deadline:
            return result.stdout.strip()
        time.sleep(0.1)


# ---- the tests -----------------------------------------------------------------------------------

def test_the_nodes_reach_each_other_and_the_host_reaches_them_on_127_0_0_1_but_they_reach_nothing_outside(
        compose_cluster, docker_client, grouper_image):
    cluster = compose_cluster
    for index in range(len(SERVICES)):
        container = cluster.container(index)
        assert container.attrs["Config"]["User"] == "10001:10001", container.attrs["Config"]["User"]
        published = container.attrs["NetworkSettings"]["Ports"]
        assert published.get(f"{RAFT_PORT}/tcp") is None, f"the raft port is published: {published}"
        assert published.get("5676/tcp") is None, f"the peer port is published: {published}"
        for port in ("5671/tcp", "5672/tcp", "5673/tcp", "5675/tcp"):
            assert [binding["HostIp"] for binding in published[port]] == ["127.0.0.1"], published
        with urllib.request.urlopen(f"http://127.0.0.1:{cluster.http_ports[index]}/readyz",
                                    timeout=HTTP_TIMEOUT_S) as response:  # the host reaches the published port
            assert response.status == 200, response.read()
        status = cluster.status(index)  # through the published admin port
        assert status is not None and status["has_quorum"] and status["leader"], status
        assert sorted(member["node"] for member in status["members"] if member["connected"]) == \
            [f"{service}:{RAFT_PORT}" for service in SERVICES], status["members"]

    # secured: no AMQP client without an identity, no admin call without credentials, no plain admin
    with pytest.raises(ConnectionException):
        BlockingConnection(f"amqp://127.0.0.1:{cluster.amqp_ports[0]}", timeout=HTTP_TIMEOUT_S * 5,
                           allowed_mechs="ANONYMOUS").close()
    ca = grpc.ssl_channel_credentials(root_certificates=(cluster.secrets / "ca.pem").read_bytes())
    with pytest.raises(AccessDenied) as refused:
        with AdminClient(f"127.0.0.1:{cluster.admin_ports[0]}", timeout_ms=ADMIN_TIMEOUT_MS, credentials=ca) as admin:
            admin.cluster_status()
    assert refused.value.status == "UNAUTHENTICATED", refused.value
    with pytest.raises(AdminError):  # a plain channel to the TLS port: the handshake never completes
        with AdminClient(f"127.0.0.1:{cluster.admin_ports[0]}", timeout_ms=ADMIN_TIMEOUT_MS,
                         metadata=basic_metadata(ADMIN_USER, cluster.password)) as admin:
            admin.cluster_status()
    logs = cluster.container(0).logs().decode(errors="replace")
    for line in ("security: secured", "forwarding over mutual TLS", "raft encrypted"):
        assert line in logs, f"{line!r} not in node0's banner:\n{logs[-2000:]}"

    with Outside() as outside:
        # the control: a container on Docker's default (masqueraded) bridge reaches the outside
        control = docker_client.containers.run(grouper_image, ["-c", CONNECT_PROBE, outside.address,
                                                               str(outside.port), str(OUTSIDE_CONNECT_TIMEOUT_S)],
                                               entrypoint="python3", remove=True,
                                               # not the anonymous volume of the image's VOLUME: remove leaves it
                                               tmpfs={"/var/lib/grouper": ""}).decode().strip()
        assert control == "reached", f"the control container could not reach the outside: {control}"
        with ThreadPoolExecutor(len(SERVICES)) as pool:  # each probe waits out its timeout: in parallel
            verdicts = list(pool.map(lambda index: cluster.run_in(
                index, "python3", "-c", CONNECT_PROBE, outside.address, str(outside.port),
                str(OUTSIDE_CONNECT_TIMEOUT_S)).strip(), range(len(SERVICES))))
        for service, verdict in zip(SERVICES, verdicts):
            assert verdict.startswith("unreachable"), f"{service} reached the outside: {verdict}"


def test_grouped_traffic_through_every_node_keeps_order_and_exclusivity(compose_cluster, tmp_path):
    cluster = compose_cluster
    traffic = Traffic(cluster, tmp_path)
    started_s = time.monotonic()
    with traffic.load:
        traffic.consumers({0: 2, 1: 2, 2: 2})
        traffic.producers_on_every_node(groups("spread"))
        traffic.wait_accepted(list(traffic.producers.values()), 150, "grouped load through every node")
        with cluster.admin(0) as admin:
            owners = {row["group"]: (row["node"], row["consumer"]) for row in admin.list_groups(QUEUE)}
        report = traffic.check()
    print(f"\ngrouped traffic in {time.monotonic() - started_s:.1f} s:\n{report.summary()}")
    assert_ok(report)
    assert report.refused == 0 and report.timed_out == 0, report.summary()
    # exclusive groups stick to a consumer for its lifetime: while the load ran, every group had one
    assert set(owners) == set(groups("spread")) and all(consumer for _, consumer in owners.values()), owners
    print(f"groups per node: {Counter(node for node, _ in owners.values())}")


def test_killing_the_raft_leaders_container_under_load_loses_and_reorders_nothing_and_it_rejoins(
        compose_cluster, tmp_path):
    cluster = compose_cluster
    traffic = Traffic(cluster, tmp_path)
    leader = cluster.leader()
    followers = [index for index in range(len(SERVICES)) if index != leader]
    summary: dict = {"leader_at_start": SERVICES[leader]}
    with traffic.load:
        traffic.consumers({index: 1 for index in followers})  # the (new) groups are placed on the followers
        traffic.producers_on_every_node(groups("leader-kill"))
        # every probe send needs a new route; one probe per follower, so one survives whoever leads at the kill
        probes = {index: traffic.producer(index, f"probe{index}", [f"{SERVICES[index]}-{group}"
                                                                   for group in PROBE_GROUPS], in_flight_max=1)
                  for index in followers}
        traffic.wait_accepted([*traffic.producers.values(), *probes.values()], LOAD_BEFORE_KILL_ACCEPTS,
                              "before the kill")

        killed = cluster.leader()  # normally still `leader`; a busy machine may have moved it
        survivors = [index for index in range(len(SERVICES)) if index != killed]
        summary["killed"] = SERVICES[killed]
        killed_ms = now_ms()
        cluster.container(killed).kill()  # SIGKILL
        summary["new_leader"] = SERVICES[cluster.leader(among=survivors, excluding=killed)]
        summary["kill_to_new_leader_seen_ms"] = now_ms() - killed_ms
        traffic.wait_accepted([probe for index, probe in probes.items() if index != killed], 2,
                              "a new group after the leader's kill")
        summary["kill_to_new_group_routed_ms"] = now_ms() - killed_ms
        traffic.wait_accepted([traffic.producers[index] for index in survivors], 20, "after the leader's kill")

        restarted_ms = now_ms()
        cluster.container(killed).start()
        cluster.wait_healthy(killed)
        summary["restart_to_healthy_ms"] = now_ms() - restarted_ms
        cluster.wait_rejoined(killed)
        summary["restart_to_rejoined_ms"] = now_ms() - restarted_ms
        # it serves: its producer (reconnected through the same published port) gets sends accepted again
        traffic.wait_accepted(list(traffic.producers.values()), 20, "after the old leader's restart")
        summary["restart_to_its_producer_accepted_ms"] = now_ms() - restarted_ms
        report = traffic.check()
    summary["checker"] = report.summary()
    summary["producers"] = {producer.name: producer.outcomes for producer in traffic.load.producers}
    (tmp_path / "leader_kill.summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(f"\nleader kill in compose: {json.dumps(summary, indent=1)}")
    assert_ok(report)
    assert summary["kill_to_new_group_routed_ms"] < NEW_GROUP_AFTER_LEADER_KILL_BOUND_S * 1000, summary


def test_the_readmes_client_commands_and_urls_work_as_written(compose_cluster):
    """The README's compose block, from `export GROUPER_USER` on, run by bash in a directory holding
    build/compose-secrets, on this project's ports; then its `# clients:` URLs dialled by
    python-qpid-proton as a user's client would. Dialling 127.0.0.1 instead fails, as the README says."""
    cluster = compose_cluster
    ports = cluster.published()
    script = "\n".join(with_ports(command, ports) for command in client_commands())
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"  # this environment's grouper
    ran = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cluster.directory, capture_output=True,
                         text=True, timeout=120, env={**os.environ, "PATH": path})
    assert ran.returncode == 0, f"{script}\nexited {ran.returncode}:\n{ran.stdout}{ran.stderr}"
    assert f"2 message(s) accepted by localhost:{cluster.amqps_ports[0]} into trades" in ran.stdout, ran.stdout
    assert "2 message(s) received and accepted" in ran.stdout, ran.stdout

    domain = SSLDomain(SSLDomain.MODE_CLIENT)  # "trusting build/compose-secrets/ca.pem"; proton checks the name
    domain.set_trusted_ca_db(str(cluster.secrets / "ca.pem"))
    domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
    credentials = {"GROUPER_USER": ADMIN_USER, "GROUPER_PASSWORD": cluster.password, "PATH": path}
    for url in client_urls():
        url = with_ports(url, ports).replace("PASSWORD", urllib.parse.quote(cluster.password, safe=""))
        if url.startswith("amqps://"):
            BlockingConnection(url, ssl_domain=domain, timeout=HTTP_TIMEOUT_S * 5).close()
        else:  # "SCRAM-SHA-256 clients also on amqp://...": grouper's own client logs in with it on plain ports
            browsed = subprocess.run(["grouper", "browse", "trades", "--node", url.removeprefix("amqp://")],
                                     capture_output=True, text=True, timeout=60, env={**os.environ, **credentials})
            assert browsed.returncode == 0, f"{url}: {browsed.stdout}{browsed.stderr}"
    with pytest.raises(ConnectionException, match="certificate verify failed"):
        BlockingConnection(with_ports(client_urls()[0], ports).replace("localhost", "127.0.0.1").replace(
            "PASSWORD", urllib.parse.quote(cluster.password, safe="")), ssl_domain=domain,
            timeout=HTTP_TIMEOUT_S * 5).close()
