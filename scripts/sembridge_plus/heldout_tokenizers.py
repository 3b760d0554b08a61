"""Build SemBridge+'s two held-out English target vocabularies, fixed before any of their results
were looked at.

Their families and training text differ from the three public settings (en-bpe: byte-level BPE on
SICK + STS 2012-13; en-roberta: byte-level BPE on web text; en-kobigbird: cased WordPiece on Korean
text):

- ``en-unigram``: a SentencePiece Unigram (the family of XLM-R's and BGE-M3's tokenizers), 8,000
  pieces, NFKC, cased, trained on WordNet 3.0's glosses (definitions and examples);
- ``en-spbpe``: a SentencePiece BPE with byte fallback (the family of LLaMA's tokenizer), 12,000
  pieces, cased, trained on the STS 2014-2016 sentences (the source model saw STS 2012-13 and SICK
  only).

    PYTHONPATH=. python scripts/sembridge_plus/heldout_tokenizers.py --data DATA --out /tmp/heldout

``DATA`` holds ``wordnet/nltk_data`` (nltk's ``wordnet`` corpus) and ``sts/<year>/*.tsv`` (the
package's own ``assets/sembridge_ray_assets/data/sts`` has that layout).

writes ``OUT/en-unigram`` and ``OUT/en-spbpe`` (``tokenizer.json`` + the transformers files),
deterministic for the same data. Their licences are the training text's: WordNet 3.0's licence and
the STS tasks' (see each data directory's README); the vocabularies are not bundled with the
project."""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

UNIGRAM_VOCAB, SPBPE_VOCAB = 8000, 12000
SPECIALS = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]


def wordnet_glosses(data: Path) -> list[str]:
    import nltk

    nltk.data.path.insert(0, str(data / "wordnet" / "nltk_data"))
    from nltk.corpus import wordnet as wn

    out = []
    for synset in sorted(wn.all_synsets(), key=lambda s: s.name()):
        out.append(synset.definition())
        out.extend(synset.examples())
    return out


def sts_sentences(data: Path) -> list[str]:
    out: list[str] = []
    for year in (2014, 2015, 2016):
        for path in sorted((data / "sts" / str(year)).glob("*.tsv")):
            with path.open(encoding="utf-8", errors="replace", newline="") as f:
                for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
                    out.extend(cell for cell in row if cell and not _is_score(cell))
    return out


def _is_score(cell: str) -> bool:
    try:
        float(cell)
    except ValueError:
        return False
    return True


def unigram(text: list[str]):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=UNIGRAM_VOCAB, special_tokens=SPECIALS, unk_token="<unk>"
    )
    tok.train_from_iterator(iter(text), trainer)
    return tok


def spbpe(text: list[str]):  # type: ignore[no-untyped-def]
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Sequence([decoders.ByteFallback(), decoders.Metaspace()])
    alphabet = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(
        vocab_size=SPBPE_VOCAB,
        min_frequency=2,
        special_tokens=SPECIALS + alphabet,
        show_progress=False,
    )
    tok.train_from_iterator(iter(text), trainer)
    return tok


def save(tok, out: Path) -> None:  # type: ignore[no-untyped-def]
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
        cls_token="<s>",
        sep_token="</s>",
        model_max_length=128,
    )
    fast.save_pretrained(str(out))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--data", type=Path, required=True, help="holds wordnet/nltk_data and sts/<year>/*.tsv"
    )
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    save(unigram(wordnet_glosses(args.data)), args.out / "en-unigram")
    save(spbpe(sts_sentences(args.data)), args.out / "en-spbpe")
    print(f"wrote {args.out / 'en-unigram'} and {args.out / 'en-spbpe'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
