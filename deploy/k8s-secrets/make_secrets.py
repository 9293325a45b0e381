#!/usr/bin/env python3
"""The two Secrets the StatefulSet in deploy/k8s mounts, as files, and the kubectl commands that
create them from those files.

    python3 deploy/k8s-secrets/make_secrets.py --namespace shop --replicas 3 --dir k8s-secrets
    # then run the two `kubectl create secret` commands it prints, then `kubectl apply -k deploy/k8s`

Rules:
- grouper-tls: ca.pem and, for every pod grouper-<i> (i < --replicas), grouper-<i>.pem and
  grouper-<i>-key.pem, signed by the directory's CA (made once, by node.certs). SANs: the pod's
  name under the headless Service (its node id's host: the peers check it), the client Service
  (grouper, grouper.<ns>.svc), localhost and 127.0.0.1 (the CLI inside the pod). The CA's key stays
  in the directory and never goes into the Secret.
- grouper-auth: users.json with the user `admin` (role administrator), admin-password (that user's
  password, which joining pods and `kubectl exec ... grouper` use), raft.secret.
- Files that exist are kept: run it again with a larger --replicas to add pods' certificates, then
  create the Secret again (`--dry-run=client -o yaml | kubectl apply -f -`). Passwords and secrets
  are random; nothing is read from or written to the cluster here.
- For production, put certificates of the operator's own PKI under the same key names instead.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # run from a clone: node.* without installing the package

from node import certs  # noqa: E402
from node.core.errors import InvalidConfig  # noqa: E402
from node.core.access.roles import ADMINISTRATOR  # noqa: E402
from node.users import UserDatabase  # noqa: E402

SET_NAME = "grouper"  # the StatefulSet, and its client Service
HEADLESS_SERVICE = "grouper-headless"
TLS_SECRET = "grouper-tls"
AUTH_SECRET = "grouper-auth"
ADMIN_USER = "admin"  # GROUPER_USER in the StatefulSet
USERS_FILE = "users.json"
ADMIN_PASSWORD_FILE = "admin-password"  # a Secret key: GROUPER_PASSWORD of every pod
RAFT_SECRET_FILE = "raft.secret"
PASSWORD_BYTES = 24  # random bytes of the administrator's password (base64url: 32 characters)
RAFT_SECRET_BYTES = 32  # random bytes of the raft secret (the node wants at least 16 characters)


def pod_names(replicas: int) -> list[str]:
    return [f"{SET_NAME}-{ordinal}" for ordinal in range(replicas)]


def make(directory: Path, namespace: str, replicas: int) -> list[Path]:
    """Everything missing in `directory`; returns the files written."""
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    written: list[Path] = []
    if not (directory / certs.CA_CERT_FILE).exists():
        written += certs.make_ca(directory)
    for pod in pod_names(replicas):
        if not certs.leaf_paths(directory, pod)[0].exists():
            names = [f"{pod}.{HEADLESS_SERVICE}.{namespace}.svc", SET_NAME, f"{SET_NAME}.{namespace}.svc", "localhost"]
            written += certs.make_leaf(directory, pod, dns=names, ips=["127.0.0.1"])
    password_path = directory / ADMIN_PASSWORD_FILE
    for path, size in ((password_path, PASSWORD_BYTES), (directory / RAFT_SECRET_FILE, RAFT_SECRET_BYTES)):
        if not path.exists():
            # no newline: a secretKeyRef hands the whole value to GROUPER_PASSWORD
            _write_new(path, secrets.token_urlsafe(size))
            written.append(path)
    users_path = directory / USERS_FILE
    if not users_path.exists():
        database = UserDatabase()
        database.add_user(ADMIN_USER, password_path.read_text(), roles=[ADMINISTRATOR])
        database.save(str(users_path))
        written.append(users_path)
    return written


def _write_new(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)


def secret_files(directory: Path, replicas: int) -> dict[str, dict[str, Path]]:
    """Secret name -> key -> file: what the two Secrets hold."""
    tls = {certs.CA_CERT_FILE: directory / certs.CA_CERT_FILE}
    for pod in pod_names(replicas):
        cert_path, key_path = certs.leaf_paths(directory, pod)
        tls[cert_path.name], tls[key_path.name] = cert_path, key_path
    auth = {name: directory / name for name in (USERS_FILE, ADMIN_PASSWORD_FILE, RAFT_SECRET_FILE)}
    return {TLS_SECRET: tls, AUTH_SECRET: auth}


def kubectl_commands(directory: Path, namespace: str, replicas: int) -> list[str]:
    return [" ".join(["kubectl", "create", "secret", "generic", name, "--namespace", shlex.quote(namespace),
                      *(f"--from-file={key}={shlex.quote(str(path))}" for key, path in files.items())])
            for name, files in secret_files(directory, replicas).items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dir", type=Path, required=True, help="where the files go (kept: holds the CA's key)")
    parser.add_argument("--namespace", default="default", help="the StatefulSet's namespace (in the pods' names)")
    parser.add_argument("--replicas", type=int, default=3, help="pods to make certificates for (default 3)")
    args = parser.parse_args(argv)
    if args.replicas < 1:
        parser.error(f"--replicas must be at least 1, got {args.replicas}")
    try:
        written = make(args.dir, args.namespace, args.replicas)
    except InvalidConfig as error:
        print(f"make_secrets: {error}", file=sys.stderr)
        return 2
    print(f"{args.dir}: wrote {', '.join(path.name for path in written) or 'nothing new'}")
    print("create the Secrets (again: add `--dry-run=client -o yaml | kubectl apply -f -`):")
    for command in kubectl_commands(args.dir, args.namespace, args.replicas):
        print(f"  {command}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
