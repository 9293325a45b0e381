"""Who may do what to which queue: roles made of grants over queue-name patterns, and the decisions.

Rules:
- Pure: no I/O, threads, clock or sockets. An `Access` is built once from plain data (the users
  file's roles and users) and never changes; a changed file builds a new one, so no decision
  outlives the file it came from.
- Queue-name patterns use ActiveMQ Artemis wildcards: words separated by '.', '*' is exactly one
  word, '#' is zero or more words, anything else is literal. Patterns are parsed once, at
  construction, and matched word by word in time linear in (words of the name x words of the
  pattern): queue names come from clients, so no backtracking regex.
- `allows` runs on every link attach and, on anonymous-relay links, per message: once a
  (user, permission, queue) is decided it is one dict lookup.
- A denial names the user, the permission and the queue, and says how an administrator grants it.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Iterable, Mapping

from node.core.errors import InvalidConfig, Unauthorized

ANONYMOUS = "anonymous"  # the identity of a client that did not log in
ADMINISTRATOR = "administrator"  # built-in role: every permission on every queue
PATTERN_LENGTH_MAX_CHARS = 255  # as long as the longest queue name
DECISIONS_CACHED_MAX = 10_000  # (user, permission, queue) decisions remembered, entries; emptied when full
ONE_WORD = "*"
ANY_WORDS = "#"


class Permission(str, enum.Enum):
    SEND = "send"
    CONSUME = "consume"
    BROWSE = "browse"
    MANAGE = "manage"  # the management API and CLI: declare, delete, purge, move groups...
    CREATE = "create"  # auto-create a queue by attaching to an unknown address


_DOING = {Permission.SEND: "send to", Permission.CONSUME: "consume from", Permission.BROWSE: "browse",
          Permission.MANAGE: "manage", Permission.CREATE: "create"}


def validate_pattern(pattern: str, key: str = "queues") -> str:
    if not isinstance(pattern, str) or not pattern:
        raise InvalidConfig(key, "empty queue pattern; '#' matches every queue")
    if len(pattern) > PATTERN_LENGTH_MAX_CHARS:
        raise InvalidConfig(key, f"queue pattern longer than {PATTERN_LENGTH_MAX_CHARS} characters")
    if any(ord(char) < 32 for char in pattern):
        raise InvalidConfig(key, f"queue pattern {pattern!r} contains a control character")
    for word in pattern.split("."):
        if not word:
            raise InvalidConfig(key, f"queue pattern {pattern!r} has an empty word (a dot at an end, or two in a row)")
        if word not in (ONE_WORD, ANY_WORDS) and (ONE_WORD in word or ANY_WORDS in word):
            raise InvalidConfig(key, f"queue pattern {pattern!r}: the word {word!r} mixes a wildcard with text; "
                                     f"'*' and '#' stand alone between dots, as in 'orders.*'")
    return pattern


class QueuePattern:
    __slots__ = ("text", "_words", "_literal", "_everything")

    def __init__(self, text: str):
        self.text = validate_pattern(text)
        self._words = tuple(text.split("."))
        self._literal = ONE_WORD not in self._words and ANY_WORDS not in self._words
        self._everything = all(word == ANY_WORDS for word in self._words)

    @property
    def matches_everything(self) -> bool:
        return self._everything

    def matches(self, queue: str) -> bool:
        if self._literal:
            return queue == self.text
        if self._everything:
            return True
        pattern = self._words
        states = self._closure({0})
        for word in queue.split("."):
            following = set()
            for index in states:
                if index == len(pattern):
                    continue
                if pattern[index] == ANY_WORDS:
                    following.add(index)  # '#' takes this word and may take more
                elif pattern[index] == ONE_WORD or pattern[index] == word:
                    following.add(index + 1)
            if not following:
                return False
            states = self._closure(following)
        return len(pattern) in states

    def _closure(self, states: set[int]) -> set[int]:
        # '#' may also take no word at all: a state before it is a state after it too.
        pending = list(states)
        while pending:
            index = pending.pop()
            if index < len(self._words) and self._words[index] == ANY_WORDS and index + 1 not in states:
                states.add(index + 1)
                pending.append(index + 1)
        return states

    def __repr__(self) -> str:
        return f"QueuePattern({self.text!r})"


@dataclass(frozen=True)
class Grant:
    permissions: frozenset[Permission]
    queues: tuple[str, ...]

    def __post_init__(self):
        if not self.permissions:
            raise InvalidConfig("permissions", "a grant needs at least one permission")
        known = {permission.value for permission in Permission}
        for permission in self.permissions:
            if permission not in known:
                raise InvalidConfig("permissions", f"unknown permission {permission!r}; "
                                                   f"known: {', '.join(sorted(known))}")
        object.__setattr__(self, "permissions", frozenset(Permission(p) for p in self.permissions))
        if isinstance(self.queues, str) or not self.queues:
            raise InvalidConfig("queues", "a grant needs a list of at least one queue pattern ('#' is every queue)")
        for queue in self.queues:
            validate_pattern(queue)
        object.__setattr__(self, "queues", tuple(self.queues))


ADMINISTRATOR_GRANTS = (Grant(frozenset(Permission), (ANY_WORDS,)),)


class Access:
    def __init__(self, roles: Mapping[str, Iterable[Grant]], user_roles: Mapping[str, Iterable[str]]):
        """`user_roles` may list ANONYMOUS: the roles of clients that did not log in."""
        if ADMINISTRATOR in roles:
            raise InvalidConfig(f"roles.{ADMINISTRATOR}",
                                "is built in (every permission on '#') and cannot be redefined")
        every_role = {ADMINISTRATOR: ADMINISTRATOR_GRANTS, **{name: tuple(grants) for name, grants in roles.items()}}
        self._roles_of: dict[str, tuple[str, ...]] = {}
        self._patterns: dict[tuple[str, Permission], tuple[QueuePattern, ...] | None] = {}
        for user, names in user_roles.items():
            names = tuple(sorted(set(names)))
            for name in names:
                if name not in every_role:
                    raise InvalidConfig(f"users.{user}.roles", f"unknown role {name!r}")
            self._roles_of[user] = names
            for permission in Permission:
                texts = sorted({queue for name in names for grant in every_role[name]
                                if permission in grant.permissions for queue in grant.queues})
                patterns = tuple(QueuePattern(text) for text in texts)
                # None: every queue, decided without looking at the name
                self._patterns[(user, permission)] = (None if any(p.matches_everything for p in patterns)
                                                      else patterns)
        self._everyone = False
        self._decisions: dict[tuple[str, str, str], bool] = {}

    @classmethod
    def open(cls) -> "Access":
        """Everyone, anonymous included, may do everything: a node on loopback without a users file."""
        access = cls({}, {})
        access._everyone = True
        return access

    @property
    def is_open(self) -> bool:
        return self._everyone

    def allows(self, user: str, permission: Permission | str, queue: str) -> bool:
        if self._everyone:
            return True
        key = (user, permission, queue)
        decision = self._decisions.get(key)
        if decision is None:
            decision = self._decide(user, Permission(permission), queue)
            if len(self._decisions) >= DECISIONS_CACHED_MAX:
                self._decisions.clear()
            self._decisions[key] = decision
        return decision

    def check(self, user: str, permission: Permission | str, queue: str) -> None:
        if not self.allows(user, permission, queue):
            raise Unauthorized(self._denial(user, Permission(permission), queue))

    def _decide(self, user: str, permission: Permission, queue: str) -> bool:
        patterns = self._patterns.get((user, permission), ())
        if patterns is None:
            return True
        if queue == ANY_WORDS:  # "every queue" (cluster-wide calls): only a grant on '#' covers it, not '*'
            return False
        return any(pattern.matches(queue) for pattern in patterns)

    def _denial(self, user: str, permission: Permission, queue: str) -> str:
        doing = f"{_DOING[permission]} queue {queue!r}"
        grant = f"`grouper role set ROLE --allow {permission.value}:{queue}`"
        if user == ANONYMOUS:
            return (f"anonymous clients may not {doing} (no role under anonymous_roles in the users file grants "
                    f"{permission.value} on it; log in as a user, or an administrator can grant it with {grant} "
                    f"and `grouper user roles {ANONYMOUS} --role ROLE`)")
        if user not in self._roles_of:
            return (f"user {user!r} may not {doing} (there is no user {user!r} in the users file; an administrator "
                    f"can add it with `grouper user add {user} --role ROLE`)")
        roles = ", ".join(self._roles_of[user]) or "none"
        return (f"user {user!r} may not {doing} (no role of {user} grants {permission.value} on it; {user}'s roles: "
                f"{roles}; an administrator can grant it with {grant} on one of them, or on a new role given with "
                f"`grouper user roles {user} --role ROLE ...`)")
