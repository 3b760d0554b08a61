"""Exact sparse retrieval: term-major CSR shards, per-shard top-k and its merge, ir-measures scoring
(no Ray)."""
