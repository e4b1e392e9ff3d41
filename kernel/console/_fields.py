"""Every form field and path parameter the console takes, checked by the wall's rule for text.

A browser sends what its page holds, but whoever holds a session and its CSRF
token may send anything: a control character in a name, or, in a multipart form
whose sender names the charset (``unicode_escape``, ``utf-7``), a lone surrogate
that no inbox row or journal can hold. So before a form is read, each field is
checked (kernel.core.text): names, ids, choices and hashes take no control
character; the free text of a reason, a rule's title and content, and the JSON of
modified parameters keeps tabs and line breaks; the secrets compared and never
recorded (password, token, CSRF, nonce) must be UTF-8 text. What a form builds
(an inbox row) is checked again for a lone surrogate anywhere, which JSON escapes
in modified parameters can carry (``"\\ud800"``).

A refusal is SCHEMA_INVALID naming the field; it never echoes the text refused.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import msgspec

from kernel.console._decide import Refused
from kernel.core.reasons import ReasonCode
from kernel.core.text import free_text_problem, id_problem, utf8_problem, value_problem

FREE_TEXT = frozenset({"reason", "title", "content", "params"})
"""Fields of free text: tabs and line breaks allowed."""
SECRETS = frozenset({"secret", "csrf", "nonce"})
"""Fields compared and never recorded: UTF-8 text, anything else allowed."""


def field_refusal(fields: Iterable[tuple[str, Any]]) -> Refused | None:
    """Return the refusal of the first field (name, value) that breaks its rule, or None."""
    for name, value in fields:
        shown = _shown(name)
        problem = utf8_problem(name) if isinstance(name, str) else "a name that is not text"
        if problem is not None:
            return Refused(ReasonCode.SCHEMA_INVALID, f"a field name holds {problem}")
        if not isinstance(value, str):
            continue  # files are refused by the form parser (max_files=0)
        if name in SECRETS:
            problem = utf8_problem(value)
        elif name in FREE_TEXT:
            problem = free_text_problem(value)
        else:
            problem = id_problem(value)
        if problem is not None:
            return Refused(ReasonCode.SCHEMA_INVALID, f"{shown}: {problem}")
    return None


def row_refusal(row: Any) -> Refused | None:
    """Return the refusal of an inbox row built from a form that holds a lone surrogate."""
    try:
        plain = msgspec.to_builtins(row)
    except (TypeError, ValueError, OverflowError) as exc:
        return Refused(ReasonCode.SCHEMA_INVALID, f"not plain data: {type(exc).__name__}")
    found = value_problem(plain)
    if found is None:
        return None
    path, problem = found
    return Refused(ReasonCode.SCHEMA_INVALID, f"{path}: {problem}")


def form_items(form: Mapping[str, Any] | Any) -> list[tuple[str, Any]]:
    """A form's fields as (name, value) pairs, a repeated name as often as it was sent."""
    multi = getattr(form, "multi_items", None)
    return list(multi()) if callable(multi) else list(form.items())


def _shown(name: Any) -> str:
    text = name if isinstance(name, str) else repr(name)
    return text[:64].encode("utf-8", "backslashreplace").decode()
