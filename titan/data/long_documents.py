"""Encoding a long document in pieces, with the ids of one encoding of it whole.

A tokenizer library encodes a text into a Python list of ints, about 36 bytes per token (the
int object and its slot in the list): a plain text file is one document, and a 100 MB one
held 5 GB while it was encoded. A document longer than :data:`LONG_DOCUMENT_CHARS` is
therefore encoded piece by piece, each piece's ids turned into an int32 array at once, so that
memory stays within a piece's list beside the document's array of ids.

A cut must not change the ids. The tokenizers Titan reads split text into pre-tokens before
merging (sentencepiece at each ``▁``, the whitespace it stands for; Hugging Face's and
tiktoken's pre-tokenizers by their rules), and no token spans a pre-token boundary. So a cut
where the pre-tokenizer splits anyway, made the way the library encodes the start of a text,
leaves the ids as they were. Which cut that is depends on the library: sentencepiece adds its
dummy prefix (a ``▁``) to every text it encodes, so its cut drops the space before a word,
where tiktoken's keeps it with the word. :func:`exact_cut` does not assume either: it tries
candidate cuts, at a single space or newline between two non-space characters, first
keeping then dropping that character, and takes the first under which the text around it
(:data:`CUT_WINDOW_CHARS` either side) encodes to the same ids in two pieces as in one. The
ids of a pre-token depend on its characters only, and the pre-tokenizer's decision to split
at the cut on the few characters beside it, which the window holds. Where no candidate near a
cut passes (a long run without spaces, say), the piece goes on to the next place to cut.
"""

from __future__ import annotations

import re
from collections.abc import Callable

import numpy as np

LONG_DOCUMENT_CHARS = 1 << 20
"""Characters of a piece of a long document (1 Mi: its list of ids is tens of MB)."""
CUT_WINDOW_CHARS = 256
"""Characters on each side of a candidate cut that are encoded to check it."""
CUT_CANDIDATES = 16
"""Candidate cuts tried near each place to cut before the piece goes on."""

_CANDIDATE = re.compile(r"(?<=\S)[ \n](?=\S)")

Encode = Callable[[list[str]], list[list[int]]]
"""A tokenizer library's encoding of texts as ordinary text (one list of ids per text)."""


def exact_cut(encode: Encode, text: str, near: int) -> tuple[int, int] | None:
    """A cut of ``text`` at or after ``near`` that leaves its ids unchanged: (``end``,
    ``start``), the first piece ending before ``end`` and the next starting at ``start``
    (``end`` or ``end + 1``: the space or newline at ``end`` dropped), or None when none of the
    first :data:`CUT_CANDIDATES` candidates passes (module docstring)."""
    position = near
    for _ in range(CUT_CANDIDATES):
        cut = _next_candidate(text, position)
        if cut is None:
            return None
        begin = max(cut - CUT_WINDOW_CHARS, 0)
        for start in (cut, cut + 1):
            end = start + CUT_WINDOW_CHARS
            ids_left, ids_right, ids_whole = encode(
                [text[begin:cut], text[start:end], text[begin:end]]
            )
            if ids_left + ids_right == ids_whole:
                return cut, start
        position = cut + 1
    return None


def _next_candidate(text: str, position: int) -> int | None:
    """The first index at or after ``position`` of a space or newline with a non-space
    character on both sides, or None."""
    found = _CANDIDATE.search(text, position)
    return None if found is None else found.start()


def spans(
    encode: Encode, text: str, piece_chars: int = LONG_DOCUMENT_CHARS
) -> list[tuple[int, int]]:
    """``text`` cut into pieces of about ``piece_chars`` characters at :func:`exact_cut`\\ s,
    as (start, end) character spans in order (one span when it is no longer, or no cut
    passes): the pieces' ids, joined, are those of ``text``."""
    cut_spans: list[tuple[int, int]] = []
    start, near = 0, piece_chars
    while len(text) - start > piece_chars and near < len(text):
        cut = exact_cut(encode, text, near)
        if cut is None:
            near += piece_chars  # this piece goes on to the next place to cut
            continue
        cut_spans.append((start, cut[0]))
        start, near = cut[1], cut[1] + piece_chars
    return [*cut_spans, (start, len(text))]


def pieces(encode: Encode, text: str, piece_chars: int = LONG_DOCUMENT_CHARS) -> list[str]:
    """The texts of :func:`spans`."""
    return [text[start:end] for start, end in spans(encode, text, piece_chars)]


def encode_long(encode: Encode, text: str, piece_chars: int = LONG_DOCUMENT_CHARS) -> np.ndarray:
    """The ids of ``text`` as ``encode([text])`` gives them, encoded piece by piece
    (:func:`pieces`).

    Returns:
        (tokens,) int32 array.
    """
    cut = pieces(encode, text, piece_chars)
    arrays = [np.asarray(encode([piece])[0], dtype=np.int32) for piece in cut]
    return np.concatenate(arrays) if arrays else np.zeros(0, np.int32)
