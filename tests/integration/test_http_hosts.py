"""The HTTP port answers only to names the node is known by, and takes actions only from its own pages
(issue 26: DNS rebinding reached the open quick-start console).

A DNS rebinding page is served from the attacker's name, which then resolves to the node: the browser
sends that name as Host, and no Origin on a same-origin request. A cross-site page's request carries
its own Origin. Here both are forged with a plain HTTP client, and the rebinding is done for real in
chromium, whose host resolver maps a made-up name to 127.0.0.1.

Rules of this file: one open node (the quick start's case) for the module, started with a name in
http_allowed_hosts; every wait is bounded.
"""

from __future__ import annotations

import http.client
import json
import socket

import pytest

from tests.integration.harness import WAIT_S, NodeProcess
from tests.integration.test_console import BROWSER_WAIT_S, browser, open_view, text_of, wait_page

LISTED = "broker.example"  # a name the operator lists in http_allowed_hosts
REBOUND = "rebind.attacker.example"  # the attacker's name, resolved to the node


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    started = NodeProcess(tmp_path_factory.mktemp("hosts") / "node",
                          f'[node]\nhttp_allowed_hosts = "{LISTED}"\n\n[[queue]]\nname = "orders"\n').start()
    try:
        yield started
    finally:
        started.kill()


def request(node, method: str, path: str, headers: dict, body: bytes | None = None) -> tuple[int, str]:
    """(status, body) of one request with exactly these headers (http.client adds no Host when given one)."""
    host, port = node.http_address.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=WAIT_S)
    try:
        connection.putrequest(method, path, skip_host="Host" in headers, skip_accept_encoding=True)
        for name, value in headers.items():
            connection.putheader(name, value)
        if body is not None:
            connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return response.status, response.read().decode()
    finally:
        connection.close()


def port_of(node) -> str:
    return node.http_address.rsplit(":", 1)[1]


@pytest.mark.parametrize("path", ["/", "/api/session", "/api/queues", "/metrics", "/readyz"])
def test_a_request_by_a_name_the_node_does_not_know_is_misdirected(node, path):
    status, body = request(node, "GET", path, {"Host": f"{REBOUND}:{port_of(node)}"})
    assert status == 421, (status, body)
    assert REBOUND in body and "http_allowed_hosts" in body, body
    assert "orders" not in body


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "LOCALHOST.", LISTED, "[::1]", "10.1.2.3",
                                  socket.gethostname()])
def test_the_nodes_own_loopback_listed_and_literal_names_are_answered(node, host):
    for name in (host, f"{host}:{port_of(node)}", f"{host}:80"):  # a port mapping may change the port
        status, body = request(node, "GET", "/api/session", {"Host": name})
        assert (status, json.loads(body)) == (200, {"open": True, "user": "anonymous"}), (name, body)


def test_an_action_from_another_sites_page_is_refused(node):
    host = f"127.0.0.1:{port_of(node)}"
    settings = json.dumps({"name": "made.by.attacker"}).encode()
    for origin in ("http://attacker.example", f"http://{REBOUND}:{port_of(node)}", "null", f"https://{host}",
                   f"http://127.0.0.1:{int(port_of(node)) + 1}"):
        status, body = request(node, "POST", "/api/queues", {"Host": host, "Origin": origin,
                                                             "Content-Type": "application/json"}, settings)
        assert status == 403, (origin, status, body)
        assert "Origin" in json.loads(body)["error"] and f"http://{host}/" in json.loads(body)["error"], body
    status, body = request(node, "GET", "/api/queues", {"Host": host})
    assert "made.by.attacker" not in body

    # the console's own page, and a client that sends no Origin (the JSON body still keeps forms out)
    for headers in ({"Origin": f"http://{host}"}, {}):
        name = f"made.here.{len(headers)}"
        status, body = request(node, "POST", "/api/queues", {"Host": host, "Content-Type": "application/json",
                                                             **headers}, json.dumps({"name": name}).encode())
        assert status == 200 and json.loads(body)["queue"]["name"] == name, body
    status, body = request(node, "POST", "/api/queues", {"Host": host, "Content-Type": "text/plain"}, settings)
    assert status == 415, body


def test_a_rebinding_page_in_chromium_gets_no_console_and_a_listed_name_does(node):
    # chromium's resolver sends both names to the node, as a rebound DNS answer would
    chromium = browser((f"--host-resolver-rules=MAP {REBOUND} 127.0.0.1, MAP {LISTED} 127.0.0.1",))
    chromium.set_page_load_timeout(BROWSER_WAIT_S)
    try:
        chromium.get(f"http://{REBOUND}:{port_of(node)}/")
        body = chromium.find_element("tag name", "body").text
        assert "http_allowed_hosts" in body and "Grouper" not in body, body
        chromium.get(f"http://{LISTED}:{port_of(node)}/")
        open_view(chromium, "queues")
        wait_page(chromium, lambda: chromium.find_elements("css selector", '#queues tr[data-queue="orders"]'),
                  "the queues")
        assert not chromium.find_element("id", "error").is_displayed(), text_of(chromium, "error")
    finally:
        chromium.quit()
