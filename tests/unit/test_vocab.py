"""Vocabulary partition: canonical forms, match rules and their preferences, special roles, real
tokenizers."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import (
    AutoTokenizer,
    BertTokenizer,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from sembridge_ray.embed_init.vocab import (
    Partition,
    VocabIndex,
    bridge_string,
    canonical,
    is_symbol,
    partition_vocab,
    tokenizer_family,
)


@pytest.mark.parametrize(
    ("token", "family", "expected"),
    [
        ("##ing", "wordpiece", "ing"),
        ("play", "wordpiece", "▁play"),
        ("##", "wordpiece", "▁##"),
        ("Ġcapital", "bytebpe", "▁capital"),
        ("capital", "bytebpe", "capital"),
        ("Ċ", "bytebpe", "\n"),
        ("Ã", "bytebpe", "<0xC3>"),
        ("ÃĤ", "bytebpe", "Â"),  # a lone UTF-8 lead byte is a byte, not the text "Ã"
        ("▁Haus", "sentencepiece", "▁Haus"),
        ("<0x0A>", "sentencepiece", "<0x0A>"),
        ("<0x0A>", "wordpiece", "<0x0A>"),
    ],
)
def test_canonical_forms(token: str, family: str, expected: str) -> None:
    assert canonical(token, family) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("canon", "expected"),
    [("▁123", True), ("?!", True), ("▁", True), ("$", True), ("▁a1", False), ("", False)],
)
def test_symbols(canon: str, expected: bool) -> None:
    assert is_symbol(canon) is expected


def token_id(tok: PreTrainedTokenizerBase, token: str) -> int:
    """The id of one token (``convert_tokens_to_ids`` of a string is an int)."""
    tid = tok.convert_tokens_to_ids(token)
    assert isinstance(tid, int)
    return tid


def wordpiece(vocab: list[str], cls: type = BertTokenizer) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.WordPiece({t: i for i, t in enumerate(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    return cls(
        tokenizer_object=tok,
        unk_token="[UNK]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        pad_token="[PAD]",
        mask_token="[MASK]",
    )


def test_fuzzy_prefers_own_canonical_form_then_lowest_id() -> None:
    vocab = {"[PAD]": 0, "the": 1, "##the": 2, "The": 3, "##The": 4, "x": 5}
    index = VocabIndex.build(vocab, "wordpiece", exclude=[0])
    # "##the" canonicalises to "the", which is the fuzzy key itself
    assert index.lookup("▁THE", "fuzzy") == 2
    assert index.lookup("▁the", "exact") == 1
    index = VocabIndex.build({"▁The": 7, "▁the": 3, "The": 9}, "sentencepiece")
    assert index.lookup("THE", "fuzzy") == 3  # nobody's canonical form is "the": lowest id


def test_match_rules_order_and_flags() -> None:
    source = wordpiece(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "##ing", "1", "house"])
    target = wordpiece(
        ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "The", "##ing", "1", "tree", "house"]
    )
    part = partition_vocab(source, target)
    ttok = functools.partial(token_id, target)
    stok = functools.partial(token_id, source)
    assert part.overlap[ttok("The")] == (stok("the"), "fuzzy")
    assert part.overlap[ttok("##ing")] == (stok("##ing"), "exact")
    assert part.overlap[ttok("1")] == (stok("1"), "symbols")
    assert part.rest == [ttok("tree")]
    only_exact = partition_vocab(source, target, rules=["exact"])
    assert only_exact.overlap[ttok("1")] == (stok("1"), "exact") and ttok("The") in only_exact.rest
    none = partition_vocab(source, target, copy_overlap=False)
    assert not none.overlap and len(none.rest) == 5 and len(none.specials) == 5
    # FOCUS's anchors
    assert none.anchors == part.anchors == sorted({s for s, _ in part.overlap.values()})
    with pytest.raises(ValueError, match="unknown match rule"):
        partition_vocab(source, target, rules=["exact", "fuzz"])


def test_roles_map_across_families(fixtures_root: Path) -> None:
    bert = AutoTokenizer.from_pretrained(fixtures_root / "bert-mlm")
    uni = AutoTokenizer.from_pretrained(fixtures_root / "tok-unigram")
    part = partition_vocab(bert, uni)
    names = {
        uni.convert_ids_to_tokens(t): (bert.convert_ids_to_tokens(s), r)
        for t, (s, r) in part.specials.items()
    }
    assert names == {
        "<s>": ("[CLS]", "cls"),
        "</s>": ("[SEP]", "sep"),
        "<pad>": ("[PAD]", "pad"),
        "<mask>": ("[MASK]", "mask"),
        "<unk>": ("[UNK]", "unk"),
    }


def test_every_target_id_lands_in_exactly_one_group(fixtures_root: Path) -> None:
    for src, tgt in [
        ("bert-mlm", "tok-bytebpe"),
        ("roberta-mlm", "tok-wordpiece"),
        ("roberta-mlm", "tok-unigram"),
    ]:
        part = partition_vocab(
            AutoTokenizer.from_pretrained(fixtures_root / src),
            AutoTokenizer.from_pretrained(fixtures_root / tgt),
        )
        groups = [set(part.specials), set(part.overlap), set(part.rest), set(part.unused)]
        assert sum(len(g) for g in groups) == part.size == len(set().union(*groups))


def test_bridge_string_rule(fixtures_root: Path) -> None:
    bert = AutoTokenizer.from_pretrained(fixtures_root / "bert-mlm")
    rob = AutoTokenizer.from_pretrained(fixtures_root / "roberta-mlm")
    assert bridge_string(bert, token_id(bert, "[CLS]"), "[CLS]") == "[CLS]"
    ing = token_id(bert, "##ing")
    assert bridge_string(bert, ing, "##ing") == str(bert.decode([ing])).strip()
    man = token_id(rob, "Ġman")
    assert bridge_string(rob, man, "Ġman") == "man"


REAL_SPOT_CHECKS = [  # (source, target, target token, expected source token, kind or rule)
    ("bert-base-uncased", "kobigbird-bert-base", "<s>", "[CLS]", "bos"),
    ("bert-base-uncased", "kobigbird-bert-base", "[MASK]", "[MASK]", "mask"),
    ("bert-base-uncased", "kobigbird-bert-base", "1", "1", "symbols"),
    ("bert-base-uncased", "bert-base-chinese", "北", "北", "exact"),
    ("bert-base-uncased", "bert-base-chinese", "##ing", "##ing", "exact"),
    ("roberta-base", "bert-base-uncased", "capital", "Ġcapital", "exact"),
    ("roberta-base", "bert-base-uncased", "[CLS]", "<s>", "cls"),
    ("bert-base-uncased", "araelectra-base-discriminator", "[SEP]", "[SEP]", "sep"),
]


@functools.cache
def real(root: Path, name: str) -> PreTrainedTokenizerBase:
    return AutoTokenizer.from_pretrained(root / "tokenizers" / name)


@functools.cache
def real_partition(root: Path, src: str, tgt: str) -> Partition:
    return partition_vocab(real(root, src), real(root, tgt))


@pytest.mark.parametrize(("src", "tgt", "token", "expected", "how"), REAL_SPOT_CHECKS)
def test_real_tokenizers_spot_checks(
    shared_data: Path, src: str, tgt: str, token: str, expected: str, how: str
) -> None:
    s, t = real(shared_data, src), real(shared_data, tgt)
    part = real_partition(shared_data, src, tgt)
    tid = token_id(t, token)
    sid, label = {**part.overlap, **part.specials}[tid]
    assert (s.convert_ids_to_tokens(sid), label) == (expected, how)
    groups = [set(part.specials), set(part.overlap), set(part.rest), set(part.unused)]
    assert sum(len(g) for g in groups) == part.size == len(set().union(*groups))
    assert tokenizer_family(t) == "wordpiece"


def test_holes_in_a_vocabulary_are_unused_rows(shared_data: Path) -> None:
    part = real_partition(shared_data, "roberta-base", "roberta-base")
    assert part.size == 50265 and part.unused == [50261, 50262, 50263]
    # identity transfer copies every row onto itself
    assert all(part.overlap[t][0] == t for t in part.overlap)
