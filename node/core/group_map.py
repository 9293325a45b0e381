"""A compact map of one queue's group ids to 64-bit numbers: how every node holds a million routes.

Both copies of the route table (the raft member's handler/route_table.py and the node's router,
node/core/cluster/routing.py) keep, per queue, group id -> one packed int. As a dict that costs ~127 bytes
a route, two thirds of it the str and int objects; every node holds every route twice, so a
million live routes did not fit 300 MB per node (docs/benchmarks.md, "Memory: routes").
Here a route is its group id's UTF-8 bytes, one separator byte and 8 bytes of value, about 30
bytes a route in all (bench/route_memory.py measures it).

Layout (linear hashing): buckets numbered 0..n-1; a group's bucket comes from crc32 of its bytes,
so the layout is the same in every process and every replica that applied the same operations.
A bucket is two bytes objects: its keys, SEPARATOR + (group bytes + SEPARATOR) per entry, and its
values, 8 bytes each (unsigned, little-endian) in the same order. SEPARATOR (0xFF) never occurs in
UTF-8, nor with "surrogatepass" (which lets any str in, lone surrogates included), so one find of
SEPARATOR + group + SEPARATOR locates an entry and a count of separators before it gives its index.
Rules:
- Lookups and changes are O(bucket): past ENTRIES_PER_BUCKET_MAX entries per bucket on average,
  one bucket is split (linear hashing), never the whole map at once, so no call stalls the raft
  tick thread or the engine loop on a rehash of a million routes.
- Buckets are never merged: after a burst the map keeps its bucket count (two list slots and two
  shared empty objects per emptied bucket: ~16 bytes per bucket, so ~1 byte per peak route).
- Values are ints in 0..VALUE_MAX; anything else raises ValueError naming it (the callers check
  cluster input before it gets here). Keys are str; reads of any other key find nothing, as a dict's do.
- `state()` is plain data (ints, lists of bytes) for a raft snapshot; `from_state` takes it back
  and checks its shape, raising ValueError on a malformed one.
Pure: never imports threading, time, socket, grpc, pysyncobj or proton.
"""

from __future__ import annotations

import struct
import sys
from array import array
from zlib import crc32

SEPARATOR = b"\xff"  # bounds every group id in a bucket's keys: never a byte of UTF-8
ENTRIES_PER_BUCKET_MAX = 16  # average entries per bucket before one is split; a bucket's keys ~300 bytes
VALUE_MAX = (1 << 64) - 1  # a value is 8 bytes, unsigned
_VALUE = struct.Struct("<Q")
_VALUE_BYTES = _VALUE.size
_unpack_from = _VALUE.unpack_from
_EMPTY_KEYS = SEPARATOR
_EMPTY_VALUES = b""
_BIG_ENDIAN = sys.byteorder == "big"
assert array("Q").itemsize == _VALUE_BYTES


def _encoded(group: str) -> bytes:
    return group.encode("utf-8", "surrogatepass")


def _ints(values: bytes) -> array:
    numbers = array("Q", values)
    if _BIG_ENDIAN:
        numbers.byteswap()
    return numbers


