"""Another client's send time while someone floods the node with bad SASL PLAIN logins (issue 26
finding 6: 250 attempts a second raised it from 2.3 to 23 ms, the PBKDF2 of each running on the
engine loop).

    python3 -m bench.plain_flood [--rate 250] [--seconds 5] [--durable] [--iterations 4096] [--admin-share 0]

starts one node on 127.0.0.1 (a users file with `sender` and `admin`, their keys of `--iterations`
PBKDF2 rounds; PLAIN on loopback; one queue, non-durable unless `--durable`) and times a logged-in
client's synchronous sends (each to its accepted outcome) for 2 x `--seconds`, in windows of a
second: alone, then attacked, alternately, so the machine's other load meets both alike. In each
attacked window an attacker process makes `--rate` PLAIN attempts a second with wrong passwords,
each from a loopback address of its own (127.1.0.0 on). An `--admin-share` of them guess `admin`'s
password; the others each name a user of their own, which the node's throttle (per address and per
user) never holds, so each costs a key derivation. The attacker runs niced (a real one's CPU is not
the node's machine's). Prints both medians and the attack's achieved rate; `measure` is what
tests/integration/test_login_flood.py runs. Not a test: pytest does not collect it.

Measured here (2 shared cores): 4096 rounds, durable: 1.15x before the fix, 1.06x after; 16384 rounds
and half the attempts at admin (a derivation as costly as 4096 rounds on the issue's machine):
8.7x and 15.6x before, 1.01x and 1.08x after.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from proton import Message
from proton.utils import BlockingConnection

from tests.integration.harness import NodeProcess, send_outcome
from tests.integration.sasl_socket import SASL_HEADER, plain_response, sasl_init

PASSWORD = "flood bench password"
QUEUE_CONFIG = '[[queue]]\nname = "flood"\ndurable = {durable}\n'
WINDOW_S = 1.0  # alone and attacked windows alternate, each this long
SETTLE_S = 0.1  # sends in a window's first part are not counted: the attack starts or ends then
ATTACK_THREADS = 64  # attacker threads, each making attempts one after the other
ANSWER_WAIT_S = 0.05  # how long an attempt waits for the node's answer before it closes the socket
ATTACKER_NICE = 19  # the attacker process's niceness (see _attack)
ATTEMPT_TIMEOUT_S = 10.0  # one attempt's connect and outcome
CONNECT_TIMEOUT_S = 10.0
ONE_ADDRESS = ""  # --one-address: every attempt from 127.1.0.1 (the throttle then refuses them unchecked)


@dataclass(frozen=True)
class Flood:
    alone_ms: list[float]  # each send's time to its outcome without the attack
    attacked_ms: list[float]  # the same during the attack
    attempts: int  # PLAIN attempts made during the attack
    attempts_per_s: float  # achieved

    @property
    def alone_p50_ms(self) -> float:
        return statistics.median(self.alone_ms)

    @property
    def attacked_p50_ms(self) -> float:
        return statistics.median(self.attacked_ms)


def users_file(directory: Path, iterations: int = 4096) -> Path:
    from node.core.access.roles import ADMINISTRATOR
    from node.users import UserDatabase
    database = UserDatabase()
    for name in ("sender", "admin"):
        database.add_user(name, PASSWORD, [ADMINISTRATOR], iterations=iterations)
    path = directory / "users.json"
    database.save(str(path))
    return path


def start_node(directory: Path, durable: bool = False, iterations: int = 4096) -> NodeProcess:
    return NodeProcess(directory / "node", QUEUE_CONFIG.format(durable=str(durable).lower()),
                       ("--users-file", str(users_file(directory, iterations)), "--sasl-plain-on-loopback")).start()


def _attempt(host: str, port: int, number: int, user: str) -> bool:
    """One PLAIN attempt with a wrong password from 127.1.x.y: True once it went out. It waits for the
    node's answer at most ANSWER_WAIT_S (a held one comes later): a guesser does not queue behind it."""
    source = ONE_ADDRESS or f"127.{1 + (number >> 16) % 254}.{(number >> 8) & 255}.{number & 255}"
    with socket.socket() as raw:
        raw.settimeout(ATTEMPT_TIMEOUT_S)
        raw.bind((source, 0))
        raw.connect((host, port))
        raw.sendall(SASL_HEADER + sasl_init("PLAIN", plain_response(user, "wrong password")))
        raw.settimeout(ANSWER_WAIT_S)
        try:
            while raw.recv(4096):  # the node closes the socket after its outcome
                pass
        except socket.timeout:
            pass
    return True


