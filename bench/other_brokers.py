"""The brokers Grouper is measured against, each a private subprocess of the run (peers.py's rules):
RabbitMQ 3.10 with its AMQP 1.0 and consistent-hash plugins, and ActiveMQ Classic 5.17 over STOMP
(Debian builds it without AMQP). Each starts, waits for readiness, declares what a row needs and stops;
none touches a system service or a port other than on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from bench.peers import HOST, STOP_TIMEOUT_S, Peer, PeerFailed, Target, _deb_version, free_port, port_open


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
