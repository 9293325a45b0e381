"""Black-box tests of the Grouper image: who it runs as, its volume and health check, and that a
node it cannot serve with exits non-zero naming the problem.

Rules:
- Containers are started with the Docker SDK on the default network and removed in a finally;
  no port is published, nothing is pulled.
- Each container on the vfs driver costs seconds to create, so the refused starts run at once,
  each awaited with its own deadline.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import docker.errors

EXIT_WAIT_S = 60.0  # a refused start exits within a second or two; the engine may be slow to create
HEALTHY_WAIT_S = 60.0
LOG_TAIL_CHARS = 2000

# the first administrator, made at the first start (a literal password: these containers are throw-away)
ADMIN_ENVIRONMENT = {"GROUPER_DEFAULT_USER": "admin", "GROUPER_DEFAULT_PASSWORD": "image-test-password"}

# name -> (environment, extra args, extra run options, a fragment the node's stderr must contain)
REFUSED_STARTS = {
    "peer list without this node": (
        {"GROUPER_PEERS": "a:5674,b:5674,c:5674", "GROUPER_ADVERTISE_HOST": "me"}, [], {},
        "does not list it"),
    "data dir that does not exist": ({"GROUPER_DATA_DIR": "/var/lib/grouper/missing/deeper"}, [], {},
                                     "does not exist"),
    "data dir on the container's own layer": ({"GROUPER_DATA_DIR": "/opt/grouper"}, [], {},
                                              "not a mounted volume"),
    "data volume the node cannot write": (
        {}, [], {"tmpfs": {"/var/lib/grouper": "mode=0755,uid=0,gid=0"}}, "not usable"),
    "port in use": ({**ADMIN_ENVIRONMENT}, ["--amqp-port", "5673"], {}, "5673"),
    # secure by default: the image lets nobody in until it has users
    "no users on 0.0.0.0": ({}, [], {}, "--allow-anonymous"),
}


def run_until_exit(client, image: str, environment: dict, args: list[str], options: dict) -> tuple[int | None, str]:
    container = client.containers.run(image, args, environment=environment, detach=True, **options)
    try:
        deadline = time.monotonic() + EXIT_WAIT_S
        while True:
            container.reload()
            if container.status == "exited":
                return container.attrs["State"]["ExitCode"], container.logs().decode(errors="replace")
            if time.monotonic() > deadline:
                return None, container.logs().decode(errors="replace")
            time.sleep(0.2)
    finally:
        container.remove(force=True, v=True)


def test_a_node_that_cannot_serve_exits_non_zero_naming_the_problem(docker_client, grouper_image):
    with ThreadPoolExecutor(len(REFUSED_STARTS)) as pool:
        results = dict(zip(REFUSED_STARTS, pool.map(
            lambda case: run_until_exit(docker_client, grouper_image, *case[:3]), REFUSED_STARTS.values())))
    for name, (exit_code, output) in results.items():
        expected = REFUSED_STARTS[name][3]
        assert exit_code not in (None, 0), f"{name}: exit status {exit_code}:\n{output[-LOG_TAIL_CHARS:]}"
        assert expected in output, f"{name}: {expected!r} not in the node's output:\n{output[-LOG_TAIL_CHARS:]}"


def test_the_image_runs_a_single_node_as_uid_10001_on_its_volume_and_reports_healthy(docker_client,
                                                                                   grouper_image):
    image = docker_client.images.get(grouper_image)
    config = image.attrs["Config"]
    assert config["User"] == "10001:10001", config["User"]
    assert "/var/lib/grouper" in (config.get("Volumes") or {}), config.get("Volumes")
    assert sorted(config["ExposedPorts"]) == ["5671/tcp", "5672/tcp", "5673/tcp", "5674/tcp", "5675/tcp",
                                              "5676/tcp"], config["ExposedPorts"]
    assert "GROUPER_ALLOW_ANONYMOUS=true" not in config["Env"], config["Env"]
    container = docker_client.containers.run(grouper_image, environment=ADMIN_ENVIRONMENT, detach=True)
    try:
        deadline = time.monotonic() + HEALTHY_WAIT_S
        while True:
            container.reload()
            health = container.attrs["State"].get("Health", {})
            if health.get("Status") == "healthy":
                break
            assert container.status == "running" and time.monotonic() < deadline, \
                f"not healthy within {HEALTHY_WAIT_S} s: {container.status}, {health}\n" \
                f"{container.logs().decode(errors='replace')[-LOG_TAIL_CHARS:]}"
            time.sleep(0.2)
        exit_code, output = container.exec_run(["sh", "-c", "id -u; stat -c '%u %a' /var/lib/grouper; "
                                                            "ls /var/lib/grouper"])
        uid, data_dir_owner, *files = output.decode().splitlines()
        assert exit_code == 0 and uid == "10001" and data_dir_owner == "10001 700", output.decode()
        assert files, f"the node wrote nothing to its data volume: {output.decode()}"
        # the management CLI in the image reaches the node's admin port (default 127.0.0.1:5673), with
        # the bootstrapped administrator's credentials; without them it is refused (exit 4)
        exit_code, output = container.exec_run(["grouper", "queue", "list"])
        assert exit_code == 4, output.decode()
        exit_code, output = container.exec_run(["grouper", "queue", "list"], environment={
            "GROUPER_USER": "admin", "GROUPER_PASSWORD": ADMIN_ENVIRONMENT["GROUPER_DEFAULT_PASSWORD"]})
        assert exit_code == 0, output.decode()
    finally:
        try:
            container.remove(force=True, v=True)
        except docker.errors.NotFound:
            pass
