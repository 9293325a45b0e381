"""Real `grouper node` processes on 127.0.0.1 for black-box tests, and small AMQP client helpers.

Every wait here is bounded; nothing sleeps to make time pass except where the broker's own clock
(TTL, delayed dispatch) is the thing under test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

from proton import Delivery, Endpoint, Message, Timeout
from proton.handlers import MessagingHandler
from proton.reactor import Copy
from proton.utils import BlockingConnection, BlockingReceiver, LinkDetached

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 90.0  # a node is ready in about 0.6 s; CI once saw no output at all for 30 s under Spark load
STOP_TIMEOUT_S = 15.0
MEMBER_EXIT_TIMEOUT_S = 5.0  # a killed node's raft member child must be gone within this (PR_SET_PDEATHSIG)
# every cluster node needs a raft secret (node/peer/cluster_secrets.py): a node started with --peers and
# neither --raft-secret-file nor --allow-insecure-cluster gets this session's, one file for all tests
RAFT_SECRET_FLAGS = ("--raft-secret-file", "--allow-insecure-cluster")
_session_raft_secret: list[str] = []


def session_raft_secret_file() -> str:
    """One raft secret file (0600) for every cluster node the tests start without one of their own."""
    if not _session_raft_secret:
        import secrets
        import tempfile
        directory = tempfile.mkdtemp(prefix="grouper-raft-")  # 0700, removed with the machine's tmp
        path = os.path.join(directory, "raft.secret")
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(secrets.token_urlsafe(32) + "\n")
        _session_raft_secret.append(path)
    return _session_raft_secret[0]


def with_raft_secret(args: tuple, config_text: str = "") -> tuple:
    """`args` plus the session's raft secret when they make a cluster node that names none."""
    if "--peers" not in args or any(flag in args for flag in RAFT_SECRET_FLAGS) or "raft_secret_file" in config_text \
            or "allow_insecure_cluster" in config_text:
        return args
    return (*args, "--raft-secret-file", session_raft_secret_file())


def _process_state(pid: int) -> str:
    """The kernel's view of a process that hangs: its state and where it waits."""
    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        wchan = Path(f"/proc/{pid}/wchan").read_text()
    except OSError as error:
        return f"no /proc view: {error}"
    fields = dict(line.split(":", 1) for line in status if ":" in line)
    return (f"state {fields.get('State', '?').strip()}, threads {fields.get('Threads', '?').strip()}, "
            f"waiting in {wchan or '?'}")


def member_children(pid: int) -> list[int]:
    """A node's child processes (its raft member), from /proc."""
    children = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children += [int(child) for child in (task / "children").read_text().split()]
        except OSError:
            continue
    return sorted(set(children))


