"""Target-language tokenizers the package carries (the assets' ``tokenizers/<lang>/``, with their
licences) or builds (Russian), each written as a directory that ``transformers.AutoTokenizer``
loads, with the five roles a SPLADE transfer maps (cls, sep, pad, mask, unk) and cls/sep added
around every sequence.

- **zh, ko**: bert-base-chinese's and KoBigBird's WordPiece files, loaded and saved as they are.
- **ar**: AraELECTRA's WordPiece, with AraBERT's removal of diacritics and tatweel in front
  (:func:`arabic_tokenizer`).
- **hi**: iNLTK's 30,000-piece Hindi Unigram; its ``tokenizer.json`` has no SPLADE specials, so the
  loadable one marks ``<unk>``, ``<s>``, ``</s>`` (pieces 0-2) as special, appends ``<pad>`` and
  ``<mask>`` (ids 30000, 30001), and adds ``<s> ... </s>`` (the bundled file itself is never
  changed).
- **ru**: no licensed Russian tokenizer is bundled (the Wikipedia SentencePiece beside the checkout
  has no licence and is never shipped). The bridge's XLM-R vocabulary (MIT, via
  multilingual-e5-small) is trimmed to the pieces Russian text uses (:func:`russian_keep_ids`),
  keeping the pieces' order and scores (:func:`trim_unigram`).
"""

from __future__ import annotations

import json
import shutil
import string
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sembridge_ray import languages
from sembridge_ray.resources import asset
from sembridge_ray.runtime.atomic import atomic_path
from sembridge_ray.runtime.errors import InputError

if TYPE_CHECKING:
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

SPLADE_ROLES = ("cls", "sep", "pad", "mask", "unk")
MAX_LENGTH = 512
UNIGRAM_ROLES = {
    "bos": "<s>",
    "eos": "</s>",
    "cls": "<s>",
    "sep": "</s>",
    "unk": "<unk>",
    "pad": "<pad>",
}
XQUAD_RU = "xquad/xquad.ru.json"
XQUAD_TRAIN_ARTICLES = 24
"""XQuAD's articles 0-23 (train and development); 24-47 are test text and never choose a piece."""
ARABIC_MARKS = "[\u0640\u064b-\u0652]"
"""Tatweel and the Arabic diacritics (fathatan .. sukun), removed before AraELECTRA's WordPiece."""
_LICENCE_FILES = ("LICENSE", "LICENSE.head", "LICENSE-Apache-2.0.txt", "NOTICE")


def build_target_tokenizer(language: str, out: Path) -> Path:
    """Write the loadable tokenizer of ``language`` to ``out`` (whole or not at all), with its
    licence files and a README naming the licence, and mark it (``provenance.mark_asset``) so a
    model card names it."""
    from sembridge_ray.provenance import mark_asset

    facts = languages.language(language).bundled
    with atomic_path(Path(out)) as tmp:
        tokenizer = _BUILDERS[facts.recipe](language)
        check_roles(tokenizer, language)
        tokenizer.save_pretrained(str(tmp))
        _copy_licences(language, facts, tmp)
    mark_asset(Path(out), f"tok-{language}", facts.what)
    return Path(out)


def check_roles(tokenizer: PreTrainedTokenizerBase, name: str) -> None:
    """Raise unless ``tokenizer`` defines every SPLADE role and wraps a sequence in cls ... sep."""
    missing = [
        role for role in SPLADE_ROLES if getattr(tokenizer, f"{role}_token_id", None) is None
    ]
    ids = tokenizer("a")["input_ids"]
    if missing or ids[0] != tokenizer.cls_token_id or ids[-1] != tokenizer.sep_token_id:
        raise InputError(
            f"target tokenizer {name!r}: roles {missing or 'present'}, a sequence encodes as {ids}"
        )


def require_vocabulary(tokenizer: PreTrainedTokenizerBase, name: str) -> None:
    """Raise unless ``tokenizer`` has a token besides its special ones and encodes a text: a
    ``tokenizer.json`` whose vocabulary is empty still loads (its added special tokens make it
    "5 tokens"), and a model made for it would fail at its first encoding."""
    ordinary = set(tokenizer.get_vocab().values()) - set(tokenizer.all_special_ids)
    if not ordinary:
        raise InputError(
            f"target tokenizer {name!r} has no vocabulary: its {len(tokenizer)} tokens are all "
            "special (an empty vocab in its tokenizer.json?)"
        )
    try:
        tokenizer("a")
    except Exception as err:  # the Rust tokenizers raise plain Exceptions
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise InputError(f"target tokenizer {name!r} cannot encode a text: {first}") from None


