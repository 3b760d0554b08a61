"""Fixed word vectors for the MaLSTM, by source (``--vectors NAME``):

- ``minilm``: each word encoded on its own, as a sentence, by the bundled all-MiniLM-L6-v2;
- ``minilm-context``: aggregated contextual vectors (Bommasani et al. 2020; see ``contextual.py``);
- ``minilm-input``: the mean of the word's pieces' input embeddings (a cheap baseline);
- ``word2vec:PATH``: gensim KeyedVectors, binary or text (the paper's GoogleNews vectors).

Any source can then be retrofitted to the thesaurus (``retrofit.py``). Words without a vector get
small seeded random ones; row 0 is the zero padding vector. The MiniLM vectors are cached per word
under ``vectors.cache_dir``, verified on every read, and concurrent runs add words without losing
any (:func:`_read_cache`)."""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sembridge_ray import cache
from sembridge_ray.bundled import minilm_dir
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.siamese import contextual as ctx
from sembridge_ray.siamese.config import MINILM, MINILM_CONTEXT, MINILM_INPUT
from sembridge_ray.siamese.records import ContextStats

log = logging.getLogger(__name__)
WORD2VEC = "word2vec:"
NAMED = (MINILM, MINILM_CONTEXT, MINILM_INPUT)
# a word-vector cache is a directory of parts (see _read_cache)
_PART, _PART_FILE = "part-", "words.npz"
_MAX_PARTS = 16  # beyond this many parts, a writer merges them into one


@dataclass(frozen=True, kw_only=True)
class WordVectors:
    """``matrix`` (V, D) float32 with row 0 = padding; ``oov`` (V,) bool marks the rows that were
    drawn at random."""

    matrix: np.ndarray
    oov: np.ndarray
    source: str

    def cosine(self, i: int, j: int) -> float:
        """Cosine of rows i and j; nan when either is out of vocabulary (no evidence of
        similarity)."""
        if self.oov[i] or self.oov[j]:
            return float("nan")
        a, b = self.matrix[i], self.matrix[j]
        return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))


def parse_source(source: str) -> tuple[str, Path | None]:
    """A named source -> (name, None); ``word2vec:PATH`` -> ("word2vec", PATH), the file checked to
    exist."""
    if source in NAMED:
        return source, None
    if source.startswith(WORD2VEC):
        path = Path(source[len(WORD2VEC) :]).expanduser()
        if not path.is_file():
            raise InputError(f"word2vec vectors file not found: {path}")
        return "word2vec", path
    raise InputError(f"vectors {source!r}: expected one of {', '.join(NAMED)} or 'word2vec:PATH'")


def vectors_identity(source: str) -> str:
    """The identity of a vectors source: the word2vec file's, or the bundled MiniLM's, content (the
    context corpus is the run's SICK and STS inputs, identified beside it, plus WordNet, named by
    the thesaurus)."""
    from sembridge_ray.runtime.identity import path_identity

    kind, path = parse_source(source)
    if path is not None:
        return path_identity(path)
    return f"{kind}:{path_identity(minilm_dir())}"


def read_word2vec(path: Path, words: Sequence[str]) -> dict[str, np.ndarray]:
    """Vectors of ``words`` from a word2vec file, binary or text (detected); a word missing in its
    own case falls back to its lower-cased form (GoogleNews is cased, SICK starts sentences with
    capitals)."""
    from gensim.models import KeyedVectors

    kv = None
    # a binary file fails the text parser at its first vector, so try text first
    for binary in (False, True):
        try:
            kv = KeyedVectors.load_word2vec_format(str(path), binary=binary)
            break
        except (ValueError, UnicodeDecodeError, EOFError) as err:
            problem = err
    if kv is None:
        raise InputError(f"{path}: not a word2vec file, binary or text ({problem})")
    found = {}
    for word in words:
        for key in (word, word.lower()):
            if key in kv.key_to_index:
                found[word] = np.asarray(kv[key], dtype=np.float32)
                break
    return found


