"""A consumer's source filters at attach: which the node applies, and what its attach answers.

Engine loop thread only. Rules:
- The one filter applied is the JMS selector: a filter-set entry whose value is described by
  `apache.org:selector-filter:string` (or its code 0x0000468C00000004) and holds a string. It is compiled
  here (node.core.dispatch.selector); one that does not compile raises InvalidSelector, an InvalidField
  whose description says at which character and what is wrong, and the attach is refused with it.
  An empty selector is no selector (JMS): nothing applied, nothing echoed.
- The node's attach echoes exactly the filters it applies, under the client's key and descriptor (a
  symbol stays a symbol, a code a code); every other entry is left out (AMQP 1.0, 3.5.8), so a client
  learns which filters hold (Qpid JMS refuses a consumer whose selector is not echoed).
- Reading stops after FILTER_ENTRIES_READ_MAX entries: a longer filter set is read no further.
- Issue 30, consumer-chosen groups: the Service Bus session filter (key `com.microsoft:session-filter`,
  described by that symbol or its code 0x000001370000000C, or a plain entry under that key) holding a
  group id makes the consumer that group's, exactly as the selector `JMSXGroupID = 'X'` does
  (node/core/dispatch/selector_dispatch.py). Holding null it asks for the next free group: the one whose
  head is oldest among those with a message and no consumer (Queue.next_free_group, `resolve_next_free`);
  none is an attach refused with amqp:not-found saying so. Either way the node's attach answers the filter
  with the group id the consumer got. With a session filter, a JMS selector of the same attach is not
  applied and so not echoed (one filter is applied; the group is the one the client asked for).
"""

from __future__ import annotations

from node.amqp.engine import ffi, lib
from node.core.dispatch.selector import InvalidSelector, compile_selector
from node.core.errors import NotFound

SELECTOR_FILTER = "apache.org:selector-filter:string"
SELECTOR_FILTER_CODE = 0x0000468C00000004  # the same descriptor as a code (Apache's 0x468C domain, 4)
FILTER_ENTRIES_READ_MAX = 16  # filter-set entries read from one source
SESSION_FILTER = "com.microsoft:session-filter"  # issue 30: Service Bus sessions, a group here
SESSION_FILTER_CODE = 0x000001370000000C  # its descriptor as a code (Microsoft's 0x137 domain, 0xC)
UNREADABLE = object()  # a filter value neither null nor a string, symbol or ulong


class AppliedSelector:
    """A selector the node applies, and how the client named it, to answer with the same names."""

    __slots__ = ("key", "descriptor", "selector", "echoed", "next_free")

    def __init__(self, key: str, descriptor, selector, echoed: str | None = None, next_free: bool = False):
        self.key = key
        self.descriptor = descriptor  # str (symbol), int (code), or None: a plain entry (a session filter's)
        self.selector = selector  # node.core.dispatch.selector.Selector; None while `next_free` waits for a group
        self.echoed = selector.text if echoed is None and selector is not None else echoed  # the answer's value
        self.next_free = next_free  # a null session filter: the group is chosen by resolve_next_free


def applied_selector(filter_set) -> AppliedSelector | None:
    """The selector of a remote source's filter set (a pn_data_t), compiled; None when it has none (or an
    empty one). Raises InvalidSelector when it does not compile."""
    entries = list(_described_entries(filter_set))
    for key, descriptor, value in entries:  # issue 30: a session filter first
        if key == SESSION_FILTER and descriptor in (SESSION_FILTER, SESSION_FILTER_CODE, None):
            return session_filter(key, descriptor, value)
    for key, descriptor, value in entries:
        if descriptor is None:
            continue
        if descriptor != SELECTOR_FILTER and descriptor != SELECTOR_FILTER_CODE:
            continue
        if not isinstance(value, str):
            raise InvalidSelector(0, f"the selector filter {key!r} must hold a string, got "
                                     f"{'no value' if value is None else 'another type'}")
        selector = compile_selector(value)
        return None if selector is None else AppliedSelector(key, descriptor, selector)
    return None


