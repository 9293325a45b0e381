"""Compiling a selector's tree (node.core.dispatch.selector_parse) into nested Python closures, and what they compute.

Rules:
- Compiled once per selector; a message costs one call per tree node, no parsing and no eval/exec.
  A closure takes the message's fields (anything with `get(name)`, None for absent) and returns a
  value: a string, an int, a float, a bool or None. None is SQL's NULL, and in a condition UNKNOWN.
- Three-valued logic as SQL-92 and JMS define it: FALSE AND anything is FALSE, TRUE OR anything is
  TRUE, otherwise UNKNOWN wins over TRUE (AND) or FALSE (OR); NOT UNKNOWN is UNKNOWN. A value that is
  not a boolean where a condition stands (a string property used as `s AND ...`) counts as UNKNOWN.
- Types as JMS says: numbers (int and float, never bool) compare with numbers; strings and booleans
  only with their own kind and only by = and <>. Comparing unlike types, both non-NULL, is FALSE,
  whatever the operator ("the value of the operation is false"); a NULL operand makes it UNKNOWN.
  A property of a type JMS has no name for (binary, a list, a map, a UUID) is unlike everything.
- [NOT] IN and [NOT] BETWEEN are what JMS defines them as: IN is an OR of =, NOT IN its NOT (so a
  number is NOT IN any list of strings); BETWEEN is `>= AND <=`, NOT BETWEEN is `< OR >`. NOT LIKE is
  NOT (LIKE); LIKE of a non-string is FALSE.
- Arithmetic never raises: a NULL or non-number operand, division by zero, or an exact result outside
  a Java long gives NULL. Exact division truncates toward zero, as Java's does.
- LIKE matches without regular expressions: the pattern is cut at its unescaped '%' into pieces
  matched left to right, leftmost first, so a hostile pattern costs at most pattern x text steps
  (a backtracking regex could cost text ** pieces).
"""

from __future__ import annotations

import operator

from node.core.dispatch.selector_parse import LONG_MAX, LONG_MIN

_COMPARE = {"=": operator.eq, "<>": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
            ">=": operator.ge}
_EQUALITY = frozenset({"=", "<>"})


def _is_number(value) -> bool:
    cls = value.__class__
    return cls is int or cls is float or (isinstance(value, (int, float)) and not isinstance(value, bool))


def compare(symbol: str, left, right):
    if left is None or right is None:
        return None
    if _is_number(left):
        return _COMPARE[symbol](left, right) if _is_number(right) else False
    if symbol in _EQUALITY and ((isinstance(left, str) and isinstance(right, str))
                                or (isinstance(left, bool) and isinstance(right, bool))):
        return _COMPARE[symbol](left, right)
    return False


def _exact(value):
    """An exact result kept only within a Java long; a float as it is."""
    if value.__class__ is int and not LONG_MIN <= value <= LONG_MAX:
        return None
    return value


def _add(left, right):
    return _exact(left + right) if _is_number(left) and _is_number(right) else None


def _subtract(left, right):
    return _exact(left - right) if _is_number(left) and _is_number(right) else None


def _multiply(left, right):
    return _exact(left * right) if _is_number(left) and _is_number(right) else None


def _divide(left, right):
    if not (_is_number(left) and _is_number(right)) or right == 0:
        return None
    if isinstance(left, int) and isinstance(right, int):
        quotient = abs(left) // abs(right)
        return _exact(quotient if (left < 0) == (right < 0) else -quotient)
    return left / right


ARITHMETIC = {"+": _add, "-": _subtract, "*": _multiply, "/": _divide}


def like_pieces(pattern: str, escape: str | None) -> list[list]:
    """The pattern cut at its unescaped '%': each piece a list of characters, None standing for '_'."""
    pieces, piece, position = [], [], 0
    while position < len(pattern):
        character = pattern[position]
        if character == escape:  # the parser refused a pattern ending in an escape
            piece.append(pattern[position + 1])
            position += 2
            continue
        if character == "%":
            pieces.append(piece)
            piece = []
        else:
            piece.append(None if character == "_" else character)
        position += 1
    pieces.append(piece)
    return pieces


def _piece_at(text: str, piece: list, start: int) -> bool:
    return all(want is None or text[start + index] == want for index, want in enumerate(piece))


def _find_piece(text: str, piece: list, start: int, end: int) -> int:
    """The leftmost position >= start where `piece` matches within text[:end], or -1."""
    if None not in piece:
        return text.find("".join(piece), start, end)
    for position in range(start, end - len(piece) + 1):
        if _piece_at(text, piece, position):
            return position
    return -1


