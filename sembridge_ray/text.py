"""Text inputs read line by line (UTF-8, gzip-compressed when the name ends in ``.gz``), so that a
file that cannot be read is one :class:`InputError` naming it and the line: a byte that is not
UTF-8, damaged or truncated gzip data.

Lines are read as bytes and decoded one at a time, because a text-mode file decodes ahead in 8 KiB
chunks: its ``UnicodeDecodeError`` is raised lines before the bad byte is reached and says nothing
about where it is."""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from pathlib import Path

from sembridge_ray.runtime.errors import InputError

# What gzip raises on damaged input: a bad header or CRC (BadGzipFile), a bad deflate stream
# (zlib.error), a truncated file (EOFError).
GZIP_ERRORS = (gzip.BadGzipFile, zlib.error, EOFError)


def decode_line(raw: bytes, where: str) -> str:
    """One line's bytes as text; a byte that is not UTF-8 is an :class:`InputError` at ``where``
    (``file:line``), naming the byte and its column."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as err:
        column = len(raw[: err.start].decode("utf-8", errors="replace")) + 1
        raise InputError(
            f"{where}: not UTF-8 text (byte 0x{raw[err.start]:02x} at column {column})"
        ) from None


def text_lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number from 1, line) of a UTF-8 text file, ``.gz`` decompressed; ``\\r\\n`` ends a line
    as ``\\n`` does (both are kept at the line's end, as ``\\n``). A missing file, a byte that is
    not UTF-8 or damaged gzip data is an :class:`InputError` naming the file (and the line)."""
    path = Path(path)
    lineno = 0
    try:
        with gzip.open(path, "rb") if path.name.endswith(".gz") else open(path, "rb") as fh:
            for lineno, raw in enumerate(fh, start=1):
                line = decode_line(raw, f"{path}:{lineno}")
                yield lineno, line[:-2] + "\n" if line.endswith("\r\n") else line
    except FileNotFoundError:
        raise InputError(f"{path}: file not found") from None
    except GZIP_ERRORS as err:
        where = f"after line {lineno}" if lineno else "at its start"
        raise InputError(f"{path}: damaged gzip data {where} ({err})") from None


def nonblank_lines(path: Path) -> Iterator[tuple[int, str]]:
    """:func:`text_lines` without the lines that hold only whitespace."""
    return ((lineno, line) for lineno, line in text_lines(path) if line.strip())