def session_filter(key: str, descriptor, value) -> AppliedSelector:
    """A session filter naming group `value` (the selector `JMSXGroupID = 'value'`), or asking for the next
    free group (null). Raises InvalidSelector for any other value."""
    if value is None:
        return AppliedSelector(key, descriptor, None, next_free=True)
    if not isinstance(value, str) or not value:
        raise InvalidSelector(0, f"the session filter {key!r} must hold a group id (a string) or null for the "
                                 f"next free group, got {'an empty string' if value == '' else 'another type'}")
    return for_group(AppliedSelector(key, descriptor, None), value)


def for_group(applied: AppliedSelector, group_id: str) -> AppliedSelector:
    selector = compile_selector("JMSXGroupID = '" + group_id.replace("'", "''") + "'")
    return AppliedSelector(applied.key, applied.descriptor, selector, echoed=group_id)


def resolve_next_free(applied: AppliedSelector | None, queue) -> AppliedSelector | None:
    """A null session filter made concrete: the queue's next free group, or NotFound when it has none."""
    if applied is None or not applied.next_free:
        return applied
    group_id = queue.next_free_group()
    if group_id is None:
        raise NotFound(f"queue {queue.settings.name!r} has no group with a message waiting and no consumer (a "
                       f"null {SESSION_FILTER} asks for one): attach again later, or name a group")
    return for_group(applied, group_id)


def echo(filter_set, applied: AppliedSelector | None) -> None:
    """Make a local source's filter set (a pn_data_t) hold exactly the applied selector, or nothing."""
    lib.pn_data_clear(filter_set)
    if applied is None:
        return
    lib.pn_data_put_map(filter_set)
    lib.pn_data_enter(filter_set)
    lib.pn_data_put_symbol(filter_set, _bytes(applied.key))
    if applied.descriptor is None:  # a plain entry (a session filter sent so): answered so
        lib.pn_data_put_string(filter_set, _bytes(applied.echoed))
        lib.pn_data_exit(filter_set)
        return
    lib.pn_data_put_described(filter_set)
    lib.pn_data_enter(filter_set)
    if isinstance(applied.descriptor, int):
        lib.pn_data_put_ulong(filter_set, applied.descriptor)
    else:
        lib.pn_data_put_symbol(filter_set, _bytes(applied.descriptor))
    lib.pn_data_put_string(filter_set, _bytes(applied.echoed))
    lib.pn_data_exit(filter_set)
    lib.pn_data_exit(filter_set)


def _bytes(value: str):
    encoded = value.encode("utf-8")
    return (len(encoded), ffi.from_buffer(encoded))  # a pn_bytes_t; proton copies it


def _described_entries(data):
    """(key, descriptor, value) of a filter set's described entries; value None unless a string."""
    lib.pn_data_rewind(data)
    if not lib.pn_data_next(data) or lib.pn_data_type(data) != lib.PN_MAP:
        return
    lib.pn_data_enter(data)
    try:
        for _ in range(FILTER_ENTRIES_READ_MAX):
            if not lib.pn_data_next(data):
                return
            key = _scalar(data)
            if not lib.pn_data_next(data):
                return
            if lib.pn_data_type(data) != lib.PN_DESCRIBED:  # a plain entry: descriptor None (issue 30)
                yield (key if isinstance(key, str) else ""), None, _value(data)
                continue
            lib.pn_data_enter(data)
            descriptor = _scalar(data) if lib.pn_data_next(data) else None
            value = _value(data) if lib.pn_data_next(data) else None
            lib.pn_data_exit(data)
            yield (key if isinstance(key, str) else ""), descriptor, value
    finally:
        lib.pn_data_exit(data)


def _value(data):
    """A filter's value: a string, symbol or ulong as _scalar reads it, None for null, else UNREADABLE."""
    value = _scalar(data)
    if value is None and lib.pn_data_type(data) != lib.PN_NULL:
        return UNREADABLE
    return value


def _scalar(data):
    kind = lib.pn_data_type(data)
    if kind == lib.PN_SYMBOL:
        value = lib.pn_data_get_symbol(data)
    elif kind == lib.PN_STRING:
        value = lib.pn_data_get_string(data)
    elif kind == lib.PN_ULONG:
        return lib.pn_data_get_ulong(data)
    else:
        return None
    return ffi.unpack(value.start, value.size).decode("utf-8", "replace")
