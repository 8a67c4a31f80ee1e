"""An answer as a list of blocks (a title, the verdict and its arithmetic, headings, paragraphs, bullets, tables),
written three ways from the same blocks: text that fits a terminal's width, Markdown, and the body of an HTML page.

Every text view builds its blocks once (render.py); what each format does with them is here: the text wraps
paragraphs by word at the width, shortens long names in the middle and wraps a table's prose column, so that no line
runs past the width where the width allows it; Markdown and HTML keep every name whole (so does JSON).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from typing import TextIO

from onnxmem.views.safe import markdown_code, markdown_text, terminal_text

DEFAULT_WIDTH = 80  # where the output is no terminal (a pipe, a file, a CI log) and COLUMNS is not set
MIN_WIDTH = 40  # narrower than this, text is written at this width (a table cannot be read narrower)
_ELLIPSIS = "..."


def output_width(stream: TextIO | None = None) -> int:
    """Give the columns text is written in: COLUMNS where it is set, else the terminal's width where `stream`
    (stdout) is a terminal, else 80."""
    given = os.environ.get("COLUMNS", "").strip()
    if given.isdigit() and int(given) > 0:
        return max(int(given), MIN_WIDTH)
    stream = sys.stdout if stream is None else stream
    try:
        if stream is not None and stream.isatty():
            return max(shutil.get_terminal_size((DEFAULT_WIDTH, 24)).columns, MIN_WIDTH)
    except (AttributeError, ValueError, OSError):  # (a closed or replaced stream)
        pass
    return DEFAULT_WIDTH


# --- the blocks ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Title:
    """The first line: which command, on which model."""

    command: str
    model: str


@dataclass(frozen=True)
class Answer:
    """The verdict (the first line) and the lines of its arithmetic; `fits`: None where there is no verdict."""

    lines: tuple[str, ...]
    fits: bool | None = None


@dataclass(frozen=True)
class Heading:
    text: str


@dataclass(frozen=True)
class Para:
    """One paragraph; `indent`: the text view's indent (its continuation lines get two more)."""

    text: str
    indent: int = 0


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


@dataclass(frozen=True)
class Table:
    """A table: `right` the columns aligned right (numbers); `wrap` the columns (prose) that the text view wraps
    within its width instead of shortening; the others, shortened in the middle where the width needs it."""

    headers: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    right: tuple[int, ...] = ()
    wrap: tuple[int, ...] = ()
    code: tuple[int, ...] = ()  # columns of names from the model: code spans in Markdown, <code> in HTML


Block = Title | Answer | Heading | Para | Bullets | Table


# --- text ---------------------------------------------------------------------------------------------------------


def shorten_middle(text: str, width: int) -> str:
    """Give `text` in at most `width` characters: its start and its end kept, '...' between (a name's scope and its
    own last part are what tell it apart)."""
    if len(text) <= width:
        return text
    if width <= len(_ELLIPSIS):
        return text[:width]
    keep = width - len(_ELLIPSIS)
    head = (keep * 2 + 4) // 5  # (a little more of the end: a name's own last part)
    return text[:head] + _ELLIPSIS + text[len(text) - (keep - head):]


_UNIT = re.compile(r"(?<=\d) (?=(?:B|KiB|MiB|GiB|TiB|PiB)\b)")  # a size's number and unit stay on one line
_KEEP = "\x00"


def wrap(text: str, width: int, indent: int = 0, hanging: int = 2) -> list[str]:
    """Give `text` wrapped at word boundaries in `width` columns (a word longer than a line, a long node's name, is
    shortened in the middle; a size stays whole: '12.00 MiB'), its first line indented by `indent`, the others by
    `indent + hanging`."""
    first, rest = " " * indent, " " * (indent + hanging)
    if len(text) + indent <= width:
        return [first + text]
    room = width - indent - hanging
    if any(len(word) > room for word in text.split(" ")):  # a name longer than a line: shortened in the middle
        text = " ".join(shorten_middle(word, room) for word in text.split(" "))
    lines = textwrap.wrap(_UNIT.sub(_KEEP, text), width=width, initial_indent=first, subsequent_indent=rest,
                          break_on_hyphens=False, break_long_words=True) or [first]
    return [line.replace(_KEEP, " ") for line in lines]


_GAP = 2  # spaces between a text table's columns
_PROSE_FLOOR = 16  # a wrapped column is never narrowed below this
_NAME_FLOOR = 12  # nor a shortened one below this (or its header)


def text_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = (),
               wrap_columns: Sequence[int] = (), width: int | None = None) -> list[str]:
    """Give a table as aligned text lines in at most `width` columns (None: as wide as it is): the prose columns
    (`wrap_columns`) are narrowed first and wrapped onto continuation lines, then the widest name columns are
    shortened in the middle; numbers (`right`) are never cut."""
    widths = [max([len(h), *(len(r[i]) for r in rows)]) for i, h in enumerate(headers)]
    if width is not None:
        widths = _narrowed(widths, headers, right, wrap_columns, width)

    def line(cells: Sequence[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths,
                                                                                                  strict=True)))

    out = [line(headers).rstrip(), line(["-" * w for w in widths]).rstrip()]
    for row in rows:
        pieces = [textwrap.wrap(_UNIT.sub(_KEEP, c), width=widths[i], break_on_hyphens=False) or [""]
                  if i in wrap_columns and len(c) > widths[i] else
                  [c if len(c) <= widths[i] else shorten_middle(c, widths[i])] for i, c in enumerate(row)]
        for k in range(max(len(p) for p in pieces)):
            out.append(line([p[k].replace(_KEEP, " ") if k < len(p) else "" for p in pieces]).rstrip())
    return out


