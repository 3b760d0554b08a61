"""Everything the restarts share, built once by the driver: splits, STS pool, thesaurus, vectors, augmentation."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sembridge_ray.data.sick import read_sick_split
from sembridge_ray.errors import InputError
from sembridge_ray.jobs.malstm import AugmentConfig, MalstmConfig
from sembridge_ray.resources import SICK_DIR, STS_DIR
from sembridge_ray.siamese import augment as aug
from sembridge_ray.siamese import contextual as ctx
from sembridge_ray.siamese.data import (
    EncodedPairs,
    TokenPair,
    Vocabulary,
    encode_pairs,
    leak_guard,
    read_sick_training,
    read_sts_pool,
    require_pairs,
    split_validation,
    tokenize_pairs,
    vocabulary,
)
from sembridge_ray.siamese.retrofit import retrofit, thesaurus_neighbours
from sembridge_ray.siamese.vectors import (
    MINILM_CONTEXT,
    MINILM_INPUT,
    ContextSpec,
    WordVectors,
    assemble_matrix,
    encode_contextual,
    encode_input_embeddings,
    encode_minilm,
    parse_source,
    read_word2vec,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """Encoded splits over one embedding matrix; ``sts_*`` are None without pretraining. ``counts`` go to the report."""

    embeddings: np.ndarray
    train: EncodedPairs
    val: EncodedPairs
    test: EncodedPairs
    sts_train: EncodedPairs | None
    sts_val: EncodedPairs | None
    counts: dict[str, Any]


def prepare(cfg: MalstmConfig) -> Prepared:
    sick_dir = Path(cfg.sick) if cfg.sick else SICK_DIR
    sts_dir = Path(cfg.sts) if cfg.sts else STS_DIR
    parse_source(cfg.vectors.source)  # a missing vectors file fails before anything slow
    rng = np.random.default_rng(cfg.data_seed)
    train_raw, val_raw = split_validation(read_sick_training(sick_dir, cfg.limit_train), cfg.val_fraction, rng)
    test_raw = list(require_pairs(f"SICK test in {sick_dir}", read_sick_split(sick_dir, "test")))
    train, val, test = tokenize_pairs(train_raw), tokenize_pairs(val_raw), tokenize_pairs(test_raw)
    counts: dict[str, Any] = {"sick_train": len(train), "sick_validation": len(val), "sick_test": len(test)}
    sts_train = sts_val = None
    if cfg.pretrain.enabled:
        pool = read_sts_pool(sts_dir, cfg.pretrain.years, cfg.pretrain.limit)
        kept, removed = leak_guard(pool, test_raw)
        sts_train_raw, sts_val_raw = split_validation(
            require_pairs("the leak-guarded STS pool", kept), cfg.val_fraction, rng
        )
        sts_train, sts_val = tokenize_pairs(sts_train_raw), tokenize_pairs(sts_val_raw)
        counts.update(
            sts_pool=len(pool),
            removed_by_leak_guard=removed,
            pretrain_train=len(sts_train),
            pretrain_validation=len(sts_val),
        )
    needs_thesaurus = cfg.augment.enabled or cfg.vectors.retrofit > 0
    thesaurus, counts["thesaurus"] = load_thesaurus(cfg.augment, train) if needs_thesaurus else ({}, None)
    candidates = (c for cands in thesaurus.values() for c in cands) if cfg.augment.enabled else ()
    vocab = Vocabulary([*vocabulary(train, val, test, sts_train or [], sts_val or []).words, *candidates])
    start = time.perf_counter()
    vectors, build = word_vectors(cfg, vocab.words, thesaurus, rng, sick_dir, sts_dir)
    counts["vectors"] = {**build, "seconds": round(time.perf_counter() - start, 1)}
    counts.update(oov_stats(vectors, vocab, train + val + test))
    augmented: list[TokenPair] = []
    if cfg.augment.enabled:
        augmented, counts["augment_gate"] = augment_training(train, thesaurus, vectors, vocab.index, cfg.augment, rng)
    counts["augmented"] = len(augmented)
    log.info("data: %s", counts)
    sts = [encode_pairs(p, vocab) if p is not None else None for p in (sts_train, sts_val)]
    return Prepared(
        vectors.matrix,
        encode_pairs(train + augmented, vocab),
        encode_pairs(val, vocab),
        encode_pairs(test, vocab),
        sts[0],
        sts[1],
        counts,
    )


def load_thesaurus(cfg: AugmentConfig, train: list[TokenPair]) -> tuple[dict[str, list[str]], str]:
    """(word -> candidates, where they came from): WordNet when available (or demanded), else the bundled file."""
    wordnet = aug.load_wordnet(cfg.wordnet_dir) if cfg.thesaurus != "bundled" else None
    if wordnet is not None:
        return aug.build_thesaurus((t for p in train for t in (*p.a, *p.b)), wordnet), "wordnet-3.0"
    if cfg.thesaurus == "wordnet":
        raise InputError(
            "augment.thesaurus=wordnet but nltk cannot find WordNet (set NLTK_DATA or augment.wordnet_dir)"
        )
    log.info("WordNet not found; using the bundled thesaurus %s", aug.BUNDLED_THESAURUS)
    return aug.read_thesaurus(aug.BUNDLED_THESAURUS), "bundled"


def word_vectors(
    cfg: MalstmConfig,
    words: list[str],
    thesaurus: dict[str, list[str]],
    rng: np.random.Generator,
    sick_dir: Path,
    sts_dir: Path,
) -> tuple[WordVectors, dict[str, Any]]:
    """The embedding matrix of ``words`` from the configured source, retrofitted when asked, and the parameters it
    was built with (for the report)."""
    v = cfg.vectors
    found, build = lookup_vectors(cfg, words, sick_dir, sts_dir)
    if v.retrofit:
        found = retrofit_found(found, thesaurus, v.retrofit, v.normalize)
        build.update(retrofit=v.retrofit, retrofit_lexicon=cfg.augment.thesaurus)
    vectors = assemble_matrix(words, found, rng, v.oov_std, v.normalize, v.center, v.scale, source=v.source)
    return vectors, build


def lookup_vectors(
    cfg: MalstmConfig, words: list[str], sick_dir: Path, sts_dir: Path
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    v = cfg.vectors
    kind, path = parse_source(v.source)
    build: dict[str, Any] = {"source": kind}
    cache_dir = Path(v.cache_dir).expanduser()
    if path is not None:
        return read_word2vec(path, words), build
    if kind == MINILM_INPUT:
        return encode_input_embeddings(words), build
    if kind != MINILM_CONTEXT:
        return encode_minilm(words, cache_dir), build
    wordnet = aug.load_wordnet(cfg.augment.wordnet_dir) if cfg.augment.thesaurus != "bundled" else None
    corpus = ctx.context_corpus(sick_dir, sts_dir, wordnet)
    spec = ContextSpec(tuple(corpus), v.layer, v.pooling, v.contexts)
    found, stats = encode_contextual(words, spec, cache_dir)
    build.update(
        layer=v.layer,
        pooling=v.pooling,
        contexts=v.contexts,
        corpus_sentences=len(corpus),
        corpus_digest=ctx.corpus_digest(corpus),
        corpus_parts=["sick-train", "sick-trial", "sts-all-years"] + (["wordnet-3.0-glosses"] if wordnet else []),
        **stats,
    )
    return found, build


def retrofit_found(
    found: dict[str, np.ndarray], thesaurus: dict[str, list[str]], iterations: int, normalize: bool
) -> dict[str, np.ndarray]:
    """The vectors of ``found`` retrofitted to the thesaurus (unit-normalised first when ``normalize``, as the
    released code does)."""
    words = list(found)
    matrix = np.stack([found[w] for w in words]).astype(np.float64)
    if normalize:
        matrix /= np.linalg.norm(matrix, axis=1, keepdims=True) + 1e-12
    fitted = retrofit(matrix, thesaurus_neighbours(words, thesaurus), iterations)
    return dict(zip(words, fitted, strict=True))


def oov_stats(vectors: WordVectors, vocab: Vocabulary, pairs: list[TokenPair]) -> dict[str, float]:
    """Out-of-vocabulary rate over SICK's token occurrences (train, validation, test) and over its word types."""
    tokens = [t for p in pairs for t in (*p.a, *p.b)]
    types = set(tokens)
    oov_tokens = sum(bool(vectors.oov[vocab.index[t]]) for t in tokens)
    oov_types = sum(bool(vectors.oov[vocab.index[t]]) for t in types)
    return {"oov_rate": oov_tokens / max(1, len(tokens)), "oov_type_rate": oov_types / max(1, len(types))}


def augment_training(
    train: list[TokenPair],
    thesaurus: dict[str, list[str]],
    vectors: WordVectors,
    index: dict[str, int],
    cfg: AugmentConfig,
    rng: np.random.Generator,
) -> tuple[list[TokenPair], float]:
    """New training pairs and the gate used (``cfg.min_cosine``, or the count-calibrated one)."""

    def similarity(word: str, candidate: str) -> float:
        return vectors.cosine(index[word], index[candidate])

    draws = aug.draw_substitutions(train, thesaurus, similarity, cfg.passes, rng)
    gate = aug.choose_gate(train, draws, cfg.min_cosine, cfg.target_pairs) if cfg.target_pairs else cfg.min_cosine
    return aug.apply_gate(train, draws, gate), gate
