# the real-node fixtures of the integration tests: `node_factory(config_text)` and `node`
from tests.integration.conftest import node, node_factory  # noqa: F401