def _narrowed(widths: list[int], headers: Sequence[str], right: Sequence[int], wrap_columns: Sequence[int],
              width: int) -> list[int]:
    widths = list(widths)
    excess = sum(widths) + _GAP * (len(widths) - 1) - width
    prose = [i for i in wrap_columns if i not in right]
    names = [i for i in range(len(widths)) if i not in right and i not in prose]
    floors = {i: max(len(headers[i]), _PROSE_FLOOR if i in prose else _NAME_FLOOR) for i in (*prose, *names)}
    for group in (prose, names):  # prose first (it wraps: nothing is lost), then names (shortened in the middle)
        while excess > 0:  # the widest column of the group loses columns, down to the next widest or its floor
            candidates = [i for i in group if widths[i] > floors[i]]
            if not candidates:
                break
            widest = max(candidates, key=lambda i: widths[i])
            step = min(excess, widths[widest] - max([floors[widest], *(widths[i] for i in candidates
                                                                       if i != widest)]) or 1)
            widths[widest] -= step
            excess -= step
    return widths


def to_text(blocks: Sequence[Block], width: int | None = None) -> str:
    """Give the blocks as terminal text in `width` columns (None: output_width()), made safe for a terminal."""
    width = output_width() if width is None else max(width, MIN_WIDTH)
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Title):  # one line: a long path shortened in the middle (its file's name kept)
            prefix = f"onnxmem {block.command}: "
            model = block.model.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")  # one line
            out.append(prefix + shorten_middle(model, max(width - len(prefix), 20)))
        elif isinstance(block, Answer):
            out += wrap(block.lines[0], width) if block.lines else []
            for line in block.lines[1:]:
                out += wrap(line, width, indent=2, hanging=4)
        elif isinstance(block, Heading):
            out += ["", *wrap(block.text, width)]
        elif isinstance(block, Para):
            out += wrap(block.text, width, indent=block.indent) if block.text else [""]
        elif isinstance(block, Bullets):
            for item in block.items:
                out += wrap(f"- {item}", width)
        else:
            out += text_table(block.headers, block.rows, block.right, block.wrap, width)
    return terminal_text("\n".join(out))


# --- Markdown -----------------------------------------------------------------------------------------------------


def to_markdown(blocks: Sequence[Block]) -> str:
    """Give the blocks as a Markdown document (every name whole; model text escaped: safe.markdown_text)."""
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Title):
            out += [f"# onnxmem {block.command}: {markdown_code(block.model)}", ""]
        elif isinstance(block, Answer):
            out += [f"**{markdown_text(block.lines[0])}**  ", *(f"{markdown_text(line)}  " for line in block.lines[1:])]
        elif isinstance(block, Heading):
            out += ["", f"## {markdown_text(block.text)}", ""]
        elif isinstance(block, Para):
            out += [f"{markdown_text(block.text)}  " if block.text else ""]
        elif isinstance(block, Bullets):
            out += [f"- {markdown_text(item)}" for item in block.items]
        else:
            align = ["---:" if i in block.right else "---" for i in range(len(block.headers))]
            out += ["| " + " | ".join(markdown_text(h) for h in block.headers) + " |", "|" + "|".join(align) + "|",
                    *("| " + " | ".join(markdown_code(c) if i in block.code and c else markdown_text(c)
                                        for i, c in enumerate(r)) + " |" for r in block.rows)]
    return terminal_text("\n".join(out) + "\n")


# --- HTML ---------------------------------------------------------------------------------------------------------


def to_html(blocks: Sequence[Block]) -> list[str]:
    """Give the blocks as HTML elements (real tables, every name whole and escaped; long names break anywhere so
    that the page never scrolls sideways)."""
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Title):
            out.append(f"<h1>onnxmem {escape(block.command)}: <code>{escape(block.model)}</code></h1>")
        elif isinstance(block, Answer):
            if not block.lines:
                continue
            kind = "" if block.fits is None else (" fits" if block.fits else " nofit")
            out.append(f'<div class="answer{kind}"><p class="verdict">{escape(block.lines[0])}</p>'
                       + "".join(f'<p class="arithmetic">{escape(line)}</p>' for line in block.lines[1:])
                       + "</div>")
        elif isinstance(block, Heading):
            out.append(f"<h2>{escape(block.text)}</h2>")
        elif isinstance(block, Para):
            if block.text:
                out.append(f'<p{" class=indent" if block.indent else ""}>{escape(block.text)}</p>')
        elif isinstance(block, Bullets):
            out.append("<ul>" + "".join(f"<li>{escape(item)}</li>" for item in block.items) + "</ul>")
        else:
            out.append(html_table(block.headers, block.rows, block.right, block.code, block.wrap))
    return out


def html_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[int] = (),
               code: Sequence[int] = (), wrap_columns: Sequence[int] = ()) -> str:
    """Give a table as one HTML <table>: numbers (`right`) aligned right and never broken, names (`code`) and prose
    (`wrap_columns`) free to break anywhere (so that a 200-character name never widens the page), the rest whole."""
    head = "".join(f'<th{" class=n" if i in right else ""}>{escape(h)}</th>' for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f'<td class=n>{escape(c)}</td>' if i in right else
                                    f'<td><code>{escape(c)}</code></td>' if i in code and c else
                                    f'<td class=w>{escape(c)}</td>' if i in wrap_columns else
                                    f'<td>{escape(c)}</td>' for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f'<div class="table"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'
