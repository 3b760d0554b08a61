"""Position-aware bridging: word-initial and continuation pieces are matched within their own class
first.

Why: the released string rule ``decode([id]).strip()`` erases the word position on byte-level BPE
and SentencePiece vocabularies (``Ġing`` and ``ing`` both become "ing", as do ``▁Haus`` and
``Haus``), while a WordPiece source keeps it (``##ing`` decodes to "##ing"). A target continuation
piece then has the *word-initial* source token as its string-identical nearest neighbour, and α=4's
narrow supports give it all the mass.

Every token gets a position class from its canonical form (``vocab.canonical``: each family's own
marker, WordPiece ``##``, SentencePiece ``▁``, byte-level ``Ġ``):

| class          | canonical form                                                               |
|----------------|-------------------------------------------------------------------------------|
| word-initial   | starts with ``▁``                                                             |
| continuation   | any other form with a letter or digit                                         |
| neutral        | punctuation, symbols or space only, byte pieces ``<0xNN>``, any ``raw`` family |

Punctuation is neutral because WordPiece pre-tokenizers isolate it: a WordPiece ``##.`` is never
produced, so its row is untrained, while a byte-level ``.`` (glued to the previous word) is one of
the most frequent pieces.

The rule kept (``position_aware=true``; docs/position-aware.md has the measured alternatives):

- **Marked strings.** A continuation piece is bridged as ``marker + text`` in *both* vocabularies (a
  byte-level or SentencePiece ``ing`` and a WordPiece ``##ing`` all become "-ing" with the default
  marker ``-``); word-initial and neutral strings are the released ones. The target ``ing`` and the
  source ``##ing`` then read the same, and a target continuation piece is compared with source
  continuation pieces on equal terms. There is no threshold to fall back across classes: the bridge
  model's own cosine decides, so a cross-class candidate still wins when it is the closer string
  despite the marker.
- **An optional class prior** (``position_penalty``, 0 by default: it added nothing on top of the
  marker): the penalty is subtracted from the cosine of every candidate of the other non-neutral
  class before α-entmax or softmax. A cross-class candidate then wins only when it beats the best
  in-class cosine by more than the penalty; above 2 plus the support radius it is a hard mask that
  falls back to every candidate only when a class has none. Neutral rows get no prior, and neutral
  candidates are never penalised.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

import numpy as np
import torch

from sembridge_ray.embed_init.plus import folded_index
from sembridge_ray.embed_init.vocab import (
    WORD_START,
    Family,
    VocabIndex,
    canonical,
    tokenizer_family,
)
from sembridge_ray.sparse.csr import csr_from_entries

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

INITIAL, CONTINUATION, NEUTRAL = 0, 1, 2
CLASS_NAMES = ("word_initial", "continuation", "neutral")
WORDPIECE_PREFIX = "##"
_BYTES = re.compile(r"^(<0x[0-9A-Fa-f]{2}>)+$")


def position_class(canon: str, neutral_symbols: bool = True) -> int:
    """The position class of a canonical form (table in the module docstring).
    ``neutral_symbols=False`` is the ablation of the neutral class (docs/position-aware.md):
    punctuation and symbols get a position class like words, and only byte pieces and a bare ``▁``
    stay neutral."""
    if _BYTES.match(canon):
        return NEUTRAL
    if neutral_symbols and not any(ch.isalnum() for ch in canon.removeprefix(WORD_START)):
        return NEUTRAL
    if not neutral_symbols and canon == WORD_START:
        return NEUTRAL
    return INITIAL if canon.startswith(WORD_START) else CONTINUATION


def vocab_classes(
    vocab: dict[str, int],
    family: Family,
    size: int,
    specials: set[int] | None = None,
    neutral_symbols: bool = True,
) -> np.ndarray:
    """(size,) int8 position class by id; ids not in ``vocab``, ``specials`` and every id of a
    ``raw`` family are neutral (a raw vocabulary has no position marker to read).
    ``neutral_symbols``: see :func:`position_class`."""
    out = np.full(size, NEUTRAL, dtype=np.int8)
    if family == "raw":
        return out
    skip = specials or set()
    for token, token_id in vocab.items():
        if token_id < size and token_id not in skip:
            out[token_id] = position_class(canonical(token, family), neutral_symbols)
    return out


def marked_string(text: str, cls: int, marker: str, own_prefix: str = "") -> str:
    """The bridge string of a token under the marked rule: ``marker`` + text for continuation
    pieces, ``text`` otherwise. ``own_prefix``: the family's marker that the released string already
    carries (WordPiece's ``##``: ``##ing`` decodes to "##ing"), replaced by ``marker``."""
    return marker + text.removeprefix(own_prefix) if cls == CONTINUATION else text


def marked_rule(marker: str) -> str:
    """The string rule's name in bridge-cache keys (``bridge.tokenizer_fingerprint``)."""
    return f"decode-strip-or-raw-v1+continuation-marker-{marker}"


def class_offsets(
    new_class: int, source_classes: torch.Tensor, penalty: float
) -> torch.Tensor | None:
    """(M,) float64 additive prior on the cosines for rows of class ``new_class``: ``-penalty`` on
    candidates of the other non-neutral class, 0 elsewhere; None for neutral rows or ``penalty ==
    0`` (no prior)."""
    if new_class == NEUTRAL or penalty == 0:
        return None
    other = (source_classes != new_class) & (source_classes != NEUTRAL)
    # built in float64: -0.3 stays -0.3, not fp32's -0.30000001
    return other.to(torch.float64) * -float(penalty)


RowWeights = Callable[[torch.Tensor, "torch.Tensor | None"], torch.Tensor]
"""(row indices (r,), offsets (M,) or None) -> CSR (r, M) weights of those rows with that prior."""


def class_weights(
    weights: RowWeights, new_classes: torch.Tensor, source_classes: torch.Tensor, penalty: float
) -> torch.Tensor:
    """CSR (n, M): each position class's rows weighted with its own prior (:func:`class_offsets`),
    reassembled in row order. ``new_classes`` (n,) and ``source_classes`` (M,) hold classes of the
    rows and candidates."""
    parts = []
    for cls in (INITIAL, CONTINUATION, NEUTRAL):
        rows = torch.nonzero(new_classes == cls).flatten()
        if len(rows):
            parts.append((rows, weights(rows, class_offsets(cls, source_classes, penalty))))
    return stack_rows(parts, len(new_classes), len(source_classes))


def stack_rows(parts: list[tuple[torch.Tensor, torch.Tensor]], n: int, m: int) -> torch.Tensor:
    """CSR blocks of rows (row ids (r,), CSR (r, M)) that together cover ``range(n)`` once -> one
    CSR (n, M)."""
    none = torch.zeros(0, dtype=torch.int64)
    entries = [(none, none, none.float())]
    for ids, w in parts:
        crow = w.crow_indices()
        at = torch.repeat_interleave(ids.to(torch.int64), crow[1:] - crow[:-1])
        entries.append((at, w.col_indices().to(torch.int64), w.values().float()))
    rows, cols, vals = (torch.cat(c) for c in zip(*entries, strict=True))
    return csr_from_entries(rows, cols, vals, n, m)


def tokenizer_classes(
    tokenizer: PreTrainedTokenizerBase, size: int, neutral_symbols: bool = True
) -> np.ndarray:
    """(size,) position class by id of a tokenizer's vocabulary (special tokens neutral)."""
    specials = set(tokenizer.all_special_ids)
    return vocab_classes(
        tokenizer.get_vocab(), tokenizer_family(tokenizer), size, specials, neutral_symbols
    )


def exact_counterparts(
    source: PreTrainedTokenizerBase, target: PreTrainedTokenizerBase, target_ids: Iterable[int]
) -> dict[int, int]:
    """Target id -> its source counterpart, for the ``target_ids`` that have one: the source token
    with the same canonical form (the partition's exact rule), else with the same canonical form up
    to case (an uncased source has ``the`` for a cased target's ``The``). The word position is part
    of the form either way; specials excluded."""
    index = VocabIndex.build(
        source.get_vocab(), tokenizer_family(source), exclude=source.all_special_ids
    )
    folded = folded_index(index)  # an already lower-case form first, then the lowest id
    family = tokenizer_family(target)
    tokens = {i: t for t, i in target.get_vocab().items()}
    forms = {tid: canonical(tokens[tid], family) for tid in map(int, target_ids) if tid in tokens}
    hits = {tid: index.exact.get(form, folded.get(form.lower())) for tid, form in forms.items()}
    return {tid: hit for tid, hit in hits.items() if hit is not None}
