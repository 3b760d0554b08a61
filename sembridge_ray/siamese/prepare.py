"""Everything the restarts share, built once by the driver: splits, STS pool, thesaurus, vectors,
augmentation."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sembridge_ray.data.sick import Pair, read_sick_split
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.siamese import augment as aug
from sembridge_ray.siamese import contextual as ctx
from sembridge_ray.siamese.config import (
    MINILM_CONTEXT,
    MINILM_INPUT,
    AugmentConfig,
    PretrainConfig,
    VectorConfig,
)
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
from sembridge_ray.siamese.records import DataCounts, VectorBuild
from sembridge_ray.siamese.retrofit import retrofit, thesaurus_neighbours
from sembridge_ray.siamese.vectors import (
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


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """Encoded splits over one embedding matrix; ``sts_*`` are None without pretraining. ``counts``
    go to the report."""

    embeddings: np.ndarray
    train: EncodedPairs
    val: EncodedPairs
    test: EncodedPairs
    sts_train: EncodedPairs | None
    sts_val: EncodedPairs | None
    counts: DataCounts


def prepare(
    vectors: VectorConfig,
    augment: AugmentConfig,
    pretrain: PretrainConfig,
    *,
    sick_dir: Path,
    sts_dir: Path,
    limit_train: int,
    val_fraction: float,
    data_seed: int,
) -> Prepared:
    """Split the first ``limit_train`` SICK train+trial pairs (0 = all) into train and a seeded
    ``val_fraction`` for validation, read the leak-guarded STS pool when ``pretrain.enabled``, build
    the vectors and the augmented pairs; ``data_seed`` seeds the splits, the augmentation draws and
    the OOV vectors."""
    parse_source(vectors.source)  # a missing vectors file fails before anything slow
    rng = np.random.default_rng(data_seed)
    train_raw, val_raw = split_validation(
        read_sick_training(sick_dir, limit_train), val_fraction, rng
    )
    test_raw = list(require_pairs(f"SICK test in {sick_dir}", read_sick_split(sick_dir, "test")))
    train, val, test = tokenize_pairs(train_raw), tokenize_pairs(val_raw), tokenize_pairs(test_raw)
    counts: DataCounts = {
        "sick_train": len(train),
        "sick_validation": len(val),
        "sick_test": len(test),
    }
    sts_train, sts_val = _pretrain_pairs(pretrain, sts_dir, test_raw, val_fraction, rng, counts)
    needs_thesaurus = augment.enabled or vectors.retrofit > 0
    thesaurus, counts["thesaurus"] = (
        load_thesaurus(augment, train) if needs_thesaurus else ({}, None)
    )
    candidates = (c for cands in thesaurus.values() for c in cands) if augment.enabled else ()
    vocab = Vocabulary(
        [*vocabulary(train, val, test, sts_train or [], sts_val or []).words, *candidates]
    )
    start = time.perf_counter()
    word_vecs, build = word_vectors(
        vectors, augment, vocab.words, thesaurus, rng, sick_dir, sts_dir
    )
    build["seconds"] = round(time.perf_counter() - start, 1)
    counts["vectors"] = build
    counts["oov_rate"], counts["oov_type_rate"] = oov_stats(word_vecs, vocab, train + val + test)
    augmented: list[TokenPair] = []
    if augment.enabled:
        augmented, counts["augment_gate"] = augment_training(
            train, thesaurus, word_vecs, vocab.index, augment, rng
        )
    counts["augmented"] = len(augmented)
    log.info("data: %s", counts)
    return Prepared(
        embeddings=word_vecs.matrix,
        train=encode_pairs(train + augmented, vocab),
        val=encode_pairs(val, vocab),
        test=encode_pairs(test, vocab),
        sts_train=encode_pairs(sts_train, vocab) if sts_train is not None else None,
        sts_val=encode_pairs(sts_val, vocab) if sts_val is not None else None,
        counts=counts,
    )


def _pretrain_pairs(
    pretrain: PretrainConfig,
    sts_dir: Path,
    test: list[Pair],
    val_fraction: float,
    rng: np.random.Generator,
    counts: DataCounts,
) -> tuple[list[TokenPair] | None, list[TokenPair] | None]:
    """The leak-guarded STS pool split for pretraining, its sizes added to ``counts``; (None, None)
    when off."""
    if not pretrain.enabled:
        return None, None
    pool = read_sts_pool(sts_dir, pretrain.years, pretrain.limit)
    kept, removed = leak_guard(pool, test)
    sts_train_raw, sts_val_raw = split_validation(
        require_pairs("the leak-guarded STS pool", kept), val_fraction, rng
    )
    sts_train, sts_val = tokenize_pairs(sts_train_raw), tokenize_pairs(sts_val_raw)
    counts["sts_pool"], counts["removed_by_leak_guard"] = len(pool), removed
    counts["pretrain_train"], counts["pretrain_validation"] = len(sts_train), len(sts_val)
    return sts_train, sts_val


def find_wordnet(cfg: AugmentConfig) -> object | None:
    """WordNet through nltk (searching ``cfg.wordnet_dir`` too), unless the bundled thesaurus is
    demanded."""
    return aug.load_wordnet(cfg.wordnet_dir) if cfg.thesaurus != "bundled" else None


def load_thesaurus(cfg: AugmentConfig, train: list[TokenPair]) -> tuple[dict[str, list[str]], str]:
    """(word -> candidates, where they came from): WordNet when available (or demanded), else the
    bundled file."""
    wordnet = find_wordnet(cfg)
    if wordnet is not None:
        return aug.build_thesaurus((t for p in train for t in (*p.a, *p.b)), wordnet), "wordnet-3.0"
    if cfg.thesaurus == "wordnet":
        raise InputError(
            "augment.thesaurus=wordnet but nltk cannot find WordNet (set NLTK_DATA or augment.wordnet_dir)"
        )
    log.info("WordNet not found; using the bundled thesaurus %s", aug.bundled_thesaurus())
    return aug.read_thesaurus(aug.bundled_thesaurus()), "bundled"


def word_vectors(
    vectors: VectorConfig,
    augment: AugmentConfig,
    words: list[str],
    thesaurus: dict[str, list[str]],
    rng: np.random.Generator,
    sick_dir: Path,
    sts_dir: Path,
) -> tuple[WordVectors, VectorBuild]:
    """The embedding matrix of ``words`` from the configured source, retrofitted when asked, and the
    parameters it was built with (for the report)."""
    v = vectors
    found, build = lookup_vectors(v, augment, words, sick_dir, sts_dir)
    if v.retrofit:
        found = retrofit_found(found, thesaurus, v.retrofit, v.normalize)
        build["retrofit"], build["retrofit_lexicon"] = v.retrofit, augment.thesaurus
    table = assemble_matrix(
        words, found, rng, v.oov_std, v.normalize, v.center, v.scale, source=v.source
    )
    return table, build


def lookup_vectors(
    vectors: VectorConfig, augment: AugmentConfig, words: list[str], sick_dir: Path, sts_dir: Path
) -> tuple[dict[str, np.ndarray], VectorBuild]:
    """word -> vector for the words of ``words`` the source knows, and how they were built;
    ``augment`` says where WordNet (whose glosses join the contextual corpus) is looked for."""
    v = vectors
    kind, path = parse_source(v.source)
    build: VectorBuild = {"source": kind}
    cache_dir = Path(v.cache_dir).expanduser()
    if path is not None:
        return read_word2vec(path, words), build
    if kind == MINILM_INPUT:
        return encode_input_embeddings(words), build
    if kind != MINILM_CONTEXT:
        return encode_minilm(words, cache_dir), build
    wordnet = find_wordnet(augment)
    corpus = ctx.context_corpus(sick_dir, sts_dir, wordnet)
    spec = ContextSpec(corpus=tuple(corpus), layer=v.layer, pooling=v.pooling, contexts=v.contexts)
    found, stats = encode_contextual(words, spec, cache_dir)
    build["layer"], build["pooling"], build["contexts"] = v.layer, v.pooling, v.contexts
    build["corpus_sentences"], build["corpus_digest"] = len(corpus), ctx.corpus_digest(corpus)
    build["corpus_parts"] = ["sick-train", "sick-trial", "sts-all-years"] + (
        ["wordnet-3.0-glosses"] if wordnet else []
    )
    for key in ("words", "seen_in_context", "built_now"):
        build[key] = stats[key]
    return found, build


def retrofit_found(
    found: dict[str, np.ndarray], thesaurus: dict[str, list[str]], iterations: int, normalize: bool
) -> dict[str, np.ndarray]:
    """The vectors of ``found`` retrofitted to the thesaurus (unit-normalised first when
    ``normalize``, as the released code does)."""
    words = list(found)
    matrix = np.stack([found[w] for w in words]).astype(np.float64)
    if normalize:
        matrix /= np.linalg.norm(matrix, axis=1, keepdims=True) + 1e-12
    fitted = retrofit(matrix, thesaurus_neighbours(words, thesaurus), iterations)
    return dict(zip(words, fitted, strict=True))


def oov_stats(
    vectors: WordVectors, vocab: Vocabulary, pairs: list[TokenPair]
) -> tuple[float, float]:
    """Out-of-vocabulary rates over SICK's token occurrences (train, validation, test) and over its
    word types."""
    tokens = [t for p in pairs for t in (*p.a, *p.b)]
    types = set(tokens)
    oov_tokens = sum(bool(vectors.oov[vocab.index[t]]) for t in tokens)
    oov_types = sum(bool(vectors.oov[vocab.index[t]]) for t in types)
    return oov_tokens / max(1, len(tokens)), oov_types / max(1, len(types))


def augment_training(
    train: list[TokenPair],
    thesaurus: dict[str, list[str]],
    vectors: WordVectors,
    index: dict[str, int],
    cfg: AugmentConfig,
    rng: np.random.Generator,
) -> tuple[list[TokenPair], float]:
    """New training pairs and the gate used (``cfg.min_cosine``, or the count-calibrated one)."""
    draws = aug.draw_substitutions(
        train, thesaurus, lambda w, c: vectors.cosine(index[w], index[c]), cfg.passes, rng
    )
    gate = (
        aug.choose_gate(train, draws, cfg.min_cosine, cfg.target_pairs)
        if cfg.target_pairs
        else cfg.min_cosine
    )
    return aug.apply_gate(train, draws, gate), gate
