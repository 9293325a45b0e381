"""Reading a JMS message selector's tokens (node.core.dispatch.selector_tokens) into a tree: a recursive-descent parser.

Rules:
- The grammar is the JMS 2.0 message selector language (javax.jms.Message, "Message Selectors"):
  literals, identifiers, parentheses, NOT/AND/OR, the six comparisons, + - * / and unary signs,
  [NOT] BETWEEN, [NOT] IN (string literals), [NOT] LIKE ... [ESCAPE ...], IS [NOT] NULL. Keywords are
  case-insensitive; identifiers are case-sensitive and follow Java's identifier rules.
- Precedence, loosest first: OR, AND, NOT, the comparisons and predicates, binary + -, * /, unary + -.
- The tree is plain tuples, `(kind, offset, ...)`, offset being where the node starts in the text, so
  an error can say where. AND, OR and chains of + - or * / are flat lists, not left-deep trees: a long
  chain adds no depth, so neither this parser nor the compiled closures recurse along it.
- Depth is counted where the grammar nests (an opening parenthesis, NOT, a unary sign) and refused past
  `depth_max` before Python's own stack could be reached: never a RecursionError.
- Every refusal is `SelectorSyntaxError(offset, problem)`; the caller (node.core.dispatch.selector) words it.
- A tree that can only be wrong at run time for every message is refused here: arithmetic on a string
  or boolean literal, or a number or string where a condition must stand (`1 AND x`, `'abc'`).
  Comparing a string literal with a number is left to the evaluator: it is FALSE, as JMS says.
"""

from __future__ import annotations

from node.core.dispatch.selector_tokens import LONG_MAX, LONG_MIN, SelectorSyntaxError, describe, quoted, tokenize

COMPARISONS = frozenset({"=", "<>", "<", "<=", ">", ">="})
CONDITION_KINDS = frozenset({"compare", "and", "or", "not", "between", "in", "like", "is_null", "field"})


