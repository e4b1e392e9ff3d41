"""How an event's canonical bytes are stored: as they are, or deflated with a preset dictionary.

An event's hash is always over its canonical JSON (:func:`kernel.core.events.canonical`);
what a store keeps in the body column is one of two forms, told apart by the first byte:

- ``{``: the canonical JSON itself. Every journal written before this codec, every
  PostgreSQL journal, and any row a tool wrote by hand.
- ``\\x01`` (the number of a dictionary), then a raw DEFLATE stream (RFC 1951, no zlib
  header or checksum) of the canonical bytes, compressed with that dictionary preset.

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
from pathlib import Path

PLAIN = 0x7B
"""The first byte of a body stored as canonical JSON (``{``)."""
CURRENT = 1
"""The dictionary new bodies are compressed with."""
MAX_BODY = 1 << 26
"""The most bytes a stored body may inflate to (64 MiB): a damaged or forged body that
claims more is refused rather than allowed to fill memory."""

_DICTIONARIES = {1: "body-1.zdict"}
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


class BodyPacker:
    """Compresses canonical bodies for storage; one per writer (not shared between threads)."""

    def __init__(self, number: int = CURRENT) -> None:
        self._prefix = bytes([number])
        # Priming a compressor with the dictionary costs more than compressing a body:
        # one primed compressor is copied for each body instead.
        self._primed = zlib.compressobj(
            _LEVEL, zlib.DEFLATED, -_WBITS, _MEM_LEVEL, _STRATEGY, dictionary(number)
        )

    def pack(self, body: bytes) -> bytes:
        """Return the stored form of canonical ``body``; a stored (packed) body is kept as is."""
        if not body or body[0] != PLAIN:
            return body
        compressor = self._primed.copy()
        return self._prefix + compressor.compress(body) + compressor.flush()


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
    zdict = _loaded.get(first) or dictionary(first)
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
