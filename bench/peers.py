"""The brokers a benchmark run measures: start, readiness, per-row setup, CPU accounting, stop.

Every broker is a subprocess this module starts, in its own session, with a private directory for
config, data and logs under the run's work directory; nothing here touches a system service, a
system-wide config or a port other than on 127.0.0.1. `cpu_seconds()` sums utime+stime (plus the
reaped children's times) over the broker's process tree from /proc, so a caller can charge broker
CPU to each message. A peer never decides what is measured: `run.py` drives rows, `clients.py`
moves messages.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
CLOCK_TICKS_PER_S = os.sysconf("SC_CLK_TCK")
START_TIMEOUT_S = 120  # a cold JVM or Erlang node on a busy 2-core machine can take a while
STOP_TIMEOUT_S = 30
HOST = "127.0.0.1"


class PeerFailed(Exception):
    """A broker did not start, answer or stop; the row or system is reported as failed."""


@dataclass(frozen=True)
class Target:
    """Where the clients of one row send and receive."""
    protocol: str  # "amqp" (lean.py, proton's C engine) or "stomp" (stomp.py)
    url: str  # amqp://user:pass@host:port, or host:port for STOMP
    send_address: str
    consumer_addresses: tuple  # one tuple of source addresses per consumer
    routing_subject: bool = False  # put the group id in the AMQP subject (RabbitMQ exchange routing key)
    sasl_mechs: str | None = None  # e.g. "PLAIN" for RabbitMQ; None lets proton choose
    user: str = ""  # SASL PLAIN user ("" = the url's, if any); wins over the url's
    password: str = ""  # the bench's own throwaway password (bench work dir), never a real one
    tls: bool = False  # TLS around the socket (Python ssl), the broker's certificate checked
    ca_file: str = ""  # PEM CAs for the broker's certificate; "" = the system's CAs


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _process_table() -> dict[int, tuple[int, float]]:
    """pid -> (ppid, cpu seconds incl. reaped children) for every live process."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()  # fields after "(comm)", starting at state
        ppid = int(fields[1])
        utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
        table[int(entry)] = (ppid, (utime + stime + cutime + cstime) / CLOCK_TICKS_PER_S)
    return table


def resident_bytes(pid: int | str = "self", names: tuple = ("VmRSS", "VmHWM")) -> dict:
    """{name: bytes} of one process's memory fields in /proc/PID/status, by default VmRSS and VmHWM
    (OSError once it is gone)."""
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in names:
            fields[name] = int(value.split()[0]) * 1024
    return fields


def tree_cpu_seconds(root_pid: int) -> float:
    table = _process_table()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    total, stack = 0.0, [root_pid]
    while stack:
        pid = stack.pop()
        if pid in table:
            total += table[pid][1]
        stack.extend(children.get(pid, ()))
    return total


def _deb_version(package: str) -> str:
    try:
        return subprocess.run(["dpkg-query", "-W", "-f=${Version}", package], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "not installed"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


class Peer:
    """One broker process. Subclasses fill in start/prepare; the tree/stop logic is shared."""
    name = "peer"

    def __init__(self, work_dir: Path):
        self.dir = work_dir / self.name
        self.process: subprocess.Popen | None = None
        self.log_path = self.dir / "stdout.log"

    def versions(self) -> dict[str, str]:
        return {}

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.process.pid)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _spawn(self, argv: list[str], env: dict | None = None, cwd: Path | None = None) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "wb")
        self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                        env=env, cwd=cwd, start_new_session=True)
        log.close()

    def _wait_until(self, ready, what: str, timeout_s: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                raise PeerFailed(f"{self.name} exited with {self.process.returncode} before {what}; "
                                 f"see {self.log_path}: {self.log_tail()}")
            if ready():
                return
            time.sleep(0.25)
        raise PeerFailed(f"{self.name}: no {what} after {timeout_s} s; see {self.log_path}: {self.log_tail()}")

    def log_tail(self, lines: int = 3) -> str:
        try:
            text = self.log_path.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])

    def graceful_stop(self) -> None:
        self.process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.alive():
            try:
                self.graceful_stop()
                self.process.wait(timeout=STOP_TIMEOUT_S)
            except (subprocess.TimeoutExpired, OSError, subprocess.SubprocessError):
                pass
        # Whatever is left of the session we started (the broker and its helpers) goes too.
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        try:
            self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def prepare(self, row) -> Target:
        raise NotImplementedError

    def cleanup(self, row) -> None:
        pass


