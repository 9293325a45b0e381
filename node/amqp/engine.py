"""proton's C engine, reached through the cffi module python-qpid-proton ships: the one module that names it.

Rules:
- `cproton_ffi` is the binding's internal module, not a public API. Its names follow proton's C API,
  which has been stable for years, but its import path moved on proton's main branch: every use of
  it goes through `lib` and `ffi` here, and pyproject pins the binding's version range.
- A cffi call costs about 0.1 us; a proton Python wrapper object costs several. Callers keep raw
  pointers (cdata, hashable by address) and never build proton's Python classes on the message path.
- Pointers are only valid while proton holds the object. Whoever frees an endpoint (link, session,
  connection) forgets it in its own tables first: proton may hand the same address to a new object.
"""

from __future__ import annotations

try:
    from proton import _cproton_ffi as _binding  # the name on proton's main branch, if it lands there
except ImportError:  # python-qpid-proton 0.39-0.40: a top-level module
    import cproton_ffi as _binding

lib = _binding.lib
ffi = _binding.ffi
NULL = ffi.NULL

# event types the engine loop acts on
CONNECTION_REMOTE_OPEN = lib.PN_CONNECTION_REMOTE_OPEN
CONNECTION_REMOTE_CLOSE = lib.PN_CONNECTION_REMOTE_CLOSE
SESSION_REMOTE_OPEN = lib.PN_SESSION_REMOTE_OPEN
SESSION_REMOTE_CLOSE = lib.PN_SESSION_REMOTE_CLOSE
LINK_REMOTE_OPEN = lib.PN_LINK_REMOTE_OPEN
LINK_REMOTE_CLOSE = lib.PN_LINK_REMOTE_CLOSE
LINK_REMOTE_DETACH = lib.PN_LINK_REMOTE_DETACH
LINK_FLOW = lib.PN_LINK_FLOW
DELIVERY = lib.PN_DELIVERY
TRANSPORT = lib.PN_TRANSPORT
TRANSPORT_ERROR = lib.PN_TRANSPORT_ERROR
TRANSPORT_CLOSED = lib.PN_TRANSPORT_CLOSED

# endpoint states
LOCAL_UNINIT = lib.PN_LOCAL_UNINIT
LOCAL_ACTIVE = lib.PN_LOCAL_ACTIVE
LOCAL_CLOSED = lib.PN_LOCAL_CLOSED

# delivery outcomes
ACCEPTED = lib.PN_ACCEPTED
REJECTED = lib.PN_REJECTED
RELEASED = lib.PN_RELEASED
MODIFIED = lib.PN_MODIFIED

EOS = lib.PN_EOS


def text(pointer) -> str | None:
    """A C string proton owns, as Python text; None for NULL."""
    if pointer == NULL:
        return None
    return ffi.string(pointer).decode("utf-8", "replace")


def terminus_present(terminus) -> bool:
    """A link's remote source or target: False for a null one (a refused link, AMQP 1.0 2.6.3), which
    proton shows as a terminus of type PN_UNSPECIFIED, never as a NULL pointer."""
    return lib.pn_terminus_get_type(terminus) != lib.PN_UNSPECIFIED


def set_condition(condition, name: str, description: str) -> None:
    lib.pn_condition_set_name(condition, name.encode())
    lib.pn_condition_set_description(condition, description.encode())


def condition_text(condition) -> str:
    """'name: description' of a condition proton holds, '' when none is set."""
    if condition == NULL or not lib.pn_condition_is_set(condition):
        return ""
    name = text(lib.pn_condition_get_name(condition)) or ""
    description = text(lib.pn_condition_get_description(condition)) or ""
    return f"{name}: {description}" if description else name


def delivery_tag(value: int):
    """A delivery tag for pn_delivery: the decimal digits of an int (what the core calls a delivery id)."""
    encoded = str(value).encode()
    return (len(encoded), ffi.from_buffer(encoded))


def tag_value(delivery) -> bytes:
    tag = lib.pn_delivery_tag(delivery)
    return ffi.unpack(tag.start, tag.size)


SYMBOLS_READ_MAX = 64  # symbols read from one terminus's capabilities; a longer list is read no further


def symbols(data) -> list[str]:
    """The symbols of a pn_data_t holding one symbol or an array of them (a terminus's capabilities)."""
    found: list[str] = []
    lib.pn_data_rewind(data)
    if not lib.pn_data_next(data):
        return found
    kind = lib.pn_data_type(data)
    if kind == lib.PN_SYMBOL:
        found.append(_symbol(data))
    elif kind == lib.PN_ARRAY and lib.pn_data_get_array_type(data) == lib.PN_SYMBOL:
        lib.pn_data_enter(data)
        while len(found) < SYMBOLS_READ_MAX and lib.pn_data_next(data):
            found.append(_symbol(data))
        lib.pn_data_exit(data)
    return found


def _symbol(data) -> str:
    value = lib.pn_data_get_symbol(data)
    return ffi.unpack(value.start, value.size).decode("utf-8", "replace")
