"""The fine-tuning job: config (contract), run (the driver, written against the executor), worker
(the body every training worker runs) and dev_run (its development scoring and selection)."""