def bundled_wordpiece(language: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(asset(f"tokenizers/{language}")))


def arabic_tokenizer(language: str = "ar") -> PreTrainedTokenizerFast:
    """AraELECTRA's WordPiece with AraBERT's own preprocessing in front: diacritics (tashkeel,
    U+064B-U+0652) and tatweel (U+0640) removed, as ``ArabertPreprocessor`` does before its
    tokenizer; the vocabulary has none, so text that carries them (أيضاً, يُطلق) was 2.6% unknown
    pieces on XQuAD-ar, 0.3% with them removed. A generic fast tokenizer, since transformers 5
    rebuilds a ``BertTokenizer``'s normaliser from its config on loading."""
    from tokenizers import Regex, normalizers
    from transformers import PreTrainedTokenizerFast

    bert = bundled_wordpiece(language)
    backend = bert.backend_tokenizer
    backend.normalizer = normalizers.Sequence(
        [normalizers.Replace(Regex(ARABIC_MARKS), ""), backend.normalizer]
    )
    roles = {f"{role}_token": getattr(bert, f"{role}_token") for role in SPLADE_ROLES}
    return PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=MAX_LENGTH, **roles)


def bundled_unigram(language: str) -> PreTrainedTokenizerFast:
    """The bundled Unigram ``tokenizer.json`` of ``language`` (hi), with XLM-R's roles."""
    from tokenizers import Tokenizer

    path = asset(f"tokenizers/{language}/tokenizer.json")
    return unigram_with_roles(Tokenizer.from_file(str(path)))


def unigram_with_roles(tokenizer: Tokenizer) -> PreTrainedTokenizerFast:
    """A ``tokenizers`` Unigram made a transformers tokenizer with XLM-R's roles: ``<s>``, ``</s>``,
    ``<unk>``, ``<pad>``, ``<mask>`` special (added at the end where the vocabulary lacks them),
    ``<s> A </s>`` around a sequence and ``<s> A </s> B </s>`` around a pair."""
    from tokenizers import AddedToken, processors
    from transformers import PreTrainedTokenizerFast

    specials = [*dict.fromkeys(UNIGRAM_ROLES.values()), "<mask>"]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    bos, eos = (tokenizer.token_to_id(t) for t in ("<s>", "</s>"))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>",
        pair="<s> $A </s> $B:1 </s>:1",
        special_tokens=[("<s>", bos), ("</s>", eos)],
    )
    roles = {f"{role}_token": token for role, token in UNIGRAM_ROLES.items()}
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, mask_token="<mask>", model_max_length=MAX_LENGTH, **roles
    )


def xquad_ru() -> Path:
    """The bundled XQuAD-ru, else the copy beside the checkout."""
    bundled = asset("data") / XQUAD_RU
    shared = Path(__file__).resolve().parents[2] / "shared" / "data" / XQUAD_RU
    for path in (bundled, shared):
        if path.is_file():
            return path
    raise InputError(f"XQuAD-ru not found (looked for {bundled} and {shared})")


