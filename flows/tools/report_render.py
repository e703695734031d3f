"""A report as a list of blocks, written as Markdown (beside its PNGs) or as one HTML file
(the PNGs inline as ``data:`` URLs, no script, no external resource: it opens from disk).

Text is plain with ``code`` spans in backticks and ``*emphasis*``; both outputs are a
function of the blocks (and the PNGs' bytes) only, so the same report gives the same bytes.

>>> blocks = [Heading("Title", 1), Para("See `x` < 3."), Table(("a", "n"), (("x", "1"),))]
>>> print(markdown(blocks))
# Title
<BLANKLINE>
See `x` < 3.
<BLANKLINE>
| a | n |
|---|---:|
| x | 1 |
<BLANKLINE>
>>> "<p>See <code>x</code> &lt; 3.</p>" in html(blocks, "Title")
True
"""

from __future__ import annotations

import base64
import html as html_escape
import re
import struct
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Para:
    text: str


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]


NUMBER = re.compile(r"^[-+–]?[\d,]*\.?\d*%?$")


@dataclass(frozen=True)
class Table:
    """Rows of cells; a column whose cells are all numbers is right-aligned."""

    header: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]

    def numeric(self) -> list[bool]:
        """Per column: whether every cell of it is a number (or a dash)."""
        return [
            bool(self.rows) and all(NUMBER.match(row[i]) for row in self.rows)
            for i in range(len(self.header))
        ]


@dataclass(frozen=True)
class Figure:
    path: Path  # a PNG beside the report
    alt: str
    caption: str


Block = Heading | Para | Bullets | Table | Figure


def markdown(blocks: list[Block]) -> str:
    """The blocks as Markdown (figures link their PNG by file name)."""
    out: list[str] = []
    for block in blocks:
        if isinstance(block, Heading):
            out += ["#" * block.level + " " + block.text, ""]
        elif isinstance(block, Para):
            out += [block.text, ""]
        elif isinstance(block, Bullets):
            out += [f"- {item}" for item in block.items] + [""]
        elif isinstance(block, Table):
            out.append(_md_row(block.header))
            out.append("|" + "".join("---:|" if n else "---|" for n in block.numeric()))
            out += [_md_row(row) for row in block.rows] + [""]
        else:
            out += [f"![{block.alt}]({block.path.name})", ""]
            out += [f"*{block.caption}*", ""] if block.caption else []
    return "\n".join(out)


def _md_row(cells: tuple[str, ...]) -> str:
    return "| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |"


STYLE = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto;
       padding: 0 1rem; line-height: 1.45; color: #222; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; }
th, td { border: 1px solid #ccc; padding: 0.25rem 0.6rem; }
th { background: #f3f3f3; } td.n, th.n { text-align: right; }
code { background: #f3f3f3; padding: 0 0.2rem; }
figure { margin: 1rem 0 2rem; } img { max-width: 100%; height: auto; }
figcaption { font-size: 0.92rem; color: #444; max-width: 60rem; }
"""


def _inline(text: str) -> str:
    """Escaped HTML of a text, with its `code` spans and *emphasis*."""
    parts = re.split(r"`([^`]*)`", text)
    return "".join(
        f"<code>{html_escape.escape(p)}</code>" if i % 2 else _emphasis(html_escape.escape(p))
        for i, p in enumerate(parts)
    )


def _emphasis(escaped: str) -> str:
    return re.sub(r"\*([^*]+)\*", r"<em>\1</em>", escaped)


def png_size(data: bytes) -> tuple[int, int]:
    """(width, height) of a PNG, from its header."""
    if data[:8] != b"\x89PNG\r\n\x1a\n" or data[12:16] != b"IHDR":
        raise ValueError("not a PNG")
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _html_block(block: Block) -> str:
    if isinstance(block, Heading):
        return f"<h{block.level}>{_inline(block.text)}</h{block.level}>"
    if isinstance(block, Para):
        return f"<p>{_inline(block.text)}</p>"
    if isinstance(block, Bullets):
        return "<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block.items) + "</ul>"
    if isinstance(block, Table):
        right = [' class="n"' if n else "" for n in block.numeric()]
        head = "".join(
            f"<th{a}>{_inline(c)}</th>" for a, c in zip(right, block.header, strict=True)
        )
        rows = "".join(
            "<tr>"
            + "".join(f"<td{a}>{_inline(c)}</td>" for a, c in zip(right, r, strict=True))
            + "</tr>"
            for r in block.rows
        )
        return f"<table><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>"
    data = block.path.read_bytes()
    width, height = png_size(data)
    src = "data:image/png;base64," + base64.b64encode(data).decode("ascii")
    return (
        f'<figure><img src="{src}" alt="{html_escape.escape(block.alt)}" width="{width}" '
        f'height="{height}"><figcaption>{_inline(block.caption)}</figcaption></figure>'
    )


def html(blocks: list[Block], title: str) -> str:
    """The blocks as one self-contained HTML page."""
    body = "\n".join(_html_block(b) for b in blocks)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{html_escape.escape(title)}</title>\n<style>{STYLE}</style>\n</head>\n"
        f"<body>\n{body}\n</body>\n</html>\n"
    )
