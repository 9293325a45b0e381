"""Reading a journal back: the good frames of a file, then where and why reading stopped.

Rules:
- Pure: no threads and no files of its own; a scan reads whatever binary file object it is handed
  (or bytes), in pieces of at least SCAN_CHUNK_BYTES. The record format is node/store/records.py's.
- A scan stops at the first frame that is short (a torn write) or fails its length, crc or decode
  checks (corruption). Everything before it is good and nothing after it is trusted.
- A whole frame this build cannot read (a newer format version or record kind) stops the scan with a
  `refusal` naming it, never read as corruption to cut.
- Recovery's hot path (one frame each of ten million records): per frame only the checks and the
  decode; no call that is not needed for every frame (refills and stop reasons are apart).
"""

from __future__ import annotations

import io
import struct
import zlib

from node.store.records import (FORMAT_VERSIONS_READ, FRAME, FRAME_HEADER_BYTES, RECORD_BODY_MAX_BYTES, STORE,
                                STORE_HEADER, NewerFormat, decode_body, format_version, store_header)

SCAN_CHUNK_BYTES = 1 << 20  # a scan reads its source in pieces of at least this size


class Scan:
    """Iterate the good frames of a journal, then say where and why reading stopped.

    Yields (offset, kind, record) with offsets relative to where the source was positioned. While
    iterating, `end_offset` is just past the frame last yielded (so `end_offset - offset` is its
    length); afterwards it is the length of the good prefix. `stop_reason` is None after a clean
    end, else a sentence saying what was wrong with the frame at `end_offset`.

    `store_headers`: a STORE of a queue whose name does not start with NUL comes as kind STORE_HEADER
    and record (queue, seq, group_id) (store_header: no payload, no Message); the cluster's own
    records (names starting with NUL) still come whole, as STORE. Every check is the same.
    """

    def __init__(self, source, store_headers: bool = False):
        if isinstance(source, (bytes, bytearray, memoryview)):
            source = io.BytesIO(source)
        self._file = source
        start = source.tell()
        self._size_bytes = source.seek(0, io.SEEK_END) - start
        source.seek(start)
        self.end_offset = 0
        self.stop_reason: str | None = None
        self.format_version = 1  # the FORMAT marker's, or 1 for a file without one
        self.refusal: str | None = None  # why reading stopped at a whole frame this build cannot read
        self._store_headers = store_headers

    def __iter__(self):
        read = self._file.read
        unpack_header = FRAME.unpack_from
        crc32 = zlib.crc32
        headers = self._store_headers
        names: dict = {}
        size_bytes = self._size_bytes
        buffer = b""
        view = memoryview(buffer)  # of `buffer`, made once per chunk, not once per frame
        position = 0  # of the next frame within `buffer`
        offset = self.end_offset
        while True:
            if len(buffer) - position < FRAME_HEADER_BYTES:
                buffer, view, position = _refilled(buffer, position, read, SCAN_CHUNK_BYTES)
                if len(buffer) < FRAME_HEADER_BYTES:
                    if buffer:
                        self.stop_reason = f"torn frame header ({len(buffer)} of {FRAME_HEADER_BYTES} bytes)"
                    return
            body_length, crc = unpack_header(buffer, position)
            if not 1 <= body_length <= RECORD_BODY_MAX_BYTES:
                self.stop_reason = f"impossible body length {body_length}"
                return
            remaining = size_bytes - offset - FRAME_HEADER_BYTES
            if body_length > remaining:
                self.stop_reason = f"torn frame (body of {body_length} bytes, {remaining} present)"
                return
            body_start = position + FRAME_HEADER_BYTES
            if len(buffer) < body_start + body_length:
                buffer, view, position = _refilled(buffer, position, read, max(SCAN_CHUNK_BYTES, body_length))
                body_start = FRAME_HEADER_BYTES
                if len(buffer) < body_start + body_length:  # the file shrank under us
                    self.stop_reason = f"torn frame (body of {body_length} bytes, {len(buffer) - body_start} read)"
                    return
            body = view[body_start:body_start + body_length]
            if crc32(body) != crc:
                self.stop_reason = f"crc mismatch in a frame of {body_length} body bytes"
                return
            try:
                version = format_version(body) if offset == 0 else None
                if version is None:
                    kind, record = STORE_HEADER, None
                    if headers and body[0] == STORE:
                        record = store_header(buffer, body_start, body_length, names)
                    if record is None:
                        kind, record = decode_body(body)
                elif version not in FORMAT_VERSIONS_READ:
                    raise NewerFormat(f"format version {version}")
            except NewerFormat as error:
                self.stop_reason = self.refusal = _refusal(error, offset)
                return
            except (ValueError, struct.error) as error:  # UnicodeDecodeError is a ValueError
                self.stop_reason = f"undecodable record ({error})"
                return
            position = body_start + body_length
            self.end_offset = offset + FRAME_HEADER_BYTES + body_length
            if version is None:
                yield offset, kind, record
            else:
                self.format_version = version
            offset = self.end_offset


def scan(source, store_headers: bool = False) -> Scan:
    """Frames of `source` (bytes-like, or a seekable binary file positioned at the first frame)."""
    return Scan(source, store_headers)


def _refilled(buffer: bytes, position: int, read, bytes_min: int) -> tuple[bytes, memoryview, int]:
    """What is left of `buffer` from `position` on, and at least `bytes_min` more of the source (less at
    its end): the new buffer, a view of it, and the position of its first frame (0)."""
    buffer = buffer[position:] + read(bytes_min)
    return buffer, memoryview(buffer), 0


def _refusal(error: NewerFormat, offset: int) -> str:
    return (f"{error} at offset {offset}; this build reads journal format versions "
            f"{', '.join(map(str, FORMAT_VERSIONS_READ))}")
