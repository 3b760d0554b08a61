"""Vocabulary partition: which target tokens copy a source row (specials by role, string overlap)
and which need the bridge.

Canonical forms make vocabularies of different families comparable:

| family          | rule                                                                        |
|-----------------|-----------------------------------------------------------------------------|
| WordPiece       | ``##x`` is the continuation ``x``; any other ``x`` is word-initial ``▁x``    |
| SentencePiece   | kept as is (``▁`` marks a word start); byte fallback ``<0xNN>`` stays raw     |
| byte-level BPE  | bytes mapped back to text, a leading space becomes ``▁``; partial UTF-8 as  |
|                 | ``<0xNN>`` bytes (so it matches byte-fallback tokens and never text)        |

Match rules, tried in this order for each non-special target token (``--match``): **symbols**
(digits, punctuation, symbols or whitespace only; by exact, then fuzzy key), **exact** (canonical
form), **fuzzy** (lower-cased, ``▁`` removed). Among source tokens sharing a key the one whose own
canonical form equals the key wins, then the lowest id."""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

WORD_START = "▁"
ROLES = ("cls", "sep", "pad", "mask", "unk", "bos", "eos")
ROLE_FALLBACK = {"bos": "cls", "eos": "sep", "cls": "bos", "sep": "eos"}
MATCH_RULES = ("symbols", "exact", "fuzzy")
Family = Literal["wordpiece", "sentencepiece", "bytebpe", "raw"]
_BYTE_FALLBACK = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")
_BRACKETED = re.compile(r"^\[.*\]$", re.DOTALL)


@cache
def _byte_decoder() -> dict[str, int]:
    """GPT-2's printable-character <-> byte table, inverted (``Ġ`` -> 0x20)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), 256)
    # the other bytes, in order, become the characters 256, 257, ...
    others = [b for b in range(256) if b not in printable]
    return {chr(b): b for b in printable} | {chr(256 + n): b for n, b in enumerate(others)}


def tokenizer_family(tokenizer: PreTrainedTokenizerBase) -> Family:
    """Detect the vocabulary family from the fast tokenizer's model, pre-tokenizer and decoder."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return "raw"
    spec = json.loads(backend.to_str())
    model = spec.get("model") or {}
    parts = json.dumps([spec.get("pre_tokenizer"), spec.get("decoder")])
    if model.get("type") == "WordPiece":
        return "wordpiece"
    if '"ByteLevel"' in parts:
        return "bytebpe"
    if model.get("type") == "Unigram" or '"Metaspace"' in parts:
        return "sentencepiece"
    return "raw"


def canonical(token: str, family: Family) -> str:
    """The token's canonical form (see the module docstring)."""
    if _BYTE_FALLBACK.match(token):
        return token
    if family == "wordpiece":
        return token[2:] if token.startswith("##") and len(token) > 2 else WORD_START + token
    if family == "bytebpe":
        table = _byte_decoder()
        try:
            raw = bytes(table[ch] for ch in token)
        except KeyError:
            return token  # not a byte-level string at all
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:  # a partial UTF-8 sequence: byte-fallback notation, never text
            return "".join(f"<0x{b:02X}>" for b in raw)
        return WORD_START + text[1:] if text.startswith(" ") else text
    return token


def fuzzy_key(canon: str) -> str:
    return canon.replace(WORD_START, "").lower()


def is_symbol(canon: str) -> bool:
    """Digits, punctuation, symbols or whitespace only (a bare ``▁`` counts as whitespace)."""
    body = canon.replace(WORD_START, " ")
    return bool(body) and all(
        ch.isdigit() or ch.isspace() or unicodedata.category(ch)[0] in "PS" for ch in body
    )


def role_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    """Role -> token id, for the roles this tokenizer defines."""
    found = {role: getattr(tokenizer, f"{role}_token_id", None) for role in ROLES}
    return {role: int(token_id) for role, token_id in found.items() if token_id is not None}


def bridge_string(tokenizer: PreTrainedTokenizerBase, token_id: int, raw: str) -> str:
    """The reference's rule: ``decode([id]).strip()``, or the raw vocabulary string if that is empty
    or [..]."""
    text = str(tokenizer.decode([token_id])).strip()  # one id decodes to one string
    return raw if not text or _BRACKETED.match(text) else text


