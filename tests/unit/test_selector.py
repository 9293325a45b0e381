"""JMS message selectors (node.core.dispatch.selector): the JMS spec's examples, SQL's three-valued truth tables, the
type rules, error offsets, the limits, and a hypothesis check against a reference model written here.

The model below is a second, independent reading of the same rules: expression trees of its own, evaluated
directly with truth tables spelt out as data ("T", "F", "U"), a LIKE done by regular expressions, and
rendered to selector text (parentheses only where precedence needs them, plus some for their own sake)
for the real parser and compiled evaluator to answer the same question.
"""

from __future__ import annotations

import operator
import re
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.amqp.conditions import condition_for
from node.core.dispatch import selector_eval
from node.core.errors import InvalidField
from node.core.dispatch.selector import SELECTOR_DEPTH_MAX, SELECTOR_MAX_CHARS, InvalidSelector, compile_selector

T, F, U = "T", "F", "U"


def verdict(text: str, **fields) -> str:
    value = compile_selector(text).evaluate(fields)
    return {True: T, False: F, None: U}[value]


def selects(text: str, **fields) -> bool:
    return compile_selector(text).matches(fields)


# ---- the examples of javax.jms.Message's "Message Selectors" -------------------------------------

def test_the_spec_example_selects_a_heavy_blue_car_only():
    text = "JMSType = 'car' AND color = 'blue' AND weight > 2500"
    assert selects(text, JMSType="car", color="blue", weight=2600)
    assert not selects(text, JMSType="car", color="blue", weight=2500)
    assert not selects(text, JMSType="car", color="red", weight=2600)
    assert not selects(text, JMSType="car", color="blue")  # weight NULL: UNKNOWN, not selected


def test_between_is_inclusive_and_not_between_its_complement():
    assert [selects("age BETWEEN 15 AND 19", age=age) for age in (14, 15, 19, 20)] == [False, True, True, False]
    assert [selects("age NOT BETWEEN 15 AND 19", age=age) for age in (14, 15, 19, 20)] == [True, False, False, True]
    assert verdict("age BETWEEN 15 AND 19") == U and verdict("age NOT BETWEEN 15 AND 19") == U


def test_in_and_not_in_over_string_literals():
    assert selects("Country IN ('UK', 'US', 'France')", Country="UK")
    assert not selects("Country IN ('UK', 'US', 'France')", Country="Peru")
    assert not selects("Country NOT IN ('UK', 'US', 'France')", Country="UK")
    assert selects("Country NOT IN ('UK', 'US', 'France')", Country="Peru")
    assert verdict("Country IN ('UK')") == U and verdict("Country NOT IN ('UK')") == U


def test_like_with_percent_underscore_and_escape():
    assert [selects("phone LIKE '12%3'", phone=p) for p in ("123", "12993", "1234")] == [True, True, False]
    assert [selects("word LIKE 'l_se'", word=w) for w in ("lose", "loose")] == [True, False]
    assert [selects("underscored LIKE '\\_%' ESCAPE '\\'", underscored=u) for u in ("_foo", "bar")] == [True, False]
    assert [selects("phone NOT LIKE '12%3'", phone=p) for p in ("123", "1234")] == [False, True]
    assert verdict("phone LIKE '12%3'") == U and verdict("phone NOT LIKE '12%3'") == U


def test_is_null_and_is_not_null():
    assert selects("prop_name IS NULL") and not selects("prop_name IS NULL", prop_name="x")
    assert selects("prop_name IS NOT NULL", prop_name="x") and not selects("prop_name IS NOT NULL")


# ---- three-valued logic ------------------------------------------------------------------------

LOGIC_FIELDS = {T: "t", F: "f", U: "u"}  # properties holding TRUE and FALSE; `u` is absent, so NULL
AND = {(T, T): T, (T, F): F, (T, U): U, (F, T): F, (F, F): F, (F, U): F, (U, T): U, (U, F): F, (U, U): U}
OR = {(T, T): T, (T, F): T, (T, U): T, (F, T): T, (F, F): F, (F, U): U, (U, T): T, (U, F): U, (U, U): U}
NOT = {T: F, F: T, U: U}


