"""Hypothesis strategies for what an attacker (or a broken client) sends to an entry point.

Hypothesis leaves lone surrogates out of ``st.text()`` unless asked, and rarely draws
control characters; the kernel's edges must meet both. Every property test of an
entry point (API, inbox, CLI argv, bus, MCP, console, manifests, packs) draws its
strings from :func:`hostile_text` and its free-form values from :func:`hostile_values`.
"""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

LONE_SURROGATES = ("\ud800", "\udbff", "\udc00", "\udcff")
"""What ``surrogateescape`` makes of bytes that are not UTF-8 (``\\udcff`` is ``b"\\xff"``)."""
C0 = tuple(chr(c) for c in range(0x20))
C1 = tuple(chr(c) for c in range(0x80, 0xA0))
DEL = "\x7f"
TERMINAL_ESCAPES = (
    "\x1b]0;pwned\x07",
    "\x1b[2J",
    "\x1b[1A\x1b[2K",
    "\x1b]8;;http://evil.example\x1b\\click\x1b]8;;\x1b\\",
    "\r",
    "\x9b31m",
)
"""Sequences that set a window title, clear a screen, erase a line or disguise a link."""

_nasty_char = st.one_of(st.sampled_from(LONE_SURROGATES), st.sampled_from((*C0, *C1, DEL)))
_any_char = st.characters(codec=None, categories=["L", "M", "N", "P", "S", "Z", "Cc", "Cs"])


def hostile_text(*, min_size: int = 0, max_size: int = 40) -> st.SearchStrategy[str]:
    """Draw strings that often hold a lone surrogate, a C0/C1 control, DEL or an escape."""
    plain = st.text(_any_char, min_size=min_size, max_size=max_size)
    spiked = st.tuples(
        st.text(max_size=max_size // 2), _nasty_char, st.text(max_size=max_size // 2)
    ).map("".join)
    escapes = st.tuples(st.text(max_size=8), st.sampled_from(TERMINAL_ESCAPES)).map("".join)
    return st.one_of(spiked, plain, escapes).filter(lambda s: len(s) >= min_size)


def hostile_scalars() -> st.SearchStrategy[Any]:
    """Draw scalars past every bound: huge integers, non-finite floats, bools, None."""
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.sampled_from([2**63, -(2**63) - 1, 2**64, 10**400]),
        st.floats(allow_nan=True, allow_infinity=True),
        st.sampled_from(["NaN", "1e999", "-inf", "Infinity"]),
        hostile_text(),
    )


def hostile_values(*, max_leaves: int = 20) -> st.SearchStrategy[Any]:
    """Draw free-form JSON-like values with hostile keys, scalars and some nesting."""
    return st.recursive(
        hostile_scalars(),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4),
            st.dictionaries(hostile_text(max_size=12), inner, max_size=4),
        ),
        max_leaves=max_leaves,
    )


def deeply_nested(depth: int) -> Any:
    """Return a list nested ``depth`` deep (past recursion limits at a few thousand)."""
    value: Any = []
    for _ in range(depth):
        value = [value]
    return value


def deeply_nested_json(depth: int) -> str:
    """Return JSON text nested ``depth`` deep, built without recursion."""
    return "[" * depth + "]" * depth


def is_utf8(text: str) -> bool:
    """Tell whether ``text`` encodes as UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
