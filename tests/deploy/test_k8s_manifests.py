"""deploy/k8s, offline: every manifest passes the Kubernetes schemas, and the rendered resources have
the properties a Raft cluster of Grouper nodes needs (names, DNS, probes, disruption budget, a
non-root security context, the queue definitions). The peer script of the pod is run here with
dash, as the image runs it. Booting the pod template on Docker is test_k8s_pod_template.py.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from node.config import load
from node.file_modes import secret_file_problem
from tests.deploy.podtemplate import Unsupported, expand, http_probe, pod_container, quantity, render, resource

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
VALIDATE_TIMEOUT_S = 60
KUBERNETES_VERSIONS = ("1.29", "1.37")  # the oldest still common in managed clusters, and the newest known
SCRIPT_TIMEOUT_S = 10
PRE_STOP_SLEEP_S = 5
NODE_STOP_WAIT_S = 10  # node/runtime.py STOP_WAIT_S: how long a node's clean stop may take


@pytest.fixture(scope="module")
def documents() -> list[dict]:
    return render(K8S)


@pytest.fixture(scope="module")
def statefulset(documents) -> dict:
    return resource(documents, "StatefulSet", "grouper")


@pytest.fixture(scope="module")
def container(statefulset) -> dict:
    (only,) = statefulset["spec"]["template"]["spec"]["containers"]
    return only


def env_values(container: dict) -> dict:
    return {entry["name"]: entry.get("value") for entry in container["env"]}


def test_every_manifest_and_the_rendered_set_pass_the_kubernetes_schemas_strictly(tmp_path, documents):
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(documents))
    sources = sorted(str(path) for path in K8S.glob("*.yaml") if path.name != "kustomization.yaml")
    for version in KUBERNETES_VERSIONS:
        result = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "--quiet", "-k", version,
                                 str(rendered), *sources], capture_output=True, text=True, timeout=VALIDATE_TIMEOUT_S)
        assert result.returncode == 0, f"Kubernetes {version}:\n{result.stdout}{result.stderr}"
    kinds = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in documents)
    assert [kind.rsplit("-", 1)[0] if kind.startswith("ConfigMap/") else kind for kind in kinds] == [
        "ConfigMap/grouper-config", "PodDisruptionBudget/grouper", "Service/grouper", "Service/grouper-headless",
        "StatefulSet/grouper"]


def test_the_kustomization_names_every_manifest_in_the_directory():
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    listed = set(kustomization["resources"]) | {name for generator in kustomization["configMapGenerator"]
                                                for name in generator["files"]}
    present = {path.name for path in K8S.iterdir() if path.name != "kustomization.yaml"}
    assert listed == present, f"not applied by kubectl apply -k: {sorted(present - listed)}; missing: {sorted(listed - present)}"


def test_pods_start_together_with_stable_dns_names_from_a_headless_service_that_publishes_unready_pods(
        documents, statefulset):
    spec = statefulset["spec"]
    assert spec["podManagementPolicy"] == "Parallel"  # OrderedReady would wait for a lone, never-ready grouper-0
    headless = resource(documents, "Service", spec["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert headless["spec"]["publishNotReadyAddresses"] is True
    pod_labels = spec["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= pod_labels.items()
    assert headless["spec"]["selector"].items() <= pod_labels.items()


def test_the_advertised_host_is_the_pods_name_under_the_headless_service(statefulset, container):
    env = env_values(container)
    fields = {entry["name"]: entry["valueFrom"]["fieldRef"]["fieldPath"] for entry in container["env"]
              if "fieldRef" in entry.get("valueFrom", {})}
    assert fields == {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace"}
    advertised = expand(env["GROUPER_ADVERTISE_HOST"], {"POD_NAME": "grouper-4", "POD_NAMESPACE": "shop"})
    assert advertised == f"grouper-4.{statefulset['spec']['serviceName']}.shop.svc"
    assert env["GROUPER_HOST"] == "0.0.0.0"


def test_probes_ask_the_nodes_http_port_for_readyz_and_healthz(documents, container):
    env = env_values(container)
    http_port = int(env["GROUPER_HTTP_PORT"])
    assert http_probe(container, "readinessProbe") == ("/readyz", http_port)
    assert http_probe(container, "livenessProbe") == ("/healthz", http_port)
    assert http_probe(container, "startupProbe") == ("/healthz", http_port)
    headless = resource(documents, "Service", "grouper-headless")
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"amqp": int(env["GROUPER_AMQP_PORT"]), "admin": int(env["GROUPER_ADMIN_PORT"]),
                     "raft": int(env["GROUPER_RAFT_PORT"]), "http": http_port,
                     "amqps": int(env["GROUPER_AMQPS_PORT"]), "peer": int(env["GROUPER_PEER_PORT"])}
    assert {p["name"]: p["port"] for p in headless["spec"]["ports"]}["raft"] == ports["raft"]


def test_the_client_service_offers_amqp_and_admin_of_ready_pods_only(documents, statefulset):
    service = resource(documents, "Service", "grouper")
    assert service["spec"].get("publishNotReadyAddresses", False) is False
    assert service["spec"]["selector"].items() <= statefulset["spec"]["template"]["metadata"]["labels"].items()
    assert {(p["name"], p["port"], p["targetPort"]) for p in service["spec"]["ports"]} == {
        ("amqp", 5672, "amqp"), ("amqps", 5671, "amqps"), ("admin", 5673, "admin")}


def test_the_disruption_budget_keeps_a_raft_majority_for_every_size_from_three(documents, statefulset):
    budget = resource(documents, "PodDisruptionBudget", "grouper")
    assert budget["spec"]["selector"]["matchLabels"].items() <= statefulset["spec"]["template"]["metadata"]["labels"].items()
    unavailable_max = budget["spec"]["maxUnavailable"]
    for size in range(3, 10):
        assert size - unavailable_max >= size // 2 + 1, size
    assert statefulset["spec"]["replicas"] >= 3


def test_the_journal_lives_on_a_claim_per_pod_mounted_at_the_data_dir(statefulset, container):
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    assert mounts[claim["metadata"]["name"]] == env_values(container)["GROUPER_DATA_DIR"]
    assert claim["spec"]["accessModes"] == ["ReadWriteOnce"]
    assert statefulset["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Retain"


def test_the_node_runs_unprivileged_as_uid_10001_with_a_read_only_root(statefulset, container):
    pod = statefulset["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert (pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"],
            pod["securityContext"]["fsGroup"]) == (10001, 10001, 10001)
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"]["drop"] == ["ALL"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert pod["automountServiceAccountToken"] is False
    assert pod["enableServiceLinks"] is False  # GROUPER_PORT=tcp://... would land among the node's settings


def test_secrets_are_mounted_owner_read_only_and_the_node_accepts_them_as_the_kubelet_leaves_them(
        documents, statefulset):
    """Issue 26 finding 7: the node refuses a secret file others may read. The manifest asks for 0400; with
    the fsGroup the kubelet makes the files root:10001 0440, which the node accepts (root owns them)."""
    volumes = statefulset["spec"]["template"]["spec"]["volumes"]
    assert {volume["name"]: volume["secret"]["defaultMode"] for volume in volumes if "secret" in volume} == {
        "tls": 0o400, "auth": 0o400}
    pod = pod_container(statefulset, config_maps_of(documents), 0, "default", SECRETS)
    modes = {mount.volume: mount.file_mode for mount in pod.mounts if mount.kind == "secret"}
    assert modes == {"tls": 0o440, "auth": 0o440}
    assert all(secret_file_problem(mode, owned_by_node=False) is None for mode in modes.values())
    assert secret_file_problem(0o440, owned_by_node=True) == "readable by its group"  # were it the node's own


def test_requests_fit_within_limits(container):
    resources = container["resources"]
    for kind in ("cpu", "memory"):
        request = quantity(resources["requests"][kind], kind)
        limit = quantity(resources["limits"][kind], kind)
        assert 0 < request <= limit, kind


def test_termination_grace_covers_the_pre_stop_sleep_and_the_nodes_clean_stop(statefulset, container):
    command = container["lifecycle"]["preStop"]["exec"]["command"]
    assert command == ["sleep", str(PRE_STOP_SLEEP_S)]
    grace_s = statefulset["spec"]["template"]["spec"]["terminationGracePeriodSeconds"]
    assert grace_s >= PRE_STOP_SLEEP_S + NODE_STOP_WAIT_S + 5


# What a pod's memory holds beside its budgets, each from docs/benchmarks.md:
# - a queued message's journal index entry: "Paging: node memory and paged drains", the recovered
#   10,000,000 messages in 1,000 groups (budgets 8/64 and 256/64 MiB): resident less ~80 MB at rest, the
#   bodies in RAM and the 64 MiB of records is 20.7-22.5 bytes a message settled and 27.7-29.5 at the
#   recovery's peak (the packed index's 20.5, node/store/spans.py, and the cold count's 2.6-5.4,
#   "Memory: queued messages and groups"), rounded up from the peak;
# - warm records: "Memory: queued messages and groups", resident 163.9 bytes a paged message and 427.1
#   a group of its own against the 160 and 160 + 256 record_memory_max_bytes counts them as: up to 3%
#   more than the budget;
# - a route on one pod, node process and raft member together: "Routes on 3 nodes", 1,000,000 live
#   routes: 226-232 MB a pod against 96 MB at rest, 130-136 bytes a route;
# - an outbound entry beside its body: "Forwarding backlogs", 450-463 bytes a paged message, 644-655
#   whole (the unbounded runs), rounded up from 655.
INDEX_BYTES_PER_QUEUED_MESSAGE = 32
RECORD_BUDGET_RESIDENT_RATIO = 1.03
ROUTE_BYTES_PER_POD = 150
OUTBOUND_ENTRY_BYTES = 660
POD_AT_REST_BYTES = 100 << 20  # node and raft member with no messages and no routes (96 MB measured)
MEMORY_ENV = ("GROUPER_MESSAGE_MEMORY_MAX_BYTES", "GROUPER_RECORD_MEMORY_MAX_BYTES", "GROUPER_ROUTES_MAX",
              "GROUPER_OUTBOUND_MAX_BYTES", "GROUPER_OUTBOUND_TOTAL_MAX_BYTES", "GROUPER_OUTBOUND_MEMORY_MAX_BYTES",
              "GROUPER_OUTBOUND_MAX_MESSAGES")


def outbound_held_bytes(config, owner_pods: int) -> float:
    """The outbound stores' share of a pod with `owner_pods` other pods: the bodies its forwarders hold
    (outbound_memory_max_bytes per owner; a restart leaves the rest in the journal too, a2b4fa7), at
    most the store's bound, and a record per message, outbound_max_messages per owner."""
    return (min(owner_pods * config.outbound_memory_max_bytes, config.outbound_total_max_bytes)
            + owner_pods * config.outbound_max_messages * OUTBOUND_ENTRY_BYTES)


