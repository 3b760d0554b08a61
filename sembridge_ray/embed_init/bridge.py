"""The bridge side: token strings, the bridge encoder, fingerprints and the verified cache of bridge
vectors (with the entries the package ships for its bundled vocabularies,
:func:`shipped_vectors`)."""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sembridge_ray import cache
from sembridge_ray.data.schema import ID, TEXT
from sembridge_ray.embed_init.position import NEUTRAL, WORDPIECE_PREFIX, marked_string
from sembridge_ray.embed_init.vocab import bridge_string, tokenizer_family
from sembridge_ray.resources import bridge_cache_dir
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.executor import use_threads
from sembridge_ray.runtime.outputs import sha256_file
from sembridge_ray.runtime.placement import pick_device

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)
VECTOR = "vector"
BRIDGE_FILE = "vectors.parquet"  # in a cache entry <cache_dir>/<key>/
# part of the cache key: bump if the string rule ever changes
RULE_VERSION = "decode-strip-or-raw-v1"
SPOT_CHECK = 16
"""Strings of a shipped entry encoded again before it is used (:func:`shipped_vectors`)."""
SPOT_ATOL = 1e-4
"""The most a spot-checked vector may differ from the shipped one, per component: fp32 vectors of
the same model differ by ~1e-7 between machines and batchings; another model's, or bf16 ones, by
1e-3 and more."""


def resolve_bridge(name: str) -> str:
    """``minilm`` -> the bundled all-MiniLM-L6-v2 directory; anything else as given (hub id or
    path)."""
    from sembridge_ray.bundled import resolve

    return resolve(name)


def check_bridge(name: str) -> str:
    """The bridge model's identity, after checking it is a sentence-transformers or transformers
    model (a local directory with ``modules.json`` or ``config.json``, or a hub id); fails here, in
    the driver, not in an actor."""
    from sembridge_ray.runtime.identity import model_identity

    resolved = resolve_bridge(name)
    path = Path(resolved).expanduser()
    if path.exists() and not any((path / f).is_file() for f in ("modules.json", "config.json")):
        raise InputError(
            f"bridge model {name!r} is not a model directory (no modules.json or config.json in {path})"
        )
    return model_identity(resolved, "bridge model")


