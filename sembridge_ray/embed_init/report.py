"""init_report.json: counts, support sizes, timings, fingerprints, and the paper's Table 3 sample."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pyarrow as pa

from sembridge_ray.data.schema import KIND, SOURCE_IDS, TARGET_ID, TOKEN, WEIGHTS
from sembridge_ray.embed_init.vocab import Partition


def support_histogram(prov: pa.Table) -> dict[str, int]:
    """Number of bridge rows per support size (non-zero weights)."""
    kinds = prov.column(KIND).to_pylist()
    sizes = [len(s) for s, k in zip(prov.column(SOURCE_IDS).to_pylist(), kinds, strict=True) if k == "bridge"]
    return {str(size): count for size, count in sorted(Counter(sizes).items())}


def sample_rows(prov: pa.Table, source_tokens: dict[int, str], n: int, seed: int) -> list[dict[str, Any]]:
    """``n`` bridged target tokens (seeded choice) with their top-3 source tokens and weights."""
    bridged = [i for i, k in enumerate(prov.column(KIND).to_pylist()) if k == "bridge"]
    rng = np.random.default_rng(seed)
    chosen = sorted(rng.choice(bridged, size=min(n, len(bridged)), replace=False).tolist()) if bridged else []
    out = []
    for row in chosen:
        ids = prov.column(SOURCE_IDS)[row].as_py()
        ws = prov.column(WEIGHTS)[row].as_py()
        top = sorted(zip(ws, ids, strict=True), key=lambda t: (-t[0], t[1]))[:3]
        out.append({"target_id": prov.column(TARGET_ID)[row].as_py(), "token": prov.column(TOKEN)[row].as_py(),
                    "top": [{"source_id": i, "token": source_tokens.get(i, ""), "weight": round(w, 4)} for w, i in top]})
    return out


def counts(part: Partition, prov: pa.Table) -> dict[str, Any]:
    kinds = Counter(prov.column(KIND).to_pylist())
    rules = Counter(rule for _, rule in part.overlap.values())
    roles = Counter(role for _, role in part.specials.values())
    return {"target_size": part.size, "kinds": dict(sorted(kinds.items())), "match_rules": dict(sorted(rules.items())),
            "special_roles": dict(sorted(roles.items())), "unused_ids": len(part.unused),
            "overlap_empty": not part.overlap}


def sample_table(samples: list[dict[str, Any]]) -> str:
    """The sample as a small text table (printed by the job)."""
    lines = [f"{'target token':<20} top-3 source tokens (weight)"]
    for s in samples:
        tops = ", ".join(f"{t['token']} ({t['weight']:.3f})" for t in s["top"])
        lines.append(f"{s['token'][:20]:<20} {tops}")
    return "\n".join(lines)