class GroupMap:
    """group id (str) -> int in 0..VALUE_MAX, packed (see the header); reads like a dict."""

    __slots__ = ("_keys", "_values", "_round_buckets", "_split", "_count")

    def __init__(self):
        self._keys: list[bytes] = [_EMPTY_KEYS]  # bucket -> its keys (see the header)
        self._values: list[bytes] = [_EMPTY_VALUES]  # bucket -> its values, 8 bytes per key, same order
        self._round_buckets = 1  # buckets when this round of splits began (a power of two)
        self._split = 0  # the next bucket to split; buckets below it are split already this round
        self._count = 0

    def _bucket(self, encoded: bytes) -> int:
        hashed = crc32(encoded)
        bucket = hashed & (self._round_buckets - 1)
        if bucket < self._split:
            bucket = hashed & (2 * self._round_buckets - 1)
        return bucket

    def _locate(self, encoded: bytes) -> tuple[int, int, int]:
        """(bucket, entry index or -1, offset of the entry's leading separator in the bucket's keys)."""
        bucket = self._bucket(encoded)
        keys = self._keys[bucket]
        offset = keys.find(SEPARATOR + encoded + SEPARATOR)
        return bucket, (-1 if offset < 0 else keys.count(SEPARATOR, 0, offset)), offset

    # ---- reads ---------------------------------------------------------------------------------

    def get(self, group: str, default=None):
        # _locate written out: the node routes every message through here
        if not isinstance(group, str):
            return default  # as a dict of str keys answers for None or any other key
        encoded = group.encode("utf-8", "surrogatepass")
        hashed = crc32(encoded)
        bucket = hashed & (self._round_buckets - 1)
        if bucket < self._split:
            bucket = hashed & (2 * self._round_buckets - 1)
        keys = self._keys[bucket]
        offset = keys.find(SEPARATOR + encoded + SEPARATOR)
        if offset < 0:
            return default
        return _unpack_from(self._values[bucket], keys.count(SEPARATOR, 0, offset) * _VALUE_BYTES)[0]

    def __getitem__(self, group: str) -> int:
        value = self.get(group)
        if value is None:
            raise KeyError(group)
        return value

    def __contains__(self, group) -> bool:
        return isinstance(group, str) and self._locate(_encoded(group))[1] >= 0

    def __len__(self) -> int:
        return self._count

    def __bool__(self) -> bool:
        return self._count > 0

    def __eq__(self, other) -> bool:  # the same entries in the same layout (replicas compare so)
        return type(other) is GroupMap and self.state() == other.state()

    __hash__ = None  # mutable

    def __repr__(self) -> str:
        return f"GroupMap({self.state()!r})"

    def items(self):
        """(group, value) of every entry, bucket by bucket (an order every replica shares)."""
        for keys, values in zip(self._keys, self._values):
            if values:
                yield from zip((key.decode("utf-8", "surrogatepass") for key in keys[1:-1].split(SEPARATOR)),
                               _ints(values))

    def __iter__(self):
        for group, _ in self.items():
            yield group

    def values(self):
        for values in self._values:
            if values:
                yield from _ints(values)

    def below(self, limit: int) -> list[tuple[str, int]]:
        """(group, value) of the entries whose value is below `limit`. A bucket's values are compared
        in C (its least value first), so only buckets holding such entries are decoded: an expiry scan
        of a million routes that finds nothing reads 16 MB of values and makes no objects per route."""
        found = []
        for keys, values in zip(self._keys, self._values):
            if values:
                numbers = _ints(values)
                if min(numbers) < limit:
                    groups = keys[1:-1].split(SEPARATOR)
                    found.extend((groups[index].decode("utf-8", "surrogatepass"), number)
                                 for index, number in enumerate(numbers) if number < limit)
        return found

    # ---- changes -------------------------------------------------------------------------------

    def __setitem__(self, group: str, value: int) -> None:
        if not isinstance(group, str):
            raise ValueError(f"a group id must be a str, got {type(group).__name__}: the caller checks its input")
        if type(value) is not int or not 0 <= value <= VALUE_MAX:
            raise ValueError(f"a group map holds ints 0..{VALUE_MAX}, got {value!r} for {group!r}: "
                             f"the caller checks its input")
        encoded = _encoded(group)
        bucket, index, _ = self._locate(encoded)
        values = self._values[bucket]
        if index >= 0:
            at = index * _VALUE_BYTES
            self._values[bucket] = values[:at] + _VALUE.pack(value) + values[at + _VALUE_BYTES:]
            return
        self._keys[bucket] += encoded + SEPARATOR
        self._values[bucket] = values + _VALUE.pack(value)
        self._count += 1
        if self._count > ENTRIES_PER_BUCKET_MAX * len(self._keys):
            self._split_one()

    def pop(self, group: str, default=None):
        if not isinstance(group, str):
            return default
        encoded = _encoded(group)
        bucket, index, offset = self._locate(encoded)
        if index < 0:
            return default
        keys, values = self._keys[bucket], self._values[bucket]
        at = index * _VALUE_BYTES
        value = _VALUE.unpack_from(values, at)[0]
        if len(values) == _VALUE_BYTES:  # the last one: share the empty objects
            self._keys[bucket], self._values[bucket] = _EMPTY_KEYS, _EMPTY_VALUES
        else:
            self._keys[bucket] = keys[:offset] + keys[offset + 1 + len(encoded):]
            self._values[bucket] = values[:at] + values[at + _VALUE_BYTES:]
        self._count -= 1
        return value

    def __delitem__(self, group: str) -> None:
        if self.pop(group, None) is None:
            raise KeyError(group)

    def _split_one(self) -> None:
        """Linear hashing: bucket `_split` shares its entries with the new bucket `_split + round`."""
        old = self._split
        keys, values = self._keys[old], self._values[old]
        wide_mask = 2 * self._round_buckets - 1
        stay_keys, stay_values, move_keys, move_values = [b""], [], [b""], []
        if values:
            for encoded, value in zip(keys[1:-1].split(SEPARATOR), _ints(values)):
                if crc32(encoded) & wide_mask == old:
                    stay_keys.append(encoded)
                    stay_values.append(value)
                else:
                    move_keys.append(encoded)
                    move_values.append(value)
        self._keys[old], self._values[old] = self._bucket_bytes(stay_keys, stay_values)
        moved = self._bucket_bytes(move_keys, move_values)
        self._keys.append(moved[0])
        self._values.append(moved[1])
        self._split += 1
        if self._split == self._round_buckets:
            self._round_buckets *= 2
            self._split = 0

    @staticmethod
    def _bucket_bytes(keys: list, values: list) -> tuple[bytes, bytes]:
        if not values:
            return _EMPTY_KEYS, _EMPTY_VALUES
        numbers = array("Q", values)
        if _BIG_ENDIAN:
            numbers.byteswap()
        keys.append(b"")
        return SEPARATOR.join(keys), numbers.tobytes()

    # ---- snapshots -----------------------------------------------------------------------------

    def state(self) -> list:
        """[round_buckets, split, count, keys, values] as plain data; the lists are shared, not copied
        (a raft snapshot pickles them at once, in a forked child)."""
        return [self._round_buckets, self._split, self._count, self._keys, self._values]

    @classmethod
    def from_state(cls, state) -> "GroupMap":
        try:
            round_buckets, split, count, keys, values = state
        except (TypeError, ValueError):
            raise ValueError(f"a group map's state is [round_buckets, split, count, keys, values], "
                             f"got {type(state).__name__}") from None
        if not (type(round_buckets) is int and round_buckets > 0 and round_buckets & (round_buckets - 1) == 0
                and type(split) is int and 0 <= split < round_buckets and type(keys) is list
                and type(values) is list and len(keys) == len(values) == round_buckets + split
                and all(type(blob) is bytes and len(blob) % _VALUE_BYTES == 0 for blob in values)
                and all(type(blob) is bytes and blob[:1] == blob[-1:] == SEPARATOR for blob in keys)
                and all(keys_blob.count(SEPARATOR) - 1 == len(values_blob) // _VALUE_BYTES
                        for keys_blob, values_blob in zip(keys, values))
                and count == sum(len(blob) for blob in values) // _VALUE_BYTES):
            raise ValueError("a group map's state is inconsistent (bucket counts, separators or values): "
                             "the snapshot holding it is damaged")
        group_map = cls()
        group_map._round_buckets, group_map._split, group_map._count = round_buckets, split, count
        group_map._keys, group_map._values = keys, values
        return group_map

    @classmethod
    def from_items(cls, items) -> "GroupMap":
        group_map = cls()
        for group, value in items:
            group_map[group] = value
        return group_map