@dataclass(frozen=True)
class VocabIndex:
    """A source vocabulary keyed for matching: exact canonical form and fuzzy key -> preferred
    source id."""

    exact: dict[str, int]
    fuzzy: dict[str, int]

    @classmethod
    def build(
        cls, vocab: Mapping[str, int], family: Family, exclude: Iterable[int] = ()
    ) -> VocabIndex:
        skip = set(exclude)
        exact: dict[str, int] = {}
        fuzzy: dict[str, tuple[bool, int]] = {}
        for token, token_id in sorted(vocab.items(), key=lambda kv: kv[1]):
            if token_id in skip:
                continue
            canon = canonical(token, family)
            exact.setdefault(canon, token_id)  # ids ascending: the first is the lowest
            if key := fuzzy_key(canon):
                # own canonical form equals the key first, then lowest id
                rank = (canon != key, token_id)
                fuzzy[key] = min(fuzzy.get(key, rank), rank)
        return cls(exact, {k: r[1] for k, r in fuzzy.items()})

    def lookup(self, canon: str, rule: str) -> int | None:
        found = None if rule == "fuzzy" else self.exact.get(canon)  # symbols: exact, then fuzzy
        return found if found is not None or rule == "exact" else self.fuzzy.get(fuzzy_key(canon))


@dataclass(frozen=True, kw_only=True)
class Partition:
    """Every target id lands in exactly one of: specials (by role), overlap (by rule), rest (the
    bridge), unused (ids the tokenizer never produces, e.g. holes in a vocab.json)."""

    size: int
    specials: dict[int, tuple[int, str]]  # target id -> (source id, role)
    overlap: dict[int, tuple[int, str]]  # target id -> (source id, rule)
    rest: list[int]
    unused: list[int] = field(default_factory=list)
    anchors: list[int] = field(default_factory=list)
    """Source ids that some target token matches by the rules, copied or not (FOCUS's anchor set),
    ascending."""


def partition_vocab(
    source: PreTrainedTokenizerBase,
    target: PreTrainedTokenizerBase,
    rules: Iterable[str] = MATCH_RULES,
    copy_overlap: bool = True,
) -> Partition:
    """Split the target vocabulary into specials, overlap and the rest. ``copy_overlap=False`` sends
    every non-special token through the bridge (the low-overlap setting of a cross-lingual
    transfer)."""
    if unknown := set(rules) - set(MATCH_RULES):
        raise ValueError(
            f"unknown match rule(s): {sorted(unknown)} (known: {', '.join(MATCH_RULES)})"
        )
    rules = [r for r in MATCH_RULES if r in set(rules)]
    src_roles, tgt_roles = role_ids(source), role_ids(target)
    specials: dict[int, tuple[int, str]] = {}
    for role in ROLES:
        tid = tgt_roles.get(role)
        sid = src_roles.get(role, src_roles.get(ROLE_FALLBACK.get(role, ""), None))
        if tid is not None and sid is not None and tid not in specials:
            specials[tid] = (sid, role)
    src_family, tgt_family = tokenizer_family(source), tokenizer_family(target)
    index = VocabIndex.build(source.get_vocab(), src_family, exclude=source.all_special_ids)
    vocab = target.get_vocab()
    size = max(max(vocab.values()) + 1, len(target))
    overlap: dict[int, tuple[int, str]] = {}
    rest: list[int] = []
    anchors: set[int] = set()
    for token, tid in sorted(vocab.items(), key=lambda kv: kv[1]):
        if tid in specials:
            continue
        hit = _match(index, canonical(token, tgt_family), rules)
        if hit is not None:
            anchors.add(hit[0])
        if hit is None or not copy_overlap:
            rest.append(tid)
        else:
            overlap[tid] = hit
    used = set(vocab.values())
    unused = [i for i in range(size) if i not in used]
    return Partition(
        size=size,
        specials=specials,
        overlap=overlap,
        rest=rest,
        unused=unused,
        anchors=sorted(anchors),
    )


def _match(index: VocabIndex, canon: str, rules: list[str]) -> tuple[int, str] | None:
    for rule in rules:
        if rule == "symbols" and not is_symbol(canon):
            continue
        found = index.lookup(canon, rule)
        if found is not None:
            return found, rule
    return None
