"""The StatefulSet's own pod template, booted on the Docker engine as Kubernetes would run it.

`kubectl kustomize deploy/k8s` renders what `kubectl apply -k` applies; tests/deploy/podtemplate.py
turns pod grouper-<i> of that StatefulSet into a container (same image, command, args, environment,
mounts, user, limits; hostname and DNS aliases as cluster DNS gives them) on an internal network
cut off from the outside. The test then plays the kubelet and the StatefulSet controller:
- starts grouper-0..2 together (podManagementPolicy Parallel) and polls each readiness probe until
  all are ready, then checks the raft cluster formed under the advertised names and serves grouped
  traffic through every pod (order, exclusivity, nothing lost: tests/drills/checker.py);
- restarts grouper-1 as the kubelet would (preStop hook, SIGTERM, a clean exit inside the grace
  period) while scaling up: grouper-3 from the same template joins by itself and takes grouper-1's
  old address, so grouper-1 comes back on a new one; every member must reach every other again by
  name, and both serve grouped traffic.
The pods run secured, as the manifests demand: the Secrets grouper-tls and grouper-auth hold what
deploy/k8s-secrets/make_secrets.py makes (the README's commands), clients use amqps with PLAIN as
`admin`, the test's admin calls use TLS and the same credentials, and grouper-3 joins a cluster that
takes none without them. So a manifest change that would break a real deployment fails here. Every wait has a deadline; the
containers, the network and the volumes are removed even when the test fails (their logs are kept
in the test's tmp directory).
"""

from __future__ import annotations

import http.client
import importlib.util
import time
from concurrent.futures import ThreadPoolExecutor
import tomllib
from pathlib import Path

import grpc
import pytest
from proton import SSLDomain

from node.admin.client import AdminClient, AdminError
from node.admin.callers import basic_metadata
from tests.deploy.podtemplate import PodRunner, http_probe, render, resource
from tests.drills.checker import check_files
from tests.drills.load import start_load

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
MAKE_SECRETS = REPO / "deploy" / "k8s-secrets" / "make_secrets.py"
ADMIN_USER = "admin"  # GROUPER_USER in the StatefulSet
CERTIFICATE_NAME = "localhost"  # in every pod's certificate; the test dials the pods' addresses
READY_TIMEOUT_S = 90.0  # from container start to every pod ready (2 cores shared by four interpreters)
CONNECT_TIMEOUT_S = 15.0  # a restarted member is redialled every 0.2 s, its name re-resolved every 1 s
POLL_S = 0.25  # faster than the probe's period: the test only wants to know sooner
ADMIN_TIMEOUT_MS = 3000
GROUPS_PER_ROUND = 12  # each round has new groups: they are placed where the round's consumers are
ACCEPTED_PER_ROUND = 300  # grouped sends accepted before a round's producers stop
TRAFFIC_TIMEOUT_S = 45.0
IN_FLIGHT_MAX = 10
CONSUMER_CREDIT = 20


@pytest.fixture
def statefulset_pods(docker_client, grouper_image, tmp_path):
    """A PodRunner for the rendered StatefulSet, with the manifest's image reference pointing at the
    image this session built. Everything is removed afterwards; each pod's log is kept."""
    documents = render(K8S)
    statefulset = resource(documents, "StatefulSet", "grouper")
    config_maps = {d["metadata"]["name"]: d for d in documents if d["kind"] == "ConfigMap"}
    image = statefulset["spec"]["template"]["spec"]["containers"][0]["image"]
    repository, _, tag = image.rpartition(":") if ":" in image.rsplit("/", 1)[-1] else (image, "", "latest")
    docker_client.images.get(grouper_image).tag(repository, tag)
    runner = PodRunner(docker_client, statefulset, config_maps, tmp_path / "volumes",
                       secrets=make_secrets(tmp_path / "secrets", statefulset["spec"]["replicas"] + 1))
    try:
        yield runner
    finally:
        for pod in runner.containers:
            try:
                (tmp_path / f"{pod}.log").write_text(runner.logs(pod))
            except Exception as error:  # noqa: BLE001 - a log lost must not hide the test's own failure
                print(f"log of {pod} not kept: {error}")
        errors = runner.close()
        if image != grouper_image:
            docker_client.images.remove(image, noprune=True)  # only the tag: the built image stays
        assert not errors, f"cleanup failed: {errors}"


