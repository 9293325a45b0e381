"""Faults that need root, shared by the tests that inject them: a small tmpfs (a disk that fills up).

A test that cannot make its fault on this machine (no root, no mount) is skipped with the reason, unless
GROUPER_FAULTS_REQUIRED=1 (.ci/run sets it), where the missing piece fails the test instead of hiding it.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

import pytest

REQUIRED = os.environ.get("GROUPER_FAULTS_REQUIRED") == "1"
COMMAND_TIMEOUT_S = 30.0


def cannot_run(what: str, reason: str) -> None:
    """Skip the test (fail it when faults are required): `what` cannot run here, because `reason`."""
    if REQUIRED:
        pytest.fail(f"{what} cannot run although GROUPER_FAULTS_REQUIRED=1: {reason}")
    pytest.skip(f"{what} cannot run here: {reason}")


def mount_tmpfs(path: Path, size_bytes: int) -> str | None:
    """Mount a tmpfs of `size_bytes` at `path`; None when mounted, else why it could not be."""
    if os.geteuid() != 0:
        return "mounting a tmpfs needs root"
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(path)],
                             capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    return f"cannot mount a tmpfs here: {mounted.stderr.strip()}" if mounted.returncode else None


def unmount(path: Path) -> str | None:
    """Unmount `path` (lazily: a process still in it does not stop the test); None, or the error."""
    result = subprocess.run(["umount", "--lazy", str(path)], capture_output=True, text=True,
                            timeout=COMMAND_TIMEOUT_S)
    return result.stderr.strip() if result.returncode else None


def tmpfs_unavailable() -> str | None:
    """Why no tmpfs can be mounted here (a 1 MiB probe), or None."""
    probe = Path(tempfile.mkdtemp(prefix="grouper-mount-"))
    try:
        reason = mount_tmpfs(probe, 1 << 20)
        if reason is None:
            unmount(probe)
        return reason
    finally:
        probe.rmdir()
