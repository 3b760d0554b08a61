"""init_report.json (:func:`init_report`): counts, support sizes (overall and per position class),
the exact counterparts that get no weight, timings, fingerprints, and the paper's Table 3 sample."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

import numpy as np
import pyarrow as pa

from sembridge_ray.data.schema import KIND, SOURCE_IDS, TARGET_ID, TOKEN, WEIGHTS
from sembridge_ray.embed_init.bridge import model_fingerprint
from sembridge_ray.embed_init.config import TransferSettings, WeightingConfig
from sembridge_ray.embed_init.position import CLASS_NAMES
from sembridge_ray.embed_init.records import CounterpartStats, Counts, Models, PositionStats, Sample
from sembridge_ray.embed_init.vocab import Partition

if TYPE_CHECKING:
    from sembridge_ray.embed_init.records import InitReport
    from sembridge_ray.embed_init.transfer import Transfer


def init_report(
    named: TransferSettings,
    section: WeightingConfig,
    done: Transfer,
    samples: int,
    timings: Mapping[str, float],
) -> InitReport:
    """The report of a transfer ``done``, in the order init_report.json has always had: its settings
    (``named``: with the inputs as the user named them; the weighting ``section`` as configured,
    each option saying whether and when the report carries it: ``embed_init.config.Read``), counts
    and position statistics, ``timings``, fingerprints, the inputs, and ``samples`` bridged
    tokens."""
    prov, keys = done.provenance, done.bridge.keys
    return cast(
        "InitReport",
        {
            "method": named.method,
            "alpha": section.alpha,
            "bias": named.bias,
            "match": list(named.match),
            "copy_overlap": named.copy_overlap,
            "exclude_special_sources": named.exclude_special_sources,
            **section.reported(named.method),
            **counts(done.partition, prov),
            "support_histogram": support_histogram(prov),
            "position": position_stats(prov, done.bridge.classes["target"], done.counterparts),
            "timings": {k: round(v, 3) for k, v in timings.items()},
            "fingerprints": {
                "source_model": model_fingerprint(named.source_model),
                "bridge_model": done.bridge.fingerprint,
                # <bridge>-<tokenizer>[-<precision>]
                "source_tokenizer": keys["source"].split("-")[1],
                "target_tokenizer": keys["target"].split("-")[1],
            },
            # the inputs as named, with the keys Models declares, in its order
            "models": {k: getattr(named, k) for k in Models.__annotations__},
            "samples": sample_rows(prov, done.source_tokens, samples),
        },
    )


def support_histogram(prov: pa.Table) -> dict[str, int]:
    """Number of bridge rows per support size (non-zero weights)."""
    columns = (prov.column(c).to_pylist() for c in (SOURCE_IDS, KIND))
    sizes = Counter(len(ids) for ids, kind in zip(*columns, strict=True) if kind == "bridge")
    return {str(size): count for size, count in sorted(sizes.items())}


SAMPLE_SEED = 0
"""Seeds the report's choice of sample tokens: one fixed choice, so runs of every method and seed
show the same tokens side by side (``seed`` shapes what the random rows are, never which rows the
report shows)."""


def sample_rows(prov: pa.Table, source_tokens: dict[int, str], n: int) -> list[Sample]:
    """``n`` bridged target tokens (seeded choice) with their top-3 source tokens and weights."""
    bridged = [i for i, k in enumerate(prov.column(KIND).to_pylist()) if k == "bridge"]
    rng = np.random.default_rng(SAMPLE_SEED)
    chosen = sorted(rng.choice(bridged, size=min(n, len(bridged)), replace=False).tolist())
    out: list[Sample] = []
    for row in chosen:
        ids = prov.column(SOURCE_IDS)[row].as_py()
        ws = prov.column(WEIGHTS)[row].as_py()
        top = sorted(zip(ws, ids, strict=True), key=lambda t: (-t[0], t[1]))[:3]
        out.append(
            {
                "target_id": prov.column(TARGET_ID)[row].as_py(),
                "token": prov.column(TOKEN)[row].as_py(),
                "top": [
                    {"source_id": i, "token": source_tokens.get(i, ""), "weight": round(w, 4)}
                    for w, i in top
                ],
            }
        )
    return out


def counts(part: Partition, prov: pa.Table) -> Counts:
    kinds = Counter(prov.column(KIND).to_pylist())
    rules = Counter(rule for _, rule in part.overlap.values())
    roles = Counter(role for _, role in part.specials.values())
    return {
        "target_size": part.size,
        "kinds": dict(sorted(kinds.items())),
        "match_rules": dict(sorted(rules.items())),
        "special_roles": dict(sorted(roles.items())),
        "unused_ids": len(part.unused),
        "overlap_empty": not part.overlap,
    }


def sample_table(samples: list[Sample]) -> str:
    """The sample as a small text table (printed by the job)."""
    lines = [f"{'target token':<20} top-3 source tokens (weight)"]
    for s in samples:
        tops = ", ".join(f"{t['token']} ({t['weight']:.3f})" for t in s["top"])
        lines.append(f"{s['token'][:20]:<20} {tops}")
    return "\n".join(lines)


def position_stats(
    prov: pa.Table, classes: np.ndarray, counterparts: dict[int, int]
) -> PositionStats:
    """Per position class of the bridged target tokens (``position.CLASS_NAMES``): how many have an
    exact source counterpart (same canonical form), how many of those put zero weight on it and that
    share, and the support-size histogram. ``classes``: class by target id; ``counterparts``: target
    id -> source id."""
    stats: dict[str, CounterpartStats] = {
        name: {"with_counterpart": 0, "zero_weight": 0} for name in CLASS_NAMES
    }
    sizes: dict[str, Counter[int]] = {name: Counter() for name in CLASS_NAMES}
    columns = (prov.column(c).to_pylist() for c in (TARGET_ID, KIND, SOURCE_IDS))
    for tid, kind, ids in zip(*columns, strict=True):
        if kind != "bridge":
            continue
        name = CLASS_NAMES[int(classes[tid])]
        sizes[name][len(ids)] += 1
        if tid in counterparts:
            stats[name]["with_counterpart"] += 1
            stats[name]["zero_weight"] += counterparts[tid] not in ids
    total: CounterpartStats = {
        "with_counterpart": sum(s["with_counterpart"] for s in stats.values()),
        "zero_weight": sum(s["zero_weight"] for s in stats.values()),
    }
    for entry in [*stats.values(), total]:
        found = entry["with_counterpart"]
        entry["zero_weight_share"] = round(entry["zero_weight"] / found, 4) if found else None
    return {
        "exact_counterpart": {**stats, "all": total},
        "support_histogram": {
            name: {str(k): v for k, v in sorted(c.items())} for name, c in sizes.items()
        },
    }