@pytest.fixture(scope="module")
def config_map_config(tmp_path_factory, documents, statefulset, container):
    volumes = {v["name"]: v for v in statefulset["spec"]["template"]["spec"]["volumes"]}
    (mount,) = [m for m in container["volumeMounts"] if "configMap" in volumes.get(m["name"], {})]
    config_map = resource(documents, "ConfigMap", volumes[mount["name"]]["configMap"]["name"])
    config_flag = container["args"][container["args"].index("--config") + 1]
    assert os.path.dirname(config_flag) == mount["mountPath"] and mount["readOnly"] is True
    path = tmp_path_factory.mktemp("config") / "grouper.toml"
    path.write_text(config_map["data"][os.path.basename(config_flag)])
    env = env_values(container)  # the settings of memory the StatefulSet sets (the rest need the pod's script)
    return load(str(path), environ={key: env[key] for key in MEMORY_ENV})


def test_the_config_map_holds_queue_definitions_the_node_accepts_and_is_passed_with_config(config_map_config):
    assert [queue.name for queue in config_map_config.queues] == ["orders", "carts", "carts.dlq"]


def test_queue_depths_are_bounded_by_the_volume_not_by_the_pods_memory(config_map_config, statefulset):
    # bodies past the node's memory budget stay in the journal, so a queue's depth in bytes is a share of
    # the volume: the declared queues and the auto-created template together take at most half of it
    # (compaction writes a copy of the live records before it drops the old file)
    config = config_map_config
    settings = [*config.queues, config.template_settings()]
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    volume_bytes = quantity(claim["spec"]["resources"]["requests"]["storage"], "storage")
    assert 0 not in [queue.depth_max_bytes for queue in settings]
    assert sum(queue.depth_max_bytes for queue in settings) <= volume_bytes / 2
    # and records past their budget go cold, so the depth in messages is no longer what the pod's memory
    # holds records for: the budget is far below what the queues' depths would take as warm records
    # (160 bytes each, as the budget counts them)
    assert 0 < config.record_memory_max_bytes < sum(queue.depth_max_messages for queue in settings) * 160 / 4


