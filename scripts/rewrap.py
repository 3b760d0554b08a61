"""Rewrap prose in docstrings and comments to a line length (the formatter's): the paragraphs that
have a line over the limit are refilled; code examples, tables, doctests and literal blocks are left
as they are.

    python scripts/rewrap.py --width 100 FILE_OR_DIR ...

A paragraph is a run of lines at one prose indent: the docstring's own, or a bullet's text (``- ``,
``* ``, ``1. ``) under it. A line at any other indent, a table row (``|``), a doctest (``>>>``) or a
directive (``..``) is kept verbatim, and so is a block after a line ending in ``::``. A trailing
comment that makes a line too long moves to its own line above the code (pragmas such as ``# type:``
and ``# noqa`` stay). ``ruff format`` does the code."""

from __future__ import annotations

import argparse
import ast
import io
import re
import sys
import textwrap
import tokenize
from pathlib import Path

BULLET = re.compile(r"(?:[-*+]|\d+[.)]|\(\w\))\s+")
PRAGMA = re.compile(r"#\s*(type:|noqa|pragma|fmt:|ruff:|mypy:)")
VERBATIM = ("|", ">>>", "..", "+--", "```")


def fill(words: str, first: str, rest: str, width: int) -> list[str]:
    return textwrap.wrap(
        words,
        width=width,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [first.rstrip()]


def rewrap_block(lines: list[str], base: int, width: int) -> list[str]:
    """The lines of one docstring, its prose at indent ``base``, with the paragraphs too long
    refilled."""
    out: list[str] = []
    i = 0
    literal_indent: int | None = None
    while i < len(lines):
        line = lines[i]
        stripped = line.strip()
        indent = len(line) - len(line.lstrip(" "))
        if not stripped:
            out.append(line)
            i += 1
            continue
        if literal_indent is not None:
            if indent > literal_indent:
                out.append(line)
                i += 1
                continue
            literal_indent = None
        prose_indents = {base}
        # indents opened by bullets above (nearest first): allowed while we are inside them
        for prev in reversed(out):
            if not prev.strip():
                continue
            p_indent = len(prev) - len(prev.lstrip(" "))
            m = BULLET.match(prev.lstrip(" "))
            if m and p_indent < indent:
                prose_indents.add(p_indent + m.end())
            if p_indent <= base:
                break
        bullet = BULLET.match(stripped)
        if indent not in prose_indents or stripped.startswith(VERBATIM):
            out.append(line)
            i += 1
            if stripped.endswith("::"):
                literal_indent = indent
            continue
        text_indent = indent + (bullet.end() if bullet else 0)
        para = [line]
        j = i + 1
        while j < len(lines):
            nxt = lines[j]
            n_strip = nxt.strip()
            n_indent = len(nxt) - len(nxt.lstrip(" "))
            if (
                not n_strip
                or n_indent != text_indent
                or BULLET.match(n_strip)
                or n_strip.startswith(VERBATIM)
                or para[-1].rstrip().endswith("::")
            ):
                break
            para.append(nxt)
            j += 1
        if any(len(p) > width for p in para) and not para[-1].rstrip().endswith("::"):
            words = " ".join(p.strip() for p in para)
            if bullet:
                words = words[bullet.end() :]
                first = " " * indent + stripped[: bullet.end()]
            else:
                first = " " * indent
            out.extend(fill(words, first, " " * text_indent, width))
        else:
            out.extend(para)
        if para[-1].rstrip().endswith("::"):
            literal_indent = indent
        i = j
    return out


def docstring_spans(source: str) -> list[tuple[int, int]]:
    """(first line, last line), 1-based, of every statement that is a bare triple-quoted string."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Expr)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and node.end_lineno is not None
        ):
            spans.append((node.lineno, node.end_lineno))
    return spans


def rewrap_docstring(lines: list[str], start: int, end: int, width: int) -> list[str]:
    """The physical lines ``start..end`` (0-based, inclusive) of one docstring, rewrapped. The
    opening quotes are held by a placeholder glued to the first word, so the first line is prose at
    the docstring's indent."""
    block = lines[start : end + 1]
    m = re.match(r'(\s*)([rRbBuU]?(?:"""|\'\'\'))', block[0])
    if not m:
        return block
    base, quotes = len(m.group(1)), m.group(2)
    hold = "\x00" * len(quotes)
    first = " " * base + hold + block[0][m.end() :]
    new = rewrap_block([first, *block[1:]], base, width)
    return [new[0].replace(hold, quotes, 1), *new[1:]]


def rewrap_comments(lines: list[str], source: str, width: int, skip: set[int]) -> list[str]:
    """Full-line comment paragraphs refilled; a trailing comment that makes its line too long moved
    above it."""
    trailing: dict[int, int] = {}
    full: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            row = tok.start[0] - 1
            if lines[row][: tok.start[1]].strip():
                trailing[row] = tok.start[1]
            else:
                full.add(row)
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        if (
            i in full
            and i not in skip
            and not PRAGMA.match(line.strip())
            and not line.strip().startswith("#!")
        ):
            indent = len(line) - len(line.lstrip(" "))
            j = i
            while (
                j + 1 < len(lines)
                and j + 1 in full
                and len(lines[j + 1]) - len(lines[j + 1].lstrip(" ")) == indent
                and lines[j + 1].strip() not in ("#",)
                and not BULLET.match(lines[j + 1].strip()[1:].strip())
                and not PRAGMA.match(lines[j + 1].strip())
            ):
                j += 1
            para = lines[i : j + 1]
            if any(len(p) > width for p in para):
                words = " ".join(p.strip()[1:].strip() for p in para)
                lead = " " * indent + "# "
                out.extend(fill(words, lead, lead, width))
            else:
                out.extend(para)
            i = j + 1
            continue
        if i in trailing and len(line) > width and i not in skip:
            col = trailing[i]
            code, comment = line[:col].rstrip(), line[col:].strip()
            if not PRAGMA.match(comment) and len(code) <= width:
                indent = len(line) - len(line.lstrip(" "))
                lead = " " * indent + "# "
                out.extend(fill(comment[1:].strip(), lead, lead, width))
                out.append(code)
                i += 1
                continue
        out.append(line)
        i += 1
    return out


def rewrap_source(source: str, width: int) -> str:
    lines = source.split("\n")
    spans = docstring_spans(source)
    in_doc: set[int] = set()
    for start, end in sorted(spans, reverse=True):
        s, e = start - 1, end - 1
        if any(len(x) > width for x in lines[s : e + 1]):
            lines[s : e + 1] = rewrap_docstring(lines, s, e, width)
    source = "\n".join(lines)
    for start, end in docstring_spans(source):
        in_doc.update(range(start - 1, end))
    lines = rewrap_comments(source.split("\n"), source, width, in_doc)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("paths", nargs="+")
    parser.add_argument("--width", type=int, default=100)
    args = parser.parse_args(argv)
    files = [
        f for p in map(Path, args.paths) for f in ([p] if p.is_file() else sorted(p.rglob("*.py")))
    ]
    changed = 0
    for path in files:
        old = path.read_text()
        new = rewrap_source(old, args.width)
        if new != old:
            ast.parse(new)  # still Python
            path.write_text(new)
            changed += 1
    print(f"rewrapped {changed} of {len(files)} files", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
