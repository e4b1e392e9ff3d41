"""Matching constraints by meaning, deterministically: words, stems, synonyms, an optional model.

A constraint names phrases ("verify *accessibility* before *booking*", "never use
*eval()*"); a proposal is text (its kind, explanation and parameters). Whether the
phrase occurs in the text is decided here, the same way live and on every replay:

1. **Normalisation**: Unicode NFKC, case-folded; split into words (letters and digits,
   joined by underscores: ``eval()`` is the word ``eval``, ``ast.literal_eval`` the words
   ``ast`` and ``literal_eval``; a policy kind's underscores are spaces, so the kind
   ``trading.place_order`` reads as three words, :func:`kind_words`); a few
   function words (:data:`STOPWORDS`) dropped from both sides.
2. **Stemming**: each word to its Snowball English stem (``booking``, ``Book`` and
   ``booked`` are ``book``; ``accessibility`` and ``accessible`` are ``access``), so
   the DML paper's own pair, "Verify accessibility before booking" against "Book Hotel
   Granvia", matches. The stemmer is a pure function of the word (snowballstemmer).
3. **Synonyms**: groups of phrases a policy pack declares to mean the same
   (``("book", "reserve", "reservation")``). Each occurrence of a group's phrase, in
   the constraint and in the text, is read as the group's first phrase, longest first.
   The groups a constraint uses are recorded on it when it is added (``ConstraintAdded``),
   so a pack loaded later never changes how an older constraint matched.
4. **A phrase occurs** when its words appear, in order and next to each other, among
   the text's words. Nothing else: no fuzzy distance, no partial stems ("cat" is not
   in "concatenate", "eval" is not "evaluate").

Past words, an **embedding matcher** (:class:`EmbeddingMatcher`) may score how close a
proposal's text comes to each constraint the words did not match. It runs at the edge
(kernel.api, before the DIM judges), and its scores are recorded (``MeaningScored``:
model, version, threshold, score per constraint): the verdict reads the recorded
scores, never the model, so replay is exact without it.
"""

from __future__ import annotations

import hashlib
import math
import re
import unicodedata
from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Protocol

import snowballstemmer

MATCHER = "meaning/1"
"""What a constraint matched by this module records in ``ConstraintAdded.matcher``."""
STOPWORDS = frozenset({"a", "an", "the", "any", "some", "this", "that", "these", "those"})
"""Function words left out of both sides: "never book the suite" forbids "book suite"."""
MICRO = 1_000_000
"""Scores are integers: 1.0 is a million (kernel.state.beliefs does the same)."""

_WORD = re.compile(r"[^\W_]+(?:_+[^\W_]+)*")
# Underscores join: an identifier is one word ("literal_eval" is not "eval"); a policy
# kind's underscores are read as spaces by the caller (kind_words).
_stemmer = snowballstemmer.stemmer("english")

Words = tuple[str, ...]
Groups = tuple[tuple[Words, ...], ...]


@lru_cache(maxsize=65536)
def _stem(word: str) -> str:
    stem: str = _stemmer.stemWord(word)
    return stem


@lru_cache(maxsize=8192)
def words(text: str) -> Words:
    """Return the normalised, stemmed words of ``text`` (function words left out)."""
    folded = unicodedata.normalize("NFKC", text).casefold()
    return tuple(_stem(w) for w in _WORD.findall(folded) if w not in STOPWORDS)


def kind_words(kind: str) -> str:
    """A policy kind as text to match: its underscores are spaces (``place_order``)."""
    return kind.replace("_", " ")


@lru_cache(maxsize=1024)
def groups_of(synonyms: tuple[tuple[str, ...], ...]) -> Groups:
    """Return synonym groups as words, each group's phrases longest first (empty ones out)."""
    out = []
    for group in synonyms:
        phrases = [w for w in (words(p) for p in group) if w]
        if len(phrases) > 1:
            # The group reads as its first phrase; longest first, so "step free access"
            # is read before "step".
            head = phrases[0]
            rest = sorted(set(phrases[1:]) - {head}, key=lambda w: (-len(w), w))
            out.append((head, *rest))
    return tuple(out)


