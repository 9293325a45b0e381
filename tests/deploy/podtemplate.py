"""The StatefulSet's pod template, read from the rendered manifests and run as Docker containers.

It owns one translation: pod `<set>-<ordinal>` of the StatefulSet -> the container the kubelet would
run, on a Docker engine. Everything comes from the manifests as `kubectl apply -k` would apply them:
image, command, args, environment (fieldRef values substituted for the pod, `$(VAR)` expanded as
Kubernetes expands it), volume mounts (claims, ConfigMaps, Secrets, emptyDirs), user, groups and security
context, memory and CPU limits, and the pod's DNS names (hostname, subdomain, network aliases).

Rules:
- A field the translation does not understand is an `Unsupported` error naming it, never dropped:
  a manifest change must either be emulated faithfully or fail loudly here.
- `pod_container()` and its helpers are pure (plain dicts in, a `PodContainer` out); `PodRunner` is
  the only part that touches the Docker engine or the file system.
- Volumes are host directories bind-mounted into the container, prepared as the kubelet prepares
  them: a fresh claim is root-owned and gets the pod's fsGroup (group-owned, setgid, group-writable),
  an emptyDir is world-writable, a ConfigMap or a Secret is read-only files (a Secret's group-owned
  by the fsGroup, with its defaultMode plus the group read the kubelet adds for an fsGroup). Without
  the manifest's fsGroup the node cannot write its data dir, exactly as on a real cluster. Secrets
  are not in the manifests: the caller passes them (name -> {"data": {key: text}}, the shape of a
  ConfigMap), as `kubectl create secret` would have made them; one the pod names but the caller did
  not pass is a LookupError, as a pod that waits for a missing Secret never starts.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import yaml

KUBECTL_TIMEOUT_S = 30
CLUSTER_DOMAIN = "cluster.local"
NAMESPACE = "default"
TEST_LABEL = "grouper.test"  # every container and network made here carries it, for cleanup
TEST_LABEL_VALUE = "k8s-pod-template"
CONFIG_MAP_DEFAULT_MODE = 0o644  # the kubelet's defaultMode of ConfigMap and Secret files
# with an fsGroup the kubelet ORs this into every ConfigMap and Secret file's mode, whatever defaultMode says
# (SetVolumeOwnership's read-only mask; kubernetes/kubernetes#57923): a Secret 0400 becomes 0440
FS_GROUP_READ_BITS = 0o440
CLAIM_MODE = 0o2775  # a claim after the kubelet applied fsGroup: group-owned, setgid, group-writable
EMPTY_DIR_MODE = 0o777  # the kubelet makes emptyDir volumes world-writable


class Unsupported(Exception):
    """The manifest uses something this emulation cannot reproduce; the message names the field."""


# ---- rendering -------------------------------------------------------------------------------

def render(kustomization_dir: str | Path) -> list[dict]:
    """The resources `kubectl apply -k DIR` would apply, rendered offline by `kubectl kustomize`."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        raise FileNotFoundError("kubectl is not on PATH; the machine image ships it at /usr/bin/kubectl "
                                "(install kubectl to render deploy/k8s with kustomize)")
    result = subprocess.run([kubectl, "kustomize", str(kustomization_dir)], capture_output=True, text=True,
                            timeout=KUBECTL_TIMEOUT_S)
    if result.returncode != 0:
        raise RuntimeError(f"kubectl kustomize {kustomization_dir} failed: {result.stderr.strip()}")
    return [document for document in yaml.safe_load_all(result.stdout) if document]


