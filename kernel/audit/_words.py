"""The table of the narrative's words: one small function per event type (kernel.audit.narrative).

A module of words enters each of its functions with ``@says``; the narrative looks a payload's
type up once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

_P = TypeVar("_P")
WORDS: dict[type[Any], Callable[[Any], str]] = {}
"""Each event type's words, entered by the modules of words (``_flow_words``, ``_state_words``)."""


def says(kind: type[_P]) -> Callable[[Callable[[_P], str]], Callable[[_P], str]]:
    """Enter the function that words one event type into the table."""

    def enter(words: Callable[[_P], str]) -> Callable[[_P], str]:
        assert kind not in WORDS, kind
        WORDS[kind] = words
        return words

    return enter


def count(items: object, word: str) -> str:
    return count_of(len(items) if hasattr(items, "__len__") else 0, word)


def count_of(n: int, word: str) -> str:
    if word in ("promoted", "archived", "discarded"):
        return f"{n} {word}"
    return f"{n} {word}{'' if n == 1 else 's'}"
