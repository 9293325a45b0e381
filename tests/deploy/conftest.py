"""Session fixtures of the deployment tests: a Docker engine and the Grouper image built on it.

Rules:
- `docker_client` connects to the engine; if none answers it runs deploy/docker/engine.sh once (which
  installs and starts one) and connects again. No engine is a test failure naming the reason, never
  a skip: the deployment is part of what CI proves.
- `grouper_image` runs deploy/docker/build.py once per session and returns the image tag. The build
  is cached (base image, wheels, layers), so a session without source changes pays a few seconds.
- Both are bounded: the engine script by ENGINE_TIMEOUT_S, the build by BUILD_TIMEOUT_S.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import docker
import docker.errors
import pytest

REPO = Path(__file__).resolve().parents[2]
ENGINE_SCRIPT = REPO / "deploy" / "docker" / "engine.sh"
BUILD_SCRIPT = REPO / "deploy" / "docker" / "build.py"
IMAGE_TAG = os.environ.get("GROUPER_IMAGE", "grouper:dev")
ENGINE_TIMEOUT_S = 300  # apt-get install of docker.io and docker-compose, then dockerd's start
BUILD_TIMEOUT_S = 900  # a cold build: debootstrap, wheels (proton compiles), the image on vfs
DOCKER_API_TIMEOUT_S = 120  # one engine call; vfs copies whole layers, so commits can be slow
OUTPUT_TAIL_LINES = 40


def _connect() -> docker.DockerClient | None:
    """A client whose ping succeeded, or None. The API version is negotiated: the SDK may be newer
    than Debian's engine."""
    try:
        client = docker.from_env(version="auto", timeout=DOCKER_API_TIMEOUT_S)
        client.ping()
        return client
    except docker.errors.DockerException:
        return None


def _tail(text: str) -> str:
    return "\n".join(text.strip().splitlines()[-OUTPUT_TAIL_LINES:])


def run_script(command: list[str], timeout_s: float, what: str) -> str:
    """Run `command` from the repository root; returns its combined output, fails the test naming
    `what` with the output's tail if it fails or outlives `timeout_s`."""
    try:
        result = subprocess.run(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                timeout=timeout_s)
    except subprocess.TimeoutExpired as error:
        output = error.stdout.decode() if isinstance(error.stdout, bytes) else (error.stdout or "")
        pytest.fail(f"{what} did not finish within {timeout_s} s:\n{_tail(output)}", pytrace=False)
    if result.returncode != 0:
        pytest.fail(f"{what} failed with exit status {result.returncode}:\n{_tail(result.stdout)}", pytrace=False)
    return result.stdout


@pytest.fixture(scope="session")
def docker_client():
    client = _connect()
    if client is None:
        run_script(["bash", str(ENGINE_SCRIPT)], ENGINE_TIMEOUT_S,
                   f"no Docker engine answered, and {ENGINE_SCRIPT.relative_to(REPO)} (which installs and starts one)")
        client = _connect()
        if client is None:
            pytest.fail(f"{ENGINE_SCRIPT.relative_to(REPO)} succeeded but the Docker SDK still cannot reach the "
                        f"engine (DOCKER_HOST={os.environ.get('DOCKER_HOST', 'unset')}); check the socket "
                        "/var/run/docker.sock", pytrace=False)
    yield client
    client.close()


@pytest.fixture(scope="session")
def grouper_image(docker_client) -> str:
    started_s = time.monotonic()
    output = run_script([sys.executable, str(BUILD_SCRIPT), "--tag", IMAGE_TAG], BUILD_TIMEOUT_S,
                        f"building the image {IMAGE_TAG} ({BUILD_SCRIPT.relative_to(REPO)})")
    print(f"\nimage {IMAGE_TAG} built in {time.monotonic() - started_s:.1f} s:\n{_tail(output)}")
    try:
        docker_client.images.get(IMAGE_TAG)
    except docker.errors.ImageNotFound:
        pytest.fail(f"{BUILD_SCRIPT.relative_to(REPO)} succeeded but the engine has no image {IMAGE_TAG}",
                    pytrace=False)
    return IMAGE_TAG
