"""JMS message selectors (`apache.org:selector-filter:string`): compile once at attach, test per message.

Rules:
- The language is JMS 2.0's (javax.jms.Message, "Message Selectors"), docs/selectors.md; parsing is
  node.core.dispatch.selector_parse, evaluation node.core.dispatch.selector_eval. A message is selected only when the
  selector is TRUE: FALSE and UNKNOWN (SQL's three-valued logic, NULL for an absent field) both pass it by.
- Pure: no I/O, no clock. A selector reads a message through a mapping-like view of its fields
  (`get(name)`, None when absent); node.amqp.message_fields reads that view from the AMQP bytes:
    application property NAME      application-properties[NAME]
    JMSXGroupID, JMSXGroupSeq      properties.group-id, group-sequence
    JMSMessageID, JMSCorrelationID properties.message-id, correlation-id, as Qpid JMS shows them:
                                   strings as they are, ulong/uuid/binary as 'ID:AMQP_ULONG:...' and so on
    JMSType                        message annotation x-opt-jms-type (Qpid JMS), else properties.subject
                                   (these five: else the application property of the same name)
    JMSPriority                    header.priority, 4 when absent (AMQP's default)
    JMSDeliveryMode                'PERSISTENT' when header.durable, else 'NON_PERSISTENT'
    JMSTimestamp, JMSExpiration    properties.creation-time, absolute-expiry-time (ms), 0 when absent
- Limits, each refused at compile with InvalidSelector: the text at most SELECTOR_MAX_CHARS characters;
  nesting (parentheses, NOT, signs) at most SELECTOR_DEPTH_MAX levels, checked before Python's stack
  is, so a hostile selector gets an answer, never a RecursionError (a caller already so deep that the
  allowed depth does not fit gets InvalidSelector too). Evaluation never raises.
- A malformed selector raises InvalidSelector (an InvalidField: the client's fault, amqp:invalid-field)
  saying at which character offset and what was expected, for the attach's refusal.
"""

from __future__ import annotations

from node.core.errors import InvalidField
from node.core.dispatch.selector_eval import compile_node
from node.core.dispatch.selector_parse import Parser, SelectorSyntaxError

SELECTOR_MAX_CHARS = 4096  # longer selectors are refused: the text is the client's, the parse is ours
SELECTOR_DEPTH_MAX = 64  # parentheses, NOT and signs nested; at most ~660 Python frames to parse, fewer to run


class InvalidSelector(InvalidField):
    """The client's selector cannot be compiled; `offset` is the character where the problem is."""

    def __init__(self, offset: int, problem: str):
        super().__init__(f"selector: at {offset}, {problem}")
        self.offset = offset


class Selector:
    """A compiled selector: `matches(fields)` for dispatch, `evaluate(fields)` for the three values.
    `group_id` is X when the selector is exactly `JMSXGroupID = 'X'` (either way round, parentheses
    allowed): issue 30's consumer-chosen group, which dispatch serves by giving that group to the consumer."""

    __slots__ = ("text", "_evaluate", "group_id")

    def __init__(self, text: str, evaluate, group_id: str | None = None):
        self.text = text
        self._evaluate = evaluate
        self.group_id = group_id

    def matches(self, fields) -> bool:
        return self._evaluate(fields) is True

    def evaluate(self, fields):
        """True, False, or None for UNKNOWN."""
        value = self._evaluate(fields)
        return value if value is True or value is False else None

    def __repr__(self) -> str:
        return f"Selector({self.text!r})"


def compile_selector(text: str) -> Selector | None:
    """The compiled selector, or None for an empty one: JMS reads an empty selector as no selector."""
    if not isinstance(text, str):
        raise InvalidSelector(0, f"a selector must be a string, got {type(text).__name__}")
    if len(text) > SELECTOR_MAX_CHARS:
        raise InvalidSelector(SELECTOR_MAX_CHARS, f"the selector is {len(text)} characters long; at most "
                                                  f"{SELECTOR_MAX_CHARS} (SELECTOR_MAX_CHARS) are accepted")
    if not text.strip():
        return None
    try:
        tree = Parser(text, SELECTOR_DEPTH_MAX).parse()
        return Selector(text, compile_node(tree), chosen_group(tree))
    except SelectorSyntaxError as error:
        raise InvalidSelector(error.offset, error.problem) from None
    except RecursionError:  # the deepest selector allowed needs ~660 frames; a caller already deep may lack them
        raise InvalidSelector(0, f"the selector nests too deeply for this node's stack: write it flatter "
                                 f"(at most {SELECTOR_DEPTH_MAX} levels are accepted)") from None


def chosen_group(tree: tuple) -> str | None:
    """X when the parsed selector is `JMSXGroupID = 'X'` or `'X' = JMSXGroupID`; else None."""
    if tree[0] != "compare" or tree[2] != "=":
        return None
    sides = {tree[3][0]: tree[3], tree[4][0]: tree[4]}
    field, literal = sides.get("field"), sides.get("literal")
    if field is None or literal is None or field[2] != "JMSXGroupID" or not isinstance(literal[2], str):
        return None
    return literal[2]
