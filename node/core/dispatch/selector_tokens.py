"""The tokens of a JMS message selector: literals, identifiers, keywords and symbols, each with its offset.

Rules:
- As javax.jms.Message's "Message Selectors" writes them: strings in single quotes ('' is one
  quote); exact numerics as Java long literals in decimal (no octal, no hex, no suffix); approximate
  numerics with a point and/or an exponent (7., .5, 95.7, 7E3, 1e+16); identifiers by Java's rules
  (a letter, '$' or '_' first), case-sensitive; the keywords NULL TRUE FALSE NOT AND OR BETWEEN LIKE IN
  IS ESCAPE case-insensitive, never identifiers.
- A token is (kind, value, offset): kind one of string, number, identifier, keyword (value upper-cased),
  symbol, end. Refusals are SelectorSyntaxError(offset, problem), worded for the client.
"""

from __future__ import annotations

import unicodedata

_DIGITS = frozenset("0123456789")  # ASCII: Python's isdigit() takes other scripts' digits, Java's literals do not
KEYWORDS = frozenset({"NULL", "TRUE", "FALSE", "NOT", "AND", "OR", "BETWEEN", "LIKE", "IN", "IS", "ESCAPE"})
_SYMBOLS = ("<>", "<=", ">=", "=", "<", ">", "+", "-", "*", "/", "(", ")", ",")
LONG_MIN, LONG_MAX = -(2 ** 63), 2 ** 63 - 1  # a JMS exact numeric is a Java long
_IDENTIFIER_START_CATEGORIES = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Nl", "Sc", "Pc"})  # isJavaIdentifierStart
_IDENTIFIER_PART_CATEGORIES = _IDENTIFIER_START_CATEGORIES | {"Nd", "Mn", "Mc"}  # ... and isJavaIdentifierPart


class SelectorSyntaxError(Exception):
    def __init__(self, offset: int, problem: str):
        super().__init__(f"at {offset}, {problem}")
        self.offset = offset
        self.problem = problem


def _is_identifier_start(character: str) -> bool:
    return character.isalpha() or character in "$_" or unicodedata.category(character) in _IDENTIFIER_START_CATEGORIES


def _is_identifier_part(character: str) -> bool:
    return character.isalnum() or character in "$_" or unicodedata.category(character) in _IDENTIFIER_PART_CATEGORIES


def tokenize(text: str) -> list[tuple]:
    """(kind, value, offset) per token, kind one of string, number, identifier, keyword, symbol, end."""
    tokens, position, end = [], 0, len(text)
    while position < end:
        character = text[position]
        if character.isspace():
            position += 1
        elif character == "'":
            start = position
            value, position = _string(text, position)
            tokens.append(("string", value, start))
        elif character in _DIGITS or (character == "." and text[position + 1:position + 2] in _DIGITS):
            start = position
            value, position = _number(text, position)
            tokens.append(("number", value, start))
        elif _is_identifier_start(character):
            start = position
            while position < end and _is_identifier_part(text[position]):
                position += 1
            word = text[start:position]
            upper = word.upper()
            keyword = upper in KEYWORDS and word.isascii()  # no Unicode case folding into a keyword ("ın" is not IN)
            tokens.append(("keyword", upper, start) if keyword else ("identifier", word, start))
        else:
            symbol = next((s for s in _SYMBOLS if text.startswith(s, position)), None)
            if symbol is None:
                hint = "; write <> for 'not equal'" if text.startswith("!=", position) else ""
                if character == '"':
                    hint = "; strings take single quotes ('...')"
                elif character == ".":
                    hint = "; a JMS identifier cannot hold a dot"
                raise SelectorSyntaxError(position, f"unexpected character {character!r}{hint}")
            tokens.append(("symbol", symbol, position))
            position += len(symbol)
    tokens.append(("end", None, end))
    return tokens


def _string(text: str, start: int) -> tuple[str, int]:
    """The literal opening at `start` ('' stands for one quote) and the position past its closing quote."""
    pieces, position = [], start + 1
    while True:
        close = text.find("'", position)
        if close < 0:
            raise SelectorSyntaxError(start, "a string that is never closed: end it with '")
        pieces.append(text[position:close])
        if text.startswith("''", close):
            pieces.append("'")
            position = close + 2
        else:
            return "".join(pieces), close + 1


def _number(text: str, start: int) -> tuple[int | float, int]:
    position, end = start, len(text)
    while position < end and text[position] in _DIGITS:
        position += 1
    approximate = False
    if position < end and text[position] == ".":
        approximate = True
        position += 1
        while position < end and text[position] in _DIGITS:
            position += 1
    if position < end and text[position] in "eE":
        exponent = position + 1
        if exponent < end and text[exponent] in "+-":
            exponent += 1
        if exponent < end and text[exponent] in _DIGITS:
            approximate = True
            position = exponent
            while position < end and text[position] in _DIGITS:
                position += 1
    if position < end and _is_identifier_part(text[position]):
        raise SelectorSyntaxError(position, f"a number runs into {text[position]!r}: put a space or an operator "
                                            f"between")
    literal = text[start:position]
    if approximate:
        value = float(literal)
        if value in (float("inf"), float("-inf")):
            raise SelectorSyntaxError(start, f"{literal} is beyond the range of a double")
        return value, position
    if len(literal) > 1 and literal.startswith("0"):
        raise SelectorSyntaxError(start, f"{literal} has a leading 0, which Java reads as octal: write it without")
    return int(literal), position


def describe(token: tuple) -> str:
    kind, value, _ = token
    if kind == "end":
        return "end of text"
    if kind == "string":
        return f"string {quoted(value)}"
    if kind == "number":
        return f"number {value!r}"
    if kind == "identifier":
        return f"identifier {value}"
    return f"'{value}'"


def quoted(value: str) -> str:
    shown = value if len(value) <= 20 else value[:20] + "..."
    return "'" + shown.replace("'", "''") + "'"
