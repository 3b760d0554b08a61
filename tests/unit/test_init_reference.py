"""The init job's output against a plain, independent reference of the rules (full rows, float64
entmax), on tiny models of every tokenizer family; plus the bias policies and the baselines'
rules."""

from __future__ import annotations

import functools
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from entmax import entmax_bisect, sparsemax
from sentence_transformers import SentenceTransformer, SparseEncoder
from transformers import AutoModelForMaskedLM, AutoTokenizer

from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.init.run import initialise
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.outputs import is_complete

COMBOS = [
    ("bert-mlm", "tok-unigram"),
    ("roberta-mlm", "tok-wordpiece"),
    ("bert-mlm", "tok-bytebpe"),
    ("roberta-mlm", "tok-unigram"),
]
ROLES = ("cls", "sep", "pad", "mask", "unk", "bos", "eos")
FALLBACK = {"bos": "cls", "eos": "sep", "cls": "bos", "sep": "eos"}


# ---- the reference: written from the rules in the issue, sharing no code with
# sembridge_ray.embed_init ----


def ref_canonical(tok: Any, token: str) -> str:
    kind = type(tok).__name__
    if kind.startswith("Bert"):
        return token[2:] if token.startswith("##") and len(token) > 2 else "▁" + token
    if kind.startswith("Roberta"):
        text = tok.convert_tokens_to_string([token])
        if "\ufffd" in text:
            return "bytes:" + token  # partial UTF-8: never equal to text
        return "▁" + text[1:] if text.startswith(" ") else text
    return token


def ref_partition(src: Any, tgt: Any) -> tuple[dict[int, int], list[int]]:
    """target id -> copied source id (roles, then symbols/exact/fuzzy), and the rest in id order."""
    copies: dict[int, int] = {}
    for role in ROLES:
        t = getattr(tgt, f"{role}_token_id")
        s = getattr(src, f"{role}_token_id")
        if s is None and role in FALLBACK:
            s = getattr(src, f"{FALLBACK[role]}_token_id")
        if t is not None and s is not None and t not in copies:
            copies[t] = s
    exact: dict[str, int] = {}
    fuzzy: dict[str, tuple[bool, int]] = {}
    specials = set(src.all_special_ids)
    for token, sid in sorted(src.get_vocab().items(), key=lambda kv: kv[1]):
        if sid in specials:
            continue
        c = ref_canonical(src, token)
        exact.setdefault(c, sid)
        key = c.replace("▁", "").lower()
        if key and (key not in fuzzy or (c != key, sid) < fuzzy[key]):
            fuzzy[key] = (c != key, sid)
    rest = []
    for token, tid in sorted(tgt.get_vocab().items(), key=lambda kv: kv[1]):
        if tid in copies:
            continue
        c = ref_canonical(tgt, token)
        # with all three rules on, symbols/exact/fuzzy reduce to: exact, else fuzzy
        hit = exact.get(c)
        if hit is None:
            hit = fuzzy.get(c.replace("▁", "").lower(), (None, None))[1]
        if hit is None:
            rest.append(tid)
        else:
            copies[tid] = hit
    return copies, rest


def ref_string(tok: Any, tid: int, raw: str) -> str:
    s = tok.decode([tid]).strip()
    return raw if not s or (s.startswith("[") and s.endswith("]")) else s


def ref_weights(bridge: Any, src: Any, tgt: Any, rest: list[int], alpha: float) -> torch.Tensor:
    svocab = sorted(src.get_vocab().items(), key=lambda kv: kv[1])
    tvocab = dict((i, t) for t, i in tgt.get_vocab().items())
    s_vec = bridge.encode(
        [ref_string(src, i, t) for t, i in svocab], convert_to_tensor=True
    ).double()
    n_vec = bridge.encode(
        [ref_string(tgt, i, tvocab[i]) for i in rest], convert_to_tensor=True
    ).double()
    cos = (
        torch.nn.functional.normalize(n_vec, dim=1) @ torch.nn.functional.normalize(s_vec, dim=1).T
    )
    w = sparsemax(cos, dim=1) if alpha == 2 else entmax_bisect(cos, alpha=alpha, dim=1, n_iter=60)
    full = torch.zeros(len(rest), max(i for _, i in svocab) + 1, dtype=torch.float64)
    full[:, [i for _, i in svocab]] = w
    return full


# ---- the system under test ----


@functools.cache
def run(root: Path, out: Path, src: str, tgt: str, **overrides: Any) -> Path:
    cfg = InitConfig(
        source_model=str(root / src),
        target_tokenizer=str(root / tgt),
        bridge_model=str(root / "bridge"),
        output=str(out / "-".join([src, tgt, *map(str, overrides.values())])),
        cache_dir=str(out / "cache"),
        samples=5,
    )
    return Path(initialise(cfg.with_settings(**overrides)).output)


@pytest.fixture(scope="module")
def out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("init")


def load(path: Path) -> tuple[Any, Any]:
    return AutoModelForMaskedLM.from_pretrained(path / "model"), AutoTokenizer.from_pretrained(
        path / "model"
    )


