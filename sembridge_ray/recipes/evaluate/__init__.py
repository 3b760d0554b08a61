"""The evaluate job: config (contract) and run (encode, exact sharded search, scores)."""
