"""Documented amqps addresses name a host the certificates' DNS names carry, never an IP (issue 32).

python-qpid-proton checks a TLS peer's name against the certificate's DNS names only: dialling
`amqps://...@127.0.0.1:5671` fails `certificate verify failed` although the compose certificates
carry 127.0.0.1 too. So no README, deploy/ or docs/ text may tell a client to dial one.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", REPO / "docker-compose.yml", *sorted((REPO / "deploy").rglob("*")),
             *sorted((REPO / "docs").rglob("*"))]
AMQPS_BY_IP = re.compile(r"amqps://\S*?@?(?:\d{1,3}\.){3}\d{1,3}|amqps://\S*?\[[0-9a-fA-F:]+\]")


def test_no_document_tells_a_client_to_dial_amqps_by_ip_address():
    found = []
    for path in DOCUMENTS:
        if not path.is_file() or path.suffix in {".png", ".pem", ".gz"}:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if AMQPS_BY_IP.search(line):
                found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not found, "amqps addresses by IP (proton refuses them; name `localhost` or the node's host):\n" + \
        "\n".join(found)
