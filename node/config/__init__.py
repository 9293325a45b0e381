"""The node's one configuration object and how it is built: `load` gives a validated `NodeConfig`.

- settings: NodeConfig, the frozen dataclass of every setting (defaults, units, comments)
- loading: defaults, a TOML file, environment, then flags (later sources win); files_stamp
- rules: the cross-field checks `NodeConfig.validate()` runs, one function per subject

A bad key or value raises `InvalidConfig` naming it; `grouper node` turns that into a non-zero exit.
"""

from node.config.loading import ENV_PREFIX, HTTP_PORT_OFFSET, files_stamp, load
from node.config.settings import NodeConfig

__all__ = ["ENV_PREFIX", "HTTP_PORT_OFFSET", "NodeConfig", "files_stamp", "load"]
