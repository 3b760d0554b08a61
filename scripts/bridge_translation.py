"""Can a bridge translate? Tatoeba sentence retrieval (target sentence -> its English translation,
top-1 among the 1,000 English sentences of the same language file, exact cosine) for each bundled
bridge; prints one JSON line per bridge and language.

    python scripts/bridge_translation.py                         # me5 and minilm; ar zh hi ko ru
    python scripts/bridge_translation.py --bridges me5 --languages ko --pairs 200

The bridges encode through the init job's own path (``embed_init.bridge.encode_strings``: the same
model loading, prompt and batches). Tatoeba (LASER's test pairs, CC BY 2.0 FR) is not shipped: it is
read from ``$SEMBRIDGE_SHARED_DATA/tatoeba`` (default ``../shared/data`` beside the checkout)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
FILES = {"ar": "ara", "zh": "cmn", "hi": "hin", "ko": "kor", "ru": "rus"}


def pairs(root: Path, lang: str, n: int) -> tuple[list[str], list[str]]:
    stem = root / "tatoeba" / f"tatoeba.{FILES[lang]}-eng"
    target = Path(f"{stem}.{FILES[lang]}").read_text("utf-8").splitlines()[:n]
    english = Path(f"{stem}.eng").read_text("utf-8").splitlines()[:n]
    return target, english


def top1(target: np.ndarray, english: np.ndarray) -> float:
    """Share of target rows whose nearest English row (cosine; ties to the lower index) is their own
    translation."""
    t = target / np.linalg.norm(target, axis=1, keepdims=True)
    e = english / np.linalg.norm(english, axis=1, keepdims=True)
    return float((np.argmax(t @ e.T, axis=1) == np.arange(len(t))).mean())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bridges", nargs="+", default=["me5", "minilm"])
    parser.add_argument("--languages", nargs="+", default=list(FILES), choices=list(FILES))
    parser.add_argument("--pairs", type=int, default=1000)
    args = parser.parse_args(argv)
    root = Path(os.environ.get("SEMBRIDGE_SHARED_DATA", REPO.parent / "shared" / "data"))
    if not (root / "tatoeba").is_dir():
        print(
            f"error: no Tatoeba pairs under {root / 'tatoeba'} (set SEMBRIDGE_SHARED_DATA)",
            file=sys.stderr,
        )
        return 2

    from sembridge_ray.embed_init.bridge import encode_strings, load_bridge

    for name in args.bridges:
        model = load_bridge(name)
        for lang in args.languages:
            target, english = pairs(root, lang, args.pairs)
            score = top1(
                encode_strings(model, target, 64, name), encode_strings(model, english, 64, name)
            )
            print(
                json.dumps(
                    {
                        "bridge": name,
                        "language": lang,
                        "pairs": len(target),
                        "top1": round(score, 3),
                    }
                )
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
