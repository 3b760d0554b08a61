"""The faithful rule (``position_aware=false``, the default) is byte-for-byte what the code wrote
before position-aware bridging existed.

``tests/data/faithful_init_golden.npz`` was written by this module's ``main`` at commit ce495f0
(before any position-aware code), on the tiny fixtures of ``sembridge_ray.testing`` with one change:
the ``tokenizers`` WordPiece and Unigram trainers are not reproducible (from build to build a few
WordPiece pieces change and about 130 of 2,000 ids move; about 11 of 1,500 Unigram ids move), so the
vocabularies of that build are pinned in ``tests/data/faithful_fixture_vocabs.json.gz`` and every
later build uses them:

    PYTHONPATH=. python -m tests.unit.test_position_faithful --write tests/data

Per case it holds the bridge strings' digest, the bridge-cache keys, the provenance of every bridged
row (source ids and float32 weights) and a digest of every tensor of the written model. The bridge
vectors' digest is kept too: the tiny bridge encoder runs in fp32, so another CPU may produce
vectors that differ in the last bits. Then weights are compared to 1e-5 instead of bit for bit (the
strings and keys are always exact).

With the same vectors, the weights match bit for bit on the machine that wrote the file and on most
others. But the float64 cosines and sums are BLAS and SIMD reductions whose order depends on the
CPU: on an AMD EPYC with AVX-512, FOCUS (sparsemax over every anchor, 156k weights) differs in the
last float32 bit of some weights, with the same source ids and the same model bytes. The digest-only
cases (α=2, softmax, FOCUS, WECHSEL) had their full arrays added on 2026-12-02 from that machine,
whose digests equal the file's except FOCUS's.

Where the digest differs, what the rule defines is compared (:func:`assert_rows_match`): every row's
support size and weights (within 1e-6, or 1e-5 when the bridge vectors differ too), and every source
id, except that a row cut at its nearest candidates (the softmax's ``candidates``, WECHSEL's) may
end in other ids among those whose weight equals its smallest: equal cosines (identical vectors of
identical strings) at the cut are taken in whatever order that CPU's top-k takes them, and on
another CPU a 2-of-870 failure came from exactly that."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import itertools
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from safetensors.numpy import load_file
from tokenizers import Tokenizer
from transformers import BertTokenizer, XLMRobertaTokenizer

from sembridge_ray import testing
from sembridge_ray.embed_init.bridge import vocab_strings
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.init.run import initialise
from sembridge_ray.sparse.model import load_tokenizer

DATA = Path(__file__).resolve().parent.parent / "data"
GOLDEN, VOCABS = "faithful_init_golden.npz", "faithful_fixture_vocabs.json.gz"
KINDS = ("overlap", "special", "bridge", "random")
LOW = {"copy_overlap": False, "exclude_special_sources": True}
CASES: dict[str, tuple[str, str, dict[str, Any]]] = {
    "bert-bytebpe": ("bert-mlm", "tok-bytebpe", {}),
    "bert-bytebpe-low": ("bert-mlm", "tok-bytebpe", LOW),
    "bert-unigram-low": ("bert-mlm", "tok-unigram", LOW),
    "roberta-wordpiece-low": ("roberta-mlm", "tok-wordpiece", LOW),
    "roberta-unigram": ("roberta-mlm", "tok-unigram", {}),
    "bert-bytebpe-a2": ("bert-mlm", "tok-bytebpe", {**LOW, "alpha": 2.0}),
    "bert-bytebpe-softmax": ("bert-mlm", "tok-bytebpe", {**LOW, "alpha": 1.0}),
    "bert-bytebpe-focus": ("bert-mlm", "tok-bytebpe", {**LOW, "method": "focus"}),
    "bert-bytebpe-wechsel": ("bert-mlm", "tok-bytebpe", {**LOW, "method": "wechsel"}),
    "roberta-unigram-wechsel": ("roberta-mlm", "tok-unigram", {**LOW, "method": "wechsel"}),
}


def _pin(tok: Any, key: str, vocabs: dict[str, Any], **kwargs: Any) -> Any:
    """``tok`` with the vocabulary stored under ``key`` (or, when there is none yet, ``tok``'s own,
    now stored)."""
    spec = json.loads(tok.backend_tokenizer.to_str())
    vocab = spec["model"]["vocab"]
    if isinstance(vocab, dict):  # WordPiece: token -> id; stored as the tokens in id order
        stored = vocabs.setdefault(key, sorted(vocab, key=vocab.__getitem__))
        spec["model"]["vocab"] = {t: i for i, t in enumerate(stored)}
    else:  # Unigram: [piece, score] in id order
        spec["model"]["vocab"] = vocabs.setdefault(key, vocab)
    return type(tok)(
        tokenizer_object=Tokenizer.from_str(json.dumps(spec)),
        model_max_length=tok.model_max_length,
        **kwargs,
    )


@contextlib.contextmanager
def pinned_fixtures(root: Path, vocabs: dict[str, Any]) -> Iterator[Path]:
    """Every fixture of ``sembridge_ray.testing`` under ``root``, with the WordPiece and Unigram
    vocabularies of ``vocabs`` (filled in from this build where it has none)."""
    wordpiece, unigram = testing.wordpiece_tokenizer, testing.unigram_tokenizer

    def pinned_wordpiece(text: list[str], vocab_size: int, lowercase: bool) -> BertTokenizer:
        return _pin(
            wordpiece(text, vocab_size, lowercase),
            f"wordpiece-{vocab_size}-{lowercase}",
            vocabs,
            do_lower_case=lowercase,
        )

    def pinned_unigram(text: list[str], vocab_size: int) -> XLMRobertaTokenizer:
        return _pin(unigram(text, vocab_size), f"unigram-{vocab_size}", vocabs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(testing, "wordpiece_tokenizer", pinned_wordpiece)
        patch.setattr(testing, "unigram_tokenizer", pinned_unigram)
        testing.build_all(root)
    yield root


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _strings_sha(path: Path) -> str:
    return _sha(
        json.dumps(
            vocab_strings(load_tokenizer(str(path))).to_pydict(), ensure_ascii=False
        ).encode()
    )


def snapshot(root: Path, out: Path, case: str, **extra: Any) -> dict[str, Any]:
    """Initialise one case on the fixtures under ``root`` and reduce its artefacts to comparable
    arrays."""
    src, tgt, overrides = CASES[case]
    cfg = InitConfig(
        source_model=str(root / src),
        target_tokenizer=str(root / tgt),
        bridge_model=str(root / "bridge"),
        output=str(out / case),
        cache_dir=str(out / "cache"),
        samples=3,
    ).with_settings(**overrides, **extra)
    result = initialise(cfg)
    prov = pq.read_table(Path(result.output) / "provenance.parquet").to_pydict()
    rows = [i for i, k in enumerate(prov["kind"]) if k == "bridge"]
    tensors = load_file(str(Path(result.output) / "model" / "model.safetensors"))
    fps = result.report["fingerprints"]
    # the bridge model's fp is not ours
    keys = [fps[name] for name in ("source_tokenizer", "target_tokenizer")]
    # sembridge_ray.cache entries
    entries = [out / "cache" / f"{fps['bridge_model']}-{key}" for key in keys]
    vectors = [pq.read_table(entry / "vectors.parquet").column("vector") for entry in entries]
    ids = np.array([s for i in rows for s in prov["source_ids"][i]], np.int64)
    weights = np.array([w for i in rows for w in prov["weights"][i]], np.float32)
    return {
        "strings": [_strings_sha(root / src), _strings_sha(root / tgt)],
        "keys": keys,
        "vectors": [
            _sha(np.stack(v.to_numpy(zero_copy_only=False)).astype(np.float32).tobytes())
            for v in vectors
        ],
        "model": _sha(
            b"".join(name.encode() + tensors[name].tobytes() for name in sorted(tensors))
        ),
        "kinds": np.array([KINDS.index(k) for k in prov["kind"]], np.uint8),
        "sizes": np.array([len(prov["source_ids"][i]) for i in rows], np.int32),
        "digest": _sha(ids.tobytes() + weights.tobytes()),
        "ids": ids.astype(np.int32),
        "weights": weights,
    }


def _flatten(snaps: dict[str, dict[str, Any]]) -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for case, snap in snaps.items():
        for name, value in snap.items():
            out[f"{case}/{name}"] = np.asarray(value)
    return out


def read_golden(path: Path = DATA / GOLDEN) -> dict[str, dict[str, Any]]:
    data = np.load(path, allow_pickle=False)
    snaps: dict[str, dict[str, Any]] = {}
    for key in data.files:
        case, name = key.split("/")
        snaps.setdefault(case, {})[name] = data[key]
    return snaps


@pytest.fixture(scope="module")
def golden() -> dict[str, dict[str, Any]]:
    return read_golden()


@pytest.fixture(scope="module")
def stable_root(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    vocabs = json.loads(gzip.decompress((DATA / VOCABS).read_bytes()))
    with pinned_fixtures(tmp_path_factory.mktemp("pinned-fixtures"), vocabs) as root:
        yield root


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("explicit", [False, True], ids=["default", "position_aware=false"])
def test_faithful_rule_is_unchanged_bit_for_bit(
    stable_root: Path, tmp_path: Path, golden: dict[str, Any], case: str, explicit: bool
) -> None:
    got = snapshot(stable_root, tmp_path, case, **({"position_aware": False} if explicit else {}))
    want = golden[case]
    assert got["strings"] == want["strings"].tolist()  # the released string rule, exactly
    # and so the bridge caches written before stay valid
    assert got["keys"] == want["keys"].tolist()
    assert np.array_equal(got["kinds"], want["kinds"])
    assert np.array_equal(got["sizes"], want["sizes"])  # every row's support size
    # the ids and weights bit for bit (the digest hashes both)
    if got["digest"] == str(want["digest"]):
        assert got["model"] == str(want["model"])
        return
    # Another CPU: the float64 cosines and sums are reduced in another order (the last float32 bit
    # of some weights), and where its fp32 bridge encoder gives other last bits, in inputs rounded
    # otherwise. What the rule defines is then compared: each row's weights, and its source ids
    # except those a tie decides (candidates whose weights equal the row's smallest: the
    # nearest-`candidates` cut of the softmax rows picks among equal cosines, such as the identical
    # vectors of identical strings, in whatever order that CPU's top-k takes them).
    atol = 1e-6 if got["vectors"] == want["vectors"].tolist() else 1e-5
    assert_rows_match(got, want, atol, cut_size(case))


def cut_size(case: str) -> int | None:
    """How many nearest source tokens a case's rows keep (the softmax's ``candidates``, WECHSEL's
    ``wechsel_candidates``), or None: an α-entmax support or FOCUS's anchors, where no cut picks
    among equals."""
    overrides = CASES[case][2]
    if overrides.get("method") == "wechsel":
        return InitConfig().weighting.wechsel_candidates
    return InitConfig().weighting.candidates if overrides.get("alpha") == 1.0 else None


def assert_rows_match(
    got: dict[str, Any], want: dict[str, Any], atol: float, cut: int | None
) -> None:
    """Row by row: sorted weights within ``atol``, and the same weight for every source id; in a row
    cut at the ``cut`` nearest, the ids whose weight equals the row's smallest may be others (chosen
    among equals)."""
    bounds = np.concatenate([[0], np.cumsum(want["sizes"])])
    for row, (start, stop) in enumerate(itertools.pairwise(bounds)):
        ids_g, w_g = got["ids"][start:stop], got["weights"][start:stop]
        ids_w, w_w = want["ids"][start:stop], want["weights"][start:stop]
        np.testing.assert_allclose(
            np.sort(w_g), np.sort(w_w), rtol=0, atol=atol, err_msg=f"row {row}"
        )
        if not len(w_w):
            continue
        # a full row: its last candidates may tie with ones left out
        tied = cut is not None and len(w_w) == cut
        cut_weight = min(w_g.min(), w_w.min()) + atol if tied else -1.0
        decided_g = {int(i): float(w) for i, w in zip(ids_g, w_g, strict=True) if w > cut_weight}
        decided_w = {int(i): float(w) for i, w in zip(ids_w, w_w, strict=True) if w > cut_weight}
        assert decided_g.keys() == decided_w.keys(), (
            f"row {row}: other source ids where no tie decides them"
        )
        for i, w in decided_w.items():
            assert abs(decided_g[i] - w) <= atol, (
                f"row {row}: source {i} weighs {decided_g[i]}, not {w}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="write the faithful-rule golden file")
    parser.add_argument(
        "--write", type=Path, required=True, help="directory for the golden and vocabulary files"
    )
    args = parser.parse_args(argv)
    vocabs: dict[str, Any] = {}
    with (
        tempfile.TemporaryDirectory() as tmp,
        pinned_fixtures(Path(tmp) / "fixtures", vocabs) as root,
    ):
        snaps = {case: snapshot(root, Path(tmp) / "out", case) for case in CASES}
    args.write.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.write / GOLDEN, allow_pickle=True, **_flatten(snaps))
    (args.write / VOCABS).write_bytes(
        gzip.compress(json.dumps(vocabs, ensure_ascii=False).encode(), mtime=0)
    )
    for name in (GOLDEN, VOCABS):
        print(f"wrote {args.write / name} ({(args.write / name).stat().st_size} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def test_the_comparison_allows_ties_at_the_cut_and_nothing_else() -> None:
    """The rule for another CPU, on a hand-made pair of rows: ids tied at the row's smallest weight
    may differ."""
    want = {
        "sizes": np.array([3, 2]),
        "ids": np.array([5, 7, 9, 1, 2]),
        "weights": np.array([0.5, 0.25, 0.25, 0.6, 0.4], np.float32),
    }
    # source 8 ties with 9 at the cut: either is right
    tie_other_way = {**want, "ids": np.array([5, 7, 8, 1, 2])}
    assert_rows_match(tie_other_way, want, atol=1e-6, cut=3)
    # the same without a cut: the support is the rule's, every id defined
    with pytest.raises(AssertionError):
        assert_rows_match(tie_other_way, want, atol=1e-6, cut=None)
    # an id above the cut; a row not cut
    for wrong in (np.array([6, 7, 9, 1, 2]), np.array([5, 7, 9, 1, 3])):
        with pytest.raises(AssertionError):
            assert_rows_match({**want, "ids": wrong}, want, atol=1e-6, cut=3)
    with pytest.raises(AssertionError):
        assert_rows_match(
            {**want, "weights": want["weights"] + np.float32(1e-3)}, want, atol=1e-6, cut=3
        )