class Parser:
    """One use: `Parser(text, depth_max).parse()` gives the tree of a whole selector."""

    def __init__(self, text: str, depth_max: int):
        self.tokens = tokenize(text)
        self.index = 0
        self.depth = 0
        self.depth_max = depth_max

    def parse(self) -> tuple:
        node = self._condition(self._logic(0))
        token = self.tokens[self.index]
        if token[0] != "end":
            raise SelectorSyntaxError(token[2], f"expected AND, OR or the end of the selector, got {describe(token)}")
        return node

    # ---- tokens ------------------------------------------------------------------------------

    def _peek_keyword(self, *words: str) -> bool:
        kind, value, _ = self.tokens[self.index]
        return kind == "keyword" and value in words

    def _peek_symbol(self, *symbols: str) -> bool:
        kind, value, _ = self.tokens[self.index]
        return kind == "symbol" and value in symbols

    def _take(self) -> tuple:
        token = self.tokens[self.index]
        self.index += 1
        return token

    def _expect(self, kind: str, value, wanted: str, after: str) -> tuple:
        token = self.tokens[self.index]
        if token[0] != kind or (value is not None and token[1] != value):
            raise SelectorSyntaxError(token[2], f"expected {wanted} after {after}, got {describe(token)}")
        self.index += 1
        return token

    def _enter(self, offset: int) -> None:
        self.depth += 1
        if self.depth > self.depth_max:
            raise SelectorSyntaxError(offset, f"the selector nests deeper than {self.depth_max} levels "
                                              f"(parentheses, NOT, signs): write it flatter")

    # ---- conditions --------------------------------------------------------------------------

    def _logic(self, level: int) -> tuple:
        """OR (level 0) over AND (level 1) over NOT: one method, so a nesting level costs few stack frames."""
        word, kind = ("OR", "or") if level == 0 else ("AND", "and")
        first = self._logic(1) if level == 0 else self._not()
        if not self._peek_keyword(word):
            return first
        operands = [self._condition(first)]
        while self._peek_keyword(word):
            self._take()
            self._expect_condition(word)
            operands.append(self._condition(self._logic(1) if level == 0 else self._not()))
        return (kind, first[1], operands)

    def _not(self) -> tuple:
        if not self._peek_keyword("NOT"):
            return self._predicate()
        token = self._take()
        self._enter(token[2])
        self._expect_condition("NOT")
        operand = self._condition(self._not())
        self.depth -= 1
        return ("not", token[2], operand)

    def _expect_condition(self, after: str) -> None:
        token = self.tokens[self.index]
        if not (self._starts_value(token) or (token[0] == "keyword" and token[1] == "NOT")):
            raise SelectorSyntaxError(token[2], f"expected a condition after {after}, got {describe(token)}")

    @staticmethod
    def _condition(node: tuple) -> tuple:
        """`node` where a condition must stand: refuse what can never be TRUE or FALSE."""
        if node[0] in CONDITION_KINDS or (node[0] == "literal" and (node[2] is None or isinstance(node[2], bool))):
            return node
        raise SelectorSyntaxError(node[1], f"expected a condition (a comparison, a boolean property, TRUE or "
                                           f"FALSE), got {_node_name(node)}")

    def _predicate(self) -> tuple:
        left = self._value()
        kind, value, _ = self.tokens[self.index]
        if kind == "symbol" and value in COMPARISONS:
            self._take()
            return ("compare", left[1], value, left, self._value_after(f"'{value}'"))
        negated = False
        if kind == "keyword" and value == "NOT":
            following = self.tokens[self.index + 1]
            if not (following[0] == "keyword" and following[1] in ("BETWEEN", "IN", "LIKE")):
                raise SelectorSyntaxError(following[2], f"expected BETWEEN, IN or LIKE after NOT, "
                                                        f"got {describe(following)}")
            self._take()
            negated = True
            kind, value, _ = self._take()
        elif kind == "keyword" and value in ("BETWEEN", "IN", "LIKE", "IS"):
            self._take()
        else:
            return left
        if value == "BETWEEN":
            low = self._value_after("BETWEEN")
            self._expect("keyword", "AND", "AND", "BETWEEN's lower bound")
            return ("between", left[1], negated, left, low, self._value_after("BETWEEN ... AND"))
        if value == "IN":
            return ("in", left[1], negated, left, self._string_list())
        if value == "LIKE":
            return self._like(left, negated)
        is_not = self._peek_keyword("NOT")
        if is_not:
            self._take()
        self._expect("keyword", "NULL", "NULL", "IS NOT" if is_not else "IS")
        return ("is_null", left[1], is_not, left)

    def _string_list(self) -> frozenset:
        self._expect("symbol", "(", "'('", "IN")
        strings = [self._expect("string", None, "a string literal", "IN (")[1]]
        while self._peek_symbol(","):
            self._take()
            strings.append(self._expect("string", None, "a string literal", "',' in IN (...)")[1])
        self._expect("symbol", ")", "',' or ')'", "a string in IN (...)")
        return frozenset(strings)

    def _like(self, left: tuple, negated: bool) -> tuple:
        pattern_token = self._expect("string", None, "a string literal (the pattern)", "LIKE")
        pattern = pattern_token[1]
        escape = None
        if self._peek_keyword("ESCAPE"):
            self._take()
            token = self._expect("string", None, "a string literal of one character", "ESCAPE")
            escape = token[1]
            if len(escape) != 1:
                raise SelectorSyntaxError(token[2], f"the ESCAPE string must be one character, got {describe(token)}")
        if escape is not None and (len(pattern) - len(pattern.rstrip(escape))) % 2:
            raise SelectorSyntaxError(pattern_token[2], f"the LIKE pattern {quoted(pattern)} ends with its escape "
                                                      f"character '{escape}', which escapes nothing")
        return ("like", left[1], negated, left, pattern, escape)

    # ---- values ------------------------------------------------------------------------------

    def _value_after(self, after: str) -> tuple:
        token = self.tokens[self.index]
        if not self._starts_value(token):
            raise SelectorSyntaxError(token[2], f"expected a value after {after}, got {describe(token)}")
        return self._value()

    @staticmethod
    def _starts_value(token: tuple) -> bool:
        kind, value, _ = token
        return (kind in ("string", "number", "identifier") or (kind == "keyword" and value in ("TRUE", "FALSE", "NULL"))
                or (kind == "symbol" and value in ("(", "+", "-")))

    def _value(self) -> tuple:
        return self._arithmetic(0)

    def _arithmetic(self, level: int) -> tuple:
        """Binary + - (level 0) over * / (level 1) over the unary signs, as flat chains."""
        symbols = ("+", "-") if level == 0 else ("*", "/")
        operand = (lambda: self._arithmetic(1)) if level == 0 else self._unary
        first = self._arithmetic(1) if level == 0 else self._unary()
        if not self._peek_symbol(*symbols):
            return first
        rest = []
        while self._peek_symbol(*symbols):
            symbol = self._take()[1]
            rest.append((symbol, self._numeric(self._operand_after(operand, f"'{symbol}'"))))
        return ("arithmetic", first[1], self._numeric(first), rest)

    def _operand_after(self, operand, after: str) -> tuple:
        token = self.tokens[self.index]
        if not self._starts_value(token):
            raise SelectorSyntaxError(token[2], f"expected a value after {after}, got {describe(token)}")
        return operand()

    @staticmethod
    def _numeric(node: tuple) -> tuple:
        """`node` as an arithmetic operand: literals must be numbers; a property may hold anything."""
        if node[0] in ("field", "arithmetic", "negate", "plus") or (node[0] == "literal" and _is_number(node[2])):
            return node
        raise SelectorSyntaxError(node[1], f"arithmetic needs numbers, got {_node_name(node)}")

    def _unary(self) -> tuple:
        if not self._peek_symbol("+", "-"):
            return self._primary()
        _, sign, offset = self._take()
        token = self.tokens[self.index]
        if token[0] == "number" and sign == "-":  # a negative literal: -9223372036854775808 fits a long
            self._take()
            return ("literal", offset, self._in_range(-token[1], offset))
        self._enter(offset)
        operand = self._numeric(self._operand_after(self._unary, f"'{sign}'"))
        self.depth -= 1
        return ("negate", offset, operand) if sign == "-" else ("plus", offset, operand)

    def _primary(self) -> tuple:
        kind, value, offset = token = self._take()
        if kind == "string":
            return ("literal", offset, value)
        if kind == "number":
            return ("literal", offset, self._in_range(value, offset))
        if kind == "keyword" and value in ("TRUE", "FALSE", "NULL"):
            return ("literal", offset, {"TRUE": True, "FALSE": False, "NULL": None}[value])
        if kind == "identifier":
            return ("field", offset, value)
        if kind == "symbol" and value == "(":
            self._enter(offset)
            node = self._logic(0)
            self._expect("symbol", ")", "')'", f"the expression opened at {offset}")
            self.depth -= 1
            return node
        raise SelectorSyntaxError(offset, f"expected a value, got {describe(token)}")

    @staticmethod
    def _in_range(value, offset: int):
        if isinstance(value, int) and not LONG_MIN <= value <= LONG_MAX:
            raise SelectorSyntaxError(offset, f"{value} is beyond the range of a long (a JMS exact numeric)")
        return value


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _node_name(node: tuple) -> str:
    if node[0] == "literal":
        value = node[2]
        return f"string {quoted(value)}" if isinstance(value, str) else f"number {value!r}" if _is_number(value) \
            else {True: "TRUE", False: "FALSE", None: "NULL"}[value]
    return {"arithmetic": "an arithmetic expression", "negate": "a signed value", "plus": "a signed value"}.get(
        node[0], "a condition")
