"""Position-aware bridging: classes from each family's marker, marked strings, the class prior
against full-row entmax on prior-adjusted cosines, the report's counterpart statistics, and the
acceptance property through the whole init: a continuation piece whose exact source counterpart
exists puts weight on it."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from entmax import entmax_bisect, sparsemax
from transformers import AutoTokenizer

from sembridge_ray.data.schema import PROVENANCE_SCHEMA
from sembridge_ray.embed_init.bridge import vocab_strings
from sembridge_ray.embed_init.pipeline import Stages, compute_rows
from sembridge_ray.embed_init.position import (
    CONTINUATION,
    INITIAL,
    NEUTRAL,
    class_offsets,
    class_weights,
    marked_string,
    position_class,
    stack_rows,
    tokenizer_classes,
    vocab_classes,
)
from sembridge_ray.embed_init.records import InitReport
from sembridge_ray.embed_init.report import position_stats
from sembridge_ray.embed_init.weighting import bridge_weights
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.init.run import initialise

W, C, N = INITIAL, CONTINUATION, NEUTRAL  # word-initial, continuation, neutral


@pytest.mark.parametrize(
    ("canon", "expected"),
    [
        ("▁play", W),
        ("ing", C),
        ("▁1999", W),
        ("99", C),
        ("▁.", N),
        (".", N),
        ("'", N),
        ("▁", N),
        ("<0xC3>", N),
        ("<0xE4><0xB8>", N),
        ("'s", C),
        ("▁Haus", W),
        ("中", C),
        ("▁中", W),
    ],
)
def test_position_class_of_canonical_forms(canon: str, expected: int) -> None:
    assert position_class(canon) == expected


def test_classes_from_each_family_marker() -> None:
    wordpiece = {"[CLS]": 0, "play": 1, "##ing": 2, "##.": 3, ".": 4}
    # id 5: a hole
    assert vocab_classes(wordpiece, "wordpiece", 6, specials={0}).tolist() == [N, W, C, N, N, N]
    bytebpe = {"<s>": 0, "Ġplay": 1, "ing": 2, "Ġ.": 3, ".": 4, "Ã": 5, "ĠÃ": 6}
    # Ã: a lone byte
    assert vocab_classes(bytebpe, "bytebpe", 7, specials={0}).tolist() == [N, W, C, N, N, N, N]
    sentencepiece = {"<s>": 0, "▁Haus": 1, "haus": 2, "<0x0A>": 3, "▁": 4}
    assert vocab_classes(sentencepiece, "sentencepiece", 5, specials={0}).tolist() == [
        N,
        W,
        C,
        N,
        N,
    ]
    assert vocab_classes({"ing": 0, "Ġa": 1}, "raw", 2).tolist() == [N, N]  # no marker to read


def test_marked_strings() -> None:
    assert marked_string("ing", C, "##") == "##ing" and marked_string("ing", C, "-") == "-ing"
    # WordPiece: decoded with its own marker
    assert marked_string("##ing", C, "##", own_prefix="##") == "##ing"
    assert marked_string("##ing", C, "-", own_prefix="##") == "-ing"
    # a byte-level piece that reads "##x" keeps its text
    assert marked_string("##x", C, "##") == "####x"
    assert marked_string("play", W, "-") == "play" and marked_string(".", N, "-") == "."


def test_class_offsets_penalise_only_the_other_non_neutral_class() -> None:
    src = torch.tensor([W, C, N, C, W])
    initial, continuation = class_offsets(W, src, 0.3), class_offsets(C, src, 0.3)
    assert initial is not None and initial.tolist() == [0.0, -0.3, 0.0, -0.3, 0.0]
    assert continuation is not None and continuation.tolist() == [-0.3, 0.0, 0.0, 0.0, -0.3]
    assert class_offsets(N, src, 0.3) is None and class_offsets(W, src, 0.0) is None


def test_stack_rows_puts_blocks_back_in_row_order() -> None:
    a = torch.tensor([[0.0, 1.0, 0.0], [0.5, 0.0, 0.5]]).to_sparse_csr()
    b = torch.tensor([[0.0, 0.0, 1.0]]).to_sparse_csr()
    out = stack_rows([(torch.tensor([2, 0]), a), (torch.tensor([1]), b)], 3, 3)
    torch.testing.assert_close(
        out.to_dense(), torch.tensor([[0.5, 0.0, 0.5], [0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    )


def _oracle_row(
    cos: torch.Tensor, alpha: float, temperature: float, top_k: int | None
) -> torch.Tensor:
    scores = cos / temperature
    if alpha == 1:
        top = scores.topk(top_k or len(scores))
        return torch.zeros_like(scores).scatter(0, top.indices, torch.softmax(top.values, 0))
    if alpha == 2:
        return sparsemax(scores, dim=0)
    return entmax_bisect(scores, alpha=alpha, dim=0, n_iter=100)


@pytest.mark.parametrize(
    ("alpha", "temperature", "top_k"),
    [(4.0, 1.0, None), (2.0, 1.0, None), (1.5, 1.0, None), (1.0, 0.1, 10)],
)
@pytest.mark.parametrize("penalty", [0.1, 0.35, 4.0])
def test_class_prior_equals_full_row_entmax_of_adjusted_cosines(
    alpha: float, temperature: float, top_k: int | None, penalty: float
) -> None:
    gen = torch.Generator().manual_seed(0)
    new, src = torch.randn(30, 6, generator=gen), torch.randn(300, 6, generator=gen)
    new_cls = torch.randint(0, 3, (30,), generator=gen)
    src_cls = torch.randint(0, 3, (300,), generator=gen)
    src_cls[:40] = C  # the continuation class is never empty here; the empty case is tested below
    got = (
        class_weights(
            lambda ids, off: bridge_weights(
                new[ids], src, alpha, temperature=temperature, top_k=top_k, offsets=off
            ),
            new_cls,
            src_cls,
            penalty,
        )
        .to_dense()
        .double()
    )
    cos = (
        torch.nn.functional.normalize(new.double(), dim=1)
        @ torch.nn.functional.normalize(src.double(), dim=1).T
    )
    # the prior, written out: -penalty where both classes are non-neutral and differ
    for i in range(len(new)):
        other = (src_cls != new_cls[i]) & (src_cls != N) & (new_cls[i] != N)
        expected = _oracle_row(cos[i] - penalty * other.double(), alpha, temperature, top_k)
        assert (got[i] - expected).abs().max().item() < 5e-4, i


def test_a_hard_mask_falls_back_to_every_candidate_when_the_class_is_empty() -> None:
    gen = torch.Generator().manual_seed(1)
    new, src = torch.randn(5, 4, generator=gen), torch.randn(50, 4, generator=gen)
    no_continuations = torch.full((50,), W)
    w = class_weights(
        lambda ids, off: bridge_weights(new[ids], src, 4.0, offsets=off),
        torch.full((5,), C),
        no_continuations,
        4.0,
    )
    # one offset for all: no-op
    torch.testing.assert_close(w.to_dense(), bridge_weights(new, src, 4.0).to_dense())


def test_position_stats_on_a_hand_made_provenance() -> None:
    rows = [  # target id, kind, source ids
        (0, "special", [0]),
        (1, "bridge", [10, 11]),
        (2, "bridge", [12]),
        (3, "bridge", [13, 14, 15]),
        (4, "bridge", [16, 17]),
        (5, "overlap", [18]),
        (6, "bridge", [19]),
    ]
    prov = pa.table(
        {
            "target_id": [r[0] for r in rows],
            "token": [""] * 7,
            "kind": [r[1] for r in rows],
            "source_ids": [r[2] for r in rows],
            "weights": [[1.0 / len(r[2])] * len(r[2]) for r in rows],
        },
        schema=PROVENANCE_SCHEMA,
    )
    classes = np.array([N, W, W, C, C, C, N], np.int8)
    # 2 and 4 miss theirs; 5 is copied, not bridged
    counterparts = {1: 11, 2: 99, 3: 15, 4: 99, 5: 18, 6: 19}
    stats = position_stats(prov, classes, counterparts)
    assert stats["exact_counterpart"] == {
        "word_initial": {"with_counterpart": 2, "zero_weight": 1, "zero_weight_share": 0.5},
        "continuation": {"with_counterpart": 2, "zero_weight": 1, "zero_weight_share": 0.5},
        "neutral": {"with_counterpart": 1, "zero_weight": 0, "zero_weight_share": 0.0},
        "all": {"with_counterpart": 5, "zero_weight": 2, "zero_weight_share": 0.4},
    }
    assert stats["support_histogram"] == {
        "word_initial": {"1": 1, "2": 1},
        "continuation": {"2": 1, "3": 1},
        "neutral": {"1": 1},
    }


# ---- the whole init, with a character n-gram bridge: fast, deterministic, and string-identical
# means cosine 1 ----


def ngram_vectors(strings: list[str], dim: int = 256) -> np.ndarray:
    """Hashed counts of a string's 1- to 3-grams (with boundary marks), L2-normalised: (n, dim)
    float32."""
    out = np.zeros((len(strings), dim), np.float32)
    for row, text in enumerate(strings):
        padded = f"<{text}>"
        for n in (1, 2, 3):
            for i in range(len(padded) - n + 1):
                out[
                    row,
                    int.from_bytes(
                        hashlib.blake2b(padded[i : i + n].encode(), digest_size=4).digest()
                    )
                    % dim,
                ] += 1
    return out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)


NGRAM_STAGES = Stages(
    encode=lambda table: ngram_vectors(table.column("text").to_pylist()), rows=compute_rows
)
FAMILY_COMBOS = {
    "bytebpe": ("bert-mlm", "tok-bytebpe"),
    "sentencepiece": ("bert-mlm", "tok-unigram"),
    "wordpiece": ("roberta-mlm", "tok-wordpiece"),
}


@functools.cache
def run(root: Path, out: Path, src: str, tgt: str, **overrides: Any) -> tuple[pa.Table, InitReport]:
    cfg = InitConfig(
        source_model=str(root / src),
        target_tokenizer=str(root / tgt),
        bridge_model=str(root / "bridge"),
        output=str(out / "-".join([src, tgt, *map(str, overrides.values())])),
        cache_dir=str(out / "cache"),
        samples=3,
        copy_overlap=False,
        exclude_special_sources=True,
    ).with_settings(**overrides)
    result = initialise(cfg, NGRAM_STAGES)
    return pq.read_table(Path(result.output) / "provenance.parquet"), result.report


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("position")


def continuation_counterparts(src: Any, tgt: Any) -> dict[int, int]:
    """Written from the markers alone: target continuation pieces (ASCII letters) -> their source
    piece."""
    svocab, out = src.get_vocab(), {}
    for token, tid in tgt.get_vocab().items():
        wordpiece_target = token.startswith("##")
        body = token[2:] if wordpiece_target else token
        if (
            not body.isascii()
            or not body.isalpha()
            or (not wordpiece_target and type(tgt).__name__.startswith("Bert"))
        ):
            continue
        # WordPiece target <- byte-level source, or back
        counterpart = body if wordpiece_target else "##" + body
        if counterpart in svocab:
            out[tid] = svocab[counterpart]
    return out


def zero_weight(prov: pa.Table, counterparts: dict[int, int]) -> list[int]:
    ids = prov.column("source_ids").to_pylist()
    assert all(prov.column("kind")[t].as_py() == "bridge" for t in counterparts)
    return [t for t, s in counterparts.items() if s not in ids[t]]


@pytest.mark.parametrize("family", list(FAMILY_COMBOS))
@pytest.mark.parametrize(
    "method",
    [{}, {"alpha": 2.0}, {"alpha": 1.0}, {"method": "focus"}, {"method": "wechsel"}],
    ids=["alpha4", "alpha2", "softmax", "focus", "wechsel"],
)
def test_a_continuation_piece_weights_its_counterpart(
    fixtures_root: Path, out: Path, family: str, method: dict[str, Any]
) -> None:
    src, tgt = FAMILY_COMBOS[family]
    pairs = continuation_counterparts(
        *(AutoTokenizer.from_pretrained(fixtures_root / n) for n in (src, tgt))
    )
    assert len(pairs) > 50
    improved, rep = run(fixtures_root, out, src, tgt, position_aware=True, **method)
    assert zero_weight(improved, pairs) == []
    # The report counts these and also case-folded counterparts (``A`` -> ``##a``), which this
    # case-sensitive bridge keeps apart.
    assert rep["position"]["exact_counterpart"]["continuation"]["with_counterpart"] >= len(pairs)
    if family != "wordpiece" and not method:
        # The released rule collapses some of them onto the string-identical word-initial piece (a
        # byte-level source's "Ġing" and "ing" both read "ing", so there the counterpart ties and
        # keeps weight).
        faithful, _ = run(fixtures_root, out, src, tgt)
        assert len(zero_weight(faithful, pairs)) > 0.1 * len(pairs)


def test_marked_strings_and_cache_keys(fixtures_root: Path, out: Path) -> None:
    """A cache key names the strings: a vocabulary whose strings the rule changes gets its own key,
    one whose strings stay the same keeps the released key (and the vectors already cached under
    it)."""
    fps = {
        marker: run(
            fixtures_root,
            out,
            "bert-mlm",
            "tok-bytebpe",
            position_aware=True,
            position_marker=marker,
        )[1]["fingerprints"]
        for marker in ("-", "##")
    }
    released = run(fixtures_root, out, "bert-mlm", "tok-bytebpe")[1]["fingerprints"]
    prior_only = run(
        fixtures_root,
        out,
        "bert-mlm",
        "tok-bytebpe",
        position_aware=True,
        position_marker="",
        position_penalty=0.5,
    )[1]["fingerprints"]
    assert prior_only == released  # the prior alone leaves the strings as they are
    # WordPiece's ##ing already reads "##ing"
    assert fps["##"]["source_tokenizer"] == released["source_tokenizer"]
    # "-ing": other strings, other key
    assert len({fps["-"]["source_tokenizer"], fps["##"]["source_tokenizer"]}) == 2
    # byte-level: changed by both
    assert len({f["target_tokenizer"] for f in (released, fps["-"], fps["##"])}) == 3
    for f in fps.values():
        assert (
            out / "cache" / f"{f['bridge_model']}-{f['target_tokenizer']}" / "vectors.parquet"
        ).is_file()


@pytest.mark.parametrize("marker", ["-", "##"])
def test_real_tokenizers_mark_the_same_piece_the_same_way(shared_data: Path, marker: str) -> None:
    bert = AutoTokenizer.from_pretrained(shared_data / "tokenizers" / "bert-base-uncased")
    roberta = AutoTokenizer.from_pretrained(shared_data / "tokenizers" / "roberta-base")
    strings = {}
    for name, tok in (("bert", bert), ("roberta", roberta)):
        ids = [
            tok.convert_tokens_to_ids(t)
            for t in (("##ing", "ing", "##.") if name == "bert" else ("ing", "Ġing", "."))
        ]
        # roberta-base's ids have holes
        classes = tokenizer_classes(tok, max(tok.get_vocab().values()) + 1)
        table = vocab_strings(tok, classes, marker).to_pydict()
        strings[name] = [table["text"][table["id"].index(i)] for i in ids]
        assert [int(classes[i]) for i in ids] == [C, W, N]
    assert strings["bert"][:2] == strings["roberta"][:2] == [f"{marker}ing", "ing"]
    # neutral: as released (BERT's "##." is never produced, so stays apart)
    assert strings["roberta"][2] == "."
