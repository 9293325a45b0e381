"""The README's "Your first grouped messages", command for command as written, against `grouper up` (issue 32).

The commands are parsed from the README (each `$ grouper ...` line of the section's blocks) and run
unchanged: `grouper up --config examples/grouper.toml` runs on free ports, and $GROUPER_AMQP, which
the section names as the commands' default --node, points them at its node0. What each prints must
hold the README's output lines in order ("..." skips lines; a consumer's generated name and node0's
address are the only parts compared loosely). A `--hold` command stays running in the background, as
in the README's first terminal, until a later command's comment says "after Ctrl-C in the first".
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import time

import pytest

from tests.integration.cli import CLI_TIMEOUT_S, CREDENTIAL_ENV
from tests.integration.grouper_up import GrouperUp
from tests.integration.harness import REPO

SECTION = "## Your first grouped messages"
README_NODE = "127.0.0.1:5672"  # node0 of the README's `grouper up`, as the outputs print it
HOLD_WAIT_S = 30.0  # for the held command's "holding" line


def readme_session() -> list[tuple[str, str, list[str]]]:
    """(command, its comment, its output lines) of every `$ grouper` line of the section, in order, but
    `grouper perf`'s (below)."""
    text = (REPO / "README.md").read_text()
    start = text.index(SECTION)
    section = text[start:text.index("\n## ", start + len(SECTION))]
    session = []
    for block in re.findall(r"```\n(.*?)```", section, re.S):
        for line in block.replace("\\\n", " ").splitlines():  # a command's continued lines joined
            if line.startswith("$ grouper perf "):
                break  # the load generator's runs: 30,000 messages and 10 s, too long here (test_tools runs perf)
            if line.startswith("$ grouper "):
                command, _, comment = line[2:].partition("  #")
                session.append((command.strip(), comment.strip(), []))
            elif line.strip() and session:
                session[-1][2].append(line)
    assert len(session) >= 4, f"the README's {SECTION} has {len(session)} `$ grouper` commands"
    return session


def loose(line: str, node: str) -> str:
    return re.sub(r"consumer=\S+", "consumer=*", line.replace(node, README_NODE))


def assert_prints(command: str, output: str, expected: list[str], node: str) -> None:
    """`expected` (the README's lines, "..." skipping any number) appears in order in `output`."""
    actual = [loose(line, node) for line in output.splitlines()]
    at = 0
    for want in expected:
        if want.strip() == "...":
            continue
        want = loose(want, node)
        while at < len(actual) and actual[at] != want:
            at += 1
        assert at < len(actual), f"`{command}` did not print {want!r} (in the README's order); it printed:\n{output}"
        at += 1


class Held:
    """A command left running in a first terminal; its output collected as it comes."""

    def __init__(self, argv: list[str], env: dict):
        self.process = subprocess.Popen(argv, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE,
                                        stderr=subprocess.STDOUT)
        self.lines: list[str] = []
        threading.Thread(target=lambda: self.lines.extend(line.rstrip("\n") for line in self.process.stdout),
                         daemon=True).start()

    def wait_holding(self) -> None:
        deadline = time.monotonic() + HOLD_WAIT_S
        while not any(line.startswith("holding ") for line in self.lines):
            assert time.monotonic() < deadline and self.process.poll() is None, "\n".join(self.lines)
            time.sleep(0.02)

    def ctrl_c(self) -> str:
        self.process.send_signal(signal.SIGINT)
        assert self.process.wait(CLI_TIMEOUT_S) == 0, "\n".join(self.lines)
        return "\n".join(self.lines)


@pytest.fixture
def up(tmp_path):
    cluster = GrouperUp(tmp_path / "data", args=("--config", str(REPO / "examples" / "grouper.toml"))).start()
    try:
        yield cluster
    finally:
        cluster.kill_tree()


def test_the_readmes_first_grouped_messages_print_what_the_readme_shows(up):
    node = up.amqp(0)
    environment = {key: value for key, value in os.environ.items() if key not in CREDENTIAL_ENV}
    environment["GROUPER_AMQP"] = node
    held: tuple[str, list[str], Held] | None = None
    try:
        for command, comment, expected in readme_session():
            argv = [sys.executable, "-m", "node.cli", *shlex.split(command)[1:]]  # this checkout's grouper
            if "after Ctrl-C in the first" in comment:
                assert held is not None, f"`{command}`: no command held in a first terminal"
                held_command, held_expected, holder = held
                assert_prints(held_command, holder.ctrl_c(), held_expected, node)
                held = None
            if "--hold" in command:
                held = (command, expected, Held(argv, environment))
                held[2].wait_holding()
                continue
            ran = subprocess.run(argv, cwd=REPO, env=environment, capture_output=True, text=True,
                                 timeout=CLI_TIMEOUT_S)
            assert ran.returncode == 0, f"`{command}` exited {ran.returncode}:\n{ran.stdout}{ran.stderr}"
            assert_prints(command, ran.stdout, expected, node)
        assert held is None, f"`{held[0]}` was never let go in the README's session"
    finally:
        if held is not None:
            held[2].process.kill()
