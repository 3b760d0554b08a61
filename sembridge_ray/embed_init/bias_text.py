"""``bias: frequency``'s text: the target tokens' counts on ``bias_text``, read whole before any
work, and the check that they vary among the tokens to initialise."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq

from sembridge_ray.embed_init import plus
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.text import decode_line

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase


def read_texts(path: str) -> list[str]:
    """``bias_text``: a ``.txt`` file (one text per line, UTF-8; ``.gz`` too) or a Parquet file
    (every string column's values). A file that cannot be read is an :class:`InputError` naming it
    (and the line)."""
    file = Path(path)
    if file.suffix == ".parquet":
        try:
            table = pq.read_table(file)
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            raise InputError(
                f"--bias-text {path}: not a readable Parquet file ({str(err).splitlines()[0]})"
            ) from None
        strings = [
            f.name
            for f in table.schema
            if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
        ]
        return [text for name in strings for text in table.column(name).to_pylist() if text]
    raw = file.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:  # one line naming the line and column (text_lines' wording)
        lineno = raw.count(b"\n", 0, err.start) + 1
        decode_line(raw.split(b"\n")[lineno - 1], f"--bias-text {path}:{lineno}")
        raise
    return [line for line in text.splitlines() if line.strip()]


def bias_counts(tokenizer: PreTrainedTokenizerBase, path: str) -> dict[int, int]:
    """The target tokens' counts on ``bias_text``, read whole before any work: an unreadable or
    empty text is one :class:`InputError`."""
    texts = read_texts(path)
    if not texts:
        raise InputError(f"--bias-text {path}: holds no text (every line or string is empty)")
    return plus.token_counts(tokenizer, texts)


def require_varying_counts(counts: dict[int, int], rest: list[int], text: str) -> None:
    """``bias: frequency`` standardises the log-counts of the tokens it initialises: refuse a text
    in which they do not vary (none occurs, or all equally often), which would give every one the
    same bias (the source's mean)."""
    seen = {counts.get(int(i), 0) for i in rest}
    if len(rest) > 1 and len(seen) < 2:
        found = "none of them occurs" if seen == {0} else "all occur equally often"
        raise InputError(
            f"--bias-text {text}: {found} among the {len(rest)} tokens to initialise, so the frequency bias would be "
            "one constant; give target-language text in which they occur"
        )