def xquad_texts(path: Path, articles: slice) -> list[str]:
    """The paragraphs and questions of XQuAD ``articles`` (SQuAD JSON), in file order."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))["data"][articles]
    paragraphs = [paragraph for article in data for paragraph in article["paragraphs"]]
    return [t for p in paragraphs for t in (p["context"], *(q["question"] for q in p["qas"]))]


def is_kept_character(piece: str) -> bool:
    """A single-character piece (``▁`` prefix aside, or ``▁`` itself) of the Cyrillic block,
    printable ASCII (letters, digits, punctuation, symbols), the Latin-1 Supplement (``«»°é``…),
    General Punctuation (``—…“”``) or ``№``: kept whether Russian text used it or not, so any such
    text still segments."""
    body = piece[1:] if piece.startswith("▁") and len(piece) > 1 else piece
    if len(body) != 1:
        return False
    code = ord(body)
    return (
        0x0400 <= code <= 0x04FF
        or (body in string.printable and not body.isspace())
        or 0x00A1 <= code <= 0x00FF
        or 0x2010 <= code <= 0x205E
        or body in "▁№"
    )


def russian_keep_ids(spec: dict[str, Any], texts: Iterable[str]) -> list[int]:
    """Ids of the Unigram ``spec`` (a ``tokenizer.json``) to keep for Russian: its special tokens,
    every piece the encodings of ``texts`` use, and every piece :func:`is_kept_character` accepts;
    ascending."""
    from tokenizers import Tokenizer

    full = Tokenizer.from_str(json.dumps(spec))
    used = {i for enc in full.encode_batch(list(texts), add_special_tokens=False) for i in enc.ids}
    specials = {int(t["id"]) for t in spec.get("added_tokens", []) if t.get("special")}
    chars = {i for i, (piece, _) in enumerate(spec["model"]["vocab"]) if is_kept_character(piece)}
    return sorted(used | specials | chars)


def trim_unigram(spec: dict[str, Any], keep: list[int]) -> dict[str, Any]:
    """The Unigram ``tokenizer.json`` ``spec`` with only the pieces ``keep`` (ascending ids), in
    their order and with their scores; the unknown id, added tokens and post-processor's special ids
    renumbered to match."""
    new_id = {old: new for new, old in enumerate(keep)}
    out: dict[str, Any] = json.loads(json.dumps(spec))
    model = out["model"]
    if model.get("type") != "Unigram" or model.get("unk_id") not in new_id:
        raise InputError(
            "trim_unigram: not a Unigram tokenizer.json, or its unknown piece is not kept"
        )
    model["vocab"] = [spec["model"]["vocab"][i] for i in keep]
    model["unk_id"] = new_id[model["unk_id"]]
    out["added_tokens"] = [
        {**t, "id": new_id[t["id"]]} for t in out.get("added_tokens", []) if t["id"] in new_id
    ]
    for special in ((out.get("post_processor") or {}).get("special_tokens") or {}).values():
        special["ids"] = [new_id[i] for i in special["ids"]]
    return out


def russian_tokenizer() -> PreTrainedTokenizerFast:
    """The bridge's XLM-R vocabulary trimmed to Russian (:func:`russian_keep_ids` on XQuAD-ru's
    articles 0-23), as a transformers tokenizer."""
    from tokenizers import Tokenizer

    from sembridge_ray.bridges import me5_sources

    spec = json.loads(me5_sources()[1].read_text(encoding="utf-8"))
    texts = xquad_texts(xquad_ru(), slice(0, XQUAD_TRAIN_ARTICLES))
    trimmed = trim_unigram(spec, russian_keep_ids(spec, texts))
    return unigram_with_roles(Tokenizer.from_str(json.dumps(trimmed, ensure_ascii=False)))


_BUILDERS: dict[languages.Recipe, Callable[[str], PreTrainedTokenizerFast]] = {
    "wordpiece": bundled_wordpiece,
    "arabic-wordpiece": arabic_tokenizer,
    "unigram": bundled_unigram,
    "me5-trimmed": lambda language: russian_tokenizer(),
}
"""A row's ``bundled.recipe`` -> its builder, given the language code."""


def licence_files(language: str) -> list[Path]:
    """The licence files that travel with the tokenizer of ``language``: the bundled folder's, or
    for one trimmed from multilingual-e5-small (``ru``) its NOTICE beside the bridge's
    ``tokenizer.json``."""
    from sembridge_ray.bridges import me5_sources

    trimmed = languages.language(language).bundled.recipe == "me5-trimmed"
    folder = me5_sources()[1].parent if trimmed else asset(f"tokenizers/{language}")
    return [folder / name for name in _LICENCE_FILES if (folder / name).is_file()]


def _copy_licences(language: str, facts: languages.BundledTokenizer, out: Path) -> None:
    files = licence_files(language)
    for file in files:
        shutil.copyfile(file, out / file.name)
    card = [
        # what a model card shows
        f"---\nlicense: {json.dumps(facts.licence, ensure_ascii=False)}\n---\n",
        f"# Target tokenizer `tok-{language}`: {facts.what}\n",
        f"- **Licence:** {facts.licence}; its text: {', '.join(f.name for f in files)} (beside this README).",
        f"- **On the hub:** {facts.hub_id or 'none'}.",
        "- Built by `sembridge_ray.target_tokenizers.build_target_tokenizer`; sources and licences of the bundled",
        "  files: `sembridge_ray/resources/tokenizers/README.md`.",
    ]
    (out / "README.md").write_text("\n".join(card) + "\n", encoding="utf-8")