def resource(documents: list[dict], kind: str, name: str | None = None) -> dict:
    """The one resource of `kind` (named `name`, if given); an error naming what was there otherwise."""
    found = [d for d in documents if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
    if len(found) != 1:
        present = sorted(f"{d['kind']}/{d['metadata']['name']}" for d in documents)
        raise LookupError(f"expected one {kind}{'/' + name if name else ''}, found {len(found)} among {present}")
    return found[0]


# ---- Kubernetes' own rules, as pure functions --------------------------------------------------

def expand(text: str, variables: dict[str, str]) -> str:
    """Kubernetes' `$(VAR)` expansion: `$(NAME)` becomes the variable's value when NAME is defined and
    stays as written otherwise; `$$` is one literal `$`; any other `$` is kept with what follows."""
    out: list[str] = []
    index = 0
    while index < len(text):
        char = text[index]
        if char != "$" or index + 1 == len(text):
            out.append(char)
            index += 1
            continue
        following = text[index + 1]
        if following == "$":
            out.append("$")
            index += 2
        elif following == "(":
            close = text.find(")", index + 2)
            if close < 0:  # unterminated: kept as written
                out.append(text[index:])
                break
            name = text[index + 2:close]
            out.append(variables[name] if name in variables else text[index:close + 1])
            index = close + 1
        else:
            out.append(char + following)
            index += 2
    return "".join(out)


_QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_FACTORS = {None: 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12,
            "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}


def quantity(value, where: str) -> float:
    """A Kubernetes resource quantity ("250m", "1", "512Mi") as a plain number."""
    match = _QUANTITY.match(str(value))
    if match is None:
        raise Unsupported(f"{where}: quantity {value!r} is not a number with one of the suffixes {list(_FACTORS)[1:]}")
    return float(match.group(1)) * _FACTORS[match.group(2)]


def pod_fields(statefulset: dict, ordinal: int, namespace: str) -> dict[str, str]:
    """What a fieldRef can read of pod `ordinal` before it runs."""
    name = f"{statefulset['metadata']['name']}-{ordinal}"
    labels = dict(statefulset["spec"]["template"]["metadata"].get("labels", {}))
    labels["statefulset.kubernetes.io/pod-name"] = name  # the StatefulSet controller adds it
    fields = {"metadata.name": name, "metadata.namespace": namespace}
    fields.update({f"metadata.labels['{key}']": value for key, value in labels.items()})
    return fields


def environment(container: dict, fields: dict[str, str], config_maps: dict[str, dict], where: str,
                secrets: dict[str, dict] | None = None) -> dict[str, str]:
    """The container's environment in Kubernetes' order: each value is expanded against the variables
    defined before it; fieldRef, configMapKeyRef and secretKeyRef are looked up."""
    if container.get("envFrom"):
        raise Unsupported(f"{where}.envFrom is not emulated")
    variables: dict[str, str] = {}
    for index, entry in enumerate(container.get("env", [])):
        at = f"{where}.env[{index}] ({entry['name']})"
        if "value" in entry:
            variables[entry["name"]] = expand(str(entry["value"]), variables)
        elif "fieldRef" in entry.get("valueFrom", {}):
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            if path not in fields:
                raise Unsupported(f"{at}: fieldRef {path!r} is not known before the pod runs; "
                                  f"known: {sorted(fields)}")
            variables[entry["name"]] = fields[path]
        elif "configMapKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["configMapKeyRef"]
            variables[entry["name"]] = config_maps[ref["name"]]["data"][ref["key"]]
        elif "secretKeyRef" in entry.get("valueFrom", {}):
            ref = entry["valueFrom"]["secretKeyRef"]
            variables[entry["name"]] = _secret(secrets, ref["name"], at)["data"][ref["key"]]
        else:
            raise Unsupported(f"{at}: only value, fieldRef, configMapKeyRef and secretKeyRef are emulated")
    return variables


# ---- the container of one pod --------------------------------------------------------------------

@dataclass(frozen=True)
class VolumeMount:
    target: str  # mount path in the container
    kind: str  # "claim" | "config" | "secret" | "empty"
    volume: str  # the volume's (or claim template's) name
    read_only: bool
    files: dict = field(default_factory=dict)  # kinds "config", "secret": file name -> text
    file_mode: int = CONFIG_MAP_DEFAULT_MODE


@dataclass(frozen=True)
class PodContainer:
    pod: str  # pod name, container name and hostname
    subdomain: str  # the governing headless Service
    namespace: str
    image: str
    entrypoint: list | None  # Kubernetes `command` (None: the image's ENTRYPOINT)
    command: list | None  # Kubernetes `args` (None: the image's CMD)
    environment: dict
    user: str | None  # "uid:gid"
    group_add: list
    fs_group: int | None
    read_only_root: bool
    cap_drop: list
    cap_add: list
    no_new_privileges: bool
    memory_limit_bytes: int | None
    nano_cpus: int | None
    mounts: list
    ports: dict  # container port name -> number

    @property
    def domainname(self) -> str:
        return f"{self.subdomain}.{self.namespace}.svc.{CLUSTER_DOMAIN}"

    @property
    def aliases(self) -> list[str]:
        """The names cluster DNS gives the pod (with and without search-path suffixes) and the
        headless Service (which resolves to every pod)."""
        service = [self.subdomain, f"{self.subdomain}.{self.namespace}", f"{self.subdomain}.{self.namespace}.svc",
                   self.domainname]
        return [f"{self.pod}.{name}" for name in service] + service


_POD_KEYS = {"containers", "volumes", "securityContext", "terminationGracePeriodSeconds",
             "automountServiceAccountToken", "enableServiceLinks"}
_CONTAINER_KEYS = {"name", "image", "imagePullPolicy", "command", "args", "env", "ports", "startupProbe",
                   "livenessProbe", "readinessProbe", "lifecycle", "resources", "securityContext", "volumeMounts"}
_SECURITY_KEYS = {"runAsNonRoot", "runAsUser", "runAsGroup", "fsGroup", "fsGroupChangePolicy", "seccompProfile",
                  "allowPrivilegeEscalation", "readOnlyRootFilesystem", "capabilities", "supplementalGroups"}


def _check_known(section: dict, known: set, where: str) -> None:
    unknown = sorted(set(section) - known)
    if unknown:
        raise Unsupported(f"{where}: {unknown} not emulated; teach tests/deploy/podtemplate.py what they do")


def pod_container(statefulset: dict, config_maps: dict[str, dict], ordinal: int,
                  namespace: str = NAMESPACE, secrets: dict[str, dict] | None = None) -> PodContainer:
    spec = statefulset["spec"]
    pod_spec = spec["template"]["spec"]
    _check_known(pod_spec, _POD_KEYS, "spec.template.spec")
    if pod_spec.get("enableServiceLinks", True) is not False:
        raise Unsupported("spec.template.spec.enableServiceLinks: service environment variables are not "
                          "emulated; set it to false")
    if len(pod_spec["containers"]) != 1 or pod_spec.get("initContainers"):
        raise Unsupported("spec.template.spec.containers: exactly one container is emulated")
    container = pod_spec["containers"][0]
    where = f"spec.template.spec.containers[{container['name']}]"
    _check_known(container, _CONTAINER_KEYS, where)
    pod_security = pod_spec.get("securityContext", {})
    security = container.get("securityContext", {})
    _check_known(pod_security, _SECURITY_KEYS, "spec.template.spec.securityContext")
    _check_known(security, _SECURITY_KEYS, f"{where}.securityContext")
    merged = {**pod_security, **security}  # the container's settings win
    if merged.get("runAsNonRoot") and merged.get("runAsUser", 0) == 0:
        raise Unsupported("runAsNonRoot needs a numeric non-zero runAsUser in the manifest (the kubelet would "
                          "refuse to start an image whose user it cannot verify)")
    user = f"{merged['runAsUser']}:{merged.get('runAsGroup', merged['runAsUser'])}" if "runAsUser" in merged else None
    capabilities = security.get("capabilities", {})
    fields = pod_fields(statefulset, ordinal, namespace)
    variables = environment(container, fields, config_maps, where, secrets)
    limits = container.get("resources", {}).get("limits", {})
    fs_group = pod_security.get("fsGroup")
    return PodContainer(
        pod=fields["metadata.name"],
        subdomain=spec["serviceName"],
        namespace=namespace,
        image=container["image"],
        entrypoint=[expand(part, variables) for part in container["command"]] if "command" in container else None,
        command=[expand(part, variables) for part in container["args"]] if "args" in container else None,
        environment=variables,
        user=user,
        group_add=[group for group in [fs_group, *pod_security.get("supplementalGroups", [])] if group is not None],
        fs_group=fs_group,
        read_only_root=bool(security.get("readOnlyRootFilesystem", False)),
        cap_drop=list(capabilities.get("drop", [])),
        cap_add=list(capabilities.get("add", [])),
        no_new_privileges=security.get("allowPrivilegeEscalation", True) is False,
        memory_limit_bytes=int(quantity(limits["memory"], f"{where}.resources.limits.memory")) if "memory" in limits else None,
        nano_cpus=int(quantity(limits["cpu"], f"{where}.resources.limits.cpu") * 1e9) if "cpu" in limits else None,
        mounts=_mounts(statefulset, container, config_maps, where, secrets, fs_group),
        ports={port["name"]: port["containerPort"] for port in container.get("ports", []) if "name" in port},
    )


def _secret(secrets: dict[str, dict] | None, name: str, at: str) -> dict:
    if not secrets or name not in secrets:
        raise LookupError(f"{at}: Secret {name!r} was not given (the pod would wait for it); given: "
                          f"{sorted(secrets or {})}")
    return secrets[name]


def _mounts(statefulset: dict, container: dict, config_maps: dict[str, dict], where: str,
            secrets: dict[str, dict] | None = None, fs_group: int | None = None) -> list[VolumeMount]:
    def file_mode(source: dict) -> int:
        mode = source.get("defaultMode", CONFIG_MAP_DEFAULT_MODE)
        return mode | FS_GROUP_READ_BITS if fs_group is not None else mode

    volumes = {volume["name"]: volume for volume in statefulset["spec"]["template"]["spec"].get("volumes", [])}
    claims = {claim["metadata"]["name"] for claim in statefulset["spec"].get("volumeClaimTemplates", [])}
    mounts = []
    for entry in container.get("volumeMounts", []):
        at = f"{where}.volumeMounts[{entry['name']}]"
        _check_known(entry, {"name", "mountPath", "readOnly"}, at)
        name, read_only = entry["name"], bool(entry.get("readOnly", False))
        if name in claims:
            mounts.append(VolumeMount(entry["mountPath"], "claim", name, read_only))
        elif name not in volumes:
            raise LookupError(f"{at}: no volume or volumeClaimTemplate named {name!r}")
        elif "configMap" in volumes[name]:
            source = volumes[name]["configMap"]
            _check_known(source, {"name", "defaultMode", "items"}, f"volumes[{name}].configMap")
            data = config_maps[source["name"]].get("data", {})
            items = source.get("items") or [{"key": key, "path": key} for key in data]
            mounts.append(VolumeMount(entry["mountPath"], "config", name, True,
                                      {item["path"]: data[item["key"]] for item in items},
                                      file_mode(source)))
        elif "secret" in volumes[name]:
            source = volumes[name]["secret"]
            _check_known(source, {"secretName", "defaultMode", "items"}, f"volumes[{name}].secret")
            data = _secret(secrets, source["secretName"], f"volumes[{name}]")["data"]
            items = source.get("items") or [{"key": key, "path": key} for key in data]
            mounts.append(VolumeMount(entry["mountPath"], "secret", name, True,
                                      {item["path"]: data[item["key"]] for item in items},
                                      file_mode(source)))
        elif "emptyDir" in volumes[name]:
            if volumes[name]["emptyDir"].get("medium"):
                raise Unsupported(f"volumes[{name}].emptyDir.medium is not emulated")
            mounts.append(VolumeMount(entry["mountPath"], "empty", name, read_only))
        else:
            raise Unsupported(f"volumes[{name}]: only configMap, secret and emptyDir volumes (and claims) are "
                              "emulated")
    return mounts


def http_probe(container: dict, probe: str) -> tuple[str, int]:
    """(path, port number) of the container's `probe` (e.g. "readinessProbe"), named ports resolved."""
    action = container[probe]["httpGet"]
    port = action["port"]
    if isinstance(port, str):
        named = {entry["name"]: entry["containerPort"] for entry in container.get("ports", []) if "name" in entry}
        if port not in named:
            raise LookupError(f"{probe} names port {port!r}, but the container's ports are {sorted(named)}")
        port = named[port]
    return action["path"], int(port)


# ---- the Docker side ----------------------------------------------------------------------------

class PodRunner:
    """Runs pods of one StatefulSet as containers on one internal (isolated) Docker network.
    `close()` removes every container, the network and the volumes' directories."""

    def __init__(self, client, statefulset: dict, config_maps: dict[str, dict], volumes_dir: Path,
                 namespace: str = NAMESPACE, secrets: dict[str, dict] | None = None):
        self.client = client
        self.statefulset = statefulset
        self.config_maps = config_maps
        self.secrets = secrets
        self.volumes_dir = Path(volumes_dir)
        self.namespace = namespace
        self.containers: dict[str, object] = {}
        self.network = None
        self._remove_leftovers()
        self.network = client.networks.create(f"grouper-k8s-{uuid.uuid4().hex[:8]}", driver="bridge", internal=True,
                                              labels={TEST_LABEL: TEST_LABEL_VALUE})

    def _remove_leftovers(self) -> None:
        """Containers and networks an earlier, killed run of this test left behind (by label only)."""
        selector = {"label": f"{TEST_LABEL}={TEST_LABEL_VALUE}"}
        for container in self.client.containers.list(all=True, filters=selector):
            container.remove(force=True)
        for network in self.client.networks.list(filters=selector):
            network.remove()

    def create(self, ordinal: int) -> PodContainer:
        """Create pod `ordinal`'s container (not started: on vfs, creating copies the image and is the
        slow part; starting is quick, so pods created first then started come up together, as pods
        of a Parallel StatefulSet do)."""
        from docker.types import EndpointConfig, Mount

        pod = pod_container(self.statefulset, self.config_maps, ordinal, self.namespace, self.secrets)
        mounts = [Mount(mount.target, str(self._prepare(pod, mount)), type="bind", read_only=mount.read_only)
                  for mount in pod.mounts]
        endpoint = EndpointConfig(self.client.api.api_version, aliases=pod.aliases)
        self.containers[pod.pod] = self.client.containers.create(
            pod.image, entrypoint=pod.entrypoint, command=pod.command, name=pod.pod, hostname=pod.pod,
            domainname=pod.domainname, environment=pod.environment, user=pod.user,
            group_add=[str(group) for group in pod.group_add], read_only=pod.read_only_root,
            cap_drop=pod.cap_drop or None, cap_add=pod.cap_add or None,
            security_opt=["no-new-privileges"] if pod.no_new_privileges else None,
            mem_limit=pod.memory_limit_bytes, nano_cpus=pod.nano_cpus, mounts=mounts,
            network=self.network.name, networking_config={self.network.name: endpoint},
            labels={TEST_LABEL: TEST_LABEL_VALUE}, detach=True)
        return pod

    def start(self, pods: list[PodContainer]) -> None:
        for pod in pods:
            self.containers[pod.pod].start()

    def _prepare(self, pod: PodContainer, mount: VolumeMount) -> Path:
        """The host directory behind one mount, as the kubelet would hand it to the container."""
        path = self.volumes_dir / f"{mount.volume}-{pod.pod}"  # claims are named <template>-<pod>
        if path.exists():  # a restarted pod keeps its claim
            return path
        path.mkdir(parents=True)
        group = pod.fs_group if pod.fs_group is not None else 0
        if mount.kind == "claim":
            os.chown(path, 0, group)
            os.chmod(path, CLAIM_MODE if pod.fs_group is not None else 0o755)
        elif mount.kind == "empty":
            os.chmod(path, EMPTY_DIR_MODE)
        else:
            for name, text in mount.files.items():
                file_path = path / name
                file_path.write_text(text)
                os.chown(file_path, 0, group)
                os.chmod(file_path, mount.file_mode)
            os.chmod(path, 0o755)
        return path

    def address(self, pod: str) -> str:
        """The pod's IP on the network (what a Service endpoint would point at)."""
        container = self.containers[pod]
        container.reload()
        return container.attrs["NetworkSettings"]["Networks"][self.network.name]["IPAddress"]

    def running(self, pod: str) -> bool:
        container = self.containers[pod]
        container.reload()
        return container.status == "running"

    def logs(self, pod: str) -> str:
        return self.containers[pod].logs().decode(errors="replace")

    def create_all(self, ordinals: list[int]) -> list[PodContainer]:
        """`create` for several pods at once: on vfs each copies the whole image, so they overlap."""
        with ThreadPoolExecutor(max_workers=len(ordinals) or 1) as pool:
            return list(pool.map(self.create, ordinals))

    def close(self) -> list[str]:
        """Remove everything (containers at once: on vfs each removal deletes a whole copy of the
        image); returns the errors met, for the caller to report without masking its own failure."""
        def remove(item) -> str | None:
            name, container = item
            try:
                container.remove(force=True)
            except Exception as error:  # noqa: BLE001 - keep removing the rest
                return f"container {name}: {error}"
            return None

        with ThreadPoolExecutor(max_workers=len(self.containers) or 1) as pool:
            errors = [error for error in pool.map(remove, list(self.containers.items())) if error]
        if self.network is not None:
            try:
                self.network.remove()
            except Exception as error:  # noqa: BLE001
                errors.append(f"network {self.network.name}: {error}")
        shutil.rmtree(self.volumes_dir, ignore_errors=True)
        return errors
