"""What a replicated command accepts from the cluster: exact builtin types, checked before any change.

A command applied on every replica must never raise (an exception would kill pysyncobj's tick thread)
and must store only plain builtins (its table is pickled into snapshots), so each command checks its
arguments with these and ignores, or answers None for, what fails. Exact types: a subclass of str would
put a custom class into the state, and bool, an int subclass, is no time or count.
Never imports pysyncobj, threading, time, random, socket, grpc or proton.
"""

from __future__ import annotations


def is_str(value) -> bool:
    return type(value) is str


def is_int(value) -> bool:
    return type(value) is int


def is_key(key) -> bool:
    """A route key: [queue, group] or (queue, group), both str."""
    return isinstance(key, (list, tuple)) and len(key) == 2 and is_str(key[0]) and is_str(key[1])