def test_what_a_pod_holds_in_memory_adds_up_to_within_its_limit(config_map_config, container, statefulset):
    config = config_map_config
    settings = [*config.queues, config.template_settings()]
    assert 0 not in [queue.depth_max_messages for queue in settings]
    assert config.message_memory_max_bytes > 0 and config.record_memory_max_bytes > 0
    assert config.outbound_total_max_bytes > 0 and config.outbound_max_messages > 0  # else it would be unbounded
    held_bytes = (POD_AT_REST_BYTES + config.message_memory_max_bytes
                  + config.record_memory_max_bytes * RECORD_BUDGET_RESIDENT_RATIO
                  + sum(queue.depth_max_messages for queue in settings) * INDEX_BYTES_PER_QUEUED_MESSAGE
                  + config.routes_max * ROUTE_BYTES_PER_POD
                  + outbound_held_bytes(config, statefulset["spec"]["replicas"] - 1))
    memory_limit_bytes = quantity(container["resources"]["limits"]["memory"], "memory")
    assert held_bytes <= memory_limit_bytes * 3 / 4, held_bytes  # a quarter left for Python's own overhead


def test_the_outbound_store_is_bounded_well_inside_the_pods_memory_beside_the_queues(config_map_config, container,
                                                                                     statefulset):
    # a dead owner's backlog costs memory too (bodies up to the forwarders' budget, a record per
    # message up to outbound_max_messages): its bounds must leave the pod room (the sum above counts them), and
    # the per-owner memory budget must be below the per-owner bound, or the store never pages
    config = config_map_config
    memory_limit_bytes = quantity(container["resources"]["limits"]["memory"], "memory")
    assert 0 < config.outbound_max_bytes <= config.outbound_total_max_bytes <= memory_limit_bytes / 8
    assert 0 < config.outbound_memory_max_bytes < config.outbound_max_bytes
    owner_pods = statefulset["spec"]["replicas"] - 1
    assert owner_pods * config.outbound_memory_max_bytes <= config.outbound_total_max_bytes
    assert outbound_held_bytes(config, owner_pods) <= memory_limit_bytes / 4


