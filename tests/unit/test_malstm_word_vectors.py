"""The MaLSTM's extra word-vector sources: retrofitting, aggregated contextual vectors and their
cache, the input embeddings, and the guarantee that building vectors never reads SICK test."""

from __future__ import annotations

import builtins
import io
from pathlib import Path

import numpy as np
import pytest
import torch
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
from transformers import BertConfig, BertModel, BertTokenizer

from sembridge_ray.siamese import contextual as ctx
from sembridge_ray.siamese import vectors
from sembridge_ray.siamese.config import AugmentConfig, VectorConfig
from sembridge_ray.siamese.prepare import lookup_vectors
from sembridge_ray.siamese.retrofit import retrofit, thesaurus_neighbours
from sembridge_ray.testing import BERT_SPECIALS, TINY

PIECES = [
    *BERT_SPECIALS,
    "the",
    "a",
    "cat",
    "sat",
    "ran",
    "dog",
    "zeb",
    "##ra",
    ".",
    "man",
    "play",
    "##s",
]
CORPUS = ["the cat sat", "a zebra ran .", "the cat ran with a zebra"]  # "with" is [UNK]


def test_retrofit_matches_the_hand_computed_two_word_update() -> None:
    # a = (1, 0), b = (0, 1), linked. One update: each becomes (q̂ + other) / 2 = (.5, .5). A second
    # update: a = ((1, 0) + (.5, .5)) / 2 = (.75, .25). The fixed point solves a = (q̂a + b)/2, b =
    # (q̂b + a)/2: a = (2 q̂a + q̂b) / 3 = (2/3, 1/3). A third word with no neighbour keeps its
    # vector.
    q = np.array([[1.0, 0.0], [0.0, 1.0], [3.0, 4.0]])
    links = [[1], [0], []]
    np.testing.assert_allclose(
        retrofit(q, links, 1), [[0.5, 0.5], [0.5, 0.5], [3.0, 4.0]], atol=1e-7
    )
    np.testing.assert_allclose(
        retrofit(q, links, 2), [[0.75, 0.25], [0.25, 0.75], [3.0, 4.0]], atol=1e-7
    )
    np.testing.assert_allclose(
        retrofit(q, links, 60), [[2 / 3, 1 / 3], [1 / 3, 2 / 3], [3.0, 4.0]], atol=1e-6
    )
    np.testing.assert_array_equal(retrofit(q, links, 0), q)


def test_retrofit_weights_each_neighbour_by_one_over_the_degree() -> None:
    # a linked to b and c: a ← (q̂a + (q̂b + q̂c)/2) / 2 = ((0,0) + (1,1)/2) / 2 = (.25, .25) after
    # one update
    q = np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    np.testing.assert_allclose(retrofit(q, [[1, 2], [0], [0]], 1)[0], [0.25, 0.25], atol=1e-7)


def test_thesaurus_neighbours_are_symmetric_case_blind_and_within_the_vocabulary() -> None:
    words = ["Man", "man", "guy", "play", "zebra"]
    # "homo"/"act" have no vector; self-links drop
    thesaurus = {"man": ["guy", "homo"], "play": ["play", "act"]}
    assert thesaurus_neighbours(words, thesaurus) == [[2], [2], [0, 1], [], []]


