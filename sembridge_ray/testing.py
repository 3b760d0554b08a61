"""Tiny, deterministic models and tokenizers of every family we support, built offline.

Registered by name, like real hub ids, so tests and smoke runs use them the way users use real
models:

| name              | what                                                                       |
|-------------------|----------------------------------------------------------------------------|
| ``bert-mlm``      | source: BERT MLM (tied embeddings) + uncased WordPiece, a SparseEncoder dir |
| ``roberta-mlm``   | source: RoBERTa MLM (tied embeddings) + byte-level BPE, a SparseEncoder dir |
| ``tok-wordpiece`` | target: cased WordPiece (``##`` continuations)                             |
| ``tok-bytebpe``   | target: cased byte-level BPE (``Ġ`` word starts)                            |
| ``tok-unigram``   | target: SentencePiece-style Unigram (``▁`` word starts), XLM-R specials     |
| ``bridge``        | a tiny sentence-transformers model (BERT + mean pooling), cased WordPiece  |

Tokenizers are trained with the ``tokenizers`` library on the bundled SICK (sources) and STS 2012
(targets and bridge) text, so vocabularies overlap partially, as they do across languages.

    python -m sembridge_ray.testing --out DIR     # writes every fixture under DIR/<name>
"""

from __future__ import annotations

import argparse
import contextlib
import json
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from tokenizers import (
    AddedToken,
    SentencePieceUnigramTokenizer,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)
from transformers import (
    BertConfig,
    BertForMaskedLM,
    BertModel,
    BertTokenizer,
    PreTrainedTokenizerBase,
    RobertaConfig,
    RobertaForMaskedLM,
    XLMRobertaTokenizer,
)

from sembridge_ray.bundled import ROBERTA_SPECIALS, byte_bpe_tokenizer
from sembridge_ray.data.sick import read_sick_split
from sembridge_ray.data.sts import read_sts, sts_files
from sembridge_ray.resources import sick_dir, sts_dir
from sembridge_ray.runtime.outputs import atomic_path
from sembridge_ray.sparse.model import save_sparse_encoder

BERT_SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
TINY: dict[str, Any] = {
    "hidden_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "intermediate_size": 64,
}


def source_text() -> list[str]:
    """English source-side text: the bundled SICK training sentences (9,000)."""
    pairs = read_sick_split(sick_dir(), "train")
    return [p.a for p in pairs] + [p.b for p in pairs]


def target_text() -> list[str]:
    """Target-side text: the bundled STS 2012 sentences (cased, punctuated, other domains)."""
    pairs = [p for f in sts_files(sts_dir(), [2012]) for p in read_sts(f)]
    return [p.a for p in pairs] + [p.b for p in pairs]


def wordpiece_tokenizer(text: list[str], vocab_size: int, lowercase: bool) -> BertTokenizer:
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=lowercase, strip_accents=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(
        text, trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=BERT_SPECIALS)
    )
    cls_id, sep_id = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
    )
    return BertTokenizer(tokenizer_object=tok, do_lower_case=lowercase, model_max_length=128)


