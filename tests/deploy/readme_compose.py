"""The README's docker-compose instructions as data, so a test runs what the text says (issue 32).

Rules:
- Read from the README's "## docker-compose" section, its first ```sh block: the commands as a user
  types them, and the client URLs its `# clients:` comment names. Nothing here is retyped from the text.
- The ports are the compose file's default host ports; a test maps them to the ports its own project
  published (`with_ports`), and fails on a port it has no mapping for rather than leaving it.
"""

from __future__ import annotations

import re

from tests.deploy.conftest import REPO

README = REPO / "README.md"
SECTION = "## docker-compose"
# the host ports docker-compose.yml publishes by default, by (kind, node index)
DEFAULT_PORTS = {("amqps", 0): 5671, ("amqps", 1): 5681, ("amqps", 2): 5691,
                 ("amqp", 0): 5672, ("amqp", 1): 5682, ("amqp", 2): 5692,
                 ("admin", 0): 5673, ("admin", 1): 5683, ("admin", 2): 5693,
                 ("http", 0): 5675, ("http", 1): 5685, ("http", 2): 5695}
_PORT = re.compile(r"(?<=:)(56[789]\d)\b")


def compose_block() -> list[str]:
    """The lines of the section's first ```sh block."""
    text = README.read_text()
    start = text.index(SECTION)
    block = text[text.index("```sh\n", start) + len("```sh\n"):]
    return block[:block.index("```")].splitlines()


def client_commands() -> list[str]:
    """The block's commands a client runs against the running cluster: from the `export` of the
    credentials up to `docker-compose down`, trailing comments dropped."""
    commands, started = [], False
    for line in compose_block():
        command = line.split("  #", 1)[0].strip()
        started = started or command.startswith("export GROUPER_USER")
        if command.startswith("docker-compose down"):
            break
        if started and command and not command.startswith("#"):
            commands.append(command)
    assert commands, f"no client commands (from `export GROUPER_USER`) in the README's {SECTION} block"
    return commands


def client_urls() -> list[str]:
    """Every URL of the `# clients:` comment, the short forms (`:5681`) spelt out on the URL before them."""
    comment = " ".join(line.strip().lstrip("#").strip() for line in compose_block() if line.strip().startswith("#"))
    assert comment.startswith("clients:"), f"no `# clients:` comment in the README's {SECTION} block: {comment!r}"
    urls: list[str] = []
    for token in re.findall(r"amqps?://\S+?(?=[,\s]|$)|(?<=\s):\d+", comment):
        urls.append(token if "://" in token else re.sub(r":\d+$", token, urls[-1]))
    return urls


def with_ports(text: str, ports: dict[tuple[str, int], int]) -> str:
    """`text` with each default host port replaced by the test project's port of the same kind and node."""
    by_default = {DEFAULT_PORTS[key]: port for key, port in ports.items()}

    def replace(match: re.Match) -> str:
        default = int(match.group(1))
        assert default in by_default, f"port {default} in {text!r} is none the test publishes ({sorted(by_default)})"
        return str(by_default[default])

    return _PORT.sub(replace, text)