def make_secrets(directory: Path, replicas: int) -> dict[str, dict]:
    """The Secrets as `kubectl create secret` would make them from make_secrets.py's files."""
    spec = importlib.util.spec_from_file_location("make_secrets", MAKE_SECRETS)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.make(directory, "default", replicas)
    return {name: {"data": {key: path.read_text() for key, path in files.items()}, "directory": directory}
            for name, files in module.secret_files(directory, replicas).items()}


def password(runner: PodRunner) -> str:
    return runner.secrets["grouper-auth"]["data"]["admin-password"]


def admin_client(runner: PodRunner, address: str) -> AdminClient:
    credentials = grpc.ssl_channel_credentials(
        root_certificates=runner.secrets["grouper-tls"]["data"]["ca.pem"].encode())
    return AdminClient(address, timeout_ms=ADMIN_TIMEOUT_MS, credentials=credentials, server_name=CERTIFICATE_NAME,
                       metadata=basic_metadata(ADMIN_USER, password(runner)))


def amqps_url(runner: PodRunner, pod: str, port: int) -> str:
    return f"amqps://{ADMIN_USER}:{password(runner)}@{runner.address(pod)}:{port}"


def tls_options(runner: PodRunner):
    """start_load's connect_options: each client its own SSLDomain trusting the Secret's CA."""
    ca_file = str(runner.secrets["grouper-tls"]["directory"] / "ca.pem")

    def options(url: str) -> dict:
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        domain.set_trusted_ca_db(ca_file)
        domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME)
        return {"ssl_domain": domain, "sni": CERTIFICATE_NAME}
    return options


def readiness(address: str, path: str, port: int, timeout_s: float) -> tuple[bool, str]:
    """What an httpGet probe decides: 200..399 is success. No proxy is ever involved."""
    connection = http.client.HTTPConnection(address, port, timeout=timeout_s)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read(200).decode(errors="replace").strip()
        return 200 <= response.status < 400, f"{response.status} {body}"
    except OSError as error:
        return False, f"{type(error).__name__}: {error}"
    finally:
        connection.close()


def wait_ready(runner: PodRunner, pods: list[str], container: dict, timeout_s: float = READY_TIMEOUT_S) -> float:
    """Poll every pod's readiness probe until all pass; returns the seconds it took. A pod whose
    container exited fails at once, with its log."""
    path, port = http_probe(container, "readinessProbe")
    probe_timeout_s = container["readinessProbe"].get("timeoutSeconds", 1)
    started_s = time.monotonic()
    deadline_s = started_s + timeout_s
    last: dict[str, str] = {}
    while True:
        waiting = []
        for pod in pods:
            if not runner.running(pod):
                pytest.fail(f"{pod} exited before it was ready; its log:\n{runner.logs(pod)[-3000:]}")
            ok, last[pod] = readiness(runner.address(pod), path, port, probe_timeout_s)
            if not ok:
                waiting.append(pod)
        if not waiting:
            return time.monotonic() - started_s
        if time.monotonic() > deadline_s:
            logs = "\n".join(f"--- {pod}:\n{runner.logs(pod)[-2000:]}" for pod in waiting)
            pytest.fail(f"not ready within {timeout_s} s: " + "; ".join(f"{p}: {last[p]}" for p in waiting) + "\n" + logs)
        time.sleep(POLL_S)


def groups(prefix: str) -> list[str]:
    return [f"{prefix}{index:02d}" for index in range(GROUPS_PER_ROUND)]


def node_id(pod) -> str:
    """The raft address a pod's node names itself by: its advertised host (the pod's DNS name under
    the headless Service) and raft port."""
    assert pod.environment["GROUPER_ADVERTISE_HOST"] == f"{pod.pod}.{pod.subdomain}.{pod.namespace}.svc"
    return f"{pod.environment['GROUPER_ADVERTISE_HOST']}:{pod.environment['GROUPER_RAFT_PORT']}"


