"""The init job: config (contract), initialise (the run without Ray, its stages injected), run (on
Ray Data actor pools)."""