# ---- the pod's peer script, run with dash as the image runs it -----------------------------------

@pytest.fixture(scope="module")
def run_pod_command(tmp_path_factory, container):
    """Runs the container's command for a pod name, with a `grouper` on PATH that prints the peer
    settings it was started with instead of starting a node."""
    bin_dir = tmp_path_factory.mktemp("bin")
    fake = bin_dir / "grouper"
    fake.write_text('#!/bin/sh\necho "args=$*"\necho "peers=$GROUPER_PEERS"\necho "join=${GROUPER_JOIN:-}"\n'
                    'echo "certificates=$GROUPER_TLS_CERT_FILE $GROUPER_ADMIN_TLS_KEY_FILE $GROUPER_CLUSTER_TLS_CERT_FILE"\n')
    fake.chmod(0o755)
    shell = shutil.which("dash") or "/bin/sh"

    def run(pod_name: str, **overrides) -> subprocess.CompletedProcess:
        env = {entry["name"]: entry.get("value", "") for entry in container["env"]}
        env.update(POD_NAME=pod_name, POD_NAMESPACE="shop")
        env = {name: expand(value, env) for name, value in env.items()}
        env.update(overrides)
        env["PATH"] = f"{bin_dir}:/usr/bin:/bin"
        command = [shell if part == "/bin/sh" else part for part in container["command"]]
        return subprocess.run([*command, *container["args"]], env=env, capture_output=True, text=True,
                              timeout=SCRIPT_TIMEOUT_S)

    return run


