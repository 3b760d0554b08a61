"""SICK and STS for the MaLSTM: tokenisation, the validation split, the STS pretraining pool and its
leak guard, and padded id arrays for training."""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sembridge_ray.data.sick import Pair, read_sick_split
from sembridge_ray.data.sts import read_sts, sts_files
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.siamese.model import PAD

_TOKEN = re.compile(r"\w+|[^\w\s]")


def tokenize(text: str) -> list[str]:
    """Whitespace plus punctuation splitting, case kept: ``"Don't stop."`` -> ``Don ' t stop .``"""
    return _TOKEN.findall(text)


def normalise(text: str) -> str:
    """The leak guard's sentence key: lower-cased word tokens, punctuation and spacing dropped."""
    return " ".join(t.lower() for t in tokenize(text) if t[0].isalnum() or t[0] == "_")


def require_pairs(name: str, pairs: Sequence[Pair]) -> Sequence[Pair]:
    """An empty split is an input error, not a silent zero-length training run."""
    if not pairs:
        raise InputError(f"{name} is empty")
    return pairs


def read_sick_training(sick_dir: Path, limit: int = 0) -> list[Pair]:
    """SICK train + trial, the paper's 5,000 training pairs (the first ``limit`` when > 0, for smoke
    runs)."""
    pairs = read_sick_split(sick_dir, "train") + read_sick_split(sick_dir, "trial")
    return list(require_pairs(f"SICK train+trial in {sick_dir}", pairs[: limit or None]))


def split_validation(
    pairs: Sequence[Pair], fraction: float, rng: np.random.Generator
) -> tuple[list[Pair], list[Pair]]:
    """A seeded random ``fraction`` of ``pairs`` held out for validation: (train, validation), both
    non-empty."""
    n_val = round(len(pairs) * fraction)
    if not 0 < n_val < len(pairs):
        raise InputError(
            f"a validation fraction of {fraction} leaves an empty split of {len(pairs)} pairs"
        )
    order = rng.permutation(len(pairs))
    val = set(order[:n_val].tolist())
    train = [p for i, p in enumerate(pairs) if i not in val]
    return train, [p for i, p in enumerate(pairs) if i in val]


def read_sts_pool(sts_dir: Path, years: Sequence[int], limit: int = 0) -> list[Pair]:
    """Scored STS pairs of ``years`` with 0-5 scores mapped onto SICK's scale by 1 + 0.8·s."""
    pairs = [
        Pair(pair_id=p.pair_id, a=p.a, b=p.b, score=1.0 + 0.8 * p.score)
        for f in sts_files(sts_dir, years)
        for p in read_sts(f)
    ]
    return list(require_pairs(f"the STS pool {list(years)} in {sts_dir}", pairs[: limit or None]))


def leak_guard(pool: Sequence[Pair], protected: Iterable[Pair]) -> tuple[list[Pair], int]:
    """(``pool`` pairs kept, number removed): drops every pair whose two normalised sentences match
    a ``protected`` pair in either order."""
    keys = set()
    for p in protected:
        a, b = normalise(p.a), normalise(p.b)
        keys.update({(a, b), (b, a)})
    kept = [p for p in pool if (normalise(p.a), normalise(p.b)) not in keys]
    return kept, len(pool) - len(kept)


@dataclass(frozen=True, kw_only=True)
class TokenPair:
    """A pair after tokenisation; augmented copies keep the source pair's score and get
    ``<id>~aug<pass>``."""

    pair_id: str
    a: tuple[str, ...]
    b: tuple[str, ...]
    score: float


def tokenize_pairs(pairs: Iterable[Pair]) -> list[TokenPair]:
    return [
        TokenPair(pair_id=p.pair_id, a=tuple(tokenize(p.a)), b=tuple(tokenize(p.b)), score=p.score)
        for p in pairs
    ]


@dataclass(frozen=True, kw_only=True)
class EncodedPairs:
    """Padded id arrays: ``ids_a`` (N, Ta), ``len_a`` (N,), ``ids_b`` (N, Tb), ``len_b`` (N,),
    ``score`` (N,)."""

    pair_ids: tuple[str, ...]
    ids_a: np.ndarray
    len_a: np.ndarray
    ids_b: np.ndarray
    len_b: np.ndarray
    score: np.ndarray

    def __len__(self) -> int:
        return len(self.pair_ids)


class Vocabulary:
    """Word -> row of the embedding matrix; row 0 is padding, so words start at 1."""

    def __init__(self, words: Iterable[str]) -> None:
        self.words: list[str] = list(dict.fromkeys(words))
        self.index = {w: i + 1 for i, w in enumerate(self.words)}

    def __len__(self) -> int:
        return len(self.words) + 1

    def ids(self, tokens: Sequence[str]) -> list[int]:
        return [self.index[t] for t in tokens]


def vocabulary(*groups: Iterable[TokenPair]) -> Vocabulary:
    """Every token of every pair, in first-seen order."""
    return Vocabulary(t for pairs in groups for p in pairs for t in (*p.a, *p.b))


def encode_pairs(pairs: Sequence[TokenPair], vocab: Vocabulary) -> EncodedPairs:
    """Token pairs -> padded id arrays (an empty sentence keeps length 0 and encodes as all
    padding)."""

    def pad(sides: list[tuple[str, ...]]) -> tuple[np.ndarray, np.ndarray]:
        lengths = np.array([len(s) for s in sides], dtype=np.int64)
        ids = np.full((len(sides), max(1, int(lengths.max(initial=1)))), PAD, dtype=np.int64)
        for row, side in enumerate(sides):
            ids[row, : len(side)] = vocab.ids(side)
        return ids, lengths

    ids_a, len_a = pad([p.a for p in pairs])
    ids_b, len_b = pad([p.b for p in pairs])
    return EncodedPairs(
        pair_ids=tuple(p.pair_id for p in pairs),
        ids_a=ids_a,
        len_a=len_a,
        ids_b=ids_b,
        len_b=len_b,
        score=np.array([p.score for p in pairs], dtype=np.float64),
    )
