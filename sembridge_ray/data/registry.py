"""Every dataset spec a job, a model card or a plan takes, parsed in one place.

| spec                    | reads                                                                  | licence        |
|-------------------------|------------------------------------------------------------------------|----------------|
| ``webfaq:<lang>``       | hub ``PaDaS-Lab/webfaq-retrieval`` (``<iso3>-corpus/-queries/-qrels``) | unknown        |
| ``miracl:<lang>[@DIR]`` | hub ``miracl/miracl`` + ``miracl/miracl-corpus``, or a local mirror    | Apache 2.0     |
| ``xquad:<lang>[@DIR]``  | XQuAD (bundled: en ar zh hi ru), or ``DIR/xquad.<lang>.json``          | CC BY-SA 4.0   |
| ``korquad:ko[@DIR]``    | KorQuAD 1.0 dev (bundled, unmodified), or ``DIR/KorQuAD_v1.0_dev.json`` | CC BY-ND 2.0 KR |
| ``cmrc2018:zh``         | CMRC 2018 dev + trial (bundled): training pairs only                   | CC BY-SA 4.0   |
| ``arcd:ar``             | ARCD train (bundled): training pairs only                              | MIT            |
| a directory             | BEIR: ``corpus.jsonl``, ``queries.jsonl``, ``qrels/<split>.tsv``       | its own        |
| ``A+B``                 | training sets concatenated (fine-tuning's ``--train`` only)            | each part's    |

A spec names one :class:`Source` (its loader, identity, licence, languages and the hub ids it
reads); adding a dataset is one entry in :data:`SOURCES`. The reading-comprehension sets (XQuAD,
KorQuAD, CMRC, ARCD) become question -> answer-sentence retrieval sets (``data.squad``), split by
article the same way in every language."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from sembridge_ray.data import squad
from sembridge_ray.data.retrieval import (
    RetrievalData,
    load_beir,
    load_miracl,
    load_webfaq,
)
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.identity import hub_identity, path_identity

PARTS = "+"
"""Joins the training sets of one fine-tuning (``xquad:zh+cmrc2018:zh``)."""


@dataclass(frozen=True, kw_only=True)
class Spec:
    """A parsed dataset spec: its source, language and local root (a mirror or a directory), or a
    path."""

    text: str
    source: str
    """A :data:`SOURCES` key, or ``beir`` for a directory and ``pairs`` for a Parquet file of
    pairs."""
    lang: str = ""
    root: str = ""


@dataclass(frozen=True, kw_only=True)
class Source:
    """One kind of dataset spec."""

    name: str
    load: Callable[[Spec, str], RetrievalData]
    """(spec, split) -> the split's queries, judgements and corpus."""
    identity: Callable[[Spec], str]
    licence: str = ""
    """As the source states it; "" where the hub card says (read by the model card from the local
    hub cache)."""
    hub_id: str = ""
    """The hub dataset it reads or stands for ("" for none)."""
    languages: tuple[str, ...] | None = None
    """The languages it has (None: any, with a local root)."""
    splits: tuple[str, ...] | None = None
    """The splits it has (None: whatever its files or the hub have, which then say so)."""
    test_split: str = "test"
    """The split the evaluate job scores as a test; never a development set (MIRACL's public
    ``dev``)."""
    mirror: bool = False
    """Takes ``@DIR``: a local copy instead of the bundled or hub files."""
    corpus_per_split: bool = False
    """Each split has its own corpus (the sentences of its own articles), not one corpus shared by
    every split."""


def _hub_identity(*repos: str) -> str:
    return "+".join(hub_identity(repo, "dataset") for repo in repos)


def _miracl_identity(spec: Spec) -> str:
    if not spec.root:
        return _hub_identity("miracl/miracl", "miracl/miracl-corpus")
    base = Path(spec.root).expanduser() / spec.lang
    if not base.is_dir():
        raise InputError(f"MIRACL mirror {spec.root}: no {spec.lang} directory ({base})")
    return f"miracl:{spec.lang}@{path_identity(base)}"


def _squad_identity(spec: Spec) -> str:
    return f"{spec.source}:{spec.lang}@{path_identity(squad.source_file(spec.source, spec.lang, _root(spec)))}"


def _root(spec: Spec) -> Path | None:
    return Path(spec.root).expanduser() if spec.root else None


def _squad_source(name: str) -> Source:
    table = squad.SOURCES[name]
    return Source(
        name=name,
        load=lambda spec, split: squad.load(name, spec.lang, split, _root(spec)),
        identity=_squad_identity,
        licence=table.licence,
        languages=table.languages,
        splits=table.splits,
        mirror=table.mirror,
        corpus_per_split=True,
    )


