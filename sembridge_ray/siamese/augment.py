"""Thesaurus augmentation of the training pairs, as Mueller & Thyagarajan did it (reconstructed from
their data).

Candidates for a word are the head lemmas of its WordNet 3.0 synsets
(``synset.name().split('.')[0]``), deduplicated, minus the word itself. Each pass replaces every
non-stopword token that has candidates by one drawn uniformly, accepted only when the word vectors'
cosine clears the gate; a new pair is kept only when both sentences changed, keeps its source's
score, and is dropped when it duplicates a pair already present."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from sembridge_ray.resources import asset
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.siamese.data import TokenPair

log = logging.getLogger(__name__)


def bundled_thesaurus() -> Path:
    """The bundled thesaurus of the SICK vocabulary (the assets' ``thesaurus/``, with WordNet's
    licence)."""
    return asset("thesaurus/sick_wordnet30.tsv")


# NLTK's English stopword list (nltk_data corpora/stopwords/english), which the authors' code
# filtered with.
STOPWORDS = frozenset(
    [
        "i",
        "me",
        "my",
        "myself",
        "we",
        "our",
        "ours",
        "ourselves",
        "you",
        "you're",
        "you've",
        "you'll",
        "you'd",
        "your",
        "yours",
        "yourself",
        "yourselves",
        "he",
        "him",
        "his",
        "himself",
        "she",
        "she's",
        "her",
        "hers",
        "herself",
        "it",
        "it's",
        "its",
        "itself",
        "they",
        "them",
        "their",
        "theirs",
        "themselves",
        "what",
        "which",
        "who",
        "whom",
        "this",
        "that",
        "that'll",
        "these",
        "those",
        "am",
        "is",
        "are",
        "was",
        "were",
        "be",
        "been",
        "being",
        "have",
        "has",
        "had",
        "having",
        "do",
        "does",
        "did",
        "doing",
        "a",
        "an",
        "the",
        "and",
        "but",
        "if",
        "or",
        "because",
        "as",
        "until",
        "while",
        "of",
        "at",
        "by",
        "for",
        "with",
        "about",
        "against",
        "between",
        "into",
        "through",
        "during",
        "before",
        "after",
        "above",
        "below",
        "to",
        "from",
        "up",
        "down",
        "in",
        "out",
        "on",
        "off",
        "over",
        "under",
        "again",
        "further",
        "then",
        "once",
        "here",
        "there",
        "when",
        "where",
        "why",
        "how",
        "all",
        "any",
        "both",
        "each",
        "few",
        "more",
        "most",
        "other",
        "some",
        "such",
        "no",
        "nor",
        "not",
        "only",
        "own",
        "same",
        "so",
        "than",
        "too",
        "very",
        "s",
        "t",
        "can",
        "will",
        "just",
        "don",
        "don't",
        "should",
        "should've",
        "now",
        "d",
        "ll",
        "m",
        "o",
        "re",
        "ve",
        "y",
        "ain",
        "aren",
        "aren't",
        "couldn",
        "couldn't",
        "didn",
        "didn't",
        "doesn",
        "doesn't",
        "hadn",
        "hadn't",
        "hasn",
        "hasn't",
        "haven",
        "haven't",
        "isn",
        "isn't",
        "ma",
        "mightn",
        "mightn't",
        "mustn",
        "mustn't",
        "needn",
        "needn't",
        "shan",
        "shan't",
        "shouldn",
        "shouldn't",
        "wasn",
        "wasn't",
        "weren",
        "weren't",
        "won",
        "won't",
        "wouldn",
        "wouldn't",
    ]
)

Thesaurus = Mapping[str, Sequence[str]]


def wordnet_candidates(word: str, wordnet: object) -> list[str]:
    """Head lemmas of the WordNet synsets of ``word``, in WordNet's order, deduplicated, minus
    ``word`` itself."""
    key = word.lower()
    heads = dict.fromkeys(s.name().split(".")[0] for s in wordnet.synsets(key))  # type: ignore[attr-defined]
    return [h for h in heads if h != key]


def load_wordnet(extra_dir: str = "") -> object | None:
    """nltk's WordNet 3.0 reader, or None when its files cannot be found (``extra_dir`` joins nltk's
    search path)."""
    import nltk
    from nltk.corpus import wordnet

    if extra_dir and extra_dir not in nltk.data.path:
        nltk.data.path.append(extra_dir)
    try:
        wordnet.ensure_loaded()
    except LookupError:
        return None
    if wordnet.get_version() != "3.0":
        log.warning(
            "WordNet %s found; the authors' thesaurus was WordNet 3.0", wordnet.get_version()
        )
    return wordnet


def build_thesaurus(words: Iterable[str], wordnet: object) -> dict[str, list[str]]:
    """Lower-cased word -> its WordNet candidates, for every word that has some."""
    lowered = dict.fromkeys(w.lower() for w in words)
    return {w: cands for w in lowered if (cands := wordnet_candidates(w, wordnet))}


def read_thesaurus(path: Path) -> dict[str, list[str]]:
    """``word<TAB>cand cand ...`` lines; ``#`` lines are comments (the licence notice)."""
    out = {}
    with open(path, encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip() or line.startswith("#"):
                continue
            word, sep, cands = line.rstrip("\n").partition("\t")
            if not sep:
                raise InputError(f"{path}:{lineno}: expected word<TAB>candidates")
            out[word] = cands.split(" ")
    return out


@dataclass(frozen=True, kw_only=True)
class Draws:
    """Every pass's random pick, drawn before any gate is applied so that gates can be compared on
    the same draws.

    ``slots`` (S, 3) are (pair, side, position) of the eligible tokens; ``choice`` (passes, S) the
    candidate picked, as its string; ``cosine`` (passes, S) its word-vector cosine with the token
    (nan when either lacks a vector)."""

    slots: np.ndarray
    choice: np.ndarray
    cosine: np.ndarray


def draw_substitutions(
    pairs: Sequence[TokenPair],
    thesaurus: Thesaurus,
    similarity: Callable[[str, str], float],
    passes: int,
    rng: np.random.Generator,
) -> Draws:
    """Pick one candidate uniformly for every eligible token in every pass (eligible: not a
    stopword, has candidates)."""
    slots, tokens_at, cands = [], [], []
    for i, pair in enumerate(pairs):
        for side, tokens in enumerate((pair.a, pair.b)):
            for pos, token in enumerate(tokens):
                if token.lower() not in STOPWORDS and (options := thesaurus.get(token.lower())):
                    slots.append((i, side, pos))
                    tokens_at.append(token)
                    cands.append(options)
    counts = np.array([len(c) for c in cands], dtype=np.int64)
    picks = np.minimum((rng.random((passes, len(cands))) * counts).astype(np.int64), counts - 1)
    choice = np.empty(picks.shape, dtype=object)
    cosine = np.empty(picks.shape, dtype=np.float64)
    cache: dict[tuple[str, str], float] = {}
    for p in range(passes):
        for s, k in enumerate(picks[p]):
            token, word = tokens_at[s], cands[s][k]
            if (token, word) not in cache:
                cache[(token, word)] = similarity(token, word)
            choice[p, s], cosine[p, s] = word, cache[(token, word)]
    return Draws(slots=np.array(slots, dtype=np.int64).reshape(-1, 3), choice=choice, cosine=cosine)


def apply_gate(pairs: Sequence[TokenPair], draws: Draws, gate: float) -> list[TokenPair]:
    """The new pairs that ``draws`` make when substitutions need cosine >= ``gate``, in pass order.

    Kept only when both sentences changed; duplicates of the originals or of earlier new pairs are
    dropped."""
    seen = {(p.a, p.b) for p in pairs}
    out = []
    for p in range(draws.choice.shape[0]):
        edits: dict[tuple[int, int], dict[int, str]] = {}
        for s in np.flatnonzero(draws.cosine[p] >= gate):  # nan compares False: no vector, no swap
            i, side, pos = draws.slots[s]
            edits.setdefault((int(i), int(side)), {})[int(pos)] = draws.choice[p, s]
        for i, pair in enumerate(pairs):
            if (i, 0) not in edits or (i, 1) not in edits:
                continue
            a, b = (
                tuple(edits[(i, side)].get(k, t) for k, t in enumerate(tokens))
                for side, tokens in enumerate((pair.a, pair.b))
            )
            if a == pair.a or b == pair.b or (a, b) in seen:
                continue
            seen.add((a, b))
            out.append(replace(pair, pair_id=f"{pair.pair_id}~aug{p + 1}", a=a, b=b))
    return out


def choose_gate(
    pairs: Sequence[TokenPair], draws: Draws, floor: float, target: int, steps: int = 20
) -> float:
    """The smallest gate >= ``floor`` whose augmentation yields at most ``target`` new pairs
    (bisection).

    An option beside the paper's fixed 0.6: with MiniLM word vectors 0.6 is far looser than with
    word2vec (27k pairs instead of the paper's ~10k, many of them wrong senses), so the gate can be
    set by the count instead."""
    if len(apply_gate(pairs, draws, floor)) <= target:
        return floor
    lo, hi = floor, 1.0 + 1e-9
    for _ in range(steps):
        mid = (lo + hi) / 2
        if len(apply_gate(pairs, draws, mid)) <= target:
            hi = mid
        else:
            lo = mid
    return hi


def write_bundled_thesaurus(sick_dir: Path, wordnet: object, path: Path | None = None) -> int:
    """Derive the thesaurus of the SICK training vocabulary (train + trial, lower-cased) from
    WordNet 3.0 and write it with the WordNet licence as its header; returns the number of words.
    Regenerate with ``NLTK_DATA=DIR python -m sembridge_ray.siamese.augment``, DIR holding nltk's
    ``wordnet`` corpus (``python -m nltk.downloader -d DIR wordnet``)."""
    from sembridge_ray.data.sick import read_sick_split
    from sembridge_ray.runtime.outputs import atomic_write_text
    from sembridge_ray.siamese.data import tokenize

    pairs = read_sick_split(sick_dir, "train") + read_sick_split(sick_dir, "trial")
    thesaurus = build_thesaurus(
        (t for p in pairs for s in (p.a, p.b) for t in tokenize(s)), wordnet
    )
    path = path or bundled_thesaurus()
    licence = (path.parent / "WORDNET_LICENSE.txt").read_text(encoding="utf-8")
    header = (
        "Head lemmas of the WordNet 3.0 synsets of each word of the SICK 2014 train+trial vocabulary "
        "(lower-cased),\nminus the word itself: synset.name().split('.')[0], deduplicated, in WordNet's "
        "order. Derived from WordNet 3.0,\nwhose licence follows and applies to this file.\n\n"
        + licence
    )
    lines = [f"# {h}" if h else "#" for h in header.splitlines()]
    lines += (f"{w}\t{' '.join(c)}" for w, c in sorted(thesaurus.items()))
    atomic_write_text(path, "\n".join(lines) + "\n")
    return len(thesaurus)


if __name__ == "__main__":
    from sembridge_ray.resources import sick_dir

    logging.basicConfig(level=logging.INFO)
    found = load_wordnet()
    if found is None:
        raise SystemExit("WordNet not found: set NLTK_DATA to a directory holding corpora/wordnet")
    log.info(
        "wrote %d words to %s", write_bundled_thesaurus(sick_dir(), found), bundled_thesaurus()
    )