class RabbitMQ(Peer):
    """RabbitMQ 3.10 with the AMQP 1.0 and consistent-hash plugins, node name private to the run.

    Queues, exchanges and bindings are declared over AMQP 0-9-1 with pika on the same port (the
    AMQP 1.0 plugin declares nothing for `/amq/queue/...` addresses, it only uses what exists).
    """
    name = "rabbitmq"
    SBIN = Path("/usr/lib/rabbitmq/bin")

    def __init__(self, work_dir: Path):
        super().__init__(work_dir)
        self.port = free_port()
        self.dist_port = free_port()
        self.node_name = f"grouperbench{os.getpid()}@localhost"
        self.epmd_was_running = port_open(4369)

    def _env(self) -> dict:
        env = dict(os.environ)
        env.update({
            "HOME": str(self.dir / "home"),  # private Erlang cookie for the node and rabbitmqctl
            "RABBITMQ_NODENAME": self.node_name,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "ERL_EPMD_ADDRESS": HOST,
            "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.dir / "log"),
            "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.dir / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
            "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
            "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
        })
        return env

    def versions(self) -> dict[str, str]:
        return {"RabbitMQ": _deb_version("rabbitmq-server"), "Erlang/OTP": _deb_version("erlang-base")}

    def ctl(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run([str(self.SBIN / "rabbitmqctl"), "-n", self.node_name, *args], env=self._env(),
                              capture_output=True, text=True, timeout=timeout_s)

    def start(self, rows) -> None:
        if not (self.SBIN / "rabbitmq-server").exists():
            raise PeerFailed("rabbitmq-server is not installed (apt-get install -y rabbitmq-server)")
        for sub in ("home", "mnesia", "log"):
            (self.dir / sub).mkdir(parents=True, exist_ok=True)
        (self.dir / "rabbitmq.conf").write_text(
            f"listeners.tcp.1 = {HOST}:{self.port}\n"
            "loopback_users = none\n"
            "log.console = false\n"
            "log.file.level = warning\n")
        (self.dir / "enabled_plugins").write_text("[rabbitmq_amqp1_0,rabbitmq_consistent_hash_exchange].\n")
        self._spawn([str(self.SBIN / "rabbitmq-server")], env=self._env())

        def ready() -> bool:
            if not port_open(self.port):
                return False
            return self.ctl("await_startup", "--timeout", "5", timeout_s=30).returncode == 0

        self._wait_until(ready, f"AMQP listener on {HOST}:{self.port}")

    def graceful_stop(self) -> None:
        try:
            self.ctl("stop", timeout_s=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGTERM)

    def stop(self) -> None:
        super().stop()
        if not self.epmd_was_running and shutil.which("epmd"):
            # epmd daemonises out of our session when the node starts it; it stops itself on -kill
            # when no node is registered any more.
            subprocess.run(["epmd", "-kill"], capture_output=True, timeout=10,
                           env={**os.environ, "ERL_EPMD_ADDRESS": HOST})

    def _channel(self):
        import pika
        connection = pika.BlockingConnection(pika.ConnectionParameters(HOST, self.port, heartbeat=0))
        return connection, connection.channel()

    def prepare(self, row) -> Target:
        connection, channel = self._channel()
        try:
            if row.variant == "rabbitmq-queue":
                channel.queue_declare(row.queue, durable=row.durable)
                sources = tuple((f"/amq/queue/{row.queue}",) for _ in range(row.consumers))
                send_address, routing = f"/amq/queue/{row.queue}", False
            else:  # rabbitmq-hash-sac: RabbitMQ's documented recipe for ordered, partitioned groups
                exchange = f"{row.queue}-hash"
                channel.exchange_declare(exchange, exchange_type="x-consistent-hash", durable=row.durable)
                for index in range(row.consumers):
                    name = f"{row.queue}-{index}"
                    channel.queue_declare(name, durable=row.durable, arguments={"x-single-active-consumer": True})
                    channel.queue_bind(name, exchange, routing_key="1")  # equal weight per queue
                sources = tuple((f"/amq/queue/{row.queue}-{index}",) for index in range(row.consumers))
                send_address, routing = f"/exchange/{exchange}", True
        finally:
            connection.close()
        return Target("amqp", f"amqp://guest:guest@{HOST}:{self.port}", send_address, sources,
                      routing_subject=routing, sasl_mechs="PLAIN")

    def cleanup(self, row) -> None:
        connection, channel = self._channel()
        try:
            if row.variant == "rabbitmq-queue":
                channel.queue_delete(row.queue)
            else:
                for index in range(row.consumers):
                    channel.queue_delete(f"{row.queue}-{index}")
                channel.exchange_delete(f"{row.queue}-hash")
        finally:
            connection.close()


ACTIVEMQ_XML = """<beans xmlns="http://www.springframework.org/schema/beans"
       xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
       xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
                           http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <broker xmlns="http://activemq.apache.org/schema/core" brokerName="grouperbench" useJmx="false"
          dataDirectory="{data}" schedulerSupport="false" advisorySupport="false">
    <persistenceAdapter>
      <kahaDB directory="{data}/kahadb"/>
    </persistenceAdapter>
    <transportConnectors>
      <transportConnector name="stomp" uri="stomp://{host}:{port}"/>
    </transportConnectors>
  </broker>
</beans>
"""

LOG4J_PROPERTIES = """log4j.rootLogger=WARN, stdout
log4j.appender.stdout=org.apache.log4j.ConsoleAppender
log4j.appender.stdout.layout=org.apache.log4j.PatternLayout
log4j.appender.stdout.layout.ConversionPattern=%d %-5p %c{1} - %m%n
"""


class ActiveMQ(Peer):
    """ActiveMQ Classic from the Debian package, one private instance with only a STOMP connector.

    Message groups use the broker's defaults (the group map keeps 1024 groups); queues are created
    on first use. Debian builds it without AMQP, hence STOMP.
    """
    name = "activemq"
    HOME = Path("/usr/share/activemq")

    def __init__(self, work_dir: Path):
        super().__init__(work_dir)
        self.port = free_port()

    def versions(self) -> dict[str, str]:
        java = subprocess.run(["java", "-version"], capture_output=True, text=True).stderr.splitlines()
        return {"ActiveMQ Classic": _deb_version("activemq"), "Java": java[0] if java else "unknown"}

    def start(self, rows) -> None:
        if not (self.HOME / "bin" / "activemq.jar").exists():
            raise PeerFailed("activemq is not installed (apt-get install -y activemq)")
        conf, data, tmp = self.dir / "conf", self.dir / "data", self.dir / "tmp"
        for path in (conf, data, tmp):
            path.mkdir(parents=True, exist_ok=True)
        (conf / "activemq.xml").write_text(ACTIVEMQ_XML.replace("{data}", str(data)).replace(
            "{host}", HOST).replace("{port}", str(self.port)))
        (conf / "log4j.properties").write_text(LOG4J_PROPERTIES)
        self._spawn([
            "java", "-Xms512M", "-Xmx512M", "-Djava.awt.headless=true", f"-Djava.io.tmpdir={tmp}",
            f"-Dactivemq.classpath={conf}", f"-Dactivemq.home={self.HOME}", f"-Dactivemq.base={self.dir}",
            f"-Dactivemq.conf={conf}", f"-Dactivemq.data={data}", f"-Dlog4j.configuration=file:{conf}/log4j.properties",
            "-jar", str(self.HOME / "bin" / "activemq.jar"), "start", f"xbean:file:{conf}/activemq.xml",
        ], cwd=self.dir)
        self._wait_until(self._stomp_answers, f"STOMP listener on {HOST}:{self.port}")

    def _stomp_answers(self) -> bool:
        if not port_open(self.port):
            return False
        import stomp
        connection = stomp.Connection([(HOST, self.port)], heartbeats=(0, 0))
        try:
            connection.connect(wait=True)
            connection.disconnect()
            return True
        except Exception:  # any failure means "not yet"
            return False

    def prepare(self, row) -> Target:
        destination = f"/queue/{row.queue}"
        return Target("stomp", f"{HOST}:{self.port}", destination,
                      tuple((destination,) for _ in range(row.consumers)))


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


PEERS = {"grouper": Grouper, "rabbitmq": RabbitMQ, "activemq": ActiveMQ, "grouper-tls": SecuredGrouper}
