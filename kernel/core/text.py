"""What a text field may hold, checked at an edge before anything is queued or sent on.

The web edges (``dirk console``'s forms, ``dirk mcp``'s tool arguments) take text
from whoever reaches them and turn it into inbox rows or kernel calls. They check
it by the wall's rule for text, so a refusal comes back at once, with its code and
the field, instead of as a row the kernel later refuses (or, where a string holds a
lone surrogate, as a row no journal can record):

- every string encodes as UTF-8: no lone surrogate (``"\\ud800"``, or ``"\\udcff"``
  from a byte that was not UTF-8 under ``surrogateescape``, or a JSON ``\\ud800``
  escape, or a form decoded with the charset its sender chose);
- an id or a name (an agent, an operator, a DFID, a rule id, a status, a hash)
  holds no control character at all: C0, DEL or C1;
- free text (a reason, an explanation, a rule's title and content) keeps tabs and
  line breaks, and holds no other control character.

A terminal obeys control characters (clear the screen, rewrite the line above,
retitle the window) and PostgreSQL's text columns cannot hold NUL, so they are
refused where they enter. Free-form values (a proposal's policy, modified
parameters) are refused for a lone surrogate anywhere; the wall bounds the rest.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

_ID_CONTROLS = r"\x00-\x1f\x7f-\x9f"
"""The characters an id or a name may not hold: C0, DEL, C1."""
_TEXT_CONTROLS = r"\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f"
"""The characters free text may not hold: the same, less tab, line feed and carriage return."""

ID_PATTERN = rf"^[^{_ID_CONTROLS}]*\Z"
NAME_PATTERN = rf"^(?=\s*\S)[^{_ID_CONTROLS}]*\Z"
"""An id that must be given: not blank."""
TEXT_PATTERN = rf"^[^{_TEXT_CONTROLS}]*\Z"
REASON_PATTERN = rf"^(?=\s*\S)[^{_TEXT_CONTROLS}]*\Z"
"""Free text that must be given: not blank."""

_ANY_CONTROL = re.compile(f"[{_ID_CONTROLS}]")
_TEXT_CONTROL = re.compile(f"[{_TEXT_CONTROLS}]")


def utf8_problem(text: str) -> str | None:
    """Return why ``text`` is not UTF-8 text (where its lone surrogate is), or None."""
    if text.isascii():
        return None
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        return (
            f"a lone surrogate U+{ord(text[exc.start]):04X} at character {exc.start}:"
            " not UTF-8 text"
        )
    return None


def id_problem(value: Any) -> str | None:
    """Return why ``value`` cannot be an id or a name (not text, not UTF-8, a control), or None."""
    return _problem(value, _ANY_CONTROL)


def free_text_problem(value: Any) -> str | None:
    """Return why ``value`` cannot be free text (not text, not UTF-8, a control other than
    tab, line feed or carriage return), or None."""
    return _problem(value, _TEXT_CONTROL)


def value_problem(value: Any) -> tuple[str, str] | None:
    """Return ``(path, why)`` for the first string or key of a free-form value that is not
    UTF-8 text, or None. Walks without recursion, so any nesting is safe to check."""
    # A path is kept as (parent, step) pairs and spelled out only for the string refused:
    # spelling every path as it goes would cost the square of the nesting's depth.
    stack: list[tuple[Any, Any]] = [(value, None)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            problem = utf8_problem(item)
            if problem is not None:
                return _spelled(where), problem
        elif isinstance(item, Mapping):
            for key, inner in item.items():
                if isinstance(key, str):
                    problem = utf8_problem(key)
                    if problem is not None:
                        return _spelled((where, key)), f"a key with {problem}"
                stack.append((inner, (where, key)))
        elif isinstance(item, (list, tuple)):
            stack.extend((inner, (where, i)) for i, inner in enumerate(item))
    return None


def _spelled(where: Any) -> str:
    """A path kept as nested (parent, key or index) pairs, spelled ``a.b[0]`` (``$``: the whole)."""
    parts: list[str] = []
    while where is not None:
        where, step = where
        parts.append(f"[{step}]" if isinstance(step, int) else f".{_shown_key(step)}")
    return "".join(reversed(parts)).removeprefix(".") or "$"


def _problem(value: Any, controls: re.Pattern[str]) -> str | None:
    if not isinstance(value, str):
        return f"not text: {type(value).__name__}"
    problem = utf8_problem(value)
    if problem is not None:
        return problem
    found = controls.search(value)
    if found is not None:
        return f"a control character U+{ord(found.group()):04X} at character {found.start()}"
    return None


def _shown_key(key: Any) -> str:
    """A key as a path names it: UTF-8 text only, cut short (a refusal never echoes a surrogate)."""
    text = key if isinstance(key, str) else repr(key)
    return text[:64].encode("utf-8", "backslashreplace").decode()
