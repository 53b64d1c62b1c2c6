"""Strings from run records shown as inert text: control characters escaped visibly.

Run dir names and every string inside ``events.jsonl`` (statuses, presets, errors, config
values, stack frames) come from files anyone can write. Shown raw, an ESC starts a terminal
sequence (OSC 52 writes the clipboard, OSC 0/2 the window title, CSI moves the cursor) and a
bidi override reorders what is read. :func:`inert` writes each such character as its Python
escape (``\\x1b``, ``\\x07``, ``\\u202e``), so the text shows what the record holds and the
terminal receives nothing but printable characters. Markup (Rich, Textual) is a separate matter:
callers pass the result as plain text (``rich.text.Text``, ``markup=False``) or escape it;
:func:`markdown_text` escapes it for Markdown (``titan report``).

This module imports nothing beyond the standard library.
"""

from __future__ import annotations

# C0 controls (ESC, BEL, NUL, tab, newline, ...), DEL, C1 controls (CSI U+009B, OSC U+009D, ...).
_CONTROLS = (*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0))
# Bidirectional marks, embeddings, overrides and isolates (Unicode TR 9), and the line and
# paragraph separators, which some terminals treat as line breaks.
_FORMATS = (0x061C, 0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x2028, 0x2029)
# Lone surrogates: what Python makes of bytes of a file name that are not UTF-8 (they cannot be
# written to a terminal, or anywhere UTF-8 is expected).
_SURROGATES = range(0xD800, 0xE000)
_TABLE = {
    **{c: f"\\x{c:02x}" for c in _CONTROLS},
    **{c: f"\\u{c:04x}" for c in (*_FORMATS, *_SURROGATES)},
}


def inert(text: object) -> str:
    """``text`` (``str()`` of it when not a string) with every control character, DEL and
    bidi format character written as its escape: ``"a\\x1b]52;c;..."`` for an ESC, ``"\\u202e"``
    for a right-to-left override, ``"\\udcff"`` for a lone surrogate (a byte of a file name that
    is not UTF-8). Printable text, other scripts and emoji pass unchanged."""
    return (text if isinstance(text, str) else str(text)).translate(_TABLE)


# HTML's special characters as entities (an HTML tag, an entity, an autolink <http://...>) and
# the Markdown punctuation that opens links, images, code spans and table cells, escaped with a
# backslash (CommonMark 0.31, Sec. 2.4: any ASCII punctuation may be).
_MARKDOWN = str.maketrans(
    {
        "&": "&amp;",
        "<": "&lt;",
        ">": "&gt;",
        "\\": "\\\\",
        "[": "\\[",
        "]": "\\]",
        "`": "\\`",
        "|": "\\|",
        "\n": " ",
    }
)


def markdown_text(text: object) -> str:
    """``text`` (``str()`` of it when not a string) as inert Markdown: it renders as the text it
    is, never as HTML, a link, an image, a code span or another table cell, on one line. Control
    characters are left to :func:`inert`."""
    return (text if isinstance(text, str) else str(text)).translate(_MARKDOWN)