def cluster_status(runner: PodRunner, address: str) -> dict:
    with admin_client(runner, address) as admin:
        return admin.cluster_status()


def terminate(runner: PodRunner, pod: str, container: dict, grace_s: float) -> tuple[int, float]:
    """The kubelet's termination: the preStop hook, then SIGTERM, then SIGKILL once the grace period
    (counted from the start of the hook) is over. Returns the exit status and the seconds taken."""
    started_s = time.monotonic()
    hook = runner.containers[pod].exec_run(container["lifecycle"]["preStop"]["exec"]["command"])
    assert hook.exit_code == 0, f"the preStop hook of {pod} failed: {hook.output!r}"
    runner.containers[pod].stop(timeout=max(1, int(grace_s - (time.monotonic() - started_s))))
    exit_code = runner.containers[pod].wait(timeout=grace_s)["StatusCode"]
    return exit_code, time.monotonic() - started_s


def wait_all_connected(runner: PodRunner, pods: list[str], admin_port: int, members: list[str],
                       timeout_s: float = CONNECT_TIMEOUT_S) -> float:
    """Until every pod's node lists exactly `members`, all connected to it; returns the seconds taken."""
    started_s = time.monotonic()
    views: dict[str, object] = {}
    while True:
        for pod in pods:
            try:
                status = cluster_status(runner, f"{runner.address(pod)}:{admin_port}")
                views[pod] = sorted((m["node"], m["connected"]) for m in status["members"])
            except AdminError as error:
                views[pod] = str(error)
        if all(view == [(member, True) for member in members] for view in views.values()):
            return time.monotonic() - started_s
        assert time.monotonic() - started_s < timeout_s, f"members not all connected within {timeout_s} s: {views}"
        time.sleep(POLL_S)


def send_grouped_round(runner: PodRunner, directory: Path, queue: str, groups: list[str], producer_urls: list[str],
                       consumer_urls: list[str]) -> dict:
    """Producers and consumers over `groups` until ACCEPTED_PER_ROUND sends were accepted, then until
    the consumers have had every accepted message; the checker's verdict over their logs must be
    clean. Returns the report's counts."""
    load = start_load([(url, queue, groups) for url in producer_urls],
                      [(url, queue, CONSUMER_CREDIT) for url in consumer_urls], directory,
                      in_flight_max=IN_FLIGHT_MAX, reconnect_delay_max_s=0.25, connect_options=tls_options(runner))
    with load:
        deadline_s = time.monotonic() + TRAFFIC_TIMEOUT_S
        while load.accepted() < ACCEPTED_PER_ROUND and time.monotonic() < deadline_s:
            time.sleep(POLL_S / 5)
        for producer in load.producers:
            producer.stop()
        while sum(c.received for c in load.consumers) < load.accepted() and time.monotonic() < deadline_s:
            time.sleep(POLL_S / 5)
    report = check_files(load.send_paths, load.delivery_paths)
    assert report.ok, report.summary()
    assert report.accepted >= ACCEPTED_PER_ROUND, report.summary()
    assert report.delivered == report.accepted, report.summary()
    return {"accepted": report.accepted, "refused": report.refused, "deliveries": report.deliveries}