def encode_minilm(
    words: Sequence[str], cache_dir: Path, batch_size: int = 256
) -> dict[str, np.ndarray]:
    """Each word (``_`` read as a space, for WordNet phrases) as its own sentence through
    all-MiniLM-L6-v2 (384-d).

    Vectors are cached per word in ``cache_dir`` under the model's fingerprint (see
    :func:`_read_cache`), so later runs encode only new words. A word whose word pieces are all
    ``[UNK]`` counts as out of vocabulary."""
    from sentence_transformers import SentenceTransformer

    model_dir = minilm_dir()
    path = cache_dir / f"minilm-{_fingerprint(model_dir)}"
    known = _read_cache(path)
    missing = [w for w in dict.fromkeys(words) if w not in known]
    if missing:
        log.info("encoding %d words with all-MiniLM-L6-v2 (%d cached)", len(missing), len(known))
        model = SentenceTransformer(str(model_dir), device="cpu")
        texts = [w.replace("_", " ") for w in missing]
        vectors = model.encode(
            texts, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False
        )
        new: dict[str, np.ndarray | None] = {
            word: vec.astype(np.float32) if ctx.in_vocabulary(model.tokenizer, text) else None
            for word, text, vec in zip(missing, texts, vectors, strict=True)
        }
        _write_cache(path, new)
        known |= new
    return {w: v for w in words if (v := known[w]) is not None}


@dataclass(frozen=True, kw_only=True)
class ContextSpec:
    """What determines aggregated contextual vectors besides the model: the corpus, the layer (0 =
    the embedding layer's output, 6 = MiniLM's last), the pooling of a word's pieces and the number
    of contexts per word."""

    corpus: tuple[str, ...]
    layer: int
    pooling: str
    contexts: int

    def cache_path(
        self, cache_dir: Path, model_dir: Path, layer: int | None = None, pooling: str | None = None
    ) -> Path:
        corpus = ctx.corpus_digest(self.corpus)
        layer = self.layer if layer is None else layer
        pooling = pooling or self.pooling
        # MAX_WORDS cuts the corpus sentences, so it shapes the vectors as much as the corpus does
        key = f"{_fingerprint(model_dir)}-{corpus}-w{ctx.MAX_WORDS}-k{self.contexts}-L{layer}-{pooling}"
        return cache_dir / f"context-{key}"


def encode_contextual(
    words: Sequence[str], spec: ContextSpec, cache_dir: Path
) -> tuple[dict[str, np.ndarray], ContextStats]:
    """(word -> aggregated vector, build stats) for ``words`` (matched lower-cased), cached per word
    under the model, corpus, contexts, layer and pooling. One pass fills the caches of every layer
    up to ``spec.layer`` and every pooling, so choosing them on validation costs one pass at the
    deepest layer."""
    model_dir = minilm_dir()
    keys = list(dict.fromkeys(w.lower() for w in words))
    known = _read_cache(spec.cache_path(cache_dir, model_dir))
    missing = [w for w in keys if w not in known]
    if missing:
        _fill_context_caches(missing, spec, cache_dir, model_dir)
        known = _read_cache(spec.cache_path(cache_dir, model_dir))
    found = {w: v for w in words if (v := known[w.lower()]) is not None}
    seen = ctx.first_occurrences(ctx.corpus_tokens(spec.corpus), keys, 1)
    return found, {"words": len(keys), "seen_in_context": len(seen), "built_now": len(missing)}


def _fill_context_caches(
    words: list[str], spec: ContextSpec, cache_dir: Path, model_dir: Path
) -> None:
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModel.from_pretrained(str(model_dir)).eval()
    model.encoder.layer = model.encoder.layer[: spec.layer]  # deeper layers are never looked at
    tokens = ctx.corpus_tokens(spec.corpus)
    occurrences = ctx.first_occurrences(tokens, words, spec.contexts)
    log.info(
        "aggregating MiniLM layers 0-%d over %d contexts of %d/%d words (corpus %d sentences)",
        spec.layer,
        sum(map(len, occurrences.values())),
        len(occurrences),
        len(words),
        len(spec.corpus),
    )
    pooled = ctx.aggregate_contexts(model, tokenizer, tokens, occurrences)
    unseen = [w for w in words if w not in pooled[ctx.POOLINGS[0]]]
    alone = ctx.decontextualised(model, tokenizer, unseen)
    for pooling in ctx.POOLINGS:
        for layer in range(spec.layer + 1):
            new = {
                w: None
                if (v := pooled[pooling].get(w, alone[pooling].get(w))) is None
                else v[layer]
                for w in words
            }
            _write_cache(spec.cache_path(cache_dir, model_dir, layer, pooling), new)


def encode_input_embeddings(words: Sequence[str]) -> dict[str, np.ndarray]:
    """word -> the mean of its MiniLM word pieces' input embeddings (``_`` read as a space)."""
    from transformers import AutoModel, AutoTokenizer

    model_dir = minilm_dir()
    model = AutoModel.from_pretrained(str(model_dir))
    return ctx.input_embeddings(model, AutoTokenizer.from_pretrained(str(model_dir)), words)