def alive(pid: int) -> bool:
    """Running or stopped, not gone and not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


class NodeProcess:
    """One broker node process; `restart()` reuses its data directory and config."""

    def __init__(self, data_dir: Path, config_text: str = "", args: tuple = ()):
        self.data_dir = Path(data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path = self.data_dir.parent / f"{self.data_dir.name}.toml"
        self.config_path.write_text(textwrap.dedent(config_text))
        self.args = tuple(args)
        # words run before the node's own command, e.g. a launcher that puts it in a cgroup and execs it
        # (tests/drills/nemesis.py): the process keeps its pid, so signals and kill() still reach the node
        self.command_prefix: tuple = ()
        # the process's environment (None: this one's), e.g. without the credentials a test set here
        self.environment: dict | None = None
        # False: a cluster node that names no raft secret gets none (a test of the refusal)
        self.session_raft_secret = True
        # how long start() waits for "ready" (a benchmark recovering a large journal waits longer)
        self.start_timeout_s = START_TIMEOUT_S
        self.process: subprocess.Popen | None = None
        self.amqp_address = ""
        self.amqps_address = ""  # AMQP over TLS, when the node is given a certificate
        self.admin_address = ""
        self.output: list[str] = []
        self._amqp_port = 0
        self._admin_port = 0
        self._http_port = 0
        self.http_address = ""

    @property
    def url(self) -> str:
        return f"amqp://{self.amqp_address}"

    def start(self) -> "NodeProcess":
        command = [*self.command_prefix, sys.executable, "-m", "node.cli", "node", "--config", str(self.config_path),
                   "--data-dir", str(self.data_dir), "--amqp-port", str(self._amqp_port),
                   "--admin-port", str(self._admin_port), "--http-port", str(self._http_port),
                   *(with_raft_secret(self.args, self.config_path.read_text()) if self.session_raft_secret
                     else self.args)]
        environment = os.environ if self.environment is None else self.environment
        self.process = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        text=True, env={**environment, "PYTHONUNBUFFERED": "1"})
        deadline = time.monotonic() + self.start_timeout_s
        ready = threading.Event()

        def read():
            for line in self.process.stdout:
                self.output.append(line.rstrip("\n"))
                if line.startswith("amqp: "):
                    self.amqp_address = line.split(": ", 1)[1].strip()
                elif line.startswith("amqps: "):
                    self.amqps_address = line.split(": ", 1)[1].strip()
                elif line.startswith("admin: "):
                    self.admin_address = line.split(": ", 1)[1].strip()
                elif line.startswith("http: "):
                    self.http_address = line.split(": ", 1)[1].strip()
                elif line.strip() == "ready":
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        while not ready.is_set():
            if self.process.poll() is not None:
                raise RuntimeError(f"node exited with {self.process.returncode}:\n" + "\n".join(self.output))
            if time.monotonic() > deadline:
                state = _process_state(self.process.pid)
                self.kill()
                raise RuntimeError(f"node did not become ready in {self.start_timeout_s} s ({state}; load average "
                                   f"{os.getloadavg()}):\n" + "\n".join(self.output))
            ready.wait(0.05)
        # a restart keeps the same ports so clients and tests can reconnect to the same address
        self._amqp_port = int(self.amqp_address.rsplit(":", 1)[1])
        self._admin_port = int(self.admin_address.rsplit(":", 1)[1])
        self._http_port = int(self.http_address.rsplit(":", 1)[1])
        return self

    def stop(self) -> int:
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.kill()
            raise RuntimeError("node did not stop on SIGTERM:\n" + "\n".join(self.output))

    def kill(self) -> None:
        """SIGKILL the node; returns once it and its raft member child are gone.

        The kernel ends the member when its node dies, but a moment later: until then it still votes
        and commits, so a test that counts on the node's raft vote being gone must wait for both."""
        if self.process is None or self.process.poll() is not None:
            return
        children = member_children(self.process.pid)
        self.process.kill()
        self.process.wait(STOP_TIMEOUT_S)
        deadline = time.monotonic() + MEMBER_EXIT_TIMEOUT_S
        while any(alive(child) for child in children):
            if time.monotonic() > deadline:
                for child in children:
                    try:
                        os.kill(child, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                raise AssertionError(f"the raft member {children} outlived its killed node")
            time.sleep(0.005)

    def restart(self) -> "NodeProcess":
        self.stop()
        return self.start()

    def cli(self, *args: str) -> subprocess.CompletedProcess:
        """Run a `grouper` management command against this node."""
        return subprocess.run([sys.executable, "-m", "node.cli", *args, "--node", self.admin_address],
                              cwd=REPO, capture_output=True, text=True, timeout=60)


def wait_until(predicate, what: str, timeout_s: float = 20.0, interval_s: float = 0.05):
    """Poll `predicate` until it returns something true, and return that; at most `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s} s: {what}")
        time.sleep(interval_s)


def connect(node: NodeProcess, timeout_s: float = 10.0) -> BlockingConnection:
    return BlockingConnection(node.url, timeout=timeout_s)


CLOSE_TIMEOUT_S = 1.0  # a live node answers a close in milliseconds; one a test killed never does


def close_quietly(connection: BlockingConnection) -> None:
    """At a test's end: close, waiting at most CLOSE_TIMEOUT_S for the node's answer (the connection's own
    timeout, 10 s, was spent in full on every connection to a node the test had killed)."""
    connection.timeout = CLOSE_TIMEOUT_S
    try:
        connection.close()
    except Exception:  # already closed, or its node killed: nothing left to release
        pass


def grouped(body, group: str | None = None, **properties) -> Message:
    # durable (the header's): a durable queue journals only durable messages (issue 29)
    message = Message(body=body, properties=properties or None, durable=True)
    if group is not None:
        message.group_id = group
    return message


# ---- consumers with exact credit, and outcomes with their conditions ---------------------------
#
# A `ManualReceiver` never grants credit on its own: `fetch()` grants one and waits for it to be
# used, `poll()` grants one in drain mode so the node answers at once with a message or with the
# credit handed back. So "nothing is available to this consumer now" is a round trip, not a sleep.
# Outcomes (`Held.accept()` and friends) wait until the node has settled the delivery, so once they
# return the node has applied them and the next step of a test sees their effect.

WAIT_S = 10.0  # bound of every wait for a delivery, a settlement or a detach


class Held:
    """A delivery the test holds; settle it with one of the outcome methods."""

    def __init__(self, receiver: "ManualReceiver", message: Message, delivery: Delivery):
        self.receiver = receiver
        self.message = message
        self.delivery = delivery

    @property
    def body(self):
        return self.message.body

    @property
    def delivery_count(self) -> int:
        return self.message.delivery_count

    @property
    def redelivered(self) -> bool:
        return self.message.delivery_count > 0

    def accept(self) -> None:
        self._settle(Delivery.ACCEPTED)

    def reject(self) -> None:
        self._settle(Delivery.REJECTED)

    def release(self) -> None:
        self._settle(Delivery.RELEASED)

    def modify(self, failed: bool = True) -> None:
        self.delivery.local.failed = failed
        self._settle(Delivery.MODIFIED)

    def _settle(self, state) -> None:
        delivery = self.delivery
        delivery.update(state)
        self.receiver.connection.wait(lambda: delivery.settled, timeout=WAIT_S,
                                      msg=f"the node settling {self.body!r} on {self.receiver.name}")
        delivery.settle()

    def __repr__(self) -> str:
        return f"Held({self.body!r} on {self.receiver.name}, delivery_count={self.delivery_count})"


class _Inbox(MessagingHandler):
    def __init__(self):
        super().__init__(prefetch=0, auto_accept=False)
        self.arrived: list[tuple[Message, Delivery]] = []
        self.detach_condition = None
        self.detached = False

    def on_message(self, event):
        self.arrived.append((event.message, event.delivery))

    def on_link_error(self, event):
        self.detach_condition = event.link.remote_condition
        self.detached = True

    def on_link_closing(self, event):
        self.detached = True

    def on_link_closed(self, event):
        self.detached = True


class ManualReceiver:
    """A consumer (or, with `browse=True`, a browser) whose credit the test grants explicitly."""

    def __init__(self, connection: BlockingConnection, address: str, name: str, *, browse: bool = False,
                 credit: int = 0):
        self.connection = connection
        self.name = name
        self._inbox = _Inbox()
        link = connection.container.create_receiver(connection.conn, address, name=name, handler=self._inbox,
                                                    options=[Copy()] if browse else None)
        self.blocking = BlockingReceiver(connection, link, None, credit=credit)
        self.link = link

    @property
    def detached(self) -> bool:
        return self._inbox.detached

    @property
    def detach_condition(self):
        return self._inbox.detach_condition

    @property
    def arrived_count(self) -> int:
        return len(self._inbox.arrived)

    def _take(self) -> Held:
        message, delivery = self._inbox.arrived.pop(0)
        return Held(self, message, delivery)

    def take_arrived(self) -> list[Held]:
        """Every delivery that has arrived and not been taken yet, without waiting or granting credit."""
        taken = [Held(self, message, delivery) for message, delivery in self._inbox.arrived]
        self._inbox.arrived.clear()
        return taken

    def flow(self, credit: int) -> None:
        self.link.drain_mode = False
        self.link.flow(credit)

    def fetch(self, timeout_s: float = WAIT_S) -> Held:
        """The next delivery, granting one credit if none is outstanding; fails after `timeout_s`."""
        inbox = self._inbox
        if not inbox.arrived and self.link.credit == 0:
            self.flow(1)
        try:
            self.connection.wait(lambda: inbox.arrived or inbox.detached, timeout=timeout_s,
                                 msg=f"a delivery on {self.name}")
        except Timeout:
            self.reclaim_credit()
            if inbox.arrived:
                return self._take()
            raise AssertionError(f"{self.name}: nothing was delivered within {timeout_s} s") from None
        if not inbox.arrived:
            raise AssertionError(f"{self.name} was detached: {inbox.detach_condition}")
        return self._take()

    def fetch_many(self, count: int, timeout_s: float = WAIT_S) -> list[Held]:
        return [self.fetch(timeout_s) for _ in range(count)]

    def poll(self) -> Held | None:
        """What the node would deliver to this consumer right now, or None: one drain round trip."""
        inbox = self._inbox
        if not inbox.arrived:
            if self.link.credit == 0:
                self.link.drain(1)
            else:
                self.link.drain_mode = True
                self.link.flow(0)
            self.connection.wait(lambda: inbox.arrived or not self.link.draining() or inbox.detached,
                                 timeout=WAIT_S, msg=f"draining {self.name}")
            self.link.drain_mode = False
        return self._take() if inbox.arrived else None

    def poll_all(self) -> list[Held]:
        """Everything this consumer can be given right now, one credit at a time."""
        taken = []
        while (held := self.poll()) is not None:
            taken.append(held)
        return taken

    def reclaim_credit(self) -> None:
        """Take back outstanding credit, so nothing more arrives behind the test's back."""
        if self.link.credit > 0 and not self._inbox.detached:
            self.link.drain_mode = True
            self.link.flow(0)
            self.connection.wait(lambda: not self.link.draining() or self._inbox.detached, timeout=WAIT_S,
                                 msg=f"draining {self.name}")
            self.link.drain_mode = False

    def wait_detached(self, timeout_s: float = WAIT_S):
        """Wait until the node detaches this link; returns its error condition (or None)."""
        self.connection.wait(lambda: self._inbox.detached, timeout=timeout_s, msg=f"{self.name} detached")
        return self._inbox.detach_condition

    def close(self) -> None:
        self.blocking.close()


def send_outcome(sender, message: Message, timeout_s: float = WAIT_S) -> tuple:
    """Send one message and return (remote state, condition name or None) once the node settles it.

    `BlockingSender.send` raises SendException with the state only; the condition is what tells
    a producer why a message was refused."""
    delivery = sender.link.send(message)
    sender.connection.wait(lambda: delivery.settled, timeout=timeout_s, msg=f"outcome on {sender.link.name}")
    condition = delivery.remote.condition
    state = delivery.remote_state
    delivery.settle()
    return state, condition.name if condition is not None else None


def link_refusal(open_link) -> str | None:
    """Open a link with `open_link()` and return the condition name the node detaches it with.

    The node opens and at once closes a refused link; depending on how the frames are read the
    blocking client raises while opening or only sees the detach a moment later."""
    try:
        link = open_link()
        inner = getattr(link, "link", link)
        link.connection.wait(lambda: inner.state & Endpoint.REMOTE_CLOSED, timeout=WAIT_S,
                             msg="a refused link's detach")
    except LinkDetached as error:
        return error.condition
    condition = inner.remote_condition
    return condition.name if condition is not None else None