@pytest.mark.parametrize("left, right", sorted(AND))
def test_and_and_or_follow_sql_truth_tables(left, right):
    fields = {"t": True, "f": False}
    assert verdict(f"{LOGIC_FIELDS[left]} AND {LOGIC_FIELDS[right]}", **fields) == AND[(left, right)]
    assert verdict(f"{LOGIC_FIELDS[left]} OR {LOGIC_FIELDS[right]}", **fields) == OR[(left, right)]


@pytest.mark.parametrize("value", [T, F, U])
def test_not_unknown_is_unknown(value):
    assert verdict(f"NOT {LOGIC_FIELDS[value]}", t=True, f=False) == NOT[value]


def test_a_message_is_selected_only_when_the_selector_is_true():
    assert not selects("missing = 1") and not selects("NOT (missing = 1)")
    assert selects("missing = 1 OR TRUE") and not selects("missing = 1 AND TRUE")


def test_a_non_boolean_where_a_condition_stands_is_unknown():
    assert verdict("s AND TRUE", s="yes") == U and verdict("NOT s", s=1) == U


# ---- types -------------------------------------------------------------------------------------

def test_numbers_compare_across_exact_and_approximate():
    assert selects("n = 2.0", n=2) and selects("n < 2.5", n=2) and selects("x >= 1", x=1.0)


def test_unlike_types_compare_false_with_every_operator_and_null_makes_unknown():
    for symbol in ("=", "<>", "<", "<=", ">", ">="):
        assert verdict(f"s {symbol} 1", s="1") == F
        assert verdict(f"b {symbol} 1", b=True) == F  # a boolean is not the number 1
        assert verdict(f"s {symbol} 1") == U
    assert verdict("NOT (s = 1)", s="1") == T


def test_strings_and_booleans_compare_only_by_equality():
    assert verdict("s = 'a'", s="a") == T and verdict("s <> 'a'", s="b") == T
    assert verdict("s < 'b'", s="a") == F and verdict("b = TRUE", b=True) == T and verdict("b > FALSE", b=True) == F


def test_a_property_of_a_type_jms_cannot_name_is_present_but_unlike_everything():
    assert verdict("x = 'a'", x=b"a") == F and verdict("x IS NOT NULL", x=[1]) == T and verdict("x + 1 = 2", x=b"") == U


def test_arithmetic_follows_java_and_never_raises():
    assert selects("7 / 2 = 3 AND -7 / 2 = -3 AND 7 / -2 = -3 AND 7.0 / 2 = 3.5")
    assert verdict("1 / 0 = 1") == U and verdict("1.5 / 0 = 1") == U and verdict("n / 0 > 0", n=0) == U
    assert selects("a + 2 * 3 = 7 AND (a + 2) * 3 = 9 AND 10 - 4 - 3 = 3 AND 24 / 4 / 2 = 3", a=1)
    assert selects("- -1 = 1 AND -(a) = -1 AND +a = 1", a=1)
    assert verdict("9223372036854775807 + 1 > 0") == U  # beyond a Java long: NULL, not a wrap
    assert verdict("s + 1 = 2", s="1") == U and verdict("-s = 1", s="1") == U


def test_keywords_are_case_insensitive_and_identifiers_case_sensitive():
    assert selects("colour = 'x' and Not (n between 1 AnD 2) oR false", colour="x", n=5)
    assert verdict("Colour = 'x'", colour="x") == U
    assert selects("$dollar = 1 AND _under = 2 AND größe = 3 AND x1 = 4", **{"$dollar": 1, "_under": 2, "größe": 3,
                                                                          "x1": 4})


def test_literals():
    assert selects("s = 'it''s'", s="it's") and selects("1e3 = 1000 AND 7. = 7 AND .5 = 0.5 AND 1E+2 = 100")
    assert selects("-9223372036854775808 < 0 AND TRUE AND NOT FALSE") and verdict("NULL") == U


def test_an_empty_selector_is_no_selector():
    assert compile_selector("") is None and compile_selector("  \t") is None