def like_matches(text: str, pieces: list[list]) -> bool:
    first, last = pieces[0], pieces[-1]
    if len(pieces) == 1:
        return len(text) == len(first) and _piece_at(text, first, 0)
    if len(text) < len(first) + len(last) or not _piece_at(text, first, 0):
        return False
    position, end = len(first), len(text) - len(last)
    for piece in pieces[1:-1]:
        found = _find_piece(text, piece, position, end)
        if found < 0:
            return False
        position = found + len(piece)
    return _piece_at(text, last, end)


def compile_node(node: tuple):
    """The closure computing `node`'s value from a message's fields."""
    return _COMPILERS[node[0]](node)


def _literal(node):
    value = node[2]
    return lambda fields: value


def _field(node):
    name = node[2]
    return lambda fields: fields.get(name)


def _compare_node(node):
    _, _, symbol, left_node, right_node = node
    left, right = compile_node(left_node), compile_node(right_node)
    if right_node[0] == "literal" and left_node[0] == "field" and right_node[2] is not None:
        name, constant = left_node[2], right_node[2]  # the common case, `colour = 'blue'`: one call, not three
        return lambda fields: compare(symbol, fields.get(name), constant)
    return lambda fields: compare(symbol, left(fields), right(fields))


def _arithmetic(node):
    _, _, first_node, rest_nodes = node
    first = compile_node(first_node)
    rest = [(ARITHMETIC[symbol], compile_node(operand)) for symbol, operand in rest_nodes]

    def arithmetic(fields):
        value = first(fields)
        for apply, operand in rest:
            value = apply(value, operand(fields))
            if value is None:
                return None
        return value
    return arithmetic


def _sign(node):
    operand = compile_node(node[2])
    negative = node[0] == "negate"

    def sign(fields):
        value = operand(fields)
        if not _is_number(value):
            return None
        return _exact(-value) if negative else value
    return sign


def _connective(node):
    """AND and OR: FALSE decides an AND and TRUE an OR; else UNKNOWN (or a non-boolean) beats the rest."""
    operands = [compile_node(operand) for operand in node[2]]
    decisive = node[0] == "or"
    neutral = not decisive

    def connective(fields):
        result = neutral
        for operand in operands:
            value = operand(fields)
            if value is decisive:
                return decisive
            if value is not neutral:
                result = None
        return result
    return connective


def _not(node):
    operand = compile_node(node[2])

    def negation(fields):
        value = operand(fields)
        return (not value) if value is True or value is False else None
    return negation


def _between(node):
    _, _, negated, value_node, low_node, high_node = node
    value, low, high = compile_node(value_node), compile_node(low_node), compile_node(high_node)
    if negated:  # JMS: e1 NOT BETWEEN e2 AND e3 is e1 < e2 OR e1 > e3
        def outside(fields):
            checked = value(fields)
            below, above = compare("<", checked, low(fields)), compare(">", checked, high(fields))
            return True if below is True or above is True else None if below is None or above is None else False
        return outside

    def between(fields):  # e1 >= e2 AND e1 <= e3
        checked = value(fields)
        lower, upper = compare(">=", checked, low(fields)), compare("<=", checked, high(fields))
        return False if lower is False or upper is False else None if lower is None or upper is None else True
    return between


def _in(node):
    _, _, negated, value_node, strings = node
    value = compile_node(value_node)

    def member(fields):
        checked = value(fields)
        if checked is None:
            return None
        found = isinstance(checked, str) and checked in strings
        return found is not negated
    return member


def _like(node):
    _, _, negated, value_node, pattern, escape = node
    value, pieces = compile_node(value_node), like_pieces(pattern, escape)

    def like(fields):
        checked = value(fields)
        if checked is None:
            return None
        found = isinstance(checked, str) and like_matches(checked, pieces)
        return found is not negated
    return like


def _is_null(node):
    _, _, negated, value_node = node
    value = compile_node(value_node)
    if negated:
        return lambda fields: value(fields) is not None
    return lambda fields: value(fields) is None


_COMPILERS = {"literal": _literal, "field": _field, "compare": _compare_node, "arithmetic": _arithmetic,
              "negate": _sign, "plus": _sign, "and": _connective, "or": _connective, "not": _not, "between": _between,
              "in": _in, "like": _like, "is_null": _is_null}