def bridge_dimension(name: str) -> int | None:
    """The dimension of a local sentence-transformers bridge's vectors, read from its module configs
    (the last ``Dense`` module's ``out_features``, else the pooling's ``embedding_dimension``,
    ``word_embedding_dimension`` before sentence-transformers 6) without loading weights; None where
    they do not say (a hub id, a plain transformers directory)."""
    path = Path(resolve_bridge(name)).expanduser()
    try:
        modules = json.loads((path / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    found = None
    for module in modules if isinstance(modules, list) else []:
        kind, where = str(module.get("type", "")), path / str(module.get("path", ""))
        dense = kind.endswith(".Dense")
        keys = ("out_features",) if dense else ("embedding_dimension", "word_embedding_dimension")
        if dense or kind.endswith(".Pooling"):
            try:
                config = json.loads((where / "config.json").read_text(encoding="utf-8"))
                found = int(next(config[k] for k in keys if k in config))
            except (OSError, ValueError, StopIteration, TypeError):
                return None
    return found


def load_bridge(
    name: str, device: str = "cpu", trust_remote_code: bool = False
) -> SentenceTransformer:
    from sentence_transformers import SentenceTransformer

    try:
        return SentenceTransformer(
            resolve_bridge(name), device=device, trust_remote_code=trust_remote_code
        )
    except (OSError, ValueError, KeyError) as err:
        raise InputError(
            f"cannot load bridge model {name!r}: {str(err).strip().splitlines()[0]}"
        ) from None


def encode_strings(
    model: SentenceTransformer,
    strings: list[str],
    batch_size: int,
    name: str = "bridge",
    precision: str = "fp32",
) -> np.ndarray:
    """(n, D) float32 bridge vectors of ``strings`` (bf16 autocast when ``precision`` says so);
    non-finite output is an error naming the model."""
    import torch

    from sembridge_ray.sparse.encode import autocast_for

    with autocast_for(torch.device(getattr(model, "device", "cpu")), precision):
        vecs = model.encode(
            strings, batch_size=batch_size, convert_to_numpy=True, show_progress_bar=False
        )
    vecs = np.asarray(vecs, dtype=np.float32).reshape(len(strings), -1)
    if not np.isfinite(vecs).all():
        raise InputError(f"bridge model {name!r} returned non-finite vectors")
    return vecs


def vocab_strings(
    tokenizer: PreTrainedTokenizerBase, classes: np.ndarray | None = None, marker: str = ""
) -> pa.Table:
    """(id, text) for every vocabulary id, ascending: the strings the bridge embeds. With
    ``classes`` (position class by id, ``position.vocab_classes``) and a ``marker``, continuation
    pieces carry the marker (``position.marked_string``)."""
    pairs = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    texts = [bridge_string(tokenizer, i, tok) for tok, i in pairs]
    if classes is not None and marker:
        own = WORDPIECE_PREFIX if tokenizer_family(tokenizer) == "wordpiece" else ""
        texts = [
            marked_string(t, int(classes[i]) if i < len(classes) else NEUTRAL, marker, own)
            for t, (_, i) in zip(texts, pairs, strict=True)
        ]
    return pa.table({ID: pa.array([i for _, i in pairs], pa.int32()), TEXT: texts})


def tokenizer_fingerprint(tokenizer: PreTrainedTokenizerBase, rule: str = RULE_VERSION) -> str:
    """Content hash of a tokenizer's vocabulary, family and special tokens (not of its file layout),
    and of the string ``rule`` (so the bridge caches of two rules never share a key)."""
    vocab = sorted(tokenizer.get_vocab().items())
    payload = [vocab, tokenizer_family(tokenizer), tokenizer.all_special_tokens, rule]
    return hashlib.sha256(json.dumps(payload, ensure_ascii=False).encode("utf-8")).hexdigest()[:16]


def model_fingerprint(name: str) -> str:
    """A local directory: hash of its files' contents; a hub id: id + cached snapshot revision when
    known."""
    path = Path(resolve_bridge(name))
    if path.is_dir():
        digest = hashlib.sha256()
        for file in sorted(p for p in path.rglob("*") if p.is_file() and ".git" not in p.parts):
            digest.update(f"{file.relative_to(path)}:{sha256_file(file)}".encode())
        return digest.hexdigest()[:16]
    try:
        from huggingface_hub import snapshot_download

        revision = Path(snapshot_download(name, local_files_only=True)).name
    except Exception:  # not cached locally: the id alone
        revision = "unresolved"
    return hashlib.sha256(f"{name}@{revision}".encode()).hexdigest()[:16]


def cached_vectors(
    cache_dir: Path, key: str, strings: pa.Table, encode: Callable[[pa.Table], np.ndarray]
) -> np.ndarray:
    """(n, D) float32 vectors for ``strings`` (id, text): from the verified cache entry
    ``cache_dir/key/`` (:mod:`sembridge_ray.cache`), or else from the package's shipped entry of
    that key (:func:`shipped_vectors`) or encoded, and published there. Runs sharing a bridge and a
    vocabulary share it; when two encode it at once, both return the one entry that was
    published."""
    entry = Path(cache_dir).expanduser() / key

    def build(tmp: Path) -> np.ndarray:
        # before the temporary directory exists: nothing half-built while encoding
        vecs = shipped_vectors(key, strings, encode)
        if vecs is None:
            vecs = encode(strings)
        tmp.mkdir(parents=True)
        pq.write_table(
            strings.append_column(VECTOR, pa.array(list(vecs), pa.list_(pa.float32()))),
            tmp / BRIDGE_FILE,
        )
        return vecs

    vecs, hit = cache.fetch(
        entry, lambda found: _stored_vectors(found, strings), build, "bridge cache"
    )
    if hit:
        log.info("bridge vectors from cache %s", entry)
    return vecs


def shipped_vectors(
    key: str, strings: pa.Table, encode: Callable[[pa.Table], np.ndarray], root: Path | None = None
) -> np.ndarray | None:
    """The vectors of ``strings`` that the package ships under ``key`` (``<bridge
    model>-<vocabulary>`` fingerprints: the bundled MiniLM bridge and the bundled source and target
    vocabularies, so the quick start does not encode 38,522 strings), or None: none shipped for
    ``key``, or refused with one warning when a file does not match its sha256, the entry holds
    other strings, or :data:`SPOT_CHECK` of them, encoded now with ``encode``, differ from the
    shipped vectors by more than :data:`SPOT_ATOL`. A refused entry is left as it is. ``root``:
    where the entries are (default :func:`~sembridge_ray.resources.bridge_cache_dir`, in the
    assets; none shipped without them)."""
    root = root if root is not None else bridge_cache_dir()
    if root is None:
        return None
    path = Path(root) / key
    what = "the package's bridge cache"
    vecs = cache.load_shipped(path, lambda found: _stored_vectors(found, strings), what)
    if vecs is None:
        return None
    rows = np.unique(
        np.linspace(0, len(vecs) - 1, min(SPOT_CHECK, len(vecs))).round().astype(np.int64)
    )
    fresh = encode(strings.take(pa.array(rows)))
    diff = (
        float(np.abs(fresh - vecs[rows]).max()) if fresh.shape == vecs[rows].shape else float("inf")
    )
    if not diff <= SPOT_ATOL:
        log.warning(
            "%s %s: %d of its vectors, encoded again, differ from it by up to %.3g (above %g: another model or "
            "precision); not used",
            what,
            path,
            len(rows),
            diff,
            SPOT_ATOL,
        )
        return None
    log.info("bridge vectors of %d strings from %s %s (verified)", len(vecs), what, path.name)
    return vecs


def _stored_vectors(entry: cache.Entry, strings: pa.Table) -> np.ndarray:
    """The vectors of the entry's ``vectors.parquet``, or of its parts ``vectors-<n>.parquet`` in
    name order (a shipped entry's files stay under the 10 MiB that Ray's working-directory upload
    warns about)."""
    parts = sorted(
        n for n in entry.digests if n == BRIDGE_FILE or re.fullmatch(r"vectors-\d+\.parquet", n)
    )
    if not parts:
        raise cache.Corrupt(entry.path / BRIDGE_FILE, "missing")
    table = pa.concat_tables(
        [pq.read_table(pa.BufferReader(entry.read_bytes(name))) for name in parts]
    )
    if not (
        table.column(ID).equals(strings.column(ID))
        and table.column(TEXT).equals(strings.column(TEXT))
    ):
        raise cache.Corrupt(
            entry.current, "holds the vectors of other strings than the vocabulary's"
        )
    return np.stack(table.column(VECTOR).to_numpy(zero_copy_only=False)).astype(np.float32)


class BridgeEncodeUDF:
    """A pool's worker: holds the bridge sentence-transformers model; (id, text) -> (id, vector)."""

    def __init__(
        self,
        name: str,
        batch_size: int,
        trust_remote_code: bool = False,
        threads: int = 0,
        precision: str = "fp32",
        device: str = "",
    ) -> None:
        use_threads(threads)
        self.name, self.batch_size, self.precision = name, batch_size, precision
        self.model = load_bridge(
            name, device=device or pick_device(), trust_remote_code=trust_remote_code
        )

    def __call__(self, batch: pa.Table) -> pa.Table:
        vecs = encode_strings(
            self.model, batch.column(TEXT).to_pylist(), self.batch_size, self.name, self.precision
        )
        return pa.table(
            {ID: batch.column(ID), VECTOR: pa.array(list(vecs), pa.list_(pa.float32()))}
        )
