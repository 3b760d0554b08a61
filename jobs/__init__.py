"""Job entrypoints: ``python -m jobs.<name>``, locally or through ``ray job submit``."""
