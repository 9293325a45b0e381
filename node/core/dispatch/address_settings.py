"""Address settings and address parameters: which settings an auto-created queue gets.

Rules:
- Pure: no I/O, threads, clock or sockets. Built once from the config file's `[[address-setting]]`
  tables and its `[template]`; never changes afterwards.
- A table's `match` is an ActiveMQ Artemis pattern (the grammar and matcher of node.core.access.roles):
  words separated by '.', '*' is exactly one word, '#' is zero or more words.
- Specificity, most specific first (the exact rule; README "Address settings and parameters"):
  1. a pattern without wildcards beats every pattern with one;
  2. otherwise the words are compared left to right by kind, literal > '*' > '#', and the first
     word whose kind differs decides (leftmost words weigh most, as in dotted address hierarchies);
  3. if one pattern's kinds are a prefix of the other's, the one with fewer words wins (the longer
     one can only match the same names through trailing '#'s matching nothing);
  4. otherwise the pattern text, in code point order, decides, so the order never depends on the file.
- A table's keys are QueueSettings' (dashes or underscores), or Artemis's `default-<parameter>` for the
  parameters below (`default-group-buckets` is group_buckets).
- Merging, as Artemis does: a setting comes from the most specific matching table that gives it,
  else from `[template]` (below every table, even `match = "#"`), else QueueSettings' default.
- Address parameters (`orders?group-buckets=1024&group-first-key=K`) name seed 002's group
  parameters. The part before '?' is the queue. On an auto-create they override the merged settings;
  an existing queue must already have those values, or the attach is refused naming the parameter,
  the queue's value and the one asked for. Parameters never decide who may create a queue: callers
  authorize the bare queue name.
"""

from __future__ import annotations

import dataclasses
from typing import Iterable, Mapping
from urllib.parse import unquote

from node.core.access.roles import ANY_WORDS, ONE_WORD, QueuePattern
from node.core.errors import AlreadyExists, InvalidConfig, InvalidField
from node.core.dispatch.settings import DEAD_LETTER_SUFFIX, QueueSettings

ADDRESS_SETTINGS_MAX = 1000  # [[address-setting]] tables in one config file
PARAMETERS_MAX = 16  # parameters in one attach address
PARAMETER_SEPARATOR = "?"

# seed 002's (Artemis's) queue parameter -> the QueueSettings field it sets
PARAMETERS = {
    "group-buckets": "group_buckets",
    "group-first-key": "group_first_key",
    "group-rebalance": "group_rebalance",
    "group-rebalance-pause-dispatch": "group_rebalance_pause_dispatch",
    "consumers-before-dispatch": "consumers_before_dispatch",
    "delay-before-dispatch": "time_before_dispatch_ms",
}

ARTEMIS_DEFAULT_PREFIX = "default-"  # address-setting keys as Artemis spells them: default-<parameter>

_KIND_LITERAL, _KIND_ONE_WORD, _KIND_ANY_WORDS = 2, 1, 0


def specificity(pattern: str) -> tuple:
    """A sort key: a larger key is a more specific pattern (rules 1-3 of the module header)."""
    words = pattern.split(".")
    kinds = tuple(_KIND_ANY_WORDS if word == ANY_WORDS else _KIND_ONE_WORD if word == ONE_WORD else _KIND_LITERAL
                  for word in words)
    exact = all(kind == _KIND_LITERAL for kind in kinds)
    # Python compares tuples element by element and a prefix sorts first; appending a sentinel above
    # every kind makes the shorter of two prefix-equal patterns the larger key (rule 3).
    return (exact, kinds + (3,))


def most_specific_first(patterns: Iterable[str]) -> list[str]:
    # sorted() is stable: the text order (rule 4) survives among patterns of equal specificity
    return sorted(sorted(patterns), key=specificity, reverse=True)


@dataclasses.dataclass(frozen=True)
class AddressSetting:
    match: str
    values: Mapping  # QueueSettings field -> value, only the fields this table gives
    index: int  # position in the config file, for error messages

    @property
    def where(self) -> str:
        return f"address-setting[{self.index}]"


def parse_table(table: dict, index: int) -> AddressSetting:
    where = f"address-setting[{index}]"
    if not isinstance(table, dict):
        raise InvalidConfig(where, "must be a table with match = \"PATTERN\" and queue settings")
    if "match" not in table:
        raise InvalidConfig(f"{where}.match", "missing: give the queue names it applies to, e.g. \"orders.#\"")
    match = table["match"]
    try:
        QueuePattern(match)
    except InvalidConfig as error:
        raise InvalidConfig(f"{where}.match", str(error).split(": ", 1)[1]) from None
    values, fields_given = {}, set()
    for key, value in table.items():
        if key == "match":
            continue
        # Artemis's spelling, default-group-buckets and the like, for the parameters' settings
        alias = PARAMETERS.get(key[len(ARTEMIS_DEFAULT_PREFIX):]) if key.startswith(ARTEMIS_DEFAULT_PREFIX) else None
        field = alias or key.replace("-", "_")
        if field in fields_given:
            raise InvalidConfig(f"{where}.{key}", f"gives {field} a second time (keys may use '-' or '_')")
        fields_given.add(field)
        values[alias or key] = value
    if any(key.replace("-", "_") == "name" for key in values):
        raise InvalidConfig(f"{where}.name", "an address setting applies to many queues; 'match' chooses them")
    return AddressSetting(match, QueueSettings.check_values(values, where=where), index)


