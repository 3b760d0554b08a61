"""Build the bridge vectors of every bundled vocabulary once, at set-up (``cluster/local.sh``):

- the vectors the assets ship (``assets/sembridge_ray_assets/bridge_cache``): the bundled MiniLM
  bridge's vectors of the bundled source vocabulary (MiniLM's WordPiece, the ``minilm-splade``
  source) and of the bundled byte-level BPE target (``sick-bpe``, 8,000 pieces), so the quick start
  and the demo do not encode 38,522 strings;
- with ``--xling`` (instead): the multilingual bridge ``me5``'s vectors of the cross-lingual miniature's
  vocabularies (the English source's WordPiece, shared by ``splade-tiny`` and ``minilm-splade``, and
  ``tok-ar``, ``tok-zh``, ``tok-hi``, ``tok-ko``, ``tok-ru``: 184,825 strings, about 8 minutes on
  2 CPUs), and the MiniLM bridge's of the five targets (its wrong-bridge control; about 3 minutes),
  into the init job's cache, a progress line every 10 s.

    python scripts/bridge_cache.py                 # from the checkout's root; prints one line per entry
    python scripts/bridge_cache.py --xling         # the cross-lingual vocabularies' me5 vectors

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
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from sembridge_ray import bundled, cache
from sembridge_ray.embed_init.bridge import VECTOR, _stored_vectors, cached_vectors
from sembridge_ray.embed_init.pipeline import Stages, bridge_side, in_process_stages
from sembridge_ray.languages import CODES
from sembridge_ray.recipes.init.config import InitConfig
from sembridge_ray.recipes.reproduce.config import DemoSettings
from sembridge_ray.resources import asset
from sembridge_ray.runtime.errors import InputError
from sembridge_ray.runtime.progress import Progress
from sembridge_ray.sparse.model import load_tokenizer

PART_ROWS = 6000
"""Rows per file of an entry (~7.5 MiB): under the 10 MiB above which ``ray job submit --working-dir
.`` warns."""


log = logging.getLogger("bridge_cache")
XLING_SOURCES = ("splade-tiny", "minilm")
"""The cross-lingual miniature's English sources' tokenizers (one WordPiece: one entry)."""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cache-dir", default=InitConfig().cache_dir, help="the init job's cache (read or filled)"
    )
    parser.add_argument("--out", type=Path, help="default: the assets' bridge_cache/")
    parser.add_argument(
        "--xling",
        action="store_true",
        help="instead, the me5 vectors of the cross-lingual miniature's vocabularies (about 11 min)",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.xling:
        xling(Path(args.cache_dir))
        # the grid's wrong-bridge control (sembridge@minilm): MiniLM's vectors of the targets
        targets = tuple(f"tok-{lang}" for lang in CODES)
        xling(Path(args.cache_dir), targets, bridge_model="minilm")
    else:
        try:
            out = args.out or asset("bridge_cache")
        except InputError as err:
            parser.exit(2, f"error: {err}\n")
        shipped(Path(args.cache_dir), Path(out))


def counted(stages: Stages, batch_size: int, what: str) -> Callable[[pa.Table], np.ndarray]:
    """``stages.encode`` in chunks of whole batches (the same batch boundaries, so the same
    vectors), with a progress line every 10 s: done / total and an ETA."""

    def encode(table: pa.Table) -> np.ndarray:
        progress = Progress(log, f"bridge vectors of {what}", table.num_rows, "strings")
        parts, step = [], 16 * batch_size
        for start in range(0, table.num_rows, step):
            parts.append(stages.encode(table.slice(start, step)))
            progress.add(min(step, table.num_rows - start))
        progress.finish()
        return np.concatenate(parts) if parts else stages.encode(table)

    return encode


def xling(cache_dir: Path, names: tuple[str, ...] | None = None, bridge_model: str = "me5") -> None:
    """The ``me5`` vectors of the cross-lingual miniature's vocabularies (``names``: bundled model
    or tokenizer names, or paths; default its sources' and every ``tok-<lang>``) into the init job's
    cache, as its in-process stages encode them (fp32, the default batch): a run of the grid then
    finds them. ``bridge_model``: another bridge (the tests' tiny one)."""
    cfg = InitConfig(method="sembridge", bridge_model=bridge_model, precision="fp32")
    bridge = bundled.resolve(cfg.bridge_model)
    stages = in_process_stages(bridge, cfg.bridge_batch_size, "fp32", False)
    for name in names or (*XLING_SOURCES, *(f"tok-{lang}" for lang in CODES)):
        tok = load_tokenizer(bundled.resolve(name))
        side = bridge_side(
            "sembridge", cfg.weighting, "fp32", bridge, {"vocab": tok}, {"vocab": len(tok)}
        )
        strings, key = side.strings["vocab"], side.keys["vocab"]
        encode = counted(stages, cfg.bridge_batch_size, f"{name} through {bridge_model}")
        vecs = cached_vectors(cache_dir.expanduser(), key, strings, encode)
        print(f"{name}: {len(vecs)} strings -> {cache_dir / key}", flush=True)


def shipped(cache_dir: Path, out: Path, bridge_model: str = "minilm") -> None:
    """The MiniLM bridge's vectors of the bundled source (its own vocabulary) and BPE target, into
    the package's ``out``. ``bridge_model``: another bridge (the tests' tiny one)."""
    cfg = InitConfig(method="sembridge", bridge_model=bridge_model, precision="fp32")
    bridge = bundled.resolve(cfg.bridge_model)
    # the quick start's and the demo's target, built as they build it
    target = out / ".target-bpe"
    shutil.rmtree(target, ignore_errors=True)
    bundled.build_sick_bpe(target, DemoSettings().target_vocab)
    try:
        toks = {"source": load_tokenizer(bridge), "target": load_tokenizer(str(target))}
        side = bridge_side(
            "sembridge",
            cfg.weighting,
            "fp32",
            bridge,
            toks,
            {name: len(tok) for name, tok in toks.items()},
        )
        stages = in_process_stages(bridge, cfg.bridge_batch_size, "fp32", False)
        # entries of older models, vocabularies or rules
        for stale in cache.entries(out):
            if stale.name not in side.keys.values():
                cache.discard(stale)
        for name in ("source", "target"):
            strings, key = side.strings[name], side.keys[name]
            encode = counted(stages, cfg.bridge_batch_size, f"the bundled {name} vocabulary")
            vecs = cached_vectors(cache_dir.expanduser(), key, strings, encode)
            table = strings.append_column(VECTOR, pa.array(list(vecs), pa.list_(pa.float32())))
            entry = out / key
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