def _fingerprint(model_dir: Path) -> str:
    weights = sorted(model_dir.glob("*.safetensors")) or sorted(model_dir.glob("*.bin"))
    digest = hashlib.sha256()
    for path in weights:
        digest.update(f"{path.name}:{path.stat().st_size}".encode())
    return digest.hexdigest()[:12]


def _read_cache(path: Path) -> dict[str, np.ndarray | None]:
    """word -> vector (None: out of vocabulary) from the word-vector cache ``path``.

    The cache is a directory of immutable parts, each a :mod:`sembridge_ray.cache` entry holding the
    words one run added, named by their content: a run never rewrites what another wrote, so two
    runs adding words at once lose none. A damaged part is moved aside with a warning and its words
    are computed again. A word in two parts (two runs computed it at once) takes the first part's
    vector, by name."""
    return _read_parts(path)[1]


def _read_parts(path: Path) -> tuple[list[Path], dict[str, np.ndarray | None]]:
    known: dict[str, np.ndarray | None] = {}
    read = []
    for part in cache.entries(path, _PART):
        words = cache.load(part, _part_words, "word-vector cache")
        if words is not None:
            read.append(part)
            for word, vec in words.items():
                known.setdefault(word, vec)
    return read, known


def _write_cache(path: Path, new: dict[str, np.ndarray | None]) -> None:
    """Add the words of ``new`` to the cache ``path`` as one part; merge the parts into one when
    there are many."""
    if not new:
        return
    _publish_part(path, new)
    if len(cache.entries(path, _PART)) > _MAX_PARTS:
        parts, known = _read_parts(path)
        merged = _publish_part(path, known)
        for old in parts:
            if old != merged:
                # a reader that listed it meanwhile misses its words and computes them again
                cache.discard(old)


def _publish_part(path: Path, words: dict[str, np.ndarray | None]) -> Path:
    dim = next((v.shape[0] for v in words.values() if v is not None), 1)
    zero = np.zeros(dim, np.float32)
    buffer = io.BytesIO()
    np.savez(
        buffer,
        words=np.array(list(words)),
        vectors=np.stack([v if v is not None else zero for v in words.values()]),
        oov=np.array([v is None for v in words.values()]),
    )
    data = buffer.getvalue()
    part = path / f"{_PART}{hashlib.sha256(data).hexdigest()[:16]}"

    def build(tmp: Path) -> dict[str, np.ndarray | None]:
        tmp.mkdir(parents=True)
        (tmp / _PART_FILE).write_bytes(data)
        return words

    cache.publish(part, build, _part_words, "word-vector cache")
    return part


def _part_words(entry: cache.Entry) -> dict[str, np.ndarray | None]:
    with np.load(io.BytesIO(entry.read_bytes(_PART_FILE)), allow_pickle=False) as data:
        words, vectors, oov = data["words"].tolist(), data["vectors"], data["oov"]
    return {w: None if o else vectors[i] for i, (w, o) in enumerate(zip(words, oov, strict=True))}


def assemble_matrix(
    words: Sequence[str],
    found: dict[str, np.ndarray],
    rng: np.random.Generator,
    oov_std: float = 0.01,
    normalize: bool = True,
    center: bool = False,
    scale: float = 1.0,
    source: str = "",
) -> WordVectors:
    """Rows for ``words`` (row i+1 = words[i]) from ``found`` -> WordVectors with (V+1, D) float32.

    ``center`` subtracts the mean known vector (MiniLM word vectors share a large common direction,
    so their raw cosines sit around 0.2-0.4 even for unrelated words); ``normalize`` then scales
    known rows to length ``scale``. Out-of-vocabulary rows are N(0, oov_std²) per component, drawn
    from ``rng`` in word order."""
    if not found:
        raise InputError("no word of the vocabulary has a vector")
    dim = next(iter(found.values())).shape[0]
    matrix = np.zeros((len(words) + 1, dim), dtype=np.float32)
    oov = np.zeros(len(words) + 1, dtype=bool)
    for i, word in enumerate(words, start=1):
        if word in found:
            matrix[i] = found[word]
        else:
            oov[i] = True
    known = ~oov
    known[0] = False
    if center:
        matrix[known] -= matrix[known].mean(axis=0)
    if normalize:
        matrix[known] *= scale / (np.linalg.norm(matrix[known], axis=1, keepdims=True) + 1e-12)
    matrix[oov] = rng.normal(0.0, oov_std, size=(int(oov.sum()), dim)).astype(np.float32)
    return WordVectors(matrix=matrix, oov=oov, source=source)
