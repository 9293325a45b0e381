"""Loading NodeConfig: defaults, then a TOML file, then environment (GROUPER_*), then flags.

Rules:
- Later sources win. Queue declarations live in the same TOML file as `[[queue]]` tables, and the
  settings of auto-created queues in `[[address-setting]]` tables over one `[template]`, multicast
  addresses in `[[address]]` tables with their subscription queues as `[[address.queue]]` (see README).
- A bad key or value raises `InvalidConfig` naming it as its source spells it (`node.amqp_port`,
  `GROUPER_AMQP_PORT`, `--amqp_port`); `grouper node` turns that into a non-zero exit. The result is
  validated (node/config/rules.py) before it is returned.
- Reads the file and the environment given, once; nothing is kept.
"""

from __future__ import annotations

import dataclasses
import os
import tomllib

from node.config.settings import NodeConfig
from node.core.errors import InvalidConfig
from node.core.dispatch.settings import QueueSettings

ENV_PREFIX = "GROUPER_"
HTTP_PORT_OFFSET = 3  # http_port = amqp_port + 3 when only amqp_port is given: a second node on one host just works

_FIELDS = {f.name: f for f in dataclasses.fields(NodeConfig)}
_TABLES = ("queues", "template", "address_settings", "multicast_addresses")  # fields only a config file's tables give


def files_stamp(paths) -> tuple:
    """Changes whenever one of the files does (a Secret's update swaps a symlink, so the inode changes):
    per path (mtime_ns, size, inode), or None for a path that is empty or cannot be read."""
    stamps = []
    for path in paths:
        try:
            status = os.stat(path) if path else None
        except OSError:
            status = None
        stamps.append((status.st_mtime_ns, status.st_size, status.st_ino) if status else None)
    return tuple(stamps)


def _coerce(key: str, value, source: str, name: str = ""):
    """`name`: how the error names the setting, when not `source` + `key` (an environment variable's
    name is upper case: GROUPER_AMQP_PORT)."""
    name = name or f"{source}{key}"
    default = _FIELDS[key].default
    if isinstance(default, bool):
        if isinstance(value, str):
            lowered = value.strip().lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
        if isinstance(value, bool):
            return value
        raise InvalidConfig(name, f"expected true or false, got {value!r}")
    if isinstance(default, int):
        if isinstance(value, str):
            try:
                return int(value)
            except ValueError:
                pass
        elif isinstance(value, int) and not isinstance(value, bool):
            return value
        raise InvalidConfig(name, f"expected an integer, got {value!r}")
    if not isinstance(value, str):
        raise InvalidConfig(name, f"expected a string, got {value!r}")
    return value


def load(config_file: str | None = None, environ: dict | None = None, overrides: dict | None = None) -> NodeConfig:
    values: dict = {}
    queues: list[QueueSettings] = []
    if config_file:
        queues = _from_file(config_file, values)
    environ = os.environ if environ is None else environ
    for key in _FIELDS:
        env_key = ENV_PREFIX + key.upper()
        if key not in _TABLES and env_key in environ:
            values[key] = _coerce(key, environ[env_key], ENV_PREFIX, env_key)
    for key, value in (overrides or {}).items():
        if value is not None:
            values[key] = _coerce(key, value, "--") if key not in _TABLES else value
    values["queues"] = tuple(queues) + tuple(values.get("queues", ()))
    if "amqp_port" in values and "http_port" not in values:
        amqp_port = values["amqp_port"]
        values["http_port"] = amqp_port + HTTP_PORT_OFFSET if amqp_port else 0
        if values["http_port"] > 65535:
            raise InvalidConfig("http_port", f"amqp_port {amqp_port} + {HTTP_PORT_OFFSET} is past 65535; give "
                                             f"--http-port")
    return NodeConfig(**values).validate()