def bootstrap_peers(count: int) -> str:
    return ",".join(f"grouper-{i}.grouper-headless.shop.svc:5674" for i in range(count))


@pytest.mark.parametrize("pod_name", ["grouper-0", "grouper-2"])
def test_a_bootstrap_pod_starts_the_node_with_the_bootstrap_members_as_peers(run_pod_command, pod_name):
    result = run_pod_command(pod_name)
    assert result.returncode == 0, result.stderr
    tls = "/run/secrets/grouper/tls"  # the Secret grouper-tls; each pod its own files
    assert result.stdout.splitlines() == ["args=node --config /etc/grouper/grouper.toml",
                                          f"peers={bootstrap_peers(3)}", "join=",
                                          f"certificates={tls}/{pod_name}.pem {tls}/{pod_name}-key.pem "
                                          f"{tls}/{pod_name}.pem"]


@pytest.mark.parametrize("pod_name", ["grouper-3", "grouper-11"])
def test_a_pod_beyond_the_bootstrap_size_joins_the_existing_members(run_pod_command, pod_name):
    result = run_pod_command(pod_name)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[1:3] == [f"peers={bootstrap_peers(3)}", "join=true"]


def test_the_bootstrap_size_decides_who_joins(run_pod_command):
    result = run_pod_command("grouper-3", GROUPER_BOOTSTRAP_NODES="5")
    assert result.stdout.splitlines()[1:3] == [f"peers={bootstrap_peers(5)}", "join="]


@pytest.mark.parametrize("bootstrap, complaint", [("0", "GROUPER_BOOTSTRAP_NODES must be a positive integer"),
                                                  ("three", "GROUPER_BOOTSTRAP_NODES must be a positive integer"),
                                                  ("", "GROUPER_BOOTSTRAP_NODES must be a positive integer")])
def test_a_bad_bootstrap_size_stops_the_pod_naming_it(run_pod_command, bootstrap, complaint):
    result = run_pod_command("grouper-1", GROUPER_BOOTSTRAP_NODES=bootstrap)
    assert result.returncode == 2 and complaint in result.stderr and result.stdout == ""


def test_a_pod_name_without_an_ordinal_stops_the_pod_naming_it(run_pod_command):
    result = run_pod_command("grouper")
    assert result.returncode == 2 and "does not end in -ORDINAL" in result.stderr


def test_kubernetes_expansion_leaves_the_scripts_own_shell_syntax_alone(container):
    env = {entry["name"]: "X" for entry in container["env"]}
    assert [expand(part, env) for part in container["command"]] == container["command"]


# ---- the emulation's own rules (Kubernetes' $(VAR) expansion) -------------------------------------

@pytest.mark.parametrize("text, expected", [
    ("$(A).b", "1.b"),
    ("$(MISSING)", "$(MISSING)"),
    ("$$(A)", "$(A)"),
    ("$$$(A)", "$1"),
    ("$A ${A} $((i + 1))", "$A ${A} $((i + 1))"),
    ("tail $(A", "tail $(A"),
    ("$", "$"),
])
def test_dollar_parenthesis_expands_as_kubernetes_does(text, expected):
    assert expand(text, {"A": "1"}) == expected


# ---- the pod-template translation (tests/deploy/podtemplate.py), pure ------------------------------

def config_maps_of(documents: list[dict]) -> dict:
    return {d["metadata"]["name"]: d for d in documents if d["kind"] == "ConfigMap"}


SECRETS = {"grouper-tls": {"data": {"ca.pem": "CA", "grouper-3.pem": "CERT", "grouper-3-key.pem": "KEY"}},
           "grouper-auth": {"data": {"users.json": "{}", "admin-password": "pw", "raft.secret": "s" * 16}}}