def test_the_statefulset_pod_template_forms_a_cluster_serves_groups_survives_a_restart_and_scales_up(statefulset_pods, tmp_path):
    runner = statefulset_pods
    statefulset = runner.statefulset
    container = statefulset["spec"]["template"]["spec"]["containers"][0]
    env = {entry["name"]: entry.get("value") for entry in container["env"]}
    bootstrap = int(env["GROUPER_BOOTSTRAP_NODES"])
    replicas = statefulset["spec"]["replicas"]
    assert replicas == bootstrap, "the manifest's first deploy starts exactly the bootstrap members"
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    timings: dict[str, float] = {}

    # ---- first deploy: every replica at once (Parallel), each polled as its readiness probe would
    started_s = time.monotonic()
    started = runner.create_all(list(range(replicas)))
    timings["create_containers_s"] = time.monotonic() - started_s
    started_s = time.monotonic()
    runner.start(started)
    pods = [pod.pod for pod in started]
    timings["ready_s"] = wait_ready(runner, pods, container)

    node_ids = {pod.pod: node_id(pod) for pod in started}
    status = cluster_status(runner, f"{runner.address(pods[0])}:{ports['admin']}")
    assert sorted(member["node"] for member in status["members"]) == sorted(node_ids.values())
    assert status["leader"] in node_ids.values() and status["has_quorum"]
    (config_mount,) = [mount for mount in started[0].mounts if mount.kind == "config"]
    config_file = container["args"][container["args"].index("--config") + 1]
    config = tomllib.loads(config_mount.files[config_file.removeprefix(config_mount.target + "/")])
    declared = [queue["name"] for queue in config["queue"]]  # the ConfigMap's queues, read by --config
    with pytest.raises(AdminError):  # secured: no admin answer without credentials
        with AdminClient(f"{runner.address(pods[-1])}:{ports['admin']}", timeout_ms=ADMIN_TIMEOUT_MS) as admin:
            admin.list_queues()
    with admin_client(runner, f"{runner.address(pods[-1])}:{ports['admin']}") as admin:
        assert set(declared) <= {queue["name"] for queue in admin.list_queues()}
    queue = declared[0]

    urls = [amqps_url(runner, pod, ports["amqps"]) for pod in pods]
    started_s = time.monotonic()
    first = send_grouped_round(runner, tmp_path / "round1", queue, groups("a"), urls, urls)
    timings["traffic_round1_s"] = time.monotonic() - started_s
    journal_owner = (runner.volumes_dir / f"data-{pods[0]}" / "journal.dat").stat().st_uid
    assert journal_owner == 10001, "the journal is written on the claim by the manifest's user"

    # ---- a rolling restart of grouper-1 during a scale-up. The kubelet terminates grouper-1 (preStop
    # hook, then SIGTERM within the grace period); grouper-3, from the same template, starts meanwhile
    # and takes grouper-1's old address, so grouper-1 comes back on its claim with a NEW address, as a
    # restarted pod does. Members still dialling the old address reach grouper-3, which must refuse
    # connections meant for grouper-1 (handler/raft_transport.py) so that they redial by name. Every
    # member must reach every other again, under the same names.
    restarted, restarted_address = pods[1], runner.address(pods[1])
    grace_s = statefulset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    with ThreadPoolExecutor(max_workers=1) as pool:  # the joiner's container is made during the preStop sleep
        termination = pool.submit(terminate, runner, restarted, container, grace_s)
        started_s = time.monotonic()
        joining = runner.create(replicas)
        timings["create_joiner_s"] = time.monotonic() - started_s
        exit_code, timings["terminate_s"] = termination.result()
    assert exit_code == 0, f"{restarted} did not stop cleanly on SIGTERM:\n{runner.logs(restarted)[-2000:]}"
    assert timings["terminate_s"] < grace_s
    started_s = time.monotonic()
    runner.start([joining])
    runner.containers[restarted].start()
    assert runner.address(restarted) != restarted_address, "the scenario needs the restarted pod on a new address"
    joiner = joining.pod
    timings["restart_and_scale_up_ready_s"] = wait_ready(runner, [restarted, joiner], container)
    all_ids = sorted([*node_ids.values(), node_id(joining)])
    timings["all_connected_s"] = wait_all_connected(runner, [*pods, joiner], ports["admin"], all_ids)

    joiner_url = amqps_url(runner, joiner, ports["amqps"])
    restarted_url = amqps_url(runner, restarted, ports["amqps"])
    started_s = time.monotonic()
    second = send_grouped_round(runner, tmp_path / "round2", queue, groups("b"), [joiner_url, restarted_url],
                                [joiner_url, restarted_url, urls[0], urls[2]])
    timings["traffic_round2_s"] = time.monotonic() - started_s

    print(f"\npod template: {first}, then {second} after a restart and a scale-up; "
          + ", ".join(f"{key} {value:.1f}" for key, value in timings.items()))
