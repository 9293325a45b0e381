"""Grouper as a peer of the main table (bench/run.py): one node from this repository with the rows'
queues in a generated config, and a second one secured (a users file, TLS with SASL PLAIN) for the
security rows. peers.py's rules hold: a private subprocess, its own directory, 127.0.0.1 only."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from bench.peers import HOST, REPO_ROOT, Peer, PeerFailed, Target


class Grouper(Peer):
    """A Grouper node from this repository, queues declared in a generated TOML config.

    Started as `grouper node` when the console script is installed, else `python -m node.cli node`;
    it reports `amqp: HOST:PORT`, `admin: HOST:PORT` and `ready` on stdout.
    """
    name = "grouper"

    def __init__(self, work_dir: Path):
        super().__init__(work_dir)
        self.amqp_port = 0
        self.extra_args: list[str] = []  # more `grouper node` flags (the secured node's)

    def versions(self) -> dict[str, str]:
        commit = subprocess.run(["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"],
                                capture_output=True, text=True).stdout.strip()
        return {"Grouper": f"git {commit or 'unknown'} (this repository's working tree)"}

    def command(self) -> list[str]:
        script = shutil.which("grouper")
        if script:
            return [script, "node"]
        return [sys.executable, "-m", "node.cli", "node"]

    def start(self, rows) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        data = self.dir / "data"
        if data.exists():
            shutil.rmtree(data)
        data.mkdir()
        config = self.dir / "grouper.toml"
        tables = []
        for row in rows:
            tables.append(f'[[queue]]\nname = "{row.queue}"\ngroup_policy = "exclusive"\n'
                          f'durable = {"true" if row.durable else "false"}\n')
        config.write_text("\n".join(tables))
        self._spawn([*self.command(), "--config", str(config), "--amqp-port", "0", "--admin-port", "0", "--http-port", "0",
                     "--data-dir", str(data), *self.extra_args], cwd=REPO_ROOT)
        self._wait_until(self._reported_ready, "`ready` line on stdout")

    def _reported_ready(self) -> bool:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return False
        for line in lines:
            if line.startswith("amqp:"):
                self.amqp_port = int(line.rsplit(":", 1)[1])
        return "ready" in (line.strip() for line in lines) and self.amqp_port > 0

    def prepare(self, row) -> Target:
        return Target("amqp", f"amqp://{HOST}:{self.amqp_port}", row.queue,
                      tuple((row.queue,) for _ in range(row.consumers)))


class SecuredGrouper(Grouper):
    """The same node, secured: a users file with one administrator, AMQP over TLS (development
    certificates from node/certs.py), clients logging in with SASL PLAIN on the amqps port.

    Everything is made in its own directory under the run's work dir: the CA, the node's certificate
    (for 127.0.0.1), the users file (`grouper user add --password-stdin`) and a random password that
    lives only in this process and the clients it forks.
    """
    name = "grouper-tls"
    USER = "bench"

    def __init__(self, work_dir: Path):
        super().__init__(work_dir)
        self.amqps_port = 0
        self.password = ""
        self.ca_file = self.dir / "certs" / "ca.pem"

    def start(self, rows) -> None:
        import secrets

        from node import certs

        certificates = self.dir / "certs"
        if certificates.exists():
            shutil.rmtree(certificates)
        certificates.mkdir(parents=True)
        certs.make_ca(certificates)
        cert_file, key_file = certs.make_leaf(certificates, "localhost", ips=(HOST,))
        users_file = self.dir / "users.json"
        users_file.unlink(missing_ok=True)
        self.password = secrets.token_urlsafe(24)
        added = subprocess.run([*self.command()[:-1], "user", "add", self.USER, "--role", "administrator",
                                "--password-stdin", "--users-file", str(users_file)], input=self.password + "\n",
                               capture_output=True, text=True, cwd=REPO_ROOT, timeout=60)
        if added.returncode:
            raise PeerFailed(f"grouper user add failed: {added.stderr.strip()}")
        self.extra_args = ["--users-file", str(users_file), "--tls-cert-file", str(cert_file),
                           "--tls-key-file", str(key_file), "--amqps-port", "0"]
        super().start(rows)

    def _reported_ready(self) -> bool:
        ready = super()._reported_ready()
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return False
        for line in lines:
            if line.startswith("amqps:"):
                self.amqps_port = int(line.rsplit(":", 1)[1])
        return ready and self.amqps_port > 0

    def prepare(self, row) -> Target:
        return Target("amqp", f"amqp://{HOST}:{self.amqps_port}", row.queue,
                      tuple((row.queue,) for _ in range(row.consumers)), sasl_mechs="PLAIN", user=self.USER,
                      password=self.password, tls=True, ca_file=str(self.ca_file))
