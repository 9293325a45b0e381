import pytest

from tests.integration.harness import NodeProcess


@pytest.fixture
def node_factory(tmp_path):
    """Start nodes with a TOML config text; every node is killed at the end of the test."""
    nodes: list[NodeProcess] = []

    def make(config_text: str = "", *args: str, name: str = "node") -> NodeProcess:
        node = NodeProcess(tmp_path / f"{name}{len(nodes)}", config_text, args)
        nodes.append(node)
        return node.start()

    yield make
    for node in nodes:
        node.kill()


@pytest.fixture
def node(node_factory):
    return node_factory()