def _attack(host: str, port: int, rate: float, start_s: float, windows: int, admin_share: float, done) -> None:
    """The attacker process: `rate` attempts a second in the attack windows (second 2k + 1 to 2k + 2
    after `start_s`, CLOCK_MONOTONIC, which is machine-wide), from ATTACK_THREADS threads each making
    its share one after the other; puts (attempts made, seconds attacked) in `done`. Niced: a real
    attacker's CPU is not the node's machine's, and here it shares its cores."""
    os.nice(ATTACKER_NICE)
    made = [0]
    lock = threading.Lock()
    per_window = int(rate * WINDOW_S)

    def worker(first: int) -> None:
        for number in range(first, per_window * windows, ATTACK_THREADS):
            window, index = divmod(number, per_window)
            pause = start_s + (2 * window + 1) * WINDOW_S + index / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            user = "admin" if (number * admin_share) % 1 + admin_share >= 1 else f"guess-{number}"
            try:
                _attempt(host, port, number, user)
            except OSError:
                continue
            with lock:
                made[0] += 1

    threads = [threading.Thread(target=worker, args=(first,), daemon=True) for first in range(ATTACK_THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    done.put((made[0], windows * WINDOW_S))


def _sends(address: str, until_s: float) -> list[tuple[float, float]]:
    """(started, ms to the accepted outcome) of each synchronous send until `until_s` (monotonic)."""
    connection = BlockingConnection(f"amqp://{address}", timeout=CONNECT_TIMEOUT_S, user="sender", password=PASSWORD,
                                    allowed_mechs="PLAIN", allow_insecure_mechs=True)
    try:
        sender = connection.create_sender("flood")
        sends = []
        number = 0
        while (started := time.monotonic()) < until_s:
            outcome = send_outcome(sender, Message(body=number, group_id=f"g{number % 8}"))
            sends.append((started, (time.monotonic() - started) * 1000))
            assert outcome[1] is None, outcome
            number += 1
        return sends
    finally:
        connection.close()


def measure(address: str, rate: float = 250, seconds: float = 5, admin_share: float = 0) -> Flood:
    """Alone and attacked windows of WINDOW_S alternate for 2 * `seconds`, so a change in the machine's
    other load meets both alike; a send counts for the window it started in, unless it started in a
    window's first SETTLE_S."""
    _sends(address, time.monotonic() + 1)  # warm up: the first sends create the queue's state
    host, port = address.rsplit(":", 1)
    windows = max(1, round(seconds / WINDOW_S))
    start_s = time.monotonic() + 1.0
    context = multiprocessing.get_context("fork")
    done = context.Queue()
    attacker = context.Process(target=_attack, args=(host, int(port), rate, start_s, windows, admin_share, done),
                               daemon=True)
    attacker.start()
    try:
        sends = _sends(address, start_s + 2 * windows * WINDOW_S)
        attempts, attacked_s = done.get(timeout=2 * windows * WINDOW_S + ATTEMPT_TIMEOUT_S + 30)
    finally:
        attacker.join(timeout=30)
        if attacker.is_alive():
            attacker.kill()
    alone_ms, attacked_ms = [], []
    for started, took_ms in sends:
        window, into_s = divmod(started - start_s, WINDOW_S)
        if window >= 0 and into_s >= SETTLE_S:
            (attacked_ms if window % 2 else alone_ms).append(took_ms)
    return Flood(alone_ms, attacked_ms, attempts, attempts / attacked_s)


def _quantile(values: list[float], fraction: float) -> float:
    return sorted(values)[min(len(values) - 1, int(len(values) * fraction))]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=250, help="PLAIN attempts a second (default 250)")
    parser.add_argument("--seconds", type=float, default=5, help="seconds alone and as many attacked (default 5)")
    parser.add_argument("--durable", action="store_true", help="a durable queue (each send waits for an fsync)")
    parser.add_argument("--iterations", type=int, default=4096, help="the users' PBKDF2 rounds (default 4096)")
    parser.add_argument("--admin-share", type=float, default=0, help="attempts guessing admin's password (0..1)")
    parser.add_argument("--one-address", action="store_true",
                        help="every attempt from one address: what the attempts cost the node without key work")
    args = parser.parse_args(argv)
    global ONE_ADDRESS
    ONE_ADDRESS = "127.1.0.1" if args.one_address else ""
    with tempfile.TemporaryDirectory(prefix="plain-flood-") as directory:
        node = start_node(Path(directory), args.durable, args.iterations)
        try:
            flood = measure(node.amqp_address, args.rate, args.seconds, args.admin_share)
        finally:
            node.kill()
    print(f"sends alone: p50 {flood.alone_p50_ms:.2f} ms ({len(flood.alone_ms)} sends); during "
          f"{flood.attempts_per_s:.0f} bad PLAIN attempts/s: p50 {flood.attacked_p50_ms:.2f} ms "
          f"({len(flood.attacked_ms)} sends), {flood.attacked_p50_ms / flood.alone_p50_ms:.2f}x; p90 "
          f"{_quantile(flood.alone_ms, 0.9):.2f} -> {_quantile(flood.attacked_ms, 0.9):.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
