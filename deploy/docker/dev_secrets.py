#!/usr/bin/env python3
"""Development secrets for docker-compose.yml: a CA, a certificate per node, an administrator's
password and the raft secret, in one directory the compose nodes mount read-only.

    python3 deploy/docker/dev_secrets.py            # -> build/compose-secrets/ (the compose default)
    python3 deploy/docker/dev_secrets.py --dir DIR  # then GROUPER_SECRETS_DIR=DIR docker-compose up -d

Rules:
- Development only: the CA's key lies beside the certificates it signed, so whoever reads the
  directory can make a node. Production certificates come from the operator's own PKI.
- Files that exist are kept: running it again before every `up` changes nothing, and a cluster's
  journals keep working with the same raft secret. Delete a file (or the directory) to make it anew;
  README, docker-compose, says how to rotate each.
- Certificates come from node.certs (`grouper certs dev`): node<i>.pem names node<i>, localhost,
  127.0.0.1 and ::1, so clients on the host verify the published ports against the node's name.
- The containers run as uid 10001, not the host's user, and a bind mount keeps the host's owners
  and modes. Run as root (as CI does), the files go to uid 10001 with modes 0600/0700; run as
  another user, who cannot give files away, they are made readable to all (keys 0644 in a
  directory 0755), which the script says: the nodes then start only with
  GROUPER_ALLOW_LOOSE_SECRET_FILES=true (node/file_modes.py). The passwords are random, never
  written in the YAML.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run from a clone: node.certs without installing the package

from node import certs  # noqa: E402
from node.core.errors import InvalidConfig  # noqa: E402

DIR_DEFAULT = REPO / "build" / "compose-secrets"
NODES = ("node0", "node1", "node2")  # the compose services, which are the nodes' advertise hosts
CLIENT = "admin"  # a client certificate for SASL EXTERNAL, CN = the default administrator
ADMIN_PASSWORD_FILE = "admin.password"  # GROUPER_DEFAULT_PASSWORD_FILE of every node
RAFT_SECRET_FILE = "raft.secret"  # raft_secret_file of every node: the same on each
PASSWORD_BYTES = 24  # random bytes of the administrator's password (base64url: 32 characters)
RAFT_SECRET_BYTES = 32  # random bytes of the raft secret (the node wants at least 16 characters)
CONTAINER_UID = 10001  # the image's user `grouper`


def make(directory: Path) -> list[Path]:
    """Everything missing in `directory`; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    if not (directory / certs.CA_CERT_FILE).exists():
        written += certs.make_ca(directory)
    for name in NODES:
        if not certs.leaf_paths(directory, name)[0].exists():
            written += certs.make_leaf(directory, name, dns=certs.DEV_HOSTS, ips=certs.DEV_IPS)
    if not certs.leaf_paths(directory, CLIENT)[0].exists():
        written += certs.make_leaf(directory, CLIENT, client_only=True)
    for file_name, size in ((ADMIN_PASSWORD_FILE, PASSWORD_BYTES), (RAFT_SECRET_FILE, RAFT_SECRET_BYTES)):
        path = directory / file_name
        if not path.exists():
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as out:
                out.write(secrets.token_urlsafe(size) + "\n")
            written.append(path)
    return written


def hand_to_containers(directory: Path) -> str:
    """Let uid CONTAINER_UID read every file; returns how."""
    files = [path for path in directory.iterdir() if path.is_file()]
    if os.geteuid() == 0:
        for path in [directory, *files]:
            os.chown(path, CONTAINER_UID, CONTAINER_UID)
            os.chmod(path, 0o700 if path == directory else 0o600)
        return f"owned by uid {CONTAINER_UID}, modes 0700/0600"
    directory.chmod(0o755)
    for path in files:
        path.chmod(0o644)
    return (f"readable by every local user (keys too): only root can give files to the containers' uid "
            f"{CONTAINER_UID}; run this as root, or, on a single-user machine, export "
            f"GROUPER_ALLOW_LOOSE_SECRET_FILES=true before `docker-compose up` (the nodes refuse such files "
            f"otherwise)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, default=DIR_DEFAULT,
                        help=f"where to write (default {DIR_DEFAULT.relative_to(REPO)}; compose reads "
                             "GROUPER_SECRETS_DIR)")
    args = parser.parse_args(argv)
    try:
        written = make(args.dir)
    except InvalidConfig as error:
        print(f"dev_secrets: {error}", file=sys.stderr)
        return 2
    how = hand_to_containers(args.dir)
    kept = "nothing new" if not written else ", ".join(path.name for path in written)
    print(f"{args.dir}: wrote {kept}; {how}")
    print(f"administrator: {CLIENT}, password in {args.dir / ADMIN_PASSWORD_FILE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
