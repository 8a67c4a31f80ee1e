"""Text that came from a model, made safe for where it is shown: a terminal, a Markdown page.

A model names its nodes, tensors, graph and file as it likes: a clear-screen or hyperlink escape sequence, a bell,
a right-to-left override, an HTML tag, a backtick or a pipe that breaks a code span or a table. Every text view
passes what it prints through these (JSON is safe as json.dumps writes it, the HTML page escapes with html.escape).
"""

from __future__ import annotations

import re
import unicodedata

# Characters a terminal acts on or hides: C0 controls but line feed and tab, DEL, C1 controls (8-bit CSI, OSC),
# and the invisible format characters (bidirectional overrides and isolates, zero-width joiners).
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u200b-\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def _visible(match: re.Match[str]) -> str:
    return match.group(0).encode("unicode_escape").decode("ascii")


def terminal_text(text: str) -> str:
    """Give `text` with every character a terminal would act on (escape sequences, bells, carriage returns,
    bidirectional overrides) written as a visible escape (\\x1b, \\u202e); line feeds and tabs kept."""
    if text.isascii() and text.isprintable():
        return text
    cleaned = _UNSAFE.sub(_visible, text)
    # (any other non-printable format or control character a future Unicode adds: the same treatment)
    if not all(c.isprintable() or c in "\n\t" for c in cleaned):
        cleaned = "".join(c if c.isprintable() or c in "\n\t" or unicodedata.category(c)[0] != "C"
                          else c.encode("unicode_escape").decode("ascii") for c in cleaned)
    return cleaned


def _one_line(text: str) -> str:
    return terminal_text(text.replace("\r\n", " ").replace("\n", " ").replace("\r", " ")).replace("\n", " ")


def markdown_code(text: str) -> str:
    """Give `text` as one Markdown code span that shows it as it is inside a table cell: a backtick in it gets a
    longer fence (CommonMark's rule), a pipe is escaped as GFM tables require, a line break becomes a space. Text
    with '<', '>' or '&' is given as markdown_text instead: a code span would show it as text, but a tag in the
    page's source is one careless converter away from running."""
    if "<" in text or ">" in text or "&" in text:
        return markdown_text(text)
    text = _one_line(text).replace("|", "\\|")
    if "`" not in text:
        return f"`{text}`"
    longest = max(len(run) for run in re.findall(r"`+", text))
    fence = "`" * (longest + 1)
    return f"{fence} {text} {fence}"


_MARKDOWN_ACTIVE = re.compile(r"[\\`*_\[\]<>|#&]")
_ENTITIES = {"<": "&lt;", ">": "&gt;", "&": "&amp;"}


def markdown_text(text: str) -> str:
    """Give `text` as Markdown that shows it as it is: HTML's '<', '>' and '&' as entities, Markdown's own syntax
    (emphasis, code, links, headings, table pipes, backslashes) escaped, line breaks as spaces."""
    text = _one_line(text)
    return _MARKDOWN_ACTIVE.sub(lambda m: _ENTITIES.get(m.group(0), "\\" + m.group(0)), text)
