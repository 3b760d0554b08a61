"""Column names and Arrow schemas shared by every job (never scatter these as string literals)."""

from __future__ import annotations

import pyarrow as pa

# Sparse vectors: one row per text.
ID, TEXT, INDICES, VALUES = "id", "text", "indices", "values"
SPARSE_SCHEMA = pa.schema(
    [(ID, pa.string()), (INDICES, pa.list_(pa.int32())), (VALUES, pa.list_(pa.float32()))]
)

# Training pairs (Parquet): query, positive, optional negative_1..negative_k.
QUERY, POSITIVE, NEGATIVE_PREFIX = "query", "positive", "negative"

# Init provenance: one row per target token.
TARGET_ID, TOKEN, KIND, SOURCE_IDS, WEIGHTS = "target_id", "token", "kind", "source_ids", "weights"
PROVENANCE_SCHEMA = pa.schema(
    [
        (TARGET_ID, pa.int32()),
        (TOKEN, pa.string()),
        (KIND, pa.string()),
        (SOURCE_IDS, pa.list_(pa.int32())),
        (WEIGHTS, pa.list_(pa.float32())),
    ]
)

# MaLSTM predictions (TSV): predictions.tsv has all four, val_predictions.tsv the first three.
PAIR_ID, GOLD, RAW, CALIBRATED = "pair_ID", "gold", "raw", "calibrated"