class AddressSettings:
    def __init__(self, tables: Iterable[AddressSetting] = (), template: QueueSettings | None = None):
        self.template = template or QueueSettings(name="template")
        tables = list(tables)
        if len(tables) > ADDRESS_SETTINGS_MAX:
            raise InvalidConfig("address-setting", f"{len(tables)} tables; at most {ADDRESS_SETTINGS_MAX}")
        seen: dict[str, AddressSetting] = {}
        for table in tables:
            if table.match in seen:
                raise InvalidConfig(f"{table.where}.match", f"{table.match!r} is already the match of "
                                    f"{seen[table.match].where}; merge the two tables")
            seen[table.match] = table
        self.tables = [seen[match] for match in most_specific_first(seen)]
        self._patterns = [QueuePattern(table.match) for table in self.tables]
        for table in self.tables:  # cross-field rules, as far as a name the pattern itself spells shows them
            try:
                self.settings_for(table.match.replace(ANY_WORDS, "x").replace(ONE_WORD, "x"))
            except InvalidConfig as error:
                raise InvalidConfig(f"{table.where}.{error.key}", str(error).split(": ", 1)[1]) from None

    @classmethod
    def from_config(cls, tables: Iterable[dict], template: dict) -> "AddressSettings":
        return cls([parse_table(table, index) for index, table in enumerate(tables)],
                   QueueSettings.from_dict({"name": "template", **template}, where="template"))

    def matching(self, queue_name: str) -> list[AddressSetting]:
        """The tables whose match takes `queue_name`, most specific first."""
        return [table for table, pattern in zip(self.tables, self._patterns) if pattern.matches(queue_name)]

    def settings_for(self, queue_name: str, parameters: Mapping | None = None) -> QueueSettings:
        merged: dict = {}
        for table in self.matching(queue_name):
            for key, value in table.values.items():
                merged.setdefault(key, value)
        merged.update(parameters or {})
        settings = dataclasses.replace(self.template, **merged, name=queue_name)
        if queue_name.endswith(DEAD_LETTER_SUFFIX) or settings.dead_letter_queue == queue_name:
            # a dead-letter queue keeps what it holds for an operator: no limit, no dead-letter queue of its own
            settings = dataclasses.replace(settings, delivery_count_max=0, dead_letter_queue="",
                                           dead_letter_queue_auto_create=False)
        return settings.validate()


def split_address(address: str) -> tuple[str, dict]:
    """(queue name, {QueueSettings field: value}) of an attach address; raises InvalidField on a bad
    parameter. An address without '?' is all queue name."""
    queue_name, separator, query = address.partition(PARAMETER_SEPARATOR)
    if not separator:
        return address, {}
    if not queue_name:
        raise InvalidField(f"address {address!r} has parameters but no queue name before '?'")
    parameters: dict = {}
    pairs = [pair for pair in query.split("&") if pair]
    if len(pairs) > PARAMETERS_MAX:
        raise InvalidField(f"address {address!r} has {len(pairs)} parameters; at most {PARAMETERS_MAX}")
    for pair in pairs:
        name, equals, raw = pair.partition("=")
        name = unquote(name)
        if name not in PARAMETERS:
            raise InvalidField(f"address parameter {name!r} is unknown; known: {', '.join(sorted(PARAMETERS))}")
        if not equals:
            raise InvalidField(f"address parameter {name!r} has no value; write {name}=VALUE")
        field = PARAMETERS[name]
        if field in parameters:
            raise InvalidField(f"address parameter {name!r} is given twice")
        parameters[field] = _parameter_value(name, field, unquote(raw))
    return queue_name, parameters


def _parameter_value(name: str, field: str, raw: str):
    expected = type(getattr(QueueSettings, field))
    if expected is bool:
        if raw.lower() in ("true", "false"):
            return raw.lower() == "true"
        raise InvalidField(f"address parameter {name}={raw!r}: expected true or false")
    if expected is int:
        try:
            value = int(raw)
        except ValueError:
            raise InvalidField(f"address parameter {name}={raw!r}: expected an integer") from None
        if field == "group_buckets" and value < -1:
            raise InvalidField(f"address parameter {name}={value}: must be -1 (every group), 0 (off) or a bucket count")
        if field != "group_buckets" and value < 0:
            raise InvalidField(f"address parameter {name}={value}: must be >= 0")
        return value
    return raw


def parameter_name(field: str) -> str:
    return next(name for name, known in PARAMETERS.items() if known == field)


def check_parameters(settings: QueueSettings, parameters: Mapping) -> None:
    """An existing queue takes an address's parameters only when it already has those values."""
    for field, requested in sorted(parameters.items()):
        current = getattr(settings, field)
        if current != requested:
            name = parameter_name(field)
            raise AlreadyExists(
                f"queue {settings.name!r} exists with {name}={_spelled(current)} but the address asks for "
                f"{name}={_spelled(requested)}; parameters only shape a queue when they create it: attach "
                f"without {name}, or with the queue's value")


def _spelled(value) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)
