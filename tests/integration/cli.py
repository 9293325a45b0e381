"""`grouper` commands run as a user would run them, for black-box tests: one subprocess per call.

The caller's credential variables (GROUPER_USER, GROUPER_PASSWORD, GROUPER_CA, ...) are left out of
the command's environment unless the test passes them in `env`, so what a command proves never
depends on the shell the suite runs in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.integration.harness import REPO

CLI_TIMEOUT_S = 60.0  # one command, a node's start refused included
CREDENTIAL_ENV = ("GROUPER_USER", "GROUPER_PASSWORD", "GROUPER_CA", "GROUPER_CERT", "GROUPER_KEY", "GROUPER_NODE")


def grouper(*args: str, stdin: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    """Run `grouper ARGS` with no credentials in its environment but `env`."""
    environment = {key: value for key, value in os.environ.items() if key not in CREDENTIAL_ENV}
    return subprocess.run([sys.executable, "-m", "node.cli", *args], cwd=REPO, input=stdin, capture_output=True,
                          text=True, timeout=CLI_TIMEOUT_S, env={**environment, **(env or {})})


def grouper_ok(*args: str, stdin: str = "", env: dict | None = None) -> str:
    """`grouper ARGS`'s stdout; fails the test on a non-zero exit."""
    result = grouper(*args, stdin=stdin, env=env)
    assert result.returncode == 0, f"grouper {' '.join(args)} exited {result.returncode}:\n{result.stderr}"
    return result.stdout


def write_users_file(path: Path, roles: dict[str, str], users: dict[str, str], password: str) -> Path:
    """A users file made with the user and role commands: roles name -> allow, users name -> role."""
    for role, allow in roles.items():
        grouper_ok("role", "set", role, "--allow", allow, "--users-file", str(path))
    for name, role in users.items():
        grouper_ok("user", "add", name, "--role", role, "--password-stdin", "--users-file", str(path),
                   stdin=password + "\n")
    return path