SOURCES: dict[str, Source] = {
    "webfaq": Source(
        name="webfaq",
        load=lambda spec, split: load_webfaq(spec.lang, split),
        identity=lambda spec: _hub_identity("PaDaS-Lab/webfaq-retrieval"),
        hub_id="PaDaS-Lab/webfaq-retrieval",
    ),
    "miracl": Source(
        name="miracl",
        load=lambda spec, split: load_miracl(spec.lang, split, _root(spec)),
        identity=_miracl_identity,
        hub_id="miracl/miracl",
        licence="Apache 2.0",  # project-miracl/miracl's LICENSE and its hub card
        splits=("train", "dev", "test"),
        test_split="dev",  # its test judgements are hidden: evaluate scores dev as the test
        mirror=True,
    ),
    **{name: _squad_source(name) for name in squad.SOURCES},
}


def parse(spec: str) -> Spec:
    """A spec as the table above reads it; one that is none of them is an :class:`InputError` naming
    it."""
    kind, sep, rest = spec.partition(":")
    if sep and kind in SOURCES and rest:
        lang, at, root = rest.partition("@")
        source = SOURCES[kind]
        if at and not source.mirror:
            raise InputError(f"dataset {spec!r}: {kind} takes no @DIR")
        if not lang or (source.languages is not None and lang not in source.languages and not root):
            have = ", ".join(source.languages or ())
            mirror = "; or give @DIR" if source.mirror else ""
            raise InputError(
                f"dataset {spec!r}: {kind} has no language {lang!r} (it has {have}{mirror})"
            )
        return Spec(text=spec, source=kind, lang=lang, root=root)
    path = Path(spec).expanduser()
    if path.is_dir():
        return Spec(text=spec, source="beir", root=str(path))
    if path.is_file():  # a Parquet file of training pairs (read_pairs says so if it is not one)
        return Spec(text=spec, source="pairs", root=str(path))
    known = ", ".join(f"{k}:<lang>" + ("[@DIR]" if s.mirror else "") for k, s in SOURCES.items())
    raise InputError(
        f"dataset {spec!r} is none of {known}, a BEIR directory or a .parquet file of pairs"
    )


def parts(spec: str) -> list[str]:
    """The training sets of a ``+``-joined spec (one for a plain spec)."""
    return (
        [p for p in spec.split(PARTS) if p] if PARTS in spec and not Path(spec).exists() else [spec]
    )


def load_retrieval(spec: str, split: str) -> RetrievalData:
    """One split of a dataset spec (a bundled name is resolved by the job before)."""
    parsed = parse(spec)
    if parsed.source == "beir":
        return load_beir(Path(parsed.root), split)
    if parsed.source == "pairs":
        raise InputError(
            f"dataset {spec!r} is a file of training pairs, not a retrieval set with judgements"
        )
    source = SOURCES[parsed.source]
    if source.splits is not None and split not in source.splits:
        raise InputError(
            f"dataset {spec!r}: no split {split!r} (it has {', '.join(source.splits)})"
        )
    return source.load(parsed, split)


def dataset_identity(spec: str) -> str:
    """The identity of what a spec reads (see :mod:`sembridge_ray.runtime.identity`); a ``+``-joined spec's
    parts' joined. A bad spec or a missing input names itself."""
    found = []
    for part in parts(spec):
        if not Path(part).expanduser().exists() and ":" not in part:
            raise InputError(
                f"dataset {part!r} not found (neither a dataset spec nor a local path)"
            )
        parsed = parse(part)
        if parsed.source in ("beir", "pairs"):
            found.append(path_identity(Path(parsed.root)))
        else:
            found.append(SOURCES[parsed.source].identity(parsed))
    return " + ".join(found)


def _parsed_source(spec: str) -> Source | None:
    """The :class:`Source` of a spec; None for a directory, a file or a spec that does not parse."""
    try:
        return SOURCES.get(parse(spec).source)
    except InputError:
        return None


def corpus_split(spec: str, split: str) -> str:
    """``split`` where the corpus ``spec`` searches in that split is its own (what an encoding of it
    is keyed by), "" where every split shares one corpus (a BEIR directory, WebFAQ, MIRACL)."""
    source = _parsed_source(spec)
    return split if source is not None and source.corpus_per_split else ""


def is_test_split(spec: str, split: str) -> bool:
    """Whether ``split`` of ``spec`` is what the evaluate job scores as a test (MIRACL's public
    ``dev`` is)."""
    if split == "test":
        return True
    source = _parsed_source(spec)
    return source is not None and split == source.test_split


def hub_id(spec: str) -> str:
    """The hub dataset a spec reads or stands for ("" for local data without one)."""
    source = SOURCES.get(spec.partition(":")[0])
    return source.hub_id if source is not None and "@" not in spec else ""


def licence(spec: str) -> str:
    """The licence a spec's source states ("" where its hub card or its own directory says, and for
    a local copy ``@DIR``: it may hold anything of the format, so the source's licence is not
    assumed for it)."""
    source = SOURCES.get(spec.partition(":")[0])
    return source.licence if source is not None and "@" not in spec else ""


def language(spec: str) -> str:
    """The language code a spec names ("" for a directory or a file)."""
    try:
        return parse(spec).lang
    except InputError:
        return ""