@pytest.mark.parametrize(("src", "tgt"), COMBOS)
def test_written_model_matches_the_reference(
    fixtures_root: Path, out: Path, src: str, tgt: str
) -> None:
    result = run(fixtures_root, out, src, tgt)
    model, tok = load(result)
    source = AutoModelForMaskedLM.from_pretrained(fixtures_root / src)
    s_tok, t_tok = (
        AutoTokenizer.from_pretrained(fixtures_root / src),
        AutoTokenizer.from_pretrained(fixtures_root / tgt),
    )
    assert tok.get_vocab() == t_tok.get_vocab() and model.config.vocab_size == len(t_tok)
    copies, rest = ref_partition(s_tok, t_tok)
    e_s = source.get_input_embeddings().weight.detach().double()
    expected = torch.zeros(len(t_tok), e_s.shape[1], dtype=torch.float64)
    expected[list(copies)] = e_s[list(copies.values())]
    w = ref_weights(
        SentenceTransformer(str(fixtures_root / "bridge"), device="cpu"), s_tok, t_tok, rest, 4.0
    )
    expected[rest] = w @ e_s
    got = model.get_input_embeddings().weight.detach().double()
    assert (got - expected).abs().max().item() < 1e-4
    b_s = source.get_output_embeddings().bias.detach().double()
    b_exp = torch.zeros(len(t_tok), dtype=torch.float64)
    b_exp[list(copies)] = b_s[list(copies.values())]
    b_exp[rest] = w @ b_s
    assert (model.get_output_embeddings().bias.detach().double() - b_exp).abs().max().item() < 1e-4
    assert (
        model.get_output_embeddings().weight.data_ptr()
        == model.get_input_embeddings().weight.data_ptr()
    )
    assert model.config.pad_token_id == tok.pad_token_id
    vec = SparseEncoder(str(result / "model"), device="cpu").encode(
        ["A man is playing a guitar"], convert_to_tensor=True
    )
    assert vec.shape == (1, len(t_tok)) and int((vec.to_dense() > 0).sum()) > 0


def test_provenance_and_report(fixtures_root: Path, out: Path) -> None:
    result = run(fixtures_root, out, "bert-mlm", "tok-unigram")
    prov = pq.read_table(result / "provenance.parquet")
    assert [f.type for f in prov.schema] == [
        pa.int32(),
        pa.string(),
        pa.string(),
        pa.list_(pa.int32()),
        pa.list_(pa.float32()),
    ]
    kinds = prov.column("kind").to_pylist()
    assert set(kinds) <= {"overlap", "special", "bridge", "random"} and prov.num_rows == 1500
    for k, w in zip(kinds, prov.column("weights").to_pylist(), strict=True):
        assert (w == [1.0]) if k in ("overlap", "special") else abs(sum(w) - 1) < 1e-5
    import json

    rep = json.loads((result / "init_report.json").read_text())
    assert rep["kinds"]["bridge"] == kinds.count("bridge") and sum(
        rep["support_histogram"].values()
    ) == kinds.count("bridge")
    assert {"method", "alpha", "bias", "timings", "fingerprints", "samples", "match_rules"} <= set(
        rep
    )
    assert len(rep["samples"]) == 5 and all(len(s["top"]) <= 3 for s in rep["samples"])
    assert is_complete(result)


def test_bias_policies(fixtures_root: Path, out: Path) -> None:
    source = AutoModelForMaskedLM.from_pretrained(fixtures_root / "bert-mlm")
    b_s = source.get_output_embeddings().bias.detach()
    zero, _ = load(run(fixtures_root, out, "bert-mlm", "tok-unigram", bias="zero"))
    assert not bool(zero.get_output_embeddings().bias.any())
    index, _ = load(run(fixtures_root, out, "bert-mlm", "tok-unigram", bias="index"))
    resized = AutoModelForMaskedLM.from_pretrained(fixtures_root / "bert-mlm")
    # what the released reference inherits
    resized.resize_token_embeddings(1500, mean_resizing=False)
    assert torch.equal(index.get_output_embeddings().bias, resized.get_output_embeddings().bias)
    assert torch.equal(index.get_output_embeddings().bias, b_s[:1500])


