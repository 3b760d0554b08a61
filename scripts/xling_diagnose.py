"""Why a transfer from a real SPLADE works or not: the diagnosis of issue 41, on development articles
only, from the cross-lingual grid's zero-shot models.

    python scripts/xling_diagnose.py --grid outputs/xling            # every language the grid ran
    python scripts/xling_diagnose.py --grid outputs/xling --languages ru,zh --json diagnosis.json

Per language, comparing the released rule (``sembridge`` α=4, seed 0's init) with random init (seed
0's) and the source (``splade-tiny`` by default):

- **row norms** (the tied input/output embedding rows) of the copied, bridged and special tokens,
  and of the random rows, against the source's: medians;
- **the MLM bias** the init gives the new tokens (median), against the copied ones';
- **self-activation**: of up to ``--sample`` new tokens whose own string tokenizes to themselves,
  the share whose own dimension is among the ``--top`` strongest of the document vector of that
  string alone;
- **the bridge's confidence** per new token: its best source cosine, the ratio margin (best over
  the mean of the 10 best) and CSLS (2 cos − the mean of the target token's 10 nearest source
  cosines − the mean of the source token's 10 nearest target cosines; Conneau et al. 2018), and
  how the zero-shot development gain over random depends on it: per query the mean CSLS of its new
  tokens, queries cut into quartiles, the mean per-query ΔnDCG@10 in each;
- **unseen and unreachable tokens**: new tokens that the tokenizer never produces on the
  language's training and development text (*unseen*: rare pieces, and the unreachable ones), and
  those it can never produce (*unreachable*: a continuation piece ``##`` + one CJK character in a
  WordPiece vocabulary whose pre-tokenizer splits CJK characters apart, as bert-base-chinese's);
  their number, and the share of the zero-shot development query vectors' weight on them (terms
  that only expansion fires).

The development evaluations are scored here with the project's encoder and metrics, on every judged
development question (no test article is read)."""

from __future__ import annotations

import argparse
import json
import logging
import re
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import torch

from sembridge_ray import bundled
from sembridge_ray.embed_init.bridge import cached_vectors
from sembridge_ray.embed_init.config import WeightingConfig
from sembridge_ray.embed_init.pipeline import bridge_side, in_process_stages
from sembridge_ray.languages import CODES
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.reproduce.cells import cell_paths, expand
from sembridge_ray.recipes.reproduce.grid import xling_specs
from sembridge_ray.retrieval.dev import DevSet, load_judged
from sembridge_ray.retrieval.metrics import per_query_metrics
from sembridge_ray.sparse.encode import encode_texts
from sembridge_ray.sparse.model import load_sparse_encoder, load_tokenizer

log = logging.getLogger("xling_diagnose")
NEIGHBOURS = 10