def test_like_matching_costs_at_most_text_times_pattern_steps(monkeypatch):
    calls = []
    piece_at = selector_eval._piece_at
    monkeypatch.setattr(selector_eval, "_piece_at", lambda *args: calls.append(1) or piece_at(*args))
    pattern = "%a_" * 30 + "%b"  # a backtracking regex tries ~len(text) ** 30 cuts of this text
    pieces = selector_eval.like_pieces(pattern, None)
    assert not selector_eval.like_matches("a" * 2000, pieces)
    assert len(calls) <= (2000 + 1) * len(pieces)


# ---- errors ------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, offset, words", [
    ("a = ", 4, "expected a value after '=', got end of text"),
    ("(a = 1", 6, "expected ')' after the expression opened at 0"),
    ("a = 1 b", 6, "expected AND, OR or the end of the selector, got identifier b"),
    ("a = 1 AND", 9, "expected a condition after AND"),
    ("a != 1", 2, "write <> for 'not equal'"),
    ("s = \"x\"", 4, "single quotes"),
    ("amqp.correlation_id = 'x'", 4, "cannot hold a dot"),
    ("a <", 3, "expected a value after '<', got end of text"),
    ("s = 'open", 4, "never closed"),
    ("a IN ()", 6, "expected a string literal"),
    ("a IN ('x', 1)", 11, "expected a string literal"),
    ("a BETWEEN 1", 11, "expected AND after BETWEEN's lower bound"),
    ("a IS 1", 5, "expected NULL after IS"),
    ("a NOT NULL", 6, "expected BETWEEN, IN or LIKE after NOT"),
    ("'abc'", 0, "expected a condition"),
    ("1 + 'a' = 1", 4, "arithmetic needs numbers, got string 'a'"),
    ("a LIKE 'x\\' ESCAPE '\\'", 7, "ends with its escape character"),
    ("a LIKE 'x' ESCAPE 'ab'", 18, "must be one character"),
    ("017 = 1", 0, "leading 0"),
    ("9223372036854775808 > 1", 0, "range of a long"),
    ("1e999 > 1", 0, "range of a double"),
    ("in = 1", 0, "expected a value, got 'IN'"),
])
def test_a_malformed_selector_is_refused_saying_where_and_what(text, offset, words):
    with pytest.raises(InvalidSelector) as raised:
        compile_selector(text)
    assert raised.value.offset == offset
    assert raised.value.description.startswith(f"selector: at {offset}, ")
    assert words in raised.value.description


def test_an_invalid_selector_is_the_clients_invalid_field():
    with pytest.raises(InvalidField) as raised:
        compile_selector("a =")
    assert condition_for(raised.value)[0] == "amqp:invalid-field" and raised.value.fault == "client"


# ---- limits ------------------------------------------------------------------------------------

def test_a_selector_of_max_chars_is_accepted_and_one_more_refused():
    text = "a = 1" + " " * (SELECTOR_MAX_CHARS - 5)
    assert compile_selector(text).matches({"a": 1})
    with pytest.raises(InvalidSelector, match="SELECTOR_MAX_CHARS"):
        compile_selector(text + " ")


