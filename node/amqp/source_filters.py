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
"""

from __future__ import annotations

from node.amqp.engine import ffi, lib
from node.core.dispatch.selector import InvalidSelector, compile_selector

SELECTOR_FILTER = "apache.org:selector-filter:string"
SELECTOR_FILTER_CODE = 0x0000468C00000004  # the same descriptor as a code (Apache's 0x468C domain, 4)
FILTER_ENTRIES_READ_MAX = 16  # filter-set entries read from one source


class AppliedSelector:
    """A selector the node applies, and how the client named it, to answer with the same names."""

    __slots__ = ("key", "descriptor", "selector")

    def __init__(self, key: str, descriptor, selector):
        self.key = key
        self.descriptor = descriptor  # str (symbol) or int (code)
        self.selector = selector  # node.core.dispatch.selector.Selector


def applied_selector(filter_set) -> AppliedSelector | None:
    """The selector of a remote source's filter set (a pn_data_t), compiled; None when it has none (or an
    empty one). Raises InvalidSelector when it does not compile."""
    for key, descriptor, value in _described_entries(filter_set):
        if descriptor != SELECTOR_FILTER and descriptor != SELECTOR_FILTER_CODE:
            continue
        if not isinstance(value, str):
            raise InvalidSelector(0, f"the selector filter {key!r} must hold a string, got "
                                     f"{'no value' if value is None else 'another type'}")
        selector = compile_selector(value)
        return None if selector is None else AppliedSelector(key, descriptor, selector)
    return None


def echo(filter_set, applied: AppliedSelector | None) -> None:
    """Make a local source's filter set (a pn_data_t) hold exactly the applied selector, or nothing."""
    lib.pn_data_clear(filter_set)
    if applied is None:
        return
    lib.pn_data_put_map(filter_set)
    lib.pn_data_enter(filter_set)
    lib.pn_data_put_symbol(filter_set, _bytes(applied.key))
    lib.pn_data_put_described(filter_set)
    lib.pn_data_enter(filter_set)
    if isinstance(applied.descriptor, int):
        lib.pn_data_put_ulong(filter_set, applied.descriptor)
    else:
        lib.pn_data_put_symbol(filter_set, _bytes(applied.descriptor))
    lib.pn_data_put_string(filter_set, _bytes(applied.selector.text))
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
            if lib.pn_data_type(data) != lib.PN_DESCRIBED:
                continue
            lib.pn_data_enter(data)
            descriptor = _scalar(data) if lib.pn_data_next(data) else None
            value = _scalar(data) if lib.pn_data_next(data) else None
            lib.pn_data_exit(data)
            yield (key if isinstance(key, str) else ""), descriptor, value
    finally:
        lib.pn_data_exit(data)


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
