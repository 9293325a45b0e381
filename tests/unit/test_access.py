"""Authorization decisions: Artemis wildcard patterns against a recursive reference matcher, the
user x permission x pattern matrix against a naive model, and denials that say who, what and how."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.amqp.conditions import condition_for
from node.core.access import roles as access_module
from node.core.access.roles import (ADMINISTRATOR, ANONYMOUS, DECISIONS_CACHED_MAX, Access, Grant, Permission,
                              QueuePattern, validate_pattern)
from node.core.errors import InvalidConfig, Unauthorized


def reference_matches(pattern: list[str], words: list[str]) -> bool:
    """Artemis semantics read straight off the definition: '#' any number of words, '*' one."""
    if not pattern:
        return not words
    head, rest = pattern[0], pattern[1:]
    if head == "#":
        return any(reference_matches(rest, words[skip:]) for skip in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and reference_matches(rest, words[1:])


pattern_words = st.lists(st.sampled_from(["a", "b", "*", "#"]), min_size=1, max_size=6)
name_words = st.lists(st.sampled_from(["a", "b", "c", ""]), min_size=1, max_size=7)
permissions = st.sampled_from(list(Permission))


def grant(permission_names, *queues) -> Grant:
    return Grant(frozenset(Permission(name) for name in permission_names), queues)


# ---- patterns ------------------------------------------------------------------------------------

@given(pattern_words, name_words)
@settings(max_examples=1000, deadline=None)
def test_pattern_matches_exactly_where_the_reference_matcher_does(pattern, words):
    assert QueuePattern(".".join(pattern)).matches(".".join(words)) == reference_matches(pattern, words)


@pytest.mark.parametrize("pattern, name, expected", [
    ("orders.*", "orders.eu", True),
    ("orders.*", "orders", False),
    ("orders.*", "orders.eu.x", False),
    ("orders.#", "orders", True),
    ("orders.#", "orders.eu", True),
    ("orders.#", "orders.eu.x", True),
    ("orders.#", "ordersx", False),
    ("#", "anything.at.all", True),
    ("#.eu", "eu", True),
    ("#.eu", "orders.eu", True),
    ("#.eu", "orders.us", False),
    ("a.#.b", "a.b", True),
    ("a.#.b", "a.x.y.b", True),
    ("orders", "orders", True),
    ("orders", "orders.eu", False),
    ("or+ders.(x)", "or+ders.(x)", True),  # regex characters are literal
])
def test_artemis_wildcard_examples(pattern, name, expected):
    assert QueuePattern(pattern).matches(name) is expected


def test_many_any_word_wildcards_match_a_long_name_in_linear_time():
    # a backtracking regex would take ages on this; names come from clients
    pattern = QueuePattern(".".join(["#", "a"] * 20 + ["b"]))
    assert not pattern.matches(".".join(["a"] * 250))


@pytest.mark.parametrize("pattern, problem", [
    ("", "empty queue pattern"),
    ("ord*", "mixes a wildcard with text"),
    ("orders.eu#", "mixes a wildcard with text"),
    ("orders..eu", "empty word"),
    ("orders.", "empty word"),
    ("x" * 256, "longer than 255 characters"),
    ("orders\n", "control character"),
])
def test_bad_patterns_are_refused_saying_why(pattern, problem):
    with pytest.raises(InvalidConfig, match=problem):
        validate_pattern(pattern)


# ---- grants ----------------------------------------------------------------------------------------

def test_grant_takes_permission_names_and_keeps_permissions():
    assert Grant(frozenset({"send"}), ("orders.*",)).permissions == {Permission.SEND}


@pytest.mark.parametrize("permission_names, queues, problem", [
    (frozenset(), ("q",), "at least one permission"),
    (frozenset({"sned"}), ("q",), "unknown permission 'sned'"),
    (frozenset({"send"}), (), "at least one queue pattern"),
    (frozenset({"send"}), "orders", "at least one queue pattern"),
    (frozenset({"send"}), ("ord*",), "mixes a wildcard"),
])
def test_bad_grants_are_refused(permission_names, queues, problem):
    with pytest.raises(InvalidConfig, match=problem):
        Grant(permission_names, queues)


# ---- the authorization matrix --------------------------------------------------------------------

grants = st.builds(lambda names, patterns: Grant(frozenset(names), tuple(".".join(p) for p in patterns)),
                   st.sets(permissions, min_size=1), st.lists(pattern_words, min_size=1, max_size=3))
role_names = st.sampled_from(["r1", "r2", "r3", "r4"])
user_names = st.sampled_from(["alice", "bob", "carol", ANONYMOUS])


@given(roles=st.dictionaries(role_names, st.lists(grants, min_size=1, max_size=3)),
       data=st.data())
@settings(max_examples=150, deadline=None)
def test_decisions_match_a_naive_model_of_roles_and_grants(roles, data):
    known = sorted(roles) + [ADMINISTRATOR]
    user_roles = data.draw(st.dictionaries(user_names, st.lists(st.sampled_from(known), max_size=3)))
    access = Access(roles, user_roles)
    every_role = {**roles, ADMINISTRATOR: [Grant(frozenset(Permission), ("#",))]}
    for _ in range(20):
        user = data.draw(user_names)
        permission = data.draw(permissions)
        words = data.draw(name_words)
        expected = any(permission in grant_.permissions and reference_matches(pattern.split("."), words)
                       for role in user_roles.get(user, ()) for grant_ in every_role[role]
                       for pattern in grant_.queues)
        assert access.allows(user, permission, ".".join(words)) is expected
        assert access.allows(user, permission.value, ".".join(words)) is expected  # a plain string too


def test_a_role_grants_only_its_permissions_on_its_queues():
    access = Access({"orders-writer": [grant(["send"], "orders.*")]}, {"bob": ["orders-writer"]})
    assert access.allows("bob", Permission.SEND, "orders.eu")
    assert not access.allows("bob", Permission.CONSUME, "orders.eu")
    assert not access.allows("bob", Permission.SEND, "orders")
    assert not access.allows("bob", Permission.SEND, "payments")


def test_grants_of_several_roles_add_up():
    roles = {"writer": [grant(["send"], "orders.#")], "reader": [grant(["consume", "browse"], "orders.eu")]}
    access = Access(roles, {"bob": ["writer", "reader"]})
    assert access.allows("bob", Permission.SEND, "orders.us")
    assert access.allows("bob", Permission.BROWSE, "orders.eu")
    assert not access.allows("bob", Permission.CONSUME, "orders.us")


def test_administrator_may_do_everything_everywhere():
    access = Access({}, {"alice": [ADMINISTRATOR]})
    for permission in Permission:
        assert access.allows("alice", permission, "any.queue.at.all")


def test_administrator_cannot_be_redefined():
    with pytest.raises(InvalidConfig, match="built in"):
        Access({ADMINISTRATOR: [grant(["send"], "q")]}, {})


def test_an_unknown_role_is_refused_naming_the_user():
    with pytest.raises(InvalidConfig) as caught:
        Access({}, {"bob": ["nope"]})
    assert caught.value.key == "users.bob.roles"
    assert "unknown role 'nope'" in caught.value.description


def test_anonymous_gets_nothing_by_default_and_its_listed_roles_otherwise():
    roles = {"public": [grant(["consume"], "news.#")]}
    assert not Access(roles, {"bob": ["public"]}).allows(ANONYMOUS, Permission.CONSUME, "news")
    access = Access(roles, {ANONYMOUS: ["public"]})
    assert access.allows(ANONYMOUS, Permission.CONSUME, "news.eu")
    assert not access.allows(ANONYMOUS, Permission.SEND, "news.eu")


def test_open_access_lets_everyone_do_everything():
    access = Access.open()
    assert access.is_open
    for user in (ANONYMOUS, "whoever"):
        for permission in Permission:
            assert access.allows(user, permission, "q")
            access.check(user, permission, "q")
    assert not Access({}, {}).is_open


# ---- denials -----------------------------------------------------------------------------------------

def test_a_denial_names_user_permission_queue_and_how_to_grant_it():
    access = Access({"orders-writer": [grant(["send"], "orders.*")]}, {"bob": ["orders-writer"]})
    with pytest.raises(Unauthorized) as caught:
        access.check("bob", Permission.CONSUME, "payments")
    description = caught.value.description
    assert description.startswith("user 'bob' may not consume from queue 'payments' (no role of bob grants consume")
    assert "orders-writer" in description
    assert "grouper role set ROLE --allow consume:payments" in description


@given(user=st.sampled_from(["bob", "carol"]), permission=permissions, queue=st.sampled_from(["q", "a.b", "x.y.z"]))
@settings(deadline=None)
def test_every_denial_names_its_user_permission_and_queue(user, permission, queue):
    access = Access({}, {"bob": []})
    with pytest.raises(Unauthorized) as caught:
        access.check(user, permission, queue)
    description = caught.value.description
    assert f"user {user!r}" in description
    assert f"queue {queue!r}" in description
    assert permission.value in description


def test_an_unknown_user_is_denied_saying_there_is_no_such_user():
    with pytest.raises(Unauthorized, match="there is no user 'mallory' in the users file"):
        Access({}, {"bob": []}).check("mallory", Permission.SEND, "q")


def test_an_anonymous_denial_says_to_log_in():
    with pytest.raises(Unauthorized, match="anonymous clients may not send to queue 'q'.*log in"):
        Access({}, {}).check(ANONYMOUS, Permission.SEND, "q")


def test_unauthorized_is_the_clients_fault_and_not_retriable():
    assert condition_for(Unauthorized("no"))[0] == "amqp:unauthorized-access"
    assert Unauthorized.fault == "client"
    assert Unauthorized.retriable is False


# ---- cost ----------------------------------------------------------------------------------------------

def test_a_decision_is_made_once_and_then_remembered(monkeypatch):
    access = Access({"writer": [grant(["send"], "orders.*")]}, {"bob": ["writer"]})
    calls = []
    real = QueuePattern.matches
    monkeypatch.setattr(QueuePattern, "matches", lambda self, queue: calls.append(queue) or real(self, queue))
    for _ in range(5):
        assert access.allows("bob", Permission.SEND, "orders.eu")
    assert calls == ["orders.eu"]


def test_remembered_decisions_stay_within_their_bound_and_right(monkeypatch):
    assert DECISIONS_CACHED_MAX == 10_000
    monkeypatch.setattr(access_module, "DECISIONS_CACHED_MAX", 3)
    access = Access({"writer": [grant(["send"], "orders.*")]}, {"bob": ["writer"]})
    for round_ in range(3):
        for index in range(10):
            assert access.allows("bob", Permission.SEND, f"orders.q{index}")
            assert not access.allows("bob", Permission.SEND, f"other.q{index}")
            assert len(access._decisions) <= 3


def test_every_queue_is_covered_only_by_a_grant_on_every_queue():
    # '*' matches the one word '#' as a name, but a cluster-wide call asks about every queue
    access = Access({"one-word": [Grant(frozenset({Permission.MANAGE}), ("*",))],
                     "all": [Grant(frozenset({Permission.MANAGE}), ("#",))]},
                    {"carol": ["one-word"], "dave": ["all"]})
    assert not access.allows("carol", Permission.MANAGE, "#")
    assert access.allows("carol", Permission.MANAGE, "orders")
    assert access.allows("dave", Permission.MANAGE, "#")