@pytest.mark.parametrize("opening, closing, core", [("(", ")", "a"), ("NOT ", "", "a"), ("+", "", "1 = 1")])
def test_nesting_to_the_depth_max_works_and_one_deeper_is_refused_not_a_recursion_error(opening, closing, core):
    def nested(depth):
        return opening * depth + core + closing * depth
    assert compile_selector(nested(SELECTOR_DEPTH_MAX)).evaluate({"a": True}) is True
    with pytest.raises(InvalidSelector, match="nests deeper than"):
        compile_selector(nested(SELECTOR_DEPTH_MAX + 1))
    with pytest.raises(InvalidSelector, match="nests deeper than"):  # far deeper still, within the length limit
        compile_selector(nested((SELECTOR_MAX_CHARS - 10) // max(1, len(opening) + len(closing))))


def test_a_caller_short_of_stack_gets_a_refusal_not_a_recursion_error():
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 200)  # enough for a shallow selector, not for one nested 60 deep
    try:
        assert compile_selector("(a = 1)").matches({"a": 1})
        with pytest.raises(InvalidSelector, match="nests too deeply for this node's stack"):
            compile_selector("(" * 60 + "a" + ")" * 60)
    finally:
        sys.setrecursionlimit(limit)


def test_long_flat_chains_neither_recurse_when_parsed_nor_when_evaluated():
    conjunction = " AND ".join(["a = 1"] * 400)
    arithmetic = "+".join(["a"] * 1300) + " = 1300"
    frame, depth = sys._getframe(), 0
    while frame is not None:
        frame, depth = frame.f_back, depth + 1
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 100)  # a left-deep tree of these chains would need 400 and 1300 frames more
    try:
        assert compile_selector(conjunction).matches({"a": 1}) and compile_selector(arithmetic).matches({"a": 1})
    finally:
        sys.setrecursionlimit(limit)


# ---- the reference model ----------------------------------------------------------------------

