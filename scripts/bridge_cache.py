"""Build the bridge vectors the package ships (``sembridge_ray/resources/bridge_cache``): the
bundled MiniLM bridge's vectors of the bundled source vocabulary (MiniLM's WordPiece, the
``minilm-splade`` source) and of the bundled byte-level BPE target (``sick-bpe``, 8,000 pieces), so
the quick start and the demo do not encode 38,522 strings.

    python scripts/bridge_cache.py                 # from the checkout's root; prints one line per entry

Each entry is what the init job computes and caches under ``~/.cache/sembridge_ray/bridge`` (taken
from there when that cache holds it, verified, else encoded in this process exactly as the init
job's in-process stages do: the default ``bridge_batch_size``, fp32), rewritten compressed (zstd,
byte-stream-split floats) in files of at most :data:`PART_ROWS` rows, with its sha256 manifest.
Rerun it when the bridge model, a bundled vocabulary or the string rule changes: their fingerprints
name the entries, so a stale entry is simply never found (and a tampered one is refused,
``shipped_vectors``); entries of other names are removed."""

from __future__ import annotations

import argparse
import logging
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sembridge_ray import bundled, cache
from sembridge_ray.embed_init.bridge import VECTOR, _stored_vectors, cached_vectors
from sembridge_ray.embed_init.pipeline import bridge_side, in_process_stages
from sembridge_ray.jobs.init import InitConfig
from sembridge_ray.jobs.reproduce import DemoSettings
from sembridge_ray.resources import BRIDGE_CACHE_DIR
from sembridge_ray.sparse.model import load_tokenizer

PART_ROWS = 6000
"""Rows per file of an entry (~7.5 MiB): under the 10 MiB above which ``ray job submit --working-dir
.`` warns."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache-dir", default=InitConfig().cache_dir, help="the init job's cache (read or filled)"
    )
    parser.add_argument("--out", type=Path, default=BRIDGE_CACHE_DIR)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    cfg = InitConfig(method="sembridge", bridge_model="minilm", precision="fp32")
    bridge = bundled.resolve(cfg.bridge_model)
    # the quick start's and the demo's target, built as they build it
    target = Path(args.out) / ".target-bpe"
    shutil.rmtree(target, ignore_errors=True)
    bundled.build_sick_bpe(target, DemoSettings().target_vocab)
    try:
        toks = {"source": load_tokenizer(bridge), "target": load_tokenizer(str(target))}
        side = bridge_side(
            cfg.weighting, bridge, toks, {name: len(tok) for name, tok in toks.items()}
        )
        stages = in_process_stages(bridge, cfg.bridge_batch_size, "fp32", False)
        # entries of older models, vocabularies or rules
        for stale in cache.entries(Path(args.out)):
            if stale.name not in side.keys.values():
                cache.discard(stale)
        for name in ("source", "target"):
            strings, key = side.strings[name], side.keys[name]
            vecs = cached_vectors(Path(args.cache_dir).expanduser(), key, strings, stages.encode)
            table = strings.append_column(VECTOR, pa.array(list(vecs), pa.list_(pa.float32())))
            entry = Path(args.out) / key
            cache.discard(entry)

            def build(tmp: Path, table: pa.Table = table) -> None:
                tmp.mkdir(parents=True)
                for n, start in enumerate(range(0, table.num_rows, PART_ROWS)):
                    pq.write_table(
                        table.slice(start, PART_ROWS),
                        tmp / f"vectors-{n:03d}.parquet",
                        compression="zstd",
                        compression_level=9,
                        use_dictionary=False,
                        use_byte_stream_split=[f"{VECTOR}.list.element"],
                    )

            cache.publish(entry, build, lambda found: None, "shipped bridge cache")
            cache.load_shipped(
                entry, lambda found, s=strings: _stored_vectors(found, s), "shipped bridge cache"
            )
            size = sum(f.stat().st_size for f in entry.glob("vectors-*.parquet")) / 2**20
            print(f"{name}: {len(vecs)} strings -> {entry} ({size:.1f} MiB)")
    finally:
        shutil.rmtree(target, ignore_errors=True)


if __name__ == "__main__":
    main()
