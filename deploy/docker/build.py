#!/usr/bin/env python3
"""Builds the Grouper container image offline: a Debian base image, the wheels, then the Dockerfile.

    python3 deploy/docker/build.py [--tag grouper:dev] [--base-image grouper-base:bookworm]

Rules:
- Nothing is pulled from a registry. The base image is a debootstrap (minbase, with python3 and
  python3-venv) of Debian bookworm from the machine's own apt mirror, imported with `docker import`.
- Everything is cached, so a second build is quick:
  * the base image is built only if the engine lacks it; its root filesystem tarball is kept in the
    cache directory, so a new engine re-imports it without debootstrap;
  * the dependency wheels are built once per dependency list (a hash of pyproject.toml's
    `[project] dependencies` and the Python version), without the optional extras (no pyspark);
  * the project's own wheel is built from a clean copy of its packages with a fixed
    SOURCE_DATE_EPOCH, so unchanged sources give a byte-identical wheel and Docker's layer cache holds.
- The build context is the repository root, cut down by .dockerignore to build/docker/ (the staged
  wheels) and deploy/docker/ (entrypoint and healthcheck).
- Each step prints its duration; a failing step exits non-zero naming the step and what to do.
"""

from __future__ import annotations

import argparse
import glob
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STAGE = REPO / "build" / "docker"  # git-ignored; the only build output inside the repository
DEFAULT_CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "grouper-docker"
SUITE = "bookworm"
# Changing this list needs a new --base-image name (or `docker rmi` of the old one) and deleting the
# cached rootfs tarball: neither is keyed by it.
BASE_PACKAGES = "python3,python3-venv"
PROJECT_PACKAGES = ("node", "handler", "proto", "pipeline")  # as pyproject.toml's packages.find lists them
PROJECT_FILES = ("pyproject.toml", "README.md")
SOURCE_DATE_EPOCH = "315532800"  # 1980-01-01, the earliest a zip can store: reproducible wheels
FALLBACK_MIRROR = "http://deb.debian.org/debian"


class BuildError(Exception):
    pass


def step(name: str):
    """Decorator: prints the step's name and duration."""
    def wrap(fn):
        def run(*args, **kwargs):
            started_s = time.monotonic()
            print(f"== {name}", flush=True)
            result = fn(*args, **kwargs)
            print(f"== {name}: {time.monotonic() - started_s:.1f} s", flush=True)
            return result
        return run
    return wrap