def _from_file(config_file: str, values: dict) -> list[QueueSettings]:
    """The TOML file's settings into `values`; returns the queues its [[queue]] and [[address]] tables declare."""
    try:
        with open(config_file, "rb") as handle:
            document = tomllib.load(handle)
    except OSError as error:
        raise InvalidConfig("config", f"cannot read {config_file}: {error.strerror}") from None
    except tomllib.TOMLDecodeError as error:
        raise InvalidConfig("config", f"{config_file} is not valid TOML: {error}") from None
    for key, value in document.get("node", {}).items():
        norm = key.replace("-", "_")
        if norm not in _FIELDS or norm in _TABLES:
            raise InvalidConfig(f"node.{key}", "unknown setting")
        values[norm] = _coerce(norm, value, "node.")
    queues = []
    for index, table in enumerate(document.get("queue", [])):
        if not isinstance(table, dict):
            raise InvalidConfig(f"queue[{index}]", "must be a table")
        queues.append(QueueSettings.from_dict(table, where=f"queue[{index}]"))
    template = document.get("template", {})
    if not isinstance(template, dict):
        raise InvalidConfig("template", "must be a table")
    values["template"] = template
    address_settings = document.get("address-setting", [])
    if not isinstance(address_settings, list):
        raise InvalidConfig("address-setting", "must be an array of tables: write [[address-setting]]")
    values["address_settings"] = tuple(address_settings)
    addresses, subscriptions = _addresses(document.get("address", []))
    values["multicast_addresses"] = addresses
    queues.extend(subscriptions)
    unknown = set(document) - {"node", "queue", "template", "address-setting", "address"}
    if unknown:
        raise InvalidConfig(sorted(unknown)[0], "unknown section")
    return queues


ADDRESS_KEYS = ("name", "routing", "queue")  # the keys of an [[address]] table


def _addresses(tables) -> tuple[tuple, list[QueueSettings]]:
    """[[address]] tables, as Artemis's <address name="..."><multicast><queue name="..."/>: the multicast
    address names and their subscription queues (each a queue table bound to its address)."""
    if not isinstance(tables, list):
        raise InvalidConfig("address", "must be an array of tables: write [[address]]")
    names: list[str] = []
    queues: list[QueueSettings] = []
    for index, table in enumerate(tables):
        where = f"address[{index}]"
        if not isinstance(table, dict):
            raise InvalidConfig(where, "must be a table")
        unknown = sorted(set(table) - set(ADDRESS_KEYS))
        if unknown:
            raise InvalidConfig(f"{where}.{unknown[0]}", f"unknown key; an [[address]] has {', '.join(ADDRESS_KEYS)}")
        name = table.get("name")
        if not isinstance(name, str) or not name or len(name) > 255 or "::" in name \
                or any(ord(char) < 32 for char in name):
            raise InvalidConfig(f"{where}.name", "an address name is 1..255 characters, without '::' or control "
                                "characters")
        if name in names:
            raise InvalidConfig(f"{where}.name", f"{name!r} is declared by an earlier [[address]] table too")
        routing = table.get("routing", "multicast")
        if routing != "multicast":
            raise InvalidConfig(f"{where}.routing", f"{routing!r}: only multicast addresses are declared here; an "
                                "anycast address is a queue of its name: declare it as [[queue]]")
        subscriptions = table.get("queue", [])
        if not isinstance(subscriptions, list):
            raise InvalidConfig(f"{where}.queue", "must be an array of tables: write [[address.queue]]")
        for position, values in enumerate(subscriptions):
            queue_where = f"{where}.queue[{position}]"
            if not isinstance(values, dict):
                raise InvalidConfig(queue_where, "must be a table")
            if values.get("address", name) != name:
                raise InvalidConfig(f"{queue_where}.address", f"a queue under [[address]] {name!r} subscribes to it")
            queues.append(QueueSettings.from_dict({**values, "address": name}, where=queue_where))
        names.append(name)
    return tuple(names), queues