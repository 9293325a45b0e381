import pytest

from tests.integration.cluster import Cluster
from tests.integration.harness import NodeProcess, close_quietly
from tests.integration.test_clustered_groups import Clients


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


@pytest.fixture
def cluster_factory(tmp_path):
    """Start 3-node clusters with a TOML config text; every node is killed at the end of the test."""
    made: list[Cluster] = []

    def make(config_text: str = "", *args: str) -> Cluster:
        cluster = Cluster(tmp_path, 3, config_text, args)
        made.append(cluster)
        return cluster.start()

    yield make
    for cluster in made:
        cluster.kill_all()


@pytest.fixture
def cluster(cluster_factory):
    return cluster_factory()


@pytest.fixture
def clients():
    """AMQP connections a test opens (Clients, tests/integration/test_clustered_groups.py), closed at its end."""
    made = Clients()
    yield made
    made.close()


@pytest.fixture
def connections():
    """Connections a test opens and appends here (proton BlockingConnection), closed at its end."""
    made = []
    yield made
    for connection in made:
        close_quietly(connection)