def run(command: list[str], what: str, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(command, **kwargs)
    if result.returncode != 0:
        raise BuildError(f"{what} failed with exit status {result.returncode}: {' '.join(command)}")
    return result


def image_exists(name: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", name], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def check_engine() -> None:
    if shutil.which("docker") is None:
        raise BuildError("no docker client on PATH; run `bash deploy/docker/engine.sh` as root first")
    if subprocess.run(["docker", "version"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode != 0:
        raise BuildError("no Docker engine answers; run `bash deploy/docker/engine.sh` as root to start one")


# ---- the base image ------------------------------------------------------------------------------

def debian_mirror() -> str:
    """GROUPER_DEBIAN_MIRROR, else the first apt source serving the suite (deb822 or one-line), else
    deb.debian.org."""
    if os.environ.get("GROUPER_DEBIAN_MIRROR"):
        return os.environ["GROUPER_DEBIAN_MIRROR"]
    for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
        for block in Path(path).read_text().split("\n\n"):
            fields = dict(re.findall(r"^([A-Za-z-]+):\s*(.*)$", block, re.MULTILINE))
            if SUITE in fields.get("Suites", "").split() and fields.get("URIs"):
                return fields["URIs"].split()[0]
    for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
        if not os.path.exists(path):
            continue
        for line in Path(path).read_text().splitlines():
            match = re.match(r"^\s*deb\s+(?:\[[^]]*\]\s+)?(\S+)\s+(\S+)", line)
            if match and match.group(2) == SUITE:
                return match.group(1)
    return FALLBACK_MIRROR


@step("base image")
def build_base(base_image: str, cache: Path) -> None:
    if image_exists(base_image):
        print(f"{base_image} is on the engine already")
        return
    rootfs_tar = cache / f"{SUITE}-minbase-rootfs.tar"
    if not rootfs_tar.exists():
        debootstrap(rootfs_tar)
    print(f"importing {rootfs_tar} as {base_image}")
    with open(rootfs_tar, "rb") as handle:
        run(["docker", "import", "--change", "CMD [\"/bin/bash\"]", "-", base_image], "docker import", stdin=handle,
            stdout=subprocess.DEVNULL)


def debootstrap(rootfs_tar: Path) -> None:
    if shutil.which("debootstrap") is None:
        raise BuildError("debootstrap is missing; run `bash deploy/docker/engine.sh` as root (it installs it) "
                         "or `apt-get install debootstrap`")
    mirror = debian_mirror()
    rootfs = rootfs_tar.parent / "rootfs.partial"
    shutil.rmtree(rootfs, ignore_errors=True)
    print(f"debootstrap {SUITE} (minbase, {BASE_PACKAGES}) from {mirror}", flush=True)
    run(["debootstrap", "--variant=minbase", f"--include={BASE_PACKAGES}", SUITE, str(rootfs), mirror],
        "debootstrap", stdout=subprocess.DEVNULL)
    # the downloaded .debs and apt lists are dead weight in every layer (vfs copies layers whole)
    for leftover in [*glob.glob(f"{rootfs}/var/cache/apt/archives/*.deb"),
                     *glob.glob(f"{rootfs}/var/lib/apt/lists/*_*")]:
        os.remove(leftover)
    partial = rootfs_tar.with_suffix(".tar.partial")
    run(["tar", "-C", str(rootfs), "--numeric-owner", "-cf", str(partial), "."], "tar of the base rootfs")
    partial.rename(rootfs_tar)
    shutil.rmtree(rootfs, ignore_errors=True)


# ---- the wheels ----------------------------------------------------------------------------------

def dependencies() -> list[str]:
    with open(REPO / "pyproject.toml", "rb") as handle:
        return list(tomllib.load(handle)["project"]["dependencies"])


@step("dependency wheels")
def build_dependency_wheels(cache: Path) -> Path:
    requirements = dependencies()
    key = hashlib.sha256("\n".join([sys.version.split()[0].rsplit(".", 1)[0], *sorted(requirements)]).encode())
    directory = cache / f"wheels-{key.hexdigest()[:16]}"
    if directory.exists():
        print(f"cached in {directory}")
        return directory
    partial = directory.with_name(directory.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt") as requirements_file:
        requirements_file.write("\n".join(requirements) + "\n")
        requirements_file.flush()
        run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--wheel-dir", str(partial),
             "-r", requirements_file.name], "pip wheel of the dependencies (needs PyPI)")
    partial.rename(directory)
    return directory


@step("project wheel")
def build_project_wheel(into: Path) -> None:
    with tempfile.TemporaryDirectory() as source:
        for name in PROJECT_FILES:
            shutil.copy2(REPO / name, Path(source) / name)
        for package in PROJECT_PACKAGES:
            shutil.copytree(REPO / package, Path(source) / package,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        environment = {**os.environ, "SOURCE_DATE_EPOCH": SOURCE_DATE_EPOCH}
        # No build isolation when this Python's setuptools can build the wheel (an isolated build reaches PyPI
        # every time); else pip fetches a setuptools that can, rather than failing on "invalid command
        # 'bdist_wheel'" (Python 3.11 ships setuptools 65.5, below pyproject.toml's >= 68).
        isolation = [] if _setuptools_builds_wheels() else ["--use-pep517"]  # isolated: pip's default
        if isolation:
            print("this Python's setuptools cannot build the wheel (needs >= 70.1, or >= 68 with wheel): "
                  "pip builds it with setuptools from PyPI")
        run([sys.executable, "-m", "pip", "wheel", "-q", "--disable-pip-version-check", "--no-deps",
             *(isolation or ["--no-build-isolation"]), "--wheel-dir", str(into), source], "pip wheel of the project",
            env=environment, stdout=subprocess.DEVNULL)


def _setuptools_builds_wheels() -> bool:
    from importlib import metadata

    def version(name: str) -> tuple:
        try:
            return tuple(int(part) for part in metadata.version(name).split(".")[:2] if part.isdigit())
        except metadata.PackageNotFoundError:
            return ()

    setuptools = version("setuptools")
    return setuptools >= (70, 1) or (setuptools >= (68,) and bool(version("wheel")))


def stage_wheels(dependency_wheels: Path) -> None:
    shutil.rmtree(STAGE / "wheels", ignore_errors=True)
    (STAGE / "wheels").mkdir(parents=True)
    shutil.copytree(dependency_wheels, STAGE / "wheels" / "deps", copy_function=shutil.copy2)
    build_project_wheel(STAGE / "wheels" / "grouper")


# ---- the image -----------------------------------------------------------------------------------

def builder() -> tuple[list[str], dict]:
    """The build command and its environment. BuildKit skips the container that the classic builder
    makes (and the vfs driver copies whole) for every metadata instruction: ~5 s each here. It needs
    the buildx plugin, or a client older than 23 (Debian's /usr/bin/docker 20.10 has it built in)."""
    if subprocess.run(["docker", "buildx", "version"], stdout=subprocess.DEVNULL,
                      stderr=subprocess.DEVNULL).returncode == 0:
        return ["docker", "build"], {"DOCKER_BUILDKIT": "1"}
    for client in dict.fromkeys([shutil.which("docker"), "/usr/bin/docker"]):
        if client and os.path.exists(client):
            version = subprocess.run([client, "version", "--format", "{{.Client.Version}}"], capture_output=True,
                                     text=True).stdout.strip()
            major = re.match(r"(\d+)\.", version)
            if major and int(major.group(1)) < 23:
                return [client, "build"], {"DOCKER_BUILDKIT": "1"}
    print("no BuildKit-capable docker client: the classic builder is slow on vfs (install docker-buildx)")
    return ["docker", "build"], {"DOCKER_BUILDKIT": "0"}


def image_id(name: str) -> str | None:
    result = subprocess.run(["docker", "image", "inspect", "--format", "{{.Id}}", name], capture_output=True, text=True)
    return result.stdout.strip() if result.returncode == 0 else None


@step("docker build")
def build_image(tag: str, base_image: str) -> None:
    previous = image_id(tag)
    command, environment = builder()
    run([*command, "-q", "--build-arg", f"BASE_IMAGE={base_image}", "-t", tag, "-f", str(REPO / "Dockerfile"),
         str(REPO)], "docker build", env={**os.environ, **environment}, stdout=subprocess.DEVNULL)
    if previous is not None and previous != image_id(tag):
        # the tag's previous image is now nameless; on vfs its layers are whole copies (~250 MB).
        # Refused (and kept) while a container still uses it.
        subprocess.run(["docker", "rmi", previous], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tag", default="grouper:dev", help="the Grouper image's tag (default grouper:dev)")
    parser.add_argument("--base-image", default=f"grouper-base:{SUITE}",
                        help=f"the imported Debian base (default grouper-base:{SUITE})")
    parser.add_argument("--cache-dir", type=Path, default=Path(os.environ.get("GROUPER_DOCKER_CACHE", DEFAULT_CACHE)),
                        help=f"rootfs tarball and wheels (default $GROUPER_DOCKER_CACHE or {DEFAULT_CACHE})")
    args = parser.parse_args(argv)
    started_s = time.monotonic()
    try:
        check_engine()
        args.cache_dir.mkdir(parents=True, exist_ok=True)
        build_base(args.base_image, args.cache_dir)
        stage_wheels(build_dependency_wheels(args.cache_dir))
        build_image(args.tag, args.base_image)
    except BuildError as error:
        print(f"build.py: {error}", file=sys.stderr)
        return 1
    print(f"built {args.tag} in {time.monotonic() - started_s:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
