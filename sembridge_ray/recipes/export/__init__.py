"""The export job: config (contract) and run (the targets, their parity with the model)."""