LONG_MIN, LONG_MAX = -(2 ** 63), 2 ** 63 - 1
NAMES = ("a", "b", "c")
ORDER = {"=": operator.eq, "<>": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def as_truth(value) -> str:
    return T if value is True else F if value is False else U


def is_number(value) -> bool:
    return type(value) in (int, float)


def model_compare(symbol, left, right) -> str:
    if left is None or right is None:
        return U
    if is_number(left) and is_number(right):
        return as_truth(ORDER[symbol](left, right))
    if type(left) is type(right) and type(left) in (str, bool) and symbol in ("=", "<>"):
        return as_truth(ORDER[symbol](left, right))
    return F


def model_arithmetic(symbol, left, right):
    if not (is_number(left) and is_number(right)):
        return None
    if symbol == "/":
        if right == 0:
            return None
        if type(left) is int and type(right) is int:
            result = left // right
            if result < 0 and result * right != left:
                result += 1  # toward zero, as Java
        else:
            result = left / right
    else:
        result = {"+": operator.add, "-": operator.sub, "*": operator.mul}[symbol](left, right)
    if type(result) is int and not LONG_MIN <= result <= LONG_MAX:
        return None
    return result


def model_like(text, pattern, escape) -> bool:
    regex, position = [], 0
    while position < len(pattern):
        character = pattern[position]
        if character == escape:
            regex.append(re.escape(pattern[position + 1]))
            position += 2
            continue
        regex.append(".*" if character == "%" else "." if character == "_" else re.escape(character))
        position += 1
    return re.fullmatch("".join(regex), text, re.DOTALL) is not None


def model(node, fields):
    """A value node's value, or a condition node's truth as T, F or U."""
    kind = node[0]
    if kind == "field":
        return fields.get(node[1])
    if kind == "literal":
        return node[1]
    if kind == "paren":
        return model(node[1], fields)
    if kind == "arithmetic":
        return model_arithmetic(node[1], model(node[2], fields), model(node[3], fields))
    if kind == "negate":
        value = model(node[1], fields)
        return model_arithmetic("-", 0, value) if is_number(value) else None
    if kind == "compare":
        return model_compare(node[1], value_of(node[2], fields), value_of(node[3], fields))
    if kind == "and":
        return AND[truth_of(node[1], fields), truth_of(node[2], fields)]
    if kind == "or":
        return OR[truth_of(node[1], fields), truth_of(node[2], fields)]
    if kind == "not":
        return NOT[truth_of(node[1], fields)]
    if kind == "between":
        _, negated, checked, low, high = node
        checked, low, high = value_of(checked, fields), value_of(low, fields), value_of(high, fields)
        if negated:
            return OR[model_compare("<", checked, low), model_compare(">", checked, high)]
        return AND[model_compare(">=", checked, low), model_compare("<=", checked, high)]
    if kind == "in":
        _, negated, checked, strings = node
        checked = value_of(checked, fields)
        found = U if checked is None else T if type(checked) is str and checked in strings else F
        return NOT[found] if negated else found
    if kind == "like":
        _, negated, checked, pattern, escape = node
        checked = value_of(checked, fields)
        found = U if checked is None else T if type(checked) is str and model_like(checked, pattern, escape) else F
        return NOT[found] if negated else found
    assert kind == "is_null"
    found = T if value_of(node[2], fields) is None else F
    return NOT[found] if node[1] else found


CONDITIONS = {"compare", "and", "or", "not", "between", "in", "like", "is_null"}


def is_condition(node) -> bool:
    return node[0] in CONDITIONS or (node[0] == "paren" and is_condition(node[1]))


def value_of(node, fields):
    """A node where a value stands: a condition's truth becomes TRUE, FALSE or NULL."""
    result = model(node, fields)
    return {T: True, F: False, U: None}[result] if is_condition(node) else result


def truth_of(node, fields) -> str:
    result = model(node, fields)
    return result if is_condition(node) else as_truth(result)


def level(node) -> int:
    """How tightly a node binds when rendered: a child of a looser level needs parentheses."""
    kind = node[0]
    if kind == "arithmetic":
        return 5 if node[1] in "+-" else 6
    return {"or": 1, "and": 2, "not": 3, "negate": 7}.get(kind, 4 if kind in CONDITIONS else 8)


def quote(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def render(node, least: int = 0) -> str:
    kind = node[0]
    if kind == "field":
        text = node[1]
    elif kind == "literal":
        value = node[1]
        text = ({True: "TRUE", False: "fAlSe"}[value] if type(value) is bool else "NULL" if value is None
                else quote(value) if type(value) is str else repr(value))
    elif kind == "paren":
        text = "(" + render(node[1]) + ")"
    elif kind == "arithmetic":
        own = level(node)
        text = f"{render(node[2], own)} {node[1]} {render(node[3], own + 1)}"
    elif kind == "negate":
        text = "- " + render(node[1], 7)
    elif kind == "compare":
        text = f"{render(node[2], 5)} {node[1]} {render(node[3], 5)}"
    elif kind in ("and", "or"):
        own = level(node)
        text = f"{render(node[1], own)} {kind.upper()} {render(node[2], own + 1)}"
    elif kind == "not":
        text = "NOT " + render(node[1], 3)
    elif kind == "between":
        _, negated, checked, low, high = node
        text = f"{render(checked, 5)} {'NOT ' * negated}BETWEEN {render(low, 5)} AND {render(high, 5)}"
    elif kind == "in":
        _, negated, checked, strings = node
        text = f"{render(checked, 5)} {'NOT ' * negated}IN ({', '.join(quote(s) for s in strings)})"
    elif kind == "like":
        _, negated, checked, pattern, escape = node
        text = f"{render(checked, 5)} {'not ' * negated}like {quote(pattern)}"
        text += f" ESCAPE {quote(escape)}" if escape else ""
    else:
        text = f"{render(node[2], 5)} IS {'NOT ' * node[1]}NULL"
    return f"({text})" if level(node) < least else text


# ---- the trees hypothesis draws --------------------------------------------------------------

STRINGS = st.text(alphabet="ab_%'", max_size=3)
NUMBERS = st.one_of(st.integers(-3, 3), st.sampled_from([LONG_MAX, LONG_MIN, 0.0, 0.5, -1.5, 2.0]))
PROPERTY_VALUES = st.one_of(st.none(), st.booleans(), NUMBERS, STRINGS)
FIELDS = st.fixed_dictionaries({}, optional={name: PROPERTY_VALUES.filter(lambda v: v is not None) for name in NAMES})
FIELD = st.sampled_from(NAMES).map(lambda name: ("field", name))


def numeric(children):
    return st.one_of(
        st.tuples(st.just("arithmetic"), st.sampled_from("+-*/"), children, children),
        st.tuples(st.just("negate"), children),
        children.map(lambda node: ("paren", node)))


NUMERIC = st.recursive(st.one_of(FIELD, NUMBERS.map(lambda n: ("literal", n))), numeric, max_leaves=4)
VALUE_LEAVES = st.one_of(NUMERIC, st.one_of(STRINGS, st.booleans(), st.none()).map(lambda v: ("literal", v)))


def like_pattern(draw_pattern_escape):
    pattern, escape = draw_pattern_escape
    if escape and (len(pattern) - len(pattern.rstrip(escape))) % 2:
        pattern += "a"  # a pattern ending in its escape character is refused at parse
    return pattern, escape


LIKES = st.tuples(st.text(alphabet="ab_%!\\", max_size=5), st.sampled_from([None, "\\", "!"])).map(like_pattern)


def conditions(children):
    values = st.one_of(VALUE_LEAVES, children.map(lambda node: ("paren", node)))
    return st.one_of(
        st.tuples(st.just("compare"), st.sampled_from(sorted(ORDER)), values, values),
        st.tuples(st.sampled_from(["and", "or"]), children, children),
        st.tuples(st.just("not"), children),
        st.tuples(st.just("between"), st.booleans(), VALUE_LEAVES, NUMERIC, NUMERIC),
        st.tuples(st.just("in"), st.booleans(), VALUE_LEAVES, st.lists(STRINGS, min_size=1, max_size=3).map(tuple)),
        st.tuples(st.just("like"), st.booleans(), VALUE_LEAVES, LIKES).map(lambda n: n[:3] + n[3]),
        st.tuples(st.just("is_null"), st.booleans(), VALUE_LEAVES),
        children.map(lambda node: ("paren", node)))


CONDITION_LEAVES = st.one_of(FIELD, st.sampled_from([True, False, None]).map(lambda v: ("literal", v)),
                             st.tuples(st.just("compare"), st.sampled_from(sorted(ORDER)), VALUE_LEAVES, VALUE_LEAVES))
TREES = st.recursive(CONDITION_LEAVES, conditions, max_leaves=8)


@settings(max_examples=600, deadline=None)
@given(tree=TREES, fields=FIELDS)
def test_the_compiled_selector_agrees_with_the_reference_model(tree, fields):
    text = render(tree)
    expected = truth_of(tree, fields)
    assert verdict(text, **fields) == expected, text
    assert compile_selector(text).matches(fields) == (expected == T)


@settings(max_examples=200, deadline=None)
@given(value=PROPERTY_VALUES, strings=st.lists(STRINGS, min_size=1, max_size=3), low=NUMBERS, high=NUMBERS)
def test_in_and_between_are_the_or_and_and_jms_defines_them_as(value, strings, low, high):
    fields = {} if value is None else {"x": value}
    listed = ", ".join(quote(s) for s in strings)
    ored = " OR ".join(f"x = {quote(s)}" for s in strings)
    assert verdict(f"x IN ({listed})", **fields) == verdict(ored, **fields)
    assert verdict(f"x NOT IN ({listed})", **fields) == verdict(f"NOT ({ored})", **fields)
    bounds = f"x >= {low!r} AND x <= {high!r}"
    assert verdict(f"x BETWEEN {low!r} AND {high!r}", **fields) == verdict(bounds, **fields)
    assert verdict(f"x NOT BETWEEN {low!r} AND {high!r}", **fields) == verdict(f"x < {low!r} OR x > {high!r}", **fields)


@settings(max_examples=300, deadline=None)
@given(text=st.text(alphabet="ab_%", max_size=8), pattern_escape=LIKES)
def test_like_agrees_with_a_regular_expression(text, pattern_escape):
    pattern, escape = pattern_escape
    pieces = selector_eval.like_pieces(pattern, escape)
    assert selector_eval.like_matches(text, pieces) == model_like(text, pattern, escape)


ODD_VALUES = st.one_of(st.floats(), st.integers(0, 2 ** 64 - 1), st.binary(max_size=2), st.just([1]), st.just({}))


@settings(max_examples=300, deadline=None)
@given(tree=TREES, fields=st.dictionaries(st.sampled_from(NAMES), st.one_of(PROPERTY_VALUES, ODD_VALUES)))
def test_evaluation_never_raises_whatever_the_properties_hold(tree, fields):
    assert compile_selector(render(tree)).evaluate(fields) in (True, False, None)