@pytest.fixture(scope="module")
def tiny_minilm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer BERT and a fixed word-piece vocabulary, saved like the bundled MiniLM."""
    tok = Tokenizer(models.WordPiece({p: i for i, p in enumerate(PIECES)}, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]",
        special_tokens=[("[CLS]", PIECES.index("[CLS]")), ("[SEP]", PIECES.index("[SEP]"))],
    )
    tokenizer = BertTokenizer(tokenizer_object=tok, do_lower_case=True, model_max_length=128)
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=len(PIECES), max_position_embeddings=64, **{**TINY, "num_hidden_layers": 2}
    )
    out = tmp_path_factory.mktemp("tiny-minilm")
    BertModel(config).eval().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _load(path: Path) -> tuple[BertModel, BertTokenizer]:
    return BertModel.from_pretrained(path).eval(), BertTokenizer.from_pretrained(path)


def _hidden(model: BertModel, tokenizer: BertTokenizer, text: str) -> torch.Tensor:
    """(L, T, D) hidden states of one sentence, no padding."""
    with torch.no_grad():
        return torch.stack(
            model(**tokenizer(text, return_tensors="pt"), output_hidden_states=True).hidden_states
        )[:, 0]


def test_aggregated_vectors_equal_the_direct_average_over_occurrences(tiny_minilm: Path) -> None:
    model, tokenizer = _load(tiny_minilm)
    tokens = ctx.corpus_tokens(CORPUS)
    occ = ctx.first_occurrences(tokens, ["cat", "zebra", "dog"], k=5)
    assert occ == {"cat": [(0, 1), (2, 1)], "zebra": [(1, 1), (2, 5)]}  # "dog" never occurs
    got = ctx.aggregate_contexts(model, tokenizer, tokens, occ, batch_size=2)  # padded batches
    h0, h1, h2 = (_hidden(model, tokenizer, s) for s in CORPUS)
    # [CLS] the cat sat [SEP]; [CLS] a zeb ##ra ran . [SEP]; [CLS] the cat ran [UNK] a zeb ##ra
    # [SEP]
    cat = (h0[:, 2] + h2[:, 2]) / 2
    zebra_mean = (h1[:, 2:4].mean(1) + h2[:, 6:8].mean(1)) / 2
    zebra_first = (h1[:, 2] + h2[:, 6]) / 2
    np.testing.assert_allclose(got["mean"]["cat"], cat.numpy(), atol=1e-5)
    np.testing.assert_allclose(got["first"]["cat"], cat.numpy(), atol=1e-5)
    np.testing.assert_allclose(got["mean"]["zebra"], zebra_mean.numpy(), atol=1e-5)
    np.testing.assert_allclose(got["first"]["zebra"], zebra_first.numpy(), atol=1e-5)
    assert got["mean"]["cat"].shape == (3, 32) and "dog" not in got["mean"]
    # k caps the contexts: the first occurrence only
    one = ctx.aggregate_contexts(
        model, tokenizer, tokens, ctx.first_occurrences(tokens, ["zebra"], k=1)
    )
    np.testing.assert_allclose(one["mean"]["zebra"], h1[:, 2:4].mean(1).numpy(), atol=1e-5)


def test_unseen_words_get_their_decontextualised_vector(tiny_minilm: Path) -> None:
    model, tokenizer = _load(tiny_minilm)
    got = ctx.decontextualised(model, tokenizer, ["dog", "plays", "qqq"])
    np.testing.assert_allclose(
        got["mean"]["plays"], _hidden(model, tokenizer, "plays")[:, 1:3].mean(1), atol=1e-5
    )
    assert "qqq" not in got["mean"]  # all [UNK]: no vector at all


def test_input_embeddings_average_the_word_pieces(tiny_minilm: Path) -> None:
    model, tokenizer = _load(tiny_minilm)
    table = model.get_input_embeddings().weight.detach().numpy()
    got = ctx.input_embeddings(model, tokenizer, ["plays", "man", "qqq"])
    np.testing.assert_allclose(
        got["plays"], (table[PIECES.index("play")] + table[PIECES.index("##s")]) / 2
    )
    assert set(got) == {"plays", "man"}


def test_context_cache_is_keyed_by_source_corpus_layer_pooling_and_contexts(tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    spec = vectors.ContextSpec(corpus=tuple(CORPUS), layer=2, pooling="mean", contexts=10)
    path = spec.cache_path(tmp_path, model_dir)
    others = [
        vectors.ContextSpec(corpus=tuple(CORPUS[:2]), layer=2, pooling="mean", contexts=10),
        vectors.ContextSpec(corpus=tuple(CORPUS), layer=1, pooling="mean", contexts=10),
        vectors.ContextSpec(corpus=tuple(CORPUS), layer=2, pooling="first", contexts=10),
        vectors.ContextSpec(corpus=tuple(CORPUS), layer=2, pooling="mean", contexts=5),
    ]
    assert len({path, *(o.cache_path(tmp_path, model_dir) for o in others)}) == 5
    assert path.name.startswith("context-")  # never the isolated ``minilm-<model>.npz`` cache


def test_context_vectors_are_cached_per_layer_and_reused(
    tiny_minilm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(vectors, "minilm_dir", lambda: tiny_minilm)
    model, tokenizer = _load(tiny_minilm)
    spec = vectors.ContextSpec(corpus=tuple(CORPUS), layer=2, pooling="mean", contexts=10)
    found, stats = vectors.encode_contextual(["Cat", "zebra", "dog", "qqq"], spec, tmp_path)
    assert (
        set(found) == {"Cat", "zebra", "dog"}
        and stats["seen_in_context"] == 2
        and stats["built_now"] == 4
    )
    expected = ctx.aggregate_contexts(
        model, tokenizer, ctx.corpus_tokens(CORPUS), {"cat": [(0, 1), (2, 1)]}
    )
    np.testing.assert_allclose(found["Cat"], expected["mean"]["cat"][2], atol=1e-5)
    # layers 0-2 x both poolings, from one pass
    assert len(list(tmp_path.glob("context-*/part-*"))) == 6

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("recomputed a cached word")

    monkeypatch.setattr(ctx, "aggregate_contexts", refuse)
    again, stats = vectors.encode_contextual(
        ["cat", "zebra"],
        vectors.ContextSpec(corpus=tuple(CORPUS), layer=1, pooling="first", contexts=10),
        tmp_path,
    )
    assert stats["built_now"] == 0
    np.testing.assert_allclose(again["cat"], expected["first"]["cat"][1], atol=1e-5)


def test_building_vectors_never_reads_sick_test(
    tiny_minilm: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sembridge_ray.resources import sick_dir, sts_dir

    monkeypatch.setattr(vectors, "minilm_dir", lambda: tiny_minilm)
    opened: list[str] = []
    real_open = builtins.open

    def spy(file: object, *args: object, **kwargs: object) -> object:
        opened.append(str(file))
        return real_open(file, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(io, "open", spy)
    vcfg = VectorConfig(source="minilm-context", layer=1, contexts=1, cache_dir=str(tmp_path))
    found, build = lookup_vectors(
        vcfg,
        AugmentConfig(thesaurus="bundled"),
        ["cat", "sat", "policewoman"],
        sick_dir(),
        sts_dir(),
    )
    assert any(p.endswith("SICK_train.txt") for p in opened) and any(
        p.endswith(".tsv") for p in opened
    )
    assert not [p for p in opened if "test_annotated" in p.lower()]
    assert build["corpus_parts"] == ["sick-train", "sick-trial", "sts-all-years"]
    # "policewoman" (a SICK test word) is all [UNK] for the tiny vocabulary
    assert set(found) == {"cat", "sat"}


def test_source_names_parse_and_a_bad_one_is_named() -> None:
    for name in ("minilm", "minilm-context", "minilm-input"):
        assert vectors.parse_source(name) == (name, None)
    with pytest.raises(
        vectors.InputError, match=r"vectors 'glove': expected one of minilm, minilm-context"
    ):
        vectors.parse_source("glove")
