"""Choose word vectors on SICK validation only: a training-free proxy for every source, layer and
pooling.

The proxy is the Pearson r, on the job's validation split (30% of SICK train + trial, data seed 0),
between the gold relatedness and the cosine of the two sentences' mean unit word vectors. It never
reads SICK test; the MaLSTM runs then confirm the chosen candidates.

    NLTK_DATA=DIR python -m benchmarks.word_vectors [key=value ...]

DIR holds nltk's ``wordnet`` corpus (``python -m nltk.downloader -d DIR wordnet``), for the WordNet
contexts."""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import replace
from typing import Literal

import numpy as np
from scipy import stats

from sembridge_ray.cli import parse_config
from sembridge_ray.recipes.malstm.config import MalstmConfig
from sembridge_ray.resources import sick_dir, sts_dir
from sembridge_ray.runtime.logs import setup_logging
from sembridge_ray.siamese.data import read_sick_training, split_validation, tokenize_pairs
from sembridge_ray.siamese.prepare import load_thesaurus, lookup_vectors, retrofit_found

log = logging.getLogger(__name__)


def bag_cosine_r(found: dict[str, np.ndarray], pairs: list) -> float:
    """Pearson r of gold vs cos(mean unit vector of a, of b) over ``pairs`` (words without a vector
    skipped)."""

    def embed(tokens: tuple[str, ...]) -> np.ndarray:
        rows = [found[t] / np.linalg.norm(found[t]) for t in tokens if t in found]
        return np.mean(rows, axis=0)

    cos = []
    for p in pairs:
        a, b = embed(p.a), embed(p.b)
        cos.append(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))
    return float(stats.pearsonr(cos, [p.score for p in pairs])[0])


def main(argv: list[str] | None = None) -> int:
    setup_logging("INFO")
    cfg, _ = parse_config(MalstmConfig, argv, job="malstm", default_preset="paper")
    train, val = split_validation(
        read_sick_training(sick_dir()), cfg.val_fraction, np.random.default_rng(cfg.data_seed)
    )
    train_t, val_t = tokenize_pairs(train), tokenize_pairs(val)
    words = list(dict.fromkeys(t for p in train_t + val_t for t in (*p.a, *p.b)))
    thesaurus, _ = load_thesaurus(cfg.augment, train_t)
    poolings: tuple[Literal["mean", "first"], ...] = ("mean", "first")
    candidates = [("minilm", 6, poolings[0]), ("minilm-input", 0, poolings[0])]
    candidates += [
        ("minilm-context", layer, pooling) for layer in range(6, -1, -1) for pooling in poolings
    ]
    for source, layer, pooling in candidates:
        vcfg = replace(cfg.vectors, source=source, layer=layer, pooling=pooling)
        start = time.perf_counter()
        found, build = lookup_vectors(vcfg, cfg.augment, words, sick_dir(), sts_dir())
        seconds = time.perf_counter() - start
        row = {
            "source": source,
            "layer": layer,
            "pooling": pooling,
            "val_r": bag_cosine_r(found, val_t),
        }
        row["val_r_retrofit10"] = bag_cosine_r(retrofit_found(found, thesaurus, 10, True), val_t)
        print(
            json.dumps(
                {**row, "seconds": round(seconds, 1), "corpus": build.get("corpus_sentences")}
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