def test_pod_three_translates_to_its_names_environment_mounts_and_limits(documents, statefulset):
    pod = pod_container(statefulset, config_maps_of(documents), 3, "shop", SECRETS)
    assert (pod.pod, pod.domainname) == ("grouper-3", "grouper-headless.shop.svc.cluster.local")
    assert "grouper-3.grouper-headless.shop.svc" in pod.aliases and "grouper-3.grouper-headless" in pod.aliases
    assert pod.environment["GROUPER_ADVERTISE_HOST"] == "grouper-3.grouper-headless.shop.svc"
    assert (pod.user, pod.group_add, pod.cap_drop, pod.no_new_privileges, pod.read_only_root) == (
        "10001:10001", [10001], ["ALL"], True, True)
    assert (pod.memory_limit_bytes, pod.nano_cpus) == (1 << 30, 1_000_000_000)
    kinds = {mount.target: (mount.kind, mount.volume, mount.read_only) for mount in pod.mounts}
    assert kinds == {"/var/lib/grouper": ("claim", "data", False), "/etc/grouper": ("config", "config", True),
                     "/tmp": ("empty", "tmp", False), "/run/secrets/grouper/tls": ("secret", "tls", True),
                     "/run/secrets/grouper/auth": ("secret", "auth", True)}
    secrets = {mount.volume: mount for mount in pod.mounts if mount.kind == "secret"}
    assert secrets["auth"].files["raft.secret"] == "s" * 16 and secrets["auth"].file_mode == 0o440
    assert pod.environment["GROUPER_PASSWORD"] == "pw" and pod.environment["GROUPER_USER"] == "admin"
    assert "GROUPER_ALLOW_ANONYMOUS" not in pod.environment  # secure by default
    with pytest.raises(LookupError, match="grouper-auth"):  # a pod without its Secret never starts
        pod_container(statefulset, config_maps_of(documents), 3, "shop", {"grouper-tls": SECRETS["grouper-tls"]})
    (config,) = [mount for mount in pod.mounts if mount.kind == "config"]
    assert "[[queue]]" in config.files["grouper.toml"]


def test_a_pod_field_the_translation_does_not_know_is_an_error_naming_it(documents, statefulset):
    changed = copy.deepcopy(statefulset)
    changed["spec"]["template"]["spec"]["hostNetwork"] = True
    with pytest.raises(Unsupported, match="hostNetwork"):
        pod_container(changed, config_maps_of(documents), 0, secrets=SECRETS)
    changed = copy.deepcopy(statefulset)
    changed["spec"]["template"]["spec"]["containers"][0]["env"].append(
        {"name": "NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}})
    with pytest.raises(Unsupported, match="status.hostIP"):
        pod_container(changed, config_maps_of(documents), 0, secrets=SECRETS)


def test_quantities_read_as_kubernetes_writes_them():
    assert [quantity(v, "x") for v in ("250m", "1", "256Mi", "1Gi", "2k")] == [0.25, 1, 256 << 20, 1 << 30, 2000]
    with pytest.raises(Unsupported, match="1 GB"):
        quantity("1 GB", "x")


def test_updates_roll_one_ready_pod_at_a_time_as_the_readme_says(statefulset, container):
    strategy = statefulset["spec"]["updateStrategy"]
    assert strategy["type"] == "RollingUpdate"
    # every pod is updated, one at a time: no maxUnavailable above 1 (a beta field off by default)
    assert strategy.get("rollingUpdate", {}).get("partition", 0) == 0
    assert strategy.get("rollingUpdate", {}).get("maxUnavailable", 1) == 1
    assert http_probe(container, "readinessProbe")[0] == "/readyz"  # what "ready" waits for
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("### Upgrades"):]
    section = section[:section.index("\n## ")]
    for promise in ("`RollingUpdate`", "one pod at a time", "`/readyz`", "one version step at a time",
                    "tests/drills/test_rolling_upgrade.py"):
        assert promise in " ".join(section.split()), promise
