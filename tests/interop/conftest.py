"""Fixtures of the interop tests: a real node (the integration harness's), and one connection of each
real client to it.

The `client` fixture runs every scenario once per client: python-qpid-proton's container API, its
BlockingConnection, and rhea under Node.js. rhea's dependencies are installed once per session
(npm ci from js/package-lock.json) when js/node_modules is missing; a machine without Node.js and
npm fails these tests rather than skipping them, because CI has both.
"""

import pytest

from tests.integration.conftest import node_factory  # noqa: F401 (the fixture, reused as it is)
from tests.interop.proton_clients import BlockingClient, ContainerClient
from tests.interop.rhea_client import RheaClient, ensure_rhea_installed

QUEUE = "orders"  # the one queue every scenario uses; exclusive groups
NODE_CONFIG = f"""\
[node]
auto_create = false

[[queue]]
name = "{QUEUE}"
group_policy = "exclusive"
"""

CLIENTS = ("proton-container", "proton-blocking", "rhea")


@pytest.fixture(scope="session")
def nodejs() -> str:
    return ensure_rhea_installed()


@pytest.fixture
def node(node_factory):  # noqa: F811
    """A node with auto-create off and the queue QUEUE, so any other address is refused."""
    return node_factory(NODE_CONFIG)


@pytest.fixture(params=CLIENTS)
def client(request, node):
    host, port = node.amqp_address.rsplit(":", 1)
    if request.param == "proton-container":
        opened = ContainerClient(node.url)
    elif request.param == "proton-blocking":
        opened = BlockingClient(node.url)
    else:
        opened = RheaClient(request.getfixturevalue("nodejs"), host, int(port))
    yield opened
    opened.close()