def canonical(text_words: Words, groups: Groups) -> Words:
    """Return ``text_words`` with each synonym phrase replaced by its group's first phrase."""
    if not groups:
        return text_words
    alternatives = sorted(
        ((phrase, group[0]) for group in groups for phrase in group[1:]),
        key=lambda pair: (-len(pair[0]), pair[0]),
    )
    out: list[str] = []
    i = 0
    while i < len(text_words):
        for phrase, head in alternatives:
            if text_words[i : i + len(phrase)] == phrase:
                out.extend(head)
                i += len(phrase)
                break
        else:
            out.append(text_words[i])
            i += 1
    return tuple(out)


def occurs(phrase: Words, text: Words) -> bool:
    """Whether ``phrase`` occurs in ``text`` as consecutive words (an empty phrase never does)."""
    n = len(phrase)
    if n == 0 or n > len(text):
        return False
    first = phrase[0]
    return any(text[i] == first and text[i : i + n] == phrase for i in range(len(text) - n + 1))


def phrase_in(phrase: str, text: str, synonyms: Sequence[Sequence[str]] = ()) -> bool:
    """Whether ``phrase`` occurs in ``text`` by meaning (words, stems and ``synonyms``)."""
    groups = groups_of(tuple(tuple(g) for g in synonyms))
    return occurs(canonical(words(phrase), groups), canonical(words(text), groups))


def overlapping(a: str, b: str, synonyms: Sequence[Sequence[str]] = ()) -> bool:
    """Whether one phrase occurs in the other by meaning (what two constraints conflict on)."""
    groups = groups_of(tuple(tuple(g) for g in synonyms))
    wa, wb = canonical(words(a), groups), canonical(words(b), groups)
    return occurs(wa, wb) or occurs(wb, wa)


def relevant(phrases: Iterable[str], synonyms: Iterable[Sequence[str]]) -> list[list[str]]:
    """Return the synonym groups that share a word with any of ``phrases`` (what to record)."""
    mine = {w for phrase in phrases for w in words(phrase)}
    chosen = []
    for group in synonyms:
        if any(mine & set(words(p)) for p in group):
            chosen.append(list(group))
    return sorted(chosen)


def text_hash(text: str) -> str:
    """The hash a recorded score names its text by."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


# --- the embedding matcher ---------------------------------------------------------


class Embedder(Protocol):
    """The port an embedding model sits behind: its name, its version, and vectors."""

    model: str
    version: str

    async def embed(self, texts: Sequence[str]) -> Sequence[Sequence[float]]:
        """Return one vector per text, in order."""
        ...


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two vectors (0.0 if either is zero or they differ in length)."""
    if len(a) != len(b):
        return 0.0
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return dot / norm if norm > 0 and math.isfinite(norm) else 0.0


def to_micro(score: float) -> int:
    """A score as recorded: micro-units, clamped to [-1, 1], half to even."""
    if not math.isfinite(score):
        return 0
    return round(max(-1.0, min(1.0, score)) * MICRO)


class EmbeddingMatcher:
    """Scores a proposal's text against constraint phrases with an :class:`Embedder`.

    Args:
        embedder: the model behind the port (its ``model`` and ``version`` are recorded).
        threshold: the cosine similarity, in [0, 1], at which a phrase counts as matched.
    """

    def __init__(self, embedder: Embedder, threshold: float = 0.8) -> None:
        if not 0.0 <= threshold <= 1.0:
            raise ValueError("an embedding threshold lies in [0, 1]")
        self.embedder = embedder
        self.threshold = to_micro(threshold)

    async def scores(self, text: str, phrases: Sequence[str]) -> list[int]:
        """Return the score of ``text`` against each phrase, in micro-units."""
        vectors = list(await self.embedder.embed([text, *phrases]))
        if len(vectors) != len(phrases) + 1:
            raise ValueError("the embedder returned another number of vectors than texts")
        head, rest = vectors[0], vectors[1:]
        return [to_micro(cosine(head, v)) for v in rest]