def unigram_tokenizer(text: list[str], vocab_size: int) -> XLMRobertaTokenizer:
    sp = SentencePieceUnigramTokenizer()
    tokens: list[str | AddedToken] = list(ROBERTA_SPECIALS)
    sp.train_from_iterator(
        iter(text), vocab_size=vocab_size, special_tokens=tokens, unk_token="<unk>"
    )
    # The trainer is not reproducible: it sums scores in parallel (last-bit noise), orders equal
    # scores by a randomly seeded hash map, and gives the fallback characters order-dependent scores
    # (about 1e-3 apart). Round scores to 0.01 and re-sort (specials, then score descending, then
    # the piece) for stable ids.
    spec = json.loads(sp._tokenizer.to_str())
    pieces = [[p, round(score, 2)] for p, score in spec["model"]["vocab"]]
    specials = [p for p in pieces if p[0] in ROBERTA_SPECIALS]
    others = sorted(
        (p for p in pieces if p[0] not in ROBERTA_SPECIALS), key=lambda p: (-p[1], p[0])
    )
    spec["model"]["vocab"] = specials + others
    spec["model"]["unk_id"] = ROBERTA_SPECIALS.index("<unk>")
    spec["added_tokens"] = [
        {**t, "id": ROBERTA_SPECIALS.index(t["content"])} for t in spec["added_tokens"]
    ]
    return XLMRobertaTokenizer(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)), model_max_length=128
    )


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """HF initialises weights from the global RNG: fork it so fixtures never disturb the caller's
    stream."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def tiny_bert_mlm(tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> BertForMaskedLM:
    config = BertConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        **TINY,
    )
    with _seeded(seed):
        return BertForMaskedLM(config).eval()


def tiny_roberta_mlm(tokenizer: PreTrainedTokenizerBase, seed: int = 0) -> RobertaForMaskedLM:
    config = RobertaConfig(
        vocab_size=len(tokenizer),
        max_position_embeddings=258,
        type_vocab_size=1,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=True,
        **TINY,
    )
    with _seeded(seed):
        return RobertaForMaskedLM(config).eval()


def _save_tokenizer(tok: PreTrainedTokenizerBase, out: Path) -> None:
    with atomic_path(out) as tmp:
        tok.save_pretrained(str(tmp))


def _save_source(tok: PreTrainedTokenizerBase, model: torch.nn.Module, out: Path) -> None:
    with atomic_path(out) as tmp:
        save_sparse_encoder(model, tok, tmp)  # type: ignore[arg-type]


def _save_bridge(out: Path, seed: int = 1) -> None:
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer

    tok = wordpiece_tokenizer(source_text() + target_text(), 3000, lowercase=False)
    config = BertConfig(
        vocab_size=len(tok), max_position_embeddings=256, pad_token_id=tok.pad_token_id, **TINY
    )
    with _seeded(seed):
        backbone = BertModel(config, add_pooling_layer=False)
    with tempfile.TemporaryDirectory() as staging, atomic_path(out) as tmp:
        backbone.save_pretrained(staging)
        tok.save_pretrained(staging)
        SentenceTransformer(
            modules=[Transformer(staging), Pooling(TINY["hidden_size"], "mean")], device="cpu"
        ).save(str(tmp))


def _source_bert(out: Path, sparse: bool = False) -> None:
    """The tiny BERT; ``sparse``: with its vocabulary bias lowered until about 1% of the logits of
    the source text are positive: random weights otherwise activate nearly every dimension, which
    the fine-tuning job calls a collapsed model."""
    text = source_text()
    tok = wordpiece_tokenizer(text, 2000, lowercase=True)
    model = tiny_bert_mlm(tok)
    if sparse:
        with torch.no_grad():
            enc = tok(text[:64], padding=True, truncation=True, max_length=32, return_tensors="pt")
            logits = model(**enc).logits[enc["attention_mask"].bool()]
            model.cls.predictions.bias -= torch.quantile(logits.flatten()[::7], 0.99)
    _save_source(tok, model, out)


def _source_roberta(out: Path) -> None:
    tok = byte_bpe_tokenizer(source_text(), 2000)
    _save_source(tok, tiny_roberta_mlm(tok), out)


FIXTURES: dict[str, Callable[[Path], None]] = {
    "bert-mlm": _source_bert,
    "bert-splade": lambda out: _source_bert(out, sparse=True),
    "roberta-mlm": _source_roberta,
    "tok-wordpiece": lambda out: _save_tokenizer(
        wordpiece_tokenizer(target_text(), 1500, lowercase=False), out
    ),
    "tok-bytebpe": lambda out: _save_tokenizer(byte_bpe_tokenizer(target_text(), 1500), out),
    "tok-unigram": lambda out: _save_tokenizer(unigram_tokenizer(target_text(), 1500), out),
    "bridge": _save_bridge,
}


def build_fixture(name: str, root: Path) -> Path:
    """Write fixture ``name`` under ``root/name`` (once; an existing directory is reused) and return
    its path."""
    out = Path(root) / name
    if not out.is_dir():
        FIXTURES[name](out)
    return out


def build_all(root: Path) -> dict[str, Path]:
    return {name: build_fixture(name, root) for name in FIXTURES}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--out", required=True, type=Path, help="directory to write the fixtures into"
    )
    args = parser.parse_args(argv)
    for name, path in build_all(args.out).items():
        print(f"{name:<14} {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