def rows_and_bias(model_dir: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """(V, H) tied embedding rows and (V,) MLM decoder bias of a saved masked-LM."""
    from transformers import AutoModelForMaskedLM

    mlm = AutoModelForMaskedLM.from_pretrained(str(model_dir))
    return mlm.get_input_embeddings().weight.detach(), mlm.get_output_embeddings().bias.detach()


def kinds(init_dir: Path) -> dict[str, np.ndarray]:
    """{kind: target ids} from an init's ``provenance.parquet`` (overlap, bridge, special, ...)."""
    table = pq.read_table(init_dir / "provenance.parquet", columns=["target_id", "kind"])
    ids, found = table.column("target_id").to_numpy(), table.column("kind").to_pylist()
    return {k: ids[np.array([f == k for f in found])] for k in sorted(set(found))}


def median_norm(rows: torch.Tensor, ids: np.ndarray) -> float:
    return (
        float(rows[torch.as_tensor(ids, dtype=torch.long)].norm(dim=1).median())
        if len(ids)
        else float("nan")
    )


def self_activation(
    model_dir: Path, tokenizer: Any, ids: np.ndarray, top: int
) -> tuple[float, int]:
    """(share of ``ids`` whose own dimension is among the ``top`` of their own string's document
    vector, how many were tested): only tokens whose string tokenizes back to themselves alone."""
    strings, kept = [], []
    for i in ids.tolist():
        text = tokenizer.convert_tokens_to_string([tokenizer.convert_ids_to_tokens(i)]).strip()
        if text and tokenizer(text, add_special_tokens=False)["input_ids"] == [i]:
            strings.append(text)
            kept.append(i)
    if not kept:
        return float("nan"), 0
    model = load_sparse_encoder(str(model_dir), max_length=16)
    vectors = model.encode_document(strings, convert_to_tensor=True, batch_size=64).to_dense()
    best = vectors.topk(min(top, vectors.shape[1]), dim=1).indices
    hits = [
        (i in row.tolist()) and float(vectors[n, i]) > 0
        for n, (i, row) in enumerate(zip(kept, best, strict=True))
    ]
    return sum(hits) / len(hits), len(hits)


def confidence(
    source: np.ndarray, target: np.ndarray, new: np.ndarray, k: int = NEIGHBOURS
) -> dict[str, np.ndarray]:
    """Per new target token (rows ``new`` of ``target``): best cosine, ratio margin and CSLS against
    the source vectors (all L2-normalised here)."""
    s = torch.nn.functional.normalize(torch.from_numpy(source).float(), dim=1)
    t = torch.nn.functional.normalize(torch.from_numpy(target).float(), dim=1)
    # r_T(y): each source token's mean cosine to its k nearest target tokens (in blocks)
    r_source = torch.empty(len(s))
    for start in range(0, len(s), 4096):
        r_source[start : start + 4096] = (
            (s[start : start + 4096] @ t.T).topk(k, dim=1).values.mean(dim=1)
        )
    rows = t[torch.as_tensor(new, dtype=torch.long)]
    best, margin, csls = [], [], []
    for start in range(0, len(rows), 4096):
        cos = rows[start : start + 4096] @ s.T
        top = cos.topk(k, dim=1).values
        adjusted = 2 * cos - top.mean(dim=1, keepdim=True) - r_source[None, :]
        best.append(top[:, 0])
        margin.append(top[:, 0] / top.mean(dim=1))
        csls.append(adjusted.max(dim=1).values)
    return {
        "best_cosine": torch.cat(best).numpy(),
        "margin": torch.cat(margin).numpy(),
        "csls": torch.cat(csls).numpy(),
    }


def bridge_vectors(
    tokenizer: Any, name: str, cache_dir: Path, bridge_model: str = "me5"
) -> np.ndarray:
    """The bridge's (me5's) vectors of a vocabulary from the init job's cache (encoded here when
    absent)."""
    bridge = bundled.resolve(bridge_model)
    side = bridge_side(
        "sembridge", WeightingConfig(), "fp32", bridge, {name: tokenizer}, {name: len(tokenizer)}
    )
    stages = in_process_stages(bridge, InitConfig().bridge_batch_size, "fp32", False)
    return cached_vectors(cache_dir, side.keys[name], side.strings[name], stages.encode)


def dev_scores(
    model_dir: Path, dev: DevSet, lengths: tuple[int, int]
) -> tuple[dict[str, float], list[np.ndarray]]:
    """Per judged development query its nDCG@10 by exact search, and the query vectors' active ids
    and weights (rows in the dev set's query order)."""
    query_model = load_sparse_encoder(str(model_dir), max_length=lengths[0])
    doc_model = load_sparse_encoder(str(model_dir), max_length=lengths[1])
    docs = [c for c in dev.chunks if c.role == "document"]
    queries = [c for c in dev.chunks if c.role == "query"]
    doc_ids = [i for c in docs for i in c.ids]
    d_idx, d_val = encode_texts(doc_model, [t for c in docs for t in c.texts], 64, "document")
    q_ids = [i for c in queries for i in c.ids]
    q_idx, q_val = encode_texts(query_model, [t for c in queries for t in c.texts], 64, "query")
    vocab = int(max([int(x.max(initial=0)) for x in [*d_idx, *q_idx]] or [0])) + 1
    dense_d = np.zeros((len(doc_ids), vocab), np.float32)
    for n, (i, v) in enumerate(zip(d_idx, d_val, strict=True)):
        dense_d[n, i] = v
    run = {}
    for n, (i, v) in enumerate(zip(q_idx, q_val, strict=True)):
        scores = dense_d[:, i] @ v
        order = np.argsort(-scores, kind="stable")[:100]
        run[q_ids[n]] = {doc_ids[j]: float(scores[j]) for j in order if scores[j] > 0}
    per_query = per_query_metrics(dev.qrels, run)["nDCG@10"]
    return per_query, [np.stack([i, v]) for i, v in zip(q_idx, q_val, strict=True)]


def seen_tokens(tokenizer: Any, texts: Sequence[str]) -> set[int]:
    """Every token id the tokenizer produces on ``texts``."""
    found: set[int] = set()
    for start in range(0, len(texts), 512):
        for row in tokenizer(list(texts[start : start + 512]), add_special_tokens=False)[
            "input_ids"
        ]:
            found.update(row)
    return found


def language_texts(spec: str) -> list[str]:
    """Training and development text of a language (questions and sentences; no test article)."""
    from sembridge_ray.data.registry import load_retrieval

    texts: list[str] = []
    for split in ("train", "dev"):
        data = load_retrieval(spec, split)
        texts += list(data.queries.values())
        texts += [
            t for batch in data.corpus.batches(5000) for t in batch.column("text").to_pylist()
        ]
    return texts


@dataclass(frozen=True, kw_only=True)
class Inputs:
    """Where a language's parts come from: the preset's bundled ones by default."""

    source: str = "splade-tiny"
    bridge: str = "me5"
    tokenizers: dict[str, str] = field(default_factory=dict)
    """Language -> its target tokenizer where it is not the bundled ``tok-<lang>``."""
    xquad_dir: str = ""
    """A directory of XQuAD-format files read instead of the bundled sets."""
    cache_dir: Path = field(default_factory=lambda: Path(InitConfig().cache_dir).expanduser())

    def tokenizer(self, lang: str) -> str:
        return self.tokenizers.get(lang) or bundled.resolve(f"tok-{lang}")

    def spec(self, lang: str) -> str:
        from sembridge_ray.recipes.reproduce.config import ReproduceConfig

        cfg = ReproduceConfig(assets="xling", languages=(lang,), xquad_dir=self.xquad_dir)
        return xling_specs(cfg, lang)[0]


def parse_tokenizers(text: str) -> dict[str, str]:
    """``lang=DIR,...`` -> {lang: DIR}."""
    pairs = [item.partition("=") for item in text.split(",") if item.strip()]
    return {lang.strip(): path.strip() for lang, _, path in pairs}


def diagnose(grid: Path, lang: str, sample: int, top: int, inputs: Inputs) -> dict[str, Any]:
    cfg_lengths = (32, 64)
    source, cache_dir = inputs.source, inputs.cache_dir
    cells = {c.method: c for c in expand((source,), (lang,), ("sembridge", "random"), ("4",))}
    ours, theirs = (cell_paths(grid, cells[m]).init for m in ("sembridge", "random"))
    found: dict[str, Any] = {"language": lang}
    by_kind = kinds(ours)
    src_rows, src_bias = rows_and_bias(Path(bundled.resolve(source)))
    rows, bias = rows_and_bias(ours / "model")
    rand_rows, rand_bias = rows_and_bias(theirs / "model")
    new = by_kind.get("bridge", np.zeros(0, np.int64))
    found["tokens"] = {k: len(v) for k, v in by_kind.items()}
    found["median_norm"] = {
        "source": float(src_rows.norm(dim=1).median()),
        **{f"sembridge_{k}": median_norm(rows, v) for k, v in by_kind.items()},
        "random_new": median_norm(rand_rows, new),
    }
    index = torch.as_tensor(new, dtype=torch.long)
    copied = torch.as_tensor(by_kind.get("overlap", np.zeros(0, np.int64)), dtype=torch.long)
    found["median_bias"] = {
        "source": float(src_bias.median()),
        "sembridge_new": float(bias[index].median()),
        "sembridge_copied": float(bias[copied].median()) if len(copied) else float("nan"),
        "random_new": float(rand_bias[index].median()),
    }
    tokenizer = load_tokenizer(inputs.tokenizer(lang))
    rng = np.random.default_rng(0)
    picked = rng.choice(new, min(sample, len(new)), replace=False) if len(new) else new
    found["self_activation"] = {
        name: dict(
            zip(
                ("share", "tested"),
                self_activation(d / "model", tokenizer, picked, top),
                strict=True,
            )
        )
        for name, d in (("sembridge", ours), ("random", theirs))
    }
    src_tok = load_tokenizer(bundled.resolve(source))
    conf = confidence(
        bridge_vectors(src_tok, "source", cache_dir),
        bridge_vectors(tokenizer, "target", cache_dir),
        new,
    )
    found["confidence"] = {
        k: {
            "median": float(np.median(v)),
            "p10": float(np.percentile(v, 10)),
            "p90": float(np.percentile(v, 90)),
        }
        for k, v in conf.items()
    }
    spec = inputs.spec(lang)
    dev = load_judged(spec, "dev")
    mine, q_vectors = dev_scores(ours / "model", dev, cfg_lengths)
    other, _ = dev_scores(theirs / "model", dev, cfg_lengths)
    found["dev_ndcg@10"] = {
        "sembridge": statistics.fmean(mine.values()),
        "random": statistics.fmean(other.values()),
    }
    csls_of = dict(zip(new.tolist(), conf["csls"].tolist(), strict=True))
    queries = [c for c in dev.chunks if c.role == "query"]
    q_ids = [i for c in queries for i in c.ids]
    q_texts = [t for c in queries for t in c.texts]
    per_query = []
    for qid, text in zip(q_ids, q_texts, strict=True):
        toks = [
            csls_of[t]
            for t in tokenizer(text, add_special_tokens=False)["input_ids"]
            if t in csls_of
        ]
        if toks:
            per_query.append((statistics.fmean(toks), mine[qid] - other[qid]))
    per_query.sort()
    quartiles = np.array_split(np.array(per_query), 4) if per_query else []
    found["gain_by_csls_quartile"] = [
        {
            "csls_from": float(q[0, 0]),
            "csls_to": float(q[-1, 0]),
            "queries": len(q),
            "mean_gain_over_random": float(q[:, 1].mean()),
        }
        for q in quartiles
        if len(q)
    ]
    seen = seen_tokens(tokenizer, language_texts(spec))
    weight = sum(float(v[1].sum()) for v in q_vectors)
    for name, ids in (
        ("unseen", np.array([t for t in new.tolist() if t not in seen], np.int64)),
        ("unreachable", unreachable_pieces(tokenizer, new)),
    ):
        lost = sum(float(v[1][np.isin(v[0].astype(np.int64), ids)].sum()) for v in q_vectors)
        found[name] = {
            "tokens": len(ids),
            "share_of_new": float(len(ids) / max(1, len(new))),
            "share_of_query_weight": lost / weight if weight else float("nan"),
            "examples": [tokenizer.convert_ids_to_tokens(int(t)) for t in ids[:8]],
        }
    return found


CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def unreachable_pieces(tokenizer: Any, ids: np.ndarray) -> np.ndarray:
    """The ``##`` + one CJK character continuation pieces among ``ids``, where the tokenizer's
    pre-tokenizer isolates CJK characters (checked: it cuts two of them apart)."""
    pair = "\u4e2d\u6587"  # two CJK characters
    if len(tokenizer.tokenize(pair)) < 2 or any(
        t.startswith("##") for t in tokenizer.tokenize(pair)
    ):
        return np.zeros(0, np.int64)
    found = [
        t
        for t in ids.tolist()
        if (piece := tokenizer.convert_ids_to_tokens(int(t))).startswith("##")
        and len(piece) == 3
        and CJK.fullmatch(piece[2])
    ]
    return np.array(found, np.int64)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--grid", type=Path, required=True, help="the xling grid's --output")
    parser.add_argument("--languages", default=",".join(CODES))
    parser.add_argument("--source", default="splade-tiny", help="the grid's source model")
    parser.add_argument("--bridge", default="me5", help="the grid's bridge model")
    parser.add_argument("--tokenizers", default="", help="LANG=DIR,... instead of tok-<lang>")
    parser.add_argument("--xquad-dir", default="", help="XQuAD-format files instead of the bundled")
    parser.add_argument(
        "--sample", type=int, default=2000, help="new tokens tested for self-activation"
    )
    parser.add_argument(
        "--top", type=int, default=10, help="self-activation: among the strongest N"
    )
    parser.add_argument("--cache-dir", type=Path, default=Path(InitConfig().cache_dir).expanduser())
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    inputs = Inputs(
        source=args.source,
        bridge=args.bridge,
        tokenizers=parse_tokenizers(args.tokenizers),
        xquad_dir=args.xquad_dir,
        cache_dir=args.cache_dir,
    )
    found = []
    for lang in args.languages.split(","):
        found.append(diagnose(args.grid, lang.strip(), args.sample, args.top, inputs))
        print(json.dumps(found[-1]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(found, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
