"""How an event's canonical bytes are stored: as they are, or compressed with a dictionary.

An event's hash is always over its canonical JSON (:func:`kernel.core.events.canonical`);
what a store keeps in the body column is one of three forms, told apart by the first byte
(the number of a dictionary, which also names its codec):

- ``{``: the canonical JSON itself. Every journal written before this codec, every
  PostgreSQL journal, and any row a tool wrote by hand.
- ``\\x01`` (dictionary 1), then a raw DEFLATE stream (RFC 1951, no zlib header or
  checksum) of the canonical bytes, compressed with that dictionary preset. Written by
  kernels 0.2.0 and before; always read.
- ``\\x02`` (dictionary 2, the current one), then a zstd frame (RFC 8878) without its magic
  number, checksum or dictionary id, with its content size: the canonical bytes compressed
  with the zstd dictionary ``body-2.zstd``, trained on representative events
  (``python -m benchmarks.body_dictionary --zstd``).

Why zstd for new bodies: with a trained dictionary it compresses a trading event in about a
quarter of deflate's CPU (2.3 against 9.8 us) to fewer bytes (107.5 against 140), and
inflates it faster (0.9 against 1.4 us); deflate was a sixth of a flow's CPU (C1), spent in
the journal writer's thread. docs/benchmarks.md has the paired runs.

Most of an event's bytes are its envelope's and payload's keys, type names and reason
codes, the same in every event of a kind: a dictionary built from representative events
(``python -m benchmarks.body_dictionary``) lets a few hundred bytes of JSON deflate to
about a third. A dictionary is never changed once released: a later one takes the next
number, and every number ever released stays readable (its file's SHA-256 is pinned by
tests/journal/test_codec.py). A body naming a number this kernel does not know is
refused as unreadable, never guessed at.

Why raw DEFLATE and a one-byte number rather than the zlib format's Adler-32 DICTID:
ten bytes fewer per event (2-byte header, 4-byte DICTID, 4-byte checksum), and an
inflate that does not checksum the dictionary each time. The checksum adds nothing:
``verify`` recomputes every event's SHA-256 over the inflated bytes.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from pathlib import Path

import zstandard

PLAIN = 0x7B
"""The first byte of a body stored as canonical JSON (``{``)."""
CURRENT = 2
"""The dictionary new bodies are compressed with."""
ZLIB = 1
"""The one DEFLATE dictionary; every later number is a zstd one."""
MAX_BODY = 1 << 26
"""The most bytes a stored body may inflate to (64 MiB): a damaged or forged body that
claims more is refused rather than allowed to fill memory."""

_DICTIONARIES = {1: "body-1.zdict", 2: "body-2.zstd"}
"""Every dictionary ever released, by number; files beside this module."""
# The writer's deflate parameters may change without a format change; the reader accepts
# any window up to 32 KiB. An 8 KiB window (the dictionary's last 7,930 bytes are
# reachable) with fixed Huffman codes: a little larger than dynamic codes (124 against
# 110 bytes per trading event) but inflated in half the time, which replay and verify pay
# for every event. Level 3 against 6: 8 bytes more per event on disk (P6 296 against 288)
# for ~25 us less CPU per flow (P1 about 1.05x); level 1 matches the dictionary poorly
# (P6 ~360). docs/benchmarks.md has the interleaved runs.
_WBITS = 13
_LEVEL = 3
_MEM_LEVEL = 5
_STRATEGY = zlib.Z_FIXED


class BodyUnreadable(ValueError):
    """A stored body that does not inflate, or names a dictionary this kernel does not know."""


def dictionary(number: int) -> bytes:
    """Return dictionary ``number``.

    Raises:
        BodyUnreadable: No dictionary of that number was ever released (to this kernel).
    """
    if number in _loaded:
        return _loaded[number]
    name = _DICTIONARIES.get(number)
    if name is None:
        known = ", ".join(str(n) for n in sorted(_DICTIONARIES))
        raise BodyUnreadable(
            f"its body is compressed with dictionary {number}, unknown to this kernel"
            f" (it knows {known}): written by a newer kernel, or damaged"
        )
    zdict = _loaded[number] = (Path(__file__).parent / name).read_bytes()
    return zdict


_loaded: dict[int, bytes] = {}
_ZSTD_FORMAT = zstandard.FORMAT_ZSTD1_MAGICLESS
# Level 3 with the dictionary: level 1 is no faster on bodies this small and 2 bytes larger.
_ZSTD_LEVEL = 3
_zstd_dicts: dict[int, zstandard.ZstdCompressionDict] = {}
_decompressors: dict[int, zstandard.ZstdDecompressor] = {}
_SMALL = 65_791
"""The most a zstd frame whose content size field takes at most 2 bytes can hold."""
# Each known zstd dictionary's one-call inflate, by number (filled as _decompressor makes them).
_oneshots: dict[int, Callable[..., bytes]] = {}


def _zstd_dictionary(number: int) -> zstandard.ZstdCompressionDict:
    found = _zstd_dicts.get(number)
    if found is None:
        found = _zstd_dicts[number] = zstandard.ZstdCompressionDict(
            dictionary(number), dict_type=zstandard.DICT_TYPE_FULLDICT
        )
    return found


def _decompressor(number: int) -> zstandard.ZstdDecompressor:
    found = _decompressors.get(number)
    if found is None:
        found = _decompressors[number] = zstandard.ZstdDecompressor(
            dict_data=_zstd_dictionary(number), format=_ZSTD_FORMAT
        )
        _oneshots[number] = found.decompress
    return found


class BodyPacker:
    """Compresses canonical bodies for storage; one per writer (not shared between threads)."""

    def __init__(self, number: int = CURRENT) -> None:
        self._prefix = bytes([number])
        self._compress: Callable[[bytes], bytes]
        if number == ZLIB:
            # Priming a compressor with the dictionary costs more than compressing a body:
            # one primed compressor is copied for each body instead.
            self._primed = zlib.compressobj(
                _LEVEL, zlib.DEFLATED, -_WBITS, _MEM_LEVEL, _STRATEGY, dictionary(number)
            )
            self._compress = self._deflate
            return
        params = zstandard.ZstdCompressionParameters.from_level(
            _ZSTD_LEVEL,
            format=_ZSTD_FORMAT,
            write_checksum=False,  # verify recomputes each event's SHA-256 instead
            write_content_size=True,  # lets unpack refuse a body claiming too much up front
            write_dict_id=False,  # the first byte already names the dictionary
        )
        self._compress = zstandard.ZstdCompressor(
            dict_data=_zstd_dictionary(number), compression_params=params
        ).compress

    def pack(self, body: bytes) -> bytes:
        """Return the stored form of ``body``, canonical or stored.

        A body already stored with this packer's dictionary is kept as is; one stored with
        another (a row of an older journal, brought by ``dirk copy``) is converted, so a
        copy ends up in the current codec.

        Raises:
            BodyUnreadable: ``body`` is a stored body that does not unpack.
        """
        if not body:
            return body
        first = body[0]
        if first != PLAIN:
            if first == self._prefix[0]:
                return body
            body = unpack(body)
        return self._prefix + self._compress(body)

    def _deflate(self, body: bytes) -> bytes:
        compressor = self._primed.copy()
        return compressor.compress(body) + compressor.flush()


def unpack(stored: bytes) -> bytes:
    """Return the canonical bytes of a stored body (either form).

    Raises:
        BodyUnreadable: A compressed body that does not inflate whole, or names an unknown
            dictionary.
    """
    # The hot path of replay and verify: each line here costs per event.
    try:
        first = stored[0]
    except IndexError:
        raise BodyUnreadable("its body is empty") from None
    if first == PLAIN:
        return stored
    if first == ZLIB:
        return _inflate(stored)
    # A frame whose content size field is at most 2 bytes (the top bits of its first
    # byte below 2) says it holds at most 65,791 bytes, far below MAX_BODY: inflated in
    # one call, which checks the frame is whole, has nothing after its end and holds
    # what it says. Anything else, or any failure, goes to the checks that name it.
    oneshot = _oneshots.get(first)
    if oneshot is not None and len(stored) > 1 and stored[1] < 0x80 and MAX_BODY > _SMALL:
        try:
            # max_output_size (0: the frame's), read_across_frames, allow_extra_data: by
            # position, as keywords cost about 0.2 us a call.
            return oneshot(stored[1:], 0, False, False)
        except zstandard.ZstdError:
            pass
    return _unzstd_checked(first, stored)


def _inflate(stored: bytes) -> bytes:
    zdict = _loaded.get(stored[0]) or dictionary(stored[0])
    inflater = zlib.decompressobj(-15, zdict=zdict)
    try:
        body = inflater.decompress(stored[1:], MAX_BODY)
    except zlib.error as exc:
        raise BodyUnreadable(f"its compressed body is damaged ({exc})") from None
    if not inflater.eof or inflater.unused_data:
        raise BodyUnreadable(
            "its compressed body is damaged (it ends early, or has bytes after its end)"
            if len(body) < MAX_BODY
            else f"its compressed body inflates to more than {MAX_BODY} bytes"
        )
    return body


def _unzstd_checked(number: int, stored: bytes) -> bytes:
    decompressor = _decompressor(number)
    frame = memoryview(stored)[1:]
    try:
        size = zstandard.get_frame_parameters(frame, format=_ZSTD_FORMAT).content_size
    except zstandard.ZstdError as exc:
        raise BodyUnreadable(f"its compressed body is damaged ({exc})") from None
    if size > MAX_BODY:  # CONTENTSIZE_UNKNOWN (2**64 - 1) too: this codec always writes it
        raise BodyUnreadable(
            f"its compressed body inflates to more than {MAX_BODY} bytes, or does not say"
        )
    inflater = decompressor.decompressobj()
    try:
        body = inflater.decompress(frame)
    except zstandard.ZstdError as exc:
        raise BodyUnreadable(f"its compressed body is damaged ({exc})") from None
    if not inflater.eof or inflater.unused_data or len(body) != size:
        raise BodyUnreadable(
            "its compressed body is damaged (it ends early, or has bytes after its end)"
        )
    return body