def test_baselines(fixtures_root: Path, out: Path) -> None:
    prov = {
        m: pq.read_table(
            run(fixtures_root, out, "bert-mlm", "tok-unigram", method=m) / "provenance.parquet"
        )
        for m in ("focus", "wechsel", "mean", "random")
    }
    base = pq.read_table(run(fixtures_root, out, "bert-mlm", "tok-unigram") / "provenance.parquet")
    overlap_sources = {
        s[0]
        for s, k in zip(
            base.column("source_ids").to_pylist(), base.column("kind").to_pylist(), strict=True
        )
        if k == "overlap"
    }
    for ids, kind in zip(
        prov["focus"].column("source_ids").to_pylist(),
        prov["focus"].column("kind").to_pylist(),
        strict=True,
    ):
        if kind == "bridge":
            assert set(ids) <= overlap_sources
    sizes = {
        len(i)
        for i, k in zip(
            prov["wechsel"].column("source_ids").to_pylist(),
            prov["wechsel"].column("kind").to_pylist(),
            strict=True,
        )
        if k == "bridge"
    }
    assert sizes == {10}
    assert prov["mean"].column("kind").to_pylist() == prov["random"].column("kind").to_pylist()
    e_s = (
        AutoModelForMaskedLM.from_pretrained(fixtures_root / "bert-mlm")
        .get_input_embeddings()
        .weight.detach()
    )
    mean, _ = load(run(fixtures_root, out, "bert-mlm", "tok-unigram", method="mean"))
    rand, _ = load(run(fixtures_root, out, "bert-mlm", "tok-unigram", method="random"))
    rows = [i for i, k in enumerate(prov["mean"].column("kind").to_pylist()) if k == "random"]
    torch.testing.assert_close(
        mean.get_input_embeddings().weight[rows], e_s.mean(0).expand(len(rows), -1)
    )
    r = rand.get_input_embeddings().weight[rows].detach().double()
    assert (r.mean(0) - e_s.double().mean(0)).abs().max() < 4 * (
        e_s.double().std(0).max() / np.sqrt(len(rows))
    )
    again, _ = load(
        run(fixtures_root, out, "bert-mlm", "tok-unigram", method="random", seed=0, samples=4)
    )
    assert torch.equal(again.get_input_embeddings().weight, rand.get_input_embeddings().weight)


def test_empty_overlap_is_reported(fixtures_root: Path, out: Path) -> None:
    import json

    result = run(fixtures_root, out, "bert-mlm", "tok-unigram", copy_overlap=False)
    rep = json.loads((result / "init_report.json").read_text())
    assert rep["overlap_empty"] is True and rep["kinds"].get("overlap", 0) == 0
    # FOCUS keeps its anchors (the tokens that would have been copied), so it does not collapse to
    # sparsemax (α=2).
    copied = pq.read_table(
        run(fixtures_root, out, "bert-mlm", "tok-unigram") / "provenance.parquet"
    )
    anchors = {
        s[0]
        for s, k in zip(
            copied.column("source_ids").to_pylist(), copied.column("kind").to_pylist(), strict=True
        )
        if k == "overlap"
    }
    focus = pq.read_table(
        run(fixtures_root, out, "bert-mlm", "tok-unigram", copy_overlap=False, method="focus")
        / "provenance.parquet"
    )
    used = {
        i
        for ids, k in zip(
            focus.column("source_ids").to_pylist(), focus.column("kind").to_pylist(), strict=True
        )
        if k == "bridge"
        for i in ids
    }
    assert used and used <= anchors


@pytest.mark.parametrize("method", ["sembridge", "random"])
def test_a_target_vocabulary_inside_the_source_writes_the_copied_model(
    fixtures_root: Path, out: Path, method: str
) -> None:
    """Nothing left to initialise (the source's own tokenizer as the target): the model is the
    source, copied."""
    result = run(fixtures_root, out, "bert-mlm", "bert-mlm", method=method)
    assert is_complete(result)
    model, _ = load(result)
    source = AutoModelForMaskedLM.from_pretrained(fixtures_root / "bert-mlm")
    for name, tensor in source.state_dict().items():
        assert torch.equal(model.state_dict()[name], tensor), name
    kinds = pq.read_table(result / "provenance.parquet").column("kind").to_pylist()
    assert set(kinds) == {"overlap", "special"}


def test_missing_inputs_are_named(fixtures_root: Path, tmp_path: Path) -> None:
    cfg = InitConfig(
        source_model=str(tmp_path / "nope"),
        target_tokenizer=str(fixtures_root / "tok-unigram"),
        bridge_model=str(fixtures_root / "bridge"),
        output=str(tmp_path / "o"),
    )
    with pytest.raises(InputError, match="nope"):
        initialise(cfg)
    with pytest.raises(InputError, match="nothing-here"):
        initialise(
            replace(
                cfg,
                source_model=str(fixtures_root / "bert-mlm"),
                target_tokenizer=str(tmp_path / "nothing-here"),
            )
        )
    with pytest.raises(InputError, match="bridge model"):
        initialise(
            replace(
                cfg,
                source_model=str(fixtures_root / "bert-mlm"),
                bridge_model=str(tmp_path / "no-bridge"),
                cache_dir=str(tmp_path / "c"),
            )
        )
    assert not (tmp_path / "o" / "_SUCCESS").exists()


def test_non_finite_bridge_vectors_are_an_error() -> None:
    from sembridge_ray.embed_init.bridge import encode_strings

    class NanBridge:
        def encode(self, strings: list[str], **_: Any) -> np.ndarray:
            return np.full((len(strings), 4), np.nan, dtype=np.float32)

    with pytest.raises(InputError, match="bridge model 'nan-bridge' returned non-finite vectors"):
        encode_strings(NanBridge(), ["a", "b"], 2, "nan-bridge")  # type: ignore[arg-type]  # a stand-in model
